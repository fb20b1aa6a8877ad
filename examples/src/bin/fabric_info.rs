//! Lists the libfabric providers this host offers (placeholder until the
//! negotiation layer lands and this tool shows the full decision).

use fabric_msg::ffi;
use std::ffi::CStr;
use std::ptr;

fn main() {
    let mut list = ptr::null_mut();
    // SAFETY: NULL hints ask for everything; the list is freed below.
    let rc = unsafe {
        ffi::fi_getinfo(
            ffi::API_VERSION,
            ptr::null(),
            ptr::null(),
            0,
            ptr::null(),
            &mut list,
        )
    };
    if rc != 0 {
        // SAFETY: fi_strerror returns a static string.
        let text = unsafe { CStr::from_ptr(ffi::fi_strerror(-rc)) };
        eprintln!("fabric_info: fi_getinfo failed: {}", text.to_string_lossy());
        std::process::exit(1);
    }
    let (major, minor) = ffi::runtime_version();
    println!(
        "libfabric {major}.{minor} (headers {}.{})",
        ffi::HEADER_VERSION.0,
        ffi::HEADER_VERSION.1
    );
    let mut seen = Vec::new();
    let mut cur = list;
    while !cur.is_null() {
        // SAFETY: cur is a node of the list fi_getinfo returned.
        let info = unsafe { &*cur };
        // SAFETY: fabric_attr, domain_attr and their names are filled by fi_getinfo.
        let (prov, domain) = unsafe {
            (
                CStr::from_ptr((*info.fabric_attr).prov_name)
                    .to_string_lossy()
                    .into_owned(),
                CStr::from_ptr((*info.domain_attr).name)
                    .to_string_lossy()
                    .into_owned(),
            )
        };
        if !seen.contains(&(prov.clone(), domain.clone())) {
            println!("provider: {prov:<16} domain: {domain}");
            seen.push((prov, domain));
        }
        cur = info.next;
    }
    // SAFETY: list came from fi_getinfo and is freed once.
    unsafe { ffi::fi_freeinfo(list) };
}
