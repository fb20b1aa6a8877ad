//! `symmetric_check`: the World's symmetric memory between every pair of
//! ranks, every byte checked. Each rank puts a pattern of its own into a
//! slot of every rank's part (itself included), reads a slot back from
//! every rank, and, where the fabric has atomics, fetch-adds and
//! compare-swap-increments two counters on every rank; then each rank
//! checks its own part. Prints one line per rank; non-zero exit on any
//! difference or error.
//!
//! ```text
//! mpirun -np 4 target/release/symmetric_check
//! ```
//!
//! usage: symmetric_check [--slot BYTES] [--atomics N] [--no-atomics]
//!                        [--sharing auto|mapped|never]
//!        (the World asks for atomics by default: native where the fabric
//!        has them all, shm or sockets, emulated by fabric-msg elsewhere;
//!        --no-atomics takes Capability::Atomic out, and the atomics part
//!        is then skipped, loudly; --sharing is the allocation's
//!        NodeSharing, auto by default: mapped maps same-node parts also
//!        over native atomics, and emulates the other nodes')
//!        symmetric_check --mismatch      the last rank asks for 8 bytes more
//!        symmetric_check --mismatch-sharing
//!                                        the last rank asks for NodeSharing::Never

use fabric_msg::{
    Access, Atomic, AtomicKind, Capability, NodeSharing, OpKind, Symmetric, Token, World, WorldConfig,
};
use std::process::ExitCode;
use std::time::Instant;

/// Operations of one kind in flight at once.
const WINDOW: usize = 32;

struct Opts {
    slot: usize,
    atomics: u64,
    no_atomics: bool,
    mismatch: bool,
    mismatch_sharing: bool,
    sharing: NodeSharing,
}

fn parse() -> Result<Opts, String> {
    let mut o = Opts {
        slot: 4096,
        atomics: 50,
        no_atomics: false,
        mismatch: false,
        mismatch_sharing: false,
        sharing: NodeSharing::Auto,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = |name: &str| {
            args.next()
                .and_then(|v| v.parse::<u64>().ok())
                .ok_or(format!("{name} needs a number"))
        };
        match a.as_str() {
            "--slot" => o.slot = value("--slot")? as usize,
            "--atomics" => o.atomics = value("--atomics")?,
            "--mismatch" => o.mismatch = true,
            "--mismatch-sharing" => o.mismatch_sharing = true,
            "--sharing" => {
                o.sharing = match args.next().as_deref() {
                    Some("auto") => NodeSharing::Auto,
                    Some("mapped") => NodeSharing::Mapped,
                    Some("never") => NodeSharing::Never,
                    other => return Err(format!("--sharing {other:?}: auto, mapped or never")),
                }
            }
            "--no-atomics" => o.no_atomics = true,
            other => return Err(format!("unknown argument {other:?} (see the file's docs)")),
        }
    }
    if o.slot == 0 || o.slot % 8 != 0 || o.slot > 1 << 24 {
        return Err(format!("--slot {}: a multiple of 8 from 8 to 16 MiB", o.slot));
    }
    Ok(o)
}

/// The byte at `i` of the slot rank `from` writes on rank `to`.
fn pattern(from: u32, to: u32, i: usize) -> u8 {
    (from as usize * 131 + to as usize * 29 + i * 7 + (i >> 8)) as u8
}

/// Checks made, what failed, and how many ranks' parts this rank reaches
/// through its own mapping (the same-node ones where the World maps
/// symmetric memory).
type Outcome = (usize, Vec<String>, usize);

