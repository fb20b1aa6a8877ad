//! All-to-all with a count per pair (MPI's alltoallv; `alltoall` is the
//! case of equal counts): rank `r` sends its block `q` to rank `q`, and
//! ends with every rank's block `r`, in rank order.
//!
//! **Pairwise exchange**: in round `k` (1 ≤ k < size) rank `r` sends to
//! `(r + k) mod size` and receives from `(r - k) mod size`, so every rank
//! sends and receives exactly one message per round and no rank is the
//! target of all the others at once. `size - 1` rounds; each byte crosses
//! the fabric once. The rank's own block is copied into place before the
//! first round.
//!
//! The working array is the send blocks followed by the receive blocks.
//! A rank learns what its peers send only from the messages themselves:
//! a message whose length differs from this rank's `recv_counts` fails the
//! collective on the receiver, which tells every other rank.

use super::plan::{Place, Plan};
use super::request::Shape;
use super::schedule::{back, xfer, Blocks, Round, Schedule};
use smallvec::smallvec;

/// Rank `rank`'s part: it sends `send[q]` elements to each rank `q`
/// (its data: the blocks in rank order) and receives `recv[q]` from each.
/// `send[rank]` and `recv[rank]` are equal (the calls check it).
pub(crate) fn schedule(rank: u32, size: u32, send: &[usize], recv: &[usize]) -> Plan {
    let mut sched = Schedule::default();
    let sends = Blocks::from_counts(send.iter().copied());
    let recvs = Blocks::from_counts(recv.iter().copied());
    let base = sends.total();
    for k in 1..size {
        let to = ((u64::from(rank) + u64::from(k)) % u64::from(size)) as usize;
        let from = back(rank, u64::from(k), size) as usize;
        sched.push(Round {
            sends: smallvec![xfer(to as u32, 0, sends.at(to), sends.len(to))],
            recvs: smallvec![xfer(from as u32, 0, base + recvs.at(from), recvs.len(from))],
        });
    }
    let me = rank as usize;
    Plan {
        sched,
        len: base + recvs.total(),
        places: vec![
            Place {
                from: 0,
                to: 0,
                len: base,
            },
            Place {
                from: sends.at(me),
                to: base + recvs.at(me),
                len: sends.len(me).min(recvs.len(me)),
            },
        ],
        shape: Shape::Pieces(vec![(base, recvs.total())]),
    }
}
