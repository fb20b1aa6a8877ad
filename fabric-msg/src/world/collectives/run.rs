//! One collective in flight ([`Run`]): its schedule, its working array of
//! elements, and where it stands.
//!
//! Small messages are copied: a send lays its block out in a pooled buffer
//! (or injects it) when its round starts, and a receive lands in a pooled
//! buffer posted up to `AHEAD` receives early, then is copied or combined
//! into the working array when its round ends.
//!
//! Messages of [`ZERO_COPY_BYTES`] and more go without those copies, where
//! the endpoint carries no fabric-msg header: a send is posted straight
//! from the working array, and a receive that only copies its block in is
//! posted straight into it, when its round starts. Nothing writes a block
//! while a send from it is in flight (the provider may read it until the
//! send completes): a round's receives are applied, and a direct receive is
//! posted, only once no such send reads their block. The array outlives
//! every such operation: a
//! run that ends with one in flight is kept by the engine until the World's
//! event loop is closed (see [`Progress::busy`]).

use super::io::{post_failed, post_outgoing, token, Failure, Io, Kind, Outgoing, Shared, AHEAD};
use super::ops::{Element, Reduction};
use super::schedule::{Apply, Rounds, Schedule, Xfer};
use super::scope::Scope;
use crate::error::Error;
use crate::memory::buffer::Buffer;
use crate::transport::event_loop::{Completion, CompletionError, PostError, RecvOpts, SendOpts};
use crate::transport::liveness::LOSS_GRACE;
use crate::world::lane::Lane;
use crate::world::tags;
use std::collections::VecDeque;
use std::sync::Arc;

/// Messages from this many bytes are sent from, and copied into, the
/// working array without a staging copy.
pub(crate) const ZERO_COPY_BYTES: usize = 16 << 10;

/// How one receive arrived.
enum Arrival {
    /// In a pooled buffer, to be applied with its round.
    Pooled(Buffer),
    /// In place, in the working array.
    Direct,
}

/// A send waiting for room in the provider's queue.
enum Pending {
    /// Laid out in a buffer of its own.
    Copied(Outgoing),
    /// From the working array: `at..at + len` elements.
    Borrowed {
        peer: u32,
        tag: u64,
        at: usize,
        len: usize,
    },
}

/// One collective in flight: its schedule over a working array of `T`.
pub(crate) struct Run<T: Element> {
    what: &'static str,
    /// The engine's number for it, unique among this rank's runs in
    /// flight: its operations' tokens carry it.
    id: u32,
    /// Its number in its communicator, the same on every member: its
    /// messages' tags carry it.
    seq: u32,
    /// Its communicator.
    scope: Scope,
    rounds: Rounds,
    /// Every receive of the schedule in order, with its round.
    recvs: Vec<(usize, Xfer)>,
    /// Index in `recvs` of each round's first receive (and the total).
    first: Vec<usize>,
    arrived: Vec<Option<Arrival>>,
    /// Receives of each round still to arrive.
    missing: Vec<usize>,
    /// Next receive to post.
    next_post: usize,
    round: usize,
    /// The current round's sends are laid out (in `outbox` or posted).
    sent: bool,
    /// Sends not yet accepted by the provider (its queue was full):
    /// retried at every progress.
    outbox: VecDeque<Pending>,
    /// The provider refused a receive for a full queue at the last
    /// `advance`: the run must be advanced again even if nothing completes.
    recv_refused: bool,
    /// Blocks (`at`, `len`) of the working array that sends in flight read,
    /// by slot (the slot is the send's token index).
    sending: Vec<Option<(usize, usize)>>,
    /// Receives straight into the working array in flight.
    direct_recvs: usize,
    /// Large messages go without staging copies (decided at the start:
    /// not on framed endpoints).
    zero_copy: Option<bool>,
    /// Never reallocated while the run lives: operations in flight point
    /// into it.
    work: Vec<T>,
    reduction: Option<Reduction<T>>,
    scratch: Vec<T>,
    /// Where the run's result goes, shared with its [`Request`](super::request::Request).
    pub(crate) outcome: Outcome<T>,
}

/// A run's result, typed end to end: the run puts it here when it ends,
/// and `World::wait` takes it from its request. Dropping the request
/// drops its half; the result is then dropped with the run.
pub(crate) type Outcome<T> = Arc<parking_lot::Mutex<Option<crate::error::Result<Vec<T>>>>>;

/// The bookkeeping containers of a finished run, which the engine hands to
/// the next: a small collective allocated each of them every time.
#[derive(Default)]
pub(crate) struct Spare {
    recvs: Vec<(usize, Xfer)>,
    first: Vec<usize>,
    arrived: Vec<Option<Arrival>>,
    missing: Vec<usize>,
    sending: Vec<Option<(usize, usize)>>,
}

