//! fabric-msg's own transport between ranks on one node: shared memory
//! rings, no provider in between (what Open MPI's vader, MPICH's POSIX
//! shared memory and UCX's mm transports are to them).
//!
//! - `segment`: a rank's memfd segment and how a peer maps it;
//! - `doorbell`: a futex word in it, to sleep until a peer writes, and
//!   an eventfd beside it, to sleep on it and another descriptor at once;
//! - `eventfd`: that eventfd, made by its owner and checked by a peer;
//! - `sleeping`: how the node loop's owner sleeps on them;
//! - `ring`: one single-producer single-consumer ring of cache-line
//!   cells, and its memory ordering;
//! - `matching`: posted receives and unexpected messages, in MPI's order;
//! - `paired`: a receive that waits on another loop too (the World's
//!   receive from any rank), settled before it takes a message;
//! - `far`: messages that came over the World's fabric, matched here
//!   beside the node's own (one matching engine);
//! - `single_copy`: large messages read from the sender's memory
//!   (`process_vm_readv`), with a request and an ack on the rings;
//! - `peer_loss` and `pidfd`: a rank whose process ended, noticed
//!   through a pidfd;
//! - `receiving`: frames read from the rings into receives, acks,
//!   failures;
//! - `slots`: a rank's collective slots at the end of its segment, read
//!   in place by the node's other ranks (`world/collectives/on_node.rs`);
//! - `node_loop`: the [`NodeLoop`] that sends, receives and polls over
//!   them.
//!
//! The design, with the segment layout and the ring protocol, is in
//! `docs/onnode.md`.

mod doorbell;
mod eventfd;
pub(crate) mod far;
pub(crate) mod lent;
pub(crate) mod matching;
pub mod node_loop;
mod paired;
mod peer_loss;
mod pidfd;
mod receiving;
pub mod ring;
pub mod segment;
pub(crate) mod single_copy;
pub(crate) mod sleeping;
pub(crate) mod slots;

pub use node_loop::{NodeCompletion, NodeConfig, NodeLoop, DEFAULT_SINGLE_COPY_FROM};
pub use segment::{Segment, SegmentName};
