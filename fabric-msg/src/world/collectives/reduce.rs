//! Reduce to one rank. Two algorithms, chosen as MPICH chooses:
//!
//! - **binomial tree** for short vectors: virtual rank `v` combines its
//!   children's partial results into its own (smallest subtree first) and
//!   sends the result to its parent. ⌈log2 size⌉ rounds.
//! - **reduce-scatter + gather** (Rabenseifner's scheme, with a ring for the
//!   reduce-scatter) for long ones: each rank ends up with one fully
//!   combined block, and the blocks are sent to the root. Each rank moves
//!   about two vectors' worth instead of ⌈log2 size⌉ vectors.

use super::schedule::{
    children, parent, ring_reduce_scatter, xfer, Apply, Blocks, Rotation, Round, Schedule, Xfer,
};
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