/// A run with its element type erased, as the engine holds it.
pub(crate) trait Progress: Send {
    /// The engine's number for the run (its tokens').
    fn id(&self) -> u32;
    /// Its number in its communicator (its tags').
    fn seq(&self) -> u32;
    /// Its communicator.
    fn scope(&self) -> &Scope;
    fn what(&self) -> &'static str;
    /// End with `error`: the request's result.
    fn fail(&self, error: crate::error::Error);
    /// Whether the run has posts the provider refused for a full queue:
    /// only then can advancing it help before one of its operations
    /// completes (every other reason a run waits ends with a completion).
    fn stalled(&self) -> bool;
    /// Post what can be posted and apply finished rounds; `true` once done.
    fn advance(&mut self, io: &mut Io<'_>, sh: &mut Shared) -> Result<bool, Failure>;
    /// Receive number `index` completed.
    fn arrived(&mut self, index: u32, c: Completion, sh: &mut Shared) -> Result<(), Failure>;
    /// The send from the working array in `slot` completed.
    fn borrowed_sent(&mut self, slot: u32);
    /// Add to `out` the ranks whose messages of the current round have not
    /// come (the ranks a stuck run waits for: `probe.rs`).
    fn awaited(&self, out: &mut Vec<u32>);
    /// Whether the provider may still read or write the working array: a
    /// run that ends so must be kept until the World's event loop closes.
    fn busy(&self) -> bool;
    /// End well: the working array is the request's result.
    fn succeed(self: Box<Self>);
    /// The run's containers, for the next run (once it is done).
    fn spare(&mut self) -> Spare;
}

impl<T: Element> Run<T> {
    pub(crate) fn new(
        what: &'static str,
        (id, seq, scope): (u32, u32, Scope),
        sched: Schedule,
        work: Vec<T>,
        reduction: Option<Reduction<T>>,
        spare: Spare,
    ) -> Self {
        let Spare {
            mut recvs,
            mut first,
            mut arrived,
            mut missing,
            mut sending,
        } = spare;
        recvs.clear();
        first.clear();
        arrived.clear();
        missing.clear();
        sending.clear();
        for (k, r) in sched.rounds.iter().enumerate() {
            first.push(recvs.len());
            recvs.extend(r.recvs.iter().map(|x| (k, *x)));
        }
        first.push(recvs.len());
        missing.extend(sched.rounds.iter().map(|r| r.recvs.len()));
        arrived.resize_with(recvs.len(), || None);
        Run {
            what,
            id,
            seq,
            scope,
            missing,
            arrived,
            rounds: sched.rounds,
            recvs,
            first,
            next_post: 0,
            round: 0,
            sent: false,
            outbox: VecDeque::new(),
            recv_refused: false,
            sending,
            direct_recvs: 0,
            zero_copy: None,
            work,
            reduction,
            scratch: Vec::new(),
            outcome: Arc::default(),
        }
    }

    fn large(&self, x: &Xfer) -> bool {
        self.zero_copy == Some(true) && x.len * T::SIZE >= ZERO_COPY_BYTES
    }

    /// A receive that lands straight in the working array.
    fn direct(&self, x: &Xfer) -> bool {
        x.apply == Apply::Copy && self.large(x)
    }

    /// Whether a send in flight, or waiting in the outbox, reads any of
    /// `at..at + len`: then nothing may write there yet.
    fn read_by_sends(&self, at: usize, len: usize) -> bool {
        let hit = |a: usize, l: usize| len > 0 && l > 0 && a < at + len && at < a + l;
        self.sending.iter().flatten().any(|&(a, l)| hit(a, l))
            || self.outbox.iter().any(|p| match p {
                Pending::Borrowed { at: a, len: l, .. } => hit(*a, *l),
                Pending::Copied(_) => false,
            })
    }

