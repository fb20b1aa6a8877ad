//! Memory registration, RMA and atomics on live software providers: the
//! server exposes memory, the client reads, writes and updates it.

use crate::common;
use common::*;
use fabric_msg::discovery::negotiate::Capability;
use fabric_msg::{
    Access, Atomic, Buffer, Completion, CompletionError, Error, EventLoop, LoopConfig, OpKind, Peer,
    RecvOpts, RemoteMemory, SendOpts, Token,
};
use std::time::{Duration, Instant};

const DESCRIPTOR: u64 = 1000;
const DONE: u64 = 1001;
const REVOKED: u64 = 1002;

fn rma_profile(provider: &str) -> fabric_msg::Profile {
    profile_caps(provider, &[Capability::Tagged, Capability::Msg, Capability::Rma])
}

/// Receive the server's memory descriptor and bring it in.
fn import(c: &mut Side) -> RemoteMemory {
    let bytes = recv_tagged(&mut c.ev, c.ep, DESCRIPTOR);
    c.ev.import(&bytes).unwrap()
}

/// Poll (so the provider progresses the peer's one-sided operations) until
/// the message tagged DONE arrives; returns everything else that completed
/// and the DONE message's bytes.
fn serve_until_done(ev: &mut EventLoop, ep: fabric_msg::EndpointId) -> (Vec<Completion>, Vec<u8>) {
    let opts = RecvOpts {
        tag: Some((DONE, 0)),
        from: None,
    };
    ev.recv(ep, Buffer::new(256), opts, Token(DONE)).unwrap();
    let deadline = Instant::now() + TIMEOUT * 3;
    let mut others = Vec::new();
    let mut batch = Vec::new();
    loop {
        assert!(Instant::now() < deadline, "server: no DONE message");
        ev.poll(&mut batch, Some(Duration::from_millis(50))).unwrap();
        for c in batch.drain(..) {
            if c.token == Token(DONE) {
                c.result.unwrap();
                return (others, c.buffer.unwrap().as_slice().to_vec());
            }
            others.push(c);
        }
    }
}

/// Wait for one completion of `token`, its result as is.
fn one(ev: &mut EventLoop, token: Token) -> Completion {
    let c = wait_n(ev, 1).remove(0);
    assert_eq!(c.token, token, "{c:?}");
    c
}

fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf29ce484222325u64, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x100000001b3)
    })
}

/// Writes and reads from 1 B to 16 MiB at odd offsets, every byte checked
/// on both sides. Transfers are cut into 1 MiB parts, so large ones also
/// prove that a split transfer completes exactly once.
fn read_write(provider: &str) {
    const SIZE: usize = (16 << 20) + 4096;
    let p = rma_profile(provider);
    let cfg = LoopConfig {
        rma_chunk: Some(1 << 20),
        ..Default::default()
    };
    let (mut c, server) = pair(p.clone(), p, cfg, move |mut s| {
        let region = s.ev.register(SIZE, Access::ReadWrite).unwrap();
        region.write_at(0, &pattern(99, SIZE)).unwrap();
        send_tagged(&mut s.ev, &s.peer, DESCRIPTOR, &region.remote().encode());
        let (others, done) = serve_until_done(&mut s.ev, s.ep);
        assert!(
            others.is_empty(),
            "unexpected completions at the target: {others:?}"
        );
        let mut mem = vec![0u8; SIZE];
        region.read_at(0, &mut mem).unwrap();
        assert_eq!(
            fnv(&mem).to_le_bytes().as_slice(),
            done,
            "target memory differs from the model"
        );
    });
    let remote = import(&mut c);
    assert_eq!(remote.len(), SIZE as u64);
    let local = c.ev.register(SIZE, Access::Read).unwrap();
    let mut model = pattern(99, SIZE);
    let cases = [
        (1usize, 0u64),
        (7, 13),
        (4096, 4095),
        (65536 + 3, 1 << 20),
        (1 << 20, 333),
        (16 << 20, 4096),
    ];
    for (i, &(len, off)) in cases.iter().enumerate() {
        let bytes = pattern(i as u64, len);
        local.write_at(0, &bytes).unwrap();
        c.ev.write(
            &c.peer,
            local.local(0, len).unwrap(),
            &remote,
            off,
            Token(i as u64),
        )
        .unwrap();
        let done = one(&mut c.ev, Token(i as u64));
        assert_eq!(done.kind, OpKind::Write);
        done.result.unwrap();
        assert_eq!(local.in_flight(), 0, "the region is released with the completion");
        model[off as usize..off as usize + len].copy_from_slice(&bytes);
        // Read back what was written, and the bytes either side of it.
        let lo = off.saturating_sub(5) as usize;
        let hi = (off as usize + len + 5).min(SIZE);
        c.ev.read(
            &c.peer,
            local.local(7, hi - lo).unwrap(),
            &remote,
            lo as u64,
            Token(100 + i as u64),
        )
        .unwrap();
        let done = one(&mut c.ev, Token(100 + i as u64));
        assert_eq!(done.kind, OpKind::Read);
        done.result.unwrap();
        let mut back = vec![0u8; hi - lo];
        local.read_at(7, &mut back).unwrap();
        assert!(
            back == model[lo..hi],
            "{provider}: read back {len} bytes at {off}: differs"
        );
    }
    send_tagged(&mut c.ev, &c.peer, DONE, &fnv(&model).to_le_bytes());
    server.join().unwrap();
}

