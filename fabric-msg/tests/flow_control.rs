//! Flow control on a provider with bounded unexpected-message space (shm
//! in libfabric 1.17 takes `rx_size` messages that arrived before their
//! receive, then refuses the sender with `FI_EAGAIN`; its posted receives
//! and those messages share one pool, so a receive post then fails with
//! `FI_ENOMEM`). Sends the provider has no room for wait in the loop's
//! backlog instead of holding the caller; receives are retried after
//! progress; what never fits is reported naming the libfabric call.

use crate::common;
use common::*;
use fabric_msg::{Buffer, Completion, Error, LoopConfig, OpKind, RecvOpts, SendOpts, Token};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The provider's receive queue (and so shm's unexpected-message room).
const DEPTH: usize = 64;

/// One shm pair at a time: pairs flooding each other in one process
/// interfered (a draining backlog saw its peer take nothing for over 2 s
/// while another test's pair flooded; alone, never in 6 runs).
static SHM: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_shm_pair() -> std::sync::MutexGuard<'static, ()> {
    SHM.lock().unwrap_or_else(|p| p.into_inner())
}
const LEN: usize = 4096;
const TAG: u64 = 7;

fn opts() -> SendOpts {
    SendOpts {
        tag: Some(TAG),
        data: None,
    }
}

fn numbered(seq: u64) -> Buffer {
    let mut b = Buffer::from_slice(&pattern(seq, LEN));
    b.as_mut_slice()[..8].copy_from_slice(&seq.to_le_bytes());
    b
}

/// Poll until `want` completions of kind `kind` arrived; the others are dropped.
fn collect(ev: &mut fabric_msg::EventLoop, kind: OpKind, want: usize) -> Vec<Completion> {
    let deadline = Instant::now() + TIMEOUT;
    let (mut got, mut out) = (Vec::new(), Vec::new());
    while got.len() < want {
        assert!(
            Instant::now() < deadline,
            "{} of {want} {kind:?} completions",
            got.len()
        );
        ev.poll(&mut out, Some(Duration::from_millis(20))).expect("poll");
        got.extend(out.drain(..).filter(|c| c.kind == kind));
    }
    got
}

/// 10 times the receiver's room, sent at once to a peer that is not yet
/// polling: every `send` returns (none waits for room), and once
/// the peer receives, every message arrives, in order, each send
/// completing successfully; an `inject` made after them to the same peer
/// waits for them and arrives last.
#[test]
fn a_flood_of_unexpected_messages_waits_in_the_backlog_and_arrives_in_order() {
    flood(LoopConfig::default(), None);
}

/// The same flood drained slowly (a pause every 8 messages), for
/// longer than `post_timeout`: a backlog that keeps draining never times
/// out; the timeout is for a peer that takes nothing.
#[test]
fn a_backlog_that_drains_slowly_does_not_time_out() {
    // Two seconds: on this loaded 2-core machine (other builds, and every
    // test's loops spinning) a thread went without the CPU for over one,
    // which is no peer refusing.
    let timeout = Duration::from_secs(2);
    let cfg = LoopConfig {
        post_timeout: Some(timeout),
        ..Default::default()
    };
    let started = Instant::now();
    flood(cfg, Some(Duration::from_millis(40)));
    let took = started.elapsed();
    assert!(
        took > timeout + timeout / 2,
        "drained in {took:?}, too fast to show it"
    );
}

