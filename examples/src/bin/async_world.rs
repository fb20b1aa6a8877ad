//! The World's requests awaited in a tokio program (feature `tokio`,
//! `fabric_msg::world::awaiting`), on any number of ranks: a ring of typed
//! messages awaited while one rank computes and a ticker task keeps
//! running beside the waiting ones; a `tokio::time::timeout` around a
//! receive that never comes (its request dropped, the receive cancelled,
//! and a later message with the same tag still arrives intact);
//! `wait_any_async` over a receive and a collective; atomics on symmetric
//! memory; a persistent allreduce started and awaited. Every value is
//! checked; each rank prints its count.
//!
//! ```text
//! mpirun -np 3 async_world
//! mpirun -np 2 async_world --pingpong 20000   # 8 B ping-pong: awaited against blocking waits
//! mpirun -np 4 async_world --allreduce 30     # 4 MiB allreduces: awaited against blocking waits
//! mpirun -np 2 async_world --quiet 100        # a message after 5 ms of quiet: awaited against blocking
//! mpirun -np 3 async_world --lose-last        # rank 2 dies while the others await
//! ```
//!
//! `--lose-last` checks a loss instead: the last rank kills itself
//! (`SIGKILL`) while every other rank awaits, one after the other, a
//! receive from it, a receive from a living rank that never sends, a
//! 4 MiB send to it and an allreduce. Every one of those futures must
//! complete with `Error::RankLost` naming it (the send may have completed
//! first, where the provider took it all in before the death); each
//! survivor prints how long that took.
//!
//! `--pingpong N` measures instead: N round trips of 8 B typed messages
//! between ranks 0 and 1, each receive awaited (`wait_async`), then the
//! same with the blocking `wait`, by turns three times; rank 0 prints µs
//! per one-way message for each. `--allreduce N` does the same with N
//! non-blocking allreduces of 4 MiB on every rank (milliseconds each);
//! `--quiet N`, N messages from rank 1 to rank 0, each after 5 ms of
//! quiet (the median microseconds from send to receipt).

use fabric_msg::{Access, Atomic, Op, World};
use fabric_msg_examples::tally::Tally;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

