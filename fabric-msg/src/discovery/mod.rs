//! Discovery: what libfabric reports on this host, and which fabric we choose.
//!
//! Lives here: reading `fi_info` ([`info`], with flag names per libfabric
//! series in [`bits`]), telling InfiniBand from RoCE,
//! iWARP and TCP ([`classify`], with verbs device limits from sysfs in
//! [`verbs_limits`]), the ladder in `providers.toml` ([`config`]), probing a
//! candidate by opening it (`probe`, with the owned objects of
//! `crate::libfabric`), walking the ladder
//! ([`negotiate`]) and the [`Profile`](profile::Profile) the rest of the
//! framework obeys ([`profile`]), with what guards a peer's one-sided access
//! ([`protection`]).
//!
//! May use: `crate::libfabric`, [`crate::error`] and the raw bindings. Must not use: the memory
//! and transport layers. Nothing here opens an endpoint or moves a byte;
//! trial objects opened while negotiating are closed before
//! [`negotiate()`](negotiate::negotiate) returns, and most of the logic is a
//! pure function of recorded `fi_info` output so it is tested on fixtures
//! from real RDMA hosts.

pub mod atomic;
pub mod bits;
pub mod classify;
pub mod config;
pub(crate) mod filter;
pub mod info;
pub mod info_text;
pub mod negotiate;
pub mod plan;
pub(crate) mod probe;
pub mod profile;
pub mod protection;
pub mod quirks;
pub(crate) mod requirements;
pub mod verbs_limits;
