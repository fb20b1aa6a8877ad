//! A message larger than its receive, from a peer in another process: the
//! receive completes as `Truncated` naming both sizes, and the next message
//! on the same tag arrives intact, for each size class of each provider's
//! protocols (inject, eager, segmented, rendezvous), with the receive posted
//! before the message arrives and after.
//!
//! The receiver is the child process (`FABRIC_MSG_TEST_TRUNC`), so a crash
//! or a hang inside libfabric (what libfabric 1.17's ofi_rxm and shm did,
//! docs/decisions.md) fails the test with the child's status instead of
//! taking the harness down or stalling it.

use crate::common;
use common::*;
use fabric_msg::{
    connect, Buffer, CompletionError, EventLoop, Listener, LoopConfig, RecvOpts, SendOpts, Token,
};
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const ENV: &str = "FABRIC_MSG_TEST_TRUNC";

/// (message, receive) sizes: inject, eager/above shm's 4 KiB inject size,
/// ofi_rxm's segments cut in the first and in a later segment, rendezvous.
const CASES: [(usize, usize); 6] = [
    (100, 10),
    (4097, 4096),
    (20_000, 4096),
    (70_000, 20_000),
    (70_000, 4096),
    (1 << 20, 4096),
];

/// One line to the parent, past the harness's capture.
fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "trunc: {line}").unwrap();
    out.flush().unwrap();
}

/// The receiver; a no-op unless the parent asked for it. For each case and
/// order it posts a small receive and a fitting one on the same tag, the
/// parent sends the oversized message and then a fitting one.
#[test]
#[ignore = "child role: run by the truncation_on_* tests through current_exe()"]
fn receiver_role() {
    let Ok(spec) = std::env::var(ENV) else { return };
    let (provider, addr) = spec.split_once(',').unwrap();
    let mut ev = EventLoop::new(&profile(provider), config()).unwrap();
    let ep = ev.open_endpoint().unwrap();
    let _peer = connect(&mut ev, ep, addr, TIMEOUT).unwrap();
    let mut lines = std::io::stdin().lock().lines();
    say("ready");
    for (i, &(msg, small)) in CASES.iter().chain(CASES.iter()).enumerate() {
        let late = i >= CASES.len();
        let tag = i as u64;
        let post = |ev: &mut EventLoop| {
            let opts = || RecvOpts {
                tag: Some((tag, 0)),
                from: None,
            };
            ev.recv(ep, Buffer::new(small), opts(), Token(1)).unwrap();
            ev.recv(ep, Buffer::new(msg), opts(), Token(2)).unwrap();
        };
        if late {
            // The parent sent both first: they wait as unexpected messages.
            assert_eq!(lines.next().unwrap().unwrap(), "sent");
            std::thread::sleep(Duration::from_millis(50));
            post(&mut ev);
        } else {
            post(&mut ev);
            say("posted");
        }
        let mut got = wait_n(&mut ev, 2);
        got.sort_by_key(|c| c.token.0);
        let (cut, whole) = (&got[0], &got[1]);
        let verdict = match &cut.result {
            Err(CompletionError::Truncated {
                message_len,
                buffer_len,
            }) if *buffer_len == small && (message_len.is_none() || *message_len == Some(msg)) => {
                let text = cut.result.as_ref().unwrap_err().to_string();
                if !text.contains(&format!("truncated to the {small}-byte buffer")) {
                    format!("FAIL the error does not name the buffer: {text}")
                } else {
                    match (&whole.result, whole.buffer.as_ref()) {
                        (Ok(()), Some(b)) if b.as_slice() == pattern(tag, msg) => {
                            format!("ok message_len {message_len:?}")
                        }
                        (Ok(()), Some(b)) => {
                            format!("FAIL the next message arrived damaged ({} bytes)", b.len())
                        }
                        (r, _) => format!("FAIL the next message: {r:?}"),
                    }
                }
            }
            other => format!("FAIL expected Truncated of {msg} into {small}, got {other:?}"),
        };
        say(&format!("case {msg} into {small} late={late}: {verdict}"));
    }
    say("done");
}

/// A peer timeout far above the default 10 s: on a machine loaded 10 times
/// over its cores a process can go that long without a heartbeat.
fn config() -> LoopConfig {
    LoopConfig {
        peer_timeout: Some(Duration::from_secs(120)),
        ..LoopConfig::default()
    }
}

