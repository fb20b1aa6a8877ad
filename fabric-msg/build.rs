//! Tells the crate which libfabric API its bindings were generated from.
//!
//! `libfabric-sys` (`links = "fabric"`) reports the header version it read
//! as `DEP_FABRIC_VERSION_MAJOR`/`_MINOR`. From 2.0 some fields and flags of
//! 1.x are gone or renamed (`fi_domain_attr.data_progress` became one
//! `progress` shared with control operations; `FI_LOCAL_MR`,
//! `FI_BUFFERED_RECV`, ... were retired), so code that names them is
//! compiled under `cfg(libfabric_v2)` or `cfg(not(libfabric_v2))`. Behaviour
//! that depends on the library actually loaded is decided at run time from
//! `fi_version()` instead.

fn main() {
    println!("cargo:rustc-check-cfg=cfg(libfabric_v2)");
    println!("cargo:rerun-if-env-changed=DEP_FABRIC_VERSION_MAJOR");
    let major: u32 = std::env::var("DEP_FABRIC_VERSION_MAJOR")
        .ok()
        .and_then(|v| v.parse().ok())
        .expect("libfabric-sys reports the header version (DEP_FABRIC_VERSION_MAJOR)");
    if major >= 2 {
        println!("cargo:rustc-cfg=libfabric_v2");
    }
}
