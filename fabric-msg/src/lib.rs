//! fabric-msg: messaging over libfabric for HPC-style Rust applications.
//!
//! One binary runs unchanged on InfiniBand, RoCE, iWARP and TCP: at start-up
//! fabric-msg asks libfabric which fabrics the host has, picks the best one
//! that grants what the application needs, and reports what it got and why
//! every other choice was passed over.
//!
//! # Two ways in
//!
//! - [`World`]: one program started N times (`mpirun`, `srun --mpi=pmix`,
//!   the rendezvous variables, or alone), every rank wired to every other
//!   on the fabric they agree on, with point-to-point messages,
//!   collectives ([`World::allreduce`], ...), symmetric memory and
//!   one-sided operations. Start here for SPMD programs:
//!
//! ```no_run
//! use fabric_msg::{Op, World};
//!
//! let mut world = World::init()?;
//! let mut sum = [world.rank() as f64];
//! world.allreduce(&mut sum, Op::Sum)?;
//! println!("rank {} of {}: {}", world.rank(), world.size(), sum[0]);
//! world.finish()?;
//! # Ok::<(), fabric_msg::Error>(())
//! ```
//!
//! - [`EventLoop`]: one completion queue with the endpoints, peers and
//!   operations the application sets up itself, for clients and servers
//!   and anything that is not SPMD (the World runs on one too):
//!
//! ```no_run
//! use fabric_msg::{connect, negotiate, Buffer, EventLoop, LadderConfig, LoopConfig, RecvOpts, Requirements,
//!                  SendOpts, Token};
//! use std::time::Duration;
//!
//! let ladder = LadderConfig::load(None)?; // providers.toml, or the built-in default
//! let found = negotiate(&Requirements::default(), &ladder)?;
//! println!("using {} ({}) on {}", found.profile.provider, found.profile.fabric_kind, found.profile.domain);
//! for why in &found.rejections {
//!     println!("  passed over {why}");
//! }
//!
//! let mut ev = EventLoop::new(&found.profile, LoopConfig::default())?;
//! let ep = ev.open_endpoint()?;
//! let peer = connect(&mut ev, ep, "server.example:9228", Duration::from_secs(10))?;
//! ev.recv(peer.endpoint(), Buffer::new(4096), RecvOpts { tag: Some((7, 0)), from: None }, Token(1))?;
//! ev.send(&peer, Buffer::from_slice(b"hello"), SendOpts { tag: Some(7), data: None }, Token(2))?;
//! let mut done = Vec::new();
//! ev.poll(&mut done, Some(Duration::from_secs(5)))?;
//! # Ok::<(), fabric_msg::Error>(())
//! ```
//!
//! One-sided operations use memory registered with
//! [`EventLoop::register`]: the [`MemoryRegion`] owns its memory and hides
//! the provider's `mr_mode`; its [`RemoteMemory`] is what a peer needs to
//! [`read`](EventLoop::read), [`write`](EventLoop::write),
//! [`write_data`](EventLoop::write_data) or run an [`Atomic`] on it, checked
//! for bounds and access before anything is posted (see [`memory::mr`] and [`transport::event_loop::rma`]).
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
//! Candidates are classified by [`classify()`](discovery::classify::classify) from what libfabric reports and,
//! for verbs devices, from sysfs. The result is a [`Profile`]: the granted
//! sizes, modes and limits the rest of the framework obeys, of which the
//! [`WireProfile`](discovery::profile::WireProfile) part is compared with each peer's ([`check_peer`](discovery::profile::check_peer)).
//!
//! Before libfabric starts, fabric-msg sets `FI_UNIVERSE_SIZE` (unless the
//! user has) so that `ofi_rxm`'s completion queue fits every RDMA device's
//! `max_cqe`, and applies per-provider tunables from the ladder. libfabric
//! reads its environment once per process, so negotiate before any other
//! libfabric use.
//!
//! # Thread safety
//!
//! Negotiation may run on any thread; its results are plain data. An
//! [`EventLoop`] is `Send`, not `Sync`: one thread drives it at a time
//! (`&mut self`), which satisfies every libfabric threading level.
//! Completions and buffers are `Send` and can be consumed elsewhere. A loop
//! opened with [`LoopConfig::progress_thread`] adds one thread of its own
//! that drives the provider's progress while the loop does not poll; it
//! needs a domain at `FI_THREAD_SAFE` and takes no completion.
//!
//! # Resource cleanup
//!
//! Every libfabric object has one owner that closes it, holding its parents
//! alive: endpoints close before the CQ, AV and EQ they are bound to, those
//! before the domain, the domain before the fabric. Dropping an
//! [`EventLoop`] with operations in flight closes its endpoints first, then
//! frees the operations' buffers and registrations. `Drop` never panics:
//! close errors are logged. Negotiation's trial objects are closed before
//! [`negotiate()`] returns.

#![deny(missing_docs)]
// bindgen gives each libfabric flag macro the narrowest type that holds its
// value (FI_MSG is u32, FI_SOURCE is u64). `as u64` normalises them, and must
// keep compiling when a header version moves a flag across that line.
#![allow(clippy::unnecessary_cast)]

pub use libfabric_sys as ffi;

#[cfg(feature = "tokio")]
pub mod async_loop;
pub mod discovery;
pub mod error;
#[doc(hidden)]
pub mod fuzzing;
pub(crate) mod libfabric;
pub mod memory;
pub mod transport;
pub mod world;

// The root holds what applications name; what only tools and tests need
// (classification, probing, the wire profile, protection) stays in its
// layer's module: `fabric_msg::discovery::…`.
pub use discovery::atomic::{AtomicKind, AtomicPolicy};
pub use discovery::classify::FabricKind;
pub use discovery::config::LadderConfig;
pub use discovery::info::EndpointType;
pub use discovery::negotiate::{negotiate, Capability, EndpointChoice, Negotiation, Requirements};
pub use discovery::profile::Profile;
pub use error::{Error, Reason, Rejection, Result};
pub use memory::access::Access;
pub use memory::buffer::Buffer;
pub use memory::mr::{Local, MemoryRegion};
pub use memory::pool::{PoolSlot, RegionPool};
pub use memory::remote::RemoteMemory;
pub use transport::bootstrap::{connect, connect_with, Accepted, Listener, Refusal};
pub use transport::event_loop::rma::Atomic;
pub use transport::event_loop::{
    AtomicCounters, Completion, CompletionError, EndpointId, EventLoop, LoopConfig, LoopStats, OpKind, Peer,
    PeerStats, PostError, ProgressThread, RecvOpts, SendOpts, SleepCheck, Token, Traffic, WaitMode,
};
pub use transport::liveness::{LossAlarm, LossKind, LostPeer};
pub use world::collectives::{CombineFn, Element, Op, Reduction};
pub use world::symmetric::Symmetric;
pub use world::{
    Comm, CommView, Envelope, Matched, NodePart, NodeSharing, Persistent, RankStats, Record, Request, Status,
    World, WorldConfig, WorldStats,
};

/// What most programs name, in one import: `use fabric_msg::prelude::*;`.
///
/// The World and its collectives for SPMD programs; the event loop, its
/// messages and one-sided operations for the rest; errors for both.
pub mod prelude {
    pub use crate::{
        connect, negotiate, Access, Atomic, Buffer, Completion, CompletionError, EndpointId, Error,
        EventLoop, LadderConfig, Listener, LoopConfig, MemoryRegion, Op, OpKind, Peer, Record, RecvOpts,
        Reduction, RemoteMemory, Request, Requirements, Result, SendOpts, Symmetric, Token, World,
        WorldConfig,
    };
}