/// The receiver process, killed if the test ends (a failed assertion)
/// while it still runs: no rank is left spinning after its test.
struct Receiver(std::process::Child);

impl Drop for Receiver {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

fn run(provider: &str) {
    let mut ev = EventLoop::new(&profile(provider), config()).unwrap();
    let ep = ev.open_endpoint().unwrap();
    let listener = Listener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let mut receiver = Receiver(
        Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                &test_name(module_path!(), "receiver_role"),
                "--ignored",
                "--test-threads=1",
                "--nocapture",
            ])
            .env(ENV, format!("{provider},{addr}"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn the receiver process"),
    );
    let child = &mut receiver.0;
    let mut to_child = child.stdin.take().unwrap();
    let from_child = BufReader::new(child.stdout.take().unwrap());
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in from_child.lines().map_while(Result::ok) {
            // The harness may print "test receiver_role ... " before it.
            if let Some((_, l)) = line.split_once("trunc: ") {
                let _ = tx.send(l.to_string());
            }
        }
    });
    let peer = listener.accept(&mut ev, ep).unwrap();
    let mut out = Vec::new();
    // Poll (so sends progress) until the child's next line.
    let mut next_line = |ev: &mut EventLoop, child: &mut std::process::Child| -> String {
        let t = Instant::now();
        loop {
            if let Ok(l) = rx.try_recv() {
                return l;
            }
            if let Some(status) = child.try_wait().unwrap() {
                // Its last lines may still be in the reader thread's hands:
                // that thread ends (and the channel closes) at end of file.
                match rx.recv_timeout(Duration::from_secs(10)) {
                    Ok(l) => return l,
                    Err(_) => {
                        panic!("{provider}: the receiver ended with {status} (crashed inside libfabric?)")
                    }
                }
            }
            if t.elapsed() > TIMEOUT {
                let _ = child.kill();
                panic!("{provider}: the receiver said nothing for {TIMEOUT:?} (hung inside libfabric?)");
            }
            ev.poll(&mut out, Some(Duration::from_millis(5))).unwrap();
            for c in out.drain(..) {
                // The sender may or may not hear of the truncation.
                if let Err(e) = &c.result {
                    assert!(
                        matches!(e, CompletionError::Truncated { .. }),
                        "{provider}: send failed: {e}"
                    );
                }
            }
        }
    };
    assert_eq!(next_line(&mut ev, child), "ready");
    let mut failures = Vec::new();
    for (i, &(msg, _)) in CASES.iter().chain(CASES.iter()).enumerate() {
        let late = i >= CASES.len();
        let tag = i as u64;
        if !late {
            assert_eq!(next_line(&mut ev, child), "posted");
        }
        for _ in 0..2 {
            let opts = SendOpts {
                tag: Some(tag),
                data: None,
            };
            ev.send(
                &peer,
                Buffer::from_slice(&pattern(tag, msg)),
                opts,
                Token(i as u64),
            )
            .unwrap();
        }
        if late {
            writeln!(to_child, "sent").unwrap();
        }
        let verdict = next_line(&mut ev, child);
        eprintln!("{provider}: {verdict}");
        if !verdict.contains(": ok") {
            failures.push(verdict);
        }
    }
    assert_eq!(next_line(&mut ev, child), "done");
    let status = child.wait().unwrap();
    assert!(failures.is_empty(), "{provider}: {failures:#?}");
    assert!(status.success(), "{provider}: the receiver ended with {status}");
}

#[test]
fn truncation_on_tcp_rxm() {
    run("tcp;ofi_rxm");
}

#[test]
fn truncation_on_shm() {
    run("shm");
}

#[test]
fn truncation_on_tcp() {
    if !tcp_has_rdm() {
        skipped(
            "truncation_on_tcp",
            "tcp has RDM endpoints of its own from libfabric 1.18",
        );
        return;
    }
    run("tcp");
}

#[test]
fn truncation_on_sockets() {
    run("sockets");
}

/// rxd cuts silently; fabric-msg's frame header says how much was sent.
#[test]
fn truncation_on_udp_rxd() {
    run("udp;ofi_rxd");
}
