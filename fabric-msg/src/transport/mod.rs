//! Transport: what moves bytes.
//!
//! Lives here: the [`EventLoop`](event_loop::EventLoop) — endpoints, one
//! completion queue, posting, completions, deadlines and teardown, one file
//! per part under [`event_loop`]; connection management for connected
//! (MSG) endpoints (`event_loop/cm.rs`); one-sided reads, writes and atomics on the loop
//! ([`event_loop::rma`]); and
//! the TCP bootstrap that exchanges endpoint names and profiles
//! ([`bootstrap`]), with the check every name from a peer passes before
//! libfabric reads it (`address`); the length-prefixed frames the
//! bootstrap and the World's rendezvous speak on TCP (`framing`); the
//! bootstrap connection kept as each peer's lifeline, on which its death or
//! stall is noticed, with a map of every part of peer-loss detection
//! ([`liveness`]);
//! the thread that drives a loop's progress while its application does not
//! poll (`progress`); and fabric-msg's own transport between processes on
//! one node, rings in shared memory with no provider in between
//! ([`node`], `docs/onnode.md`).
//!
//! May use: [`crate::memory`], [`crate::discovery`], `crate::libfabric`
//! (the owned libfabric objects), [`crate::error`]. Must
//! not use anything above it. The loop is the single owner of every
//! endpoint, queue and in-flight operation; see `docs/architecture.md` for
//! who closes what, and in which order.

pub(crate) mod address;
pub mod bootstrap;
pub mod event_loop;
pub(crate) mod framing;
pub mod liveness;
pub mod node;
pub(crate) mod progress;
