//! The World's point-to-point messages: `send`, `recv`, and `poll`, which
//! also progresses the collectives and turns failures into the loss of the
//! rank behind them.

use super::collectives::io::is_reserved;
use super::messages::is_message;
use super::state::World;
use super::tags;
use crate::error::{Error, Result};
use crate::memory::buffer::Buffer;
use crate::transport::event_loop::{Completion, PostError, RecvOpts, SendOpts, Token};
use crate::transport::liveness::LOSS_GRACE;
use std::time::{Duration, Instant};

impl World {
    /// Send `buf` to `to` with the application's `tag`, completing with
    /// `token` in [`World::poll`]: the token interface, for programs that
    /// drive their own completion loop (typed messages with requests:
    /// [`World::send`], [`World::isend`]).
    ///
    /// Tokens whose top byte is `0xFE`, `0xFD` or `0xFC` are the World's
    /// own and are refused. To a rank on this node the message goes over
    /// shared memory where [`World::shm_ranks`] lists it.
    pub fn send_buffer(&mut self, to: u32, tag: u32, buf: Buffer, token: Token) -> Result<(), PostError> {
        let _call = self.live.call();
        if let Err(error) = self.check_rank(to).and_then(|()| check_token(token)) {
            return Err(PostError {
                error,
                buffer: Some(buf),
            });
        }
        self.post_send(tags::CLASS_USER, to, tag, buf, token)
    }

    /// Post a send in message class `class` to world rank `to` (checked
    /// by the caller).
    pub(crate) fn post_send(
        &mut self,
        class: u64,
        to: u32,
        tag: u32,
        buf: Buffer,
        token: Token,
    ) -> Result<(), PostError> {
        let tag = tags::encode(class, self.rank(), tag);
        if let Some(n) = self
            .announcer
            .as_ref()
            .and_then(|a| a.announces(class, to, buf.len()))
        {
            return self
                .send_announced(to, tag, n, buf, token)
                .map_err(|e| self.explain_post(e));
        }
        let r = {
            let (_, mut io) = self.engine_io();
            // A communicator's class is the World's to post in.
            io.lane(to).send(class == tags::CLASS_USER, tag, buf, token)
        };
        r.map_err(|e| self.explain_post(e))
    }

    /// An operation that failed while a rank was being lost (a send to a
    /// dead rank fills its queue first) fails as that rank's loss.
    fn explain_post(&self, mut e: PostError) -> PostError {
        if let Some(r) = self.live.first_lost() {
            e.error = self.lost(r);
        }
        e
    }

    /// Receive into `buf` from `from` (`None`: any rank) with `tag`
    /// (`None`: any tag), completing with `token` in [`World::poll`]: the
    /// token interface ([`World::recv`], [`World::irecv`] for typed
    /// messages with requests). [`World::source`] and [`World::tag`] say
    /// what arrived. Tokens whose top byte is `0xFE`, `0xFD` or `0xFC` are
    /// refused, as for [`World::send_buffer`].
    pub fn recv_buffer(
        &mut self,
        from: Option<u32>,
        tag: Option<u32>,
        buf: Buffer,
        token: Token,
    ) -> Result<(), PostError> {
        let _call = self.live.call();
        if let Err(error) = check_token(token) {
            return Err(PostError {
                error,
                buffer: Some(buf),
            });
        }
        self.post_recv(tags::CLASS_USER, from, tag, buf, token)
    }

    /// Post a receive in message class `class` from world rank `from`
    /// (`None`: any) with `tag` (`None`: any); fails at once if `from`, or
    /// for any source any rank, is lost.
    pub(crate) fn post_recv(
        &mut self,
        class: u64,
        from: Option<u32>,
        tag: Option<u32>,
        buf: Buffer,
        token: Token,
    ) -> Result<(), PostError> {
        let checked = match from {
            Some(r) => self.check_rank(r),
            None => self.live.first_lost().map_or(Ok(()), |r| Err(self.lost(r))),
        };
        if let Err(error) = checked {
            return Err(PostError {
                error,
                buffer: Some(buf),
            });
        }
        let want = tags::matcher(class, from, tag);
        let opts = RecvOpts {
            tag: Some(want),
            from: None,
        };
        let r = match self.local.as_mut() {
            None => tags::post_recv_in(&mut self.ev, class, self.ep, buf, opts, token),
            Some(l) => match l.claim(want, buf, token) {
                Ok(()) => Ok(()),
                Err(buf) => l.recv(&mut self.ev, self.ep, class, from, tag, buf, token),
            },
        };
        r.map_err(|e| self.explain_post(e))
    }

    /// The rank a received message came from.
    pub fn source(&self, c: &Completion) -> u32 {
        tags::source_of(c.tag)
    }

    /// The application's tag of a received message.
    pub fn tag(&self, c: &Completion) -> u32 {
        tags::user_tag_of(c.tag)
    }

