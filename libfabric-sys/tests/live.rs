//! Calls into the real libfabric on the software providers every Linux host
//! has (tcp). These prove that the bindings link, that the C shims for the
//! `static inline` API work on live objects, and that the version plumbing is
//! right. bindgen's layout checks for every struct are compile-time
//! assertions inside the generated bindings, so building this crate runs them.

use libfabric_sys as ffi;
use std::ffi::{CStr, CString};
use std::ptr;

/// Owns an `fi_info` list for the duration of a test.
struct InfoList(*mut ffi::fi_info);

impl Drop for InfoList {
    fn drop(&mut self) {
        // SAFETY: the pointer came from fi_getinfo or fi_allocinfo and is freed once.
        unsafe { ffi::fi_freeinfo(self.0) }
    }
}

impl InfoList {
    fn iter(&self) -> impl Iterator<Item = &ffi::fi_info> {
        // SAFETY: each node of a list from fi_getinfo is valid until fi_freeinfo.
        std::iter::successors(unsafe { self.0.as_ref() }, |i| unsafe { i.next.as_ref() })
    }
}

fn prov_name(info: &ffi::fi_info) -> String {
    // SAFETY: fi_getinfo fills fabric_attr and its prov_name with a C string.
    unsafe { CStr::from_ptr((*info.fabric_attr).prov_name) }
        .to_string_lossy()
        .into_owned()
}

/// `fi_getinfo` for reliable messaging over `prov`, with real hints.
fn getinfo(prov: &str, ep_type: ffi::fi_ep_type) -> Result<InfoList, i32> {
    // SAFETY: fi_allocinfo returns a zeroed fi_info with its attribute structs allocated.
    let hints = InfoList(unsafe { ffi::fi_allocinfo() });
    assert!(!hints.0.is_null(), "fi_allocinfo returned NULL");
    let name = CString::new(prov).unwrap();
    // SAFETY: hints and its sub-structs were allocated by fi_allocinfo; prov_name
    // must be heap memory that fi_freeinfo can free, hence strdup.
    unsafe {
        (*hints.0).caps = u64::from(ffi::FI_MSG);
        (*(*hints.0).ep_attr).type_ = ep_type;
        (*(*hints.0).fabric_attr).prov_name = libc::strdup(name.as_ptr());
    }
    let mut out = ptr::null_mut();
    // SAFETY: hints is a valid fi_info; out receives a list we free in InfoList.
    let rc = unsafe { ffi::fi_getinfo(ffi::API_VERSION, ptr::null(), ptr::null(), 0, hints.0, &mut out) };
    if rc != 0 {
        return Err(rc);
    }
    Ok(InfoList(out))
}

#[test]
fn header_and_runtime_versions_are_at_least_1_17() {
    let (major, minor) = ffi::runtime_version();
    assert!(
        (major, minor) >= (1, 17),
        "runtime libfabric {major}.{minor} is older than 1.17"
    );
    assert_eq!(ffi::fi_version_major(ffi::API_VERSION), ffi::HEADER_VERSION.0);
    assert_eq!(ffi::fi_version_minor(ffi::API_VERSION), ffi::HEADER_VERSION.1);
}

#[test]
fn getinfo_finds_the_tcp_provider() {
    let list = getinfo("tcp", ffi::FI_EP_MSG).expect("fi_getinfo for tcp MSG endpoints failed");
    let names: Vec<String> = list.iter().map(prov_name).collect();
    assert!(!names.is_empty(), "fi_getinfo returned an empty list for tcp");
    assert!(names.iter().all(|n| n == "tcp"), "asked for tcp, got {names:?}");
    for info in list.iter() {
        // SAFETY: ep_attr is filled in by fi_getinfo.
        let ep = unsafe { &*info.ep_attr };
        assert_eq!(ep.type_, ffi::FI_EP_MSG);
        assert!(
            info.caps & u64::from(ffi::FI_MSG) != 0,
            "granted caps lack FI_MSG"
        );
    }
}

#[test]
fn getinfo_for_an_absent_provider_is_enodata() {
    let rc = getinfo("no-such-provider", ffi::FI_EP_RDM).err();
    assert_eq!(rc, Some(-(ffi::FI_ENODATA as i32)));
    // SAFETY: fi_strerror returns a static string for any code.
    let text = unsafe { CStr::from_ptr(ffi::fi_strerror(ffi::FI_ENODATA as i32)) };
    assert!(!text.to_bytes().is_empty());
}

#[test]
fn static_inline_wrappers_work_on_live_tcp_objects() {
    let list = getinfo("tcp", ffi::FI_EP_MSG).expect("fi_getinfo tcp");
    let info = list.0;

    let mut fabric = ptr::null_mut();
    let mut domain = ptr::null_mut();
    let mut cq = ptr::null_mut();
    // SAFETY: each object is opened from its valid parent and closed below,
    // children first; the attribute structs live on this stack frame only for
    // the duration of the calls that read them.
    unsafe {
        assert_eq!(
            ffi::fi_fabric((*info).fabric_attr, &mut fabric, ptr::null_mut()),
            0,
            "fi_fabric"
        );
        // fi_domain is a static inline: this goes through a generated shim.
        assert_eq!(
            ffi::fi_domain(fabric, info, &mut domain, ptr::null_mut()),
            0,
            "fi_domain"
        );

        let mut attr = ffi::fi_cq_attr {
            size: 64,
            format: ffi::FI_CQ_FORMAT_TAGGED,
            wait_obj: ffi::FI_WAIT_NONE,
            ..Default::default()
        };
        assert_eq!(
            ffi::fi_cq_open(domain, &mut attr, &mut cq, ptr::null_mut()),
            0,
            "fi_cq_open"
        );

        let mut entry = ffi::fi_cq_tagged_entry::default();
        let rc = ffi::fi_cq_read(cq, (&mut entry as *mut ffi::fi_cq_tagged_entry).cast(), 1);
        assert_eq!(rc, -(ffi::FI_EAGAIN as isize), "fi_cq_read on an empty CQ");

        assert_eq!(ffi::fi_close(&mut (*cq).fid), 0, "fi_close(cq)");
        assert_eq!(ffi::fi_close(&mut (*domain).fid), 0, "fi_close(domain)");
        assert_eq!(ffi::fi_close(&mut (*fabric).fid), 0, "fi_close(fabric)");
    }
}
