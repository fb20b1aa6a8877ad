//! Shared code of fabric-msg's example tools: the options `pingpong` and
//! `bandwidth` have in common, their output (fabtests' columns or JSON
//! Lines), the byte pattern `--verify` checks, and the session around each
//! tool's measuring loop.
#![deny(missing_docs)]

pub mod opts;
pub mod output;
pub mod pattern;
pub mod session;
