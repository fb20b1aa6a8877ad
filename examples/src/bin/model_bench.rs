//! What the programming model costs against the token interface, side by
//! side in one run on 2 ranks: ping-pong latency (half the round trip) and
//! message rate (windows of 64 sends, one ack per window) at each size,
//! each measured with the typed requests (`irecv` + `send` + `wait`,
//! `isend` × 64 + `wait_all`) and with `send_buffer`/`recv_buffer` +
//! `poll` on reused `Buffer`s, alternately, ROUNDS times.
//!
//! ```text
//! mpirun -np 2 model_bench [-S 8,65536] [-I 20000] [-r 3]
//! ```
//!
//! Prints one JSON object per (size, kind, interface, round):
//! `{"bytes", "kind": "latency"|"rate", "api": "typed"|"token", "round",
//! "us"}` (µs per one-way message, or per message in a window).

use fabric_msg::{Buffer, Completion, Token, World};
use std::process::ExitCode;
use std::time::{Duration, Instant};

const TAG: u32 = 21;
const ACK: u32 = 22;
const WINDOW: usize = 64;

fn take(world: &mut World, out: &mut Vec<Completion>, want: Token) -> fabric_msg::Result<Option<Buffer>> {
    loop {
        if let Some(i) = out.iter().position(|c| c.token == want) {
            let c = out.swap_remove(i);
            if let Err(e) = &c.result {
                return Err(fabric_msg::Error::Usage(format!("{want:?}: {e}")));
            }
            return Ok(c.buffer);
        }
        let mut more = Vec::new();
        world.poll(&mut more, Some(Duration::from_secs(10)))?;
        out.extend(more);
    }
}

fn latency_typed(world: &mut World, bytes: usize, iters: usize) -> fabric_msg::Result<f64> {
    let peer = 1 - world.rank();
    let tx = vec![7u8; bytes];
    let mut rx = Some(vec![0u8; bytes]);
    let t = Instant::now();
    for _ in 0..iters {
        let r = world.irecv(Some(peer), Some(TAG), rx.take().unwrap_or_default())?;
        if world.rank() == 0 {
            world.send(peer, TAG, &tx)?;
            rx = Some(world.wait(r)?);
        } else {
            rx = Some(world.wait(r)?);
            world.send(peer, TAG, &tx)?;
        }
    }
    Ok(t.elapsed().as_secs_f64() * 1e6 / (2 * iters) as f64)
}

fn latency_token(world: &mut World, bytes: usize, iters: usize) -> fabric_msg::Result<f64> {
    let peer = 1 - world.rank();
    let mut out = Vec::new();
    let (mut tx, mut rx) = (
        Some(Buffer::from_slice(&vec![7u8; bytes])),
        Some(Buffer::new(bytes)),
    );
    let err = |e: fabric_msg::PostError| e.error;
    let t = Instant::now();
    for _ in 0..iters {
        let b = rx.take().unwrap_or_else(|| Buffer::new(bytes));
        world
            .recv_buffer(Some(peer), Some(TAG), b, Token(1))
            .map_err(err)?;
        let send = |world: &mut World, tx: &mut Option<Buffer>| {
            let b = tx.take().unwrap_or_else(|| Buffer::new(bytes));
            world.send_buffer(peer, TAG, b, Token(2)).map_err(err)
        };
        if world.rank() == 0 {
            send(world, &mut tx)?;
            rx = take(world, &mut out, Token(1))?;
        } else {
            rx = take(world, &mut out, Token(1))?;
            send(world, &mut tx)?;
        }
        tx = take(world, &mut out, Token(2))?;
        if let Some(b) = rx.as_mut() {
            b.set_len(bytes);
        }
    }
    Ok(t.elapsed().as_secs_f64() * 1e6 / (2 * iters) as f64)
}

fn rate_typed(world: &mut World, bytes: usize, windows: usize) -> fabric_msg::Result<f64> {
    let tx = vec![7u8; bytes];
    let mut spare: Vec<Vec<u8>> = (0..WINDOW).map(|_| vec![0u8; bytes]).collect();
    let t = Instant::now();
    for _ in 0..windows {
        if world.rank() == 0 {
            let reqs = (0..WINDOW)
                .map(|_| world.isend(1, TAG, &tx))
                .collect::<Result<Vec<_>, _>>()?;
            world.wait_all(reqs)?;
            world.recv(Some(1), Some(ACK), &mut [0u8; 1])?;
        } else {
            let reqs = spare
                .drain(..)
                .map(|v| world.irecv(Some(0), Some(TAG), v))
                .collect::<Result<Vec<_>, _>>()?;
            spare = world.wait_all(reqs)?;
            world.send(0, ACK, &[1u8])?;
        }
    }
    Ok(t.elapsed().as_secs_f64() * 1e6 / (windows * WINDOW) as f64)
}

