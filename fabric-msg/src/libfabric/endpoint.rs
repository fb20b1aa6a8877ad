//! Endpoints: an active one ([`Endpoint`]: opened from an `fi_info`,
//! bound to its CQ and AV or EQ, enabled, named, connected or accepted)
//! and a passive one listening for connection requests
//! ([`PassiveEndpoint`]). Posting on an open endpoint is `post.rs`.

use super::cq::Cq;
use super::eq::Eq;
use super::fabric::{close_fid, close_raw, Av, Domain, Fabric};
use super::info::{Info, InfoRef};
use super::post::RawEndpoint;
use crate::error::{check, Error, Result};
use crate::ffi;
use std::os::raw::c_void;
use std::ptr::{self, NonNull};
use std::sync::Arc;

/// What an endpoint holds open: the domain it was opened on and what it
/// is bound to.
#[derive(Default)]
struct Parents {
    _domain: Option<Arc<Domain>>,
    _cq: Option<Arc<Cq>>,
    _av: Option<Arc<Av>>,
    _eq: Option<Arc<Eq>>,
}

/// An active endpoint (`fi_endpoint`). Closed on drop (errors logged), or
/// by [`Endpoint::close`], which reports them.
pub(crate) struct Endpoint {
    raw: NonNull<ffi::fid_ep>,
    parents: Parents,
    closed: bool,
}

// SAFETY: an endpoint is used by the loop that owns it (through `&mut` of
// the loop), and by the progress thread only under the loop's gate, as
// transport/progress.rs explains.
unsafe impl Send for Endpoint {}

impl Endpoint {
    /// Open an endpoint of `info` on `domain`, with `context` as its fid's
    /// context (what [`RawEndpoint::context`] reads back).
    ///
    /// # Safety
    /// `context` is null or stays valid for as long as anything may read
    /// it through the endpoint.
    pub(crate) unsafe fn open(
        domain: &Arc<Domain>,
        info: InfoRef<'_>,
        context: *mut c_void,
    ) -> Result<Endpoint> {
        let mut raw = ptr::null_mut();
        // SAFETY: the domain is open and info live for the call; the
        // context is the caller's promise.
        check("fi_endpoint", unsafe {
            ffi::fi_endpoint(domain.raw(), info.as_ptr(), &mut raw, context)
        })?;
        let raw = NonNull::new(raw).ok_or(Error::NoData { call: "fi_endpoint" })?;
        Ok(Endpoint {
            raw,
            parents: Parents {
                _domain: Some(domain.clone()),
                ..Default::default()
            },
            closed: false,
        })
    }

    fn fid(&self) -> *mut ffi::fid {
        // SAFETY: raw is open while self lives; only the field's address is taken.
        unsafe { &mut (*self.raw.as_ptr()).fid }
    }

    /// The fid's address, to match connection events against.
    pub(crate) fn fid_addr(&self) -> *mut ffi::fid {
        self.fid()
    }

    /// Bind the completion queue for `flags` (`FI_TRANSMIT | FI_RECV`).
    pub(crate) fn bind_cq(&mut self, cq: &Arc<Cq>, flags: u64) -> Result<()> {
        // SAFETY: both are open; the endpoint keeps the CQ until it closes.
        check("fi_ep_bind(cq)", unsafe {
            ffi::fi_ep_bind(self.raw.as_ptr(), cq.fid(), flags)
        })?;
        self.parents._cq = Some(cq.clone());
        Ok(())
    }

    /// Bind the address vector.
    pub(crate) fn bind_av(&mut self, av: &Arc<Av>) -> Result<()> {
        // SAFETY: both are open; the endpoint keeps the AV until it closes.
        check("fi_ep_bind(av)", unsafe {
            ffi::fi_ep_bind(self.raw.as_ptr(), &mut (*av.raw()).fid, 0)
        })?;
        self.parents._av = Some(av.clone());
        Ok(())
    }

