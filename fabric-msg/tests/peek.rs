//! Peeks (`FI_PEEK`) on every provider here, for every protocol size class
//! (inject, eager, segmented, rendezvous): what the World's probe and
//! matched probe are built on, and what they rely on:
//! - a peek that finds nothing says so, and takes nothing;
//! - a peek reports a waiting message's tag and exact length, and leaves it
//!   waiting (a second peek finds it again); a masked one the oldest;
//! - a receive of exactly the reported tag and length then takes exactly
//!   that message, whole, and it waits no more.
//!
//! Where the provider cannot peek (shm before libfabric 1.19, endpoints
//! that frame messages) the loop refuses with the reason, and the test says
//! it was skipped.

use crate::common;
use common::*;
use fabric_msg::{Buffer, Completion, EventLoop, OpKind, RecvOpts, SendOpts, Token};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// (tag, length): one message of each size class.
const MESSAGES: [(u64, usize); 5] = [(1, 8), (2, 4000), (3, 20_000), (4, 70_000), (5, 1 << 20)];
/// A second message with tag 1, sent after the first.
const LATER: u64 = 100;

fn recv_opts(tag: u64) -> RecvOpts {
    RecvOpts {
        tag: Some((tag, 0)),
        ..Default::default()
    }
}

/// Peek for `tag` once: what it found (length, tag).
fn peek_once(ev: &mut EventLoop, ep: fabric_msg::EndpointId, tag: u64) -> Option<(usize, u64)> {
    ev.peek(ep, recv_opts(tag), Token(7)).expect("peek");
    let c = wait_kind(ev, OpKind::Peek);
    assert!(c.result.is_ok(), "peek {tag}: {:?}", c.result);
    Some((c.peeked?.len, c.tag))
}

/// Peek until a message with `tag` waits (it may still be on its way).
fn peek_until(ev: &mut EventLoop, ep: fabric_msg::EndpointId, tag: u64) -> (usize, u64) {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        if let Some(found) = peek_once(ev, ep, tag) {
            return found;
        }
        assert!(Instant::now() < deadline, "no message with tag {tag} ever waited");
        let mut out = Vec::new();
        ev.poll(&mut out, Some(Duration::from_millis(2))).expect("poll");
        assert!(out.is_empty(), "nothing else was posted: {out:?}");
    }
}

/// The next completion of `kind` (nothing else is in flight).
fn wait_kind(ev: &mut EventLoop, kind: OpKind) -> Completion {
    let c = wait_n(ev, 1).remove(0);
    assert_eq!(c.kind, kind, "{c:?}");
    c
}

fn run(provider: &'static str) {
    let p = profile(provider);
    let (go, went) = mpsc::channel::<bool>();
    // The receiver keeps its loop open until the sender has its
    // completions: libfabric 2.1's shm, with both endpoints in this one
    // process, crashed in the sender's fi_cq_read (SIGSEGV) while the
    // receiver's close unmapped its region (2 of 20 runs beside another
    // provider's test, 2026-11-28). Two processes each map the other's
    // region and do not meet this.
    let (finished, sender_done) = mpsc::channel::<()>();
    let (mut client, server) = pair(p.clone(), p, Default::default(), move |mut s: Side| {
        let ep = s.ep;
        if let Err(e) = s.ev.check_peek(ep) {
            skipped(&format!("peek_on_{provider}"), &e.to_string());
            let _ = go.send(false);
            return false;
        }
        // Nothing sent yet: nothing found, nothing taken.
        assert!(
            peek_once(&mut s.ev, ep, 1).is_none(),
            "{provider}: found a message never sent"
        );
        go.send(true).unwrap();
        for (tag, len) in MESSAGES {
            let (found, t) = peek_until(&mut s.ev, ep, tag);
            assert_eq!((found, t), (len, tag), "{provider}: the peek's length and tag");
            // Still waiting: found again.
            assert_eq!(
                peek_once(&mut s.ev, ep, tag),
                Some((len, tag)),
                "{provider}: a peek took the message it looked at"
            );
        }
        // A masked peek (any tag below 8) finds the oldest waiting message.
        s.ev.peek(
            ep,
            RecvOpts {
                tag: Some((0, 7)),
                ..Default::default()
            },
            Token(7),
        )
        .expect("peek");
        let c = wait_kind(&mut s.ev, OpKind::Peek);
        assert_eq!(
            (c.peeked.map(|p| p.len), c.tag),
            (Some(8), 1),
            "{provider}: the oldest message first"
        );
        for (tag, len) in MESSAGES {
            // A receive of exactly the peeked length takes exactly it.
            s.ev.recv(ep, Buffer::new(len), recv_opts(tag), Token(10))
                .expect("recv");
            let c = wait_kind(&mut s.ev, OpKind::Recv);
            assert!(c.result.is_ok(), "{provider} {len} B: {:?}", c.result);
            assert_eq!(c.tag, tag);
            let b = c.buffer.unwrap();
            assert!(
                b.as_slice() == pattern(tag, len),
                "{provider}: the receive of {len} B got other bytes"
            );
            if tag == 1 {
                // The second tag-1 message is next in line.
                assert_eq!(
                    peek_until(&mut s.ev, ep, 1),
                    (8, 1),
                    "{provider}: the later tag-1 message"
                );
                s.ev.recv(ep, Buffer::new(8), recv_opts(1), Token(11))
                    .expect("recv");
                let c = wait_kind(&mut s.ev, OpKind::Recv);
                assert_eq!(c.buffer.unwrap().as_slice(), pattern(LATER, 8));
            }
            assert!(
                peek_once(&mut s.ev, ep, tag).is_none(),
                "{provider}: tag {tag} is still waiting after its receive"
            );
        }
        // Err at once if the sender's side panicked (its end dropped).
        let _ = sender_done.recv_timeout(Duration::from_secs(60));
        true
    });
    if !went.recv().unwrap() {
        server.join().expect("server");
        return;
    }
    let mut sent = 0;
    for (tag, len) in MESSAGES {
        let opts = SendOpts {
            tag: Some(tag),
            data: None,
        };
        client
            .ev
            .send(
                &client.peer,
                Buffer::from_slice(&pattern(tag, len)),
                opts,
                Token(tag),
            )
            .unwrap();
        sent += 1;
        if tag == 1 {
            // One peer's messages of one tag match in the order sent.
            let opts = SendOpts {
                tag: Some(1),
                data: None,
            };
            client
                .ev
                .send(
                    &client.peer,
                    Buffer::from_slice(&pattern(LATER, 8)),
                    opts,
                    Token(LATER),
                )
                .unwrap();
            sent += 1;
        }
    }
    let done = wait_n(&mut client.ev, sent);
    assert!(done.iter().all(|c| c.result.is_ok()), "{done:?}");
    let _ = finished.send(()); // the receiver may have failed: its join says
    if server.join().expect("server") {
        eprintln!("{provider}: peeks held for every size class");
    }
}

#[test]
fn peek_on_tcp_rxm() {
    run("tcp;ofi_rxm");
}

#[test]
fn peek_on_shm() {
    run("shm");
}

#[test]
fn peek_on_sockets() {
    run("sockets");
}

#[test]
fn peek_on_udp_rxd() {
    run("udp;ofi_rxd");
}