fn check(world: &mut World, o: &Opts) -> Result<Outcome, String> {
    let (me, size) = (world.rank(), world.size());
    let counters = size as usize * o.slot;
    let len = counters + 24;
    let e = |e: fabric_msg::Error| e.to_string();
    let mem = world
        .alloc_symmetric_with(len, Access::ReadWrite, o.sharing)
        .map_err(e)?;
    let mapped = (0..size).filter(|&r| mem.on_node(r).is_some()).count();
    let mut checks = 0;
    let mut failures = Vec::new();

    // Puts: slot `me` of every rank's part gets pattern(me, t).
    let mut puts = Vec::new();
    for t in 0..size {
        let bytes: Vec<u8> = (0..o.slot).map(|i| pattern(me, t, i)).collect();
        puts.push(
            world
                .put(t, &mem, (me as usize * o.slot) as u64, &bytes)
                .map_err(e)?,
        );
    }
    world.wait_all(puts).map_err(e)?;
    world.barrier().map_err(e)?;
    let mut got = vec![0u8; o.slot];
    for s in 0..size {
        mem.load(s as usize * o.slot, &mut got).map_err(e)?;
        let bad = (0..o.slot).filter(|&i| got[i] != pattern(s, me, i)).count();
        checks += 1;
        if bad > 0 {
            failures.push(format!("slot put by rank {s}: {bad} of {} bytes differ", o.slot));
        }
    }

    // Gets: from every rank t, the slot rank (t + me) % size put there.
    let mut gets = Vec::new();
    for t in 0..size {
        let s = (t + me) % size;
        gets.push(
            world
                .get::<u8>(t, &mem, (s as usize * o.slot) as u64, o.slot)
                .map_err(e)?,
        );
    }
    for (t, got) in (0..size).zip(world.wait_all(gets).map_err(e)?) {
        let s = (t + me) % size;
        let bad = (0..o.slot).filter(|&i| got[i] != pattern(s, t, i)).count();
        checks += 1;
        if bad > 0 {
            failures.push(format!(
                "slot {s} read from rank {t}: {bad} of {} bytes differ",
                o.slot
            ));
        }
    }

    // The token interface: read the slot this rank put on its right-hand
    // neighbour into registered memory; the completion comes from poll.
    let right = (me + 1) % size;
    let local = world.event_loop().register(o.slot, Access::Read).map_err(e)?;
    let at = (me as usize * o.slot) as u64;
    world.read(right, local.all(), &mem, at, Token(7)).map_err(e)?;
    let c = poll_for(world, Token(7))?;
    local.read_at(0, &mut got).map_err(e)?;
    checks += 1;
    let bad = (0..o.slot).filter(|&i| got[i] != pattern(me, right, i)).count();
    if c.kind != OpKind::Read || bad > 0 {
        failures.push(format!(
            "token read from rank {right}: {:?}, {bad} bytes differ",
            c.kind
        ));
    }
    local.close().map_err(|(_, err)| err.to_string())?;

    // Out of bounds: refused here, before anything reaches the fabric.
    checks += 1;
    if world
        .put((me + 1) % size, &mem, (len - 4) as u64, &[0u8; 8])
        .is_ok()
    {
        failures.push("an 8-byte write 4 bytes before the end was accepted".into());
    }

    checks += atomics(world, &mem, o, counters as u64, &mut failures)?;
    checks += token_atomics(world, &mem, counters as u64 + 16, &mut failures)?;
    world.barrier().map_err(e)?;
    world.free_symmetric(mem).map_err(|(_, err)| err.to_string())?;
    Ok((checks, failures, mapped))
}

/// Every rank fetch-adds 1 to counter A and compare-swap-increments counter
/// B of every rank `o.atomics` times; each rank's counters must then be
/// exactly size × o.atomics, and the fetched values of one target distinct.
/// Odd ranks add to the parts they have mapped directly (`NodePart`),
/// beside the others' requests and the other nodes' fabric atomics, so
/// one counter takes atomics of every mechanism at once.
fn atomics(
    world: &mut World,
    mem: &Symmetric,
    o: &Opts,
    at: u64,
    failures: &mut Vec<String>,
) -> Result<usize, String> {
    let (me, size) = (world.rank(), world.size());
    let profile = world.profile();
    let missing: Vec<_> = [AtomicKind::FetchAdd, AtomicKind::CompareSwap]
        .into_iter()
        .filter(|&op| profile.atomic_carrier(op).is_none())
        .collect();
    if !missing.is_empty() {
        say_err(&format!(
            "symmetric_check: rank {me}: ATOMICS SKIPPED: {} carries no {missing:?} (FI_EOPNOTSUPP: natively \
             none, and not emulated: the world was started with --no-atomics)",
            profile.provider
        ));
        return Ok(0);
    }
    let e = |e: fabric_msg::Error| e.to_string();
    // Fetch-add, WINDOW at a time, targets interleaved.
    let targets: Vec<u32> = (0..o.atomics).flat_map(|_| 0..size).collect();
    let mut fetched: Vec<Vec<u64>> = vec![Vec::new(); size as usize];
    for chunk in targets.chunks(WINDOW) {
        let mut adds = Vec::new();
        let mut sent = Vec::new();
        for &t in chunk {
            match mem.on_node(t).filter(|_| me % 2 == 1) {
                Some(part) => {
                    fetched[t as usize].push(part.atomic(Atomic::FetchAdd(1), at as usize).map_err(e)?)
                }
                None => {
                    adds.push(world.fetch_atomic(t, Atomic::FetchAdd(1), mem, at).map_err(e)?);
                    sent.push(t);
                }
            }
        }
        for (&t, old) in sent.iter().zip(world.wait_all(adds).map_err(e)?) {
            fetched[t as usize].push(old[0]);
        }
    }
    // Compare-swap increments: one target at a time, retrying with the
    // value seen until the swap lands.
    let mut seen = vec![0u64; size as usize];
    for t in (0..size)
        .cycle()
        .skip(me as usize)
        .take((o.atomics * size as u64) as usize)
    {
        let mut guess = seen[t as usize];
        loop {
            let op = Atomic::CompareSwap {
                expected: guess,
                new: guess + 1,
            };
            let req = world.fetch_atomic(t, op, mem, at + 8).map_err(e)?;
            let old = world.wait(req).map_err(e)?[0];
            if old == guess {
                seen[t as usize] = guess + 1;
                break;
            }
            guess = old;
        }
    }
    world.barrier().map_err(e)?;
    let total = size as u64 * o.atomics;
    let mut word = [0u64];
    for (name, off) in [("fetch-add", at), ("compare-swap", at + 8)] {
        mem.load(off as usize, &mut word).map_err(e)?;
        if word[0] != total {
            failures.push(format!("{name} counter is {}, not {total}", word[0]));
        }
    }
    let mut checks = 2;
    for (t, vals) in fetched.iter_mut().enumerate() {
        vals.sort_unstable();
        vals.dedup();
        checks += 1;
        if vals.len() as u64 != o.atomics || vals.iter().any(|&v| v >= total) {
            failures.push(format!(
                "fetch-adds on rank {t} returned repeated or impossible values"
            ));
        }
    }
    Ok(checks)
}

