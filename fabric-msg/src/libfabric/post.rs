//! The data path: posting sends, receives, one-sided operations and
//! atomics on an open endpoint, and cancelling them.
//!
//! [`RawEndpoint`] is a copyable handle to an [`Endpoint`](super::Endpoint)
//! (or null, for a connected-endpoint loop's base endpoint, which stands
//! for the loop and is never posted on). Every call is an `unsafe fn`: the
//! endpoint must be open and enabled, and the memory and context of an
//! operation must stay valid until its completion is read — which the
//! event loop's operation slots guarantee, not this type. Each returns
//! libfabric's code (0, or a negative `FI_E*`), as the loop's retry logic
//! wants it.

use crate::ffi;
use std::os::raw::c_void;
use std::ptr::{self, NonNull};

/// A handle to an open endpoint, to post through. Copy; owns nothing.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct RawEndpoint(*mut ffi::fid_ep);

impl RawEndpoint {
    /// The handle of no endpoint (a connected loop's base endpoint).
    pub(crate) const NULL: RawEndpoint = RawEndpoint(ptr::null_mut());

    pub(super) fn new(raw: NonNull<ffi::fid_ep>) -> RawEndpoint {
        RawEndpoint(raw.as_ptr())
    }

    #[inline]
    pub(crate) fn is_null(self) -> bool {
        self.0.is_null()
    }

    pub(super) fn fid(self) -> *mut ffi::fid {
        // An fid_ep begins with its fid (fi_endpoint.h), so the two
        // pointers are one; nothing is read here.
        self.0.cast()
    }

    /// The context the endpoint was opened with
    /// ([`Endpoint::open`](super::Endpoint::open)).
    ///
    /// # Safety
    /// The endpoint is open.
    #[inline]
    pub(crate) unsafe fn context(self) -> *mut c_void {
        // SAFETY: open (the caller's promise), so its fid can be read.
        unsafe { (*self.0).fid.context }
    }

