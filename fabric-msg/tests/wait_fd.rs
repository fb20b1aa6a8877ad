//! An outer event loop (here a bare `poll(2)`, as mio or epoll would do)
//! sleeping on the loop's wait fd by the `fi_trywait` rule
//! (`EventLoop::prepare_sleep`): a message sent while it sleeps wakes it,
//! and it sleeps rather than spins meanwhile.

use crate::common;

use common::{pair, profile, skipped, TIMEOUT};
use fabric_msg::{Buffer, EventLoop, LoopConfig, RecvOpts, SleepCheck, Token, WaitMode};
use std::os::fd::AsRawFd;
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// What the outer loop saw while it waited for one message.
#[derive(Debug)]
struct Waited {
    /// `prepare_sleep` said `Sleep` this often, and `PollFirst` this often.
    sleeps: u32,
    poll_first: u32,
    /// From the peer's send to the completion in our hands.
    after_send: Duration,
}

/// Wait for the one completion `ev` owes, as an outer loop would: poll
/// with a zero timeout, then sleep on the fd when `prepare_sleep` allows.
fn wait_outside(ev: &mut EventLoop, sent: &mpsc::Receiver<Instant>) -> Waited {
    let fd = ev
        .wait_fd()
        .expect("a loop opened with WaitMode::Block has a wait fd")
        .as_raw_fd();
    let (mut sleeps, mut poll_first) = (0, 0);
    let mut out = Vec::new();
    let started = Instant::now();
    loop {
        assert!(
            started.elapsed() < TIMEOUT,
            "no message in {TIMEOUT:?}: {sleeps} sleeps, {poll_first} polls first"
        );
        ev.poll(&mut out, Some(Duration::ZERO)).unwrap();
        if let Some(c) = out.pop() {
            let at = Instant::now();
            assert_eq!(c.token, Token(7));
            assert_eq!(c.buffer.as_ref().unwrap().as_slice(), b"wake up");
            let send = sent.recv_timeout(TIMEOUT).expect("the sender says when it sent");
            return Waited {
                sleeps,
                poll_first,
                after_send: at.saturating_duration_since(send),
            };
        }
        match ev.prepare_sleep() {
            SleepCheck::PollFirst => poll_first += 1,
            SleepCheck::Sleep(at_most) => {
                sleeps += 1;
                let ms = at_most.map_or(5_000, |d| d.as_millis().max(1) as i32);
                let mut p = libc::pollfd {
                    fd,
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: one valid pollfd for the call's duration.
                unsafe { libc::poll(&mut p, 1, ms) };
            }
        }
    }
}

fn wakes_on(provider: &str) {
    let p = profile(provider);
    if !p.wait_fd {
        skipped("wakes_on", &format!("{provider} has no wait object"));
        return;
    }
    let cfg = LoopConfig {
        wait: WaitMode::Block,
        ..LoopConfig::default()
    };
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let (sent_tx, sent_rx) = mpsc::channel::<Instant>();
    let (mut me, server) = pair(p.clone(), p, cfg, move |mut s| {
        // A first message sets up what the provider sets up lazily (rxm's
        // connection, during which it declines to let anyone sleep).
        common::send_tagged(&mut s.ev, &s.peer, 1, b"warm");
        go_rx.recv().unwrap();
        // Long enough for the other side to be asleep on its fd.
        std::thread::sleep(Duration::from_millis(300));
        sent_tx.send(Instant::now()).unwrap();
        common::send_tagged(&mut s.ev, &s.peer, 7, b"wake up");
        // Stay until the message is surely taken.
        go_rx.recv().ok();
    });
    assert_eq!(common::recv_tagged(&mut me.ev, me.ep, 1), b"warm");
    let opts = RecvOpts {
        tag: Some((7, 0)),
        from: None,
    };
    me.ev.recv(me.ep, Buffer::new(64), opts, Token(7)).unwrap();
    go_tx.send(()).unwrap();
    let w = wait_outside(&mut me.ev, &sent_rx);
    drop(go_tx);
    server.join().unwrap();
    eprintln!("{provider}: {w:?}");
    assert!(w.sleeps >= 1, "{provider}: never slept: {w:?}");
    // 300 ms of waiting with a clock tick of 50 ms: a handful of sleeps,
    // not a spin (which makes hundreds of thousands of looks).
    assert!(w.poll_first < 200, "{provider}: spun rather than slept: {w:?}");
    assert!(
        w.after_send < Duration::from_secs(2),
        "{provider}: the fd did not wake the sleeper: {w:?}"
    );
}

#[test]
fn an_outer_loop_sleeps_on_the_fd_and_wakes_for_a_message_on_tcp_rxm() {
    wakes_on("tcp;ofi_rxm");
}

#[test]
fn an_outer_loop_sleeps_on_the_fd_and_wakes_for_a_message_on_sockets() {
    wakes_on("sockets");
}

/// shm has no wait object: no fd, and `prepare_sleep` never says sleep.
#[test]
fn shm_has_no_wait_fd_and_never_says_sleep() {
    let p = profile("shm");
    let cfg = LoopConfig {
        wait: WaitMode::Block,
        ..LoopConfig::default()
    };
    let mut ev = EventLoop::new(&p, cfg).unwrap();
    assert!(
        ev.wait_fd().is_none(),
        "shm gave a wait fd: update the docs of wait_fd.rs"
    );
    assert_eq!(ev.prepare_sleep(), SleepCheck::PollFirst);
}

/// A spinning loop opens no wait object, so has no fd to give.
#[test]
fn a_spinning_loop_has_no_wait_fd() {
    let cfg = LoopConfig {
        wait: WaitMode::Spin,
        ..LoopConfig::default()
    };
    let ev = EventLoop::new(&profile("tcp;ofi_rxm"), cfg).unwrap();
    assert!(ev.wait_fd().is_none());
}
