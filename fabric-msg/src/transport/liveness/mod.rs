//! Liveness: how fabric-msg notices that a peer is gone, and what it does
//! about it. Every part of peer-loss detection is listed here, with the
//! thread that runs it.
//!
//! A peer's loss reaches a process by two ways that do not keep time with
//! each other: the fabric (a completion that fails, or no completion at
//! all: RDM endpoints say nothing of a dead peer) and a TCP connection kept
//! to the peer for this purpose, whose end the kernel reports the moment
//! the peer's process dies, even on SIGKILL. The connection is the one
//! that is always told; the fabric's failure may come a little before it or
//! a little after. [`LOSS_GRACE`] is the time one side waits for the other.
//!
//! # The event loop's part (this layer)
//!
//! - **Lifelines** (`transport/liveness/lifeline.rs`, thread
//!   `fabric-msg-lifelines`, one per
//!   [`EventLoop`](super::event_loop::EventLoop) that has any): the
//!   bootstrap's TCP connection to each peer, kept after the handshake
//!   (`transport/bootstrap/done.rs` hands it over). The thread writes
//!   heartbeats, reads the peers' heartbeats, goodbyes and verdicts, and
//!   reports a death, a departure or a stall ([`LossKind`]) by bumping an
//!   epoch the loop reads with one atomic load per `poll`.
//! - **The loss alarm** (`transport/liveness/loss.rs`, rung by the
//!   lifelines' thread): the same verdicts, readable from any thread
//!   through [`EventLoop::loss_alarm`](super::event_loop::EventLoop::loss_alarm), for a
//!   watchdog of the user's own when the polling thread is stuck inside
//!   libfabric after a loss (the tools' `Monitor` is one).
//! - **The loop's lost-peer record and handling** (run on the thread that
//!   polls the loop): `transport/event_loop/lost_peers.rs` keeps which
//!   peer each lifeline watches, which are lost and why;
//!   `transport/event_loop/loss_handling.rs` takes the lifelines' verdicts
//!   each `poll`, posts the `PeerLost` notice, fails the operations
//!   addressed to a lost peer after [`LOSS_GRACE`] and closes a lost
//!   peer's connection. They stay inside `event_loop/` because they work on
//!   the loop's slab, backlog and endpoints (and this module does not
//!   import the loop: no cycle).
//! - **The loop's give-up signal** (`EventLoop::give_up_when`, read in
//!   `transport/event_loop/room.rs`, `backlog_flush.rs` and `teardown.rs`):
//!   a post blocked on a full queue, a send waiting in the backlog, or a
//!   teardown waiting for the provider stops waiting once the World has
//!   lost a rank (below); the lifelines' losses do the same through the
//!   lost-peer record.
//!
//! # The World's part (`world/`, the layer above, which plugs in here)
//!
//! - **The liveness star** (`world/rendezvous/watch.rs`, thread
//!   `fabric-msg-liveness`): every rank keeps its rendezvous connection to
//!   rank 0 (under PMIx launchers too, as a star of its own); rank 0 sees a
//!   rank's socket close and tells the others (`Lost`); a rank that
//!   finishes says `Bye`, so an orderly exit is not taken for a death.
//! - **The record of lost ranks** (`world/liveness.rs`, `Liveness`): set by
//!   the star's thread, read by every World call with one atomic load; its
//!   flag is the loop's give-up flag above. A World call whose completion
//!   failed waits up to [`LOSS_GRACE`] for it to name a lost rank
//!   (`world/point_to_point.rs`, `world/collectives/`), so the error names
//!   the rank.
//! - **The watchdog** (`world/liveness.rs`, thread `fabric-msg-stuck`,
//!   started with the first loss): ends the process, naming the lost
//!   rank, if a World call is still inside libfabric seconds after the loss
//!   (libfabric 1.17 shm spins for ever on a lock a killed process held).
//! - **Leaving together** (`world/leaving.rs`): after a loss, the star's
//!   connections stay open until the process exits, so that a launcher
//!   that ends the job on the first exit does not cut off the survivors.

mod lifeline;
mod loss;

pub(crate) use lifeline::{Lifelines, Loss};
pub use lifeline::{HEARTBEAT, MIN_PEER_TIMEOUT};
pub use loss::{LossAlarm, LossKind, LostPeer};

use std::time::Duration;

/// How long a loss that is already on its way is given to be noticed
/// before a failure is blamed on something else, or an operation given up.
///
/// The fabric and the liveness connections (see the module doc) report one
/// loss at different moments, and each use waits for the slower one:
/// - A send to a peer that has just died fails on the fabric
///   (`FI_ECONNRESET` on tcp;ofi_rxm) a moment before its socket's end is
///   seen: the World and its collectives wait up to this long for the
///   liveness record to name the lost rank, so the error says which rank
///   went and why, not only that a send failed.
/// - A lifeline's end can overtake the last messages the peer sent before
///   it went: on a connected (MSG) endpoint the loop closes the lost peer's
///   connection only after this long, and what had arrived is delivered.
/// - On an RDM endpoint the provider is given this long to hand back the
///   operations addressed to the lost peer, with their buffers, before they
///   complete as `PeerLost` without them.
///
/// Long enough to cover a liveness thread's 50 ms look and rank 0's relay
/// of a loss to the other ranks on a loaded machine; short enough that a
/// loss is reported well within a second.
pub const LOSS_GRACE: Duration = Duration::from_millis(300);
