//! Connected (MSG) endpoints through the same bootstrap: each connection is
//! its own endpoint, named by `Peer::endpoint`.

use crate::common;
use common::*;
use fabric_msg::{connect, Buffer, EventLoop, Listener, LoopConfig, OpKind, RecvOpts, SendOpts, Token};

#[test]
fn two_clients_connect_to_one_listener_and_echo() {
    let p = msg_profile();
    let listener = Listener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let sp = p.clone();
    let server = std::thread::spawn(move || {
        let mut ev = EventLoop::new(&sp, LoopConfig::default()).unwrap();
        let base = ev.open_endpoint().unwrap();
        let peers = [
            listener.accept(&mut ev, base).unwrap(),
            listener.accept(&mut ev, base).unwrap(),
        ];
        assert_ne!(
            peers[0].endpoint(),
            peers[1].endpoint(),
            "each connection has its own endpoint"
        );
        for (i, peer) in peers.iter().enumerate() {
            ev.recv(
                peer.endpoint(),
                Buffer::new(1 << 20),
                RecvOpts::default(),
                Token(i as u64),
            )
            .unwrap();
        }
        for d in wait_n(&mut ev, 2) {
            let peer = peers[d.token.0 as usize];
            assert_eq!(d.endpoint, peer.endpoint());
            ev.send(&peer, d.buffer.unwrap(), SendOpts::default(), Token(9))
                .unwrap();
        }
        wait_n(&mut ev, 2);
    });
    let mut clients = Vec::new();
    for seq in 0..2u64 {
        let mut ev = EventLoop::new(&p, LoopConfig::default()).unwrap();
        let base = ev.open_endpoint().unwrap();
        let peer = connect(&mut ev, base, addr, TIMEOUT).unwrap();
        let len = 1000 + seq as usize * 300_000;
        ev.recv(
            peer.endpoint(),
            Buffer::new(1 << 20),
            RecvOpts::default(),
            Token(1),
        )
        .unwrap();
        ev.send(
            &peer,
            Buffer::from_slice(&pattern(seq, len)),
            SendOpts::default(),
            Token(2),
        )
        .unwrap();
        clients.push((ev, seq, len));
    }
    for (mut ev, seq, len) in clients {
        let back = wait_n(&mut ev, 2)
            .into_iter()
            .find(|d| d.kind == OpKind::Recv)
            .unwrap();
        assert_eq!(back.buffer.unwrap().as_slice(), pattern(seq, len));
    }
    server.join().unwrap();
}

#[test]
fn posting_on_the_base_endpoint_of_a_msg_loop_says_where_to_post() {
    let p = msg_profile();
    let mut ev = EventLoop::new(&p, LoopConfig::default()).unwrap();
    let base = ev.open_endpoint().unwrap();
    let e = ev
        .recv(base, Buffer::new(8), RecvOpts::default(), Token(1))
        .unwrap_err();
    assert!(e.to_string().contains("peer.endpoint()"), "{e}");
}
