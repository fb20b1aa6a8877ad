//! `world_soak`: the World's point-to-point and collectives mixed at
//! random, as a program's phases mix them, every value checked.
//!
//! Each round every rank draws the same plan from the seed: a few
//! messages from every rank to every other, of sizes across the
//! protocol's classes (8 B inject, 64 B and 1 KiB eager, 9 KB past
//! libfabric shm's and ofi_rxm's eager sizes, 40 KB in ofi_rxm's segments,
//! 200 KB by rendezvous) and three tags; how the receives name their
//! messages (by rank and tag, or from any rank, or with any tag, or both,
//! in an order that lets every receive complete); whether the sends go
//! before, between or after the receives; how the rank waits (`wait_all`,
//! `wait_any`, or `test` with computation in between); where every
//! receive is from any rank and every rank has sent, up to three matched
//! probes (`mprobe`, `mrecv`) before the receives; and a
//! non-blocking allreduce or barrier in flight the whole time. Then a
//! blocking allreduce, broadcast and barrier on the World or on a split
//! communicator.
//!
//! Checked on each rank: every message to it arrives exactly once, whole,
//! with its source, tag and length; a receive too small for its message
//! fails with `Error::Truncated` and the messages after it still arrive;
//! MPI's non-overtaking rule (of two receives posted in order that got
//! messages of one rank, the first got the earlier message, wherever it
//! could also have taken the later one); and every collective's result
//! against a sequential reference. Non-zero exit on any fault.
//!
//! ```text
//! mpirun -np 4 world_soak -r 200 -s 7
//! mpirun -np 4 sh -c 'FABRIC_MSG_NODE=node$((OMPI_COMM_WORLD_RANK / 2)) exec world_soak'
//! ```
//!
//! usage: world_soak [-r ROUNDS] [-s SEED] [-t SECONDS] [--named-tags]
//!
//! `--named-tags`: every receive names a tag (where the plan says any
//! tag, it names its message's tag from any rank), and no probes: what a
//! World whose same-node side is libfabric's shm keeps in order
//! (`FABRIC_MSG_SHM=libfabric`; docs/world.md, "Receives from any rank").

mod plan;

use fabric_msg::{Error, Op, Request, Status, World};
use fabric_msg_examples::rng::Rng;
use plan::{contribution, id, plan_messages, plan_receives, rng_of, settings, word, Msg, Naming, LARGEST};
use std::process::ExitCode;
use std::time::{Duration, Instant};

struct Opts {
    rounds: u32,
    seed: u64,
    limit: Duration,
    /// `--named-tags`: every receive names a tag (from a rank or
    /// from any rank), the receives a World whose same-node side is
    /// libfabric's shm (`FABRIC_MSG_SHM=libfabric`) keeps in order
    /// (docs/world.md, "Receives from any rank"). The rounds' plans are
    /// drawn as without it, then each receive that would name no tag
    /// names its message's tag from any rank. No matched probes (libfabric
    /// 1.17's shm cannot peek: a World there refuses them).
    named: bool,
}

fn parse() -> Result<Opts, String> {
    let mut o = Opts {
        rounds: 100,
        seed: 1,
        limit: Duration::from_secs(300),
        named: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut num = |name: &str| -> Result<u64, String> {
            args.next()
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| format!("{name} needs a number"))
        };
        match a.as_str() {
            "-r" => o.rounds = num("-r")?.min(u64::from(u32::MAX >> 8)) as u32,
            "-s" => o.seed = num("-s")?,
            "-t" => o.limit = Duration::from_secs(num("-t")?),
            "--named-tags" => o.named = true,
            other => {
                return Err(format!(
                    "unknown argument {other}; usage: world_soak [-r ROUNDS] [-s SEED] [-t SECONDS] [--named-tags]"
                ))
            }
        }
    }
    Ok(o)
}

