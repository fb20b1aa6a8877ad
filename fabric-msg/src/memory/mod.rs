//! Memory: the opened domain, and the memory the NIC may touch in it.
//!
//! Lives here: the domain every other object is opened under and registers
//! into (`domain` — libfabric's protection domain, owned in `libfabric/`, with
//! the `fi_info`, profile and key space beside it), the
//! message [`Buffer`](crate::Buffer) with its lazily registered local
//! descriptor (`buffer`), the remote keys fabric-msg draws where the
//! provider lets it (`keys`), and registered regions, remote descriptors and
//! pools ([`mr`]): how each `mr_mode` bit is honoured, and what a peer may
//! reach.
//!
//! May use: [`crate::discovery`] (the granted [`Profile`](crate::Profile)
//! and the mode bits negotiation declared) and [`crate::error`]. Must not
//! use: the transport layer. Operations that move data to or from this
//! memory live in [`crate::transport`]; they hold an `Arc` of what they
//! touch until their completion, so memory never goes away under the NIC.

pub mod access;
pub(crate) mod buffer;
pub(crate) mod copy;
pub(crate) mod domain;
pub(crate) mod keys;
pub(crate) mod lease;
pub mod mr;
pub mod pool;
pub mod remote;
