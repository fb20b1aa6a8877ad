//! fabric-msg: messaging over libfabric for HPC-style Rust applications.
//!
//! The framework is being built up issue by issue; today it re-exports the
//! raw bindings as [`ffi`], the escape hatch it will keep offering.

#![deny(missing_docs)]

pub use libfabric_sys as ffi;
