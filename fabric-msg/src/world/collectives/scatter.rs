//! Scatter from one rank, with a count per rank (MPI's scatterv; `scatter`
//! is the case of equal counts): the root holds every rank's block in rank
//! order and rank `r` ends with block `r`. The reverse of gather
//! (`gather.rs`), with the same two algorithms and the same switch:
//!
//! - **binomial tree** for short blocks: the root lays the blocks out in
//!   virtual-rank order (rank `root` first), so that every subtree's blocks
//!   are contiguous; virtual rank `v` receives its subtree's blocks from
//!   its parent in one message, keeps its own (the first) and sends each
//!   child its subtree's blocks, largest subtree first. ⌈log2 size⌉ rounds,
//!   and the root sends ⌈log2 size⌉ messages instead of `size - 1`; a block
//!   travels up to ⌈log2 size⌉ times.
//! - **linear** for long ones: the root sends every block straight to its
//!   rank, so no block is copied twice.

use super::plan::{Place, Plan};
use super::request::Shape;
use super::schedule::{children, parent, subtree, xfer, Blocks, Rotation, Round, Schedule};

/// The algorithms and the choice between them are gather's: the same
/// bytes take the same tree the other way (a binomial tree up to 4 KiB a
/// rank on average, linear beyond).
pub(crate) use super::gather::{choose, Algorithm};

/// Rank `rank`'s part of a scatter of `counts[r]` elements to each rank
/// `r` from `root`. On the root the caller's data is every block in rank
/// order; elsewhere it is not read.
pub(crate) fn schedule(rank: u32, size: u32, root: u32, counts: &[usize], algo: Algorithm) -> Plan {
    let mut sched = Schedule::default();
    let by_rank = Blocks::from_counts(counts.iter().copied());
    let own = counts[rank as usize];
    match algo {
        Algorithm::Linear => {
            if rank != root {
                sched.recv(xfer(root, 0, 0, own));
                return Plan {
                    sched,
                    len: own,
                    places: vec![],
                    shape: Shape::Whole,
                };
            }
            let sends = (0..size)
                .filter(|&r| r != root)
                .map(|r| xfer(r, 0, by_rank.at(r as usize), counts[r as usize]))
                .collect();
            sched.push(Round {
                sends,
                recvs: Default::default(),
            });
            let total = by_rank.total();
            Plan {
                sched,
                len: total,
                places: vec![Place {
                    from: 0,
                    to: 0,
                    len: total,
                }],
                shape: Shape::Pieces(vec![(by_rank.at(rank as usize), own)]),
            }
        }
        Algorithm::Binomial => {
            let rot = Rotation { root, size };
            let v = rot.virt(rank);
            // My subtree's blocks, in virtual-rank order from me.
            let mine = Blocks::from_counts((v..v + subtree(v, size)).map(|u| counts[rot.real(u) as usize]));
            let off = |u: u32| mine.at((u - v) as usize);
            if v != 0 {
                sched.recv(xfer(rot.real(parent(v)), 0, 0, mine.total()));
            }
            let sends = children(v, size)
                .map(|c| xfer(rot.real(c), 0, off(c), off(c + subtree(c, size)) - off(c)))
                .collect();
            sched.push(Round {
                sends,
                recvs: Default::default(),
            });
            let places = if v == 0 {
                (0..size)
                    .map(|r| Place {
                        from: by_rank.at(r as usize),
                        to: off(rot.virt(r)),
                        len: counts[r as usize],
                    })
                    .collect()
            } else {
                vec![]
            };
            Plan {
                sched,
                len: mine.total(),
                places,
                shape: Shape::Pieces(vec![(0, own)]),
            }
        }
    }
}
