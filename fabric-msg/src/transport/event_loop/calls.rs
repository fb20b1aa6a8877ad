//! Which posting call an operation's options ask for, and the names errors
//! give them (`fi_send`, `fi_tsend`, `fi_senddata`, `fi_tsenddata`;
//! `fi_recv`, `fi_trecv`); and the receive every receive of the loop,
//! internal ones included, goes through: `raw_recv`, behind the overflow
//! sink where the endpoint has one. Sends post with `RawEndpoint::send`
//! (`libfabric/post.rs`), which takes the same options.

use super::overflow::Sink;
use crate::ffi;
use crate::libfabric::RawEndpoint;
use std::os::raw::c_void;

/// The libfabric function a send with these options is posted with.
pub(super) fn send_call(tag: Option<u64>, data: Option<u64>) -> &'static str {
    match (tag, data) {
        (None, None) => "fi_send",
        (Some(_), None) => "fi_tsend",
        (None, Some(_)) => "fi_senddata",
        (Some(_), Some(_)) => "fi_tsenddata",
    }
}

/// The libfabric function a receive with this matcher is posted with.
pub(super) fn recv_call(tag: Option<(u64, u64)>) -> &'static str {
    if tag.is_some() {
        "fi_trecv"
    } else {
        "fi_recv"
    }
}

/// Post a receive, tagged (`(tag, ignore)`) or not.
///
/// Where the loop runs a progress thread, callers hold its gate
/// ([`EventLoop::progress_gate`]) around this call: libfabric 1.17's shm
/// matches an arriving message against posted receives and, finding none,
/// queues it as unexpected in two steps under two takings of its receive
/// lock (`smr_progress_cmd_msg`: `get_tag`, then `queue_tag`), so a receive
/// posted between them by another thread misses the message and the
/// message waits unexpected beside it for ever. The progress thread made
/// that other thread: 4 of 157 runs of 5 ranks' `collectives_check` under
/// load hung so, none of 200 without the thread (docs/reliability.md).
///
/// # Safety
/// As for [`RawEndpoint::send`], with `len` writable bytes at `bufp`.
pub(super) unsafe fn raw_recv(
    raw: RawEndpoint,
    bufp: *mut c_void,
    len: usize,
    desc: *mut c_void,
    src: ffi::fi_addr_t,
    tag: Option<(u64, u64)>,
    ctx: *mut c_void,
) -> isize {
    // SAFETY: raw is enabled (the caller's promise).
    if let Some(sink) = unsafe { Sink::of(raw) } {
        // SAFETY: as below; the sink is mapped for the whole process and
        // takes a message's tail (overflow.rs), and both calls read `iov`
        // and `descs` during the call only.
        return unsafe { sink.recv(raw, bufp, len, desc, src, tag, ctx) };
    }
    // SAFETY: the caller's promises are exactly the call's requirements.
    unsafe { raw.recv(bufp, len, desc, src, tag, ctx) }
}
