//! Gather to one rank, with a count per rank (MPI's gatherv; `gather` is
//! the case of equal counts). Every rank passes the same counts.
//!
//! - **binomial tree** for short contributions: virtual rank `v` collects
//!   its subtree's blocks (contiguous in virtual-rank order) from its
//!   children, then sends them to its parent in one message; the root
//!   puts the blocks back in rank order. ⌈log2 size⌉ rounds, and the root
//!   takes ⌈log2 size⌉ messages instead of `size - 1`.
//! - **linear** for long ones: every rank sends straight to the root, which
//!   has all receives posted, so no block is copied twice.

use super::request::Shape;
use super::schedule::{children, parent, subtree, xfer, Blocks, Rotation, Round, Schedule};
use smallvec::smallvec;

/// Average bytes per rank below which gathers go up a binomial tree.
pub(crate) const BINOMIAL_MAX_BYTES: usize = 4 << 10;

/// Which algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Algorithm {
    Binomial,
    Linear,
}

/// The algorithm for `total_bytes` from `size` ranks.
pub(crate) fn choose(total_bytes: usize, size: u32) -> Algorithm {
    if size > 2 && total_bytes / size as usize <= BINOMIAL_MAX_BYTES {
        Algorithm::Binomial
    } else {
        Algorithm::Linear
    }
}

/// Rank `rank`'s rounds, the length of its working array (its own block
/// at 0, except on the linear root) and where the result lies in it (on
/// other ranks than the root: nothing).
pub(crate) fn schedule(
    rank: u32,
    size: u32,
    root: u32,
    counts: &[usize],
    algo: Algorithm,
) -> (Schedule, usize, Shape) {
    let mut s = Schedule::default();
    let by_rank = Blocks::from_counts(counts.iter().copied());
    match algo {
        Algorithm::Linear => {
            if rank != root {
                s.send(xfer(root, 0, 0, counts[rank as usize]));
                return (s, counts[rank as usize], Shape::Pieces(vec![]));
            }
            let recvs = (0..size)
                .filter(|&r| r != root)
                .map(|r| xfer(r, 0, by_rank.at(r as usize), counts[r as usize]))
                .collect();
            s.push(Round {
                sends: smallvec![],
                recvs,
            });
            (s, by_rank.total(), Shape::Whole)
        }
        Algorithm::Binomial => {
            let rot = Rotation { root, size };
            let v = rot.virt(rank);
            // My subtree's blocks, in virtual-rank order from me.
            let mine = Blocks::from_counts((v..v + subtree(v, size)).map(|u| counts[rot.real(u) as usize]));
            let off = |u: u32| mine.at((u - v) as usize);
            let mut kids: Vec<u32> = children(v, size).collect();
            kids.reverse();
            let recvs = kids
                .iter()
                .map(|&c| xfer(rot.real(c), 0, off(c), off(c + subtree(c, size)) - off(c)))
                .collect();
            s.push(Round {
                sends: smallvec![],
                recvs,
            });
            if v != 0 {
                s.send(xfer(rot.real(parent(v)), 0, 0, mine.total()));
                return (s, mine.total(), Shape::Pieces(vec![]));
            }
            let out = (0..size)
                .map(|r| (off(rot.virt(r)), counts[r as usize]))
                .collect();
            (s, mine.total(), Shape::Pieces(out))
        }
    }
}
