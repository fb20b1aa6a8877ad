//! Each collective's argument checks and its [`Plan`] for one rank: what
//! the non-blocking calls (`world/collective_calls.rs`,
//! `world/more_collectives.rs`) start at once and the persistent ones
//! (`world/persistent.rs`) keep to start many times. A check that fails
//! gives the message the calls pass to every rank (so none waits) or
//! return as [`Error::Usage`](crate::Error::Usage).
//!
//! `rank` and `size` are the communicator's; `n` counts elements.

use super::ops::{Element, Reduction};
use super::plan::{Place, Plan};
use super::request::{check_counts, check_root, Shape};
use super::schedule::Schedule;
use super::{allgather, allreduce, alltoall, barrier, bcast, gather, reduce, reduce_scatter, scan, scatter};

/// A plan whose working array is the caller's `n` elements themselves.
fn whole(sched: Schedule, n: usize, shape: Shape) -> Plan {
    Plan {
        sched,
        len: n,
        places: vec![Place {
            from: 0,
            to: 0,
            len: n,
        }],
        shape,
    }
}

/// What every rank of a rooted reduction keeps: the result on the root,
/// nothing elsewhere.
fn root_only(rank: u32, root: u32) -> Shape {
    if rank == root {
        Shape::Whole
    } else {
        Shape::Pieces(vec![])
    }
}

pub(crate) fn allreduce<T: Element>(
    rank: u32,
    size: u32,
    n: usize,
    op: &Reduction<T>,
) -> Result<Plan, String> {
    op.check()?;
    let algo = allreduce::choose(n * T::SIZE, n, size);
    Ok(whole(allreduce::schedule(rank, size, n, algo), n, Shape::Whole))
}

pub(crate) fn reduce<T: Element>(
    rank: u32,
    size: u32,
    root: u32,
    n: usize,
    op: &Reduction<T>,
) -> Result<Plan, String> {
    check_root(root, size)?;
    op.check()?;
    let algo = reduce::choose(n * T::SIZE, n, size);
    let sched = reduce::schedule(rank, size, root, n, algo);
    Ok(whole(sched, n, root_only(rank, root)))
}

pub(crate) fn broadcast<T: Element>(rank: u32, size: u32, root: u32, n: usize) -> Result<Plan, String> {
    check_root(root, size)?;
    let algo = bcast::choose(n * T::SIZE, n, size);
    Ok(whole(bcast::schedule(rank, size, root, n, algo), n, Shape::Whole))
}

pub(crate) fn barrier(rank: u32, size: u32) -> Plan {
    whole(
        barrier::schedule(rank, size, barrier::choose(size)),
        0,
        Shape::Whole,
    )
}

/// A reduce-scatter of `n` elements cut into `counts`.
pub(crate) fn reduce_scatter<T: Element>(
    rank: u32,
    size: u32,
    n: usize,
    counts: &[usize],
    op: &Reduction<T>,
) -> Result<Plan, String> {
    let total: usize = counts.iter().sum();
    if counts.len() != size as usize {
        return Err(format!(
            "{} counts for a world of {size} ranks: give one per rank",
            counts.len()
        ));
    }
    if n != total {
        return Err(format!("{n} elements for counts that add up to {total}"));
    }
    op.check()?;
    let at = counts[..rank as usize].iter().sum();
    let shape = Shape::Pieces(vec![(at, counts[rank as usize])]);
    Ok(whole(reduce_scatter::schedule(rank, size, counts), n, shape))
}

/// A reduce-scatter of `n` elements into `size` equal blocks.
pub(crate) fn reduce_scatter_block<T: Element>(
    rank: u32,
    size: u32,
    n: usize,
    op: &Reduction<T>,
) -> Result<Plan, String> {
    if n % size as usize != 0 {
        return Err(format!(
            "{n} elements do not split into {size} equal blocks, one per rank: pass a multiple of the world's size"
        ));
    }
    reduce_scatter(rank, size, n, &vec![n / size as usize; size as usize], op)
}