#[test]
fn read_write_tcp_rxm() {
    read_write("tcp;ofi_rxm");
}

/// tcp's own RDM endpoints: libfabric 1.18 and newer.
#[test]
fn read_write_tcp_rdm() {
    if !tcp_has_rdm() {
        return skipped(
            "read_write_tcp_rdm",
            "tcp has no RDM endpoints of its own before 1.18",
        );
    }
    read_write("tcp");
}

#[test]
fn read_write_shm() {
    read_write("shm");
}

#[test]
fn read_write_sockets() {
    read_write("sockets");
}

#[test]
fn read_write_udp_rxd() {
    read_write("udp;ofi_rxd");
}

/// write_data: the target hears of each write, in order, with its value,
/// and the bytes are in place when it does.
fn write_data(provider: &str) {
    let p = rma_profile(provider);
    let (mut c, server) = pair(p.clone(), p, LoopConfig::default(), move |mut s| {
        let region = s.ev.register(3 * 4096, Access::Write).unwrap();
        // Notices may use up untagged receives (FI_RX_CQ_DATA, or the
        // follow-up message where the fabric has no remote CQ data).
        for i in 0..3 {
            s.ev.recv(s.ep, Buffer::new(64), RecvOpts::default(), Token(500 + i))
                .unwrap();
        }
        // Not send_tagged: a notice may arrive in the same poll as this
        // send's completion (sockets progresses on its own thread).
        let opts = SendOpts {
            tag: Some(DESCRIPTOR),
            data: None,
        };
        s.ev.send(
            &s.peer,
            Buffer::from_slice(&region.remote().encode()),
            opts,
            Token(DESCRIPTOR),
        )
        .unwrap();
        let mut seen = Vec::new();
        let deadline = Instant::now() + TIMEOUT;
        let mut batch = Vec::new();
        while seen.len() < 3 {
            assert!(Instant::now() < deadline, "saw {seen:x?} of 3 notices");
            s.ev.poll(&mut batch, Some(Duration::from_millis(50))).unwrap();
            for n in batch.drain(..) {
                if n.token == Token(DESCRIPTOR) {
                    n.result.unwrap();
                    continue;
                }
                assert_eq!(n.kind, OpKind::RemoteWrite, "{n:?}");
                n.result.unwrap();
                let data = n.data.expect("a notice carries its value");
                let i = (data & 0xff) as usize;
                let mut got = vec![0u8; 4096];
                region.read_at(i * 4096, &mut got).unwrap();
                assert!(
                    got == pattern(i as u64, 4096),
                    "write {i} not in place at its notice"
                );
                seen.push(data);
            }
        }
        assert_eq!(
            seen,
            [0xabcd_0000, 0xabcd_0001, 0xabcd_0002],
            "notices in order, once each"
        );
        serve_until_done(&mut s.ev, s.ep);
    });
    let remote = import(&mut c);
    let local = c.ev.register(4096, Access::Read).unwrap();
    for i in 0..3u64 {
        local.write_at(0, &pattern(i, 4096)).unwrap();
        c.ev.write_data(&c.peer, local.all(), &remote, i * 4096, 0xabcd_0000 + i, Token(i))
            .unwrap();
        one(&mut c.ev, Token(i)).result.unwrap();
    }
    send_tagged(&mut c.ev, &c.peer, DONE, b"done");
    server.join().unwrap();
}

