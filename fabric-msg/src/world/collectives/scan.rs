//! Prefix reductions: `scan` (inclusive: rank `r` gets `x0 ⊕ … ⊕ xr`) and
//! `exscan` (exclusive: rank `r > 0` gets `x0 ⊕ … ⊕ x(r-1)`; rank 0 gets
//! nothing), combined in rank order so that an associative but
//! non-commutative reduction gives the same value as a left-to-right fold.
//!
//! Two algorithms:
//!
//! - **recursive doubling** (as MPICH's scan) for short vectors: each
//!   rank keeps `partial`, the combination of every rank of its current
//!   sub-cube, and `result`. In
//!   round `k` it trades `partial` with `rank ^ 2^k` (skipped when that rank
//!   does not exist); the higher of the pair puts the lower's `partial`
//!   before both its `result` and its `partial`, the lower appends the
//!   higher's `partial` to its own `partial` only. A rank skipped in a round
//!   is the highest of its sub-cube's existing ranks, so nobody later needs
//!   the part it misses. ⌈log2 size⌉ rounds against a chain's `size - 1`.
//!
//!   A received block can be combined into one place of the working
//!   array only, so the lower rank sends its `partial` twice (two steps of
//!   the same round): the higher rank combines one copy into `result` and
//!   one into `partial`. Per round a pair moves 3 vectors, and a rank does
//!   at most 2 combines. Exscan copies the first `partial` it receives
//!   into `result` instead of combining.
//! - **chain** for long ones (as Open MPI's basic scan): rank `r` receives
//!   the prefix of ranks `0..r` from `r - 1`, puts it before its own
//!   vector and sends the result to `r + 1`. `size - 1` steps one after
//!   the other, but each rank receives and sends one vector (exscan: two,
//!   one copied into `result`, one combined into `partial`), and does one
//!   combine.
//!
//! Working array: `partial` at `0..n`, `result` at `n..2n`.

use super::plan::{Place, Plan};
use super::request::Shape;
use super::schedule::{xfer, Apply, Round, Schedule, Xfer};
use smallvec::smallvec;

/// Bytes from which a scan goes down the chain: allgather's and bcast's
/// order of size for leaving a log-round algorithm, not measured against
/// recursive doubling on its own (docs/collectives.md).
pub(crate) const CHAIN_MIN_BYTES: usize = 16 << 10;

/// Which algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Algorithm {
    RecursiveDoubling,
    Chain,
}

/// The algorithm for `bytes` over `size` ranks.
pub(crate) fn choose(bytes: usize, size: u32) -> Algorithm {
    if bytes >= CHAIN_MIN_BYTES && size > 2 {
        Algorithm::Chain
    } else {
        Algorithm::RecursiveDoubling
    }
}

/// Inclusive or exclusive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Inclusive,
    Exclusive,
}

/// Rank `rank`'s part of a scan of `n` elements.
pub(crate) fn schedule(rank: u32, size: u32, n: usize, kind: Kind, algo: Algorithm) -> Plan {
    let mut sched = Schedule::default();
    let with = |apply: Apply, x: Xfer| Xfer { apply, ..x };
    if algo == Algorithm::Chain {
        return chain(rank, size, n, kind);
    }
    // Whether `result` holds something yet (exscan: not before the first
    // lower partner).
    let mut filled = kind == Kind::Inclusive;
    let (mut mask, mut k) = (1u32, 0u32);
    while mask < size {
        let dst = rank ^ mask;
        if dst < size {
            let (a, b) = (2 * k, 2 * k + 1);
            if rank < dst {
                sched.push(Round {
                    sends: smallvec![xfer(dst, a, 0, n), xfer(dst, b, 0, n)],
                    recvs: smallvec![with(Apply::Combine, xfer(dst, a, 0, n))],
                });
            } else {
                let into_result = if filled {
                    Apply::CombineOtherFirst
                } else {
                    Apply::Copy
                };
                sched.push(Round {
                    sends: smallvec![xfer(dst, a, 0, n)],
                    recvs: smallvec![
                        with(into_result, xfer(dst, a, n, n)),
                        with(Apply::CombineOtherFirst, xfer(dst, b, 0, n)),
                    ],
                });
                filled = true;
            }
        }
        mask = mask.saturating_mul(2);
        k += 1;
    }
    let places = places(kind, n);
    let shape = if filled {
        Shape::Pieces(vec![(n, n)])
    } else {
        Shape::Pieces(vec![])
    };
    Plan {
        sched,
        len: 2 * n,
        places,
        shape,
    }
}

/// The chain. Inclusive: `result` (starting as this rank's vector) takes
/// the prefix from the left and goes to the right. Exclusive: the prefix
/// from the left is copied into `result` and put before `partial` (this
/// rank's vector), which goes to the right twice.
fn chain(rank: u32, size: u32, n: usize, kind: Kind) -> Plan {
    let mut sched = Schedule::default();
    let with = |apply: Apply, x: Xfer| Xfer { apply, ..x };
    let (left, right) = (rank.checked_sub(1), Some(rank + 1).filter(|&r| r < size));
    match kind {
        Kind::Inclusive => {
            if let Some(l) = left {
                sched.recv(with(Apply::CombineOtherFirst, xfer(l, 0, n, n)));
            }
            if let Some(r) = right {
                sched.send(xfer(r, 0, n, n));
            }
        }
        Kind::Exclusive => {
            if let Some(l) = left {
                sched.push(Round {
                    sends: smallvec![],
                    recvs: smallvec![xfer(l, 0, n, n), with(Apply::CombineOtherFirst, xfer(l, 1, 0, n)),],
                });
            }
            if let Some(r) = right {
                sched.push(Round {
                    sends: smallvec![xfer(r, 0, 0, n), xfer(r, 1, 0, n)],
                    recvs: smallvec![],
                });
            }
        }
    }
    let places = places(kind, n);
    let filled = kind == Kind::Inclusive || left.is_some();
    Plan {
        sched,
        len: 2 * n,
        places,
        shape: Shape::Pieces(if filled { vec![(n, n)] } else { vec![] }),
    }
}

/// Where the caller's `n` elements go in the working array: at 0, and
/// for an inclusive scan (whose result starts as the caller's own
/// elements) at `n` as well.
fn places(kind: Kind, n: usize) -> Vec<Place> {
    let mut places = vec![Place {
        from: 0,
        to: 0,
        len: n,
    }];
    if kind == Kind::Inclusive {
        places.push(Place {
            from: 0,
            to: n,
            len: n,
        });
    }
    places
}
