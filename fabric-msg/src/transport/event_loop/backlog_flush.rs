//! The loop's side of the send backlog (`backlog.rs`): a send the provider
//! has no room for goes into the backlog instead of failing, later sends to
//! the same peer queue behind it, and each `poll` posts what it can, in
//! order, failing what waited past the application's `post_timeout` or
//! was addressed to a peer since lost.

use super::backlog::{Deferred, SendArgs};
use super::calls::send_call;
use super::post::Posting;
use super::slab;
use super::state::EventLoop;
use super::types::{Completion, CompletionError, OpKind, PostError};
use crate::error::{Error, ErrorCode, Result};
use crate::ffi;
use crate::libfabric::RawEndpoint;
use crate::memory::buffer::Buffer;
use std::os::raw::c_void;
use std::time::{Duration, Instant};

impl EventLoop {
    /// Operations handed to the provider: in flight, less the backlog.
    #[inline]
    pub(super) fn posted(&self) -> usize {
        self.slab.in_flight.saturating_sub(self.backlog.len())
    }

    /// Post a send of `buf`, or keep it in the backlog while the provider
    /// has no room, or while the CQ has none for its completion (as many
    /// operations posted as it holds: the send is posted once some
    /// complete, so a sender whose peer has not posted its receives is not
    /// held inside `send`). Where posts fail fast
    /// ([`EventLoop::fail_fast`]: the World's collectives posting, or a
    /// zero `post_timeout`) a full queue fails the post instead.
    pub(super) fn post_send(&mut self, what: Posting, mut buf: Buffer, a: SendArgs) -> Result<(), PostError> {
        let room = if self.fail_fast() {
            self.wait_for_room()
        } else {
            Ok(())
        };
        if let Err(error) = room.and_then(|()| self.wait_for_backlog_room(what.call)) {
            return Err(PostError {
                error,
                buffer: Some(buf),
            });
        }
        let bufp = buf.ptr(what.framed);
        let (index, generation, ctx) = self.slot_for(&what, bufp as usize);
        self.slab.slots[index as usize].buffer = Some(buf);
        let len = what.len;
        let post = move || {
            // SAFETY: raw is an enabled endpoint; bufp/len describe the
            // buffer the slot owns until the completion; ctx is the slot's.
            unsafe { a.raw.send(bufp, len, a.desc, a.addr, a.tag, a.data, ctx) }
        };
        let result = if self.fail_fast() {
            self.retry(what.call, post).map(|_| ())
        } else {
            let rc = if self.posted() >= self.objects.cq_capacity || self.backlog.holds(a.raw, a.addr) {
                -(ffi::FI_EAGAIN as isize)
            } else {
                post()
            };
            if rc == -(ffi::FI_EAGAIN as isize) {
                self.stats.retries += 1;
                let since = Instant::now();
                self.backlog.queue.push_back(Deferred {
                    index,
                    generation,
                    bufp,
                    len,
                    args: a,
                    since,
                    deadline: self.cfg.post_timeout.and_then(|t| since.checked_add(t)),
                });
                return Ok(());
            }
            crate::error::check(what.call, rc as i64).map(|_| ())
        };
        result.map_err(|error| PostError {
            error,
            buffer: self.slab.release(index),
        })
    }

    /// Wait (progressing, while [`EventLoop::patient`]) until no send to
    /// `addr` on `raw` is backlogged: an `inject` or a borrowed send to
    /// that peer is posted in place and must not pass them. Not where
    /// posts fail fast: the World's collectives, whose class of tags no
    /// application receive matches, so order against the application's
    /// sends does not matter, and waiting here for them could wait for a
    /// peer that is itself inside the collective.
    #[inline]
    pub(super) fn behind_backlog(
        &mut self,
        raw: RawEndpoint,
        addr: ffi::fi_addr_t,
        call: &'static str,
    ) -> Result<()> {
        // The clock is read only when there is something to wait for: this
        // runs on every inject (one clock_gettime per message was 6% of a
        // shm message-rate run).
        if self.fail_fast() || !self.backlog.holds(raw, addr) {
            return Ok(());
        }
        self.wait_behind_backlog(raw, addr, call)
    }

    fn wait_behind_backlog(
        &mut self,
        raw: RawEndpoint,
        addr: ffi::fi_addr_t,
        call: &'static str,
    ) -> Result<()> {
        // The wait is bounded while nothing moves, not while the backlog drains.
        let (mut left, mut started) = (self.backlog.len(), Instant::now());
        while self.backlog.holds(raw, addr) {
            if self.backlog.len() < left {
                (left, started) = (self.backlog.len(), Instant::now());
            }
            if !self.patient(started) {
                return Err(Error::QueueFull {
                    call,
                    waited: started.elapsed(),
                    in_flight: self.slab.in_flight,
                    code: Some(ErrorCode(ffi::FI_EAGAIN)),
                });
            }
            self.progress()?;
        }
        Ok(())
    }

    /// Wait (progressing, while [`EventLoop::patient`]) until the backlog
    /// holds fewer than [`LoopConfig::max_backlog`] sends.
    #[inline]
    fn wait_for_backlog_room(&mut self, call: &'static str) -> Result<()> {
        if self.backlog.len() < self.cfg.max_backlog.max(1) {
            return Ok(());
        }
        self.wait_for_backlog_room_slow(call)
    }

