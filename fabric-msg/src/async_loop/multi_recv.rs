//! Multi-receive buffers (`FI_MULTI_RECV`) from a task: one buffer posted,
//! many messages landing in it back to back, each awaited as a piece.
//!
//! ```no_run
//! # async fn f(h: fabric_msg::async_loop::LoopHandle, ep: fabric_msg::EndpointId) -> Result<(), Box<dyn std::error::Error>> {
//! use fabric_msg::Buffer;
//! let mut pieces = h.recv_multi(ep, Buffer::new(64 << 10)).await?;
//! while let Some(c) = pieces.next().await {
//!     let c = c?;
//!     c.result.clone()?;
//!     if c.multi.is_some() {
//!         let n = pieces.bytes(&c, |bytes| bytes.len());
//!         println!("a message of {n:?} bytes");
//!     }
//!     if let Some(buf) = c.buffer {
//!         // The last completion: the buffer is back, and can go out again.
//!         pieces = h.recv_multi(ep, buf).await?;
//!     }
//! }
//! # Ok(()) }
//! ```

use super::handle::LoopHandle;
use super::shared::{closed, failing_fast, Shared, State};
use super::streams::{Dropped, Next};
use crate::error::Result;
use crate::memory::buffer::Buffer;
use crate::transport::event_loop::{Completion, EndpointId, PostError, Token};
use std::future::poll_fn;
use std::sync::Arc;
use std::task::Poll;

/// One multi-receive buffer in flight: its completions, one at a time
/// ([`MultiRecv::next`]).
///
/// Dropping it before its buffer came back cancels the buffer (the loop
/// takes it back from the provider and drops it): messages that land
/// later go to the endpoint's other receives, as with a dropped receive
/// future. Pieces not yet taken are dropped with it. Where the provider
/// cannot cancel, the buffer stays posted until it is full and what lands
/// in it is dropped, with a warning in the log.
pub struct MultiRecv {
    shared: Arc<Shared>,
    ep: EndpointId,
    token: Token,
    /// The loop's count of looks after this stream's last look.
    seen: Option<u64>,
}

impl std::fmt::Debug for MultiRecv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MultiRecv")
            .field("endpoint", &self.ep)
            .finish_non_exhaustive()
    }
}

impl LoopHandle {
    /// Post `buf` as a multi-receive buffer on endpoint `ep`
    /// ([`EventLoop::recv_multi`](crate::EventLoop::recv_multi): it needs
    /// [`Capability::MultiRecv`](crate::Capability::MultiRecv) and an
    /// unframed endpoint); its completions come from the [`MultiRecv`].
    /// A post refused for room is retried as [`LoopHandle::recv`]'s is.
    pub async fn recv_multi(&self, ep: EndpointId, buf: Buffer) -> Result<MultiRecv, PostError> {
        let token = self.post_for_room(buf, |st, buf| post(st, ep, buf)).await?;
        Ok(MultiRecv {
            shared: self.shared().clone(),
            ep,
            token,
            seen: None,
        })
    }
}

/// Post `buf` as a multi-receive buffer on `ep` (under the loop's
/// fail-fast rule) with a new stream's token.
fn post(st: &mut State, ep: EndpointId, buf: Buffer) -> Result<Token, PostError> {
    let ev = match st.ev.as_mut() {
        Some(ev) if !st.closing => ev,
        _ => {
            return Err(PostError {
                buffer: Some(buf),
                ..closed()
            })
        }
    };
    let t = st.streams.open();
    match failing_fast(ev, |ev| ev.recv_multi(ep, buf, t)) {
        Ok(()) => {
            st.busy = st.busy.wrapping_add(1);
            // Until its last completion comes, nobody looks for it but its
            // `next` and the driver.
            st.sleepers += 1;
            Ok(t)
        }
        Err(e) => {
            st.streams.remove(t);
            Err(e)
        }
    }
}

impl MultiRecv {
    /// The buffer's next completion, in the order the loop gave them:
    /// a piece for each message ([`Completion::multi`] says where it lies
    /// in the buffer; read it with [`MultiRecv::bytes`]); the last one
    /// carries the buffer back (and may be a piece too). A failed one (a
    /// truncation, the peer's loss, a cancel) is the last. `None` once the
    /// last was taken; `Some(Err(Closed))` once if the loop closed before
    /// the buffer came back.
    ///
    /// Dropping this future loses nothing: the next call takes what came.
    pub async fn next(&mut self) -> Option<Result<Completion>> {
        poll_fn(|cx| {
            let mut st = self.shared.lock();
            let ready = |next| match next {
                Next::Piece(c) => Some(Some(Ok(c))),
                Next::Closed => Some(Some(Err(closed().error))),
                Next::Ended => Some(None),
                Next::Empty => None,
            };
            if let Some(r) = ready(st.streams.next(self.token, cx.waker())) {
                return Poll::Ready(r);
            }
            // One look a poll, unless another looked since this stream's
            // last (what they found is queued already). Past it the driver
            // looks, and wakes this task when a completion comes; a failed
            // look closes the loop, which tells the stream.
            if self.seen.map_or(true, |s| s == st.looks) && st.look().is_ok() {
                if let Some(r) = ready(st.streams.next(self.token, cx.waker())) {
                    self.seen = Some(st.looks);
                    return Poll::Ready(r);
                }
            }
            self.seen = Some(st.looks);
            Poll::Pending
        })
        .await
    }

    /// `f` on the bytes of `piece`, a completion this stream gave: `None`
    /// if it is not one of its pieces, or once the buffer was taken with
    /// the last completion (read the piece from the buffer, at
    /// [`Completion::multi`]'s offset, as on the blocking loop).
    pub fn bytes<R>(&self, piece: &Completion, f: impl FnOnce(&[u8]) -> R) -> Option<R> {
        let mut st = self.shared.lock();
        let st = &mut *st;
        st.streams.bytes(self.token, st.ev.as_ref(), piece, f)
    }
}

impl Drop for MultiRecv {
    fn drop(&mut self) {
        let mut st = self.shared.lock();
        if let (Dropped::Cancel, Some(ev)) = (st.streams.drop_stream(self.token), st.ev.as_mut()) {
            if let Err(e) = ev.cancel_recv(self.ep, self.token) {
                log::warn!(
                    "async loop: a dropped multi-receive buffer could not be cancelled ({e}); it stays posted, \
                     and what lands in it is dropped"
                );
            }
        }
    }
}