    /// A send in the form its options call for: `fi_send`, `fi_tsend`
    /// (`tag`), `fi_senddata` (`data`) or `fi_tsenddata` (both).
    ///
    /// # Safety
    /// The endpoint is enabled; `len` bytes at `buf` stay valid until the
    /// completion; `desc` is their local descriptor (or NULL where none is
    /// needed); `ctx` is an operation's context, valid until the completion.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    pub(crate) unsafe fn send(
        self,
        buf: *mut c_void,
        len: usize,
        desc: *mut c_void,
        addr: ffi::fi_addr_t,
        tag: Option<u64>,
        data: Option<u64>,
        ctx: *mut c_void,
    ) -> isize {
        let ep = self.0;
        // SAFETY: the caller's promises are exactly these calls' requirements.
        unsafe {
            match (tag, data) {
                (None, None) => ffi::fi_send(ep, buf, len, desc, addr, ctx),
                (Some(t), None) => ffi::fi_tsend(ep, buf, len, desc, addr, t, ctx),
                (None, Some(d)) => ffi::fi_senddata(ep, buf, len, desc, d, addr, ctx),
                (Some(t), Some(d)) => ffi::fi_tsenddata(ep, buf, len, desc, d, addr, t, ctx),
            }
        }
    }

    /// An inject (`fi_inject` and its tagged and data forms): the bytes are
    /// copied before the call returns, and no completion comes.
    ///
    /// # Safety
    /// The endpoint is enabled; `len` bytes at `buf` are readable for the
    /// call, and `len` is at most the provider's inject size.
    #[inline]
    pub(crate) unsafe fn inject(
        self,
        buf: *const c_void,
        len: usize,
        addr: ffi::fi_addr_t,
        tag: Option<u64>,
        data: Option<u64>,
    ) -> isize {
        let ep = self.0;
        // SAFETY: the caller's promises are exactly these calls' requirements.
        unsafe {
            match (tag, data) {
                (None, None) => ffi::fi_inject(ep, buf, len, addr),
                (Some(t), None) => ffi::fi_tinject(ep, buf, len, addr, t),
                (None, Some(d)) => ffi::fi_injectdata(ep, buf, len, d, addr),
                (Some(t), Some(d)) => ffi::fi_tinjectdata(ep, buf, len, d, addr, t),
            }
        }
    }

    /// A receive, tagged (`(tag, ignore)`: `fi_trecv`) or not (`fi_recv`).
    ///
    /// # Safety
    /// As for [`RawEndpoint::send`], with `len` writable bytes at `buf`.
    #[inline]
    pub(crate) unsafe fn recv(
        self,
        buf: *mut c_void,
        len: usize,
        desc: *mut c_void,
        src: ffi::fi_addr_t,
        tag: Option<(u64, u64)>,
        ctx: *mut c_void,
    ) -> isize {
        let ep = self.0;
        // SAFETY: the caller's promises are exactly these calls' requirements.
        unsafe {
            match tag {
                None => ffi::fi_recv(ep, buf, len, desc, src, ctx),
                Some((t, ignore)) => ffi::fi_trecv(ep, buf, len, desc, src, t, ignore, ctx),
            }
        }
    }

    /// A receive into two pieces of memory (`fi_recvv` / `fi_trecvv`).
    ///
    /// # Safety
    /// As for [`RawEndpoint::recv`], for both pieces; `iov` and `descs` are
    /// read during the call only.
    #[inline]
    pub(crate) unsafe fn recv2(
        self,
        iov: &[libc::iovec; 2],
        descs: &mut [*mut c_void; 2],
        src: ffi::fi_addr_t,
        tag: Option<(u64, u64)>,
        ctx: *mut c_void,
    ) -> isize {
        let ep = self.0;
        // SAFETY: the caller's promises are exactly these calls' requirements.
        unsafe {
            match tag {
                None => ffi::fi_recvv(ep, iov.as_ptr(), descs.as_mut_ptr(), 2, src, ctx),
                Some((t, ignore)) => {
                    ffi::fi_trecvv(ep, iov.as_ptr(), descs.as_mut_ptr(), 2, src, t, ignore, ctx)
                }
            }
        }
    }

    /// `fi_recvmsg` (the multi-receive buffer's post, `FI_MULTI_RECV`).
    ///
    /// # Safety
    /// As for [`RawEndpoint::recv`], for what `msg` describes; `msg` itself
    /// is read during the call only.
    #[inline]
    pub(crate) unsafe fn recvmsg(self, msg: &ffi::fi_msg, flags: u64) -> isize {
        // SAFETY: the caller's promises are this call's requirements.
        unsafe { ffi::fi_recvmsg(self.0, msg, flags) }
    }

    /// `fi_trecvmsg` (a peek, `FI_PEEK`, or the receive of a message a
    /// peek claimed, `FI_CLAIM`).
    ///
    /// # Safety
    /// As for [`RawEndpoint::recv`], for what `msg` describes; `msg` itself
    /// is read during the call only. With `FI_CLAIM`, `msg.context` is the
    /// context the claiming peek was posted with.
    #[inline]
    pub(crate) unsafe fn trecvmsg(self, msg: &ffi::fi_msg_tagged, flags: u64) -> isize {
        // SAFETY: the caller's promises are this call's requirements.
        unsafe { ffi::fi_trecvmsg(self.0, msg, flags) }
    }

    /// `fi_readmsg`: read the peer's memory `msg` describes into local memory.
    ///
    /// # Safety
    /// The endpoint is enabled; the local memory `msg` points at is
    /// registered (its descriptor in `msg`) and stays valid until the
    /// completion, as does `msg.context`; the remote range was checked
    /// against what the peer granted. `msg` is read during the call only.
    #[inline]
    pub(crate) unsafe fn readmsg(self, msg: &ffi::fi_msg_rma, flags: u64) -> isize {
        // SAFETY: the caller's promises are this call's requirements.
        unsafe { ffi::fi_readmsg(self.0, msg, flags) }
    }

    /// `fi_writemsg`: write local memory into the peer's.
    ///
    /// # Safety
    /// As for [`RawEndpoint::readmsg`].
    #[inline]
    pub(crate) unsafe fn writemsg(self, msg: &ffi::fi_msg_rma, flags: u64) -> isize {
        // SAFETY: the caller's promises are this call's requirements.
        unsafe { ffi::fi_writemsg(self.0, msg, flags) }
    }

    /// A u64 atomic with no result (`fi_atomic`).
    ///
    /// # Safety
    /// The endpoint is enabled; `operand` is an 8-byte registered word
    /// (descriptor `desc`) valid until the completion, as is `ctx`; the
    /// remote word `(raddr, key)` was checked against what the peer granted.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    pub(crate) unsafe fn atomic(
        self,
        operand: *mut c_void,
        desc: *mut c_void,
        addr: ffi::fi_addr_t,
        raddr: u64,
        key: u64,
        op: ffi::fi_op,
        ctx: *mut c_void,
    ) -> isize {
        // SAFETY: the caller's promises are this call's requirements.
        unsafe {
            ffi::fi_atomic(
                self.0,
                operand,
                1,
                desc,
                addr,
                raddr,
                key,
                ffi::FI_UINT64,
                op,
                ctx,
            )
        }
    }

    /// A u64 atomic whose old value lands in `result` (`fi_fetch_atomic`).
    ///
    /// # Safety
    /// As for [`RawEndpoint::atomic`], with `result` a registered word in
    /// the same region (descriptor `desc`).
    #[allow(clippy::too_many_arguments)]
    #[inline]
    pub(crate) unsafe fn fetch_atomic(
        self,
        operand: *mut c_void,
        result: *mut c_void,
        desc: *mut c_void,
        addr: ffi::fi_addr_t,
        raddr: u64,
        key: u64,
        op: ffi::fi_op,
        ctx: *mut c_void,
    ) -> isize {
        // SAFETY: the caller's promises are this call's requirements.
        unsafe {
            ffi::fi_fetch_atomic(
                self.0,
                operand,
                1,
                desc,
                result,
                desc,
                addr,
                raddr,
                key,
                ffi::FI_UINT64,
                op,
                ctx,
            )
        }
    }

    /// A u64 compare atomic (`fi_compare_atomic`).
    ///
    /// # Safety
    /// As for [`RawEndpoint::fetch_atomic`], with `compare` a registered
    /// word in the same region too.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    pub(crate) unsafe fn compare_atomic(
        self,
        operand: *mut c_void,
        compare: *mut c_void,
        result: *mut c_void,
        desc: *mut c_void,
        addr: ffi::fi_addr_t,
        raddr: u64,
        key: u64,
        op: ffi::fi_op,
        ctx: *mut c_void,
    ) -> isize {
        // SAFETY: the caller's promises are this call's requirements.
        unsafe {
            ffi::fi_compare_atomic(
                self.0,
                operand,
                1,
                desc,
                compare,
                desc,
                result,
                desc,
                addr,
                raddr,
                key,
                ffi::FI_UINT64,
                op,
                ctx,
            )
        }
    }

    /// Ask the provider to cancel the operation posted with `ctx`: 0 if it
    /// took the request, `-FI_ENOENT` if no such operation is queued.
    ///
    /// # Safety
    /// The endpoint is open; `ctx` is only compared (an operation's
    /// context, or any pointer).
    #[inline]
    pub(crate) unsafe fn cancel(self, ctx: *mut c_void) -> isize {
        // SAFETY: the endpoint is open; fi_cancel looks `ctx` up only.
        unsafe { ffi::fi_cancel(&mut (*self.0).fid, ctx) }
    }
}
