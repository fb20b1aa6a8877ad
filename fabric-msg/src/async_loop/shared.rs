//! What the handles, the futures and the driver share: the loop itself
//! behind a lock, and a slot per operation in flight that its future
//! waits on.

use super::streams::{is_stream, Streams};
use crate::error::Error;
use crate::memory::buffer::Buffer;
use crate::transport::event_loop::{Completion, EndpointId, EventLoop, OpKind, PostError, Token};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::Waker;
use std::time::Duration;
use tokio::sync::{oneshot, Notify};

/// What became of one operation.
// A result is held in place: boxing it would allocate per operation.
#[allow(clippy::large_enum_variant)]
pub(super) enum Slot {
    /// No operation: on the free list.
    Free,
    /// Posted, not completed. `spinning`: its future looks at the loop at
    /// every poll (see [`super::op`]), so the driver need not.
    Waiting { waker: Option<Waker>, spinning: bool },
    /// Completed (or failed with the loop's close); its future takes it.
    Done(Result<Completion, PostError>),
    /// Its future was dropped: the completion, and its buffer, are dropped
    /// when it comes.
    Abandoned,
}

/// The state behind the lock.
pub(super) struct State {
    /// `None` once closed.
    pub(super) ev: Option<EventLoop>,
    slots: Vec<Slot>,
    free: Vec<u64>,
    out: Vec<Completion>,
    /// Operations whose futures look at the loop themselves.
    pub(super) spinners: usize,
    /// Operations nobody looks for but the driver: waiting futures past
    /// their spin, abandoned operations, and multi-receive buffers.
    pub(super) sleepers: usize,
    /// Wakes the driver: close, or the looking passed from the futures
    /// to it (the last spinner stopped while others wait).
    driver: Arc<Notify>,
    /// How many looks at the loop were made, by anyone: a future that
    /// finds another looked since its last poll does not look again.
    pub(super) looks: u64,
    /// How many times the loop did something (a post, a look that found
    /// completions): the driver keeps looking for a spin after it sees
    /// this change even when no future waits, as a provider may need
    /// progress to finish what it started (a rendezvous' last steps after
    /// both its operations completed). A count, not a time: a clock read
    /// per post and per completion was a tenth of a shm ping-pong's time
    /// (`perf record`, 2026-11-29); the driver reads the clock when it
    /// sees the count move.
    pub(super) busy: u64,
    /// Asked to close (by `close`, the last handle, or a failed look).
    pub(super) closing: bool,
    /// How long a future keeps looking itself before it leaves the loop
    /// to the driver: [`super::SPIN_BEFORE_SLEEP`] on a loop with a wait
    /// fd, [`super::POLL_BEFORE_SLEEP`] on one without.
    pub(super) spin: Duration,
    /// Who waits in `close` for the loop to be gone.
    pub(super) closers: Vec<oneshot::Sender<()>>,
    /// The notices of peers' `write_data` that used up no receive, not
    /// yet awaited (at most [`NOTICES_KEPT`]), and the slots of the
    /// futures awaiting one, oldest first.
    notices: VecDeque<Completion>,
    notice_waits: VecDeque<Token>,
    /// The multi-receive buffers in flight (`async_loop/streams.rs`); each
    /// counts as a sleeper until its last completion comes.
    pub(super) streams: Streams,
}

/// How many notices of peers' `write_data` a loop keeps for
/// [`LoopHandle::remote_write`](super::LoopHandle::remote_write) before it
/// drops the oldest, saying so: a program that never awaits them does not
/// grow without bound.
pub(super) const NOTICES_KEPT: usize = 1024;

/// Run `post` on `ev` under the loop's fail-fast rule: a post with no
/// room fails with `QueueFull` at once instead of waiting in place, which
/// would hold the lock and the runtime's worker while the task that makes
/// the room may wait behind them. Callers retry after a look
/// ([`LoopHandle::recv`](super::LoopHandle::recv)).
pub(super) fn failing_fast<R>(ev: &mut EventLoop, post: impl FnOnce(&mut EventLoop) -> R) -> R {
    let was = ev.set_fail_fast(true);
    let r = post(ev);
    ev.set_fail_fast(was);
    r
}

/// The loop and its slots, shared by every handle, future and the driver.
pub(super) struct Shared {
    state: Mutex<State>,
    /// The driver's alarm (see [`State`]).
    pub(super) driver: Arc<Notify>,
}

pub(super) fn closed() -> PostError {
    PostError {
        error: Error::Closed {
            what: "the async event loop (every LoopHandle dropped, close called, or its driver ended)".into(),
        },
        buffer: None,
    }
}

