//! A trial open of a candidate (fabric, domain, CQ, AV, endpoint,
//! enable) that proves it works and reads what only a live endpoint can
//! tell (valid atomics, wait objects), with the same owned libfabric
//! objects the event loop uses (`libfabric/`).

use crate::discovery::info::FabricInfo;
use crate::error::{Error, Result};
use crate::ffi;
use crate::libfabric::{Av, Cq, Domain, Endpoint, Eq, Fabric, Info, InfoList, InfoRef, PassiveEndpoint};
use serde::{Deserialize, Serialize};
use std::ptr;

/// The first entry on `domain`, as an index into the list.
pub(crate) fn position(list: &InfoList, domain: &str) -> Option<usize> {
    // SAFETY: each entry is a live node of `list`.
    list.iter()
        .position(|e| unsafe { FabricInfo::from_raw(e.as_ptr()) }.domain == domain)
}

/// Every entry, copied.
pub(crate) fn entries(list: &InfoList) -> Vec<FabricInfo> {
    // SAFETY: each entry is a live node of `list`.
    list.iter()
        .map(|e| unsafe { FabricInfo::from_raw(e.as_ptr()) })
        .collect()
}

/// One `u64` atomic operation the provider accepts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AtomicSupport {
    /// The operation, e.g. `FI_SUM`.
    pub op: String,
    /// `atomic`, `fetch` or `compare`.
    pub form: String,
    /// Most elements per operation.
    pub count: usize,
}

/// What a trial open found out.
#[derive(Debug, Clone, Default)]
pub(crate) struct ProbeResult {
    pub atomics: Vec<AtomicSupport>,
    pub wait_fd: bool,
}

/// Sizes to open the trial resources with.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ProbeSizes {
    pub cq: usize,
    pub av: usize,
}

/// Open `info` for real, then close everything. The error names the step.
/// `entry` indexes `list` (see [`position`]).
pub(crate) fn open_candidate(
    list: &InfoList,
    entry: usize,
    sizes: ProbeSizes,
    want_atomics: bool,
) -> Result<ProbeResult> {
    let info = list.nth(entry).ok_or(Error::NoData { call: "fi_getinfo" })?;
    let mut result = ProbeResult::default();
    // Each object closes when it drops, children first: they hold their parents.
    let fabric = Fabric::open(info)?;
    let domain = Domain::open(&fabric, info)?;
    // Prefer a CQ with a wait fd (for blocking waits); fall back to none.
    // verbs' own CQs have no tagged format (FI_ENOSYS).
    let tagged = info.get().caps & ffi::FI_TAGGED as u64 != 0;
    let cq = match Cq::open(&domain, sizes.cq, tagged, true) {
        Ok(cq) => {
            result.wait_fd = true;
            cq
        }
        Err(_) => Cq::open(&domain, sizes.cq, tagged, false)?,
    };
    // SAFETY: ep_attr is set in every entry fi_getinfo returns.
    if unsafe { (*info.get().ep_attr).type_ } == ffi::FI_EP_MSG {
        // What a MSG server opens: an EQ and a passive endpoint. (An
        // active verbs endpoint needs a peer address or a connection
        // request; the connector opens those.)
        let eq = Eq::open(&fabric)?;
        let mut pep = PassiveEndpoint::open(&fabric, info)?;
        pep.bind_eq(&eq)?;
        if want_atomics {
            result.atomics = connected_atomics(&domain, info);
        }
    } else {
        let av = Av::open(&domain, sizes.av)?;
        // SAFETY: no context.
        let mut ep = unsafe { Endpoint::open(&domain, info, ptr::null_mut())? };
        ep.bind_cq(&cq, u64::from(ffi::FI_TRANSMIT | ffi::FI_RECV))?;
        ep.bind_av(&av)?;
        match ep.enable() {
            // A region of this endpoint's name exists: stale, if shm
            // named it for our pid (see `remove_stale_shm_region`).
            Err(Error::Fabric { code, .. })
                if code == ffi::FI_EBUSY && ep.name().is_ok_and(|n| remove_stale_shm_region(&n)) =>
            {
                ep.enable()?
            }
            r => r?,
        }
        if want_atomics {
            result.atomics = valid_atomics(&ep);
        }
    }
    Ok(result)
}

