//! Flow control on a provider with bounded unexpected-message space (shm
//! in libfabric 1.17 takes `rx_size` messages that arrived before their
//! receive, then refuses the sender with `FI_EAGAIN`; its posted receives
//! and those messages share one pool, so a receive post then fails with
//! `FI_ENOMEM`). Sends the provider has no room for wait in the loop's
//! backlog instead of holding the caller; receives are retried after
//! progress; what never fits is reported naming the libfabric call.

mod common;
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
        post_timeout: timeout,
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
        post_timeout: Duration::from_secs(1),
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
        post_timeout: Duration::from_millis(300),
        ..Default::default()
    };
    let mut ev = fabric_msg::EventLoop::new(&p, cfg).expect("loop");
    let ep = ev.endpoint().expect("endpoint");
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

/// A receiver that wants a message on another tag before it consumes a
/// flood: on tcp;ofi_rxm the flood waits in rxm's buffers and the other
/// message passes it; on shm (1.17) the flood takes all `rx_size` of the
/// receiver's room, the other message waits behind it, and its send
/// completes `NotPosted` after `post_timeout`. Credits per peer (not
/// built: see docs/decisions.md, "Flow control") would bound a flood to
/// its share; until then this is the documented limit, not a promise.
fn flood_then_other_tag(provider: &str) -> Result<(), String> {
    let _one = one_shm_pair();
    const N: u64 = 4 * DEPTH as u64;
    const OTHER: u64 = 9;
    let p = profile_with(provider, DEPTH);
    let cfg = LoopConfig {
        post_timeout: Duration::from_secs(2),
        ..Default::default()
    };
    let (mut c, server) = pair(p.clone(), p, cfg, move |mut s| {
        let other = RecvOpts {
            tag: Some((OTHER, 0)),
            ..Default::default()
        };
        s.ev.recv(s.ep, Buffer::new(LEN), other, Token(2))
            .expect("recv other");
        let got = collect(&mut s.ev, OpKind::Recv, 1).remove(0);
        let ok = got.result.is_ok();
        let any = RecvOpts {
            tag: Some((TAG, 0)),
            ..Default::default()
        };
        for _ in 0..N {
            s.ev.recv(s.ep, Buffer::new(LEN), any, Token(1)).expect("recv");
            collect(&mut s.ev, OpKind::Recv, 1);
        }
        (ok, s)
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
    let done = collect(&mut c.ev, OpKind::Send, N as usize + 1);
    let other = done.iter().find(|d| d.token == Token(N)).expect("the other send");
    let outcome = other.result.clone().map_err(|e| e.to_string());
    let (ok, s) = server.join().map_err(|_| "server failed".to_string())?;
    drop((c, s));
    outcome?;
    ok.then_some(()).ok_or_else(|| "the other message failed".into())
}

#[test]
fn a_flood_on_one_tag_does_not_hold_back_another_on_tcp_rxm() {
    flood_then_other_tag("tcp;ofi_rxm").unwrap();
}

#[test]
#[ignore = "shm (1.17) lets one peer's unconsumed flood take all of the receiver's room; needs credits per peer (docs/decisions.md, Flow control)"]
fn a_flood_on_one_tag_does_not_hold_back_another_on_shm() {
    flood_then_other_tag("shm").unwrap();
}
