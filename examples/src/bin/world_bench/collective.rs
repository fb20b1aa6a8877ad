//! The collectives' measurement of `world_bench`: osu_barrier,
//! osu_bcast, osu_allreduce, osu_reduce, osu_scatter, osu_alltoall and a
//! scan, each call timed on every rank (`--by-value`: the non-blocking
//! forms and `wait`; `--reversed`: on a communicator of the whole World in
//! reverse rank order).

use super::{Bench, Row};
use fabric_msg::{Comm, World};
use fabric_msg_examples::stats::IterTimes;
use std::time::{Duration, Instant};

/// osu_barrier, osu_bcast, osu_allreduce, osu_scatter, osu_alltoall and
/// a scan: every rank times every call.
pub(super) fn collective(
    world: &mut World,
    comm: Option<&Comm>,
    (bench, by_value): (Bench, bool),
    bytes: usize,
    warmup: usize,
    iters: usize,
    tick: impl Fn(usize),
) -> fabric_msg::Result<Option<Row>> {
    // The blocking slice forms, as OSU's benchmarks call MPI's: what a
    // program writes (`world.allreduce(&mut grad, Op::Sum)`). On a World
    // all on one node, the small ones go through the node's collective
    // slots (`collectives/on_node.rs`); `--by-value` times the `i…` forms
    // and `wait` instead (through the slots too, where they fit; on a
    // communicator, `--reversed`, its broadcast, reduce and allreduce).
    let mut bcast = vec![0u8; bytes];
    let mut floats = vec![0f32; bytes / 4];
    let size = world.size() as usize;
    let blocks = vec![
        1u8;
        if bench == Bench::Scatter && world.rank() != 0 {
            0
        } else {
            size * bytes
        }
    ];
    let mut total = Duration::ZERO;
    let mut times = IterTimes::always(iters);
    world.barrier()?;
    for i in 0..warmup + iters {
        if i == warmup {
            total = Duration::ZERO;
        }
        let t = Instant::now();
        match (bench, comm) {
            (Bench::Bcast, Some(c)) if by_value => {
                let r = world.on(c).ibroadcast(0, std::mem::take(&mut bcast))?;
                bcast = world.wait(r)?;
            }
            (Bench::Reduce, Some(c)) if by_value => {
                let r = world
                    .on(c)
                    .ireduce(0, std::mem::take(&mut floats), fabric_msg::Op::Sum)?;
                let out = world.wait(r)?;
                floats = if out.is_empty() {
                    vec![0f32; bytes / 4]
                } else {
                    out
                };
            }
            (Bench::Allreduce, Some(c)) if by_value => {
                let r = world
                    .on(c)
                    .iallreduce(std::mem::take(&mut floats), fabric_msg::Op::Sum)?;
                floats = world.wait(r)?;
            }
            (Bench::Barrier, Some(c)) => world.on(c).barrier()?,
            (Bench::Bcast, Some(c)) => world.on(c).broadcast(0, &mut bcast)?,
            (Bench::Reduce, Some(c)) => world.on(c).reduce(0, &mut floats, fabric_msg::Op::Sum)?,
            (_, Some(c)) => world.on(c).allreduce(&mut floats, fabric_msg::Op::Sum)?,
            _ => {}
        }
        match bench {
            _ if comm.is_some() => {}
            Bench::Barrier => world.barrier()?,
            Bench::Bcast if by_value => {
                let r = world.ibroadcast(0, std::mem::take(&mut bcast))?;
                bcast = world.wait(r)?;
            }
            Bench::Bcast => world.broadcast(0, &mut bcast)?,
            Bench::Scatter => drop(world.scatter(0, &blocks, bytes)?),
            Bench::Alltoall => drop(world.alltoall(&blocks)?),
            Bench::Scan => world.scan(&mut floats, fabric_msg::Op::Sum)?,
            Bench::Reduce if by_value => {
                let r = world.ireduce(0, std::mem::take(&mut floats), fabric_msg::Op::Sum)?;
                let out = world.wait(r)?;
                floats = if out.is_empty() {
                    vec![0f32; bytes / 4]
                } else {
                    out
                };
            }
            Bench::Reduce => world.reduce(0, &mut floats, fabric_msg::Op::Sum)?,
            _ if by_value => {
                let r = world.iallreduce(std::mem::take(&mut floats), fabric_msg::Op::Sum)?;
                floats = world.wait(r)?;
            }
            _ => world.allreduce(&mut floats, fabric_msg::Op::Sum)?,
        }
        let took = t.elapsed();
        total += took;
        if i >= warmup {
            times.record(took.as_nanos() as u64);
        }
        if bench != Bench::Barrier {
            world.barrier()?;
        }
        tick(i + 1);
    }
    let mine = total.as_secs_f64() * 1e6 / iters as f64;
    // Each call's slowest rank: one allreduce after the timed loop.
    world.allreduce(times.nanos_mut(), fabric_msg::Op::Max)?;
    let all = world.gather(0, &[mine])?;
    if world.rank() != 0 {
        return Ok(None);
    }
    let (min, max) = all
        .iter()
        .fold((f64::MAX, 0.0f64), |(lo, hi), &x| (lo.min(x), hi.max(x)));
    Ok(Some(Row {
        bytes,
        avg: all.iter().sum::<f64>() / all.len() as f64,
        min,
        max,
        iters,
        mb_per_sec: None,
        tail: times.tail(),
        over_ranks: true,
    }))
}