impl Shared {
    pub(super) fn new(ev: EventLoop, spin: Duration) -> Shared {
        let driver = Arc::new(Notify::new());
        Shared {
            state: Mutex::new(State::new(Some(ev), spin, driver.clone())),
            driver,
        }
    }

    /// The state. No code under the lock panics on purpose; should a
    /// provider call panic in one task, the state it left is still the
    /// loop's (each slot changes in one step), so the others go on.
    pub(super) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Ask the driver to close the loop.
    pub(super) fn close_soon(&self) {
        self.lock().closing = true;
        self.driver.notify_one();
    }
}

impl State {
    fn new(ev: Option<EventLoop>, spin: Duration, driver: Arc<Notify>) -> State {
        State {
            ev,
            slots: Vec::new(),
            free: Vec::new(),
            out: Vec::new(),
            spinners: 0,
            sleepers: 0,
            looks: 0,
            busy: 0,
            driver,
            closing: false,
            spin,
            closers: Vec::new(),
            notices: VecDeque::new(),
            notice_waits: VecDeque::new(),
            streams: Streams::default(),
        }
    }

    /// A spinner stopped looking (it completed, stopped spinning or was
    /// dropped). The last one wakes the driver if others wait, since
    /// nobody else looks at the loop for them now.
    fn unspin(&mut self) {
        self.spinners -= 1;
        if self.spinners == 0 && self.sleepers > 0 {
            self.driver.notify_one();
        }
    }

    /// A slot for an operation about to be posted; its token.
    fn open(&mut self) -> Token {
        let waiting = Slot::Waiting {
            waker: None,
            spinning: true,
        };
        self.spinners += 1;
        match self.free.pop() {
            Some(t) => {
                self.slots[t as usize] = waiting;
                Token(t)
            }
            None => {
                self.slots.push(waiting);
                Token(self.slots.len() as u64 - 1)
            }
        }
    }

    /// Empty slot `t`, counting it out of the spinners or sleepers; what
    /// it held. The caller fills it again or frees it.
    fn empty(&mut self, t: usize) -> Slot {
        if matches!(self.slots[t], Slot::Abandoned) {
            self.release(t);
            return Slot::Abandoned;
        }
        if let Some(waker) = self.release(t) {
            return Slot::Waiting {
                waker,
                spinning: false,
            };
        }
        std::mem::replace(&mut self.slots[t], Slot::Free)
    }

    /// If slot `t` waits (or was abandoned): count it out of the spinners
    /// or sleepers, mark it free (not yet on the free list) and give its
    /// waker. Done in place: a whole slot is the size of a completion,
    /// and moving one out costs a copy of it.
    fn release(&mut self, t: usize) -> Option<Option<Waker>> {
        let waker = match &mut self.slots[t] {
            Slot::Waiting { waker, spinning } => {
                let (waker, spinning) = (waker.take(), *spinning);
                if spinning {
                    self.unspin();
                } else {
                    self.sleepers -= 1;
                }
                waker
            }
            Slot::Abandoned => {
                self.sleepers -= 1;
                None
            }
            Slot::Done(_) | Slot::Free => return None,
        };
        self.slots[t] = Slot::Free;
        Some(waker)
    }

    /// Empty slot `t` and put it on the free list.
    fn free_slot(&mut self, t: usize) -> Slot {
        let slot = self.empty(t);
        if !matches!(slot, Slot::Free) {
            self.free.push(t as u64);
        }
        slot
    }

    /// Post an operation with `post` under a new slot's token; a refusal
    /// (or a closed loop) gives the buffer back with the error.
    pub(super) fn post(
        &mut self,
        buf: Buffer,
        post: impl FnOnce(&mut EventLoop, Buffer, Token) -> Result<(), PostError>,
    ) -> Result<Token, PostError> {
        self.post_in(|ev, t| match ev {
            Some(ev) => post(ev, buf, t),
            None => Err(PostError {
                buffer: Some(buf),
                ..closed()
            }),
        })
    }

    /// Post an operation that lends no buffer (a one-sided operation or an
    /// atomic, whose memory is a registered region the operation holds, or
    /// a peek) with `post` under a new slot's token.
    pub(super) fn post_bare(
        &mut self,
        post: impl FnOnce(&mut EventLoop, Token) -> crate::error::Result<()>,
    ) -> crate::error::Result<Token> {
        self.post_in(|ev, t| match ev {
            Some(ev) => post(ev, t),
            None => Err(closed().error),
        })
    }

