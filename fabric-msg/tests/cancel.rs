//! `EventLoop::cancel_recv` on the providers the World posts receives on
//! two loops with: a posted receive that nothing matched completes once,
//! as `Cancelled`, with its buffer; asking again, or for a token never
//! posted, says there is nothing to cancel; the loop goes on working.
//! `cancel_recv_now` hands that completion over in the same call, with
//! no poll, on every provider the World's main loop runs on here.

use crate::common;
use common::*;
use fabric_msg::{Buffer, CompletionError, EventLoop, LoopConfig, OpKind, RecvOpts, Token};
use std::time::{Duration, Instant};

fn cancels_a_posted_receive(provider: &str) {
    let p = profile(provider);
    let mut ev = EventLoop::new(&p, LoopConfig::default()).expect("event loop");
    let ep = ev.open_endpoint().expect("endpoint");
    for (tag, ignore) in [(0x17, 0), (0x17, 0xff)] {
        let opts = RecvOpts {
            tag: Some((tag, ignore)),
            ..Default::default()
        };
        ev.recv(ep, Buffer::new(100), opts, Token(7)).expect("recv");
        assert!(
            !ev.cancel_recv(ep, Token(8)).expect("cancel"),
            "{provider}: token 8 was never posted"
        );
        assert!(
            ev.cancel_recv(ep, Token(7)).expect("cancel"),
            "{provider}: the receive is posted"
        );
        let deadline = Instant::now() + TIMEOUT;
        let mut got = Vec::new();
        while got.is_empty() {
            assert!(
                Instant::now() < deadline,
                "{provider}: no completion for the cancelled receive"
            );
            ev.poll(&mut got, Some(Duration::from_millis(20))).expect("poll");
        }
        assert_eq!(got.len(), 1, "{provider}: {got:?}");
        let c = got.remove(0);
        assert_eq!((c.token, c.kind), (Token(7), OpKind::Recv));
        assert!(
            matches!(c.result, Err(CompletionError::Cancelled)),
            "{provider}: {:?}",
            c.result
        );
        assert_eq!(
            c.buffer.map(|b| b.capacity()),
            Some(100),
            "{provider}: the buffer comes back"
        );
        assert!(
            !ev.cancel_recv(ep, Token(7)).expect("cancel"),
            "{provider}: completed already"
        );
        let mut more = Vec::new();
        ev.poll(&mut more, Some(Duration::from_millis(100)))
            .expect("poll");
        assert!(
            more.is_empty(),
            "{provider}: one completion per receive: {more:?}"
        );
    }
    assert_eq!(ev.in_flight(), 0);
}

#[test]
fn cancels_a_posted_receive_on_tcp_rxm() {
    cancels_a_posted_receive("tcp;ofi_rxm");
}

#[test]
fn cancels_a_posted_receive_on_shm() {
    cancels_a_posted_receive("shm");
}

/// `cancel_recv_now`: the cancelled receive's completion comes back in the
/// call itself (the World decides with it whether a node message may go to
/// a receive from any rank, `world/local/claims.rs`), once; and nothing
/// for a token never posted.
fn cancels_now(provider: &str) {
    let p = profile(provider);
    let mut ev = EventLoop::new(&p, LoopConfig::default()).expect("event loop");
    let ep = ev.open_endpoint().expect("endpoint");
    for round in 0..3 {
        let opts = RecvOpts {
            tag: Some((0x17, 0xff)),
            ..Default::default()
        };
        ev.recv(ep, Buffer::new(64), opts, Token(7)).expect("recv");
        let mut out = Vec::new();
        assert!(
            !ev.cancel_recv_now(ep, Token(8), &mut out).expect("cancel"),
            "{provider}: token 8 was never posted"
        );
        assert!(out.is_empty(), "{provider}: {out:?}");
        assert!(ev.cancel_recv_now(ep, Token(7), &mut out).expect("cancel"));
        assert_eq!(out.len(), 1, "{provider}, round {round}: {out:?}");
        assert!(
            out[0].token == Token(7) && matches!(out[0].result, Err(CompletionError::Cancelled)),
            "{provider}: {:?}",
            out[0]
        );
        let mut more = Vec::new();
        ev.poll(&mut more, Some(Duration::from_millis(50))).expect("poll");
        assert!(
            more.is_empty(),
            "{provider}: one completion per receive: {more:?}"
        );
    }
    assert_eq!(ev.in_flight(), 0);
}

#[test]
fn cancels_now_on_every_provider_of_the_main_loop() {
    let mut providers = vec!["tcp;ofi_rxm", "shm", "udp;ofi_rxd", "sockets"];
    if tcp_has_rdm() {
        providers.push("tcp");
    }
    for provider in providers {
        cancels_now(provider);
    }
}
