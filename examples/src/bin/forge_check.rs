//! `forge_check`: a World's own tag classes under attack, as a program of
//! the World (4 ranks or more) sees them.
//!
//! 1. Every rank tries to send, inject and receive in every one of the
//!    World's reserved tag classes through `World::event_loop()`; each post
//!    must be refused, naming the class.
//! 2. Where the provider says who sent a message (`FI_SOURCE`), the last
//!    rank opens a second endpoint of its own (outside the World, as any
//!    process on the fabric could) and sends rank 0 messages in the World's
//!    collective class that claim to come from rank 1, for every step of
//!    the second collective, each the size of its messages. Then every rank
//!    runs a barrier (the first collective) and an allreduce of 4 u64 (the
//!    second), and checks the sum against the one it computes itself.
//!    Without `FI_SOURCE` (tcp;ofi_rxm on libfabric 1.17) a message from
//!    outside cannot be told from a rank's, and the step is skipped, saying
//!    so (docs/reliability.md, "Who can send what").
//!
//! A rank prints `forge_check: rank R: allreduce ok`, or the error it got;
//! a wrong result is printed as `WRONG` and fails the run. Where the forged
//! messages were sent, rank 0 drops the first that arrives and the
//! collective fails on every rank, naming it; no rank may ever see a wrong
//! sum.
//!
//! ```text
//! mpirun -np 4 target/debug/forge_check
//! ```

use fabric_msg::{Buffer, EventLoop, LoopConfig, Op, RecvOpts, SendOpts, Token, World};
use std::process::ExitCode;
use std::time::{Duration, Instant};

const N: usize = 4;
const NAME_TAG: u32 = 7;
const READY_TAG: u32 = 8;

fn main() -> ExitCode {
    let mut w = match World::init() {
        Ok(w) => w,
        Err(e) => {
            eprintln!("forge_check: {e}");
            return ExitCode::FAILURE;
        }
    };
    let (rank, size) = (w.rank(), w.size());
    let say = |what: &str| println!("forge_check: rank {rank}: {what}");
    if size < 2 {
        say("needs 2 ranks or more");
        return ExitCode::FAILURE;
    }
    // 1. The application's posts in the World's classes.
    let refused = match refuse_reserved(&mut w) {
        Ok(n) => n,
        Err(e) => {
            say(&format!("FAILED: {e}"));
            return ExitCode::FAILURE;
        }
    };
    say(&format!("{refused} posts in reserved classes refused"));

    // 2. A forger outside the World.
    let forger = size - 1;
    let outcome = if !w.profile().source {
        if rank == 0 {
            say(&format!(
                "SKIPPED the outside forger: {} reports no sender (no FI_SOURCE), so a message from outside \
                 the World cannot be told from a rank's",
                w.profile().provider
            ));
        }
        Ok(Vec::new())
    } else if rank == 0 {
        let ep = w.endpoint();
        let name = w.event_loop().endpoint_name(ep).expect("own name");
        send_and_wait(&mut w, forger, NAME_TAG, &name).and_then(|()| recv_one(&mut w, forger, READY_TAG))
    } else if rank == forger {
        recv_one(&mut w, 0, NAME_TAG).and_then(|name| {
            let sent = forge(&w, &name)?;
            say(&format!("{sent} forged messages sent to rank 0"));
            send_and_wait(&mut w, 0, READY_TAG, b"ready").map(|()| name)
        })
    } else {
        Ok(Vec::new())
    };
    if let Err(e) = outcome {
        say(&format!("FAILED before the allreduce: {e}"));
        return ExitCode::FAILURE;
    }
    let mut v: Vec<u64> = (0..N as u64).map(|i| i * 1000 + u64::from(rank)).collect();
    let want: Vec<u64> = (0..N as u64)
        .map(|i| (0..u64::from(size)).map(|r| i * 1000 + r).sum())
        .collect();
    if let Err(e) = w.barrier() {
        say(&format!("barrier failed: {e}"));
        return ExitCode::from(3);
    }
    match w.allreduce(&mut v, Op::Sum) {
        Ok(()) if v == want => say("allreduce ok"),
        Ok(()) => {
            let bad = v.iter().zip(&want).position(|(a, b)| a != b).unwrap_or(0);
            say(&format!(
                "WRONG allreduce result at {bad}: {:#x}, not {:#x}",
                v[bad], want[bad]
            ));
            return ExitCode::FAILURE;
        }
        Err(e) => {
            say(&format!("allreduce failed: {e}"));
            return ExitCode::from(3);
        }
    }
    match w.finish() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            say(&format!("finish failed: {e}"));
            ExitCode::from(3)
        }
    }
}

