//! `waits`: what a World waits for, in the programs that meet it daily: a
//! peer that computes before it receives, sends posted long before their
//! receives, more ranks than cores, and a one-sided read from a rank that
//! computes. Every byte is checked; a non-zero exit says what went wrong.
//!
//! ```text
//! mpirun -np 2 target/release/waits peer --compute 20     # rank 1 computes 20 s, then receives
//! mpirun -np 2 target/release/waits flood -n 2000 -S 65536 --hold 2
//! mpirun -np 4 target/release/waits ring -n 20000          # 4 ranks on 2 cores
//! mpirun -np 4 target/release/waits ring -n 20000 --hand   # the hand-written wait, to compare
//! mpirun -np 2 target/release/waits get --compute 5        # a read from a rank that computes
//! ```
//!
//! `peer`: rank 1 posts one 1 KiB receive, computes (`--spin`: on the CPU;
//! otherwise asleep: either way it does not call the library), posts a
//! second, and answers rank 0 once both arrived; rank 0 sent both before
//! it and waits for the answer. `flood`: rank 0 posts `-n` sends of `-S`
//! bytes at once; rank 1 posts their receives only after `--hold` seconds.
//! `ring`: every rank sends `-S` bytes to the next rank and receives from
//! the previous one, `-n` times, each round waited for (`World::poll(None)`,
//! or with `--hand` the best hand-written wait: `poll(Some(0))` and
//! `yield_now`); rank 0 prints microseconds per round. `get`: rank 0 reads
//! rank 1's symmetric memory `-I` times while rank 1 computes; rank 0
//! prints how long each read took.

use fabric_msg::{Access, Buffer, Completion, Token, World};
use std::collections::BTreeSet;
use std::process::ExitCode;
use std::time::{Duration, Instant};

const USAGE: &str = "usage: waits peer|flood|ring|get [-n N] [-S BYTES] [-I READS] [--compute SECS] [--spin] [--hold SECS] [--hand]";

struct Opts {
    case: String,
    n: u64,
    size: usize,
    reads: u64,
    compute: Duration,
    spin: bool,
    hold: Duration,
    hand: bool,
}

fn parse() -> Result<Opts, String> {
    let mut args = std::env::args().skip(1);
    let case = args.next().ok_or(USAGE)?;
    let mut o = Opts {
        case,
        n: 0,
        size: 0,
        reads: 100,
        compute: Duration::from_secs(6),
        spin: false,
        hold: Duration::from_secs(2),
        hand: false,
    };
    while let Some(a) = args.next() {
        let mut val = |what: &str| args.next().ok_or(format!("{a} needs {what}"));
        let num = |s: String| s.parse::<f64>().ok().filter(|v| v.is_finite() && *v >= 0.0);
        let bad = |s: &str| format!("{a}: {s:?} is not a number");
        match a.as_str() {
            "-n" => o.n = val("a count").map(|s| num(s.clone()).ok_or(bad(&s)))?? as u64,
            "-S" => o.size = val("bytes").map(|s| num(s.clone()).ok_or(bad(&s)))?? as usize,
            "-I" => o.reads = val("a count").map(|s| num(s.clone()).ok_or(bad(&s)))?? as u64,
            "--compute" => {
                o.compute = Duration::from_secs_f64(val("seconds").map(|s| num(s.clone()).ok_or(bad(&s)))??)
            }
            "--hold" => {
                o.hold = Duration::from_secs_f64(val("seconds").map(|s| num(s.clone()).ok_or(bad(&s)))??)
            }
            "--spin" => o.spin = true,
            "--hand" => o.hand = true,
            _ => return Err(format!("unknown option {a}\n{USAGE}")),
        }
    }
    if o.size > 64 << 20 {
        return Err(format!("-S {}: at most 64 MiB", o.size));
    }
    Ok(o)
}