    /// Open a slot and call `post` with its token and the loop (`None`
    /// once closed or closing); a refusal frees the slot again.
    fn post_in<E>(
        &mut self,
        post: impl FnOnce(Option<&mut EventLoop>, Token) -> Result<(), E>,
    ) -> Result<Token, E> {
        let t = self.open();
        self.busy = self.busy.wrapping_add(1);
        let ev = if self.closing { None } else { self.ev.as_mut() };
        let posted = post(ev, t);
        if posted.is_err() {
            // The slot goes; the error (and buffer) go back to the caller.
            self.free_slot(t.0 as usize);
        }
        posted.map(|()| t)
    }

    /// `t`'s result, if it has one (the slot is then free).
    pub(super) fn take(&mut self, t: Token) -> Option<Result<Completion, PostError>> {
        if !matches!(self.slots[t.0 as usize], Slot::Done(_)) {
            return None;
        }
        match self.free_slot(t.0 as usize) {
            Slot::Done(r) => Some(r),
            _ => None,
        }
    }

    /// `t`'s future waits: remember its waker, and whether it goes on
    /// looking itself.
    pub(super) fn wait(&mut self, t: Token, waker: &Waker, spinning: bool) {
        let Slot::Waiting {
            waker: w,
            spinning: s,
        } = &mut self.slots[t.0 as usize]
        else {
            return;
        };
        match w {
            Some(w) if w.will_wake(waker) => {}
            _ => *w = Some(waker.clone()),
        }
        if *s && !spinning {
            *s = false;
            self.sleepers += 1;
            self.unspin();
        }
    }

    /// `t`'s future was dropped before it took its result. Whether its
    /// operation was still in flight (its completion is then dropped when
    /// it comes).
    pub(super) fn abandon(&mut self, t: Token) -> bool {
        let i = t.0 as usize;
        match self.slots[i] {
            Slot::Done(_) => {
                self.free_slot(i);
                false
            }
            Slot::Waiting { spinning, .. } => {
                self.slots[i] = Slot::Abandoned;
                // A spinner becomes a sleeper: only the driver looks for
                // it now (counted before `unspin`, which tells the driver).
                if spinning {
                    self.sleepers += 1;
                    self.unspin();
                }
                true
            }
            Slot::Free | Slot::Abandoned => false,
        }
    }

    /// Cancel the receive posted on `ep` under `t`, whose future was
    /// dropped (see [`super`], "Dropping a future"). Where the provider
    /// cannot cancel it, it stays posted, as before cancelling existed,
    /// and says so.
    pub(super) fn cancel_recv(&mut self, ep: EndpointId, t: Token) {
        let Some(ev) = self.ev.as_mut() else {
            return; // closed: the close ended it
        };
        if let Err(e) = ev.cancel_recv(ep, t) {
            log::warn!(
                "async loop: a dropped receive future's receive could not be cancelled ({e}); it stays posted \
                 and takes the next message it matches"
            );
        }
    }

    /// The waiting operation in slot `t` ended with `r`: its future is
    /// woken to take it.
    fn finish(&mut self, t: usize, r: Result<Completion, PostError>) {
        let waker = self.release(t).flatten();
        self.slots[t] = Slot::Done(r);
        if let Some(w) = waker {
            w.wake();
        }
    }

    /// One look at the loop: each completion to its slot, its future
    /// woken. A failed look asks the driver to close the loop (whoever
    /// looked), which answers every wait.
    pub(super) fn look(&mut self) -> crate::error::Result<()> {
        self.look_for(None).map(drop)
    }

