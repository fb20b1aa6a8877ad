//! Shared helpers for fabric-msg's example tools.
#![deny(missing_docs)]