/// The bytes message `seq` from `src` carries.
fn pattern(src: u32, seq: u64, len: usize) -> Vec<u8> {
    let mut x = (u64::from(src) << 40) ^ seq.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x5555;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Work that does not call the library: on the CPU with `spin`, else asleep.
fn compute(how_long: Duration, spin: bool) {
    if !spin {
        std::thread::sleep(how_long);
        return;
    }
    let until = Instant::now() + how_long;
    let mut x = 1u64;
    while Instant::now() < until {
        for _ in 0..10_000 {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
    }
}

/// Poll until every token in `want` completed; their completions. With
/// `hand`, the hand-written wait: zero-timeout polls and `yield_now`.
fn complete(world: &mut World, want: &[Token], hand: bool) -> Result<Vec<Completion>, String> {
    let mut left: BTreeSet<u64> = want.iter().map(|t| t.0).collect();
    let mut done = Vec::with_capacity(want.len());
    let mut batch = Vec::new();
    while !left.is_empty() {
        let timeout = if hand { Some(Duration::ZERO) } else { None };
        let n = world.poll(&mut batch, timeout).map_err(|e| e.to_string())?;
        if n == 0 && hand {
            std::thread::yield_now();
        }
        for c in batch.drain(..) {
            if !left.remove(&c.token.0) {
                return Err(format!("completion for unexpected token {:#x}", c.token.0));
            }
            if let Err(e) = &c.result {
                return Err(format!("operation {:#x}: {e}", c.token.0));
            }
            done.push(c);
        }
    }
    Ok(done)
}

fn check_bytes(c: &Completion, src: u32, seq: u64, len: usize) -> Result<(), String> {
    let got = c.buffer.as_ref().map(Buffer::as_slice).unwrap_or_default();
    if got != pattern(src, seq, len).as_slice() {
        return Err(format!(
            "message {seq} from rank {src}: {} bytes, not what was sent",
            got.len()
        ));
    }
    Ok(())
}

fn send(world: &mut World, to: u32, tag: u32, bytes: &[u8], token: Token) -> Result<(), String> {
    world
        .send_buffer(to, tag, Buffer::from_slice(bytes), token)
        .map_err(|e| e.error.to_string())
}

fn recv(world: &mut World, from: u32, tag: u32, len: usize, token: Token) -> Result<(), String> {
    world
        .recv_buffer(Some(from), Some(tag), Buffer::new(len), token)
        .map_err(|e| e.error.to_string())
}

/// A peer that computes before it receives (rank 1), and the sender.
fn peer(world: &mut World, o: &Opts) -> Result<String, String> {
    const LEN: usize = 1024;
    match world.rank() {
        0 => {
            let started = Instant::now();
            send(world, 1, 1, &pattern(0, 1, LEN), Token(11))?;
            send(world, 1, 2, &pattern(0, 2, LEN), Token(12))?;
            recv(world, 1, 3, LEN, Token(13))?;
            let done = complete(world, &[Token(11), Token(12), Token(13)], false)?;
            let answer = done.iter().find(|c| c.token == Token(13)).ok_or("no answer")?;
            check_bytes(answer, 1, 3, LEN)?;
            Ok(format!(
                "peer: rank 1 computed {:.1} s before receiving; both sends completed and its answer came after {:.1} s",
                o.compute.as_secs_f64(),
                started.elapsed().as_secs_f64()
            ))
        }
        1 => {
            recv(world, 0, 1, LEN, Token(1))?;
            compute(o.compute, o.spin);
            recv(world, 0, 2, LEN, Token(2))?;
            let got = complete(world, &[Token(1), Token(2)], false)?;
            for c in &got {
                check_bytes(c, 0, c.token.0, LEN)?;
            }
            send(world, 0, 3, &pattern(1, 3, LEN), Token(3))?;
            complete(world, &[Token(3)], false)?;
            Ok(String::new())
        }
        _ => Ok(String::new()),
    }
}

/// `-n` sends posted before their receives.
fn flood(world: &mut World, o: &Opts) -> Result<String, String> {
    let (n, len) = (o.n.max(1), o.size.max(8));
    match world.rank() {
        0 => {
            let started = Instant::now();
            let mut tokens: Vec<Token> = (0..n).map(|i| Token(1 + i)).collect();
            for i in 0..n {
                send(world, 1, 5, &pattern(0, i, len), Token(1 + i))?;
            }
            let posted = started.elapsed();
            recv(world, 1, 6, 8, Token(0))?;
            tokens.push(Token(0));
            complete(world, &tokens, false)?;
            Ok(format!(
                "flood: {n} sends of {len} bytes posted in {:.2} s before rank 1 posted a receive; all delivered, in order, after {:.1} s",
                posted.as_secs_f64(),
                started.elapsed().as_secs_f64()
            ))
        }
        1 => {
            compute(o.hold, false);
            let tokens: Vec<Token> = (0..n).map(|i| Token(1 + i)).collect();
            for &t in &tokens {
                recv(world, 0, 5, len, t)?;
            }
            let mut got = complete(world, &tokens, false)?;
            // Receives with the same matcher complete in the order of the
            // messages: the i-th receive holds message i.
            got.sort_by_key(|c| c.token.0);
            for c in &got {
                check_bytes(c, 0, c.token.0 - 1, len)?;
            }
            send(world, 0, 6, &[1; 8], Token(u64::MAX >> 8))?;
            complete(world, &[Token(u64::MAX >> 8)], false)?;
            Ok(String::new())
        }
        _ => Ok(String::new()),
    }
}

/// Every rank sends to the next and receives from the previous, `-n`
/// rounds, each waited for.
fn ring(world: &mut World, o: &Opts) -> Result<String, String> {
    let (me, size) = (world.rank(), world.size());
    let (next, prev) = ((me + 1) % size, (me + size - 1) % size);
    let (n, len) = (o.n.max(1), o.size.max(8));
    let started = Instant::now();
    for i in 0..n {
        let (r, s) = (Token(2 * i + 1), Token(2 * i + 2));
        recv(world, prev, 7, len, r)?;
        send(world, next, 7, &pattern(me, i, len), s)?;
        let done = complete(world, &[r, s], o.hand)?;
        let got = done.iter().find(|c| c.token == r).ok_or("no receive")?;
        check_bytes(got, prev, i, len)?;
    }
    let took = started.elapsed();
    world.barrier().map_err(|e| e.to_string())?;
    if me != 0 {
        return Ok(String::new());
    }
    Ok(format!(
        "ring: {size} ranks, {n} rounds of {len} bytes, {:.1} us per round ({} wait)",
        took.as_secs_f64() * 1e6 / n as f64,
        if o.hand {
            "hand-written poll(Some(0)) + yield_now"
        } else {
            "World::poll(None)"
        }
    ))
}

/// Reads of rank 1's memory while it computes.
fn get(world: &mut World, o: &Opts) -> Result<String, String> {
    let len = o.size.max(8);
    let e = |e: fabric_msg::Error| e.to_string();
    let mem = world.alloc_symmetric(len, Access::ReadWrite).map_err(e)?;
    let expect = pattern(1, 9, len);
    if world.rank() == 1 {
        mem.region().write_at(0, &expect).map_err(e)?;
    }
    world.barrier().map_err(e)?;
    let mut line = String::new();
    match world.rank() {
        0 => {
            let dst = world.event_loop().register(len, Access::Read).map_err(e)?;
            // Let rank 1 stop polling first.
            std::thread::sleep(Duration::from_millis(200));
            let started = Instant::now();
            let mut slowest = Duration::ZERO;
            for i in 0..o.reads.max(1) {
                let t = Instant::now();
                let local = dst.local(0, len).map_err(e)?;
                world.read(1, local, &mem, 0, Token(100 + i)).map_err(e)?;
                complete(world, &[Token(100 + i)], false)?;
                slowest = slowest.max(t.elapsed());
            }
            let took = started.elapsed();
            let mut got = vec![0u8; len];
            dst.read_at(0, &mut got).map_err(e)?;
            if got != expect {
                return Err("the bytes read are not rank 1's".into());
            }
            line = format!(
                "get: {} reads of {len} bytes from rank 1 while it computed {:.1} s: {:.1} us per read, slowest {:.1} ms, all within {:.3} s (progress thread: {})",
                o.reads.max(1),
                o.compute.as_secs_f64(),
                took.as_secs_f64() * 1e6 / o.reads.max(1) as f64,
                slowest.as_secs_f64() * 1e3,
                took.as_secs_f64(),
                world.event_loop().progress_thread()
            );
        }
        1 => compute(o.compute, o.spin),
        _ => {}
    }
    world.barrier().map_err(e)?;
    world.free_symmetric(mem).map_err(|(_, err)| err.to_string())?;
    Ok(line)
}

fn run(o: &Opts) -> Result<String, String> {
    let mut world = World::init().map_err(|e| format!("World::init: {e}"))?;
    if world.size() < 2 {
        return Err("run at least 2 ranks".into());
    }
    let line = match o.case.as_str() {
        "peer" => peer(&mut world, o),
        "flood" => flood(&mut world, o),
        "ring" => ring(&mut world, o),
        "get" => get(&mut world, o),
        other => Err(format!("unknown case {other}\n{USAGE}")),
    };
    let line = match line {
        Ok(l) => l,
        Err(e) => return Err(format!("rank {}: {e}", world.rank())),
    };
    let provider = world.profile().provider.clone();
    world.finish().map_err(|e| format!("finish: {e}"))?;
    Ok(if line.is_empty() {
        line
    } else {
        format!("{line} [{provider}]")
    })
}

fn main() -> ExitCode {
    let o = match parse() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    match run(&o) {
        Ok(line) => {
            if !line.is_empty() {
                println!("{line}");
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("Error: {e}");
            ExitCode::FAILURE
        }
    }
}