fn rate_token(world: &mut World, bytes: usize, windows: usize) -> fabric_msg::Result<f64> {
    let mut out = Vec::new();
    let err = |e: fabric_msg::PostError| e.error;
    let mut bufs: Vec<Buffer> = (0..WINDOW)
        .map(|_| Buffer::from_slice(&vec![7u8; bytes]))
        .collect();
    let t = Instant::now();
    for _ in 0..windows {
        for (k, b) in bufs.drain(..).enumerate() {
            let tok = Token(100 + k as u64);
            if world.rank() == 0 {
                world.send_buffer(1, TAG, b, tok).map_err(err)?;
            } else {
                world.recv_buffer(Some(0), Some(TAG), b, tok).map_err(err)?;
            }
        }
        for k in 0..WINDOW {
            let mut b = take(world, &mut out, Token(100 + k as u64))?.unwrap_or_else(|| Buffer::new(bytes));
            b.set_len(bytes);
            bufs.push(b);
        }
        if world.rank() == 0 {
            world
                .recv_buffer(Some(1), Some(ACK), Buffer::new(1), Token(9))
                .map_err(err)?;
            take(world, &mut out, Token(9))?;
        } else {
            world
                .send_buffer(0, ACK, Buffer::from_slice(&[1]), Token(9))
                .map_err(err)?;
            take(world, &mut out, Token(9))?;
        }
    }
    Ok(t.elapsed().as_secs_f64() * 1e6 / (windows * WINDOW) as f64)
}

fn run(world: &mut World, sizes: &[usize], iters: usize, rounds: usize) -> fabric_msg::Result<()> {
    for &bytes in sizes {
        let n = if bytes > 8192 { iters / 10 } else { iters }.max(10);
        // Warm-up: pools, slots, connections.
        latency_typed(world, bytes, n / 10 + 1)?;
        latency_token(world, bytes, n / 10 + 1)?;
        for round in 0..rounds {
            for (kind, api) in [
                ("latency", "typed"),
                ("latency", "token"),
                ("rate", "typed"),
                ("rate", "token"),
            ] {
                world.barrier()?;
                let us = match (kind, api) {
                    ("latency", "typed") => latency_typed(world, bytes, n)?,
                    ("latency", _) => latency_token(world, bytes, n)?,
                    (_, "typed") => rate_typed(world, bytes, n / WINDOW + 1)?,
                    _ => rate_token(world, bytes, n / WINDOW + 1)?,
                };
                if world.rank() == 0 {
                    println!(
                        "{}",
                        serde_json::json!({"bytes": bytes, "kind": kind, "api": api, "round": round, "us": us})
                    );
                }
            }
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let get = |flag: &str| args.iter().position(|a| a == flag).and_then(|i| args.get(i + 1));
    if args.iter().any(|a| a == "-h" || a == "--help") {
        println!(
            "model_bench [-S 8,65536] [-I 20000] [-r 3]: typed requests against the token interface, 2 ranks"
        );
        return ExitCode::SUCCESS;
    }
    let sizes: Vec<usize> = get("-S")
        .map_or("8,65536", String::as_str)
        .split(',')
        .filter_map(|s| s.parse().ok())
        .collect();
    let iters = get("-I").and_then(|s| s.parse().ok()).unwrap_or(20_000);
    let rounds = get("-r").and_then(|s| s.parse().ok()).unwrap_or(3);
    let mut world = match World::init() {
        Ok(w) => w,
        Err(e) => {
            eprintln!("model_bench: {e}");
            return ExitCode::FAILURE;
        }
    };
    if world.size() != 2 {
        eprintln!("model_bench: run it on 2 ranks (this world has {})", world.size());
        return ExitCode::from(2);
    }
    let outcome = run(&mut world, &sizes, iters, rounds);
    let finished = world.finish();
    match outcome.and(finished) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("model_bench: {e}");
            ExitCode::FAILURE
        }
    }
}
