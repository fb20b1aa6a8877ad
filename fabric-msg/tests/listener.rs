//! The bootstrap listener keeps serving (issue 11, defects 2 and 10): a
//! port scan, a silent connection or a slow sender costs one slot of a
//! bounded set, not the server; the whole handshake has one deadline; the
//! listener can be polled between the event loop's polls; on connected
//! (MSG) endpoints a connection request must carry the nonce of the
//! handshake that announced it.

use crate::common;
use common::*;
use fabric_msg::{
    connect, Accepted, Buffer, EndpointId, EventLoop, Listener, LoopConfig, OpKind, Peer, RecvOpts, SendOpts,
    Token,
};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A real client on its own thread: how long its connect took.
fn real_client(p: &fabric_msg::Profile, addr: SocketAddr) -> std::thread::JoinHandle<Duration> {
    let p = p.clone();
    std::thread::spawn(move || {
        let mut ev = EventLoop::new(&p, LoopConfig::default()).unwrap();
        let ep = ev.open_endpoint().unwrap();
        let t = Instant::now();
        connect(&mut ev, ep, addr, TIMEOUT).expect("the real client connects");
        t.elapsed()
    })
}

/// A peer that sends `bytes` one at a time, `every` apart, until done or
/// told to stop (then it closes).
fn trickle(
    addr: SocketAddr,
    bytes: Vec<u8>,
    every: Duration,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<()> {
    let mut s = TcpStream::connect(addr).unwrap();
    std::thread::spawn(move || {
        for b in bytes {
            if stop.load(Ordering::Relaxed) || s.write_all(&[b]).is_err() {
                return;
            }
            let until = Instant::now() + every;
            while Instant::now() < until && !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    })
}

fn rdm_server() -> (fabric_msg::Profile, EventLoop, EndpointId) {
    let p = profile("tcp;ofi_rxm");
    let mut ev = EventLoop::new(&p, LoopConfig::default()).unwrap();
    let ep = ev.open_endpoint().unwrap();
    (p, ev, ep)
}

#[test]
fn a_port_scan_silent_peers_and_a_slow_sender_do_not_delay_a_real_client() {
    let (p, mut ev, ep) = rdm_server();
    // The default deadline: 10 s per handshake.
    let listener = Listener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(TcpStream::connect(addr).unwrap()); // a port scan: connect and close
                                             // Thirty silent connections, well under the bound of 64.
    let silent: Vec<_> = (0..30).map(|_| TcpStream::connect(addr).unwrap()).collect();
    let stop = Arc::new(AtomicBool::new(false));
    let slow = trickle(addr, hello(&p, vec![0; 16]), Duration::from_secs(1), stop.clone());
    std::thread::sleep(Duration::from_millis(100));

    // The blocking accept hands out whichever handshake finishes first:
    // the port scan's failure, then the real client, while the silent ones
    // and the slow one are still in progress.
    let e = listener.accept(&mut ev, ep).unwrap_err().to_string();
    assert!(
        e.contains("connection closed while receiving the handshake"),
        "{e}"
    );
    let t = Instant::now();
    let client = real_client(&p, addr);
    listener.accept(&mut ev, ep).expect("the real client is served");
    let served = t.elapsed();
    let took = client.join().unwrap();
    eprintln!(
        "real client served in {served:?} (its connect took {took:?}) beside 30 silent and a 1 byte/s peer"
    );
    assert!(
        served < Duration::from_secs(3) && took < Duration::from_secs(3),
        "a real client waited {served:?} behind stalled handshakes"
    );
    assert_eq!(
        listener.in_progress(),
        31,
        "the silent ones and the slow one are still in progress"
    );
    stop.store(true, Ordering::Relaxed);
    slow.join().unwrap();
    drop(silent);
}

#[test]
fn the_whole_handshake_has_one_deadline_however_a_peer_trickles() {
    let (p, mut ev, ep) = rdm_server();
    let mut listener = Listener::bind("127.0.0.1:0").unwrap();
    let deadline = Duration::from_millis(1500);
    listener.set_timeout(deadline);
    let addr = listener.local_addr().unwrap();
    // A byte every 200 ms: each read finds something well within the
    // deadline, so only a deadline for the whole handshake ends it.
    let stop = Arc::new(AtomicBool::new(false));
    let slow = trickle(
        addr,
        hello(&p, vec![0; 64]),
        Duration::from_millis(200),
        stop.clone(),
    );
    let t = Instant::now();
    let e = listener.accept(&mut ev, ep).unwrap_err().to_string();
    let took = t.elapsed();
    stop.store(true, Ordering::Relaxed);
    slow.join().unwrap();
    assert!(
        e.contains("timed out") && e.contains("whole handshake's deadline"),
        "{e}"
    );
    assert!(
        took >= deadline - Duration::from_millis(200) && took < deadline + Duration::from_secs(2),
        "a {deadline:?} deadline ended the handshake after {took:?}"
    );
}

#[test]
fn past_the_bound_connections_are_closed_and_a_real_client_is_still_served() {
    let (p, mut ev, ep) = rdm_server();
    let mut listener = Listener::bind("127.0.0.1:0").unwrap();
    listener.set_max_in_progress(4);
    let addr = listener.local_addr().unwrap();
    let mut idle: Vec<TcpStream> = (0..10).map(|_| TcpStream::connect(addr).unwrap()).collect();
    std::thread::sleep(Duration::from_millis(100));
    let r = listener
        .poll_accept(&mut ev, ep, Some(Duration::from_millis(300)))
        .unwrap();
    assert!(r.is_none(), "nothing finished: {r:?}");
    assert_eq!(listener.in_progress(), 4);
    assert_eq!(listener.over_bound(), 6);
    // The six past the bound were closed at once: they read end-of-file.
    let closed = idle
        .iter_mut()
        .map(|s| {
            s.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
            matches!(s.read(&mut [0u8; 1]), Ok(0))
        })
        .filter(|&eof| eof)
        .count();
    assert_eq!(closed, 6, "the connections past the bound are closed");
    drop(idle);

    // Once they are gone, a real client gets a slot at once; the four
    // closed handshakes are refused, each named.
    let client = real_client(&p, addr);
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut refused = 0;
    let peer = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(!left.is_zero(), "no peer within 5 s ({refused} refused)");
        match listener.poll_accept(&mut ev, ep, Some(left)).unwrap() {
            Some(Accepted::Peer(peer)) => break peer,
            Some(Accepted::Refused(r)) => {
                assert!(r.to_string().contains("127.0.0.1:"), "{r}");
                refused += 1;
            }
            None => {}
        }
    };
    client.join().unwrap();
    let _ = peer;
    assert_eq!(refused, 4);
    assert_eq!(listener.in_progress(), 0);
}

/// One ping-pong with client 1: post a receive, wait for its message,
/// echo it, polling the listener between the loop's polls.
#[test]
fn poll_accept_takes_a_new_peer_while_the_server_serves_another() {
    let (p, mut ev, ep) = rdm_server();
    let listener = Listener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    const ROUNDS: u64 = 200;
    let cp = p.clone();
    let client1 = std::thread::spawn(move || {
        let mut c = client(&cp, addr);
        for i in 0..ROUNDS {
            c.ev.recv(c.ep, Buffer::new(64), RecvOpts::default(), Token(1))
                .unwrap();
            c.ev.send(
                &c.peer,
                Buffer::from_slice(&i.to_le_bytes()),
                SendOpts::default(),
                Token(2),
            )
            .unwrap();
            let got = wait_n(&mut c.ev, 2);
            let back = got.into_iter().find(|d| d.kind == OpKind::Recv).unwrap();
            assert_eq!(back.buffer.unwrap().as_slice(), i.to_le_bytes());
            std::thread::sleep(Duration::from_millis(5));
        }
    });
    let peer1 = listener.accept(&mut ev, ep).unwrap();
    // A stalled connection stays open throughout: a blocking accept would
    // sit on it; poll_accept must not.
    let stalled = TcpStream::connect(addr).unwrap();
    let mut client2 = None;
    let mut peer2: Option<Peer> = None;
    let mut echoed = 0u64;
    let mut slowest_poll = Duration::ZERO;
    let mut out = Vec::new();
    ev.recv(ep, Buffer::new(64), RecvOpts::default(), Token(10))
        .unwrap();
    let deadline = Instant::now() + TIMEOUT;
    while echoed < ROUNDS || peer2.is_none() {
        assert!(
            Instant::now() < deadline,
            "{echoed} echoed, client 2 accepted: {}",
            peer2.is_some()
        );
        ev.poll(&mut out, Some(Duration::from_millis(2))).unwrap();
        for c in out.drain(..) {
            if c.kind == OpKind::Recv {
                let b = c.buffer.unwrap();
                ev.send(
                    &peer1,
                    Buffer::from_slice(b.as_slice()),
                    SendOpts::default(),
                    Token(11),
                )
                .unwrap();
                echoed += 1;
                ev.recv(ep, b, RecvOpts::default(), Token(10)).unwrap();
                if echoed == ROUNDS / 4 {
                    // Client 2 comes while client 1 is being served.
                    client2 = Some(real_client(&p, addr));
                }
            }
        }
        let t = Instant::now();
        match listener.poll_accept(&mut ev, ep, Some(Duration::ZERO)).unwrap() {
            Some(Accepted::Peer(p)) => peer2 = Some(p),
            Some(Accepted::Refused(r)) => panic!("{r}"),
            None => {}
        }
        slowest_poll = slowest_poll.max(t.elapsed());
    }
    let took = client2.unwrap().join().unwrap();
    eprintln!(
        "client 2 connected in {took:?} while client 1 was echoed; slowest poll_accept {slowest_poll:?}"
    );
    assert!(
        slowest_poll < Duration::from_millis(200),
        "poll_accept blocked for {slowest_poll:?}"
    );
    assert!(took < Duration::from_secs(5), "client 2 took {took:?}");
    assert_ne!(peer2.unwrap().fi_addr(), peer1.fi_addr());
    client1.join().unwrap();
    assert_eq!(
        listener.in_progress(),
        1,
        "the stalled connection is still in progress"
    );
    drop(stalled);
}

#[test]
fn the_listener_exposes_its_fd_for_applications_that_poll() {
    use std::os::fd::AsRawFd;
    let listener = Listener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let fd = listener.as_raw_fd();
    assert_eq!(listener.raw_fds(), [fd]);
    assert_eq!(listener.poll_within(), None);
    let _c = TcpStream::connect(addr).unwrap();
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one live pollfd naming the listener's open socket.
    let n = unsafe { libc::poll(&mut pfd, 1, 5000) };
    assert_eq!(n, 1, "the listener's fd is readable once a peer connects");
}

/// A third party that skips the bootstrap: a raw MSG endpoint of its own
/// (libfabric through `fabric_msg::ffi`) that calls `fi_connect` on
/// `pep_name` with `cm_data`. What it saw within 5 s.
fn third_party_connect(pep_name: &[u8], cm_data: &[u8]) -> String {
    use fabric_msg::ffi;
    use std::ptr::{null, null_mut};
    // SAFETY: plain libfabric calls on objects opened here, each checked,
    // and closed in reverse order at the end; every buffer handed over
    // (names, hints' strings from strdup, the event buffer) outlives the
    // call that reads it, and the hints' strings are freed by fi_freeinfo.
    unsafe {
        let hints = ffi::fi_allocinfo();
        (*(*hints).fabric_attr).prov_name = libc::strdup(c"tcp".as_ptr());
        (*(*hints).domain_attr).name = libc::strdup(c"lo".as_ptr());
        (*(*hints).ep_attr).type_ = ffi::FI_EP_MSG;
        (*hints).caps = u64::from(ffi::FI_MSG);
        let mut info = null_mut();
        assert_eq!(
            ffi::fi_getinfo(ffi::fi_version(), null(), null(), 0, hints, &mut info),
            0
        );
        ffi::fi_freeinfo(hints);
        let mut fabric = null_mut();
        assert_eq!(ffi::fi_fabric((*info).fabric_attr, &mut fabric, null_mut()), 0);
        let mut eq_attr = ffi::fi_eq_attr {
            size: 16,
            wait_obj: ffi::FI_WAIT_NONE,
            ..Default::default()
        };
        let mut eq = null_mut();
        assert_eq!(ffi::fi_eq_open(fabric, &mut eq_attr, &mut eq, null_mut()), 0);
        let mut domain = null_mut();
        assert_eq!(ffi::fi_domain(fabric, info, &mut domain, null_mut()), 0);
        let mut cq_attr = ffi::fi_cq_attr {
            size: 16,
            format: ffi::FI_CQ_FORMAT_CONTEXT,
            wait_obj: ffi::FI_WAIT_NONE,
            ..Default::default()
        };
        let mut cq = null_mut();
        assert_eq!(ffi::fi_cq_open(domain, &mut cq_attr, &mut cq, null_mut()), 0);
        let mut ep = null_mut();
        assert_eq!(ffi::fi_endpoint(domain, info, &mut ep, null_mut()), 0);
        assert_eq!(ffi::fi_ep_bind(ep, &mut (*eq).fid, 0), 0);
        let flags = u64::from(ffi::FI_TRANSMIT | ffi::FI_RECV);
        assert_eq!(ffi::fi_ep_bind(ep, &mut (*cq).fid, flags), 0);
        assert_eq!(ffi::fi_enable(ep), 0);
        let param = if cm_data.is_empty() {
            null()
        } else {
            cm_data.as_ptr().cast()
        };
        let rc = ffi::fi_connect(ep, pep_name.as_ptr().cast(), param, cm_data.len());
        assert_eq!(rc, 0, "fi_connect");
        let deadline = Instant::now() + Duration::from_secs(5);
        let outcome = loop {
            let mut event = 0u32;
            let mut buf = [0u64; 64];
            let rc = ffi::fi_eq_read(eq, &mut event, buf.as_mut_ptr().cast(), 512, 0);
            if rc >= 0 {
                break match event {
                    ffi::FI_CONNECTED => "connected".to_string(),
                    ffi::FI_SHUTDOWN => "shut down".to_string(),
                    other => format!("event {other}"),
                };
            }
            if rc == -(ffi::FI_EAVAIL as isize) {
                let mut err = ffi::fi_eq_err_entry::default();
                ffi::fi_eq_readerr(eq, &mut err, 0);
                break format!("refused (error {})", err.err);
            }
            if Instant::now() > deadline {
                break "no event within 5 s".to_string();
            }
            std::thread::sleep(Duration::from_millis(1));
        };
        for fid in [
            &mut (*ep).fid as *mut ffi::fid,
            &mut (*cq).fid,
            &mut (*domain).fid,
            &mut (*eq).fid,
            &mut (*fabric).fid,
        ] {
            ffi::fi_close(fid);
        }
        ffi::fi_freeinfo(info);
        outcome
    }
}

/// Read one handshake frame from a raw socket.
fn read_frame(s: &mut TcpStream) -> Frame {
    let mut len = [0u8; 4];
    s.read_exact(&mut len).unwrap();
    let mut body = vec![0u8; u32::from_le_bytes(len) as usize];
    s.read_exact(&mut body).unwrap();
    postcard::from_bytes(&body).unwrap()
}

#[test]
fn on_msg_a_connection_request_without_the_handshakes_nonce_is_refused() {
    let p = msg_profile();
    let listener = Listener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let sp = p.clone();
    let server = std::thread::spawn(move || {
        let mut ev = EventLoop::new(&sp, LoopConfig::default()).unwrap();
        let base = ev.open_endpoint().unwrap();
        let deadline = Instant::now() + TIMEOUT;
        let mut refused = Vec::new();
        loop {
            assert!(Instant::now() < deadline, "no peer; refused: {refused:?}");
            match listener
                .poll_accept(&mut ev, base, Some(Duration::from_millis(100)))
                .unwrap()
            {
                Some(Accepted::Peer(peer)) => {
                    // The real client's connection works.
                    ev.recv(peer.endpoint(), Buffer::new(64), RecvOpts::default(), Token(1))
                        .unwrap();
                    let got = wait_n(&mut ev, 1).remove(0);
                    assert_eq!(got.buffer.unwrap().as_slice(), b"real");
                    return (listener.stray_requests(), listener.in_progress(), refused);
                }
                Some(Accepted::Refused(r)) => refused.push(r.to_string()),
                None => {}
            }
        }
    });
    // A spy does the handshake's first half to learn the passive
    // endpoint's name (and its own nonce, which the third party lacks).
    let mut spy = TcpStream::connect(addr).unwrap();
    spy.write_all(&hello(&p, Vec::new())).unwrap();
    let Frame::Hello { name: pep, nonce, .. } = read_frame(&mut spy) else {
        panic!("the server answers a hello with its own")
    };
    assert_ne!(nonce, 0, "a connected endpoint's hello carries a nonce");
    let none = third_party_connect(&pep, &[]);
    assert_ne!(none, "connected", "a request with no nonce is refused");
    let wrong = third_party_connect(&pep, &nonce.wrapping_add(1).to_le_bytes());
    assert_ne!(wrong, "connected", "a request with a wrong nonce is refused");

    // The real client connects all the same.
    let mut ev = EventLoop::new(&p, LoopConfig::default()).unwrap();
    let base = ev.open_endpoint().unwrap();
    let peer = connect(&mut ev, base, addr, TIMEOUT).unwrap();
    ev.send(&peer, Buffer::from_slice(b"real"), SendOpts::default(), Token(2))
        .unwrap();
    wait_n(&mut ev, 1);
    let (strays, in_progress, refused) = server.join().unwrap();
    eprintln!("third party without a nonce: {none}; with a wrong one: {wrong}");
    assert_eq!(strays, 2, "both stray requests were refused and counted");
    assert_eq!(
        in_progress, 1,
        "the spy's handshake is still waiting for its request"
    );
    assert!(refused.is_empty(), "{refused:?}");
    drop(spy);
}

#[test]
fn a_waiting_listener_still_answers_other_threads() {
    let (_p, mut ev, ep) = rdm_server();
    let listener = Arc::new(Listener::bind("127.0.0.1:0").unwrap());
    let addr = listener.local_addr().unwrap();
    let _silent = TcpStream::connect(addr).unwrap();
    let l2 = listener.clone();
    let asker = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        let t = Instant::now();
        (l2.in_progress(), t.elapsed())
    });
    let r = listener
        .poll_accept(&mut ev, ep, Some(Duration::from_secs(1)))
        .unwrap();
    assert!(r.is_none(), "{r:?}");
    let (n, took) = asker.join().unwrap();
    assert_eq!(n, 1);
    assert!(
        took < Duration::from_millis(200),
        "in_progress waited {took:?} for a poll_accept"
    );
}
