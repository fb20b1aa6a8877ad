//! Allreduce. Two algorithms, chosen as MPICH chooses (by bytes and count):
//!
//! - **recursive doubling** for short vectors: ranks exchange whole vectors
//!   with partners `rank XOR 2^k` and combine, ⌈log2 size⌉ rounds. For a
//!   size that is not a power of two, MPICH's fold: with `p` the largest
//!   power of two not above `size` and `rem = size - p`, each even rank
//!   below `2 rem` first hands its vector to the odd rank above it and sits
//!   out; the other `p` ranks double; the odd ones hand the result back.
//!   Partners always combine the lower ranks' value first, so every rank
//!   ends with the same bits.
//! - **ring** for long vectors: a ring reduce-scatter (each rank ends with
//!   one fully combined block) then a ring allgather of the blocks,
//!   `2 (size - 1)` rounds in which every rank sends and receives
//!   `2 (size - 1) / size` of the vector: the least data any algorithm moves.

use super::schedule::{ring_allgather, ring_reduce_scatter, xfer, Apply, Blocks, Round, Schedule, Xfer};
use smallvec::smallvec;

/// Bytes from which an allreduce goes around the ring. MPICH leaves
/// recursive doubling at 2 KiB; here (2 to 8 ranks on 2 cores, shm)
/// recursive doubling was faster at 64 KiB and mostly at 256 KiB with 4
/// ranks, the ring at 1 MiB: its 2 (p - 1) rounds each wait for a
/// neighbour to be scheduled.
pub(crate) const RING_MIN_BYTES: usize = 128 << 10;

/// The step of the fold's hand-back (doubling steps are 1 to 24).
const UNFOLD_STEP: u32 = 30;

/// Which algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Algorithm {
    RecursiveDoubling,
    Ring,
}

/// The algorithm for `n` elements of `bytes` over `size` ranks.
pub(crate) fn choose(bytes: usize, n: usize, size: u32) -> Algorithm {
    if bytes >= RING_MIN_BYTES && n >= size as usize && size >= 2 {
        Algorithm::Ring
    } else {
        Algorithm::RecursiveDoubling
    }
}

/// Rank `rank`'s rounds for an allreduce of `n` elements.
pub(crate) fn schedule(rank: u32, size: u32, n: usize, algo: Algorithm) -> Schedule {
    let mut s = Schedule::default();
    match algo {
        Algorithm::Ring => {
            let blocks = Blocks::even(n, size);
            ring_reduce_scatter(&mut s, rank, size, &blocks, 0);
            ring_allgather(&mut s, rank, size, &blocks, |r| r, size - 1);
        }
        Algorithm::RecursiveDoubling => recursive_doubling(&mut s, rank, size, n),
    }
    s
}

fn recursive_doubling(s: &mut Schedule, rank: u32, size: u32, n: usize) {
    let p = if size.is_power_of_two() {
        size
    } else {
        size.next_power_of_two() / 2
    };
    let rem = size - p;
    let combine = |peer: u32, step: u32, other_first: bool| Xfer {
        apply: if other_first {
            Apply::CombineOtherFirst
        } else {
            Apply::Combine
        },
        ..xfer(peer, step, 0, n)
    };
    // Fold: even ranks below 2 rem hand over and wait for the result.
    if rank < 2 * rem && rank % 2 == 0 {
        s.send(xfer(rank + 1, 0, 0, n));
        s.recv(xfer(rank + 1, UNFOLD_STEP, 0, n));
        return;
    }
    let me = if rank < 2 * rem {
        s.recv(combine(rank - 1, 0, true));
        rank / 2
    } else {
        rank - rem
    };
    let real = |v: u32| if v < rem { 2 * v + 1 } else { v + rem };
    let (mut mask, mut k) = (1u32, 1u32);
    while mask < p {
        let partner = me ^ mask;
        s.push(Round {
            sends: smallvec![xfer(real(partner), k, 0, n)],
            recvs: smallvec![combine(real(partner), k, partner < me)],
        });
        mask <<= 1;
        k += 1;
    }
    if rank < 2 * rem {
        s.send(xfer(rank - 1, UNFOLD_STEP, 0, n));
    }
}
