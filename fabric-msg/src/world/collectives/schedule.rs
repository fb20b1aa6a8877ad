//! A collective as data: rounds of receives and sends over a working array
//! of elements, as MPICH's non-blocking collectives describe themselves.
//! Each algorithm (in its own file) builds one [`Schedule`] per rank; the
//! engine (`engine.rs`) runs it on the fabric, and the tests run every rank's
//! schedule in memory against a sequential reference.
//!
//! A round starts by sending: each send copies its block of the working
//! array as it is at that moment. The round ends when every receive of the
//! round has arrived; the receives are then applied in the order listed
//! (copied in, or combined with the reduction), which makes every result
//! deterministic. Receives may be posted several rounds early; they land in
//! buffers of their own, never in the working array.
//!
//! Messages are matched by (source, collective number, step). `step` is
//! chosen by the algorithm so that sender and receiver agree on it and no two
//! messages between the same pair of ranks in one collective share it.

use smallvec::{smallvec, SmallVec};

/// How a received block enters the working array.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Apply {
    /// Overwrite the block.
    Copy,
    /// `block = block ⊕ received`.
    Combine,
    /// `block = received ⊕ block` (the sender holds lower ranks' data, so
    /// partners that compute the same value compute it the same way).
    CombineOtherFirst,
}

/// One message: to or from `peer`, the block `at..at + len` (in elements)
/// of the working array.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Xfer {
    pub peer: u32,
    pub step: u32,
    pub at: usize,
    pub len: usize,
    pub apply: Apply,
}

/// The messages of one side of a round: most rounds have one or two, kept
/// inline (a small collective's schedule then allocates once).
pub(crate) type Xfers = SmallVec<[Xfer; 2]>;

/// Sends posted together, then receives awaited together.
#[derive(Debug, Default, Clone)]
pub(crate) struct Round {
    pub sends: Xfers,
    pub recvs: Xfers,
}

/// One rank's part of a collective.
#[derive(Debug, Default, Clone)]
pub(crate) struct Schedule {
    pub rounds: Rounds,
}

/// A schedule's rounds: two inline (a 2-rank barrier or allreduce has one,
/// a linear barrier's root two).
pub(crate) type Rounds = SmallVec<[Round; 2]>;

impl Schedule {
    /// Add a round, leaving out empty ones.
    pub(crate) fn push(&mut self, round: Round) {
        if !round.sends.is_empty() || !round.recvs.is_empty() {
            self.rounds.push(round);
        }
    }

    /// A round of sends only.
    pub(crate) fn send(&mut self, x: Xfer) {
        self.push(Round {
            sends: smallvec![x],
            recvs: smallvec![],
        });
    }

    /// A round of receives only.
    pub(crate) fn recv(&mut self, x: Xfer) {
        self.push(Round {
            sends: smallvec![],
            recvs: smallvec![x],
        });
    }
}

/// `Xfer` with `Apply::Copy`, for sends and plain receives.
pub(crate) fn xfer(peer: u32, step: u32, at: usize, len: usize) -> Xfer {
    Xfer {
        peer,
        step,
        at,
        len,
        apply: Apply::Copy,
    }
}

/// Consecutive blocks of the working array: block `i` is
/// `at(i)..at(i + 1)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Blocks {
    offsets: Vec<usize>,
}

impl Blocks {
    /// Blocks of the given lengths.
    pub(crate) fn from_counts(counts: impl IntoIterator<Item = usize>) -> Blocks {
        let mut offsets = vec![0];
        let mut at = 0;
        for c in counts {
            at += c;
            offsets.push(at);
        }
        Blocks { offsets }
    }

    /// `n` elements in `parts` blocks whose lengths differ by at most one,
    /// the longer ones first.
    pub(crate) fn even(n: usize, parts: u32) -> Blocks {
        let parts = parts.max(1) as usize;
        let (base, extra) = (n / parts, n % parts);
        Blocks::from_counts((0..parts).map(|i| base + usize::from(i < extra)))
    }

    /// How many blocks.
    #[cfg(test)]
    pub(crate) fn count(&self) -> usize {
        self.offsets.len() - 1
    }

    /// Where block `i` starts (`i == count()`: the total).
    pub(crate) fn at(&self, i: usize) -> usize {
        self.offsets[i]
    }

    /// Length of block `i`.
    pub(crate) fn len(&self, i: usize) -> usize {
        self.offsets[i + 1] - self.offsets[i]
    }

    /// Elements in blocks `i..j`.
    pub(crate) fn span(&self, i: usize, j: usize) -> usize {
        self.offsets[j] - self.offsets[i]
    }

    /// Every block's length.
    pub(crate) fn total(&self) -> usize {
        *self.offsets.last().unwrap_or(&0)
    }
}

/// A rank numbering rotated so that `root` is 0: the binomial trees are
/// built on virtual ranks.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rotation {
    pub root: u32,
    pub size: u32,
}

impl Rotation {
    /// The virtual rank of `rank`.
    pub(crate) fn virt(self, rank: u32) -> u32 {
        ((u64::from(rank) + u64::from(self.size) - u64::from(self.root)) % u64::from(self.size)) as u32
    }

