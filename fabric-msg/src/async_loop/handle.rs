//! The async side's front: [`AsyncLoop::start`] and the [`LoopHandle`]
//! every task holds.

use super::driver::{self, Command, Reply};
use crate::error::Error;
use crate::memory::buffer::Buffer;
use crate::transport::event_loop::{Completion, EndpointId, EventLoop, Peer, PostError, RecvOpts, SendOpts};
use crate::transport::liveness::LossAlarm;
use tokio::sync::{mpsc, oneshot};

/// Where an [`EventLoop`] goes to serve futures.
#[derive(Debug)]
pub struct AsyncLoop(());

impl AsyncLoop {
    /// Move `ev` into a driver task on the current tokio runtime (which
    /// must have IO and time enabled, as `#[tokio::main]`'s has) and return
    /// the first handle to it. Panics outside a runtime, as `tokio::spawn`
    /// does.
    pub fn start(ev: EventLoop) -> LoopHandle {
        let (tx, rx) = mpsc::unbounded_channel();
        let alarm = ev.loss_alarm();
        tokio::spawn(driver::drive(ev, rx));
        LoopHandle { tx, alarm }
    }
}

/// A way to the driver of one loop: cheap to clone, usable from any task.
#[derive(Debug, Clone)]
pub struct LoopHandle {
    tx: mpsc::UnboundedSender<Command>,
    alarm: LossAlarm,
}

fn closed() -> PostError {
    PostError {
        error: Error::Closed {
            what: "the async event loop (every LoopHandle dropped, close called, or its driver ended)".into(),
        },
        buffer: None,
    }
}

impl LoopHandle {
    /// Send `buf` to `peer`; the completion (its result, and the buffer
    /// back) when the provider is done with it. A post the loop refuses
    /// comes back as the `Err`, with its buffer.
    pub async fn send(&self, peer: Peer, buf: Buffer, opts: SendOpts) -> Result<Completion, PostError> {
        self.op(|done| Command::Send {
            peer,
            buf,
            opts,
            done,
        })
        .await
    }

    /// Receive into `buf` on endpoint `ep`; the completion with the
    /// buffer holding the message.
    pub async fn recv(&self, ep: EndpointId, buf: Buffer, opts: RecvOpts) -> Result<Completion, PostError> {
        self.op(|done| Command::Recv { ep, buf, opts, done }).await
    }

    async fn op(&self, make: impl FnOnce(Reply) -> Command) -> Result<Completion, PostError> {
        let (done, answer) = oneshot::channel();
        if let Err(mpsc::error::SendError(cmd)) = self.tx.send(make(done)) {
            // The driver is gone: the buffer is still ours to give back.
            return Err(match cmd {
                Command::Send { buf, .. } | Command::Recv { buf, .. } => PostError {
                    buffer: Some(buf),
                    ..closed()
                },
                _ => closed(),
            });
        }
        answer.await.unwrap_or_else(|_| Err(closed()))
    }

    /// Run `f` on the driver with the loop itself, between polls: for
    /// set-up and upkeep (open an endpoint, accept or connect a peer,
    /// register memory). The driver waits while `f`
    /// runs, so keep it short (a bootstrap handshake is a round trip or
    /// two). Operations posted here with tokens of one's own complete
    /// into the driver, which drops them with a warning: post through the
    /// handle instead.
    pub async fn with_loop<R: Send + 'static>(
        &self,
        f: impl FnOnce(&mut EventLoop) -> R + Send + 'static,
    ) -> crate::error::Result<R> {
        let (done, answer) = oneshot::channel();
        let run = Box::new(move |ev: &mut EventLoop| {
            let _ = done.send(f(ev));
        });
        self.tx.send(Command::With(run)).map_err(|_| closed().error)?;
        answer.await.map_err(|_| closed().error)
    }

    /// Close the loop now, whoever else holds a handle: every endpoint
    /// closes, operations in flight yield nothing (their futures fail with
    /// `Closed`), and this returns once the loop is gone.
    pub async fn close(self) {
        let (done, answer) = oneshot::channel();
        if self.tx.send(Command::Close(done)).is_ok() {
            let _ = answer.await;
        }
    }

    /// The peers this loop's lifelines found lost (see
    /// [`EventLoop::loss_alarm`]).
    pub fn loss_alarm(&self) -> LossAlarm {
        self.alarm.clone()
    }
}
