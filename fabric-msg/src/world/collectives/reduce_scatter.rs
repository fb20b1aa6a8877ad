//! Reduce-scatter with a count per rank (MPI's reduce_scatter): the vector
//! is cut into `size` blocks, block `r` of `counts[r]` elements; rank `r`
//! gets block `r` combined over every rank. A ring: in each of `size - 1`
//! rounds every rank passes one partially combined block to its right
//! neighbour, which adds its own contribution; each block ends on its rank.

use super::ops::{Element, Reduction};
use super::request::{Request, Shape};
use super::schedule::{ring_reduce_scatter, Blocks, Schedule};
use crate::error::Result;
use crate::world::World;

/// Rank `rank`'s rounds.
pub(crate) fn schedule(rank: u32, size: u32, counts: &[usize]) -> Schedule {
    let mut s = Schedule::default();
    ring_reduce_scatter(
        &mut s,
        rank,
        size,
        &Blocks::from_counts(counts.iter().copied()),
        0,
    );
    s
}

impl World {
    /// Combine every rank's `data` element by element with `op`, and give
    /// rank `r` the `counts[r]` elements of block `r` of the result (blocks
    /// in rank order, 0 elements allowed). `data.len()` is the sum of
    /// `counts`; every rank passes the same `counts` and reduction.
    ///
    /// ```no_run
    /// use fabric_msg::Op;
    /// let mut world = fabric_msg::World::init()?;
    /// let size = world.size() as usize;
    /// let counts = vec![2; size];
    /// let mine = world.reduce_scatter(&vec![1u64; 2 * size], &counts, Op::Sum)?;
    /// assert_eq!(mine, [size as u64, size as u64]);
    /// # Ok::<(), fabric_msg::Error>(())
    /// ```
    pub fn reduce_scatter<T: Element>(
        &mut self,
        data: &[T],
        counts: &[usize],
        op: impl Into<Reduction<T>>,
    ) -> Result<Vec<T>> {
        let r = self.ireduce_scatter(data.to_vec(), counts, op)?;
        self.wait(r)
    }

    /// Start a [`World::reduce_scatter`]; [`World::wait`] gives this rank's
    /// block.
    pub fn ireduce_scatter<T: Element>(
        &mut self,
        data: Vec<T>,
        counts: &[usize],
        op: impl Into<Reduction<T>>,
    ) -> Result<Request<T>> {
        let reduction = op.into();
        let (rank, size) = (self.rank(), self.size());
        let total: usize = counts.iter().sum();
        let checked = if counts.len() != size as usize {
            Err(format!(
                "{} counts for a world of {size} ranks: give one per rank",
                counts.len()
            ))
        } else if data.len() != total {
            Err(format!(
                "{} elements for counts that add up to {total}",
                data.len()
            ))
        } else {
            reduction.check()
        };
        if let Err(m) = checked {
            return Err(self.refuse("reduce_scatter", m));
        }
        let s = schedule(rank, size, counts);
        let at = counts[..rank as usize].iter().sum();
        let shape = Shape::Pieces(vec![(at, counts[rank as usize])]);
        self.start_run("reduce_scatter", s, data, Some(reduction), shape)
    }
}