fn flood(cfg: LoopConfig, pace: Option<Duration>) {
    let _one = one_shm_pair();
    const N: u64 = 10 * DEPTH as u64;
    let p = profile_with("shm", DEPTH);
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let (mut c, server) = pair(p.clone(), p, cfg, move |mut s| {
        go_rx.recv().expect("go");
        let mut next = 0u64;
        let mut out = Vec::new();
        let any = RecvOpts {
            tag: Some((TAG, 0)),
            ..Default::default()
        };
        for _ in 0..DEPTH / 2 {
            s.ev.recv(s.ep, Buffer::new(LEN), any, Token(1)).expect("recv");
        }
        let deadline = Instant::now() + TIMEOUT;
        while next <= N {
            assert!(Instant::now() < deadline, "received {next} of {N}");
            s.ev.poll(&mut out, Some(Duration::from_millis(20)))
                .expect("poll");
            for c in out.drain(..) {
                c.result.as_ref().expect("receive");
                let b = c.buffer.expect("buffer");
                let seq = u64::from_le_bytes(b.as_slice()[..8].try_into().expect("8 bytes"));
                assert_eq!(seq, next, "matched out of order");
                assert_eq!(
                    b.as_slice()[8..],
                    numbered(seq).as_slice()[8..],
                    "message {seq} damaged"
                );
                next += 1;
                if let Some(pause) = pace.filter(|_| next % 8 == 0) {
                    std::thread::sleep(pause);
                }
                s.ev.recv(s.ep, b, any, Token(1)).expect("recv again");
            }
        }
        s
    });
    // Before the backlog, the send that found shm's room full spun for
    // `post_timeout` and failed with QueueFull: nobody was receiving yet.
    for seq in 0..N {
        c.ev.send(&c.peer, numbered(seq), opts(), Token(seq))
            .expect("send");
    }
    go_tx.send(()).expect("go");
    c.ev.inject(&c.peer, numbered(N).as_slice(), opts())
        .expect("inject after the backlog");
    let done = collect(&mut c.ev, OpKind::Send, N as usize);
    for d in &done {
        d.result
            .as_ref()
            .unwrap_or_else(|e| panic!("send {:?}: {e}", d.token));
    }
    // Both loops close once both sides are done (shm 1.17 crashes when a
    // loop closes while its peer in the same process still polls).
    let s = server.join().expect("server");
    // What a user reads of it: every message counted once each way, the
    // refusals the backlog absorbed, how long the oldest send waited.
    let (sent, received) = (c.ev.stats(), s.ev.stats());
    assert_eq!(sent.sent.messages, N + 1, "{sent:?}");
    assert_eq!(sent.sent.bytes, (N + 1) * LEN as u64);
    assert_eq!(received.received.messages, N + 1, "{received:?}");
    assert!(sent.retries > 0, "the flood met a full queue: {sent:?}");
    assert!(sent.longest_backlog_wait > Duration::ZERO, "{sent:?}");
    assert_eq!(sent.backlogged, 0, "the backlog drained");
    drop((c, s));
}

/// A peer that polls but never posts a receive, so never makes room: the sends that did not fit complete with
/// `NotPosted` naming `fi_tsend` after `post_timeout`, their buffers
/// handed back; the caller is never held.
#[test]
fn a_send_the_peer_never_makes_room_for_completes_not_posted() {
    if fabric_msg::ffi::runtime_version() >= (2, 0) {
        // shm of libfabric 2.1 took all the sends as unexpected messages (it
        // refused none), then the process died of SIGSEGV inside libfabric
        // (ci/libfabric2.sh, 2026-11-22); not yet understood.
        return skipped(
            "a_send_the_peer_never_makes_room_for_completes_not_posted",
            "shm of libfabric 2.x refuses no send here, and the test process then crashed (SIGSEGV)",
        );
    }
    let _one = one_shm_pair();
    const N: u64 = 3 * DEPTH as u64;
    let p = profile_with("shm", DEPTH);
    let cfg = LoopConfig {
        post_timeout: Some(Duration::from_secs(1)),
        ..Default::default()
    };
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let (mut c, server) = pair(p.clone(), p, cfg, move |mut s| {
        // Polls (so shm takes messages in, as unexpected ones) but never
        // posts a receive.
        let mut out = Vec::new();
        while done_rx.try_recv().is_err() {
            s.ev.poll(&mut out, Some(Duration::from_millis(5))).expect("poll");
            assert!(out.is_empty(), "nothing was posted to complete");
        }
        s
    });
    for seq in 0..N {
        c.ev.send(&c.peer, numbered(seq), opts(), Token(seq))
            .expect("send");
    }
    let done = collect(&mut c.ev, OpKind::Send, N as usize);
    let refused: Vec<_> = done.iter().filter(|d| d.result.is_err()).collect();
    assert!(
        !refused.is_empty() && refused.len() < N as usize,
        "{} refused",
        refused.len()
    );
    for d in &refused {
        let e = d.result.as_ref().expect_err("refused").to_string();
        assert!(
            e.contains("fi_tsend") && e.contains("FI_EAGAIN") && e.contains("never posted"),
            "{e}"
        );
        assert_eq!(
            d.buffer.as_ref().map(|b| b.len()),
            Some(LEN),
            "the buffer comes back"
        );
    }
    done_tx.send(()).expect("done");
    let s = server.join().expect("server");
    drop((c, s));
}