fn main() -> ExitCode {
    let o = match parse() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let mut world = match World::init() {
        Ok(w) => w,
        Err(e) => {
            eprintln!("world_soak: {e}");
            return ExitCode::from(1);
        }
    };
    let (rank, size) = (world.rank(), world.size());
    // How this rank reaches the others: the test reads which same-node
    // side it runs on from here.
    println!("rank {rank}/{size}: {}", world.shm_report());
    // A World whose messages go over libfabric's shm before 1.19 itself
    // (the whole World on one node with `FABRIC_MSG_SHM=libfabric`) cannot
    // keep receives from any rank apart (docs/world.md, "Known gap"): a
    // receive misses its message or is given another tag's. Every rank
    // sees the same provider, so every rank skips, and says so.
    if let Some(why) = world.any_source_defect() {
        eprintln!(
            "rank {rank}/{size}: SKIPPED: receives from any rank cannot be kept apart on this World: {why}"
        );
        println!("rank {rank}/{size}: skipped: receives from any rank on this provider");
        return match world.finish() {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("rank {rank}/{size}: FAILED: finish: {e}");
                ExitCode::from(1)
            }
        };
    }
    let mut tally = Tally::default();
    let started = Instant::now();
    let mut result = Ok(());
    for round in 0..o.rounds {
        if started.elapsed() > o.limit {
            result = Err(format!("round {round} not reached in {:?} (-t)", o.limit));
            break;
        }
        if let Err(e) = soak_round(&mut world, &o, round, &mut tally) {
            let (naming, sends_at, wait_by, _) = settings(o.seed, round);
            result = Err(format!(
                "round {round} (seed {}; receives {naming:?}, sends {}, waits by {}): {e}",
                o.seed,
                ["before the receives", "between them", "after them"][sends_at as usize],
                ["wait", "wait_any", "test"][wait_by as usize]
            ));
            break;
        }
    }
    match result.and_then(|()| world.finish().map_err(|e| format!("finish: {e}"))) {
        Ok(()) => {
            println!(
                "rank {rank}/{size}: ok: {} rounds in {:.1} s: {} messages received ({} by rendezvous size, \
                 {} by matched probe), {} receives too small refused, {} checked for order; {} collectives right",
                o.rounds,
                started.elapsed().as_secs_f64(),
                tally.received,
                tally.largest,
                tally.probed,
                tally.truncated,
                tally.ordered,
                tally.collectives
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("rank {rank}/{size}: FAILED: {e}");
            ExitCode::from(1)
        }
    }
}

#[derive(Default)]
struct Tally {
    received: u64,
    largest: u64,
    truncated: u64,
    probed: u64,
    ordered: u64,
    collectives: u64,
}

