//! The async side's front: [`AsyncLoop::start`] and the [`LoopHandle`]
//! every task holds.

use super::driver::{self, POLL_BEFORE_SLEEP, SPIN_BEFORE_SLEEP};
use super::op::{self, OnDrop};
use super::shared::{closed, failing_fast, Shared, State};
use crate::error::Error;
use crate::memory::buffer::Buffer;
use crate::transport::event_loop::{
    Completion, EndpointId, EventLoop, Peer, PostError, RecvOpts, SendOpts, Token,
};
use crate::transport::liveness::LossAlarm;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::oneshot;

/// Where an [`EventLoop`] goes to serve futures.
#[derive(Debug)]
pub struct AsyncLoop(());

impl AsyncLoop {
    /// Share `ev` with futures and start its driver task on the current
    /// tokio runtime (which must have IO and time enabled, as
    /// `#[tokio::main]`'s has); the first handle to it. Panics outside a
    /// runtime, as `tokio::spawn` does.
    pub fn start(ev: EventLoop) -> LoopHandle {
        let alarm = ev.loss_alarm();
        let spin = if ev.wait_fd().is_some() {
            SPIN_BEFORE_SLEEP
        } else {
            POLL_BEFORE_SLEEP
        };
        let shared = Arc::new(Shared::new(ev, spin));
        tokio::spawn(driver::drive(shared.clone()));
        LoopHandle {
            inner: Arc::new(Handles(shared)),
            alarm,
        }
    }
}

/// The handles' share: the last one to go closes the loop.
struct Handles(Arc<Shared>);

impl Drop for Handles {
    fn drop(&mut self) {
        self.0.close_soon();
    }
}

/// A way to one loop: cheap to clone, usable from any task.
#[derive(Clone)]
pub struct LoopHandle {
    inner: Arc<Handles>,
    alarm: LossAlarm,
}

impl std::fmt::Debug for LoopHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoopHandle").finish_non_exhaustive()
    }
}

impl LoopHandle {
    pub(super) fn shared(&self) -> &Arc<Shared> {
        &self.inner.0
    }

    /// Send `buf` to `peer`; the completion (its result, and the buffer
    /// back) when the provider is done with it. A post the loop refuses
    /// comes back as the `Err`, with its buffer.
    pub async fn send(&self, peer: Peer, buf: Buffer, opts: SendOpts) -> Result<Completion, PostError> {
        let t = self.post(buf, |ev, buf, t| ev.send(&peer, buf, opts, t))?;
        op::wait(self.shared().clone(), t, OnDrop::GoOn).await
    }

    /// Send `bytes` (at most [`EventLoop::inject_max`]) to `peer` without a
    /// completion, as [`EventLoop::inject`] does: they are copied before
    /// the first look, and nothing comes back but whether the post was
    /// taken (a send that fails later, a lost peer for one, is not
    /// reported on it: the loss alarm and later operations tell).
    ///
    /// It never waits holding the loop: where the blocking `inject` would
    /// wait (sends to `peer` still in the loop's backlog, or no room in the
    /// provider's queue), it sends a copy instead (one allocation) and
    /// awaits that send's completion, so order to `peer` is kept and the
    /// peer's task, on the same runtime, can make the room.
    pub async fn inject(&self, peer: Peer, bytes: &[u8], opts: SendOpts) -> crate::error::Result<()> {
        let injected = {
            let mut st = self.shared().lock();
            if st.closing {
                return Err(closed().error);
            }
            match st.ev.as_mut() {
                Some(ev) => ev.try_inject(&peer, bytes, opts)?,
                None => return Err(closed().error),
            }
        };
        if injected {
            return Ok(());
        }
        let c = self
            .send(peer, Buffer::from_slice(bytes), opts)
            .await
            .map_err(|e| e.error)?;
        c.result.map_err(|e| Error::Message {
            operation: "inject (sent as a copy: no room to inject)",
            peer: format!("to fi_addr {} on endpoint {}", peer.addr, peer.endpoint.0),
            message: e.to_string(),
        })
    }

    /// Receive into `buf` on endpoint `ep`; the completion with the
    /// buffer holding the message. Dropping the future before the message
    /// came cancels the receive (see [`super`], "Dropping a future").
    ///
    /// Where the provider has no room for another receive (libfabric
    /// 1.17's shm, while its receive entries are all taken), the blocking
    /// loop retries in place, progressing, until there is. Here that would
    /// hold the loop and the runtime's worker while the task that would
    /// make the room (the peer's, in the same runtime) waits behind it: the
    /// receive is posted with the loop's fail-fast rule instead, and a
    /// refusal for room is retried after a look and the runtime's turn,
    /// for as long as the blocking loop would wait: its `post_timeout`
    /// (none by default: as long as it takes), or until a peer of the loop
    /// is newly lost. Then the receive fails with `QueueFull`, saying how
    /// long it waited, and its buffer back.
    pub async fn recv(&self, ep: EndpointId, buf: Buffer, opts: RecvOpts) -> Result<Completion, PostError> {
        let t = self
            .post_for_room(buf, |st, buf| {
                st.post(buf, |ev, buf, t| failing_fast(ev, |ev| ev.recv(ep, buf, opts, t)))
            })
            .await?;
        op::wait(self.shared().clone(), t, OnDrop::CancelRecv(ep)).await
    }

