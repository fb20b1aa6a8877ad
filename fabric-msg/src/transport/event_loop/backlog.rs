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

use crate::ffi;
use crate::libfabric::RawEndpoint;
use std::collections::VecDeque;
use std::os::raw::c_void;
use std::time::Instant;

/// What a send is posted with, kept for posting it again.
#[derive(Clone, Copy)]
pub(super) struct SendArgs {
    pub(super) raw: RawEndpoint,
    pub(super) desc: *mut c_void,
    pub(super) addr: ffi::fi_addr_t,
    pub(super) tag: Option<u64>,
    pub(super) data: Option<u64>,
}

/// One backlogged send.
#[derive(Clone, Copy)]
pub(super) struct Deferred {
    pub(super) index: u32,
    pub(super) generation: u64,
    pub(super) bufp: *mut c_void,
    pub(super) len: usize,
    pub(super) args: SendArgs,
    pub(super) since: Instant,
    /// `since` plus the `post_timeout` in force when it was kept; `None`:
    /// no deadline (the default).
    pub(super) deadline: Option<Instant>,
}

/// The sends waiting for room, oldest first, and the peers found full
/// during one pass over them (kept to reuse its allocation).
pub(super) struct Backlog {
    pub(super) queue: VecDeque<Deferred>,
    pub(super) full: Vec<(RawEndpoint, ffi::fi_addr_t)>,
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
    pub(super) fn holds(&self, raw: RawEndpoint, addr: ffi::fi_addr_t) -> bool {
        !self.queue.is_empty()
            && self
                .queue
                .iter()
                .any(|d| d.args.raw == raw && d.args.addr == addr)
    }
}
