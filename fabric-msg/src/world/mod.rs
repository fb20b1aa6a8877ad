//! World: one program started N times, N ranks wired on one fabric.
//!
//! ```no_run
//! use fabric_msg::World;
//!
//! let mut world = World::init()?; // mpirun, srun --mpi=pmix, the rendezvous variables, or alone
//! let (rank, size) = (world.rank(), world.size());
//! let from_left = world.irecv(Some((rank + size - 1) % size), Some(7), vec![0u8; 64])?;
//! world.send((rank + 1) % size, 7, b"hello")?;
//! let got = world.wait(from_left)?; // fails naming the rank if one dies
//! assert_eq!(got, b"hello");
//! world.finish()?;
//! # Ok::<(), fabric_msg::Error>(())
//! ```
//!
//! The model: the World is the first communicator; [`World::split`],
//! [`World::split_shared`] and [`World::dup`] make others ([`Comm`]), used
//! through [`World::on`]. Typed messages and collectives return one kind
//! of [`Request`], waited on with [`World::wait`], [`World::wait_all`],
//! [`World::wait_any`] and the rest. The token interface
//! ([`World::send_buffer`], [`World::recv_buffer`], [`World::poll`]) stays
//! for programs that drive their own completion loop.
//!
//! Lives here: the top layer, which may use every layer below (transport,
//! memory, discovery, errors) and which nothing below uses. The World
//! itself (`state`: its fields, what it says of itself, how it leaves);
//! joining (`startup`): how the process was launched (`launch`: PMIx, the
//! rendezvous, or alone), the exchanges each launcher offers (`pmix`,
//! `rendezvous`, with `admission` at the rendezvous root), how the ranks
//! agree on one fabric (`agree`); communicators (`comm`) and the World's
//! own view of itself (`whole_world`); typed messages (`typed`), their
//! operations in flight (`messages`) and the requests and waits over
//! them and the collectives (`request`); the token interface's
//! point-to-point messages (`point_to_point`), the same-node ranks reached over shared memory
//! beside the fabric (`local`, and which ranks pair up: `same_node`), the tag layout that carries the sending
//! rank (`tags`); what is known of ranks that went away (`liveness`) and
//! what a process does on its way out (`leaving`); the collective calls
//! (`collective_calls`, and `more_collectives` for scatter, alltoall and
//! the scans) over their schedules and engine (`collectives/`);
//! and the memory every rank registers at once (`symmetric`). See
//! `docs/world.md` and `docs/collectives.md`.

mod admission;
mod agree;
mod announce;
#[cfg(feature = "tokio")]
pub mod awaiting;
mod collective_calls;
pub mod collectives;
mod comm;
mod comm_handle;
mod comm_slots;
mod config;
mod kept;
mod lane;
mod launch;
mod leaving;
mod liveness;
mod local;
mod local_wiring;
mod messages;
mod more_collectives;
mod node_collectives;
mod node_requests;
mod node_symmetric;
mod one_sided;
mod persistent;
mod placement;
mod pmix;
mod point_to_point;
mod probe;
mod record;
mod rendezvous;
mod request;
mod same_node;
mod scratch;
mod startup;
mod state;
mod stats;
mod struct_reductions;
pub mod symmetric;
mod tags;
mod two_level;
mod two_level_chain;
mod two_level_requests;
mod typed;
mod whole_world;

pub use comm::{Comm, CommView};
pub use config::WorldConfig;
pub use node_symmetric::{NodePart, NodeSharing};
pub use persistent::Persistent;
pub use probe::{Envelope, Matched};
pub use record::Record;
pub use request::{Request, Status};
pub use state::World;
pub use stats::{RankStats, WorldStats};
pub use tags::{MAX_CONTEXTS, MAX_RANKS};
pub use typed::VALUE_MAX;

pub(crate) use pmix::fuzz_local_peers;
pub(crate) use rendezvous::{fuzz_frame as fuzz_rendezvous_frame, fuzz_seeds as fuzz_rendezvous_seeds};