    /// Bind the event queue (connected endpoints).
    pub(crate) fn bind_eq(&mut self, eq: &Arc<Eq>) -> Result<()> {
        // SAFETY: both are open; the endpoint keeps the EQ until it closes.
        check("fi_ep_bind(eq)", unsafe {
            ffi::fi_ep_bind(self.raw.as_ptr(), eq.fid(), 0)
        })?;
        self.parents._eq = Some(eq.clone());
        Ok(())
    }

    /// `fi_enable`.
    pub(crate) fn enable(&self) -> Result<()> {
        // SAFETY: the endpoint is open and bound.
        check("fi_enable", unsafe { ffi::fi_enable(self.raw.as_ptr()) })?;
        Ok(())
    }

    /// `FI_OPT_MIN_MULTI_RECV`: the space below which a multi-receive
    /// buffer is released.
    pub(crate) fn set_min_multi_recv(&self, min: usize) -> Result<()> {
        // SAFETY: the endpoint is open; the option reads one usize.
        check("fi_setopt(FI_OPT_MIN_MULTI_RECV)", unsafe {
            ffi::fi_setopt(
                self.fid(),
                ffi::FI_OPT_ENDPOINT as i32,
                ffi::FI_OPT_MIN_MULTI_RECV as i32,
                (&min as *const usize).cast(),
                std::mem::size_of::<usize>(),
            )
        })?;
        Ok(())
    }

    /// The endpoint's address (`fi_getname`), to give to peers.
    pub(crate) fn name(&self) -> Result<Vec<u8>> {
        // SAFETY: the fid is open.
        unsafe { getname(self.fid()) }
    }

    /// `fi_connect` to the listening address `addr`, with `data` as the
    /// connection's private data.
    ///
    /// # Safety
    /// `addr` is an address of the provider's format, checked
    /// (`transport/address.rs`): libfabric reads it by its format, not by
    /// `addr`'s length.
    pub(crate) unsafe fn connect(&self, addr: &[u8], data: &[u8]) -> Result<()> {
        // SAFETY: the endpoint is bound and enabled; addr is the caller's
        // promise; both buffers are read during the call only.
        check("fi_connect", unsafe {
            ffi::fi_connect(
                self.raw.as_ptr(),
                addr.as_ptr().cast(),
                data.as_ptr().cast(),
                data.len(),
            )
        })?;
        Ok(())
    }

    /// `fi_accept` the request this endpoint was opened from.
    pub(crate) fn accept(&self) -> Result<()> {
        // SAFETY: the endpoint was opened from a request's info, bound and enabled.
        check("fi_accept", unsafe {
            ffi::fi_accept(self.raw.as_ptr(), ptr::null(), 0)
        })?;
        Ok(())
    }

    /// How many u64 elements one atomic of `op` in `form` (`atomic`,
    /// `fetch` or `compare`) may carry here; `None` if it is not valid.
    pub(crate) fn atomic_count(&self, form: &str, op: ffi::fi_op) -> Option<usize> {
        let mut count = 0usize;
        let ep = self.raw.as_ptr();
        // SAFETY: the endpoint is open; count is a valid out-pointer.
        let rc = unsafe {
            match form {
                "atomic" => ffi::fi_atomicvalid(ep, ffi::FI_UINT64, op, &mut count),
                "fetch" => ffi::fi_fetch_atomicvalid(ep, ffi::FI_UINT64, op, &mut count),
                _ => ffi::fi_compare_atomicvalid(ep, ffi::FI_UINT64, op, &mut count),
            }
        };
        (rc == 0 && count > 0).then_some(count)
    }

    /// The handle to post through.
    #[inline]
    pub(crate) fn raw(&self) -> RawEndpoint {
        RawEndpoint::new(self.raw)
    }

    /// Close now and report failure. On failure the provider may still use
    /// what the endpoint is bound to, so that is kept open for good.
    pub(crate) fn close(mut self) -> Result<()> {
        self.closed = true;
        // SAFETY: open, and closed once: `closed` stops Drop from closing again.
        let rc = unsafe { close_raw(self.fid()) };
        if rc != 0 {
            std::mem::forget(std::mem::take(&mut self.parents));
        }
        check("fi_close(endpoint)", rc).map(|_| ())
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        if !self.closed {
            // SAFETY: open, closed once, before what it is bound to (held
            // in `parents`, dropped after this body).
            unsafe { close_fid("endpoint", self.fid()) }
        }
    }
}

