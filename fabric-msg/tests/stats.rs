//! `EventLoop::stats`: messages and bytes each way, in total and per peer,
//! and truncations, on tcp;ofi_rxm, shm and tcp's connected endpoints.
//! (The backlog's counters are checked by the flood in `flow_control.rs`.)

use crate::common;
use common::*;
use fabric_msg::{
    Buffer, Completion, CompletionError, LoopStats, Profile, RecvOpts, SendOpts, Token, Traffic,
};

const FROM_CLIENT: [usize; 3] = [10, 50, 4000];
const INJECTED: usize = 7;
const OVERSIZED: usize = 20;
const SMALL: usize = 8;
const FROM_SERVER: [usize; 2] = [30, 3000];

fn traffic(sizes: &[usize]) -> Traffic {
    Traffic {
        messages: sizes.len() as u64,
        bytes: sizes.iter().sum::<usize>() as u64,
    }
}

/// The client sends three messages, injects one and (if `cut`) sends one
/// too large for its receive; the server answers with two. Returns both
/// sides' stats.
fn exchange(p: Profile, cut: bool) -> (LoopStats, LoopStats) {
    let (mut c, server) = pair(p.clone(), p, Default::default(), move |mut s| {
        for _ in 0..FROM_CLIENT.len() + 1 {
            s.ev.recv(
                s.peer.endpoint(),
                Buffer::new(4096),
                RecvOpts::default(),
                Token(1),
            )
            .unwrap();
        }
        let got = wait_n(&mut s.ev, FROM_CLIENT.len() + 1);
        assert!(got.iter().all(|g| g.result.is_ok()), "{got:?}");
        if cut {
            let small = Buffer::new(SMALL);
            s.ev.recv(s.peer.endpoint(), small, RecvOpts::default(), Token(2))
                .unwrap();
            let got = wait_n(&mut s.ev, 1).remove(0);
            assert!(
                matches!(got.result, Err(CompletionError::Truncated { .. })),
                "{got:?}"
            );
        }
        for len in FROM_SERVER {
            s.ev.send(
                &s.peer,
                Buffer::from_slice(&pattern(0, len)),
                SendOpts::default(),
                Token(3),
            )
            .unwrap();
        }
        wait_n(&mut s.ev, FROM_SERVER.len());
        let stats = s.ev.stats();
        (s, stats)
    });
    for _ in FROM_SERVER {
        c.ev.recv(
            c.peer.endpoint(),
            Buffer::new(4096),
            RecvOpts::default(),
            Token(4),
        )
        .unwrap();
    }
    for len in FROM_CLIENT {
        c.ev.send(
            &c.peer,
            Buffer::from_slice(&pattern(1, len)),
            SendOpts::default(),
            Token(5),
        )
        .unwrap();
    }
    c.ev.inject(&c.peer, &pattern(2, INJECTED), SendOpts::default())
        .unwrap();
    // The sends' completions first (the server's messages may complete
    // receives meanwhile: they are kept, not counted as sends).
    let mut done = Vec::new();
    while done.iter().filter(|d: &&Completion| d.token == Token(5)).count() < FROM_CLIENT.len() {
        done.extend(wait_n(&mut c.ev, 1));
    }
    if cut {
        let big = Buffer::from_slice(&pattern(3, OVERSIZED));
        c.ev.send(&c.peer, big, SendOpts::default(), Token(6)).unwrap();
    }
    while done.len() < FROM_CLIENT.len() + usize::from(cut) + FROM_SERVER.len() {
        done.extend(wait_n(&mut c.ev, 1));
    }
    assert!(done.iter().all(|d| d.result.is_ok()), "{done:?}");
    let client = c.ev.stats();
    let (s, server) = server.join().unwrap();
    drop((c, s));
    (client, server)
}

fn check(provider: &str, p: Profile, cut: bool) {
    let (client, server) = exchange(p, cut);
    let mut all = FROM_CLIENT.to_vec();
    all.push(INJECTED);
    if cut {
        all.push(OVERSIZED);
    }
    // The oversized message was sent whole; it was not received whole.
    assert_eq!(client.sent, traffic(&all), "{provider} client: {client:?}");
    assert_eq!(
        client.received,
        traffic(&FROM_SERVER),
        "{provider} client: {client:?}"
    );
    assert_eq!(
        server.sent,
        traffic(&FROM_SERVER),
        "{provider} server: {server:?}"
    );
    let mut took = FROM_CLIENT.to_vec();
    took.push(INJECTED);
    assert_eq!(server.received, traffic(&took), "{provider} server: {server:?}");
    assert_eq!(
        (client.truncations, server.truncations),
        (0, u64::from(cut)),
        "{provider}"
    );
    for (side, s) in [("client", &client), ("server", &server)] {
        // One peer; what it was sent is known exactly, what came from it
        // is known where the provider names sources.
        assert_eq!(s.peers.len(), 1, "{provider} {side}: {s:?}");
        let peer = s.peers[0];
        assert_eq!(peer.sent, s.sent, "{provider} {side}");
        assert_eq!(
            peer.received.messages + s.received_from_unknown.messages,
            s.received.messages,
            "{provider} {side}: {s:?}"
        );
        assert_eq!((s.backlogged, s.lost_peers), (0, 0));
    }
}

#[test]
fn counts_each_way_and_per_peer_on_tcp_rxm() {
    if !tcp_has_rdm() {
        return skipped(
            "counts_each_way_and_per_peer_on_tcp_rxm",
            "tcp;ofi_rxm offers no RDM endpoint here",
        );
    }
    check("tcp;ofi_rxm", profile("tcp;ofi_rxm"), true);
}

#[test]
fn counts_each_way_and_per_peer_on_shm() {
    check("shm", profile("shm"), true);
}

/// Without the oversized message: on tcp's connected endpoints a message
/// larger than its receive ends the connection (`tests/truncation.rs`).
#[test]
fn counts_each_way_and_per_connection_on_tcp_msg() {
    let (client, server) = exchange(msg_profile(), false);
    // A connection knows its peer: nothing is from an unknown sender.
    assert_eq!(client.received_from_unknown, Traffic::default());
    assert_eq!(server.received_from_unknown, Traffic::default());
    assert_eq!(client.peers[0].received, client.received);
    check("tcp", msg_profile(), false);
}
