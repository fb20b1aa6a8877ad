//! Atomics on every provider here, with one semantics (issue 14): three
//! client peers increment one counter held by a server, concurrently, by
//! fetch-add and by compare-and-swap, and it ends at the exact total; every
//! old value an increment saw is distinct. Natively where the provider
//! validates every operation (shm, sockets), emulated by fabric-msg
//! elsewhere (tcp;ofi_rxm, net, udp;ofi_rxd). Forged-key, out-of-bounds,
//! misaligned and read-only requests to the emulation are refused with a
//! clear error and the target's memory is untouched.
//!
//! `FABRIC_MSG_ATOMICS_TOTAL` scales the increments per provider (default
//! 10,000, the count).

use crate::common;
use common::*;
use fabric_msg::discovery::atomic::AtomicCarrier;
use fabric_msg::discovery::negotiate::{Capability, EndpointChoice, Requirements};
use fabric_msg::{
    negotiate, Access, Atomic, AtomicKind, AtomicPolicy, Buffer, CompletionError, Error, EventLoop,
    LadderConfig, Listener, LoopConfig, OpKind, Peer, Profile, RecvOpts, RemoteMemory, SendOpts, Token,
    WaitMode,
};
use std::time::{Duration, Instant};

const DESCRIPTOR: u64 = 1;
const DONE: u64 = 2;
const CLIENTS: u64 = 3;
/// Fetch-adds each client keeps in flight.
const WINDOW: u64 = 16;
const FA: u64 = 1 << 32;
const CAS: u64 = 2 << 32;

/// Loops that sleep on the CQ's wait fd between completions: four spinning
/// loops on a 2-core machine starve the `sockets` provider's own progress
/// threads.
fn cfg() -> LoopConfig {
    LoopConfig {
        wait: WaitMode::Block,
        ..Default::default()
    }
}

fn total() -> u64 {
    std::env::var("FABRIC_MSG_ATOMICS_TOTAL")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000)
}

fn requirements(provider: &str, policy: AtomicPolicy) -> Requirements {
    Requirements {
        caps: vec![Capability::Tagged, Capability::Msg, Capability::Atomic],
        endpoint: EndpointChoice::Rdm,
        provider: Some(provider.into()),
        domain: Some(if provider == "shm" { "shm" } else { "lo" }.into()),
        same_host: provider == "shm",
        atomics: policy,
        ..Default::default()
    }
}

fn atomics_profile(provider: &str, policy: AtomicPolicy) -> Profile {
    negotiate(&requirements(provider, policy), &LadderConfig::default())
        .unwrap_or_else(|e| panic!("negotiating {provider} with atomics: {e}"))
        .profile
}

/// Poll (the target applies emulated atomics while it polls) until `n`
/// DONE messages arrived.
fn serve_until_done(ev: &mut EventLoop, ep: fabric_msg::EndpointId, n: u64) {
    for i in 0..n {
        let opts = RecvOpts {
            tag: Some((DONE, 0)),
            from: None,
        };
        ev.recv(ep, Buffer::new(64), opts, Token(DONE + i)).unwrap();
    }
    let deadline = Instant::now() + TIMEOUT * 6;
    let mut batch = Vec::new();
    let mut done = 0;
    while done < n {
        assert!(Instant::now() < deadline, "server: {done} of {n} DONE messages");
        ev.poll(&mut batch, Some(Duration::from_millis(50))).unwrap();
        for c in batch.drain(..) {
            c.result.unwrap();
            done += 1;
        }
    }
}

