//! World: one program started N times, N ranks wired on one fabric.
//!
//! ```no_run
//! use fabric_msg::{Buffer, Token, World};
//! use std::time::Duration;
//!
//! let mut world = World::init()?; // mpirun, srun --mpi=pmix, the rendezvous variables, or alone
//! let (rank, size) = (world.rank(), world.size());
//! world.recv(Some((rank + size - 1) % size), Some(7), Buffer::new(64), Token(1))?;
//! world.send((rank + 1) % size, 7, Buffer::from_slice(b"hello"), Token(2))?;
//! let mut done = Vec::new();
//! while done.len() < 2 {
//!     let mut batch = Vec::new();
//!     world.poll(&mut batch, Some(Duration::from_secs(10)))?;
//!     done.extend(batch);
//! }
//! world.finish()?;
//! # Ok::<(), fabric_msg::Error>(())
//! ```
//!
//! Lives here: the top layer, which may use every layer below (transport,
//! memory, discovery, errors) and which nothing below uses. The World
//! itself (`state`: its fields, what it says of itself, how it leaves);
//! joining (`startup`): how the process was launched (`launch`: PMIx, the
//! rendezvous, or alone), the exchanges each launcher offers (`pmix`,
//! `rendezvous`, with `admission` at the rendezvous root), how the ranks
//! agree on one fabric (`agree`); point-to-point messages
//! (`point_to_point`), the same-node ranks reached over shared memory
//! beside the fabric (`local`), the tag layout that carries the sending
//! rank (`tags`); what is known of ranks that went away (`liveness`) and
//! what a process does on its way out (`leaving`); the collective calls
//! (`collective_calls`, and `more_collectives` for scatter, alltoall and
//! the scans) over their schedules and engine (`collectives/`);
//! and the memory every rank registers at once (`symmetric`). See
//! `docs/world.md` and `docs/collectives.md`.

mod admission;
mod agree;
mod collective_calls;
pub mod collectives;
mod config;
mod launch;
mod leaving;
mod liveness;
mod local;
mod more_collectives;
mod placement;
mod pmix;
mod point_to_point;
mod rendezvous;
mod startup;
mod state;
mod stats;
pub mod symmetric;
mod tags;

pub use config::WorldConfig;
pub use state::World;
pub use stats::{RankStats, WorldStats};
pub use tags::MAX_RANKS;

pub(crate) use pmix::fuzz_local_peers;
pub(crate) use rendezvous::{fuzz_frame as fuzz_rendezvous_frame, fuzz_seeds as fuzz_rendezvous_seeds};
