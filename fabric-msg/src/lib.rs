//! fabric-msg: messaging over libfabric for HPC-style Rust applications.
//!
//! One binary runs unchanged on InfiniBand, RoCE, iWARP and TCP: at start-up
//! fabric-msg asks libfabric which fabrics the host has, picks the best one
//! that grants what the application needs, and reports what it got and why
//! every other choice was passed over.
//!
//! # Quick start
//!
//! ```no_run
//! use fabric_msg::{negotiate, LadderConfig, Requirements};
//!
//! let ladder = LadderConfig::load(None)?; // providers.toml, or the built-in default
//! let found = negotiate(&Requirements::default(), &ladder)?;
//! println!("using {} ({}) on {}", found.profile.provider, found.profile.fabric_kind, found.profile.domain);
//! for why in &found.rejections {
//!     println!("  passed over {why}");
//! }
//! # Ok::<(), fabric_msg::Error>(())
//! ```
//!
//! # Library dependency
//!
//! libfabric 1.17 or newer, found at build time by the `libfabric-sys` crate
//! through `LIBFABRIC_DIR`, `LIBFABRIC_INCLUDE_DIR` + `LIBFABRIC_LIB_DIR`, or
//! pkg-config (Debian/Ubuntu: `apt-get install libfabric-dev`). The raw
//! bindings are re-exported as [`ffi`], the escape hatch.
//!
//! # Provider selection
//!
//! The ladder in `providers.toml` (compiled in; `FABRIC_MSG_PROVIDERS` names
//! another file) lists fabric kinds and providers in order of preference:
//! InfiniBand, RoCE, iWARP through `verbs`, then TCP (`net`, `tcp;ofi_rxm`,
//! `tcp`), UDP, and `sockets` last; `shm` when the application says every
//! peer is on this host. `FI_PROVIDER`, when set, is honoured and wins.
//! Candidates are classified by [`classify()`] from what libfabric reports and,
//! for verbs devices, from sysfs. The result is a [`Profile`]: the granted
//! sizes, modes and limits the rest of the framework obeys, of which the
//! [`WireProfile`] part is compared with each peer's ([`check_peer`]).
//!
//! Before libfabric starts, fabric-msg sets `FI_UNIVERSE_SIZE` (unless the
//! user has) so that `ofi_rxm`'s completion queue fits every RDMA device's
//! `max_cqe`, and applies per-provider tunables from the ladder. libfabric
//! reads its environment once per process, so negotiate before any other
//! libfabric use.
//!
//! # Thread safety
//!
//! Negotiation may run on any thread; its results are plain data
//! (`Send + Sync`).
//!
//! # Resource cleanup
//!
//! Negotiation opens every candidate it tries (fabric, domain, CQ, AV or EQ,
//! endpoint) to prove it works, and closes them, children first, before it
//! returns.

#![deny(missing_docs)]
// bindgen gives each libfabric flag macro the narrowest type that holds its
// value (FI_MSG is u32, FI_SOURCE is u64). `as u64` normalises them, and must
// keep compiling when a header version moves a flag across that line.
#![allow(clippy::unnecessary_cast)]

pub use libfabric_sys as ffi;

pub mod bootstrap;
mod buffer;
pub mod classify;
mod cm;
pub mod config;
mod domain;
pub mod error;
pub mod event_loop;
pub mod info;
pub mod negotiate;
mod probe;
pub mod profile;
pub mod verbs_limits;

pub use bootstrap::{connect, connect_with, Listener};
pub use buffer::Buffer;
pub use classify::{classify, Classification, FabricKind};
pub use config::LadderConfig;
pub use error::{Error, Result};
pub use event_loop::{
    Completion, CompletionError, EndpointId, EventLoop, LoopConfig, OpKind, Peer, PostError, RecvOpts,
    SendOpts, Token, WaitMode,
};
pub use info::{EndpointType, FabricInfo};
pub use negotiate::{negotiate, Capability, EndpointChoice, Negotiation, Reason, Rejection, Requirements};
pub use probe::AtomicOp;
pub use profile::{check_peer, Profile, WireProfile, PROTOCOL_VERSION};
