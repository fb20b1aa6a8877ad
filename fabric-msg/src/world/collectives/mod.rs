//! Collectives on the [`World`](crate::World): barrier, broadcast, gather,
//! scatter, allgather, alltoall, reduce, allreduce, reduce-scatter and
//! scan over slices of the primitive numeric types and of the
//! application's `Pod` structs as [`Record`](crate::Record)s ([`Element`]), with the
//! built-in [`Op`]s or the application's own function
//! ([`Reduction::custom`], [`Reduction::records`]).
//!
//! ```no_run
//! use fabric_msg::{Op, World};
//! let mut world = World::init()?;
//! let mut grad = vec![1.0f32; 1 << 20];
//! world.allreduce(&mut grad, Op::Sum)?;                 // blocking
//! let pending = world.iallreduce(vec![world.rank() as u64], Op::Max)?;
//! // ... compute while it runs; any World::poll moves it on ...
//! let highest = world.wait(pending)?;                   // non-blocking, then wait
//! world.barrier()?;
//! # Ok::<(), fabric_msg::Error>(())
//! ```
//!
//! Every rank calls the same collectives in the same order (as in MPI); the
//! collectives are numbered in that order, and the number travels in every
//! message's tag, in a tag class applications cannot send in, so
//! consecutive collectives never take each other's messages and the
//! application's own messages are never touched.
//!
//! Each collective is a schedule of rounds (`schedule.rs`) built by the file
//! of its algorithm, and run by the engine (`engine.rs`) through the World's
//! event loop: a blocking call starts it and waits; an `i…` call returns a
//! [`Request`](super::Request) that progresses whenever the World is polled. The algorithms
//! and how they are chosen: `docs/collectives.md`.
//!
//! Failure: any lost rank fails every collective with
//! [`Error::RankLost`](crate::Error::RankLost) within the World's bound.
//! A rank that sees a collective go wrong (a length that differs from its
//! own, a bad argument) fails it and tells the others, which fail with
//! [`Error::Collective`](crate::Error::Collective) naming it, instead of
//! waiting.

pub(crate) mod allgather;
pub(crate) mod allreduce;
pub(crate) mod alltoall;
pub(crate) mod barrier;
pub(crate) mod bcast;
pub(crate) mod cut;
pub(crate) mod engine;
pub(crate) mod gather;
pub(crate) mod io;
pub(crate) mod notice;
pub(crate) mod on_node;
pub(crate) mod on_node_copy;
pub(crate) mod ops;
pub(crate) mod plan;
pub(crate) mod plans;
pub(crate) mod probe;
pub(crate) mod queued_copy;
pub(crate) mod reduce;
pub(crate) mod reduce_scatter;
pub(crate) mod request;
pub(crate) mod run;
pub(crate) mod scan;
pub(crate) mod scatter;
pub(crate) mod schedule;
pub(crate) mod scope;
pub(crate) mod slot_queue;
#[cfg(test)]
mod tests_on_node;
#[cfg(test)]
mod tests_sim;
#[cfg(test)]
mod tests_sim_more;

pub use ops::{CombineFn, Element, Op, Reduction};