fn soak_round(world: &mut World, o: &Opts, round: u32, tally: &mut Tally) -> Result<(), String> {
    let (me, size) = (world.rank(), world.size());
    let (naming, sends_at, wait_by, probes) = settings(o.seed, round);
    let mut rng = rng_of(o.seed, round);
    rng.0 = rng.next();
    let plan = plan_messages(&mut rng, size);
    let nb_len = [0usize, 3, 8192][rng.below(3) as usize];
    // Every rank draws every rank's receives, so the draws stay in step.
    let mut receives = Vec::new();
    for dst in 0..size {
        let incoming: Vec<Msg> = plan[dst as usize].iter().flatten().copied().collect();
        let r = plan_receives(&mut rng, naming, o.named, &incoming);
        if dst == me {
            receives = r;
        }
    }
    let err = |e: Error| e.to_string();

    // A non-blocking collective in flight across the whole round.
    let (barrier, nb) = if nb_len == 0 {
        (Some(world.ibarrier().map_err(err)?), None)
    } else {
        let mine: Vec<u64> = (0..nb_len).map(|i| contribution(round, me, i)).collect();
        (None, Some(world.iallreduce(mine, Op::Sum).map_err(err)?))
    };

    let mut reqs: Vec<Option<Request<u64>>> = Vec::new();
    let mut kinds: Vec<Option<usize>> = Vec::new(); // receive index, or None for a send
    let half = receives.len() / 2;
    let send_all = |world: &mut World, reqs: &mut Vec<_>, kinds: &mut Vec<_>| -> Result<(), String> {
        for (dst, from) in plan.iter().enumerate() {
            for m in &from[me as usize] {
                let data: Vec<u64> = (0..m.len).map(|i| word(id(me, round, m.seq), i)).collect();
                reqs.push(Some(world.isend(dst as u32, m.tag, &data).map_err(err)?));
                kinds.push(None);
            }
        }
        Ok(())
    };
    if sends_at == 0 {
        send_all(world, &mut reqs, &mut kinds)?;
    }
    // Where every receive is from any rank and every rank has sent, the
    // first few are matched probes instead (`mprobe`, then `mrecv`).
    let mut probed = Vec::new();
    if naming == Naming::Any && sends_at == 0 && !o.named {
        for i in 0..probes.min(receives.len()) {
            let m = world.mprobe(None, None).map_err(err)?;
            let env = m.envelope();
            let res = world.mrecv::<u64>(m).map(|v| {
                let st = Status {
                    source: env.source,
                    tag: env.tag,
                    count: env.bytes / 8,
                };
                (v, st)
            });
            reqs.push(None);
            kinds.push(Some(i));
            probed.push((reqs.len() - 1, res));
        }
    }
    for (i, r) in receives.iter().enumerate().skip(probed.len()) {
        if sends_at == 1 && i == half {
            send_all(world, &mut reqs, &mut kinds)?;
        }
        reqs.push(Some(
            world
                .irecv(r.from, r.tag, Vec::with_capacity(r.room))
                .map_err(err)?,
        ));
        kinds.push(Some(i));
    }
    if sends_at == 2 || (sends_at == 1 && receives.len() <= half) {
        send_all(world, &mut reqs, &mut kinds)?;
    }

    // What each receive got: (message's source, its seq).
    let mut got: Vec<Option<(u32, u32)>> = vec![None; receives.len()];
    let mut take = |k: usize, res: Result<(Vec<u64>, Status), Error>| -> Result<(), String> {
        let Some(i) = kinds[k] else {
            return res.map(drop).map_err(|e| format!("a send failed: {e}"));
        };
        let r = &receives[i];
        let (data, st) = match res {
            Ok(x) => x,
            Err(Error::Truncated { len, capacity, .. }) => {
                let (src, seq) = r.expect.ok_or_else(|| {
                    format!(
                        "receive {i} ({:?}, {:?}) truncated, yet had room for any message",
                        r.from, r.tag
                    )
                })?;
                let want = plan[me as usize][src as usize][seq as usize].len;
                if want <= r.room || capacity != r.room * 8 || len.is_some_and(|l| l != want * 8) {
                    return Err(format!(
                        "receive {i} truncated (len {len:?}, capacity {capacity}) where it expected \
                         {want} elements from rank {src} in room for {}",
                        r.room
                    ));
                }
                got[i] = Some((src, seq));
                tally.truncated += 1;
                return Ok(());
            }
            Err(e) => return Err(format!("receive {i} ({:?}, {:?}) failed: {e}", r.from, r.tag)),
        };
        let first = *data
            .first()
            .ok_or_else(|| format!("receive {i}: an empty message"))?;
        let (src, rnd, seq) = (
            (first >> 44) as u32,
            ((first >> 20) & 0xFF_FFFF) as u32,
            (first & 0xF_FFFF) as u32,
        );
        let m = plan
            .get(me as usize)
            .and_then(|f| f.get(src as usize))
            .and_then(|l| l.get(seq as usize))
            .filter(|_| rnd == round)
            .ok_or_else(|| {
                format!("receive {i}: a message no rank sent this round (first word {first:#x})")
            })?;
        if st.source != src || st.tag != m.tag || st.count != m.len || data.len() != m.len {
            return Err(format!(
                "receive {i}: status {st:?} and {} elements for message {seq} from rank {src} (tag {}, {} elements)",
                data.len(),
                m.tag,
                m.len
            ));
        }
        if !r.matches(m) {
            return Err(format!(
                "receive {i} ({:?}, {:?}) got message {seq} from rank {src} with tag {}",
                r.from, r.tag, m.tag
            ));
        }
        if let Some(e) = r.expect.filter(|e| *e != (src, seq)) {
            return Err(format!(
                "receive {i} got message {seq} from rank {src} where message {} from rank {} was due",
                e.1, e.0
            ));
        }
        if let Some(bad) = (0..m.len).find(|&k| data[k] != word(first, k)) {
            return Err(format!(
                "receive {i}: message {seq} from rank {src}: element {bad} of {} wrong",
                m.len
            ));
        }
        got[i] = Some((src, seq));
        tally.received += 1;
        tally.largest += u64::from(m.len == LARGEST);
        Ok(())
    };
    tally.probed += probed.len() as u64;
    for (k, res) in probed {
        take(k, res)?;
    }
    match wait_by {
        0 => {
            // wait_all stops at the first failure: truncations expected, so
            // one at a time where there are any.
            for (k, slot) in reqs.iter_mut().enumerate() {
                if let Some(r) = slot.take() {
                    take(k, world.wait_status(r))?;
                }
            }
        }
        1 => {
            while let Some(done) = wait_any_status(world, &mut reqs) {
                let (k, res) = done;
                take(k, res)?;
            }
        }
        _ => {
            let spin = Duration::from_micros(rng.below(200));
            let deadline = Instant::now() + Duration::from_secs(120);
            while reqs.iter().any(Option::is_some) {
                if Instant::now() > deadline {
                    return Err("receives and sends not done after 120 s of test".into());
                }
                for (k, slot) in reqs.iter_mut().enumerate() {
                    let Some(r) = slot.as_ref() else { continue };
                    if world.test(r).map_err(err)? {
                        if let Some(r) = slot.take() {
                            take(k, world.wait_status(r))?;
                        }
                    }
                }
                let t = Instant::now();
                while t.elapsed() < spin {
                    std::hint::spin_loop();
                }
            }
        }
    }

    // Exactly once, and in each rank's order.
    let incoming: usize = plan[me as usize].iter().map(Vec::len).sum();
    let mut seen = vec![Vec::new(); size as usize];
    for (src, seq) in got.iter().flatten() {
        seen[*src as usize].push(*seq);
    }
    for (src, seqs) in seen.iter_mut().enumerate() {
        seqs.sort_unstable();
        let want: Vec<u32> = (0..plan[me as usize][src].len() as u32).collect();
        if *seqs != want {
            return Err(format!("from rank {src}: got messages {seqs:?}, sent {want:?}"));
        }
    }
    if got.iter().flatten().count() != incoming {
        return Err(format!(
            "{} receives for {incoming} messages",
            got.iter().flatten().count()
        ));
    }
    for j in 0..got.len() {
        let Some((sj, qj)) = got[j] else { continue };
        let mj = plan[me as usize][sj as usize][qj as usize];
        for i in 0..j {
            let Some((si, qi)) = got[i] else { continue };
            if si == sj && receives[i].matches(&mj) {
                tally.ordered += 1;
                if qi > qj {
                    for (k, (r, g)) in receives.iter().zip(&got).enumerate() {
                        let m = g.map(|(s, q)| plan[me as usize][s as usize][q as usize]);
                        eprintln!("rank {me}: receive {k} {:?} {:?} got {:?}", r.from, r.tag, m);
                    }
                    return Err(format!(
                        "non-overtaking broken: receive {i} ({:?}, {:?}) got message {qi} from rank {si} \
                         ({} elements), the later receive {j} its earlier message {qj} (tag {}, {} elements)",
                        receives[i].from,
                        receives[i].tag,
                        plan[me as usize][si as usize][qi as usize].len,
                        mj.tag,
                        mj.len
                    ));
                }
            }
        }
    }

    // The non-blocking collective, then blocking ones.
    if let Some(r) = barrier {
        world.wait(r).map_err(err)?;
        tally.collectives += 1;
    }
    if let Some(r) = nb {
        let sum = world.wait(r).map_err(err)?;
        let want: Vec<u64> = (0..nb_len)
            .map(|i| (0..size).map(|w| contribution(round, w, i)).sum())
            .collect();
        if sum != want {
            return Err(format!("iallreduce of {nb_len}: wrong sum"));
        }
        tally.collectives += 1;
    }
    collectives(world, &mut rng, round, tally)
}

