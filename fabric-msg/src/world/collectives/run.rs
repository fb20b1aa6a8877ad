//! One collective in flight ([`Run`]): its schedule, its working array of
//! elements, and where it stands; receives posted ahead of their round,
//! sends laid out when their round starts.

use super::io::{post_failed, post_outgoing, token, Failure, Io, Kind, Outgoing, Shared, AHEAD, LOSS_GRACE};
use super::ops::{Element, Reduction};
use super::schedule::{Apply, Round, Schedule, Xfer};
use crate::error::Error;
use crate::memory::buffer::Buffer;
use crate::transport::event_loop::{Completion, CompletionError, PostError, RecvOpts};
use crate::world::tags;
use std::any::Any;
use std::collections::VecDeque;
use std::sync::Arc;

/// One collective in flight: its schedule over a working array of `T`.
pub(crate) struct Run<T: Element> {
    what: &'static str,
    seq: u32,
    rounds: Vec<Round>,
    /// Every receive of the schedule in order, with its round.
    recvs: Vec<(usize, Xfer)>,
    /// Index in `recvs` of each round's first receive (and the total).
    first: Vec<usize>,
    arrived: Vec<Option<Buffer>>,
    /// Receives of each round still to arrive.
    missing: Vec<usize>,
    /// Next receive to post.
    next_post: usize,
    round: usize,
    /// The current round's sends are laid out (in `outbox` or posted).
    sent: bool,
    /// Messages laid out and not yet accepted by the provider (its queue
    /// was full): retried at every progress.
    outbox: VecDeque<Outgoing>,
    work: Vec<T>,
    reduction: Option<Reduction<T>>,
    scratch: Vec<T>,
    pub(crate) alive: Arc<()>,
}

/// A run with its element type erased, as the engine holds it.
pub(crate) trait Progress: Send {
    fn seq(&self) -> u32;
    fn what(&self) -> &'static str;
    fn alive(&self) -> &Arc<()>;
    /// Post what can be posted and apply finished rounds; `true` once done.
    fn advance(&mut self, io: &mut Io<'_>, sh: &mut Shared) -> Result<bool, Failure>;
    /// Receive number `index` completed.
    fn arrived(&mut self, index: u32, c: Completion, sh: &mut Shared) -> Result<(), Failure>;
    /// The working array, as `Box<Vec<T>>`.
    fn into_work(self: Box<Self>) -> Box<dyn Any + Send>;
}

impl<T: Element> Run<T> {
    pub(crate) fn new(
        what: &'static str,
        seq: u32,
        sched: Schedule,
        work: Vec<T>,
        reduction: Option<Reduction<T>>,
    ) -> Self {
        let mut recvs = Vec::new();
        let mut first = Vec::with_capacity(sched.rounds.len() + 1);
        for (k, r) in sched.rounds.iter().enumerate() {
            first.push(recvs.len());
            recvs.extend(r.recvs.iter().map(|x| (k, *x)));
        }
        first.push(recvs.len());
        Run {
            what,
            seq,
            missing: sched.rounds.iter().map(|r| r.recvs.len()).collect(),
            arrived: recvs.iter().map(|_| None).collect(),
            rounds: sched.rounds,
            recvs,
            first,
            next_post: 0,
            round: 0,
            sent: false,
            outbox: VecDeque::new(),
            work,
            reduction,
            scratch: Vec::new(),
            alive: Arc::new(()),
        }
    }

    fn post_recvs(&mut self, io: &mut Io<'_>, sh: &mut Shared) -> Result<(), Failure> {
        while let Some(&(round, x)) = self.recvs.get(self.next_post) {
            if round > self.round && self.next_post - self.first[self.round] >= AHEAD {
                break;
            }
            let buf = sh.pool.take(x.len * T::SIZE);
            let field = tags::world_field(self.seq, x.step);
            let opts = RecvOpts {
                tag: Some(tags::matcher(tags::CLASS_WORLD, Some(x.peer), Some(field))),
                from: None,
            };
            let t = token(Kind::Recv, self.seq, self.next_post as u32);
            match io.ev.recv(io.ep, buf, opts, t) {
                Ok(()) => self.next_post += 1,
                Err(PostError {
                    error: Error::QueueFull { .. },
                    buffer,
                }) => {
                    sh.pool.give_opt(buffer);
                    break;
                }
                Err(e) => return Err(post_failed(sh, e, &format!("a receive from rank {}", x.peer))),
            }
        }
        Ok(())
    }

