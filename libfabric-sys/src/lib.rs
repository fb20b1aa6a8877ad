//! Raw FFI bindings to the system [libfabric](https://ofiwg.github.io/libfabric/).
//!
//! Generated at build time by bindgen from the headers of the libfabric that
//! is installed (found through `LIBFABRIC_DIR`, `LIBFABRIC_INCLUDE_DIR` +
//! `LIBFABRIC_LIB_DIR`, or pkg-config; 1.17 or newer). libfabric's data path
//! (`fi_send`, `fi_tsend`, `fi_read`, `fi_cq_read`, `fi_close`, ...) is
//! `static inline` in its headers; those functions are bound through C shims
//! that bindgen writes and this crate compiles, so they keep the exact
//! signatures of the headers in use.
//!
//! Everything here is `unsafe` and mirrors the C API one to one. The safe
//! framework is the `fabric-msg` crate, which re-exports this crate as `ffi`.
//!
//! `iovec`, `sockaddr` and `timespec` are libc's own types.

#![allow(non_upper_case_globals, non_camel_case_types, non_snake_case)]
#![allow(missing_debug_implementations, missing_docs)]
#![allow(clippy::all, clippy::undocumented_unsafe_blocks, clippy::missing_safety_doc)]
#![allow(unsafe_op_in_unsafe_fn)]

pub use libc::{iovec, sockaddr, timespec};

include!(concat!(env!("OUT_DIR"), "/bindings.rs"));

/// `FI_ADDR_UNSPEC`: `((uint64_t) -1)` in fabric.h, a cast bindgen's macro
/// evaluator does not follow.
pub const FI_ADDR_UNSPEC: fi_addr_t = u64::MAX;
/// `FI_ADDR_NOTAVAIL`: `((uint64_t) -1)` in fabric.h.
pub const FI_ADDR_NOTAVAIL: fi_addr_t = u64::MAX;

/// Encode an API version the way the C macro `FI_VERSION(major, minor)` does.
pub const fn fi_version_make(major: u32, minor: u32) -> u32 {
    (major << 16) | minor
}

/// Major part of a version made by [`fi_version_make`] (`FI_MAJOR(v)`).
pub const fn fi_version_major(version: u32) -> u32 {
    version >> 16
}

/// Minor part of a version made by [`fi_version_make`] (`FI_MINOR(v)`).
pub const fn fi_version_minor(version: u32) -> u32 {
    version & 0xffff
}

/// The libfabric header version this crate was compiled against.
pub const HEADER_VERSION: (u32, u32) = (FI_MAJOR_VERSION, FI_MINOR_VERSION);

/// The API version to hand to `fi_getinfo`: the compiled headers' version.
/// The build refuses headers older than 1.17, so this is never below it.
pub const API_VERSION: u32 = fi_version_make(FI_MAJOR_VERSION, FI_MINOR_VERSION);

/// The oldest libfabric API fabric-msg supports.
pub const MIN_API_VERSION: u32 = fi_version_make(1, 17);

// build.rs refuses older headers; this states the promise in the code too.
const _: () = assert!(API_VERSION >= MIN_API_VERSION);

/// The version of the libfabric library loaded at run time, as
/// `(major, minor)`. It may be newer than [`HEADER_VERSION`].
pub fn runtime_version() -> (u32, u32) {
    // SAFETY: fi_version takes no arguments and only returns a constant.
    let v = unsafe { fi_version() };
    (fi_version_major(v), fi_version_minor(v))
}
