//! Barrier: the dissemination algorithm (Hensgen, Finkel and Manber; MPICH's
//! default). In round `k` every rank sends an empty message to
//! `rank + 2^k` and waits for one from `rank - 2^k` (mod size): after
//! ⌈log2 size⌉ rounds every rank has heard, directly or through others,
//! from every rank. Any size, no extra step for non-powers of two.

use super::request::{Request, Shape};
use super::schedule::{back, xfer, Round, Schedule};
use crate::error::Result;
use crate::world::World;

/// Rank `rank`'s rounds in a world of `size`.
pub(crate) fn schedule(rank: u32, size: u32) -> Schedule {
    let mut s = Schedule::default();
    let (mut d, mut k) = (1u32, 0u32);
    while d < size {
        s.push(Round {
            sends: vec![xfer((rank + d) % size, k, 0, 0)],
            recvs: vec![xfer(back(rank, u64::from(d), size), k, 0, 0)],
        });
        d *= 2;
        k += 1;
    }
    s
}

impl World {
    /// Wait until every rank has called `barrier`.
    ///
    /// ```no_run
    /// let mut world = fabric_msg::World::init()?;
    /// world.barrier()?;
    /// # Ok::<(), fabric_msg::Error>(())
    /// ```
    pub fn barrier(&mut self) -> Result<()> {
        let r = self.ibarrier()?;
        self.wait(r).map(drop)
    }

    /// Start a barrier; [`World::wait`] returns (an empty vector) once every
    /// rank has started it.
    pub fn ibarrier(&mut self) -> Result<Request<u8>> {
        let s = schedule(self.rank(), self.size());
        self.start_run("barrier", s, Vec::new(), None, Shape::Whole)
    }
}
