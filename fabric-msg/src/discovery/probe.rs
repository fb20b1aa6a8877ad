//! The raw libfabric calls negotiation needs: `fi_getinfo` with owned
//! results, and a trial open of a candidate (fabric, domain, CQ, AV,
//! endpoint, enable) that proves it works and reads what only a live
//! endpoint can tell (valid atomics, wait objects).
//!
//! All raw pointers stay inside this module.

use crate::discovery::info::{EndpointType, FabricInfo};
use crate::error::{check, Error, Result};
use crate::ffi;
use serde::{Deserialize, Serialize};
use std::ffi::CString;
use std::ptr;

/// An `fi_info` list owned by Rust; freed on drop.
pub(crate) struct InfoList(*mut ffi::fi_info);

impl InfoList {
    /// Copy every entry.
    pub(crate) fn entries(&self) -> Vec<FabricInfo> {
        let mut out = Vec::new();
        let mut cur = self.0;
        while !cur.is_null() {
            // SAFETY: cur is a node of the list this value owns.
            out.push(unsafe { FabricInfo::from_raw(cur) });
            // SAFETY: as above; `next` is NULL or the following node.
            cur = unsafe { (*cur).next };
        }
        out
    }

    /// The first entry on `domain`, as an index into [`InfoList::entries`].
    pub(crate) fn position(&self, domain: &str) -> Option<usize> {
        self.entries().iter().position(|e| e.domain == domain)
    }

    pub(crate) fn nth(&self, n: usize) -> *mut ffi::fi_info {
        let mut cur = self.0;
        for _ in 0..n {
            if cur.is_null() {
                break;
            }
            // SAFETY: cur is a live node of the list this value owns.
            cur = unsafe { (*cur).next };
        }
        cur
    }
}

impl Drop for InfoList {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: the list came from fi_getinfo or fi_allocinfo and is freed once.
            unsafe { ffi::fi_freeinfo(self.0) }
        }
    }
}

/// What to ask `fi_getinfo` for.
#[derive(Debug, Clone, Default)]
pub(crate) struct Hints {
    pub caps: u64,
    pub mode: u64,
    pub mr_mode: u64,
    pub endpoint_type: Option<EndpointType>,
    pub provider: Option<String>,
    pub domain: Option<String>,
}