    /// Lay out the current round's sends: each copies its block now, so
    /// the round's receives may be applied before the provider takes it.
    fn stage_sends(&mut self, io: &mut Io<'_>, sh: &mut Shared) {
        let inject_max = io
            .ev
            .profile()
            .inject_size
            .saturating_sub(if io.ev.framed() { 16 } else { 0 });
        for x in &self.rounds[self.round].sends {
            let len = x.len * T::SIZE;
            let mut buf = sh.pool.take(len);
            T::write(&self.work[x.at..x.at + x.len], buf.as_mut_slice());
            self.outbox.push_back(Outgoing {
                peer: x.peer,
                tag: tags::encode(tags::CLASS_WORLD, io.rank, tags::world_field(self.seq, x.step)),
                buf,
                inject: len <= inject_max,
            });
        }
    }

    /// Post what the outbox holds, in order, until the provider's queue is
    /// full.
    fn flush(&mut self, io: &mut Io<'_>, sh: &mut Shared) -> Result<(), Failure> {
        while let Some(o) = self.outbox.pop_front() {
            if let Some(o) = post_outgoing(io, sh, o, token(Kind::Send, self.seq, 0))? {
                self.outbox.push_front(o);
                break;
            }
        }
        Ok(())
    }

    fn apply_round(&mut self, sh: &mut Shared) {
        for g in self.first[self.round]..self.first[self.round + 1] {
            let (_, x) = self.recvs[g];
            let Some(buf) = self.arrived[g].take() else {
                continue;
            };
            let region = &mut self.work[x.at..x.at + x.len];
            match (x.apply, &self.reduction) {
                (Apply::Copy, _) | (_, None) => T::read(buf.as_slice(), region),
                (Apply::Combine, Some(r)) => {
                    r.combine_bytes(region, buf.as_slice(), false, &mut self.scratch)
                }
                (Apply::CombineOtherFirst, Some(r)) => {
                    r.combine_bytes(region, buf.as_slice(), true, &mut self.scratch)
                }
            }
            sh.pool.give(buf);
        }
    }
}

impl<T: Element> Progress for Run<T> {
    fn seq(&self) -> u32 {
        self.seq
    }

    fn what(&self) -> &'static str {
        self.what
    }

    fn alive(&self) -> &Arc<()> {
        &self.alive
    }

    fn advance(&mut self, io: &mut Io<'_>, sh: &mut Shared) -> Result<bool, Failure> {
        loop {
            self.flush(io, sh)?;
            self.post_recvs(io, sh)?;
            if self.round == self.rounds.len() {
                return Ok(self.outbox.is_empty());
            }
            if !self.sent {
                self.stage_sends(io, sh);
                self.sent = true;
                self.flush(io, sh)?;
            }
            if self.missing[self.round] > 0 {
                return Ok(false);
            }
            self.apply_round(sh);
            self.round += 1;
            self.sent = false;
        }
    }

    fn arrived(&mut self, index: u32, c: Completion, sh: &mut Shared) -> Result<(), Failure> {
        let g = index as usize;
        let Some(&(round, x)) = self.recvs.get(g) else {
            return Ok(());
        };
        let expect = x.len * T::SIZE;
        let what = self.what;
        let mismatch = |got: Option<usize>| {
            let what_came = match got {
                Some(g) => format!("{g} bytes where this rank expected {expect}"),
                None => format!("more than the {expect} bytes this rank expected"),
            };
            Failure::seen(format!(
                "rank {} sent {what_came} ({} × {}) at step {} of the {what}: \
                 every rank must pass matching lengths (and the same root)",
                x.peer,
                x.len,
                T::NAME,
                x.step
            ))
        };
        let buf = match (c.result, c.buffer) {
            (Ok(()), Some(b)) if b.len() == expect => b,
            (Ok(()), Some(b)) => {
                let got = b.len();
                sh.pool.give(b);
                return Err(mismatch(Some(got)));
            }
            (Ok(()), None) => return Err(Failure::seen("a receive came back without its buffer".into())),
            (Err(CompletionError::Truncated { message_len, .. }), b) => {
                if let Some(b) = b {
                    sh.pool.give(b);
                }
                return Err(mismatch(message_len));
            }
            (Err(e), b) => {
                if let Some(b) = b {
                    sh.pool.give(b);
                }
                return Err(Failure {
                    message: format!("the receive from rank {} failed: {e}", x.peer),
                    grace: LOSS_GRACE,
                });
            }
        };
        if self.arrived[g].replace(buf).is_none() {
            self.missing[round] -= 1;
        }
        Ok(())
    }

    fn into_work(self: Box<Self>) -> Box<dyn Any + Send> {
        Box::new(self.work)
    }
}