    /// [`State::look`] by the future of the operation under `own`: its
    /// completion, if this look found it, comes back here instead of
    /// through its slot (which is freed), so it is not moved into the
    /// table and out again, and its task is not woken for it.
    pub(super) fn look_for(&mut self, own: Option<Token>) -> crate::error::Result<Option<Completion>> {
        let Some(ev) = self.ev.as_mut() else {
            return Ok(None);
        };
        self.looks += 1;
        let n = match ev.poll(&mut self.out, Some(Duration::ZERO)) {
            Ok(n) => n,
            Err(e) => {
                log::error!(error:% = e; "async loop: polling the event loop failed, closing it: {e}");
                self.closing = true;
                self.driver.notify_one();
                return Err(e);
            }
        };
        if n == 0 {
            return Ok(None);
        }
        self.busy = self.busy.wrapping_add(1);
        let mut found = None;
        // Moved out while the slots are written; `out` keeps its capacity.
        let mut out = std::mem::take(&mut self.out);
        for c in out.drain(..) {
            if c.kind == OpKind::PeerLost {
                continue; // the loss alarm tells; each operation fails on its own
            }
            if c.token == Token::REMOTE {
                self.notice(c, own, &mut found);
                continue;
            }
            if is_stream(c.token) {
                if self.streams.arrived(c) {
                    self.sleepers -= 1;
                }
                continue;
            }
            let t = c.token.0 as usize;
            match self.slots.get(t) {
                Some(Slot::Waiting { .. }) if Some(c.token) == own => {
                    self.release(t);
                    self.free.push(t as u64);
                    found = Some(c);
                }
                Some(Slot::Waiting { .. }) => self.finish(t, Ok(c)),
                // A dropped future: the completion, and its buffer, go.
                Some(Slot::Abandoned) => {
                    self.free_slot(t);
                }
                _ => log::warn!(
                    "async loop: a {:?} completion with token {} nobody waits for (posted through with_loop?) dropped",
                    c.kind,
                    c.token.0
                ),
            }
        }
        self.out = out;
        Ok(found)
    }

    /// A future awaits the next notice of a peer's `write_data`: the one
    /// kept, or a slot of its own that the next one fills.
    pub(super) fn await_notice(&mut self) -> crate::error::Result<Result<Completion, Token>> {
        if let Some(c) = self.notices.pop_front() {
            return Ok(Ok(c));
        }
        let t = self.post_bare(|_, _| Ok(()))?;
        self.notice_waits.push_back(t);
        Ok(Err(t))
    }

    /// The future awaiting a notice in slot `t` was dropped: its slot is
    /// freed (there is no operation behind it). A notice it was handed and
    /// did not take goes to the next future awaiting one, or back to the
    /// front of the kept ones (it is older than any of them): only futures
    /// that wait are in `notice_waits`, and while one waits none is kept.
    pub(super) fn forget_notice_wait(&mut self, t: Token) {
        self.notice_waits.retain(|&w| w != t);
        if let Slot::Done(Ok(c)) = self.free_slot(t.0 as usize) {
            if self.notice_waits.is_empty() {
                self.notices.push_front(c);
            } else {
                self.notice(c, None, &mut None);
            }
        }
    }

    /// A notice of a peer's `write_data` came (`c`, under
    /// [`Token::REMOTE`]): to the oldest future awaiting one (`found`, if
    /// that is the future looking, `own`), or kept for the next.
    fn notice(&mut self, c: Completion, own: Option<Token>, found: &mut Option<Completion>) {
        while let Some(t) = self.notice_waits.pop_front() {
            let i = t.0 as usize;
            match self.slots[i] {
                Slot::Waiting { .. } if Some(t) == own => {
                    self.release(i);
                    self.free.push(t.0);
                    *found = Some(c);
                    return;
                }
                Slot::Waiting { .. } => return self.finish(i, Ok(c)),
                // Not met: only waiting futures are listed (a dropped one
                // leaves the list at once, `forget_notice_wait`, and the
                // close empties it). Skipped, never handed a notice.
                Slot::Abandoned => {
                    self.free_slot(i);
                }
                Slot::Done(_) | Slot::Free => {}
            }
        }
        if self.notices.len() == NOTICES_KEPT {
            log::warn!(
                "async loop: {NOTICES_KEPT} notices of peers' write_data wait for LoopHandle::remote_write; the \
                 oldest is dropped"
            );
            self.notices.pop_front();
        }
        self.notices.push_back(c);
    }

    /// Close the loop: the futures still waiting fail with `Closed`. The
    /// loop is given back to be dropped outside the lock (closing its
    /// endpoints waits for the provider to let go of their buffers).
    pub(super) fn close(&mut self) -> Option<EventLoop> {
        self.closing = true;
        let ev = self.ev.take();
        // Their slots are answered below; no notice comes after the close.
        self.notice_waits.clear();
        self.sleepers -= self.streams.close();
        for t in 0..self.slots.len() {
            match self.empty(t) {
                Slot::Waiting { waker, .. } => {
                    self.slots[t] = Slot::Done(Err(closed()));
                    if let Some(w) = waker {
                        w.wake();
                    }
                }
                // A result not yet taken stays for its future.
                done @ Slot::Done(_) => self.slots[t] = done,
                Slot::Abandoned => self.free.push(t as u64),
                Slot::Free => {}
            }
        }
        ev
    }
}

#[cfg(test)]
mod tests;
