//! The event loop: one completion queue per domain, every endpoint bound to
//! it, every operation handed back by its token.
//!
//! The shape is mio's: a reusable completion buffer, user-chosen tokens, and
//! `poll` with an optional timeout. An [`EventLoop`] owns its domain, its CQ
//! and AV, its endpoints and every operation in flight with that
//! operation's buffer, so nothing the NIC may still touch can be freed.
//!
//! Promises:
//! - Every posted operation yields exactly one [`Completion`], unless its
//!   endpoint is closed first; then it yields none, and its buffer is freed
//!   by the loop.
//! - A token never comes back after its endpoint was closed.
//! - When a post meets a full queue (`-FI_EAGAIN`, or `-FI_ENOMEM` for a
//!   receive) the loop progresses the CQ and retries until the provider
//!   takes it, a peer is lost, or the application's own
//!   [`LoopConfig::post_timeout`] (none by default) passes; completions
//!   reaped meanwhile are kept for the next `poll`, never lost. A
//!   [`send`](EventLoop::send) of a [`Buffer`](crate::memory::buffer::Buffer) is not held at all: the loop
//!   keeps it (in order per peer, at most [`LoopConfig::max_backlog`]) and
//!   posts it as `poll` progresses, so an application that sends before it
//!   receives cannot deadlock with a peer doing the same; it fails only
//!   with its peer's loss, or with [`CompletionError::NotPosted`] if a
//!   `post_timeout` was set and the peer took none of the sends waiting for
//!   it for that long.
//! - A message larger than the posted buffer completes with
//!   [`CompletionError::Truncated`] naming both sizes; nothing overflows,
//!   and the next message is delivered. On `ofi_rxm` and `shm`, which
//!   cannot cut every message themselves, receives take an overflow sink
//!   behind the buffer for the tail (`overflow.rs`).
//! - Buffers are owned by the loop while their operation is in flight, and
//!   come back in the completion (or with a failed post's error).
//!
//! # Threads
//!
//! An `EventLoop` is `Send` but not `Sync`: every call takes `&mut self`,
//! so one thread drives it at a time, which is all any libfabric threading
//! level asks. [`Completion`], [`Buffer`](crate::memory::buffer::Buffer) and [`Peer`] are `Send`, so
//! completions can be consumed on another thread ([`EventLoop::forward`]).
//!
//! Bytes of a multi-receive piece are borrowed from the loop, so the loop
//! cannot be polled (and the buffer cannot come back) while they are held:
//!
//! ```compile_fail
//! # fn f(ev: &mut fabric_msg::EventLoop, c: &fabric_msg::Completion) {
//! let bytes = ev.multi_recv_bytes(c).unwrap();
//! let mut out = Vec::new();
//! ev.poll(&mut out, None).unwrap(); // error: `ev` is borrowed by `bytes`
//! println!("{bytes:?}");
//! # }
//! ```

mod am;
mod am_state;
mod am_target;
mod am_wire;
mod backlog;
mod backlog_flush;
mod calls;
mod cancel;
pub(crate) mod cm;
mod completions;
pub(crate) mod cpu_atomics;
mod cq_errors;
mod deadlines;
mod endpoint;
mod frame;
pub(crate) mod idle;
mod loss_handling;
mod lost_peers;
mod multi_recv;
mod overflow;
mod peek;
mod post;
mod resources;
pub mod rma;
mod room;
mod slab;
mod state;
mod stats;
mod tag_space;
mod teardown;
mod types;
mod wait_fd;

pub use am_state::AtomicCounters;

/// For the fuzz targets: fabric-msg's message header as a receive reads
/// it from whatever arrived.
pub(crate) fn fuzz_header(bytes: &[u8]) {
    let mut h = [0u8; crate::memory::buffer::HEADROOM];
    let n = bytes.len().min(crate::memory::buffer::HEADROOM);
    h[..n].copy_from_slice(&bytes[..n]);
    if let Some((len, _)) = frame::decode_header(&h, bytes.len()) {
        let _ = len.checked_add(crate::memory::buffer::HEADROOM);
    }
    let _ = frame::is_notify(&h, bytes.len());
}

/// For the fuzz targets: an emulated atomic's request (as a target on 64
/// and on 63 tag bits decodes it) and reply.
pub(crate) fn fuzz_atomic_message(bytes: &[u8]) {
    for bits in [64, 63] {
        let _ = am_wire::decode_request(tag_space::TagSpace::new(bits), bytes);
    }
    let mut h = [0u8; am_wire::REPLY_LEN];
    let n = bytes.len().min(am_wire::REPLY_LEN);
    h[..n].copy_from_slice(&bytes[..n]);
    for cookie in [0, u64::MAX, 0x5eed_c0ff_ee00_0009] {
        let _ = am_wire::decode_reply(&h, bytes.len(), cookie);
    }
}

/// For the fuzz targets: a real request and a real reply.
pub(crate) fn fuzz_atomic_seeds() -> Vec<Vec<u8>> {
    am_wire::fuzz_seeds()
}

/// For the fuzz targets: real headers (with and without data, a notice).
pub(crate) fn fuzz_header_seeds() -> Vec<Vec<u8>> {
    vec![
        frame::encode_header(4096, Some(7)).to_vec(),
        frame::encode_header(0, None).to_vec(),
        frame::encode_notify(42).to_vec(),
    ]
}
pub use state::EventLoop;
pub use stats::{LoopStats, PeerStats, Traffic};
pub use types::{
    Completion, CompletionError, EndpointId, LoopConfig, OpKind, Peeked, Peer, PostError, ProgressThread,
    RecvOpts, SendOpts, Token, WaitMode,
};
#[cfg(feature = "tokio")]
pub(crate) use wait_fd::LentFd;
pub use wait_fd::SleepCheck;

#[cfg(test)]
mod tests {
    use super::{Completion, EventLoop, LoopConfig, Peer, ProgressThread, WaitMode};
    use crate::memory::buffer::Buffer;

    #[test]
    fn thread_bounds_are_what_the_docs_promise() {
        fn send<T: Send>() {}
        fn sync<T: Sync>() {}
        send::<EventLoop>();
        send::<Completion>();
        send::<Buffer>();
        sync::<Buffer>();
        send::<Peer>();
        sync::<Peer>();
    }

    /// The table in `LoopConfig`'s docs is what `default()` gives.
    #[test]
    fn loop_config_defaults_are_the_documented_ones() {
        use std::time::Duration;
        let c = LoopConfig::default();
        assert_eq!(c.post_timeout, None);
        assert_eq!(c.max_backlog, 65_536);
        assert_eq!(c.wait, WaitMode::Spin);
        assert_eq!(c.spin_before_block, Duration::from_micros(50));
        assert_eq!(c.yield_before_block, Some(Duration::from_millis(2)));
        assert_eq!(c.rma_timeout, Some(Duration::from_secs(30)));
        assert!(c.cq_size.is_none() && c.min_multi_recv.is_none() && c.rma_chunk.is_none());
        assert!(!c.force_framing);
        assert_eq!(c.progress_thread, ProgressThread::Off);
        assert_eq!(c.progress_period, Duration::from_millis(1));
    }
}