/// One client's share: `n` increments, half by windowed fetch-adds, half
/// by compare-and-swap (one at a time, retrying on races). Returns the old
/// value each increment saw.
fn hammer(c: &mut Side, remote: &RemoteMemory, n: u64) -> Vec<u64> {
    let (fa_total, cas_total) = (n / 2, n - n / 2);
    let (mut fa_posted, mut fa_done, mut cas_done) = (0, 0, 0);
    let mut cas_guess = 0u64;
    let mut cas_in_flight = false;
    let mut seen = Vec::with_capacity(n as usize);
    let mut batch = Vec::new();
    let deadline = Instant::now() + TIMEOUT * 6;
    while fa_done < fa_total || cas_done < cas_total {
        while fa_posted < fa_total && fa_posted - fa_done < WINDOW {
            c.ev.atomic(&c.peer, Atomic::FetchAdd(1), remote, 0, Token(FA | fa_posted))
                .unwrap();
            fa_posted += 1;
        }
        if !cas_in_flight && cas_done < cas_total {
            let cas = Atomic::CompareSwap {
                expected: cas_guess,
                new: cas_guess + 1,
            };
            c.ev.atomic(&c.peer, cas, remote, 0, Token(CAS)).unwrap();
            cas_in_flight = true;
        }
        assert!(
            Instant::now() < deadline,
            "client: {fa_done}/{fa_total} fetch-adds and {cas_done}/{cas_total} compare-swaps after {:?}",
            TIMEOUT * 6
        );
        c.ev.poll(&mut batch, Some(Duration::from_millis(50))).unwrap();
        for done in batch.drain(..) {
            assert_eq!(done.kind, OpKind::Atomic, "{done:?}");
            if let Err(e) = &done.result {
                panic!("atomic {:#x} failed: {e}", done.token.0);
            }
            let old = done.value.expect("fetching atomics return the old value");
            if done.token == Token(CAS) {
                cas_in_flight = false;
                if old == cas_guess {
                    seen.push(old);
                    cas_done += 1;
                    cas_guess = old + 1;
                } else {
                    cas_guess = old;
                }
            } else {
                seen.push(old);
                fa_done += 1;
            }
        }
    }
    seen
}

/// Three clients, one counter, the exact total.
fn counter_ends_exact(provider: &str, policy: AtomicPolicy) {
    let p = atomics_profile(provider, policy);
    let total = total();
    let listener = Listener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let sp = p.clone();
    let server = std::thread::spawn(move || {
        let mut ev = EventLoop::new(&sp, cfg()).unwrap();
        let ep = ev.open_endpoint().unwrap();
        let region = ev.register(64, Access::ReadWrite).unwrap();
        let peers: Vec<Peer> = (0..CLIENTS)
            .map(|_| listener.accept(&mut ev, ep).unwrap())
            .collect();
        for peer in &peers {
            send_tagged(&mut ev, peer, DESCRIPTOR, &region.remote().encode());
        }
        serve_until_done(&mut ev, ep, CLIENTS);
        let mut w = [0u8; 16];
        region.read_at(0, &mut w).unwrap();
        (
            u64::from_le_bytes(w[..8].try_into().unwrap()),
            u64::from_le_bytes(w[8..].try_into().unwrap()),
        )
    });
    let started = Instant::now();
    let clients: Vec<_> = (0..CLIENTS)
        .map(|id| {
            let p = p.clone();
            let n = total / CLIENTS + u64::from(id < total % CLIENTS);
            std::thread::spawn(move || {
                let mut ev = EventLoop::new(&p, cfg()).expect("client loop");
                let ep = ev.open_endpoint().expect("client endpoint");
                let peer = fabric_msg::connect(&mut ev, ep, addr, TIMEOUT).expect("connect");
                let mut c = Side { ev, ep, peer };
                let bytes = recv_tagged(&mut c.ev, c.ep, DESCRIPTOR);
                let remote = c.ev.import(&bytes).unwrap();
                let seen = hammer(&mut c, &remote, n);
                send_tagged(&mut c.ev, &c.peer, DONE, b"done");
                seen
            })
        })
        .collect();
    let mut seen: Vec<u64> = clients.into_iter().flat_map(|t| t.join().unwrap()).collect();
    let (counter, untouched) = server.join().unwrap();
    let carrier = p.atomic_carrier(AtomicKind::FetchAdd).unwrap();
    eprintln!(
        "{provider}: {total} increments by {CLIENTS} peers, {carrier}, in {:?}",
        started.elapsed()
    );
    assert_eq!(counter, total, "{provider} ({carrier}): the counter");
    assert_eq!(untouched, 0, "{provider}: the word after the counter");
    seen.sort_unstable();
    assert!(
        seen.iter().copied().eq(0..total),
        "{provider} ({carrier}): the old values increments saw are not 0..{total}, each once"
    );
}

fn carrier_is(provider: &str, policy: AtomicPolicy, want: AtomicCarrier) {
    let p = atomics_profile(provider, policy);
    for op in AtomicKind::ALL {
        assert_eq!(p.atomic_carrier(op), Some(want), "{provider}: {op}");
    }
}