#[test]
fn write_data_tcp_rxm() {
    write_data("tcp;ofi_rxm");
}

/// tcp's own RDM endpoints: libfabric 1.18 and newer.
#[test]
fn write_data_tcp_rdm() {
    if !tcp_has_rdm() {
        return skipped(
            "write_data_tcp_rdm",
            "tcp has no RDM endpoints of its own before 1.18",
        );
    }
    write_data("tcp");
}

#[test]
fn write_data_shm() {
    write_data("shm");
}

#[test]
fn write_data_sockets() {
    write_data("sockets");
}

#[test]
fn write_data_udp_rxd() {
    write_data("udp;ofi_rxd");
}

/// write_data on framed endpoints (fabric-msg's header on every message):
/// the notice still arrives once, with its value. The follow-up-message
/// path (fabrics without remote CQ data) runs in the VM on siw0.
#[test]
fn write_data_on_framed_endpoints() {
    let p = rma_profile("tcp;ofi_rxm");
    let cfg = LoopConfig {
        force_framing: true,
        ..Default::default()
    };
    let (mut c, server) = pair(p.clone(), p, cfg, move |mut s| {
        let region = s.ev.register(4096, Access::Write).unwrap();
        send_tagged(&mut s.ev, &s.peer, DESCRIPTOR, &region.remote().encode());
        let n = wait_n(&mut s.ev, 1).remove(0);
        assert_eq!((n.kind, n.data), (OpKind::RemoteWrite, Some(7)), "{n:?}");
        let mut got = [0u8; 5];
        region.read_at(0, &mut got).unwrap();
        assert_eq!(&got, b"hello");
        serve_until_done(&mut s.ev, s.ep);
    });
    let remote = import(&mut c);
    let local = c.ev.register(5, Access::Read).unwrap();
    local.write_at(0, b"hello").unwrap();
    c.ev.write_data(&c.peer, local.all(), &remote, 0, 7, Token(1))
        .unwrap();
    one(&mut c.ev, Token(1)).result.unwrap();
    send_tagged(&mut c.ev, &c.peer, DONE, b"done");
    server.join().unwrap();
}

