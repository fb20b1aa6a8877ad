//! fabric-msg in tokio programs (feature `tokio`): an [`EventLoop`]'s
//! operations as futures that own their buffer and give it back with the
//! result, in the manner of tokio-uring.
//!
//! ```no_run
//! # async fn f(ev: fabric_msg::EventLoop, peer: fabric_msg::Peer, ep: fabric_msg::EndpointId) -> Result<(), Box<dyn std::error::Error>> {
//! use fabric_msg::async_loop::AsyncLoop;
//! use fabric_msg::{Buffer, RecvOpts, SendOpts};
//! let h = AsyncLoop::start(ev); // on the current tokio runtime
//! let sent = h.send(peer, Buffer::from_slice(b"ping"), SendOpts::default()).await?;
//! sent.result?;
//! let got = h.recv(ep, Buffer::new(64), RecvOpts::default()).await?;
//! println!("{:?}", got.buffer.unwrap().as_slice());
//! # Ok(()) }
//! ```
//!
//! # How it works
//!
//! [`AsyncLoop::start`] moves the loop into a driver task
//! (`async_loop/driver.rs`); [`LoopHandle`]s (`Clone + Send + Sync`, from
//! any task) send it each operation over a channel with a one-shot reply.
//! The driver posts it under a token of its own, polls the loop, and
//! answers each completion's waiter. When nothing is ready it keeps
//! looking for [`SPIN_BEFORE_SLEEP`] (yielding between looks, so other
//! tasks run), then sleeps by the `fi_trywait` rule
//! (`transport/event_loop/wait_fd.rs`): on the completion queue's wait fd
//! through tokio's `AsyncFd`, and on the channel, never while
//! `prepare_sleep` says a completion may be pending. A loop with no wait
//! fd (libfabric's shm, or one opened with [`WaitMode::Spin`]) keeps
//! looking for [`POLL_BEFORE_SLEEP`], then sleeps [`IDLE_PERIOD`] between
//! looks, which bounds what a quiet shm loop costs and adds at most that
//! to a message that arrives after a quiet spell. Open the loop with
//! [`WaitMode::Block`] so it has a wait fd where the provider gives one.
//!
//! # What it costs
//!
//! Per operation, beyond the loop's own work: one message on an unbounded
//! channel to the driver (tokio allocates its blocks 32 messages at a time,
//! and reuses them) and one `oneshot` (one allocation: its shared cell).
//! The driver's table of waiters is reused. An operation therefore makes
//! one allocation on the async path; the blocking path is untouched.
//!
//! # Dropping a future
//!
//! A future dropped before its operation completes does not cancel it:
//! the operation and its buffer stay with the driver's loop, which owns
//! them until the provider completes it; the buffer is then dropped (the
//! reply finds no one). So memory the NIC may still write is never freed
//! early. A receive that will never match stays posted until the loop
//! closes (its token is the driver's, not yours, so it cannot be cancelled
//! by token): a receive left behind takes the next matching message.
//!
//! # Closing
//!
//! When the last handle is dropped the driver closes the loop (every
//! endpoint; operations still in flight yield no completion, their buffers
//! freed by the loop once the provider has let go) and awaiting futures
//! fail with [`Error::Closed`](crate::Error::Closed). [`LoopHandle::close`] does it
//! at once, whoever else holds a handle.
//!
//! # Peers lost
//!
//! An operation addressed to a lost peer completes with
//! [`CompletionError::PeerLost`](crate::CompletionError::PeerLost), as on
//! the loop; the loop's `PeerLost` notices themselves are not futures:
//! [`LoopHandle::loss_alarm`] tells who was lost, from any task.
//!
//! [`EventLoop`]: crate::EventLoop
//! [`WaitMode::Spin`]: crate::WaitMode::Spin
//! [`WaitMode::Block`]: crate::WaitMode::Block

mod driver;
mod handle;

pub use driver::{IDLE_PERIOD, POLL_BEFORE_SLEEP, SPIN_BEFORE_SLEEP};
pub use handle::{AsyncLoop, LoopHandle};