/// After shm refused to enable an endpoint with FI_EBUSY: whether trying
/// again can work, because the region of the endpoint's name, left by a
/// dead process, is gone. shm names regions `/dev/shm/<pid>:<n>:<n>` from
/// this process's pid and its own counters, so a region with this
/// endpoint's name was left by a dead process that had our pid (a SIGKILLed
/// process cannot unlink its region); libfabric 1.17 unlinks such a region
/// itself when it meets it, and fails anyway. Anything it left is removed
/// here. Names of other processes' regions are never touched.
pub(crate) fn remove_stale_shm_region(name: &[u8]) -> bool {
    let text = String::from_utf8_lossy(name);
    let Some(region) = text
        .trim_end_matches('\0')
        .strip_prefix("fi_shm://")
        .map(str::to_owned)
    else {
        return false;
    };
    let ours = format!("{}:", std::process::id());
    if !region.starts_with(&ours) || region.contains('/') {
        return false;
    }
    let path = std::path::Path::new("/dev/shm").join(&region);
    if std::fs::remove_file(&path).is_ok() {
        log::warn!(
            "removed {}, left by a dead process that had this pid",
            path.display()
        );
    }
    !path.exists()
}

const ATOMIC_OPS: &[(&str, ffi::fi_op)] = &[
    ("FI_MIN", ffi::FI_MIN),
    ("FI_MAX", ffi::FI_MAX),
    ("FI_SUM", ffi::FI_SUM),
    ("FI_PROD", ffi::FI_PROD),
    ("FI_BOR", ffi::FI_BOR),
    ("FI_BAND", ffi::FI_BAND),
    ("FI_BXOR", ffi::FI_BXOR),
    ("FI_ATOMIC_READ", ffi::FI_ATOMIC_READ),
    ("FI_ATOMIC_WRITE", ffi::FI_ATOMIC_WRITE),
    ("FI_CSWAP", ffi::FI_CSWAP),
    ("FI_CSWAP_NE", ffi::FI_CSWAP_NE),
    ("FI_MSWAP", ffi::FI_MSWAP),
];

/// Which u64 atomics a connected (MSG) endpoint of `info` would accept.
/// verbs assigns an endpoint's atomic operations when it is opened and
/// validates them against the domain alone, so an endpoint that is never
/// connected (nor enabled) answers as a connected one would. It needs a
/// peer address to open (rdma_cm resolves a route): its own is given.
fn connected_atomics(domain: &std::sync::Arc<Domain>, info: InfoRef<'_>) -> Vec<AtomicSupport> {
    let Ok(mut dup) = Info::dup(info) else {
        return Vec::new();
    };
    let own = info.src_addr();
    if !own.is_empty() && info.get().dest_addr.is_null() && dup.set_dest_addr(&own).is_err() {
        return Vec::new();
    }
    // SAFETY: no context.
    match unsafe { Endpoint::open(domain, dup.as_ref(), ptr::null_mut()) } {
        Ok(ep) => valid_atomics(&ep),
        Err(e) => {
            log::debug!("no connected endpoint to ask for atomics: {e}");
            Vec::new()
        }
    }
}

/// Which u64 atomics the endpoint accepts (it is enabled, except for
/// connected endpoints, whose atomics verbs validates on the domain).
fn valid_atomics(ep: &Endpoint) -> Vec<AtomicSupport> {
    let mut out = Vec::new();
    for &(name, op) in ATOMIC_OPS {
        let cmp = matches!(op, ffi::FI_CSWAP | ffi::FI_CSWAP_NE | ffi::FI_MSWAP);
        let kinds: &[&str] = if cmp { &["compare"] } else { &["atomic", "fetch"] };
        for &kind in kinds {
            if let Some(count) = ep.atomic_count(kind, op) {
                out.push(AtomicSupport {
                    op: name.into(),
                    form: kind.into(),
                    count,
                });
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_region_named_for_this_pid_is_taken_for_stale() {
        let pid = std::process::id();
        let mine = format!("/dev/shm/{pid}:77:77");
        std::fs::write(&mine, b"stale").unwrap();
        assert!(remove_stale_shm_region(
            format!("fi_shm://{pid}:77:77\0").as_bytes()
        ));
        assert!(!std::path::Path::new(&mine).exists());
        assert!(
            remove_stale_shm_region(format!("fi_shm://{pid}:77:77").as_bytes()),
            "already gone (libfabric unlinks it itself): worth another try"
        );
        let other = format!("/dev/shm/{}:77:77", pid + 1);
        std::fs::write(&other, b"someone else's").unwrap();
        assert!(!remove_stale_shm_region(
            format!("fi_shm://{}:77:77", pid + 1).as_bytes()
        ));
        assert!(std::path::Path::new(&other).exists());
        std::fs::remove_file(&other).unwrap();
        assert!(!remove_stale_shm_region(b"fi_sockets://127.0.0.1:4"));
        assert!(!remove_stale_shm_region(
            format!("fi_shm://{pid}:../x").as_bytes()
        ));
    }
}
