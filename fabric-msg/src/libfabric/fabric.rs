//! The roots: the fabric, its domain, and the domain's address vector.
//! Also [`close_fid`], which every owner here closes its object with.

use super::info::InfoRef;
use crate::error::{check, strerror, Error, Result};
use crate::ffi;
use std::ptr::{self, NonNull};
use std::sync::Arc;

/// Close a fid, returning libfabric's code (0 on success).
///
/// # Safety
/// `fid` must be a live libfabric object that nothing will use or close
/// again.
pub(super) unsafe fn close_raw(fid: *mut ffi::fid) -> i32 {
    // SAFETY: the caller hands over a live fid, closed exactly once here.
    unsafe { ffi::fi_close(fid) }
}

/// Close a fid, logging (never panicking) on failure.
///
/// # Safety
/// As for [`close_raw`].
pub(super) unsafe fn close_fid(what: &str, fid: *mut ffi::fid) {
    // SAFETY: the caller's promise.
    let rc = unsafe { close_raw(fid) };
    if rc != 0 {
        log::warn!(
            call = "fi_close", object = what, fi_errno = rc.unsigned_abs(), fi_error = strerror(rc.unsigned_abs()).as_str();
            "closing {what}: {}", Error::from_rc("fi_close", rc.into())
        );
    }
}

/// An open fabric (`fi_fabric`).
pub(crate) struct Fabric {
    raw: NonNull<ffi::fid_fabric>,
}

// SAFETY: a fid_fabric may be used from any thread; fabric-msg calls into it
// only for fi_trywait and opening children, which libfabric serialises at
// every threading level (`FI_THREAD_*` governs endpoints, CQs and domains).
unsafe impl Send for Fabric {}
// SAFETY: see Send; no method takes &mut.
unsafe impl Sync for Fabric {}

impl Fabric {
    /// Open the fabric `info` names.
    pub(crate) fn open(info: InfoRef<'_>) -> Result<Arc<Fabric>> {
        let mut raw = ptr::null_mut();
        // SAFETY: fabric_attr belongs to the live entry.
        check("fi_fabric", unsafe {
            ffi::fi_fabric(info.get().fabric_attr, &mut raw, ptr::null_mut())
        })?;
        let raw = NonNull::new(raw).ok_or(Error::NoData { call: "fi_fabric" })?;
        Ok(Arc::new(Fabric { raw }))
    }

    pub(super) fn raw(&self) -> *mut ffi::fid_fabric {
        self.raw.as_ptr()
    }
}

impl Drop for Fabric {
    fn drop(&mut self) {
        // SAFETY: opened by fi_fabric; every child holds an Arc to this
        // value, so all of them are closed already.
        unsafe { close_fid("fabric", &mut (*self.raw.as_ptr()).fid) }
    }
}

/// An open domain (`fi_domain`), holding its fabric.
pub(crate) struct Domain {
    raw: NonNull<ffi::fid_domain>,
    fabric: Arc<Fabric>,
}

// SAFETY: fabric-msg uses a domain from the EventLoop that owns it
// (`&mut self`), or to register and close memory regions, which it allows
// only at FI_THREAD_SAFE and FI_THREAD_FID (memory/mr.rs checks), where
// libfabric takes such calls from any thread.
unsafe impl Send for Domain {}
// SAFETY: see Send.
unsafe impl Sync for Domain {}

impl Domain {
    /// Open the domain `info` names on `fabric`.
    pub(crate) fn open(fabric: &Arc<Fabric>, info: InfoRef<'_>) -> Result<Arc<Domain>> {
        let mut raw = ptr::null_mut();
        // SAFETY: the fabric is open; info is live for the call.
        check("fi_domain", unsafe {
            ffi::fi_domain(fabric.raw(), info.as_ptr(), &mut raw, ptr::null_mut())
        })?;
        let raw = NonNull::new(raw).ok_or(Error::NoData { call: "fi_domain" })?;
        Ok(Arc::new(Domain {
            raw,
            fabric: fabric.clone(),
        }))
    }

    pub(crate) fn fabric(&self) -> &Arc<Fabric> {
        &self.fabric
    }

