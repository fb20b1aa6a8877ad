//! `short_recv`: a World receive smaller than the message sent to it. Rank
//! 0 sends rank 1, for each size class of the fabric's protocols (inject,
//! eager, segmented, rendezvous), a message larger than the receive rank 1
//! posted for it, then one that fits, on the same tag. Rank 1 checks that
//! the first completes as `Truncated` naming both sizes and the second
//! arrives intact. Prints one line per rank; non-zero exit otherwise.
//!
//! `--to R` makes rank `R` the receiver (rank 1 by default; the other
//! ranks wait); `--any-source` posts its receives from any rank, so on a
//! World over several nodes they wait for the node's messages and the
//! fabric's at once.
//!
//! ```text
//! mpirun -np 2 target/release/short_recv
//! mpirun -np 2 -x FABRIC_MSG_SHM=0 target/release/short_recv
//! mpirun -np 4 sh -c 'FABRIC_MSG_NODE=node$((OMPI_COMM_WORLD_RANK / 2)) exec target/release/short_recv --to 2 --any-source'
//! ```

use fabric_msg::{Buffer, Completion, CompletionError, Token, World};
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// (message, receive) sizes.
const CASES: [(usize, usize); 6] = [
    (100, 10),
    (4097, 4096),
    (20_000, 4096),
    (70_000, 20_000),
    (70_000, 4096),
    (1 << 20, 4096),
];

fn pattern(seq: usize, len: usize) -> Vec<u8> {
    (0..len).map(|i| (seq * 31 + i * 7) as u8).collect()
}

/// Poll until `n` completions arrived, or fail after 60 s.
fn wait(world: &mut World, n: usize) -> Result<Vec<Completion>, String> {
    let (mut got, mut batch) = (Vec::new(), Vec::new());
    let t = Instant::now();
    while got.len() < n {
        if t.elapsed() > Duration::from_secs(60) {
            return Err(format!("{} of {n} completions in 60 s", got.len()));
        }
        // (poll empties the batch it is given)
        world
            .poll(&mut batch, Some(Duration::from_millis(100)))
            .map_err(|e| e.to_string())?;
        got.append(&mut batch);
    }
    Ok(got)
}

/// Who receives, and from whom its receives are posted.
struct Roles {
    to: u32,
    any_source: bool,
}

fn sender(world: &mut World, roles: &Roles) -> Result<String, String> {
    let to = roles.to;
    for (i, &(msg, _)) in CASES.iter().enumerate() {
        // The receiver says when its receives are posted.
        world
            .recv_buffer(Some(to), Some(1000 + i as u32), Buffer::new(8), Token(9))
            .map_err(|e| e.error.to_string())?;
        wait(world, 1)?;
        for k in 0..2 {
            world
                .send_buffer(to, i as u32, Buffer::from_slice(&pattern(i, msg)), Token(k))
                .map_err(|e| e.error.to_string())?;
        }
        for c in wait(world, 2)? {
            // The sender may or may not hear of the truncation.
            match c.result {
                Ok(()) | Err(CompletionError::Truncated { .. }) => {}
                Err(e) => return Err(format!("a send of {msg} bytes failed: {e}")),
            }
        }
    }
    Ok(format!(
        "{} oversized messages sent, each followed by one that fits",
        CASES.len()
    ))
}

fn receiver(world: &mut World, roles: &Roles) -> Result<String, String> {
    let from = (!roles.any_source).then_some(0);
    for (i, &(msg, small)) in CASES.iter().enumerate() {
        let tag = Some(i as u32);
        world
            .recv_buffer(from, tag, Buffer::new(small), Token(1))
            .map_err(|e| e.error.to_string())?;
        world
            .recv_buffer(from, tag, Buffer::new(msg), Token(2))
            .map_err(|e| e.error.to_string())?;
        world
            .send_buffer(0, 1000 + i as u32, Buffer::from_slice(b"posted"), Token(3))
            .map_err(|e| e.error.to_string())?;
        let mut got = wait(world, 3)?;
        got.retain(|c| c.token != Token(3));
        got.sort_by_key(|c| c.token.0);
        match &got[0].result {
            Err(CompletionError::Truncated {
                message_len,
                buffer_len,
            }) if *buffer_len == small && message_len.unwrap_or(msg) == msg => {}
            other => {
                return Err(format!(
                    "{msg} bytes into {small}: expected Truncated, got {other:?}"
                ))
            }
        }
        match (&got[1].result, got[1].buffer.as_ref()) {
            (Ok(()), Some(b)) if b.as_slice() == pattern(i, msg) && world.source(&got[1]) == 0 => {}
            (r, b) => {
                return Err(format!(
                    "the message after {msg} bytes into {small}: {r:?}, {:?} bytes",
                    b.map(Buffer::len)
                ))
            }
        }
    }
    Ok(format!(
        "{} truncations reported with both sizes, each next message intact",
        CASES.len()
    ))
}

fn main() -> ExitCode {
    let mut roles = Roles {
        to: 1,
        any_source: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--any-source" => roles.any_source = true,
            "--to" => match args.next().and_then(|r| r.parse().ok()) {
                Some(r) if r > 0 => roles.to = r,
                _ => {
                    eprintln!("short_recv: --to takes a rank above 0 (rank 0 sends)");
                    return ExitCode::FAILURE;
                }
            },
            other => {
                eprintln!(
                    "short_recv: unknown argument {other:?}; usage: short_recv [--to RANK] [--any-source]"
                );
                return ExitCode::FAILURE;
            }
        }
    }
    let mut world = match World::init() {
        Ok(w) => w,
        Err(e) => {
            eprintln!("short_recv: {e}");
            return ExitCode::FAILURE;
        }
    };
    let (rank, size) = (world.rank(), world.size());
    let mut provider = world.profile().provider.clone();
    if world.one_engine() {
        provider.push_str(", one matching engine");
    }
    let outcome = match rank {
        _ if roles.to >= size => Err(format!("--to {}: the World has {size} ranks", roles.to)),
        0 => sender(&mut world, &roles),
        r if r == roles.to => receiver(&mut world, &roles),
        _ => Ok("idle".into()),
    };
    let finished = world.finish().map_err(|e| e.to_string());
    match outcome.and_then(|line| finished.map(|()| line)) {
        Ok(line) => {
            println!("rank {rank}/{size}: {line} ({provider})");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("short_recv: rank {rank}: {e}");
            ExitCode::FAILURE
        }
    }
}
