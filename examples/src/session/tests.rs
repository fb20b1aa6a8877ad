//! `Side`'s own checks: buffers provisioned for a size, and every send's
//! buffer back from `wait_send`.

use super::*;
use fabric_msg::{Capability, EndpointChoice, Requirements};
use std::sync::mpsc;

/// Sends that complete in one batch each come back from `wait_send`:
/// eight sends over tcp;ofi_rxm, all completed before the first call
/// (the server has their receives posted and has taken them), then
/// eight calls, each with a buffer of its own. Before, the first call
/// kept the batch's last buffer and dropped the others, and the second
/// waited for ever (`bandwidth`'s stall under load).
#[test]
fn wait_send_gives_back_every_buffer_of_a_batch() {
    const N: usize = 8;
    let req = Requirements {
        caps: vec![Capability::Msg],
        endpoint: EndpointChoice::Rdm,
        provider: Some("tcp;ofi_rxm".into()),
        domain: Some("lo".into()),
        ..Default::default()
    };
    let profile = negotiate(&req, &LadderConfig::default()).unwrap().profile;
    let listener = Listener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let (sp, cp) = (profile.clone(), profile);
    let server = std::thread::spawn(move || {
        let mut ev = EventLoop::new(&sp, LoopConfig::default()).unwrap();
        let ep = ev.open_endpoint().unwrap();
        let _peer = accept_serving("test", &listener, &mut ev, ep, |ev, ep| {
            (0..N as u64).try_for_each(|t| {
                ev.recv(ep, Buffer::new(64), RecvOpts::default(), Token(t))
                    .map_err(|e| e.error)
            })
        })
        .unwrap();
        let mut out = Vec::new();
        let mut got = 0;
        while got < N {
            got += ev.poll(&mut out, Some(Duration::from_secs(10))).unwrap();
        }
        // Stay up while the client counts its buffers.
        std::thread::sleep(Duration::from_millis(500));
    });
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut ev = EventLoop::new(&cp, LoopConfig::default()).unwrap();
        let ep = ev.open_endpoint().unwrap();
        let peer = connect_with(&mut ev, ep, addr, Duration::from_secs(10), |_, _| Ok(())).unwrap();
        let mut side = Side::new(ev, peer, Vec::new(), 0, false);
        for s in 0..N {
            side.send(Buffer::from_slice(&[s as u8; 32]), s).unwrap();
        }
        // Their completions wait in the queue, to be read in one batch.
        std::thread::sleep(Duration::from_millis(300));
        for _ in 0..N {
            let b = side.wait_send().unwrap();
            tx.send(b.as_slice()[0]).unwrap();
        }
    });
    let mut back: Vec<u8> = (0..N)
        .map(|i| {
            rx.recv_timeout(Duration::from_secs(10))
                .unwrap_or_else(|_| panic!("wait_send gave back {i} of {N} buffers, then waited"))
        })
        .collect();
    back.sort_unstable();
    assert_eq!(
        back,
        (0..N as u8).collect::<Vec<_>>(),
        "each send's own buffer, once"
    );
    server.join().unwrap();
}

#[test]
fn provision_reuses_large_enough_buffers() {
    let mut pool = vec![Buffer::new(8), Buffer::new(100)];
    provision(&mut pool, 3, 64);
    assert_eq!(pool.len(), 3);
    assert!(pool.iter().all(|b| b.capacity() >= 64));
    provision(&mut pool, 1, 16);
    assert_eq!(pool.len(), 1);
}
