//! The send backlog: sends the provider had no room for (`FI_EAGAIN`)
//! are kept by the loop, in order per peer, and posted again each time
//! the loop progresses, instead of holding the caller in a retry loop.
//!
//! Why: a provider with bounded unexpected-message space (shm in 1.17
//! shares one pool of `rx_size` entries between posted receives and
//! messages that arrived before their receive) refuses a sender until the
//! receiving *application* posts receives. If the send call spun until
//! then, a ring of ranks that all send before they receive would wait on
//! each other for ever: every rank inside `send`, none reposting. With the
//! backlog, `send` returns, the application keeps polling and posting
//! receives, and the backlog drains as its peers do the same.
//!
//! A backlogged send holds its operation slot and its buffer (nothing is
//! allocated per message), does not count against the CQ's bound (it is
//! not posted), and completes like any send: successfully once posted and
//! done, with the peer's loss if its peer is lost first, or with
//! [`CompletionError::NotPosted`] if the application set a
//! [`LoopConfig::post_timeout`] and the provider still had no room when it
//! passed (counted from when the send ahead of it to the same peer was
//! posted) or refused it otherwise. By default there is no such deadline:
//! a peer that computes for minutes before it receives is no failure.
//! Later sends to the same peer queue behind it, so per-peer order holds;
//! sends to other peers are not held up by it. At most
//! [`LoopConfig::max_backlog`] sends wait; one more waits inside the call,
//! progressing, for the backlog to shrink.

use super::post::{raw_send, send_call, Posting};
use super::*;
use crate::error::{Error, ErrorCode, Result};
use crate::ffi;
use crate::memory::buffer::Buffer;
use std::collections::VecDeque;
use std::os::raw::c_void;
use std::time::{Duration, Instant};

/// What a send is posted with, kept for posting it again.
#[derive(Clone, Copy)]
pub(super) struct SendArgs {
    pub(super) raw: *mut ffi::fid_ep,
    pub(super) desc: *mut c_void,
    pub(super) addr: ffi::fi_addr_t,
    pub(super) tag: Option<u64>,
    pub(super) data: Option<u64>,
}

/// One backlogged send.
#[derive(Clone, Copy)]
struct Deferred {
    index: u32,
    generation: u64,
    bufp: *mut c_void,
    len: usize,
    args: SendArgs,
    since: Instant,
    /// `since` plus the `post_timeout` in force when it was kept; `None`:
    /// no deadline (the default).
    deadline: Option<Instant>,
}

/// The sends waiting for room, oldest first, and the peers found full
/// during one pass over them (kept to reuse its allocation).
pub(super) struct Backlog {
    queue: VecDeque<Deferred>,
    full: Vec<(*mut ffi::fid_ep, ffi::fi_addr_t)>,
}

impl Backlog {
    /// Room reserved up front, so that the first send a warmed-up loop
    /// backlogs allocates nothing (`tests/no_alloc.rs` counts); a longer
    /// backlog grows it once per doubling.
    pub(super) fn new() -> Backlog {
        Backlog {
            queue: VecDeque::with_capacity(64),
            full: Vec::with_capacity(8),
        }
    }

    /// Sends waiting.
    pub(super) fn len(&self) -> usize {
        self.queue.len()
    }

    /// Whether a send to `addr` on `raw` waits (a new one must queue behind it).
    #[inline]
    fn holds(&self, raw: *mut ffi::fid_ep, addr: ffi::fi_addr_t) -> bool {
        !self.queue.is_empty()
            && self
                .queue
                .iter()
                .any(|d| d.args.raw == raw && d.args.addr == addr)
    }
}

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
            unsafe { raw_send(a.raw, bufp, len, a.desc, a.addr, a.tag, a.data, ctx) }
        };
        let result = if self.fail_fast() {
            self.retry(what.call, post).map(|_| ())
        } else {
            let rc = if self.posted() >= self.cq.capacity || self.backlog.holds(a.raw, a.addr) {
                -(ffi::FI_EAGAIN as isize)
            } else {
                post()
            };
            if rc == -(ffi::FI_EAGAIN as isize) {
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
        raw: *mut ffi::fid_ep,
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
        raw: *mut ffi::fid_ep,
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
            if self.posted() >= self.cq.capacity {
                break;
            }
            let ctx = (&mut *self.slab.slots[d.index as usize] as *mut slab::OpSlot).cast::<c_void>();
            let a = d.args;
            // SAFETY: as in `post_send`: the slot still owns the buffer at
            // bufp (checked above: same generation, in use).
            let rc = unsafe { raw_send(a.raw, d.bufp, d.len, a.desc, a.addr, a.tag, a.data, ctx) };
            if rc == -(ffi::FI_EAGAIN as isize) {
                full.push(key);
                i += 1;
                continue;
            }
            self.backlog.queue.remove(i);
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