    /// [`EventLoop::poll`](crate::transport::event_loop::EventLoop::poll),
    /// failing with [`Error::RankLost`] once any rank
    /// of the world is gone (noticed within milliseconds of its process
    /// ending). A batch with a failed completion waits up to 300 ms for a
    /// loss to be noticed, so a send that failed because its peer died is
    /// reported as that rank's loss. A `None` timeout waits in slices, so a
    /// lost rank still ends the wait.
    ///
    /// Collectives and typed messages started with the `i…` methods
    /// progress here too; their completions are never handed out. Completions of the application's
    /// operations that arrived while a collective was waited for come
    /// first.
    pub fn poll(&mut self, out: &mut Vec<Completion>, timeout: Option<Duration>) -> Result<usize> {
        let _call = self.live.call();
        self.cancel_dropped();
        const SLICE: Duration = Duration::from_millis(20);
        let deadline = timeout.map(|t| Instant::now() + t);
        // The first slice needs no second look at the clock.
        let mut first = timeout;
        loop {
            if let Some(r) = self.live.first_lost() {
                out.clear();
                return Err(self.lost(r));
            }
            // Non-blocking calls in the node's slots move on here too.
            self.progress_slot_requests()?;
            out.clear();
            if self.coll.take_kept(out) > 0 {
                self.msgs.absorb(out);
                if !out.is_empty() {
                    return Ok(out.len());
                }
            }
            let slice = match (first.take(), deadline) {
                (Some(t), _) => t.min(SLICE),
                (None, Some(d)) => d.saturating_duration_since(Instant::now()).min(SLICE),
                (None, None) => SLICE,
            };
            // A post in the slots does not wake the completion queue's wait.
            let slice = match self.slot_requests.is_empty() {
                true => slice,
                false => slice.min(super::local::SLEEP_SLICE),
            };
            let polled = self.engine_io().1.poll(out, Some(slice));
            let n = match polled {
                Ok(n) => n,
                Err(e) => return Err(self.live.first_lost().map_or(e, |r| self.lost(r))),
            };
            let n = if self.coll.in_flight() > 0 || out.iter().any(|c| is_reserved(c.token)) {
                let (engine, mut io) = self.engine_io();
                engine.filter(&mut io, out);
                out.len()
            } else {
                n
            };
            self.msgs.absorb(out);
            let n = n.min(out.len());
            if n > 0 && out.iter().any(|c| c.result.is_err()) {
                // A send to a rank that just died fails on the fabric (FI_ECONNRESET
                // on tcp;ofi_rxm) a moment before its socket's end is seen:
                // give liveness that moment, and report the loss, naming the rank.
                if let Some(r) = self.wait_for_loss(LOSS_GRACE) {
                    out.clear();
                    return Err(self.lost(r));
                }
            }
            if n > 0 || deadline.is_some_and(|d| Instant::now() >= d) {
                return Ok(n);
            }
        }
    }

    /// The first lost rank, waiting up to `grace` for one to be noticed.
    fn wait_for_loss(&self, grace: Duration) -> Option<u32> {
        let until = Instant::now() + grace;
        loop {
            if let Some(r) = self.live.first_lost() {
                return Some(r);
            }
            if Instant::now() >= until {
                return None;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

impl World {
    /// Send `buf` to `to` under World tag `tag` as announced message
    /// number `n` (`Announcer::announces`): the announcement, injected so
    /// it keeps its place behind this rank's earlier sends to `to`, then
    /// the data, which completes with `token`.
    fn send_announced(
        &mut self,
        to: u32,
        tag: u64,
        n: u32,
        buf: Buffer,
        token: Token,
    ) -> Result<(), PostError> {
        let peer = &self.peers[to as usize];
        let announced = SendOpts {
            tag: Some(tag | tags::ANNOUNCED),
            data: None,
        };
        if let Err(error) =
            self.ev
                .as_world()
                .inject(peer, &super::local::engine::note(buf.len(), n), announced)
        {
            return Err(PostError {
                error,
                buffer: Some(buf),
            });
        }
        if let Some(a) = self.announcer.as_mut() {
            a.announced(to, n);
        }
        let data = SendOpts {
            tag: Some(tags::bulk_tag(self.rank(), n)),
            data: None,
        };
        self.ev.as_world().send(peer, buf, data, token)
    }
}

/// Refuse the tokens the collectives, the any-source pairs and the typed
/// messages use.
pub(super) fn check_token(token: Token) -> Result<()> {
    if is_reserved(token) || super::local::is_pair(token) || is_message(token) {
        return Err(Error::Usage(format!(
            "token {:#x} is in the range the World uses (top byte 0xFE, 0xFD or 0xFC): choose another",
            token.0
        )));
    }
    Ok(())
}