/// Try every way an application could post in a reserved class; count the
/// refusals (every one must be refused, naming the class).
fn refuse_reserved(w: &mut World) -> Result<usize, String> {
    let next = (w.rank() + 1) % w.size();
    let peer = *w.peer(next).map_err(|e| e.to_string())?;
    let ep = w.endpoint();
    let ev = w.event_loop();
    let mut refused = 0;
    for class in 1..=255u64 {
        let tag = class << 56 | 1 << 32 | 0x1001;
        let opts = SendOpts {
            tag: Some(tag),
            data: None,
        };
        let named = |e: &dyn std::fmt::Display| {
            let s = e.to_string();
            if s.contains("reserved") || s.contains("World's own class") {
                Ok(())
            } else {
                Err(format!("class {class}: refused without naming the class: {s}"))
            }
        };
        match ev.send(&peer, Buffer::from_slice(&[0u8; 64]), opts, Token(1)) {
            Ok(()) => return Err(format!("a send in class {class} was posted")),
            Err(e) => named(&e.error)?,
        }
        match ev.inject(&peer, &[0u8; 8], opts) {
            Ok(()) => return Err(format!("an inject in class {class} was posted")),
            Err(e) => named(&e)?,
        }
        let ropts = RecvOpts {
            tag: Some((tag, 0)),
            from: None,
        };
        match ev.recv(ep, Buffer::new(64), ropts, Token(2)) {
            Ok(()) => return Err(format!("a receive in class {class} was posted")),
            Err(e) => named(&e.error)?,
        }
        refused += 3;
    }
    Ok(refused)
}

/// Send rank 0 messages in the World's collective class from an endpoint
/// outside the World, claiming rank 1 as their source.
fn forge(w: &World, rank0_name: &[u8]) -> Result<usize, String> {
    let agreement = w.peer(0).map_err(|e| e.to_string())?.agreement;
    let mut ev = EventLoop::new(w.profile(), LoopConfig::default()).map_err(|e| e.to_string())?;
    let ep = ev.open_endpoint().map_err(|e| e.to_string())?;
    let victim = ev
        .insert_peer(ep, rank0_name, agreement)
        .map_err(|e| e.to_string())?;
    let mut sent = 0;
    // The World's class (1), claiming rank 1; the second collective (the
    // first is the barrier), its first steps (world/tags.rs lays the tag out).
    for seq in 1..2u64 {
        for step in 0..8u64 {
            let tag = 1 << 56 | 1 << 32 | seq << 12 | step;
            let opts = SendOpts {
                tag: Some(tag),
                data: None,
            };
            ev.send(&victim, Buffer::from_slice(&[0x7f; N * 8]), opts, Token(sent))
                .map_err(|e| format!("the forger's send: {}", e.error))?;
            sent += 1;
        }
    }
    let mut done = 0;
    let mut out = Vec::new();
    let until = Instant::now() + Duration::from_secs(20);
    while done < sent && Instant::now() < until {
        ev.poll(&mut out, Some(Duration::from_millis(50)))
            .map_err(|e| e.to_string())?;
        for c in out.drain(..) {
            c.result.map_err(|e| format!("a forged send failed: {e}"))?;
            done += 1;
        }
    }
    if done < sent {
        return Err(format!("only {done} of {sent} forged sends completed in 20 s"));
    }
    Ok(sent as usize)
}

fn send_and_wait(w: &mut World, to: u32, tag: u32, bytes: &[u8]) -> Result<(), String> {
    w.send_buffer(to, tag, Buffer::from_slice(bytes), Token(10))
        .map_err(|e| e.error.to_string())?;
    wait_for(w, Token(10)).map(drop)
}

fn recv_one(w: &mut World, from: u32, tag: u32) -> Result<Vec<u8>, String> {
    w.recv_buffer(Some(from), Some(tag), Buffer::new(4096), Token(11))
        .map_err(|e| e.error.to_string())?;
    wait_for(w, Token(11))
}

fn wait_for(w: &mut World, t: Token) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    let until = Instant::now() + Duration::from_secs(30);
    while Instant::now() < until {
        w.poll(&mut out, Some(Duration::from_millis(100)))
            .map_err(|e| e.to_string())?;
        if let Some(c) = out.iter_mut().find(|c| c.token == t) {
            c.result.clone().map_err(|e| e.to_string())?;
            return Ok(c.buffer.take().map(|b| b.as_slice().to_vec()).unwrap_or_default());
        }
    }
    Err(format!("token {t:?} did not complete in 30 s"))
}
