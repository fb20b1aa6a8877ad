//! Memory registration (`fi_mr_reg`): the owner that closes it, its
//! descriptor and key, binding it to an endpoint (`FI_MR_ENDPOINT`), and
//! its raw key (`FI_MR_RAW`). Which key to ask for, and what memory to
//! register, is `memory/`'s business.

use super::fabric::{close_fid, Domain};
use super::post::RawEndpoint;
use crate::error::{check, Result};
use crate::ffi;
use std::os::raw::c_void;
use std::ptr::{self, NonNull};
use std::sync::Arc;

/// A memory registration, holding its domain. Closed on drop.
pub(crate) struct Mr {
    raw: NonNull<ffi::fid_mr>,
    _domain: Arc<Domain>,
}

// SAFETY: a registration is only read (descriptor, key) or closed once in
// Drop; memory/ registers only at FI_THREAD_SAFE and FI_THREAD_FID, where
// closing it from another thread than the loop's is allowed.
unsafe impl Send for Mr {}
// SAFETY: see Send; no &self method changes it.
unsafe impl Sync for Mr {}

impl Mr {
    /// Register `len` bytes at `ptr` for `access` (`FI_SEND | FI_READ ...`),
    /// asking for `requested_key` (ignored under `FI_MR_PROV_KEY`).
    /// `Err` is libfabric's negative code, for the caller to act on
    /// (`-FI_ENOKEY`: draw another key; `-FI_ENOMEM`: the memlock limit).
    ///
    /// # Safety
    /// `ptr..ptr+len` stays allocated until the registration is dropped.
    pub(crate) unsafe fn register(
        domain: &Arc<Domain>,
        ptr: *const u8,
        len: usize,
        access: u64,
        requested_key: u64,
    ) -> std::result::Result<Mr, i32> {
        let mut raw = ptr::null_mut();
        // SAFETY: the caller keeps the memory allocated for the
        // registration's life; the out-pointer is valid.
        let rc = unsafe {
            ffi::fi_mr_reg(
                domain.raw(),
                ptr.cast(),
                len,
                access,
                0,
                requested_key,
                0,
                &mut raw,
                ptr::null_mut(),
            )
        };
        if rc != 0 {
            return Err(rc);
        }
        let raw = NonNull::new(raw).ok_or(-(ffi::FI_EINVAL as i32))?;
        Ok(Mr {
            raw,
            _domain: domain.clone(),
        })
    }

    /// Bind to `ep` and enable (`FI_MR_ENDPOINT`).
    ///
    /// # Safety
    /// `ep` is open, and stays open while this registration lives (the
    /// caller holds what keeps it so).
    pub(crate) unsafe fn bind(&self, ep: RawEndpoint) -> Result<()> {
        // SAFETY: both are open (the caller's promise for `ep`).
        check("fi_mr_bind", unsafe {
            ffi::fi_mr_bind(self.raw.as_ptr(), ep.fid(), 0)
        })?;
        // SAFETY: the region is bound, as fi_mr_enable requires here.
        check("fi_mr_enable", unsafe { ffi::fi_mr_enable(self.raw.as_ptr()) })?;
        Ok(())
    }

    /// The local descriptor operations on this memory pass.
    pub(crate) fn desc(&self) -> *mut c_void {
        // SAFETY: a live registration.
        unsafe { ffi::fi_mr_desc(self.raw.as_ptr()) }
    }

    /// The 64-bit key peers present (`FI_KEY_NOTAVAIL`, all ones, under
    /// `FI_MR_RAW`).
    pub(crate) fn key(&self) -> u64 {
        // SAFETY: a live registration.
        unsafe { ffi::fi_mr_key(self.raw.as_ptr()) }
    }

    /// The raw key (`FI_MR_RAW`) of at most `size` bytes, and the base
    /// address peers add offsets to.
    pub(crate) fn raw_key(&self, size: usize) -> Result<(u64, Vec<u8>)> {
        let mut base = 0u64;
        let mut size = size.max(1);
        let mut key = vec![0u8; size];
        // SAFETY: a live registration; key has `size` writable bytes; the
        // outputs are valid.
        check("fi_mr_raw_attr", unsafe {
            ffi::fi_mr_raw_attr(self.raw.as_ptr(), &mut base, key.as_mut_ptr(), &mut size, 0)
        })?;
        key.truncate(size);
        Ok((base, key))
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        // SAFETY: opened by fi_mr_reg and closed once, before the domain
        // (held) and before the memory it covers (its owner's promise).
        unsafe { close_fid("memory registration", &mut (*self.raw.as_ptr()).fid) }
    }
}