    #[cold]
    fn wait_for_backlog_room_slow(&mut self, call: &'static str) -> Result<()> {
        // As above: the wait is bounded while nothing moves.
        let (mut left, mut started) = (self.backlog.len(), Instant::now());
        while self.backlog.len() >= self.cfg.max_backlog.max(1) {
            if self.backlog.len() < left {
                (left, started) = (self.backlog.len(), Instant::now());
            }
            if !self.patient(started) {
                return Err(Error::QueueFull {
                    call,
                    waited: started.elapsed(),
                    in_flight: self.slab.in_flight,
                    code: Some(ErrorCode(ffi::FI_EAGAIN)),
                });
            }
            self.progress()?;
            if self.backlog.len() >= left {
                // Nothing could be posted: let the peer run (on a shared
                // core it is the one that must make room).
                std::thread::yield_now();
            }
        }
        Ok(())
    }

    /// Post what the backlog holds, oldest first, skipping peers found
    /// full in this pass; fail what waited past its deadline (only with a
    /// `post_timeout`) or while the layer above gives up.
    #[inline]
    pub(super) fn flush_backlog(&mut self) {
        if !self.backlog.queue.is_empty() {
            self.flush_backlog_now();
        }
    }

    fn flush_backlog_now(&mut self) {
        let give_up = self.giving_up();
        let now = Instant::now();
        let mut full = std::mem::take(&mut self.backlog.full);
        full.clear();
        let mut i = 0;
        while i < self.backlog.queue.len() {
            let d = self.backlog.queue[i];
            let s = &self.slab.slots[d.index as usize];
            if !s.in_use || s.generation != d.generation {
                // Its endpoint was closed: the slot was reclaimed.
                self.backlog.queue.remove(i);
                continue;
            }
            let key = (d.args.raw, d.args.addr);
            if full.contains(&key) {
                i += 1;
                continue;
            }
            let call = send_call(d.args.tag, d.args.data);
            let waited = now.saturating_duration_since(d.since);
            if give_up || d.deadline.is_some_and(|t| now >= t) {
                self.backlog.queue.remove(i);
                let code = Some(ErrorCode(ffi::FI_EAGAIN));
                let in_flight = self.slab.in_flight;
                let why = Error::QueueFull {
                    call,
                    waited,
                    in_flight,
                    code,
                };
                self.fail_backlogged(d.index, call, why.to_string());
                continue;
            }
            if self.posted() >= self.objects.cq_capacity {
                break;
            }
            let ctx = (&mut *self.slab.slots[d.index as usize] as *mut slab::OpSlot).cast::<c_void>();
            let a = d.args;
            // SAFETY: as in `post_send`: the slot still owns the buffer at
            // bufp (checked above: same generation, in use).
            let rc = unsafe { a.raw.send(d.bufp, d.len, a.desc, a.addr, a.tag, a.data, ctx) };
            if rc == -(ffi::FI_EAGAIN as isize) {
                self.stats.retries += 1;
                full.push(key);
                i += 1;
                continue;
            }
            self.backlog.queue.remove(i);
            self.stats.longest_wait = self.stats.longest_wait.max(waited);
            if rc < 0 {
                let e = Error::from_rc(call, rc as i64);
                self.fail_backlogged(d.index, call, e.to_string());
                continue;
            }
            // The peer took one: its next send's wait starts now (the
            // timeout is for a peer that makes no room, not for a long
            // queue that drains).
            let next = self.backlog.queue.range_mut(i..);
            if let Some(next) = next.into_iter().find(|n| (n.args.raw, n.args.addr) == key) {
                if let Some(deadline) = next.deadline {
                    let timeout = deadline.saturating_duration_since(next.since);
                    next.deadline = now.checked_add(timeout);
                }
                next.since = now;
            }
        }
        self.backlog.full = full;
    }

    /// Forget backlogged sends whose slots were reclaimed (their endpoint
    /// closed).
    pub(super) fn drop_stale_backlog(&mut self) {
        let slots = &self.slab.slots;
        self.backlog.queue.retain(|d| {
            let s = &slots[d.index as usize];
            s.in_use && s.generation == d.generation
        });
    }

    /// Backlogged sends to a lost peer (`addr` on `endpoint`) were never
    /// posted: each completes now with `failure` and its buffer.
    pub(super) fn fail_backlog_to(&mut self, endpoint: u32, addr: ffi::fi_addr_t, failure: &CompletionError) {
        let mut i = 0;
        while i < self.backlog.queue.len() {
            let d = self.backlog.queue[i];
            let s = &self.slab.slots[d.index as usize];
            let live = s.in_use && s.generation == d.generation;
            if live && (s.endpoint != endpoint || d.args.addr != addr) {
                i += 1;
                continue;
            }
            self.backlog.queue.remove(i);
            if live {
                let token = s.token;
                let buffer = self.slab.release(d.index);
                let mut c = Completion::outcome(token, endpoint, OpKind::Send, Err(failure.clone()));
                c.buffer = buffer;
                self.pending.push(c);
            }
        }
    }

    /// A backlogged send that was never posted completes with its buffer
    /// and the reason.
    fn fail_backlogged(&mut self, index: u32, call: &'static str, reason: String) {
        let (endpoint, token) = {
            let s = &self.slab.slots[index as usize];
            (s.endpoint, s.token)
        };
        let buffer = self.slab.release(index);
        let mut c = Completion::outcome(
            token,
            endpoint,
            OpKind::Send,
            Err(CompletionError::NotPosted { call, reason }),
        );
        c.buffer = buffer;
        self.pending.push(c);
    }

    /// How long `poll` may sleep while the backlog waits for room: the
    /// provider signals no wake-up when a peer frees room.
    pub(super) fn backlog_tick(&self) -> Option<Duration> {
        (!self.backlog.queue.is_empty()).then_some(Duration::from_millis(1))
    }
}
