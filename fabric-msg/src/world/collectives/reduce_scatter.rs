//! Reduce-scatter with a count per rank (MPI's reduce_scatter): the vector
//! is cut into `size` blocks, block `r` of `counts[r]` elements; rank `r`
//! gets block `r` combined over every rank. A ring: in each of `size - 1`
//! rounds every rank passes one partially combined block to its right
//! neighbour, which adds its own contribution; each block ends on its rank.

use super::schedule::{ring_reduce_scatter, Blocks, Schedule};

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
