//! Collectives of one node larger than a slot, with one copy: each rank
//! reads the others' data straight out of their memory with
//! `process_vm_readv` (`transport/node/single_copy.rs`), where the
//! slots' headers (`on_node.rs`) said where it lies and every rank said it
//! may read every other's. This is Open MPI's and UCX's use of CMA on a
//! node, applied to the whole collective instead of to each message of a
//! message schedule.
//!
//! - **allreduce** (a reduce-scatter, then an allgather, both by reads):
//!   1. Rank `i` owns part `i` of the data (`part`). It folds every
//!      rank's piece of that part in rank order, piece by piece (`PIECE`
//!      bytes, so the accumulator and what is read stay in cache), and
//!      writes the result into its own data. Every rank's part is thus
//!      computed once, by one expression: every rank gets the same bits.
//!   2. It says its part is final (the slot's phase word), and waits for
//!      every other rank's.
//!   3. It reads every other rank's final part into its own data.
//!   4. It says it is done (`finish`), and waits until every other rank is
//!      done too, since until then someone may still read its memory.
//!
//!   Nobody writes a part another rank may still read: in step 1 a rank
//!   writes only its own part, which the others read only in step 3, after
//!   its phase word; in step 3 it writes the others' parts, after every
//!   rank's step 1.
//! - **broadcast**: every other rank reads the root's data in one copy and
//!   says it is done; the root waits for all of them before it returns.
//! - **reduce**: the root folds all of the data, reading every other
//!   rank's piece by piece; the others wait until it is done, since their
//!   data must stay as it was (no part of it can hold a partial result).
//!
//! A read that finds a peer's process gone makes that rank lost (the
//! World's `RankLost`); any other failed read (an address that is not
//! there) fails this rank's call with the `errno`, and the others see it
//! finish without its part and fail too, naming it (`NodeColl::phases`).

use super::on_node::{Call, Differs, Kind, NodeColl};
use super::ops::{bytes_of, bytes_of_mut, Element, Reduction};
use std::ops::Range;

/// Bytes folded at a time in an allreduce's first step.
const PIECE: usize = 32 << 10;

/// Rank `i`'s part of `len` elements split among `n` ranks: as even as
/// can be, in rank order.
pub(crate) fn part(len: usize, n: usize, i: usize) -> Range<usize> {
    len * i / n..len * (i + 1) / n
}

/// Whether this rank's memory is read by others in `call` by one copy, so
/// that it must wait for their `done` before it gives `data` back: every
/// rank of an allreduce, a broadcast's root, a reduce's other ranks.
pub(crate) fn lends(call: &Call, me: u32) -> bool {
    match call.kind {
        Kind::Broadcast => me == call.root,
        Kind::Reduce => me != call.root,
        _ => true,
    }
}

/// A call's reads before it waits for anyone, once every header says one
/// copy: an allreduce folds its own part and says it is final (`Ok(true)`:
/// the other parts are read once every rank's is, `read_other_parts`); a
/// reduce's root folds all of it; a broadcast's other ranks read the
/// root's data. The blocking call and a queued one (`queued_copy.rs`)
/// both start here.
pub(crate) fn start<T: Element>(
    nc: &NodeColl,
    (k, call): (u64, &Call),
    data: &mut [T],
    reduction: Option<&Reduction<T>>,
) -> Result<bool, Differs> {
    match (call.kind, reduction) {
        (Kind::Allreduce, Some(r)) => {
            fold_own_part(nc, k, data, r)?;
            nc.phase_done(k);
            Ok(true)
        }
        (Kind::Reduce, Some(r)) if nc.me() == call.root => fold_all(nc, k, data, r).map(|()| false),
        (Kind::Broadcast, _) if nc.me() != call.root => read_root(nc, k, call.root, data).map(|()| false),
        _ => Ok(false),
    }
}

