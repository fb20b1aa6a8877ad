//! The domain a profile opens: libfabric's fabric and domain
//! (`libfabric/fabric.rs` owns them) with what fabric-msg keeps beside
//! them: the `fi_info`, the profile and the key space.

use crate::discovery::negotiate::{SUPPORTED_MODE, SUPPORTED_MR_MODE};
use crate::discovery::probe;
use crate::discovery::profile::Profile;
use crate::error::{Error, Result};
use crate::ffi;
use crate::libfabric::{getinfo, Domain, Fabric, Hints, InfoList, InfoRef};
use crate::memory::keys::KeySpace;
use std::sync::Arc;

/// The domain a loop and its memory live in: libfabric's domain (and,
/// through it, the fabric), the `fi_info` it was opened from, the profile
/// negotiated for it, and the keys drawn for its registrations.
pub(crate) struct DomainInner {
    pub(crate) domain: Arc<Domain>,
    /// The `fi_info` the domain was opened from; endpoints open from it.
    info: InfoList,
    info_index: usize,
    pub(crate) profile: Profile,
    /// Application-chosen keys for domains without `FI_MR_PROV_KEY`.
    pub(crate) keys: KeySpace,
}

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
            endpoint_type: Some(profile.endpoint_type.to_raw()),
            provider: Some(profile.provider.clone()),
            domain: Some(profile.domain.clone()),
        };
        let info = getinfo(&hints)?;
        let info_index =
            probe::position(&info, &profile.domain).ok_or(Error::NoData { call: "fi_getinfo" })?;
        let node = info.nth(info_index).ok_or(Error::NoData { call: "fi_getinfo" })?;
        // SAFETY: node is a live entry of `info`, which this value keeps; the
        // sizes written are the ones negotiation chose to fit its limits.
        unsafe {
            (*node.get().tx_attr).size = profile.queues.tx;
            (*node.get().rx_attr).size = profile.queues.rx;
        }
        let fabric = Fabric::open(node)?;
        let domain = Domain::open(&fabric, node)?;
        Ok(Arc::new(DomainInner {
            domain,
            info,
            info_index,
            profile: profile.clone(),
            keys: KeySpace::new(profile.mr_key_size),
        }))
    }

    /// The `fi_info` entry the domain was opened from.
    pub(crate) fn info(&self) -> InfoRef<'_> {
        self.info
            .nth(self.info_index)
            .expect("the entry `open` found stays in the list it owns")
    }

    pub(crate) fn fabric(&self) -> &Arc<Fabric> {
        self.domain.fabric()
    }

    pub(crate) fn mr_mode(&self, bit: u32) -> bool {
        self.profile.mr_mode_bits & bit as u64 != 0
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
