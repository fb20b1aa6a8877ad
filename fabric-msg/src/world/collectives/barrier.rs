//! Barrier. Two algorithms, chosen by the number of ranks:
//!
//! - **linear** (fan-in, fan-out through rank 0) from 3 to
//!   [`LINEAR_MAX_RANKS`] ranks: every other rank sends an empty message to
//!   rank 0 and waits for its release; rank 0 waits for all of them, then
//!   releases every rank. Two message delays whatever the size, and rank 0
//!   leaves first: a collective rooted at rank 0 that follows (a broadcast)
//!   finds the others still on their way out, not the other way round.
//!   Open MPI chooses it for small worlds too. With more ranks than cores
//!   (4 and 8 ranks on 2 cores here) it cost no more than dissemination
//!   and a following 8-byte broadcast fell several-fold (see
//!   `docs/collectives.md`).
//! - **dissemination** (Hensgen, Finkel and Manber; MPICH's default) for 2
//!   ranks, where it is one message each way at the same time (a linear
//!   barrier would be a round trip), and beyond [`LINEAR_MAX_RANKS`]: in
//!   round `k` every rank sends an empty message to `rank + 2^k` and waits
//!   for one from `rank - 2^k` (mod size); after ⌈log2 size⌉ rounds every
//!   rank has heard, directly or through others, from every rank. Any size,
//!   no extra step for non-powers of two.

use super::schedule::{back, xfer, Round, Schedule};
use smallvec::smallvec;

/// Most ranks the linear barrier serves (the same bound as the linear
/// broadcast's, for the same reason: with more ranks than cores a rank
/// that forwards is often not running).
pub(crate) const LINEAR_MAX_RANKS: u32 = 8;

/// Which algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Algorithm {
    Linear,
    Dissemination,
}

/// The algorithm for `size` ranks.
pub(crate) fn choose(size: u32) -> Algorithm {
    if (3..=LINEAR_MAX_RANKS).contains(&size) {
        Algorithm::Linear
    } else {
        Algorithm::Dissemination
    }
}

/// Rank `rank`'s rounds in a world of `size`.
pub(crate) fn schedule(rank: u32, size: u32, algo: Algorithm) -> Schedule {
    let mut s = Schedule::default();
    match algo {
        Algorithm::Linear if size > 1 => {
            // Step 0: arrived; step 1: released.
            if rank == 0 {
                s.push(Round {
                    sends: smallvec![],
                    recvs: (1..size).map(|r| xfer(r, 0, 0, 0)).collect(),
                });
                s.push(Round {
                    sends: (1..size).map(|r| xfer(r, 1, 0, 0)).collect(),
                    recvs: smallvec![],
                });
            } else {
                s.push(Round {
                    sends: smallvec![xfer(0, 0, 0, 0)],
                    recvs: smallvec![xfer(0, 1, 0, 0)],
                });
            }
        }
        Algorithm::Linear => {}
        Algorithm::Dissemination => {
            let (mut d, mut k) = (1u32, 0u32);
            while d < size {
                s.push(Round {
                    sends: smallvec![xfer((rank + d) % size, k, 0, 0)],
                    recvs: smallvec![xfer(back(rank, u64::from(d), size), k, 0, 0)],
                });
                d *= 2;
                k += 1;
            }
        }
    }
    s
}