/// Step 1 of an allreduce: this rank's part of `data` becomes every
/// rank's part combined in rank order (rank 0's, then each next rank's
/// combined in), read from the others' memory piece by piece.
pub(crate) fn fold_own_part<T: Element>(
    nc: &NodeColl,
    k: u64,
    data: &mut [T],
    r: &Reduction<T>,
) -> Result<(), Differs> {
    let (n, me) = (nc.size() as usize, nc.me() as usize);
    fold_range(nc, k, data, r, part(data.len(), n, me))
}

/// A reduce's root: all of `data` becomes every rank's combined in rank
/// order, read from the others' memory piece by piece (the other ranks'
/// data must stay as it was, so none of them folds a part).
pub(crate) fn fold_all<T: Element>(
    nc: &NodeColl,
    k: u64,
    data: &mut [T],
    r: &Reduction<T>,
) -> Result<(), Differs> {
    fold_range(nc, k, data, r, 0..data.len())
}

/// `data[own]` becomes every rank's `own` elements combined in rank order.
fn fold_range<T: Element>(
    nc: &NodeColl,
    k: u64,
    data: &mut [T],
    r: &Reduction<T>,
    own: Range<usize>,
) -> Result<(), Differs> {
    let (n, me) = (nc.size() as usize, nc.me() as usize);
    let step = (PIECE / T::SIZE).clamp(1, own.len().max(1));
    // Rank 0 folds into its own data, which is where the sum starts; any
    // other rank starts from rank 0's piece in `acc`, since its own must
    // stay as it is until its turn in the order.
    let mut acc: Vec<T> = if me == 0 {
        Vec::new()
    } else {
        data[own.start..][..step.min(own.len())].to_vec()
    };
    let mut theirs = vec![0u8; step * T::SIZE];
    let mut scratch = Vec::new();
    let mut at = own.start;
    while at < own.end {
        let piece = at..(at + step).min(own.end);
        let offset = at * T::SIZE;
        let len = piece.len();
        for rank in 1..n {
            let theirs = &mut theirs[..len * T::SIZE];
            if rank != me {
                nc.read_from(k, rank, offset, theirs)?;
            }
            if me == 0 {
                r.combine_bytes(&mut data[piece.clone()], theirs, false, &mut scratch);
            } else {
                if rank == 1 {
                    nc.read_from(k, 0, offset, bytes_of_mut(&mut acc[..len]))?;
                }
                let other = if rank == me {
                    bytes_of(&data[piece.clone()])
                } else {
                    &*theirs
                };
                r.combine_bytes(&mut acc[..len], other, false, &mut scratch);
            }
        }
        if me != 0 {
            data[piece.clone()].copy_from_slice(&acc[..len]);
        }
        at = piece.end;
    }
    Ok(())
}

/// Step 3 of an allreduce: every other rank's final part, read into
/// `data`.
pub(crate) fn read_other_parts<T: Element>(nc: &NodeColl, k: u64, data: &mut [T]) -> Result<(), Differs> {
    let (n, me) = (nc.size() as usize, nc.me() as usize);
    for rank in (0..n).filter(|&r| r != me) {
        let theirs = part(data.len(), n, rank);
        let offset = theirs.start * T::SIZE;
        nc.read_from(k, rank, offset, bytes_of_mut(&mut data[theirs]))?;
    }
    Ok(())
}

/// A broadcast's other ranks: the root's data, read into `data`.
pub(crate) fn read_root<T: Element>(nc: &NodeColl, k: u64, root: u32, data: &mut [T]) -> Result<(), Differs> {
    nc.read_from(k, root as usize, 0, bytes_of_mut(data))
}

#[cfg(test)]
mod tests {
    use super::part;

    #[test]
    fn the_parts_cover_the_data_once_in_rank_order() {
        for len in [0, 1, 5, 1000, 1 << 20] {
            for n in 1..=9 {
                let mut next = 0;
                for i in 0..n {
                    let p = part(len, n, i);
                    assert_eq!(p.start, next, "len {len}, {n} ranks, part {i}");
                    assert!(p.len() <= len / n + 1);
                    next = p.end;
                }
                assert_eq!(next, len);
            }
        }
    }
}