/// `fi_getname` into a buffer grown to what the provider asks.
///
/// # Safety
/// `fid` is an open endpoint or passive endpoint.
unsafe fn getname(fid: *mut ffi::fid) -> Result<Vec<u8>> {
    let mut name = vec![0u8; 256];
    loop {
        let mut len = name.len();
        // SAFETY: the fid is open (the caller's promise); name has `len` writable bytes.
        let rc = unsafe { ffi::fi_getname(fid, name.as_mut_ptr().cast(), &mut len) };
        if rc == -(ffi::FI_ETOOSMALL as i32) && len > name.len() {
            name.resize(len, 0);
            continue;
        }
        check("fi_getname", rc)?;
        name.truncate(len);
        return Ok(name);
    }
}

/// A passive endpoint (`fi_passive_ep`) listening for connection requests.
pub(crate) struct PassiveEndpoint {
    raw: NonNull<ffi::fid_pep>,
    _fabric: Arc<Fabric>,
    _eq: Option<Arc<Eq>>,
}

// SAFETY: used by the loop that owns it (through `&mut` of the loop).
unsafe impl Send for PassiveEndpoint {}

impl PassiveEndpoint {
    /// Open a passive endpoint of `info` on `fabric`.
    pub(crate) fn open(fabric: &Arc<Fabric>, info: InfoRef<'_>) -> Result<PassiveEndpoint> {
        let mut raw = ptr::null_mut();
        // SAFETY: the fabric is open and info live for the call.
        check("fi_passive_ep", unsafe {
            ffi::fi_passive_ep(fabric.raw(), info.as_ptr(), &mut raw, ptr::null_mut())
        })?;
        let raw = NonNull::new(raw).ok_or(Error::NoData {
            call: "fi_passive_ep",
        })?;
        Ok(PassiveEndpoint {
            raw,
            _fabric: fabric.clone(),
            _eq: None,
        })
    }

    fn fid(&self) -> *mut ffi::fid {
        // SAFETY: raw is open while self lives; only the field's address is taken.
        unsafe { &mut (*self.raw.as_ptr()).fid }
    }

    /// Bind the event queue its requests arrive on.
    pub(crate) fn bind_eq(&mut self, eq: &Arc<Eq>) -> Result<()> {
        // SAFETY: both are open; the passive endpoint keeps the EQ.
        check("fi_pep_bind(eq)", unsafe {
            ffi::fi_pep_bind(self.raw.as_ptr(), eq.fid(), 0)
        })?;
        self._eq = Some(eq.clone());
        Ok(())
    }

    /// Start listening (bound to an EQ first).
    pub(crate) fn listen(&self) -> Result<()> {
        // SAFETY: open, and bound to an EQ as fi_listen requires (else it fails).
        check("fi_listen", unsafe { ffi::fi_listen(self.raw.as_ptr()) })?;
        Ok(())
    }

    /// The address it listens on.
    pub(crate) fn name(&self) -> Result<Vec<u8>> {
        // SAFETY: the fid is open.
        unsafe { getname(self.fid()) }
    }

    /// Refuse the connection request `request` (read from this passive
    /// endpoint's EQ, neither accepted nor rejected yet).
    pub(crate) fn reject(&self, request: &Info) {
        // SAFETY: the handle is a pending request's, released by fi_reject;
        // the passive endpoint that received it is listening.
        let rc = unsafe { ffi::fi_reject(self.raw.as_ptr(), request.handle(), ptr::null(), 0) };
        if rc != 0 {
            log::warn!(call = "fi_reject", fi_errno = rc.unsigned_abs(); "{}", Error::from_rc("fi_reject", rc.into()));
        }
    }
}

impl Drop for PassiveEndpoint {
    fn drop(&mut self) {
        // SAFETY: opened by fi_passive_ep; closed once, before its EQ (held).
        unsafe { close_fid("passive endpoint", self.fid()) }
    }
}