/// Call `fi_getinfo`. `Err(Error::NoData)` means nothing matched.
pub(crate) fn getinfo(h: &Hints) -> Result<InfoList> {
    // SAFETY: fi_allocinfo returns a zeroed fi_info with its attribute
    // structs allocated, or NULL.
    let hints = InfoList(unsafe { ffi::fi_allocinfo() });
    if hints.0.is_null() {
        return Err(Error::from_rc("fi_allocinfo", -(ffi::FI_ENOMEM as i64)));
    }
    let dup = |s: &str| -> Result<*mut std::os::raw::c_char> {
        let c = CString::new(s).map_err(|_| Error::Config {
            source_name: "hints".into(),
            message: format!("name {s:?} contains a NUL byte"),
        })?;
        // SAFETY: strdup copies a valid C string into malloc'd memory that
        // fi_freeinfo will free with the hints.
        Ok(unsafe { libc::strdup(c.as_ptr()) })
    };
    // SAFETY: hints.0 and its sub-structs are valid (allocated above); string
    // fields get malloc'd copies owned by the hints from here on.
    unsafe {
        let i = &mut *hints.0;
        i.caps = h.caps;
        i.mode = h.mode;
        (*i.domain_attr).mr_mode = h.mr_mode as i32;
        (*i.ep_attr).type_ = h.endpoint_type.map_or(ffi::FI_EP_UNSPEC, EndpointType::to_raw);
        if let Some(p) = &h.provider {
            (*i.fabric_attr).prov_name = dup(p)?;
        }
        if let Some(d) = &h.domain {
            (*i.domain_attr).name = dup(d)?;
        }
    }
    let mut out = ptr::null_mut();
    // SAFETY: hints is a valid fi_info; `out` receives a list owned by the
    // returned InfoList.
    let rc = unsafe { ffi::fi_getinfo(ffi::API_VERSION, ptr::null(), ptr::null(), 0, hints.0, &mut out) };
    check("fi_getinfo", rc)?;
    Ok(InfoList(out))
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

/// Closes the fids it collected, newest first.
struct Fids(Vec<*mut ffi::fid>);

impl Drop for Fids {
    fn drop(&mut self) {
        while let Some(f) = self.0.pop() {
            // SAFETY: each fid was opened by `open_candidate` and is closed
            // once, children before parents.
            let rc = unsafe { ffi::fi_close(f) };
            if rc != 0 {
                log::warn!(
                    "closing a probe object failed: {}",
                    Error::from_rc("fi_close", rc.into())
                );
            }
        }
    }
}

/// Open `info` for real, then close everything. The error names the step.
/// `entry` indexes `list` (see [`InfoList::position`]).
pub(crate) fn open_candidate(
    list: &InfoList,
    entry: usize,
    sizes: ProbeSizes,
    want_atomics: bool,
) -> Result<ProbeResult> {
    let info = list.nth(entry);
    if info.is_null() {
        return Err(Error::NoData { call: "fi_getinfo" });
    }
    let mut fids = Fids(Vec::new());
    let mut result = ProbeResult::default();
    // SAFETY: `info` is the head of a live list; every object is opened from
    // a live parent and pushed to `fids`, which closes them in reverse order
    // on every return path. Attribute structs live on this frame only for
    // the calls that read them.
    unsafe {
        let mut fabric = ptr::null_mut();
        check(
            "fi_fabric",
            ffi::fi_fabric((*info).fabric_attr, &mut fabric, ptr::null_mut()),
        )?;
        fids.0.push(&mut (*fabric).fid);

        let mut domain = ptr::null_mut();
        check(
            "fi_domain",
            ffi::fi_domain(fabric, info, &mut domain, ptr::null_mut()),
        )?;
        fids.0.push(&mut (*domain).fid);

        // Prefer a CQ with a wait fd (for blocking waits); fall back to none.
        let mut cq = ptr::null_mut();
        let mut attr = ffi::fi_cq_attr {
            size: sizes.cq,
            // verbs' own CQs have no tagged format (FI_ENOSYS).
            format: if (*info).caps & ffi::FI_TAGGED as u64 != 0 {
                ffi::FI_CQ_FORMAT_TAGGED
            } else {
                ffi::FI_CQ_FORMAT_DATA
            },
            wait_obj: ffi::FI_WAIT_FD,
            ..Default::default()
        };
        if ffi::fi_cq_open(domain, &mut attr, &mut cq, ptr::null_mut()) == 0 {
            result.wait_fd = true;
        } else {
            attr.wait_obj = ffi::FI_WAIT_NONE;
            check(
                "fi_cq_open",
                ffi::fi_cq_open(domain, &mut attr, &mut cq, ptr::null_mut()),
            )?;
        }
        fids.0.push(&mut (*cq).fid);

        // Objects an endpoint binds to are opened first, so that the endpoint,
        // pushed last, is closed first.
        let bind_flags = u64::from(ffi::FI_TRANSMIT | ffi::FI_RECV);
        if (*(*info).ep_attr).type_ == ffi::FI_EP_MSG {
            // What a MSG server opens: an EQ and a passive endpoint. (An
            // active verbs endpoint needs a peer address or a connection
            // request; the connector opens those.)
            let mut eq = ptr::null_mut();
            let mut eq_attr = ffi::fi_eq_attr {
                size: 16,
                wait_obj: ffi::FI_WAIT_UNSPEC,
                ..Default::default()
            };
            check(
                "fi_eq_open",
                ffi::fi_eq_open(fabric, &mut eq_attr, &mut eq, ptr::null_mut()),
            )?;
            fids.0.push(&mut (*eq).fid);
            let mut pep = ptr::null_mut();
            check(
                "fi_passive_ep",
                ffi::fi_passive_ep(fabric, info, &mut pep, ptr::null_mut()),
            )?;
            fids.0.push(&mut (*pep).fid);
            check("fi_pep_bind(eq)", ffi::fi_pep_bind(pep, &mut (*eq).fid, 0))?;
            if want_atomics {
                result.atomics = connected_atomics(domain, info, &mut fids);
            }
        } else {
            let mut av = ptr::null_mut();
            let mut av_attr = ffi::fi_av_attr {
                type_: ffi::FI_AV_UNSPEC,
                count: sizes.av,
                ..Default::default()
            };
            check(
                "fi_av_open",
                ffi::fi_av_open(domain, &mut av_attr, &mut av, ptr::null_mut()),
            )?;
            fids.0.push(&mut (*av).fid);
            let mut ep = ptr::null_mut();
            check(
                "fi_endpoint",
                ffi::fi_endpoint(domain, info, &mut ep, ptr::null_mut()),
            )?;
            fids.0.push(&mut (*ep).fid);
            check("fi_ep_bind(cq)", ffi::fi_ep_bind(ep, &mut (*cq).fid, bind_flags))?;
            check("fi_ep_bind(av)", ffi::fi_ep_bind(ep, &mut (*av).fid, 0))?;
            let mut rc = ffi::fi_enable(ep);
            if rc == -(ffi::FI_EBUSY as i32) {
                // A region of this endpoint's name exists: stale, if shm
                // named it for our pid (see `remove_stale_shm_region`).
                let mut name = [0u8; 256];
                let mut len = name.len();
                if ffi::fi_getname(&mut (*ep).fid, name.as_mut_ptr().cast(), &mut len) == 0
                    && remove_stale_shm_region(&name[..len.min(name.len())])
                {
                    rc = ffi::fi_enable(ep);
                }
            }
            check("fi_enable", rc)?;
            if want_atomics {
                result.atomics = valid_atomics(ep);
            }
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
///
/// The endpoint joins `fids`, to be closed with the rest.
///
/// # Safety
/// `domain` must be an open domain of `info`.
unsafe fn connected_atomics(
    domain: *mut ffi::fid_domain,
    info: *mut ffi::fi_info,
    fids: &mut Fids,
) -> Vec<AtomicSupport> {
    // SAFETY: info is live (the caller's promise); fi_dupinfo copies it,
    // and the copy is freed below, once.
    let dup = unsafe { ffi::fi_dupinfo(info) };
    if dup.is_null() {
        return Vec::new();
    }
    let mut ep = ptr::null_mut();
    // SAFETY: dup is our copy; its dest_addr gets malloc'd memory holding
    // src_addrlen bytes, which fi_freeinfo frees with it.
    let rc = unsafe {
        let (src, len) = ((*dup).src_addr, (*dup).src_addrlen);
        if !src.is_null() && len > 0 && (*dup).dest_addr.is_null() {
            let dest = libc::malloc(len);
            if !dest.is_null() {
                ptr::copy_nonoverlapping(src.cast::<u8>(), dest.cast::<u8>(), len);
                (*dup).dest_addr = dest;
                (*dup).dest_addrlen = len;
            }
        }
        ffi::fi_endpoint(domain, dup, &mut ep, ptr::null_mut())
    };
    // SAFETY: the endpoint keeps its own copy of what it needs.
    unsafe { ffi::fi_freeinfo(dup) };
    if rc != 0 {
        log::debug!(
            "no connected endpoint to ask for atomics: {}",
            Error::from_rc("fi_endpoint", rc.into())
        );
        return Vec::new();
    }
    // SAFETY: ep was just opened; `fids` closes it once, before the domain.
    unsafe {
        fids.0.push(&mut (*ep).fid);
        valid_atomics(ep)
    }
}

/// Which u64 atomics the endpoint accepts.
///
/// # Safety
/// `ep` must be an open endpoint (enabled, except on connected endpoints,
/// whose atomics verbs validates on the domain).
unsafe fn valid_atomics(ep: *mut ffi::fid_ep) -> Vec<AtomicSupport> {
    let mut out = Vec::new();
    for &(name, op) in ATOMIC_OPS {
        let mut count = 0usize;
        let cmp = matches!(op, ffi::FI_CSWAP | ffi::FI_CSWAP_NE | ffi::FI_MSWAP);
        let kinds: &[&str] = if cmp { &["compare"] } else { &["atomic", "fetch"] };
        for &kind in kinds {
            // SAFETY: ep is open (the caller's promise); count is a valid out-pointer.
            let rc = unsafe {
                match kind {
                    "atomic" => ffi::fi_atomicvalid(ep, ffi::FI_UINT64, op, &mut count),
                    "fetch" => ffi::fi_fetch_atomicvalid(ep, ffi::FI_UINT64, op, &mut count),
                    _ => ffi::fi_compare_atomicvalid(ep, ffi::FI_UINT64, op, &mut count),
                }
            };
            if rc == 0 && count > 0 {
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
