//! The calls `--mismatch` and `--bad-op` misuse (`--call`), on the World
//! or, with `--on-comm`, on a communicator of the whole World in reverse
//! rank order, whose ranks then play the roles.

use fabric_msg::{Comm, Element, Op, World};

/// Which collective `--mismatch` and `--bad-op` misuse (`--call`).
#[derive(Clone, Copy, PartialEq)]
pub(super) enum Misused {
    Allreduce,
    /// To the last rank.
    Reduce,
    /// From rank 0.
    Broadcast,
    /// The last rank calls an allreduce where the others call a barrier
    /// (`--mismatch` only).
    Barrier,
    /// The last rank calls the non-blocking barrier (and waits) where the
    /// others call the blocking one (`--mismatch` only). In the node's
    /// slots, and as message schedules over a fabric, the two meet.
    Ibarrier,
    /// The non-blocking allreduce, waited for (`--mismatch` only): in the
    /// node's slots where the data fits in one, a message schedule where
    /// it does not.
    Iallreduce,
    /// The non-blocking reduce to the last rank, waited for, then a
    /// barrier, which must meet on every rank whatever the reduce gave:
    /// in two levels, a rank that fails its arguments still takes its
    /// node's steps, so the node's next call is numbered alike.
    Ireduce,
    /// The last rank starts a persistent barrier (and waits) where the
    /// others call the blocking one (`--mismatch` only): a message schedule
    /// where the others are in the node's slots.
    PersistentBarrier,
}

impl Misused {
    /// The call, on the World or on `comm` (whose ranks then play the
    /// roles: its last rank misuses, roots are its ranks).
    pub(super) fn run<T: Element>(
        self,
        world: &mut World,
        comm: Option<&Comm>,
        data: &mut [T],
        op: Op,
    ) -> fabric_msg::Result<()> {
        let Some(comm) = comm else {
            let last = world.size() - 1;
            return match self {
                Misused::Allreduce => world.allreduce(data, op),
                Misused::Reduce => world.reduce(last, data, op),
                Misused::Broadcast => world.broadcast(0, data),
                Misused::Barrier if world.rank() == last => world.allreduce(data, op),
                Misused::Barrier => world.barrier(),
                Misused::Ibarrier if world.rank() == last => {
                    world.ibarrier().and_then(|r| world.wait(r)).map(drop)
                }
                Misused::Iallreduce => {
                    let out = world.iallreduce(data.to_vec(), op).and_then(|r| world.wait(r));
                    // The World goes on after a failed collective: every rank
                    // took one number (and one slot) for it, so a barrier
                    // after it meets on every rank.
                    if let Err(e) = world.barrier() {
                        return Err(fabric_msg::Error::Usage(format!(
                            "the barrier after the failed iallreduce failed too: {e}"
                        )));
                    }
                    data.copy_from_slice(&out?);
                    Ok(())
                }
                Misused::Ireduce => {
                    let out = world.ireduce(last, data.to_vec(), op).and_then(|r| world.wait(r));
                    after_barrier(world.barrier(), "ireduce")?;
                    out.map(drop)
                }
                Misused::PersistentBarrier if world.rank() == last => {
                    let p = world.barrier_init()?;
                    world.start(&p, Vec::new()).and_then(|r| world.wait(r)).map(drop)
                }
                Misused::Ibarrier | Misused::PersistentBarrier => world.barrier(),
            };
        };
        let last = comm.size() - 1;
        let mut on = world.on(comm);
        match self {
            Misused::Allreduce => on.allreduce(data, op),
            Misused::Reduce => on.reduce(last, data, op),
            Misused::Broadcast => on.broadcast(0, data),
            Misused::Barrier if comm.rank() == last => on.allreduce(data, op),
            Misused::Barrier => on.barrier(),
            Misused::Ibarrier if comm.rank() == last => on.ibarrier().and_then(|r| on.wait(r)).map(drop),
            Misused::Iallreduce => {
                let out = on.iallreduce(data.to_vec(), op).and_then(|r| on.wait(r));
                if let Err(e) = on.barrier() {
                    return Err(fabric_msg::Error::Usage(format!(
                        "the barrier after the failed iallreduce failed too: {e}"
                    )));
                }
                data.copy_from_slice(&out?);
                Ok(())
            }
            Misused::Ireduce => {
                let out = on.ireduce(last, data.to_vec(), op).and_then(|r| on.wait(r));
                after_barrier(on.barrier(), "ireduce")?;
                out.map(drop)
            }
            Misused::PersistentBarrier if comm.rank() == last => {
                let p = on.barrier_init()?;
                world.start(&p, Vec::new()).and_then(|r| world.wait(r)).map(drop)
            }
            Misused::Ibarrier | Misused::PersistentBarrier => on.barrier(),
        }
    }
}

/// The barrier after a misused call: its own failure, said as such.
fn after_barrier(done: fabric_msg::Result<()>, call: &str) -> fabric_msg::Result<()> {
    done.map_err(|e| fabric_msg::Error::Usage(format!("the barrier after the failed {call} failed too: {e}")))
}

/// With `--on-comm`, a communicator of the whole World in reverse rank
/// order (so its roles fall on other world ranks than the World's).
pub(super) fn reversed(world: &mut World, on_comm: bool) -> fabric_msg::Result<Option<Comm>> {
    if !on_comm {
        return Ok(None);
    }
    let key = -i64::from(world.rank());
    world.split(Some(0), key)
}

/// This rank's rank and the last rank, in `comm` or in the World.
pub(super) fn roles(world: &World, comm: Option<&Comm>) -> (u32, u32) {
    match comm {
        Some(c) => (c.rank(), c.size() - 1),
        None => (world.rank(), world.size() - 1),
    }
}