    /// Post receives in order: pooled ones up to `AHEAD` beyond the current
    /// round, direct ones only once their round is the current one (the
    /// block may still be read by an earlier send or written by an earlier
    /// round until then).
    fn post_recvs(&mut self, io: &mut Io<'_>, sh: &mut Shared) -> Result<(), Failure> {
        while let Some(&(round, x)) = self.recvs.get(self.next_post) {
            let direct = self.direct(&x);
            if round > self.round && (direct || self.next_post - self.first[self.round] >= AHEAD) {
                break;
            }
            if direct && self.read_by_sends(x.at, x.len) {
                break;
            }
            let field = tags::world_field(self.seq, x.step);
            let want = tags::matcher(tags::world_class(self.scope.ctx), Some(x.peer), Some(field));
            let opts = RecvOpts {
                tag: Some(want),
                from: None,
            };
            let t = token(Kind::Recv, self.id, self.next_post as u32);
            let posted = if direct {
                let region = &mut self.work[x.at..x.at + x.len];
                let (into, bytes) = (region.as_mut_ptr().cast::<u8>(), x.len * T::SIZE);
                // SAFETY (both arms): the block lies in the working array,
                // which is never reallocated and outlives the operation: the
                // run ends only once this receive completed (its round must
                // arrive), or is kept by the engine while busy until the
                // World's event loops (the main one and the same-node one)
                // are closed. No send reads the block meanwhile: none in
                // flight does (checked just above), and a round never sends a
                // block it receives into. Any bit pattern is a valid element.
                let r = match io.lane(x.peer) {
                    // SAFETY: above.
                    Lane::Fabric { ev, ep, .. } => unsafe {
                        ev.as_world().recv_borrowed(ep, into, bytes, opts, t)
                    },
                    Lane::Node { nl, .. } => match std::ptr::NonNull::new(into) {
                        // SAFETY: above.
                        Some(into) => unsafe { nl.recv_lent(None, want.0, want.1, into, bytes, t) },
                        None => Err(Error::Usage("a receive into a null working array".into())),
                    },
                };
                match r {
                    Ok(()) => {
                        self.direct_recvs += 1;
                        Ok(())
                    }
                    Err(Error::QueueFull { .. }) => {
                        self.recv_refused = true;
                        break;
                    }
                    Err(e) => Err(Failure::seen(format!(
                        "posting a receive from rank {} failed: {e}",
                        x.peer
                    ))),
                }
            } else {
                let buf = sh.pool.take(x.len * T::SIZE);
                match io.lane(x.peer).recv(want, buf, t) {
                    Ok(()) => Ok(()),
                    Err(PostError {
                        error: Error::QueueFull { .. },
                        buffer,
                    }) => {
                        sh.pool.give_opt(buffer);
                        self.recv_refused = true;
                        break;
                    }
                    Err(e) => Err(post_failed(sh, e, &format!("a receive from rank {}", x.peer))),
                }
            };
            posted?;
            self.next_post += 1;
        }
        Ok(())
    }

    /// Lay out the current round's sends: small ones copy their block now,
    /// so the round's receives may be applied before the provider takes
    /// them; large ones are sent from the array.
    fn stage_sends(&mut self, io: &mut Io<'_>, sh: &mut Shared) {
        let inject_max = io.inject_max();
        for x in &self.rounds[self.round].sends {
            let tag = tags::encode(
                tags::world_class(self.scope.ctx),
                io.rank,
                tags::world_field(self.seq, x.step),
            );
            if self.large(x) {
                self.outbox.push_back(Pending::Borrowed {
                    peer: x.peer,
                    tag,
                    at: x.at,
                    len: x.len,
                });
                continue;
            }
            let len = x.len * T::SIZE;
            let mut buf = sh.pool.take(len);
            T::write(&self.work[x.at..x.at + x.len], buf.as_mut_slice());
            self.outbox.push_back(Pending::Copied(Outgoing {
                peer: x.peer,
                tag,
                buf,
                inject: len <= inject_max,
            }));
        }
    }

    /// Post what the outbox holds, in order, until the provider's queue is
    /// full.
    fn flush(&mut self, io: &mut Io<'_>, sh: &mut Shared) -> Result<(), Failure> {
        while let Some(p) = self.outbox.pop_front() {
            match p {
                Pending::Copied(o) => {
                    if let Some(o) = post_outgoing(io, sh, o, token(Kind::Send, self.id, 0))? {
                        self.outbox.push_front(Pending::Copied(o));
                        break;
                    }
                }
                Pending::Borrowed { peer, tag, at, len } => {
                    let opts = SendOpts {
                        tag: Some(tag),
                        data: None,
                    };
                    let block = &self.work[at..at + len];
                    let slot = self
                        .sending
                        .iter()
                        .position(Option::is_none)
                        .unwrap_or(self.sending.len());
                    let (data, bytes) = (block.as_ptr().cast::<u8>(), len * T::SIZE);
                    let t = token(Kind::BorrowedSend, self.id, slot as u32);
                    // SAFETY (both arms): the block lies in the working array,
                    // which is never reallocated and outlives the send:
                    // nothing writes a block a send in flight reads
                    // (`read_by_sends` holds back applies and direct
                    // receives), and a run that ends with one in flight is
                    // kept by the engine until the World's event loops are
                    // closed.
                    let r = match io.lane(peer) {
                        // SAFETY: above.
                        Lane::Fabric { ev, peer: to, .. } => unsafe {
                            ev.as_world().send_borrowed(to, data, bytes, opts, t)
                        },
                        Lane::Node { nl, peer: to } => match std::ptr::NonNull::new(data.cast_mut()) {
                            // SAFETY: above.
                            Some(data) => unsafe { nl.send_lent(to, tag, data, bytes, t) },
                            None => Err(Error::Usage("a send from a null working array".into())),
                        },
                    };
                    match r {
                        Ok(()) => {
                            if slot == self.sending.len() {
                                self.sending.push(None);
                            }
                            self.sending[slot] = Some((at, len));
                        }
                        Err(Error::QueueFull { .. }) => {
                            self.outbox.push_front(Pending::Borrowed { peer, tag, at, len });
                            break;
                        }
                        Err(e) => {
                            return Err(Failure::seen(format!(
                                "posting a send to rank {peer} failed: {e}"
                            )));
                        }
                    }
                }
            }
        }
        Ok(())
    }