async fn run(world: &mut World, t: &mut Tally) -> fabric_msg::Result<()> {
    let (rank, size) = (world.rank(), world.size());
    let (left, right) = ((rank + size - 1) % size, (rank + 1) % size);

    // A ring while rank 0 computes 300 ms first: the others await, and a
    // ticker task on the same runtime keeps ticking meanwhile.
    let ticks = Arc::new(AtomicU64::new(0));
    let ticker = {
        let ticks = ticks.clone();
        tokio::spawn(async move {
            let mut every = tokio::time::interval(Duration::from_millis(10));
            loop {
                every.tick().await;
                ticks.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    if rank == 0 {
        std::thread::sleep(Duration::from_millis(300));
    }
    let started = Instant::now();
    let from_left = world.irecv(Some(left), Some(1), vec![0u64; 100])?;
    let to_right = world.isend(right, 1, &[u64::from(rank) * 7; 100])?;
    let done = world.wait_all_async(vec![from_left, to_right]).await?;
    t.expect("ring", &done[0], &vec![u64::from(left) * 7; 100]);
    let waited = started.elapsed();
    if rank != 0 && waited > Duration::from_millis(150) {
        // The ticker ran while this rank awaited rank 0.
        let n = ticks.load(Ordering::Relaxed);
        t.expect("the runtime ran other tasks during the wait", n >= 5, true);
    }
    ticker.abort();

    // A receive that never comes, under a timeout: its request is dropped
    // (the receive cancelled), and the next message with that tag is
    // taken whole by a new receive.
    let never = world.irecv(Some(left), Some(2), vec![0u32; 4])?;
    let timed = tokio::time::timeout(Duration::from_millis(200), world.wait_async(never)).await;
    t.expect("a receive that never comes times out", timed.is_err(), true);
    world.barrier()?;
    world.send(right, 2, &[rank; 4])?;
    let mut got = [0u32; 4];
    world.recv(Some(left), Some(2), &mut got)?;
    t.expect("after the timeout, the message with its tag", got, [left; 4]);

    // wait_any over a message and a collective.
    let mut set = vec![
        Some(world.irecv(Some(left), Some(3), vec![0u64; 1])?),
        Some(world.iallreduce(vec![u64::from(rank)], Op::Sum)?),
    ];
    world.isend(right, 3, &[u64::from(rank) + 1000]).map(drop)?;
    let mut seen = [false; 2];
    while let Some((i, v, _)) = world.wait_any_async(&mut set).await? {
        seen[i] = true;
        let want = if i == 0 {
            u64::from(left) + 1000
        } else {
            u64::from(size * (size - 1) / 2)
        };
        t.expect(&format!("wait_any_async #{i}"), v[0], want);
    }
    t.expect("wait_any_async took both", seen, [true, true]);

    // Atomics on symmetric memory, and a persistent allreduce.
    let mem = world.alloc_symmetric(64, Access::ReadWrite)?;
    let adds: Vec<_> = (0..size)
        .map(|r| world.fetch_atomic(r, Atomic::FetchAdd(1), &mem, 0))
        .collect::<fabric_msg::Result<_>>()?;
    world.wait_all_async(adds).await?;
    let plan = world.allreduce_init::<u64>(1, Op::Max)?;
    world.barrier()?;
    let counter = world.get::<u64>(rank, &mem, 0, 1)?;
    t.expect(
        "every rank's fetch-add",
        world.wait_async(counter).await?,
        vec![u64::from(size)],
    );
    for k in 0..3u64 {
        let req = world.start(&plan, vec![u64::from(rank) + k])?;
        t.expect(
            &format!("persistent allreduce #{k}"),
            world.wait_async(req).await?,
            vec![u64::from(size - 1) + k],
        );
    }
    world.barrier()?;
    world.free_symmetric(mem).map_err(|(_, e)| e)?;
    Ok(())
}

/// One-way µs of `n` 8 B ping-pongs with rank `1 - rank`, each receive
/// awaited or waited for.
async fn pingpong(world: &mut World, n: usize, awaited: bool) -> fabric_msg::Result<f64> {
    let (rank, other) = (world.rank(), 1 - world.rank());
    let mut buf = vec![0u64; 1];
    world.barrier()?;
    let started = Instant::now();
    for i in 0..n as u64 {
        if rank == 0 {
            world.send(other, 4, &[i])?;
        }
        let r = world.irecv(Some(other), Some(4), buf)?;
        buf = if awaited {
            world.wait_async(r).await?
        } else {
            world.wait(r)?
        };
        if rank == 1 {
            world.send(other, 4, &buf)?;
        }
    }
    Ok(started.elapsed().as_secs_f64() * 1e6 / (2 * n) as f64)
}

/// Milliseconds per non-blocking allreduce of 1 Mi `f32` (4 MiB) over
/// `n` of them, each awaited or waited for; the vector goes round.
async fn allreduces(world: &mut World, n: usize, awaited: bool) -> fabric_msg::Result<f64> {
    let mut v = vec![1.0f32; 1 << 20];
    world.barrier()?;
    let started = Instant::now();
    for _ in 0..n {
        let r = world.iallreduce(v, Op::Sum)?;
        v = if awaited {
            world.wait_async(r).await?
        } else {
            world.wait(r)?
        };
        if v[0] != world.size() as f32 {
            return Err(fabric_msg::Error::Usage(format!(
                "a sum of {} over {} ranks",
                v[0],
                world.size()
            )));
        }
        v.fill(1.0);
    }
    Ok(started.elapsed().as_secs_f64() * 1e3 / n.max(1) as f64)
}

/// Median microseconds from send to receipt over `n` messages that rank
/// 1 sends rank 0 each after 5 ms of quiet, each receive awaited or
/// waited for (the wait has passed its spinning when the message comes).
/// Both ranks read one clock (`CLOCK_MONOTONIC`: one machine).
async fn after_quiet(world: &mut World, n: usize, awaited: bool) -> fabric_msg::Result<f64> {
    let now = || {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: writes the timespec on the stack.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
        ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
    };
    let mut delays = Vec::with_capacity(n);
    world.barrier()?;
    for _ in 0..n {
        if world.rank() == 1 {
            std::thread::sleep(Duration::from_millis(5));
            world.send(0, 5, &[now()])?;
        } else if world.rank() == 0 {
            let r = world.irecv(Some(1), Some(5), vec![0u64; 1])?;
            let sent = if awaited {
                world.wait_async(r).await?
            } else {
                world.wait(r)?
            };
            let got = now();
            if sent.len() != 1 || sent[0] == 0 || sent[0] > got {
                return Err(fabric_msg::Error::Usage(format!(
                    "a time stamp of {sent:?}, read at {got}"
                )));
            }
            delays.push((got - sent[0]) as f64 / 1e3);
        }
    }
    world.barrier()?;
    delays.sort_by(f64::total_cmp);
    Ok(delays.get(delays.len() / 2).copied().unwrap_or(0.0))
}

/// What `--pingpong`, `--allreduce` and `--quiet` measure.
#[derive(Clone, Copy)]
enum Measure {
    PingPong,
    Allreduce,
    Quiet,
}

/// `--lose-last` (see the top): on a survivor, the line it prints.
async fn lose_last(world: &mut World) -> Result<String, String> {
    let (rank, size) = (world.rank(), world.size());
    let last = size - 1;
    world.barrier().map_err(|e| format!("the first barrier: {e}"))?;
    if rank == last {
        std::thread::sleep(Duration::from_millis(300));
        // SAFETY: a plain system call on this process; nothing after it runs.
        unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        return Err("still alive after SIGKILL".into());
    }
    let living = (rank + 1) % last;
    let reqs = [
        (
            "a receive from the dying rank",
            world.irecv(Some(last), Some(9), vec![0u64; 4]),
        ),
        (
            "a receive that no living rank sends",
            world.irecv(Some(living), Some(10), vec![0u64; 4]),
        ),
        (
            "a 4 MiB send to the dying rank",
            world.isend(last, 11, &vec![1u64; 1 << 19]),
        ),
        ("an allreduce", world.iallreduce(vec![1u64], Op::Sum)),
    ];
    let started = Instant::now();
    let mut delivered = 0;
    for (what, req) in reqs {
        let req = req.map_err(|e| format!("starting {what}: {e}"))?;
        match world.wait_async(req).await {
            Err(fabric_msg::Error::RankLost { rank: lost, .. }) if lost == last => {}
            // A provider may take the whole send in before the rank dies
            // (libfabric 2.1's tcp;ofi_rxm does): then it completed.
            Ok(_) if what.ends_with("send to the dying rank") => delivered += 1,
            other => {
                return Err(format!(
                    "{what} ended with {other:?}, not the loss of rank {last}"
                ))
            }
        }
    }
    Ok(format!(
        "rank {rank}/{size}: {} awaited requests completed with the loss of rank {last} {:.2} s after they began \
         ({delivered} send delivered before)",
        4 - delivered,
        started.elapsed().as_secs_f64()
    ))
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if args.iter().any(|a| a == "--lose-last") {
        let mut world = match World::init() {
            Ok(w) => w,
            Err(e) => {
                eprintln!("async_world: {e}");
                return ExitCode::FAILURE;
            }
        };
        return match lose_last(&mut world).await {
            Ok(line) => {
                println!("{line}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("async_world: rank {}: {e}", world.rank());
                ExitCode::FAILURE
            }
        };
    }
    let flag = |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1));
    let measure = match (flag("--pingpong"), flag("--allreduce"), flag("--quiet")) {
        (Some(n), _, _) => Some((Measure::PingPong, n.parse().unwrap_or(20_000))),
        (None, Some(n), _) => Some((Measure::Allreduce, n.parse().unwrap_or(30))),
        (None, None, Some(n)) => Some((Measure::Quiet, n.parse().unwrap_or(100))),
        (None, None, None) => None,
    };
    if let Some((what, n)) = measure {
        let mut world = match World::init() {
            Ok(w) => w,
            Err(e) => {
                eprintln!("async_world: {e}");
                return ExitCode::FAILURE;
            }
        };
        if world.size() < 2 && !matches!(what, Measure::Allreduce) {
            // Ranks 0 and 1 exchange: alone, rank 0 would wait for ever.
            eprintln!("async_world: --pingpong and --quiet need at least 2 ranks (mpirun -np 2)");
            return ExitCode::FAILURE;
        }
        for round in 0..3 {
            for awaited in [true, false] {
                // A spawned task, not `main`'s own future: a future that
                // `block_on` polls itself is woken through the runtime's
                // eventfd, a system call per look (docs/async.md).
                let task = tokio::spawn(async move {
                    let took = match what {
                        Measure::PingPong => pingpong(&mut world, n, awaited).await,
                        Measure::Allreduce => allreduces(&mut world, n, awaited).await,
                        Measure::Quiet => after_quiet(&mut world, n, awaited).await,
                    };
                    (world, took)
                });
                let us;
                (world, us) = match task.await {
                    Ok(done) => done,
                    Err(e) => {
                        eprintln!("async_world: the ping-pong task: {e}");
                        return ExitCode::FAILURE;
                    }
                };
                let how = if awaited { "wait_async" } else { "wait      " };
                match (us, what) {
                    (Ok(us), Measure::PingPong) if world.rank() == 0 => {
                        println!("round {round}: {how} {us:.3} us one-way (8 B, {n} round trips)")
                    }
                    (Ok(ms), Measure::Allreduce) if world.rank() == 0 => {
                        println!("round {round}: {how} {ms:.3} ms per allreduce (4 MiB, {n} of them)")
                    }
                    (Ok(us), Measure::Quiet) if world.rank() == 0 => {
                        println!("round {round}: {how} {us:.1} us median from send to receipt (after 5 ms of quiet, {n} messages)")
                    }
                    (Ok(_), _) => {}
                    (Err(e), _) => {
                        eprintln!("async_world: {e}");
                        return ExitCode::FAILURE;
                    }
                }
            }
        }
        return match world.finish() {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("async_world: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let mut world = match World::init() {
        Ok(w) => w,
        Err(e) => {
            eprintln!("async_world: {e}");
            return ExitCode::FAILURE;
        }
    };
    let (rank, size) = (world.rank(), world.size());
    let mut tally = Tally::default();
    let outcome = run(&mut world, &mut tally).await;
    let finished = world.finish();
    tally.report("async_world", (rank, size), outcome, finished)
}