    /// The real rank of virtual rank `v`.
    pub(crate) fn real(self, v: u32) -> u32 {
        ((u64::from(v) + u64::from(self.root)) % u64::from(self.size)) as u32
    }
}

/// The lowest set bit of `v` (0 for 0).
pub(crate) fn lowbit(v: u32) -> u32 {
    v & v.wrapping_neg()
}

/// How many virtual ranks the binomial subtree rooted at `v` holds:
/// `v .. v + subtree(v)`.
pub(crate) fn subtree(v: u32, size: u32) -> u32 {
    if v == 0 {
        size
    } else {
        lowbit(v).min(size - v)
    }
}

/// The binomial children of virtual rank `v`, largest subtree first.
pub(crate) fn children(v: u32, size: u32) -> impl Iterator<Item = u32> {
    let limit = if v == 0 {
        size.next_power_of_two()
    } else {
        lowbit(v)
    };
    let mut mask = limit >> 1;
    std::iter::from_fn(move || {
        while mask > 0 {
            let c = v.checked_add(mask).filter(|&c| c < size);
            mask >>= 1;
            if c.is_some() {
                return c;
            }
        }
        None
    })
}

/// The binomial parent of virtual rank `v > 0`.
pub(crate) fn parent(v: u32) -> u32 {
    v - lowbit(v)
}

/// `(a - b) mod size` for ranks.
pub(crate) fn back(a: u32, b: u64, size: u32) -> u32 {
    let s = u64::from(size);
    ((u64::from(a) + s - b % s) % s) as u32
}

/// Ring allgather of `blocks` (block `i` belongs to ring position `i`) at
/// ring position `me`; `real` maps a position to its rank. Steps start at
/// `step0`. Afterwards every position holds every block.
pub(crate) fn ring_allgather(
    sched: &mut Schedule,
    me: u32,
    size: u32,
    blocks: &Blocks,
    real: impl Fn(u32) -> u32,
    step0: u32,
) {
    let (right, left) = (real((me + 1) % size), real(back(me, 1, size)));
    for s in 0..size.saturating_sub(1) {
        let out = back(me, u64::from(s), size) as usize;
        let inn = back(me, u64::from(s) + 1, size) as usize;
        sched.push(Round {
            sends: smallvec![xfer(right, step0 + s, blocks.at(out), blocks.len(out))],
            recvs: smallvec![xfer(left, step0 + s, blocks.at(inn), blocks.len(inn))],
        });
    }
}

/// Ring reduce-scatter of `blocks` at rank `me`: afterwards block `me`
/// holds every rank's block `me` combined. Steps start at `step0`.
pub(crate) fn ring_reduce_scatter(sched: &mut Schedule, me: u32, size: u32, blocks: &Blocks, step0: u32) {
    let (right, left) = ((me + 1) % size, back(me, 1, size));
    for s in 0..size.saturating_sub(1) {
        let out = back(me, u64::from(s) + 1, size) as usize;
        let inn = back(me, u64::from(s) + 2, size) as usize;
        sched.push(Round {
            sends: smallvec![xfer(right, step0 + s, blocks.at(out), blocks.len(out))],
            recvs: smallvec![Xfer {
                apply: Apply::Combine,
                ..xfer(left, step0 + s, blocks.at(inn), blocks.len(inn))
            }],
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_split_evenly_and_by_counts() {
        let b = Blocks::even(10, 4);
        assert_eq!((0..4).map(|i| b.len(i)).collect::<Vec<_>>(), [3, 3, 2, 2]);
        assert_eq!((b.count(), b.total(), b.at(2), b.span(1, 3)), (4, 10, 6, 5));
        let z = Blocks::even(2, 5);
        assert_eq!((0..5).map(|i| z.len(i)).collect::<Vec<_>>(), [1, 1, 0, 0, 0]);
        let c = Blocks::from_counts([0, 5, 0, 2]);
        assert_eq!((c.at(1), c.at(2), c.at(3), c.total()), (0, 5, 5, 7));
    }

    #[test]
    fn binomial_tree_covers_every_rank_once() {
        for size in 1..=33u32 {
            let mut seen = vec![0; size as usize];
            seen[0] += 1;
            for v in 0..size {
                let kids: Vec<u32> = children(v, size).collect();
                let mut covered = 1;
                for &c in &kids {
                    assert_eq!(parent(c), v, "size {size}: parent of {c}");
                    seen[c as usize] += 1;
                    covered += subtree(c, size);
                }
                assert_eq!(covered, subtree(v, size), "size {size}: subtree of {v}");
                assert!(kids.windows(2).all(|w| w[0] > w[1]), "largest first");
            }
            assert!(seen.iter().all(|&s| s == 1), "size {size}: {seen:?}");
        }
    }

    #[test]
    fn rotation_round_trips() {
        let r = Rotation { root: 3, size: 5 };
        assert_eq!((r.virt(3), r.virt(2), r.real(0), r.real(4)), (0, 4, 3, 2));
        for rank in 0..5 {
            assert_eq!(r.real(r.virt(rank)), rank);
        }
        assert_eq!(back(0, 7, 5), 3);
    }
}
