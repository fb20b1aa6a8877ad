//! Reduce to one rank. Two algorithms, chosen as MPICH chooses:
//!
//! - **binomial tree** for short vectors: virtual rank `v` combines its
//!   children's partial results into its own (smallest subtree first) and
//!   sends the result to its parent. ⌈log2 size⌉ rounds.
//! - **reduce-scatter + gather** (Rabenseifner's scheme, with a ring for the
//!   reduce-scatter) for long ones: each rank ends up with one fully
//!   combined block, and the blocks are sent to the root. Each rank moves
//!   about two vectors' worth instead of ⌈log2 size⌉ vectors.

use super::ops::{Element, Reduction};
use super::request::{check_root, copy_result, Request, Shape};
use super::schedule::{
    children, parent, ring_reduce_scatter, xfer, Apply, Blocks, Rotation, Round, Schedule, Xfer,
};
use crate::error::Result;
use crate::world::World;
use smallvec::smallvec;

/// Bytes from which a reduce goes through a reduce-scatter: as allreduce's
/// ring (not measured on its own).
pub(crate) const SCATTER_MIN_BYTES: usize = 128 << 10;

/// Which algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Algorithm {
    Binomial,
    ScatterGather,
}

/// The algorithm for `n` elements of `bytes` over `size` ranks.
pub(crate) fn choose(bytes: usize, n: usize, size: u32) -> Algorithm {
    if bytes >= SCATTER_MIN_BYTES && n >= size as usize && size >= 2 {
        Algorithm::ScatterGather
    } else {
        Algorithm::Binomial
    }
}

/// Rank `rank`'s rounds for a reduce of `n` elements to `root`.
pub(crate) fn schedule(rank: u32, size: u32, root: u32, n: usize, algo: Algorithm) -> Schedule {
    let mut s = Schedule::default();
    match algo {
        Algorithm::Binomial => {
            let rot = Rotation { root, size };
            let v = rot.virt(rank);
            let mut kids: Vec<u32> = children(v, size).collect();
            kids.reverse();
            let recvs = kids
                .iter()
                .map(|&c| Xfer {
                    apply: Apply::Combine,
                    ..xfer(rot.real(c), 0, 0, n)
                })
                .collect();
            s.push(Round {
                sends: smallvec![],
                recvs,
            });
            if v != 0 {
                s.send(xfer(rot.real(parent(v)), 0, 0, n));
            }
        }
        Algorithm::ScatterGather => {
            let blocks = Blocks::even(n, size);
            ring_reduce_scatter(&mut s, rank, size, &blocks, 0);
            let last = size - 1;
            if rank != root {
                let r = rank as usize;
                s.send(xfer(root, last, blocks.at(r), blocks.len(r)));
            } else {
                let recvs = (0..size as usize)
                    .filter(|&r| r != root as usize)
                    .map(|r| xfer(r as u32, last, blocks.at(r), blocks.len(r)))
                    .collect();
                s.push(Round {
                    sends: smallvec![],
                    recvs,
                });
            }
        }
    }
    s
}

impl World {
    /// Combine every rank's `data` element by element with `op`; on `root`,
    /// `data` becomes the result, elsewhere it is left as it was. Every
    /// rank passes the same length and the same reduction.
    ///
    /// ```no_run
    /// use fabric_msg::Op;
    /// let mut world = fabric_msg::World::init()?;
    /// let mut worst = [world.rank() as f64 * 0.5];
    /// world.reduce(0, &mut worst, Op::Max)?;
    /// # Ok::<(), fabric_msg::Error>(())
    /// ```
    pub fn reduce<T: Element>(
        &mut self,
        root: u32,
        data: &mut [T],
        op: impl Into<Reduction<T>>,
    ) -> Result<()> {
        let r = self.ireduce(root, data.to_vec(), op)?;
        let out = self.wait(r)?;
        if self.rank() == root {
            copy_result("reduce", data, &out)?;
        }
        Ok(())
    }

    /// Start a [`World::reduce`]; [`World::wait`] gives the result on
    /// `root` and an empty vector elsewhere.
    pub fn ireduce<T: Element>(
        &mut self,
        root: u32,
        data: Vec<T>,
        op: impl Into<Reduction<T>>,
    ) -> Result<Request<T>> {
        let reduction = op.into();
        let (rank, size) = (self.rank(), self.size());
        if let Err(m) = check_root(root, size).and_then(|()| reduction.check()) {
            return Err(self.refuse("reduce", m));
        }
        let algo = choose(data.len() * T::SIZE, data.len(), size);
        let s = schedule(rank, size, root, data.len(), algo);
        let shape = if rank == root {
            Shape::Whole
        } else {
            Shape::Pieces(vec![])
        };
        self.start_run("reduce", s, data, Some(reduction), shape)
    }
}