/// Every rank fetch-adds 1 to rank 0's third counter through the token
/// interface (`World::atomic`, completion from `World::poll` with the old
/// value); after a barrier, every rank reads it: exactly `size`.
fn token_atomics(
    world: &mut World,
    mem: &Symmetric,
    at: u64,
    failures: &mut Vec<String>,
) -> Result<usize, String> {
    if world.profile().atomic_carrier(AtomicKind::FetchAdd).is_none() {
        return Ok(0);
    }
    let e = |e: fabric_msg::Error| e.to_string();
    let size = u64::from(world.size());
    world
        .atomic(0, Atomic::FetchAdd(1), mem, at, Token(8))
        .map_err(e)?;
    let c = poll_for(world, Token(8))?;
    if c.kind != OpKind::Atomic || !c.value.is_some_and(|v| v < size) {
        failures.push(format!(
            "token fetch-add on rank 0: {:?} fetched {:?}",
            c.kind, c.value
        ));
    }
    world.barrier().map_err(e)?;
    let req = world.get::<u64>(0, mem, at, 1).map_err(e)?;
    let total = world.wait(req).map_err(e)?[0];
    if total != size {
        failures.push(format!(
            "token fetch-adds left rank 0's counter at {total}, not {size}"
        ));
    }
    Ok(1)
}

/// Poll the World until the completion of `token` comes (checked: it
/// succeeded).
fn poll_for(world: &mut World, token: Token) -> Result<fabric_msg::Completion, String> {
    let mut out = Vec::new();
    let until = Instant::now() + std::time::Duration::from_secs(60);
    while Instant::now() < until {
        world
            .poll(&mut out, Some(std::time::Duration::from_millis(100)))
            .map_err(|e| e.to_string())?;
        if let Some(i) = out.iter().position(|c| c.token == token) {
            let c = out.swap_remove(i);
            return c
                .result
                .clone()
                .map(|()| c)
                .map_err(|err| format!("{token:?} failed: {err}"));
        }
    }
    Err(format!("no completion of {token:?} in 60 s"))
}

/// One line in one write, so that ranks sharing `mpirun`'s stderr do not
/// interleave.
fn say_err(line: &str) {
    use std::io::Write;
    std::io::stderr().write_all(format!("{line}\n").as_bytes()).ok();
}

fn main() -> ExitCode {
    let o = match parse() {
        Ok(o) => o,
        Err(e) => {
            say_err(&format!("symmetric_check: {e}"));
            return ExitCode::from(2);
        }
    };
    let cfg = WorldConfig::from_env().map(|mut c| {
        if o.no_atomics {
            c.requirements.caps.retain(|&cap| cap != Capability::Atomic);
        }
        c
    });
    let mut world = match cfg.and_then(World::init_with) {
        Ok(w) => w,
        Err(e) => {
            say_err(&format!("symmetric_check: {e}"));
            return ExitCode::FAILURE;
        }
    };
    let (rank, size) = (world.rank(), world.size());
    let started = Instant::now();
    let outcome = if o.mismatch || o.mismatch_sharing {
        let last = rank == size - 1;
        let extra = if last && o.mismatch { 8 } else { 0 };
        let sharing = if last && o.mismatch_sharing {
            NodeSharing::Never
        } else {
            NodeSharing::Auto
        };
        world
            .alloc_symmetric_with(4096 + extra, Access::ReadWrite, sharing)
            .map(|_| (0, vec!["a mismatched allocation was accepted".to_string()], 0))
            .map_err(|e| e.to_string())
    } else {
        check(&mut world, &o)
    };
    let provider = world.profile().provider.clone();
    let launcher = world.launcher();
    let secs = started.elapsed().as_secs_f64();
    // Other ranks' atomics this rank's loop applied as emulated requests
    // (none where the provider carries them natively).
    let applied = world.event_loop().atomic_counters().applied_requests;
    match outcome {
        Ok((checks, failures, mapped)) if failures.is_empty() => {
            println!(
                "rank {rank}/{size}: {checks} checks passed in {secs:.2} s ({provider} via {launcher}; {mapped} parts mapped; \
                 {applied} emulated atomics applied)"
            );
            match world.finish() {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    say_err(&format!("symmetric_check: rank {rank}: {e}"));
                    ExitCode::FAILURE
                }
            }
        }
        Ok((_, failures, _)) => {
            for f in failures {
                println!("rank {rank}/{size}: FAILED {f}");
            }
            ExitCode::FAILURE
        }
        Err(e) => {
            say_err(&format!("symmetric_check: rank {rank}: {e}"));
            ExitCode::FAILURE
        }
    }
}
