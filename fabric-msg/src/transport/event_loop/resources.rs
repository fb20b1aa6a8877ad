//! The libfabric objects the loop owns besides the domain: the completion
//! queue (with the buffers a batch of its entries is read into), the address
//! vector, and each endpoint's state. Each closes itself on drop; the loop
//! drops them in order (see `teardown`).

use crate::ffi;
use crate::memory::domain::{close_fid, DomainInner};
use std::sync::Arc;

pub(crate) struct EndpointState {
    /// NULL for the base endpoint of a MSG loop, which only stands for the
    /// loop in `accept`/`connect`; each connection has its own endpoint.
    pub(crate) raw: *mut ffi::fid_ep,
    pub(crate) framed: bool,
    /// Held by memory regions bound to this endpoint (`FI_MR_ENDPOINT`).
    pub(crate) bound: Arc<()>,
}

impl EndpointState {
    pub(crate) fn new(raw: *mut ffi::fid_ep, framed: bool) -> EndpointState {
        EndpointState {
            raw,
            framed,
            bound: Arc::new(()),
        }
    }
}

/// Where `read_cq` reads entries to: one batch in the CQ's format, and
/// the source addresses.
pub(super) struct CqEntries {
    pub(super) tagged: Box<[ffi::fi_cq_tagged_entry; CQ_BATCH]>,
    pub(super) data: Box<[ffi::fi_cq_data_entry; CQ_BATCH]>,
    pub(super) srcs: Box<[ffi::fi_addr_t; CQ_BATCH]>,
}

impl Default for CqEntries {
    fn default() -> Self {
        CqEntries {
            tagged: Box::new([ffi::fi_cq_tagged_entry::default(); CQ_BATCH]),
            data: Box::new([ffi::fi_cq_data_entry::default(); CQ_BATCH]),
            srcs: Box::new([ffi::FI_ADDR_NOTAVAIL; CQ_BATCH]),
        }
    }
}

pub(crate) struct Cq {
    pub(crate) raw: *mut ffi::fid_cq,
    /// FI_CQ_FORMAT_TAGGED, or FI_CQ_FORMAT_DATA.
    pub(super) tagged: bool,
    pub(super) wait_fd: Option<i32>,
    pub(super) capacity: usize,
    pub(super) _domain: Arc<DomainInner>,
}

impl Drop for Cq {
    fn drop(&mut self) {
        if self.raw.is_null() {
            // Left open with the endpoints bound to it (teardown.rs).
            return;
        }
        // SAFETY: opened by fi_cq_open; every endpoint bound to it is closed
        // before the EventLoop drops this field (or the loop left the queue
        // open with them, above).
        unsafe { close_fid("completion queue", &mut (*self.raw).fid) }
    }
}

pub(super) struct Av {
    pub(super) raw: *mut ffi::fid_av,
    pub(super) _domain: Arc<DomainInner>,
}

impl Drop for Av {
    fn drop(&mut self) {
        // SAFETY: opened by fi_av_open; endpoints bound to it are closed first.
        unsafe { close_fid("address vector", &mut (*self.raw).fid) }
    }
}

pub(super) const CQ_BATCH: usize = 32;