/// More receives than shm has entries for: the one too many is retried
/// for `post_timeout`, then fails naming `fi_trecv` and `FI_ENOMEM`, with
/// its buffer handed back.
#[test]
fn a_receive_the_provider_has_no_room_for_names_fi_trecv() {
    let _one = one_shm_pair();
    let p = profile_with("shm", DEPTH);
    let cfg = LoopConfig {
        post_timeout: Some(Duration::from_millis(300)),
        ..Default::default()
    };
    let mut ev = fabric_msg::EventLoop::new(&p, cfg).expect("loop");
    let ep = ev.open_endpoint().expect("endpoint");
    let any = RecvOpts {
        tag: Some((TAG, 0)),
        ..Default::default()
    };
    let mut posted = 0;
    let e = loop {
        match ev.recv(ep, Buffer::new(64), any, Token(posted)) {
            Ok(()) => posted += 1,
            Err(e) => break e,
        }
        assert!(posted <= 4 * DEPTH as u64, "shm took {posted} receives");
    };
    // libfabric 1.17's shm has exactly the receive queue's entries; 2.1's
    // takes receives until the loop's own completion-queue bound (256)
    // stops them, which names fi_cq_read.
    if fabric_msg::ffi::runtime_version() < (2, 0) {
        assert!(e.to_string().contains("fi_trecv"), "{e}");
        assert_eq!(posted, p.queues.rx as u64, "as many as the receive queue holds");
        assert!(
            matches!(e.error, Error::QueueFull { call: "fi_trecv", code: Some(c), .. } if c.name() == Some("FI_ENOMEM")),
            "{e}"
        );
    } else {
        assert!(posted >= p.queues.rx as u64, "{posted} receives");
        assert!(
            matches!(
                e.error,
                Error::QueueFull {
                    call: "fi_trecv" | "fi_cq_read",
                    ..
                }
            ),
            "{e}"
        );
    }
    assert_eq!(e.buffer.map(|b| b.capacity()), Some(64));
}

/// What a receiver that wants a message on another tag before it consumes
/// a flood saw: whether the other message came first, every flood message
/// in order, and what the other send completed with the first time.
struct FloodOutcome {
    other_first: bool,
    /// Sends that came back unsent (the other one included).
    not_posted: usize,
    other_send: Result<(), fabric_msg::CompletionError>,
    other_buffer_back: bool,
}

/// shm before libfabric 1.19 loses receive entries when a flood exhausts
/// its command contexts (`smr_progress_cmd_msg` takes an entry for an
/// unexpected message, then returns without it when no context is free),
/// and a receiver that is sent more after that can take nothing: seen as
/// "not enough space to post recv" repeating with two receives posted (4
/// of 8 runs that sent the unsent part again). Nothing fabric-msg can
/// mend; the test does not send into it (docs/reliability.md).
fn leaks_under_pressure(p: &fabric_msg::Profile) -> bool {
    p.provider == "shm" && fabric_msg::ffi::runtime_version() < (1, 19)
}

