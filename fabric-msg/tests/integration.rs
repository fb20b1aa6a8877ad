//! fabric-msg's integration tests, as one test binary: each file beside
//! this one is a module of it (`#[path]`, so each keeps its place and its
//! name: a test is `rma::rma_write_with_data_on_tcp_rxm`, filtered as
//! before by any part of its name). One binary instead of one per file
//! saves a link and a copy of the monomorphised library code per file, in
//! each of CI's builds (the host's, ASan's, the libfabric 2.1 root's;
//! docs/decisions.md, "CI's time", 2026-11-30).
//!
//! Files that must be their own process stay their own test (see
//! Cargo.toml): the two that count allocations with a global allocator
//! (`no_alloc`, `async_alloc`), and those CI's scripts run by name (`soak`
//! in the guests, `node_loop` under valgrind, `fuzz_decoders` in
//! ci/fuzz.sh). `ci/check-layers.py` fails when a file in tests/ is in
//! neither place.

mod common;

#[path = "async_loop.rs"]
mod async_loop;
#[path = "atomics_everywhere.rs"]
mod atomics_everywhere;
#[path = "cancel.rs"]
mod cancel;
#[path = "connections.rs"]
mod connections;
#[path = "fixtures.rs"]
mod fixtures;
#[path = "flow_control.rs"]
mod flow_control;
#[path = "forged_atomics.rs"]
mod forged_atomics;
#[path = "forged_keys.rs"]
mod forged_keys;
#[path = "hostile_names.rs"]
mod hostile_names;
#[path = "idle_target.rs"]
mod idle_target;
#[path = "listener.rs"]
mod listener;
#[path = "messaging.rs"]
mod messaging;
#[path = "msg_endpoints.rs"]
mod msg_endpoints;
#[path = "negotiate_live.rs"]
mod negotiate_live;
#[path = "peek.rs"]
mod peek;
#[path = "peer_loss.rs"]
mod peer_loss;
#[path = "processes.rs"]
mod processes;
#[path = "progress_receives.rs"]
mod progress_receives;
#[path = "rma.rs"]
mod rma;
#[path = "rma_load.rs"]
mod rma_load;
#[path = "stats.rs"]
mod stats;
#[path = "tag_masks.rs"]
mod tag_masks;
#[path = "truncation.rs"]
mod truncation;
#[path = "wait_fd.rs"]
mod wait_fd;
