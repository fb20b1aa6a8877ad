//! fabric-msg's integration tests, as one test binary: each file beside
//! this one is a module of it (a crate root finds `mod rma;` in `rma.rs`
//! beside it, so each file keeps its place and its name: a test is `rma::rma_write_with_data_on_tcp_rxm`, filtered as
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

mod async_loop;
mod async_multi_recv;
mod async_one_sided;
mod atomics_everywhere;
mod cancel;
mod connections;
mod fixtures;
mod flow_control;
mod forged_atomics;
mod forged_keys;
mod hostile_names;
mod idle_target;
mod listener;
mod messaging;
mod msg_endpoints;
mod negotiate_live;
mod peek;
mod peer_loss;
mod processes;
mod progress_receives;
mod rma;
mod rma_load;
mod stats;
mod tag_masks;
mod truncation;
mod wait_fd;
