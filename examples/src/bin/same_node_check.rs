//! `same_node_check`: a World whose ranks share nodes pairwise, checked
//! end to end (`examples/tests/world_local.rs`). Each rank prints which
//! ranks it reaches over shared memory, then runs
//!
//! 1. a ring with exact-source receives (`-n` messages of 8 B to 70 KB,
//!    or to `-l` bytes),
//! 2. an all-to-all whose receives are all from any rank (`-a` messages to
//!    every other rank, at most `-w` receives posted), and
//! 3. allreduce, barrier and broadcast,
//!
//! checking every byte, that every message arrives exactly once, and that
//! the receives posted one after another get each rank's messages in the
//! order it sent them. Non-zero exit on any fault.
//!
//! ```text
//! for r in 0 1 2 3; do FABRIC_MSG_NODE=node$((r / 2)) FABRIC_MSG_RANK=$r FABRIC_MSG_SIZE=4 \
//!     FABRIC_MSG_ROOT=127.0.0.1:9300 target/release/same_node_check & done; wait
//! ```
//!
//! usage: same_node_check [-n RING] [-a ANY] [-w WINDOW] [-m] [-l LARGEST]
//!
//! `-l`: the largest message, 70,001 bytes by default (in ofi_rxm's
//! segmented range); above 128 KiB `tcp;ofi_rxm` sends it by rendezvous,
//! which completes receives out of the order it matched them in.
//!
//! `-m`: every other receive of the all-to-all is from one rank (each
//! other rank in turn) instead of any rank, so receives from one rank and
//! from any rank interleave (only where the rank surely has a message left
//! for it, so no receive can starve).

use fabric_msg::{Buffer, Completion, Op, OpKind, Token, World};
use fabric_msg_examples::pattern::{check, fill};
use std::collections::HashMap;
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

const RING: u32 = 1;
const ANY: u32 = 2;
/// Every fifth message is the largest (`-l`), the others these sizes.
const SIZES: [usize; 4] = [8, 100, 4096, 8200];
/// The least `-l` may be: the largest of `SIZES`, so every receive fits
/// every message.
const LEAST_LARGEST: usize = SIZES[SIZES.len() - 1];
/// The largest message (`-l`), set once by `parse`.
static LARGEST: AtomicUsize = AtomicUsize::new(70_001);
const LIMIT: Duration = Duration::from_secs(120);

fn largest() -> usize {
    LARGEST.load(Ordering::Relaxed)
}

fn size_of(i: u64) -> usize {
    SIZES
        .get((i % (SIZES.len() as u64 + 1)) as usize)
        .copied()
        .unwrap_or_else(largest)
}

/// Message `i` from `src`: its number in the first 8 bytes, then the
/// tools' pattern for (src, i).
fn message(src: u32, i: u64) -> Buffer {
    let mut b = vec![0u8; size_of(i)];
    b[..8].copy_from_slice(&i.to_le_bytes());
    fill(&mut b[8..], seq(src, i));
    Buffer::from_slice(&b)
}

fn seq(src: u32, i: u64) -> usize {
    (src as usize) << 32 | i as usize
}

/// The number of a message from `src`, its bytes checked.
fn verify(src: u32, bytes: &[u8]) -> Result<u64, String> {
    let head: [u8; 8] = bytes
        .get(..8)
        .and_then(|h| h.try_into().ok())
        .ok_or_else(|| format!("a message of {} bytes from rank {src}", bytes.len()))?;
    let i = u64::from_le_bytes(head);
    check(&bytes[8..], seq(src, i), size_of(i) - 8).map_err(|e| format!("from rank {src}: {e}"))?;
    Ok(i)
}

struct Opts {
    ring: u64,
    any: u64,
    window: usize,
    /// Every other receive of the all-to-all names its rank (in turn).
    mixed: bool,
}