/// A peer floods one tag (4 × the receiver's room) and then sends one
/// message on another tag, which the receiver wants first. On tcp;ofi_rxm
/// the flood waits in rxm's buffers and the other message passes it. On
/// shm (1.17) the flood takes all `rx_size` of the receiver's room, the
/// other message waits behind the rest of the flood in the sender's
/// backlog (per peer in order), and after `post_timeout` those sends
/// complete `NotPosted`, each with its buffer. Either way no message is
/// lost or reordered: the receiver, which waited `post_timeout` and more
/// for the other message, takes every flood message that was posted, in
/// order, and the sender sends what came back again, in order, and it
/// arrives (not on shm before 1.19: see [`leaks_under_pressure`]). A program that needs the other message first
/// relies on the receiver buffering the flood (MPI calls such a program
/// unsafe); credits per peer would not change this case (docs/decisions.md,
/// "Flow control").
fn flood_then_other_tag(provider: &str) -> FloodOutcome {
    let _one = one_shm_pair();
    const N: u64 = 4 * DEPTH as u64;
    const OTHER: u64 = 9;
    let p = profile_with(provider, DEPTH);
    let post_timeout = Duration::from_secs(2);
    let cfg = LoopConfig {
        post_timeout: Some(post_timeout),
        ..Default::default()
    };
    // How many flood messages the receiver is to take, once the sender
    // knows; and whether what came back unsent is sent again.
    let (expect_tx, expect_rx) = mpsc::channel::<u64>();
    let resend = !leaks_under_pressure(&p);
    let (mut c, server) = pair(p.clone(), p, cfg, move |mut s| {
        let other = RecvOpts {
            tag: Some((OTHER, 0)),
            ..Default::default()
        };
        s.ev.recv(s.ep, Buffer::new(LEN), other, Token(2))
            .expect("recv other");
        let mut out = Vec::new();
        let mut other_at = None;
        let until = Instant::now() + post_timeout + Duration::from_secs(2);
        while other_at.is_none() && Instant::now() < until {
            s.ev.poll(&mut out, Some(Duration::from_millis(20)))
                .expect("poll");
            if let Some(c) = out.iter().find(|c| c.token == Token(2)) {
                assert!(c.result.is_ok(), "the other message: {:?}", c.result);
                other_at = Some(0);
            }
        }
        let exact = RecvOpts {
            tag: Some((TAG, 0)),
            ..Default::default()
        };
        let expected = expect_rx.recv().expect("the sender's count");
        for seq in 0..expected {
            s.ev.recv(s.ep, Buffer::new(LEN), exact, Token(1)).expect("recv");
            let mut got = collect(&mut s.ev, OpKind::Recv, 1);
            if other_at.is_none() {
                if let Some(i) = got.iter().position(|c| c.token == Token(2)) {
                    other_at = Some(seq + 1);
                    got.remove(i);
                    got.extend(collect(&mut s.ev, OpKind::Recv, 1));
                }
            }
            let m = got.iter().find(|c| c.token == Token(1)).expect("a flood message");
            let b = m.buffer.as_ref().expect("a receive returns its buffer");
            let n = u64::from_le_bytes(b.as_slice()[..8].try_into().expect("8 bytes"));
            assert_eq!(n, seq, "flood message {seq} arrived as {n}");
        }
        if other_at.is_none() && expected == N {
            let c = collect(&mut s.ev, OpKind::Recv, 1).remove(0);
            assert_eq!(c.token, Token(2), "only the other receive is left");
            assert!(c.result.is_ok(), "the other message: {:?}", c.result);
            other_at = Some(N + 1);
        }
        (other_at == Some(0), s)
    });
    for seq in 0..N {
        c.ev.send(&c.peer, numbered(seq), opts(), Token(seq))
            .expect("send");
    }
    let last = SendOpts {
        tag: Some(OTHER),
        data: None,
    };
    c.ev.send(&c.peer, numbered(N), last, Token(N))
        .expect("send other");
    let mut done = collect(&mut c.ev, OpKind::Send, N as usize + 1);
    done.sort_by_key(|d| d.token.0);
    let other = &done[N as usize];
    let other_send = other.result.clone().map(|_| ());
    let other_buffer_back = other.buffer.is_some();
    // Sends that waited past post_timeout came back unsent, each with its
    // buffer, and (the backlog keeps a peer's order) only after every one
    // that was posted: send them again, in order.
    let mut again = Vec::new();
    for d in done {
        match d.result {
            Ok(_) => assert!(
                again.is_empty(),
                "send {:?} posted after an earlier one came back",
                d.token
            ),
            Err(fabric_msg::CompletionError::NotPosted { call: "fi_tsend", .. }) => again.push((
                d.token,
                d.buffer.expect("an unsent message comes back with its buffer"),
            )),
            Err(e) => panic!("send {:?}: {e}", d.token),
        }
    }
    let not_posted = again.len();
    if !resend {
        expect_tx
            .send(N - (not_posted as u64 - 1))
            .expect("receiver gone");
        again.clear();
    } else {
        expect_tx.send(N).expect("receiver gone");
    }
    for (token, b) in again {
        let o = if token == Token(N) { last } else { opts() };
        c.ev.send(&c.peer, b, o, token).expect("send again");
    }
    for d in collect(&mut c.ev, OpKind::Send, if resend { not_posted } else { 0 }) {
        assert!(d.result.is_ok(), "send {:?} again: {:?}", d.token, d.result);
    }
    let (other_first, s) = server.join().expect("the receiver failed");
    drop((c, s));
    FloodOutcome {
        other_first,
        not_posted,
        other_send,
        other_buffer_back,
    }
}

#[test]
fn a_flood_on_one_tag_does_not_hold_back_another_on_tcp_rxm() {
    let o = flood_then_other_tag("tcp;ofi_rxm");
    assert!(o.other_first, "the other message waited behind the flood");
    assert!(o.other_send.is_ok(), "{:?}", o.other_send);
    assert_eq!(o.not_posted, 0);
}

/// shm (1.17): the other message waits behind the flood, and its send
/// says so (`NotPosted`, naming `fi_tsend`, with its buffer), as do the
/// flood's sends that found no room; every flood message that was posted
/// arrives, in order. Where shm takes the whole flood (libfabric 2.1 refuses no send),
/// the other message passes it as on tcp;ofi_rxm.
#[test]
fn a_flood_on_one_tag_holds_back_another_on_shm_and_says_so() {
    let o = flood_then_other_tag("shm");
    if fabric_msg::ffi::runtime_version() >= (2, 0) && o.other_first {
        assert!(o.other_send.is_ok(), "{:?}", o.other_send);
        return;
    }
    assert!(!o.other_first, "shm 1.17 took the other message before the flood");
    match &o.other_send {
        Err(fabric_msg::CompletionError::NotPosted { call, reason }) => {
            assert_eq!(*call, "fi_tsend", "{reason}");
            assert!(reason.contains("FI_EAGAIN"), "{reason}");
        }
        other => panic!("the other send completed with {other:?}, not NotPosted"),
    }
    assert!(
        o.other_buffer_back,
        "a send that was never posted returns its buffer"
    );
    assert!(
        o.not_posted > 1,
        "the flood's own tail waited too: {}",
        o.not_posted
    );
}