#[test]
fn exact_total_on_tcp_rxm_emulated() {
    carrier_is("tcp;ofi_rxm", AtomicPolicy::Auto, AtomicCarrier::Emulated);
    counter_ends_exact("tcp;ofi_rxm", AtomicPolicy::Auto);
}

#[test]
fn exact_total_on_net_or_tcp_rdm_emulated() {
    let provider = if tcp_has_rdm() { "tcp" } else { "net" };
    carrier_is(provider, AtomicPolicy::Auto, AtomicCarrier::Emulated);
    counter_ends_exact(provider, AtomicPolicy::Auto);
}

#[test]
fn exact_total_on_udp_rxd_emulated() {
    // rxd validates atomics but crashes the target (providers.toml marks
    // them broken): emulated.
    carrier_is("udp;ofi_rxd", AtomicPolicy::Auto, AtomicCarrier::Emulated);
    counter_ends_exact("udp;ofi_rxd", AtomicPolicy::Auto);
}

#[test]
fn exact_total_on_sockets_native_and_emulated() {
    carrier_is("sockets", AtomicPolicy::Auto, AtomicCarrier::Native);
    counter_ends_exact("sockets", AtomicPolicy::Auto);
    counter_ends_exact("sockets", AtomicPolicy::Emulated);
}

#[test]
fn exact_total_on_shm_native_and_emulated() {
    carrier_is("shm", AtomicPolicy::Auto, AtomicCarrier::Native);
    counter_ends_exact("shm", AtomicPolicy::Auto);
    counter_ends_exact("shm", AtomicPolicy::Emulated);
}

/// A descriptor forged from `real` through serde, as an application could.
fn forge(real: &RemoteMemory, addr_delta: i64, len: u64, key: u64) -> RemoteMemory {
    let mut v = serde_json::to_value(real).unwrap();
    let addr = v["addr"].as_u64().unwrap().wrapping_add_signed(addr_delta);
    v["addr"] = addr.into();
    v["len"] = len.into();
    v["key"] = key.into();
    v["access"] = "ReadWrite".into();
    serde_json::from_value(v).unwrap()
}