    /// Post `buf` with `post` (under the loop's fail-fast rule); a refusal
    /// for room is retried after a look and the runtime's turn, for as long
    /// as the blocking loop would wait ([`LoopHandle::recv`]).
    pub(super) async fn post_for_room(
        &self,
        buf: Buffer,
        mut post: impl FnMut(&mut State, Buffer) -> Result<Token, PostError>,
    ) -> Result<Token, PostError> {
        let mut buf = buf;
        let mut since: Option<Instant> = None;
        loop {
            let posted = post(&mut self.shared().lock(), buf);
            match posted {
                Ok(t) => return Ok(t),
                Err(PostError {
                    error:
                        Error::QueueFull {
                            call,
                            in_flight,
                            code,
                            ..
                        },
                    buffer: Some(b),
                }) => {
                    buf = b;
                    let started = *since.get_or_insert_with(Instant::now);
                    if let Err(error) = self.look_for_room(started, call, in_flight, code) {
                        return Err(PostError {
                            error,
                            buffer: Some(buf),
                        });
                    }
                    tokio::task::yield_now().await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Look at the waiting messages on endpoint `ep` that a receive with
    /// `opts` would take, without taking one ([`EventLoop::peek`]): the
    /// completion's [`peeked`](Completion::peeked) has the first one's
    /// length (its tag, data and source are the completion's), or is `None`
    /// if none is waiting. Refused, as the loop refuses it, where the
    /// provider cannot peek; and with `QueueFull` where the loop has no
    /// room for it now, rather than waiting holding the loop.
    pub async fn peek(&self, ep: EndpointId, opts: RecvOpts) -> crate::error::Result<Completion> {
        let t = self
            .shared()
            .lock()
            .post_bare(|ev, t| failing_fast(ev, |ev| ev.peek(ep, opts, t)))?;
        op::wait(self.shared().clone(), t, OnDrop::GoOn)
            .await
            .map_err(|e| e.error)
    }

    /// A post was refused for room (`call`, with `in_flight` operations in
    /// flight, code `code`) and has been retried since `started`: look at
    /// the loop once, so completions make the room, or say `QueueFull` if
    /// the blocking loop would have stopped waiting by now (its
    /// `post_timeout`, or a peer newly lost).
    pub(super) fn look_for_room(
        &self,
        started: Instant,
        call: &'static str,
        in_flight: usize,
        code: Option<crate::error::ErrorCode>,
    ) -> crate::error::Result<()> {
        let mut st = self.shared().lock();
        // The loop's own rule, asked before the look reads (and so marks
        // seen) a new loss.
        match st.ev.as_ref() {
            Some(ev) if !ev.patient(started) => Err(Error::QueueFull {
                call,
                waited: started.elapsed(),
                in_flight,
                code,
            }),
            _ => st.look(),
        }
    }

    /// Post `buf` through `post` under a new slot's token.
    fn post(
        &self,
        buf: Buffer,
        post: impl FnOnce(&mut EventLoop, Buffer, Token) -> Result<(), PostError>,
    ) -> Result<Token, PostError> {
        self.shared().lock().post(buf, post)
    }

    /// Run `f` with the loop itself, between looks: for set-up and upkeep
    /// (open an endpoint, accept or connect a peer, register memory). It
    /// runs on the calling task, holding the loop, so keep it short (a
    /// bootstrap handshake is a round trip or two). Operations posted here
    /// with tokens of one's own complete into the handles' table, which
    /// drops them with a warning: post through the handle instead.
    pub async fn with_loop<R: Send + 'static>(
        &self,
        f: impl FnOnce(&mut EventLoop) -> R + Send + 'static,
    ) -> crate::error::Result<R> {
        let mut st = self.shared().lock();
        if st.closing {
            return Err(closed().error);
        }
        st.ev.as_mut().map(f).ok_or_else(|| closed().error)
    }

    /// Close the loop now, whoever else holds a handle: every endpoint
    /// closes, operations in flight yield nothing (their futures fail with
    /// `Closed`), and this returns once the loop is gone.
    pub async fn close(self) {
        let (done, answer) = oneshot::channel();
        {
            let mut st = self.shared().lock();
            if st.ev.is_none() {
                return;
            }
            st.closers.push(done);
        }
        self.shared().close_soon();
        let _ = answer.await;
    }

    /// The peers this loop's lifelines found lost (see
    /// [`EventLoop::loss_alarm`]).
    pub fn loss_alarm(&self) -> LossAlarm {
        self.alarm.clone()
    }
}
