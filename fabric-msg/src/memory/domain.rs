//! Fabric and domain: the roots every other libfabric object hangs from.
//!
//! Each raw object has one owner that closes it in `Drop`, and every child
//! holds an `Arc` to its parent, so close order follows from drop order and
//! `-FI_EBUSY` cannot happen.

use crate::discovery::negotiate::{SUPPORTED_MODE, SUPPORTED_MR_MODE};
use crate::discovery::probe::{self, Hints, InfoList};
use crate::discovery::profile::Profile;
use crate::error::{check, Error, Result};
use crate::ffi;
use crate::memory::keys::KeySpace;
use std::ptr;
use std::sync::Arc;

/// Close a fid, logging (never panicking) on failure.
///
/// # Safety
/// `fid` must be a live libfabric object that nothing else will use or close.
pub(crate) unsafe fn close_fid(what: &str, fid: *mut ffi::fid) {
    // SAFETY: the caller hands over a live fid, closed exactly once here.
    let rc = unsafe { ffi::fi_close(fid) };
    if rc != 0 {
        log::warn!("closing {what}: {}", Error::from_rc("fi_close", rc.into()));
    }
}

pub(crate) struct FabricInner {
    pub(crate) raw: *mut ffi::fid_fabric,
}

// SAFETY: a fid_fabric may be used from any thread; fabric-msg calls into it
// only for fi_trywait and opening children, which libfabric serialises at
// every threading level (`FI_THREAD_*` governs endpoints, CQs and domains).
unsafe impl Send for FabricInner {}
// SAFETY: see Send; no method takes &mut.
unsafe impl Sync for FabricInner {}

impl Drop for FabricInner {
    fn drop(&mut self) {
        // SAFETY: raw was opened by fi_fabric and every child holds an Arc to
        // this value, so all of them are closed already.
        unsafe { close_fid("fabric", &mut (*self.raw).fid) }
    }
}

/// An open fabric and domain for a negotiated profile.
pub(crate) struct DomainInner {
    pub(crate) raw: *mut ffi::fid_domain,
    pub(crate) fabric: Arc<FabricInner>,
    /// The `fi_info` the domain was opened from; endpoints open from it.
    pub(crate) info: InfoList,
    pub(crate) info_index: usize,
    pub(crate) profile: Profile,
    /// Application-chosen keys for domains without `FI_MR_PROV_KEY`.
    pub(crate) keys: KeySpace,
}

// SAFETY: all use of the domain from fabric-msg goes through the EventLoop
// that owns it (`&mut self`), or through fi_mr_reg/fi_close of memory
// regions, which libfabric allows concurrently from FI_THREAD_DOMAIN up only
// when serialised: fabric-msg serialises them through the same loop.
unsafe impl Send for DomainInner {}
// SAFETY: see Send.
unsafe impl Sync for DomainInner {}

impl DomainInner {
    /// Open the fabric and domain the profile describes.
    pub(crate) fn open(profile: &Profile) -> Result<Arc<DomainInner>> {
        let caps = domain_caps(&profile.caps_requested, profile.atomics_emulated());
        // Negotiation asked for FI_SOURCE where it will be used; libfabric
        // 2.x grants a secondary capability only when asked, and sizes the
        // CQ's source table from the domain's.
        let source = if profile.source { ffi::FI_SOURCE } else { 0 };
        let hints = Hints {
            caps: caps | source,
            mode: SUPPORTED_MODE,
            mr_mode: SUPPORTED_MR_MODE,
            endpoint_type: Some(profile.endpoint_type),
            provider: Some(profile.provider.clone()),
            domain: Some(profile.domain.clone()),
        };
        let info = probe::getinfo(&hints)?;
        let info_index = info
            .position(&profile.domain)
            .ok_or(Error::NoData { call: "fi_getinfo" })?;
        let node = info.nth(info_index);
        // SAFETY: node is a live entry of `info`, which this value keeps; the
        // sizes written are the ones negotiation chose to fit its limits.
        unsafe {
            (*(*node).tx_attr).size = profile.queues.tx;
            (*(*node).rx_attr).size = profile.queues.rx;
        }
        let mut fabric = ptr::null_mut();
        // SAFETY: fabric_attr belongs to the live node.
        check("fi_fabric", unsafe {
            ffi::fi_fabric((*node).fabric_attr, &mut fabric, ptr::null_mut())
        })?;
        let fabric = Arc::new(FabricInner { raw: fabric });
        let mut domain = ptr::null_mut();
        // SAFETY: fabric is open; node is live.
        check("fi_domain", unsafe {
            ffi::fi_domain(fabric.raw, node, &mut domain, ptr::null_mut())
        })?;
        Ok(Arc::new(DomainInner {
            raw: domain,
            fabric,
            info,
            info_index,
            profile: profile.clone(),
            keys: KeySpace::new(profile.mr_key_size),
        }))
    }

    pub(crate) fn info_ptr(&self) -> *mut ffi::fi_info {
        self.info.nth(self.info_index)
    }

    pub(crate) fn mr_mode(&self, bit: u32) -> bool {
        self.profile.mr_mode_bits & bit as u64 != 0
    }
}

impl Drop for DomainInner {
    fn drop(&mut self) {
        // SAFETY: raw was opened by fi_domain; every child (CQ, AV, MR,
        // endpoint) holds an Arc to this value and is closed already.
        unsafe { close_fid("domain", &mut (*self.raw).fid) }
    }
}

/// The capabilities a loop's domain is opened with: those negotiated,
/// without `FI_ATOMIC` where fabric-msg emulates every atomic (the loop
/// then issues no native one). With `FI_ATOMIC` among a domain's
/// capabilities, libfabric's `ofi_rxm` (1.17 and 2.1) enters every memory
/// registration in a map keyed by the registration's key, to check
/// incoming atomics; on `verbs;ofi_rxm` the verbs registration cache hands
/// two small buffers that fall in one cached region the same key, so the
/// second registration failed with `FI_ENOKEY` ("MR map insert for atomic
/// verification failed -266"): `atomics -w 4` on soft-RoCE, issue 14.
fn domain_caps(requested: &[String], atomics_emulated: bool) -> u64 {
    let caps = requested
        .iter()
        .filter_map(|n| {
            crate::discovery::info::CAP_NAMES
                .iter()
                .find(|(name, _)| name == n)
                .map(|(_, b)| *b)
        })
        .fold(0, |a, b| a | b);
    if atomics_emulated {
        caps & !(ffi::FI_ATOMIC as u64)
    } else {
        caps
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: &[&str]) -> Vec<String> {
        n.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn emulated_atomics_open_the_domain_without_fi_atomic() {
        let req = names(&["FI_MSG", "FI_TAGGED", "FI_ATOMIC"]);
        let atomic = ffi::FI_ATOMIC as u64;
        let tagged = ffi::FI_TAGGED as u64;
        assert_eq!(domain_caps(&req, true) & atomic, 0);
        assert_eq!(domain_caps(&req, true) & tagged, tagged);
        // Native atomics need it.
        assert_eq!(domain_caps(&req, false) & atomic, atomic);
    }
}
