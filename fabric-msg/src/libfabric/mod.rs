//! The libfabric objects, each owned by one Rust value: the lowest layer,
//! and the only place (besides `error`'s `fi_strerror`) that calls
//! libfabric.
//!
//! | object | type | file |
//! |---|---|---|
//! | `fi_info` lists and copies | [`InfoList`], [`Info`], [`InfoRef`] | `info.rs` |
//! | fabric, domain, address vector | [`Fabric`], [`Domain`], [`Av`] | `fabric.rs` |
//! | completion queue | [`Cq`] | `cq.rs` |
//! | event queue (connection management) | [`Eq`] | `eq.rs` |
//! | endpoint, passive endpoint | [`Endpoint`], [`PassiveEndpoint`] | `endpoint.rs` |
//! | the data path on an endpoint | [`RawEndpoint`] | `post.rs` |
//! | memory registration | [`Mr`] | `mr.rs` |
//!
//! Each owner closes its object on drop and holds an `Arc` to every object
//! it was opened from or bound to (domain to fabric; CQ, AV and EQ to
//! domain; an endpoint to its domain and to the CQ, AV or EQ it is bound
//! to), so close order follows from drop order: libfabric's `-FI_EBUSY`
//! ("a child is still open") cannot happen. This is rust-ibverbs' and
//! pyverbs' shape.
//!
//! Opening, binding and naming are safe methods. Posting is not: an
//! operation's memory and context must outlive it, which only the caller
//! (the event loop's operation slots) can promise, so the data path is
//! `unsafe fn`s on [`RawEndpoint`], a copyable handle to an open endpoint,
//! each with its `# Safety`. They are `#[inline]` and add no instruction to
//! the hot path (`ci/bench/hotpath.sh`).
//!
//! Discovery's trial opens (`discovery/probe.rs`) use the same types as the
//! loop.

mod cq;
mod endpoint;
mod eq;
mod fabric;
mod info;
mod mr;
mod post;

pub(crate) use cq::{Cq, CqEntries, CqError, CqProgress, CQ_BATCH};
pub(crate) use endpoint::{Endpoint, PassiveEndpoint};
pub(crate) use eq::{CmEvent, Eq};
pub(crate) use fabric::{Av, Domain, Fabric};
pub(crate) use info::{getinfo, Hints, Info, InfoList, InfoRef};
pub(crate) use mr::Mr;
pub(crate) use post::RawEndpoint;

#[cfg(test)]
mod tests;