/// `wait_any`, but a failed operation is given with its place, as the
/// others are (a truncated receive is expected here).
#[allow(clippy::type_complexity)]
fn wait_any_status(
    world: &mut World,
    reqs: &mut [Option<Request<u64>>],
) -> Option<(usize, Result<(Vec<u64>, Status), Error>)> {
    loop {
        if reqs.iter().all(Option::is_none) {
            return None;
        }
        for (k, slot) in reqs.iter_mut().enumerate() {
            let Some(r) = slot.as_ref() else { continue };
            match world.test(r) {
                Ok(true) => return slot.take().map(|r| (k, world.wait_status(r))),
                Ok(false) => {}
                Err(e) => return Some((k, Err(e))),
            }
        }
        // More ranks than cores: let the others run.
        std::thread::yield_now();
    }
}

/// A blocking allreduce, broadcast and barrier, on the World or on the
/// ranks of one parity.
fn collectives(world: &mut World, rng: &mut Rng, round: u32, tally: &mut Tally) -> Result<(), String> {
    let (me, size) = (world.rank(), world.size());
    let err = |e: Error| e.to_string();
    let len = [1usize, 16, 9000][rng.below(3) as usize];
    let root = rng.below(u64::from(size)) as u32;
    if rng.chance(30) && size > 2 {
        let half = world
            .split(Some(me % 2), i64::from(me))
            .map_err(err)?
            .ok_or("split gave no communicator")?;
        let members = half.members().to_vec();
        let mut v: Vec<u64> = (0..len).map(|i| contribution(round, me, i)).collect();
        world.on(&half).allreduce(&mut v, Op::Max).map_err(err)?;
        let want: Vec<u64> = (0..len)
            .map(|i| {
                members
                    .iter()
                    .map(|&w| contribution(round, w, i))
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        if v != want {
            return Err(format!(
                "allreduce max of {len} on the ranks of parity {}: wrong",
                me % 2
            ));
        }
        let r = root % half.size();
        let mut b = if half.rank() == r {
            want.clone()
        } else {
            vec![0; len]
        };
        world.on(&half).broadcast(r, &mut b).map_err(err)?;
        if b != want {
            return Err(format!(
                "broadcast of {len} from {r} on the ranks of parity {}: wrong",
                me % 2
            ));
        }
        world.on(&half).barrier().map_err(err)?;
    } else {
        let mut v: Vec<u64> = (0..len).map(|i| contribution(round, me, i)).collect();
        world.allreduce(&mut v, Op::Sum).map_err(err)?;
        let want: Vec<u64> = (0..len)
            .map(|i| (0..size).map(|w| contribution(round, w, i)).sum())
            .collect();
        if v != want {
            return Err(format!("allreduce sum of {len}: wrong"));
        }
        let mut b = if me == root { want.clone() } else { vec![0; len] };
        world.broadcast(root, &mut b).map_err(err)?;
        if b != want {
            return Err(format!("broadcast of {len} from {root}: wrong"));
        }
        world.barrier().map_err(err)?;
    }
    tally.collectives += 3;
    Ok(())
}