/// Forged key, out of bounds, misaligned, read-only and revoked: each is
/// refused by the target with a clear error at the origin, and the
/// target's memory (the shared page, its read-only neighbour, and the
/// bytes around) is unchanged; the loop keeps working afterwards.
#[test]
fn hostile_emulated_requests_are_refused_and_touch_nothing() {
    let p = atomics_profile("tcp;ofi_rxm", AtomicPolicy::Auto);
    assert!(p.atomics.is_empty(), "tcp;ofi_rxm has no native atomics here");
    let (mut c, server) = pair(p.clone(), p, LoopConfig::default(), move |mut s| {
        let shared = s.ev.register(4096, Access::ReadWrite).unwrap();
        let read_only = s.ev.register(4096, Access::Read).unwrap();
        let revoked = s.ev.register(64, Access::ReadWrite).unwrap();
        shared.write_at(0, &[0x5a; 4096]).unwrap();
        read_only.write_at(0, &[0x6b; 4096]).unwrap();
        let mut descs = Vec::new();
        for r in [&shared, &read_only, &revoked] {
            descs.extend_from_slice(&(r.remote().encode().len() as u32).to_le_bytes());
            descs.extend_from_slice(&r.remote().encode());
        }
        send_tagged(&mut s.ev, &s.peer, DESCRIPTOR, &descs);
        drop(revoked);
        serve_until_done(&mut s.ev, s.ep, 1);
        let mut a = vec![0u8; 4096];
        let mut b = vec![0u8; 4096];
        shared.read_at(0, &mut a).unwrap();
        read_only.read_at(0, &mut b).unwrap();
        (a, b)
    });
    let bytes = recv_tagged(&mut c.ev, c.ep, DESCRIPTOR);
    let mut descs = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        let n = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
        descs.push(c.ev.import(&bytes[at + 4..at + 4 + n]).unwrap());
        at += 4 + n;
    }
    let (shared, read_only, revoked) = (&descs[0], &descs[1], &descs[2]);
    let key = |r: &RemoteMemory| serde_json::to_value(r).unwrap()["key"].as_u64().unwrap();
    let cases: Vec<(&str, RemoteMemory, u64, Atomic, &str)> = vec![
        (
            "forged key",
            forge(shared, 0, 4096, key(shared) ^ 0x1),
            0,
            Atomic::FetchAdd(1),
            "key",
        ),
        (
            "random key",
            forge(shared, 0, 4096, 0x0123_4567_89ab_cdef),
            8,
            Atomic::Swap(7),
            "key",
        ),
        (
            "past the end",
            forge(shared, 4096, 4096, key(shared)),
            0,
            Atomic::FetchAdd(1),
            "inside",
        ),
        (
            "before the start",
            forge(shared, -8, 4096, key(shared)),
            0,
            Atomic::FetchAdd(1),
            "wraps",
        ),
        (
            "misaligned",
            forge(shared, 4, 4096, key(shared)),
            0,
            Atomic::FetchAdd(1),
            "aligned",
        ),
        (
            "read-only region",
            forge(read_only, 0, 4096, key(read_only)),
            0,
            Atomic::FetchAdd(1),
            "access",
        ),
        ("revoked key", revoked.clone(), 0, Atomic::FetchAdd(1), "revoked"),
    ];
    for (i, (what, desc, offset, op, says)) in cases.into_iter().enumerate() {
        let t = Token(100 + i as u64);
        match c.ev.atomic(&c.peer, op, &desc, offset, t) {
            // Caught at the origin already (alignment of the address).
            Err(e) => assert!(e.to_string().contains(says), "{what}: {e}"),
            Ok(()) => {
                let done = wait_n(&mut c.ev, 1).remove(0);
                assert_eq!(done.token, t, "{what}");
                match &done.result {
                    Err(e @ CompletionError::Failed { prov_text, .. }) => {
                        assert!(prov_text.contains(says), "{what}: {e}")
                    }
                    other => panic!("{what}: expected a refusal, got {other:?}"),
                }
                assert_eq!(done.value, None, "{what}");
            }
        }
    }
    // The loop still works: a good fetch-add.
    c.ev.atomic(&c.peer, Atomic::FetchAdd(1), shared, 64, Token(9))
        .unwrap();
    let ok = wait_n(&mut c.ev, 1).remove(0);
    assert_eq!(ok.value, Some(0x5a5a_5a5a_5a5a_5a5a), "{ok:?}");
    send_tagged(&mut c.ev, &c.peer, DONE, b"done");
    let (a, b) = server.join().unwrap();
    let mut want = vec![0x5a; 4096];
    want[64..72].copy_from_slice(&(0x5a5a_5a5a_5a5a_5a5au64 + 1).to_ne_bytes());
    assert!(
        a == want,
        "the shared region changed beyond the one good fetch-add"
    );
    assert!(b.iter().all(|&x| x == 0x6b), "the read-only region changed");
}

/// Applications cannot send or receive in the reserved tag space.
#[test]
fn the_reserved_tag_bit_is_refused() {
    let p = atomics_profile("tcp;ofi_rxm", AtomicPolicy::Auto);
    let (mut c, server) = pair(p.clone(), p, LoopConfig::default(), drop);
    let opts = SendOpts {
        tag: Some(1 << 63),
        data: None,
    };
    let e = c.ev.send(&c.peer, Buffer::new(1), opts, Token(1)).unwrap_err();
    assert!(e.error.to_string().contains("reserved"), "{}", e.error);
    let e = c.ev.inject(&c.peer, b"x", opts).unwrap_err();
    assert!(matches!(e, Error::Usage(_)), "{e}");
    let ropts = RecvOpts {
        tag: Some((1 << 63, 0)),
        from: None,
    };
    let e = c.ev.recv(c.ep, Buffer::new(1), ropts, Token(2)).unwrap_err();
    assert!(e.error.to_string().contains("reserved"), "{}", e.error);
    assert_eq!(c.ev.in_flight(), 0, "the loop's own receives are not counted");
    server.join().unwrap();
}

/// `AtomicPolicy::Native` keeps the old behaviour: only providers with
/// native atomics, and a clear refusal where there are none.
#[test]
fn native_policy_refuses_providers_without_atomics() {
    let e = negotiate(
        &requirements("tcp;ofi_rxm", AtomicPolicy::Native),
        &LadderConfig::default(),
    )
    .unwrap_err();
    assert!(e.to_string().contains("tcp;ofi_rxm"), "{e}");
    let e = negotiate(
        &requirements("udp;ofi_rxd", AtomicPolicy::Native),
        &LadderConfig::default(),
    )
    .unwrap_err();
    assert!(e.to_string().contains("11814"), "{e}");
}