/// Dropping a region revokes its key: the peer's next write fails with an
/// error completion at the peer, and the memory is not touched. What else
/// breaks depends on the provider (libfabric 1.17): `sockets` reports
/// FI_EACCES and carries on; `tcp;ofi_rxm` drops the connection, so the
/// write is cancelled; `shm` and `udp;ofi_rxd` never complete it, so
/// fabric-msg reports it timed out (`LoopConfig::rma_timeout`). The test
/// coordinates through a channel, because afterwards the fabric between
/// the two may be gone.
fn revoked_key(provider: &str) {
    let p = rma_profile(provider);
    let cfg = LoopConfig {
        rma_timeout: Some(Duration::from_secs(2)),
        ..Default::default()
    };
    let (finished_tx, finished) = crossbeam_channel::bounded::<()>(1);
    let (mut c, server) = pair(p.clone(), p, cfg, move |mut s| {
        let mut mem = vec![0x5au8; 4096];
        // SAFETY: `mem` outlives the region, dropped below before mem is read.
        let region = unsafe {
            s.ev.register_borrowed(mem.as_mut_ptr(), mem.len(), Access::ReadWrite)
        }
        .unwrap();
        send_tagged(&mut s.ev, &s.peer, DESCRIPTOR, &region.remote().encode());
        let _ = recv_tagged(&mut s.ev, s.ep, DONE - 1);
        drop(region);
        let after_first = mem.clone();
        assert_eq!(&after_first[..16], &[0x11; 16], "the first write landed");
        send_tagged(&mut s.ev, &s.peer, REVOKED, b"revoked");
        // Keep the provider progressing until the client has its answer.
        let mut batch = Vec::new();
        while finished.try_recv().is_err() {
            let _ = s.ev.poll(&mut batch, Some(Duration::from_millis(20)));
        }
        assert!(
            mem == after_first,
            "{}: memory changed after its key was revoked",
            s.ev.profile().provider
        );
    });
    let remote = import(&mut c);
    let local = c.ev.register(4096, Access::Read).unwrap();
    local.write_at(0, &[0x11; 16]).unwrap();
    c.ev.write(&c.peer, local.local(0, 16).unwrap(), &remote, 0, Token(1))
        .unwrap();
    one(&mut c.ev, Token(1)).result.unwrap();
    send_tagged(&mut c.ev, &c.peer, DONE - 1, b"wrote");
    recv_tagged(&mut c.ev, c.ep, REVOKED);
    local.write_at(0, &[0x22; 4096]).unwrap();
    c.ev.write(&c.peer, local.all(), &remote, 0, Token(2)).unwrap();
    let failed = one(&mut c.ev, Token(2));
    assert_eq!(failed.kind, OpKind::Write);
    match &failed.result {
        Err(
            e @ (CompletionError::Failed { .. } | CompletionError::Cancelled | CompletionError::TimedOut(_)),
        ) => {
            eprintln!("{provider}: write with a revoked key: {e}")
        }
        other => panic!("{provider}: a write with a revoked key gave {other:?}"),
    }
    finished_tx.send(()).unwrap();
    server.join().unwrap();
    // The region stays held by the timed-out write until the loop closes.
    drop(c);
}

#[test]
fn revoked_key_tcp_rxm() {
    revoked_key("tcp;ofi_rxm");
}

/// tcp's own RDM endpoints: libfabric 1.18 and newer.
#[test]
fn revoked_key_tcp_rdm() {
    if !tcp_has_rdm() {
        return skipped(
            "revoked_key_tcp_rdm",
            "tcp has no RDM endpoints of its own before 1.18",
        );
    }
    revoked_key("tcp");
}

#[test]
fn revoked_key_shm() {
    revoked_key("shm");
}

#[test]
fn revoked_key_sockets() {
    revoked_key("sockets");
}

#[test]
fn revoked_key_udp_rxd() {
    revoked_key("udp;ofi_rxd");
}