    pub(super) fn raw(&self) -> *mut ffi::fid_domain {
        self.raw.as_ptr()
    }

    /// Map a peer's raw memory key (`FI_MR_RAW`) for use on this domain:
    /// the 64-bit key to post with. Unmap it with [`Domain::unmap_key`].
    pub(crate) fn map_raw_key(&self, base: u64, raw_key: &[u8]) -> Result<u64> {
        let mut key = 0u64;
        // SAFETY: the domain is open; raw_key is read for its length during
        // the call (libfabric's prototype lacks the const); key is a valid
        // out-pointer.
        check("fi_mr_map_raw", unsafe {
            ffi::fi_mr_map_raw(
                self.raw(),
                base,
                raw_key.as_ptr().cast_mut(),
                raw_key.len(),
                &mut key,
                0,
            )
        })?;
        Ok(key)
    }

    /// Undo [`Domain::map_raw_key`].
    pub(crate) fn unmap_key(&self, key: u64) -> Result<()> {
        // SAFETY: the domain is open; libfabric looks the key up and
        // refuses one it did not map.
        check("fi_mr_unmap_key", unsafe {
            ffi::fi_mr_unmap_key(self.raw(), key)
        })?;
        Ok(())
    }
}

impl Drop for Domain {
    fn drop(&mut self) {
        // SAFETY: opened by fi_domain; every child (CQ, AV, EQ, MR,
        // endpoint) holds an Arc to this value and is closed already.
        unsafe { close_fid("domain", &mut (*self.raw.as_ptr()).fid) }
    }
}

/// An address vector (`fi_av_open`), holding its domain.
pub(crate) struct Av {
    raw: NonNull<ffi::fid_av>,
    _domain: Arc<Domain>,
}

// SAFETY: used by the loop that owns it (through `&mut` of the loop), with
// inserts made under the progress thread's gate.
unsafe impl Send for Av {}
// SAFETY: see Send.
unsafe impl Sync for Av {}

impl Av {
    /// Open an address vector for about `count` peers.
    pub(crate) fn open(domain: &Arc<Domain>, count: usize) -> Result<Arc<Av>> {
        let mut attr = ffi::fi_av_attr {
            type_: ffi::FI_AV_UNSPEC,
            count,
            ..Default::default()
        };
        let mut raw = ptr::null_mut();
        // SAFETY: the domain is open; attr lives for the call.
        check("fi_av_open", unsafe {
            ffi::fi_av_open(domain.raw(), &mut attr, &mut raw, ptr::null_mut())
        })?;
        let raw = NonNull::new(raw).ok_or(Error::NoData { call: "fi_av_open" })?;
        Ok(Arc::new(Av {
            raw,
            _domain: domain.clone(),
        }))
    }

    pub(super) fn raw(&self) -> *mut ffi::fid_av {
        self.raw.as_ptr()
    }

    /// Insert `out.len()` addresses packed back to back in `packed`,
    /// writing each one's `fi_addr_t` (or `FI_ADDR_NOTAVAIL`) to `out`.
    /// Returns `fi_av_insert`'s count of addresses inserted, or its error.
    ///
    /// # Safety
    /// `packed` must hold `out.len()` well-formed addresses of the
    /// provider's format (libfabric reads each to its own length or NUL,
    /// not to `packed`'s end): check peers' names first
    /// (`transport/address.rs`).
    pub(crate) unsafe fn insert(&self, packed: &[u8], out: &mut [ffi::fi_addr_t]) -> Result<usize> {
        // SAFETY: the AV is open; the caller's promise covers `packed`;
        // `out` has room for one fi_addr_t per address.
        let rc = unsafe {
            ffi::fi_av_insert(
                self.raw(),
                packed.as_ptr().cast(),
                out.len(),
                out.as_mut_ptr(),
                0,
                ptr::null_mut(),
            )
        };
        check("fi_av_insert", rc).map(|n| n as usize)
    }
}

impl Drop for Av {
    fn drop(&mut self) {
        // SAFETY: opened by fi_av_open; every endpoint bound to it holds an
        // Arc to this value and is closed already.
        unsafe { close_fid("address vector", &mut (*self.raw.as_ptr()).fid) }
    }
}