    fn apply_round(&mut self, sh: &mut Shared) {
        for g in self.first[self.round]..self.first[self.round + 1] {
            let (_, x) = self.recvs[g];
            let Some(Arrival::Pooled(buf)) = self.arrived[g].take() else {
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
    fn id(&self) -> u32 {
        self.id
    }

    fn seq(&self) -> u32 {
        self.seq
    }

    fn scope(&self) -> &Scope {
        &self.scope
    }

    fn what(&self) -> &'static str {
        self.what
    }

    fn fail(&self, error: crate::error::Error) {
        *self.outcome.lock() = Some(Err(error));
    }

    fn stalled(&self) -> bool {
        self.recv_refused || !self.outbox.is_empty()
    }

    fn advance(&mut self, io: &mut Io<'_>, sh: &mut Shared) -> Result<bool, Failure> {
        self.recv_refused = false;
        let zero_copy = *self.zero_copy.get_or_insert_with(|| !io.framed());
        loop {
            self.flush(io, sh)?;
            // A round's sends go out before its receives are posted: other
            // ranks wait for them, while a message that arrives before its
            // receive waits in the provider (matched by exact source and
            // tag) for the moment it takes to post it.
            if !self.sent && self.round < self.rounds.len() {
                self.stage_sends(io, sh);
                self.sent = true;
                self.flush(io, sh)?;
            }
            self.post_recvs(io, sh)?;
            if self.round == self.rounds.len() {
                return Ok(self.outbox.is_empty() && !self.busy());
            }
            // The round's receives, and no send still reading a block the
            // round writes.
            if self.missing[self.round] > 0 {
                return Ok(false);
            }
            let range = self.first[self.round]..self.first[self.round + 1];
            if zero_copy
                && self.recvs[range]
                    .iter()
                    .any(|&(_, x)| self.read_by_sends(x.at, x.len))
            {
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
        let direct = self.direct(&x);
        if direct {
            self.direct_recvs -= 1;
        }
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
        let arrival = match (c.result, c.buffer) {
            (Ok(()), None) if direct => match c.multi {
                Some((_, got)) if got == expect => Arrival::Direct,
                other => return Err(mismatch(other.map(|m| m.1))),
            },
            (Ok(()), Some(b)) if b.len() == expect => Arrival::Pooled(b),
            (Ok(()), Some(b)) => {
                let got = b.len();
                sh.pool.give(b);
                return Err(mismatch(Some(got)));
            }
            (Ok(()), None) => return Err(Failure::seen("a receive came back without its buffer".into())),
            (Err(CompletionError::Truncated { message_len, .. }), b) => {
                sh.pool.give_opt(b);
                return Err(mismatch(message_len));
            }
            (Err(e), b) => {
                sh.pool.give_opt(b);
                return Err(Failure {
                    message: format!("the receive from rank {} failed: {e}", x.peer),
                    grace: LOSS_GRACE,
                });
            }
        };
        if self.arrived[g].replace(arrival).is_none() {
            self.missing[round] -= 1;
        }
        Ok(())
    }

    fn borrowed_sent(&mut self, slot: u32) {
        if let Some(s) = self.sending.get_mut(slot as usize) {
            *s = None;
        }
    }

    fn awaited(&self, out: &mut Vec<u32>) {
        let (Some(&from), Some(&to)) = (self.first.get(self.round), self.first.get(self.round + 1)) else {
            return;
        };
        for g in from..to {
            let peer = self.recvs[g].1.peer;
            if self.arrived[g].is_none() && !out.contains(&peer) {
                out.push(peer);
            }
        }
    }

    fn busy(&self) -> bool {
        self.sending.iter().any(Option::is_some) || self.direct_recvs > 0
    }

    fn succeed(self: Box<Self>) {
        let Run { work, outcome, .. } = *self;
        *outcome.lock() = Some(Ok(work));
    }

    fn spare(&mut self) -> Spare {
        Spare {
            recvs: std::mem::take(&mut self.recvs),
            first: std::mem::take(&mut self.first),
            arrived: std::mem::take(&mut self.arrived),
            missing: std::mem::take(&mut self.missing),
            sending: std::mem::take(&mut self.sending),
        }
    }
}
