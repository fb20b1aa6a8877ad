//! Allgather, with a count per rank (MPI's allgatherv; `allgather` is the
//! case of equal counts). Every rank passes the same counts.
//!
//! - **Bruck** for short totals: each rank keeps the blocks in the order
//!   `rank, rank + 1, ...`; in round `k` it sends the first
//!   `min(2^k, size - 2^k)` blocks it has to `rank - 2^k` and receives as
//!   many from `rank + 2^k`. ⌈log2 size⌉ rounds for any size (recursive
//!   doubling needs a power of two); the blocks are put in rank order at
//!   the end.
//! - **ring** for long totals: `size - 1` rounds, each passing one block to
//!   the right neighbour, so every link carries each byte once.

use super::request::Shape;
use super::schedule::{back, ring_allgather, xfer, Blocks, Round, Schedule};
use smallvec::smallvec;

/// Total bytes from which allgathers go around a ring.
pub(crate) const RING_MIN_BYTES: usize = 64 << 10;

/// Which algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Algorithm {
    Bruck,
    Ring,
}

/// The algorithm for `total_bytes`.
pub(crate) fn choose(total_bytes: usize) -> Algorithm {
    if total_bytes >= RING_MIN_BYTES {
        Algorithm::Ring
    } else {
        Algorithm::Bruck
    }
}

/// Rank `rank`'s rounds, where its own block starts in the working array
/// (of `counts`' total), and where the result lies in it.
pub(crate) fn schedule(rank: u32, size: u32, counts: &[usize], algo: Algorithm) -> (Schedule, usize, Shape) {
    let mut s = Schedule::default();
    match algo {
        Algorithm::Ring => {
            let blocks = Blocks::from_counts(counts.iter().copied());
            ring_allgather(&mut s, rank, size, &blocks, |r| r, 0);
            let own = blocks.at(rank as usize);
            (s, own, Shape::Whole)
        }
        Algorithm::Bruck => {
            // Block i holds rank (rank + i) mod size.
            let of = |i: u32| ((u64::from(rank) + u64::from(i)) % u64::from(size)) as usize;
            let rot = Blocks::from_counts((0..size).map(|i| counts[of(i)]));
            let (mut d, mut k) = (1u32, 0u32);
            while d < size {
                let n = d.min(size - d) as usize;
                let d_us = d as usize;
                s.push(Round {
                    sends: smallvec![xfer(back(rank, u64::from(d), size), k, 0, rot.span(0, n))],
                    recvs: smallvec![xfer(of(d) as u32, k, rot.at(d_us), rot.span(d_us, d_us + n))],
                });
                d *= 2;
                k += 1;
            }
            let out = (0..size)
                .map(|q| {
                    let i = back(q, u64::from(rank), size) as usize;
                    (rot.at(i), counts[q as usize])
                })
                .collect();
            (s, 0, Shape::Pieces(out))
        }
    }
}