/// Out-of-bounds and wrong-access operations are refused before posting:
/// nothing goes in flight and the target's memory is unchanged.
#[test]
fn out_of_bounds_and_wrong_access_are_refused_locally() {
    let p = rma_profile("tcp;ofi_rxm");
    let (mut c, server) = pair(p.clone(), p, LoopConfig::default(), move |mut s| {
        let region = s.ev.register(8192, Access::ReadWrite).unwrap();
        region.write_at(0, &[0x77; 8192]).unwrap();
        let window = region.remote_window(4096, 4096, Access::Read).unwrap();
        assert!(matches!(
            region.remote_window(4096, 4097, Access::Read),
            Err(Error::OutOfBounds { .. })
        ));
        send_tagged(&mut s.ev, &s.peer, DESCRIPTOR, &window.encode());
        serve_until_done(&mut s.ev, s.ep);
        let mut mem = vec![0u8; 8192];
        region.read_at(0, &mut mem).unwrap();
        assert!(
            mem.iter().all(|&b| b == 0x77),
            "refused operations changed the target"
        );
    });
    let remote = import(&mut c);
    assert_eq!((remote.len(), remote.access()), (4096, Access::Read));
    let local = c.ev.register(8192, Access::Read).unwrap();
    let e =
        c.ev.write(&c.peer, local.local(0, 8).unwrap(), &remote, 0, Token(1))
            .unwrap_err();
    assert!(matches!(e, Error::AccessDenied { .. }), "{e}");
    assert!(e.to_string().contains("granted only remote read"), "{e}");
    let e =
        c.ev.read(&c.peer, local.local(0, 16).unwrap(), &remote, 4090, Token(2))
            .unwrap_err();
    assert!(
        matches!(
            e,
            Error::OutOfBounds {
                offset: 4090,
                len: 16,
                size: 4096,
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("nothing was posted"), "{e}");
    let e = c.ev.read(
        &c.peer,
        local.local(0, 8193).unwrap_or_else(|_| local.all()),
        &remote,
        0,
        Token(3),
    );
    assert!(
        matches!(e, Err(Error::OutOfBounds { .. })),
        "8192 bytes into a 4096-byte window"
    );
    assert!(matches!(local.local(8000, 193), Err(Error::OutOfBounds { .. })));
    let e =
        c.ev.atomic(&c.peer, Atomic::FetchAdd(1), &remote, 0, Token(4))
            .unwrap_err();
    assert!(
        matches!(e, Error::AccessDenied { .. } | Error::Unsupported { .. }),
        "{e}"
    );
    assert_eq!(c.ev.in_flight(), 0, "nothing was posted");
    // A read inside the window works.
    c.ev.read(&c.peer, local.local(0, 4096).unwrap(), &remote, 0, Token(5))
        .unwrap();
    one(&mut c.ev, Token(5)).result.unwrap();
    let mut got = vec![0u8; 4096];
    local.read_at(0, &mut got).unwrap();
    assert!(got.iter().all(|&b| b == 0x77));
    send_tagged(&mut c.ev, &c.peer, DONE, b"done");
    server.join().unwrap();
}

/// Hostile or mismatched descriptors are refused by `import`.
#[test]
fn hostile_descriptors_are_refused() {
    let p = rma_profile("tcp;ofi_rxm");
    let mut ev = EventLoop::new(&p, LoopConfig::default()).unwrap();
    let _ep = ev.open_endpoint().unwrap();
    let region = ev.register(64, Access::Read).unwrap();
    let good = region.remote().encode();
    assert_eq!(ev.import(&good).unwrap(), RemoteMemory::decode(&good).unwrap());
    assert!(ev.import(&[0xff; 40]).is_err());
    assert!(ev
        .import(&vec![0u8; 4096])
        .unwrap_err()
        .to_string()
        .contains("more than"));
    assert!(ev.import(&good[..good.len() - 1]).is_err());
}

/// The region an operation uses stays registered until its completion:
/// closing is refused while it is in flight, and a pool slot returns to
/// its pool only when both the user and the operation let go.
#[test]
fn regions_and_pool_slots_outlive_their_operations() {
    let p = rma_profile("tcp;ofi_rxm");
    let (mut c, server) = pair(p.clone(), p, LoopConfig::default(), move |mut s| {
        let region = s.ev.register(1 << 20, Access::ReadWrite).unwrap();
        send_tagged(&mut s.ev, &s.peer, DESCRIPTOR, &region.remote().encode());
        serve_until_done(&mut s.ev, s.ep);
        let mut head = [0u8; 4];
        region.read_at(0, &mut head).unwrap();
        assert_eq!(&head, b"pool");
    });
    let remote = import(&mut c);

    let local = c.ev.register(1 << 20, Access::Read).unwrap();
    c.ev.read(&c.peer, local.all(), &remote, 0, Token(1)).unwrap();
    assert_eq!(local.in_flight(), 1);
    let (local, e) = local.close().unwrap_err();
    assert!(matches!(e, Error::Busy { in_flight: 1, .. }), "{e}");
    one(&mut c.ev, Token(1)).result.unwrap();
    local.close().expect("closes once its operation completed");

    // Dropped while its read is in flight: deregistration waits for the
    // completion, which still arrives, once.
    let early = c.ev.register(1 << 20, Access::Read).unwrap();
    c.ev.read(&c.peer, early.all(), &remote, 0, Token(7)).unwrap();
    drop(early);
    one(&mut c.ev, Token(7)).result.unwrap();
    assert_eq!(c.ev.in_flight(), 0);

    let pool = c.ev.register_pool(4096, 2, Access::Read).unwrap();
    let a = pool.take().unwrap();
    let b = pool.take().unwrap();
    assert!(pool.take().is_none(), "two slots only");
    a.write_at(0, b"pool").unwrap();
    c.ev.write(&c.peer, a.local(4).unwrap(), &remote, 0, Token(2))
        .unwrap();
    drop(a);
    assert_eq!(pool.available(), 0, "the write still holds its slot");
    one(&mut c.ev, Token(2)).result.unwrap();
    assert_eq!(pool.available(), 1, "the slot came back with the completion");
    drop(b);
    assert_eq!(pool.available(), 2);
    assert!(matches!(
        pool.take().unwrap().local(4097),
        Err(Error::OutOfBounds { .. })
    ));
    send_tagged(&mut c.ev, &c.peer, DONE, b"done");
    server.join().unwrap();
}

/// Two clients hammer one counter: fetch-add, compare-swap and max are
/// atomic (every fetched value is distinct, the totals add up).
fn atomics_under_contention(provider: &str, clients: u64) {
    const N: u64 = 200;
    let p = atomic_profile(provider);
    let listener = fabric_msg::Listener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let sp = p.clone();
    let server = std::thread::spawn(move || {
        let mut ev = EventLoop::new(&sp, LoopConfig::default()).unwrap();
        let ep = ev.open_endpoint().unwrap();
        let region = ev.register(64, Access::ReadWrite).unwrap();
        let peers: Vec<Peer> = (0..clients)
            .map(|_| listener.accept(&mut ev, ep).unwrap())
            .collect();
        for peer in &peers {
            send_tagged(&mut ev, peer, DESCRIPTOR, &region.remote().encode());
        }
        // Every client says DONE.
        for _ in 0..clients {
            let (others, _) = serve_until_done(&mut ev, ep);
            assert!(others.is_empty());
        }
        let mut words = [0u8; 24];
        region.read_at(0, &mut words).unwrap();
        let word = |i: usize| u64::from_le_bytes(words[i * 8..i * 8 + 8].try_into().unwrap());
        (word(0), word(1), word(2))
    });
    let threads: Vec<_> = (0..clients)
        .map(|id| {
            let p = p.clone();
            std::thread::spawn(move || {
                let mut c = client(&p, addr);
                let remote = import(&mut c);
                let mut fetched = Vec::new();
                for i in 0..N {
                    c.ev.atomic(&c.peer, Atomic::FetchAdd(1), &remote, 0, Token(i))
                        .unwrap();
                    let done = one(&mut c.ev, Token(i));
                    assert_eq!(done.kind, OpKind::Atomic);
                    fetched.push(fetched_value(&done, "fetch-add"));
                    // Increment word 1 by compare-and-swap, retrying on races.
                    let mut seen = 0;
                    loop {
                        let cas = Atomic::CompareSwap {
                            expected: seen,
                            new: seen + 1,
                        };
                        c.ev.atomic(&c.peer, cas, &remote, 8, Token(i)).unwrap();
                        let old = fetched_value(&one(&mut c.ev, Token(i)), "compare-swap");
                        if old == seen {
                            break;
                        }
                        seen = old;
                    }
                    c.ev.atomic(&c.peer, Atomic::FetchMax(id * 1000 + i), &remote, 16, Token(i))
                        .unwrap();
                    one(&mut c.ev, Token(i)).result.unwrap();
                }
                c.ev.atomic(&c.peer, Atomic::Read, &remote, 0, Token(9)).unwrap();
                let now = fetched_value(&one(&mut c.ev, Token(9)), "atomic read");
                assert!(now >= N, "read {now} after {N} own increments");
                send_tagged(&mut c.ev, &c.peer, DONE, b"done");
                fetched
            })
        })
        .collect();
    let mut all: Vec<u64> = threads.into_iter().flat_map(|t| t.join().unwrap()).collect();
    let (count, cas, max) = server.join().unwrap();
    all.sort_unstable();
    let total = clients * N;
    assert_eq!(
        all,
        (0..total).collect::<Vec<_>>(),
        "{provider}: fetched values not distinct"
    );
    assert_eq!(
        (count, cas, max),
        (total, total, (clients - 1) * 1000 + N - 1),
        "{provider}"
    );
}

#[test]
fn atomics_under_contention_sockets() {
    atomics_under_contention("sockets", 2);
}

/// udp;ofi_rxd validates u64 atomics but crashes the target on the first
/// one (libfabric #11814): providers.toml marks them broken, so asking for
/// native atomics passes rxd over with that reason, and by default its
/// atomics are emulated by fabric-msg instead of crashing the peer.
#[test]
fn atomics_are_refused_on_udp_rxd() {
    let mut req = fabric_msg::Requirements {
        caps: vec![Capability::Tagged, Capability::Msg, Capability::Atomic],
        provider: Some("udp;ofi_rxd".into()),
        domain: Some("lo".into()),
        atomics: fabric_msg::AtomicPolicy::Native,
        ..Default::default()
    };
    let e = fabric_msg::negotiate(&req, &fabric_msg::LadderConfig::default()).unwrap_err();
    assert!(e.to_string().contains("11814"), "{e}");
    req.atomics = fabric_msg::AtomicPolicy::Auto;
    let p = fabric_msg::negotiate(&req, &fabric_msg::LadderConfig::default())
        .unwrap()
        .profile;
    assert!(p.atomics.is_empty(), "{:?}", p.atomics);
    assert_eq!(
        p.atomic_carrier(fabric_msg::AtomicKind::FetchAdd),
        Some(fabric_msg::discovery::atomic::AtomicCarrier::Emulated)
    );
}

#[test]
fn atomics_under_contention_shm() {
    atomics_under_contention("shm", 2);
}

/// Where atomics were not asked for at negotiation (so the loop keeps no
/// receives for emulated ones) and the provider has none, an atomic is a
/// clear error naming it, and nothing is posted.
#[test]
fn atomics_are_unsupported_on_tcp() {
    let p = rma_profile("tcp;ofi_rxm");
    assert!(p.atomics.is_empty());
    assert_eq!(p.atomic_carrier(fabric_msg::AtomicKind::FetchAdd), None);
    let (mut c, server) = pair(p.clone(), p, LoopConfig::default(), move |mut s| {
        let region = s.ev.register(64, Access::ReadWrite).unwrap();
        send_tagged(&mut s.ev, &s.peer, DESCRIPTOR, &region.remote().encode());
        serve_until_done(&mut s.ev, s.ep);
    });
    let remote = import(&mut c);
    let e =
        c.ev.atomic(&c.peer, Atomic::FetchAdd(1), &remote, 0, Token(1))
            .unwrap_err();
    let text = e.to_string();
    assert!(matches!(e, Error::Unsupported { .. }), "{text}");
    assert!(text.contains("tcp;ofi_rxm") && text.contains("FI_SUM"), "{text}");
    assert_eq!(c.ev.in_flight(), 0);
    send_tagged(&mut c.ev, &c.peer, DONE, b"done");
    server.join().unwrap();
}