/// An allgather of `mine` elements from this rank, `counts` from all.
pub(crate) fn allgatherv<T: Element>(
    rank: u32,
    size: u32,
    mine: usize,
    counts: &[usize],
) -> Result<Plan, String> {
    check_counts(counts, size, rank, mine)?;
    let total: usize = counts.iter().sum();
    let (sched, own, shape) = allgather::schedule(rank, size, counts, allgather::choose(total * T::SIZE));
    Ok(Plan {
        sched,
        len: total,
        places: vec![Place {
            from: 0,
            to: own,
            len: mine,
        }],
        shape,
    })
}

/// A gather of `mine` elements from this rank, `counts` from all, on `root`.
pub(crate) fn gatherv<T: Element>(
    rank: u32,
    size: u32,
    root: u32,
    mine: usize,
    counts: &[usize],
) -> Result<Plan, String> {
    check_root(root, size)?;
    check_counts(counts, size, rank, mine)?;
    let total: usize = counts.iter().sum();
    let algo = gather::choose(total * T::SIZE, size);
    let (sched, len, shape) = gather::schedule(rank, size, root, counts, algo);
    let at = if algo == gather::Algorithm::Linear && rank == root {
        counts[..rank as usize].iter().sum()
    } else {
        0
    };
    Ok(Plan {
        sched,
        len,
        places: vec![Place {
            from: 0,
            to: at,
            len: mine,
        }],
        shape,
    })
}

/// A scatter of `root`'s `data` elements (this rank's count, read on the
/// root only) cut into `counts`.
pub(crate) fn scatterv<T: Element>(
    rank: u32,
    size: u32,
    root: u32,
    data: usize,
    counts: &[usize],
) -> Result<Plan, String> {
    check_root(root, size)?;
    let total: usize = counts.iter().sum();
    if counts.len() != size as usize {
        return Err(format!(
            "{} counts for a world of {size} ranks: give one per rank",
            counts.len()
        ));
    }
    if rank == root && data != total {
        return Err(format!(
            "the root's data has {data} elements but the counts add up to {total}"
        ));
    }
    let algo = scatter::choose(total * T::SIZE, size);
    Ok(scatter::schedule(rank, size, root, counts, algo))
}

/// An alltoall of `data` elements in `size` equal blocks.
pub(crate) fn alltoall(rank: u32, size: u32, data: usize) -> Result<Plan, String> {
    let ranks = size as usize;
    if data % ranks != 0 {
        return Err(format!(
            "{data} elements do not split into {size} equal blocks, one per rank: pass a multiple of the world's size"
        ));
    }
    let counts = vec![data / ranks; ranks];
    alltoallv(rank, size, data, &counts, &counts)
}

/// An alltoall of `data` elements sent as `send` and received as `recv`.
pub(crate) fn alltoallv(
    rank: u32,
    size: u32,
    data: usize,
    send: &[usize],
    recv: &[usize],
) -> Result<Plan, String> {
    let me = rank as usize;
    if send.len() != size as usize || recv.len() != size as usize {
        return Err(format!(
            "{} send counts and {} receive counts for a world of {size} ranks: give one per rank in each",
            send.len(),
            recv.len()
        ));
    }
    if send[me] != recv[me] {
        return Err(format!(
            "this rank sends itself {} elements (send_counts[{rank}]) but expects {} (recv_counts[{rank}])",
            send[me], recv[me]
        ));
    }
    let total: usize = send.iter().sum();
    if data != total {
        return Err(format!("{data} elements for send counts that add up to {total}"));
    }
    Ok(alltoall::schedule(rank, size, send, recv))
}

/// An inclusive or exclusive scan of `n` elements.
pub(crate) fn scan<T: Element>(
    rank: u32,
    size: u32,
    n: usize,
    kind: scan::Kind,
    op: &Reduction<T>,
) -> Result<Plan, String> {
    op.check()?;
    let algo = scan::choose(n * T::SIZE, size);
    Ok(scan::schedule(rank, size, n, kind, algo))
}
