//! The tools' integration tests, as one test binary: each file beside this
//! one is a module of it (`mod world;` finds `world.rs`), so each keeps its
//! place and its name: a test is `world_local::a_rank_killed_…`, filtered
//! by any part of that name (`cargo test -p fabric-msg-examples --test
//! examples -- world_local::`). One binary instead of one per file saves a
//! link and a copy of the monomorphised library code per file, in each of
//! CI's builds (docs/decisions.md, "CI's time", 2026-11-30), as
//! fabric-msg's `tests/integration.rs` does.
//!
//! Every test here runs whole programs as child processes (`mpirun`,
//! `srun`, the rendezvous, the tools themselves), none sets a variable of
//! its own process or counts its allocations, so they share one process;
//! the Slurm cluster (`support::slurm`) is started once for all.
//! A filter is a substring: `tools::` also selects `async_tools::`, and
//! `world::` `async_world::` (`--skip` leaves them out; ci/asan.sh and
//! ci/libfabric2.sh run their subsets so). `ci/check-layers.py` fails when
//! a file in tests/ is in no test binary.

mod support;

mod async_tools;
mod async_world;
mod atomics;
mod collectives;
mod departures;
mod fabric_info;
mod forgery;
mod loss_bench;
mod model;
mod node_pingpong;
mod percentiles;
mod rma_pingpong;
mod shm_stale_region;
mod short_recv;
mod slurm;
mod symmetric;
mod tools;
mod twins;
mod waits;
mod world;
mod world_local;
mod world_soak;
