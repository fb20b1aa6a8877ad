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
//! [`AsyncLoop::start`] puts the loop behind a lock shared by every
//! [`LoopHandle`] (`Clone + Send + Sync`, from any task), every future and
//! a driver task (`async_loop/driver.rs`). A handle posts an operation at
//! once, under the token of a slot of its own (`async_loop/shared.rs`);
//! its future (`async_loop/op.rs`) takes the result from the slot. While
//! its wait is young ([`SPIN_BEFORE_SLEEP`] on a loop with a wait fd,
//! [`POLL_BEFORE_SLEEP`] on one without) the future looks at the loop
//! itself at every poll, hands each completion it finds to its slot
//! (waking that slot's future), and asks to be polled again once the
//! runtime has run what else is ready. So the task that waits is the one
//! that sees its completion: no hop between tasks or threads, as on the
//! blocking loop. Past its spin a future leaves the looking to the
//! driver, which sleeps by the `fi_trywait` rule
//! (`transport/event_loop/wait_fd.rs`) on the completion queue's wait fd
//! through tokio's `AsyncFd`, never while `prepare_sleep` says a
//! completion may be pending, and wakes the future whose completion it
//! finds. A loop with no wait fd (libfabric's shm, or one opened with
//! [`WaitMode::Spin`]) is looked at every [`IDLE_PERIOD`] by the driver
//! once no future looks, which bounds what a quiet shm loop costs and adds
//! at most that to a message that arrives after a quiet spell. Open the
//! loop with [`WaitMode::Block`] so it has a wait fd where the provider
//! gives one. While any future looks, the driver sleeps until the last
//! one stops (or 100 ms), so it does not contend for the lock.
//!
//! # What it costs
//!
//! Per operation, beyond the loop's own work: the lock, taken once to
//! post and once per look; a slot, reused from a free list; and a clone
//! of the task's waker when the future first waits (tokio's wakers are
//! reference counts). No allocation once the table of slots has grown to
//! the most operations in flight (`tests/async_alloc.rs`). The blocking
//! path is untouched. With many tasks each looking, each look is one
//! `fi_cq_read` under the lock: the tasks take turns at it.
//!
//! # Dropping a future
//!
//! A future dropped before its operation completes never frees memory the
//! NIC may still write: its slot is marked abandoned, and the operation
//! and its buffer stay with the loop until the provider completes it; the
//! completion and the buffer are then dropped. On top of that:
//!
//! - **A receive is cancelled** (`fi_cancel`, [`EventLoop::cancel_recv`](crate::EventLoop::cancel_recv)):
//!   the next message it would have matched goes to a later receive, as
//!   with a timeout around `recv` on a tokio socket. A message that
//!   matched it before the cancel took effect (its completion already
//!   queued, or in the slot and not yet taken) is dropped with it, as the
//!   bytes had reached the dropped future's buffer. Where the provider
//!   cannot cancel, the receive stays posted and takes the next matching
//!   message, with a warning in the log.
//! - **A send, a one-sided operation or an atomic goes on**: it may still
//!   reach the peer. A one-sided operation's local memory is a registered
//!   region, which the operation holds until it completes.
//! - **A [`MultiRecv`] dropped before its buffer came back cancels the
//!   buffer**, which the loop then drops; its pieces not yet taken go
//!   with it.
//!
//! # Operations
//!
//! Two-sided: [`LoopHandle::send`], [`LoopHandle::inject`],
//! [`LoopHandle::recv`], [`LoopHandle::peek`]. One-sided
//! (`async_loop/one_sided.rs`): [`LoopHandle::read`], [`LoopHandle::write`],
//! [`LoopHandle::write_data`], [`LoopHandle::atomic`], and
//! [`LoopHandle::remote_write`] for the notices of peers' `write_data`
//! (kept until awaited; one handed to a future dropped before it took it
//! goes to the next). Multi-receive buffers, whose one post completes
//! once per message: [`LoopHandle::recv_multi`] gives a [`MultiRecv`],
//! whose `next` awaits each piece in turn (`async_loop/multi_recv.rs`).
//!
//! # Closing
//!
//! When the last handle is dropped the driver closes the loop (every
//! endpoint; operations still in flight yield no completion, their buffers
//! freed by the loop once the provider has let go), and so does the
//! driver's end with its runtime; awaiting futures
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
mod multi_recv;
mod one_sided;
mod op;
mod shared;
mod streams;

pub use driver::{IDLE_PERIOD, POLL_BEFORE_SLEEP, SPIN_BEFORE_SLEEP};
pub use handle::{AsyncLoop, LoopHandle};
pub use multi_recv::MultiRecv;