fn parse() -> Result<Opts, String> {
    let mut o = Opts {
        ring: 300,
        any: 300,
        window: 16,
        mixed: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut num = |name: &str| -> Result<u64, String> {
            args.next()
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| format!("{name} needs a number"))
        };
        match a.as_str() {
            "-n" => o.ring = num("-n")?,
            "-a" => o.any = num("-a")?,
            "-w" => o.window = num("-w")?.max(1) as usize,
            "-m" => o.mixed = true,
            "-l" => {
                let l = num("-l")?;
                if l < LEAST_LARGEST as u64 {
                    return Err(format!(
                        "-l {l}: the largest message must be at least {LEAST_LARGEST} bytes"
                    ));
                }
                LARGEST.store(l as usize, Ordering::Relaxed);
            }
            other => {
                return Err(format!(
                    "unknown argument {other}; usage: same_node_check [-n RING] [-a ANY] [-w WINDOW] [-m] [-l LARGEST]"
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
            eprintln!("same_node_check: {e}");
            return ExitCode::from(1);
        }
    };
    let (rank, size) = (world.rank(), world.size());
    let shm: Vec<String> = world.shm_ranks().iter().map(u32::to_string).collect();
    println!(
        "rank {rank}/{size}: world on {} ({}); shm ranks [{}]; {}",
        world.profile().provider,
        world.launcher(),
        shm.join(","),
        world.shm_report()
    );
    let result = run(&mut world, &o);
    match result {
        Ok(line) => {
            if let Err(e) = world.finish() {
                eprintln!("rank {rank}: finish: {e}");
                return ExitCode::from(1);
            }
            println!("rank {rank}/{size}: ok: {line}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("rank {rank}/{size}: FAILED: {e}");
            ExitCode::from(1)
        }
    }
}

fn run(world: &mut World, o: &Opts) -> Result<String, String> {
    let ring = ring(world, o)?;
    let (any, exact) = all_to_all(world, o)?;
    collectives(world)?;
    Ok(format!(
        "ring {ring} messages in order; any-source {any} messages exactly once, in order per rank \
         ({exact} of the receives from one rank); collectives right"
    ))
}

/// Poll once; failures are errors, receives are returned.
fn poll(world: &mut World, out: &mut Vec<Completion>, sends: &mut u64, since: Instant) -> Result<(), String> {
    if since.elapsed() > LIMIT {
        return Err(format!("no end after {LIMIT:?}"));
    }
    world
        .poll(out, Some(Duration::from_millis(100)))
        .map_err(|e| e.to_string())?;
    for c in out.iter() {
        if let Err(e) = &c.result {
            return Err(format!("{:?} {:#x} failed: {e}", c.kind, c.token.0));
        }
        if c.kind == OpKind::Send {
            *sends += 1;
        }
    }
    out.retain(|c| c.kind == OpKind::Recv);
    Ok(())
}

/// Exact-source ring: receive `j` must hold message `j`.
fn ring(world: &mut World, o: &Opts) -> Result<u64, String> {
    let (rank, size) = (world.rank(), world.size());
    let (next, prev) = ((rank + 1) % size, (rank + size - 1) % size);
    let started = Instant::now();
    let (mut posted, mut got, mut sent, mut sends) = (0u64, 0u64, 0u64, 0u64);
    let mut out = Vec::new();
    while got < o.ring || sends < o.ring {
        while posted < o.ring && posted - got < o.window as u64 {
            world
                .recv_buffer(Some(prev), Some(RING), Buffer::new(largest()), Token(posted))
                .map_err(|e| e.error.to_string())?;
            posted += 1;
        }
        while sent < o.ring && sent - sends < o.window as u64 {
            world
                .send_buffer(next, RING, message(rank, sent), Token(1 << 40 | sent))
                .map_err(|e| e.error.to_string())?;
            sent += 1;
        }
        poll(world, &mut out, &mut sends, started)?;
        for c in out.drain(..) {
            let src = world.source(&c);
            let bytes = c.buffer.as_ref().map_or(&[][..], Buffer::as_slice);
            let i = verify(src, bytes)?;
            if src != prev || i != c.token.0 {
                return Err(format!(
                    "ring receive {} holds message {i} from rank {src}",
                    c.token.0
                ));
            }
            got += 1;
        }
    }
    Ok(got)
}

/// Every rank sends `o.any` messages to every other; every receive is from
/// any rank.
fn all_to_all(world: &mut World, o: &Opts) -> Result<(u64, u64), String> {
    let (rank, size) = (world.rank(), world.size());
    let expected = o.any * u64::from(size - 1);
    let started = Instant::now();
    let (mut posted, mut got, mut sent, mut sends) = (0u64, 0u64, 0u64, 0u64);
    // By source: (receive number, message number), as they completed.
    let mut seen: HashMap<u32, Vec<(u64, u64)>> = HashMap::new();
    // Receives that named their rank.
    let mut named: HashMap<u64, u32> = HashMap::new();
    let mut got_from: HashMap<u32, u64> = HashMap::new();
    let mut exact = 0u64;
    let mut out = Vec::new();
    while got < expected || sends < expected {
        while posted < expected && posted - got < o.window as u64 {
            // A receive from one rank only where that rank surely has a
            // message left for it: even if every receive from any rank
            // still waiting took one of that rank's, as MPI lets them.
            let from = (o.mixed && posted % 2 == 1)
                .then(|| (rank + 1 + ((posted / 2) % u64::from(size - 1)) as u32) % size)
                .filter(|&f| {
                    let left = o.any - got_from.get(&f).copied().unwrap_or(0);
                    let waiting_any = (posted - got) - named.len() as u64;
                    let waiting_f = named.values().filter(|&&g| g == f).count() as u64;
                    left > waiting_f + waiting_any + 1
                });
            world
                .recv_buffer(from, Some(ANY), Buffer::new(largest()), Token(posted))
                .map_err(|e| e.error.to_string())?;
            if let Some(f) = from {
                named.insert(posted, f);
                exact += 1;
            }
            posted += 1;
        }
        while sent < expected && sent - sends < o.window as u64 {
            // Round robin over the other ranks, message by message.
            let k = sent / u64::from(size - 1);
            let to = (rank + 1 + (sent % u64::from(size - 1)) as u32) % size;
            world
                .send_buffer(to, ANY, message(rank, k), Token(1 << 40 | sent))
                .map_err(|e| e.error.to_string())?;
            sent += 1;
        }
        poll(world, &mut out, &mut sends, started)?;
        for c in out.drain(..) {
            let src = world.source(&c);
            if world.tag(&c) != ANY || src == rank || src >= size {
                return Err(format!("a message with tag {} from rank {src}", world.tag(&c)));
            }
            let bytes = c.buffer.as_ref().map_or(&[][..], Buffer::as_slice);
            let i = verify(src, bytes)?;
            *got_from.entry(src).or_default() += 1;
            if named.remove(&c.token.0).is_some_and(|f| f != src) {
                return Err(format!(
                    "receive {} from one rank got rank {src}'s message",
                    c.token.0
                ));
            }
            seen.entry(src).or_default().push((c.token.0, i));
            got += 1;
        }
    }
    for src in (0..size).filter(|&s| s != rank) {
        let mut v = seen.remove(&src).unwrap_or_default();
        if v.len() as u64 != o.any {
            return Err(format!(
                "{} messages from rank {src}, expected {}",
                v.len(),
                o.any
            ));
        }
        v.sort_unstable();
        for (k, &(j, i)) in v.iter().enumerate() {
            if i != k as u64 {
                return Err(format!(
                    "from rank {src}: receive {j} holds message {i} where message {k} was due (lost, duplicated or out of order)"
                ));
            }
        }
    }
    Ok((got, exact))
}

fn collectives(world: &mut World) -> Result<(), String> {
    let (rank, size) = (u64::from(world.rank()), u64::from(world.size()));
    for len in [1usize, 1000, 100_000] {
        let mut data: Vec<u64> = (0..len as u64).map(|k| rank + 1 + k).collect();
        world.allreduce(&mut data, Op::Sum).map_err(|e| e.to_string())?;
        for (k, &v) in data.iter().enumerate() {
            let want = size * (size + 1) / 2 + size * k as u64;
            if v != want {
                return Err(format!("allreduce of {len}: element {k} is {v}, expected {want}"));
            }
        }
    }
    world.barrier().map_err(|e| e.to_string())?;
    let root = (size - 1) as u32;
    for len in [3usize, 50_000] {
        let mut data: Vec<u32> = if u64::from(root) == rank {
            (0..len as u32).map(|k| k.wrapping_mul(2_654_435_761)).collect()
        } else {
            vec![0; len]
        };
        world.broadcast(root, &mut data).map_err(|e| e.to_string())?;
        if let Some(k) = (0..len).find(|&k| data[k] != (k as u32).wrapping_mul(2_654_435_761)) {
            return Err(format!("broadcast of {len}: element {k} is {}", data[k]));
        }
    }
    world.barrier().map_err(|e| e.to_string())
}
