//! Emulated atomics against a forger on the same fabric: an endpoint that
//! never did a handshake, with only the public API, sending replies and
//! requests in the atomics' tag space (a loop negotiated without atomics
//! reserves no tag bit, so it may). Origin, target and forger are three
//! loops with three endpoints, as three processes would have; the fabric
//! cannot tell them apart from processes.
//!
//! - Thousands of replies with guessed tags (every slot and generation the
//!   old tag scheme would use) complete nothing: the pending operation
//!   returns the target's value once the target polls, and so do the next
//!   ones (`forged_replies_complete_nothing_*`).
//! - A reply on the operation's own tag without its cookie (from the
//!   endpoint the origin sent the request to) is dropped and counted, and the
//!   operation completes with the reply that carries it
//!   (`a_reply_counts_only_with_the_cookie_*`).
//! - A request the origin sends again half way to its deadline (the target
//!   did not poll) is applied once (`a_request_sent_again_is_applied_once_*`).
//! - Frames longer than a request (300 B to 1 MiB) on the requests' tag are
//!   cut and dropped at the target, which answers the next honest request
//!   (`oversized_frames_to_the_request_receive_are_dropped_*`).
//! - Requests naming origins that are no peer of the target are dropped
//!   unapplied, and an honest origin is answered
//!   (`requests_naming_other_origins_are_dropped_and_an_honest_one_is_answered`).

use crate::common;
use common::*;
use fabric_msg::discovery::negotiate::{Capability, EndpointChoice, Requirements};
use fabric_msg::discovery::profile::Agreement;
use fabric_msg::{
    negotiate, Access, Atomic, AtomicCounters, AtomicKind, AtomicPolicy, Buffer, Completion, EndpointId,
    EventLoop, LadderConfig, LoopConfig, OpKind, Peer, Profile, RemoteMemory, SendOpts, Token,
};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn atomics_profile(provider: &str) -> Profile {
    let req = Requirements {
        caps: vec![Capability::Tagged, Capability::Msg, Capability::Atomic],
        endpoint: EndpointChoice::Rdm,
        provider: Some(provider.into()),
        domain: Some(if provider == "shm" { "shm" } else { "lo" }.into()),
        same_host: provider == "shm",
        atomics: AtomicPolicy::Emulated,
        ..Default::default()
    };
    negotiate(&req, &LadderConfig::default())
        .unwrap_or_else(|e| panic!("negotiating {provider} with atomics: {e}"))
        .profile
}

struct Node {
    ev: EventLoop,
    ep: EndpointId,
}

fn node(p: &Profile, cfg: LoopConfig) -> Node {
    let mut ev = EventLoop::new(p, cfg).expect("loop");
    let ep = ev.open_endpoint().expect("endpoint");
    Node { ev, ep }
}

fn agreement(p: &Profile) -> Agreement {
    Agreement {
        max_msg_size: p.max_msg_size,
        cq_data_size: p.cq_data_size as u32,
        tag_bits: p.tag_bits,
    }
}

fn link_to(from: &mut Node, name: &[u8]) -> Peer {
    let a = agreement(from.ev.profile());
    from.ev.insert_peer(from.ep, name, a).expect("insert")
}

/// A target in a thread of its own, connected to the origin through the
/// bootstrap (`common::pair`), serving one region whose first words hold
/// `init`; `pause` stops its polling, as a target that computes.
struct Target {
    paused: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<(AtomicCounters, Vec<u64>)>>,
    name: Vec<u8>,
}

const REGION: u64 = 9;

/// The origin's side, its target, and the target region's descriptor.
fn start(p: &Profile, origin_cfg: LoopConfig, init: [u64; 2]) -> (Side, Target, RemoteMemory) {
    let paused = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let (pa, st) = (paused.clone(), stop.clone());
    // A target that computes is not a lost one here, however loaded the machine.
    let origin_cfg = LoopConfig {
        peer_timeout: Some(Duration::from_secs(120)),
        ..origin_cfg
    };
    let (mut origin, thread) = pair(p.clone(), p.clone(), origin_cfg, move |mut s| {
        let region = s.ev.register(64, Access::ReadWrite).unwrap();
        region.write_at(0, &init[0].to_le_bytes()).unwrap();
        region.write_at(8, &init[1].to_le_bytes()).unwrap();
        let desc = region.remote().encode();
        let mut msg = (desc.len() as u32).to_le_bytes().to_vec();
        msg.extend_from_slice(&desc);
        msg.extend_from_slice(&s.ev.endpoint_name(s.ep).unwrap());
        send_tagged(&mut s.ev, &s.peer, REGION, &msg);
        let mut batch = Vec::new();
        while !st.load(Ordering::SeqCst) {
            if pa.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(1));
                continue;
            }
            s.ev.poll(&mut batch, Some(Duration::from_millis(1)))
                .expect("poll");
            batch.retain(|c| c.kind != OpKind::Send);
            assert!(batch.is_empty(), "no operations of its own: {batch:?}");
        }
        let mut words = Vec::new();
        for at in [0, 8] {
            let mut w = [0u8; 8];
            region.read_at(at, &mut w).unwrap();
            words.push(u64::from_le_bytes(w));
        }
        (s.ev.atomic_counters(), words)
    });
    let msg = recv_tagged(&mut origin.ev, origin.ep, REGION);
    let n = u32::from_le_bytes(msg[..4].try_into().unwrap()) as usize;
    let remote = origin.ev.import(&msg[4..4 + n]).unwrap();
    let name = msg[4 + n..].to_vec();
    (
        origin,
        Target {
            paused,
            stop,
            thread: Some(thread),
            name,
        },
        remote,
    )
}

impl Drop for Target {
    fn drop(&mut self) {
        // A test that failed must not leave its target polling into the next.
        self.stop.store(true, Ordering::SeqCst);
    }
}

impl Target {
    fn pause(&mut self, now: bool) {
        self.paused.store(now, Ordering::SeqCst);
        // Let a poll in progress end.
        std::thread::sleep(Duration::from_millis(20));
    }

    fn tick(&mut self) {}

    /// What the target counted, and its region's two words.
    fn stop(mut self) -> (AtomicCounters, Vec<u64>) {
        self.stop.store(true, Ordering::SeqCst);
        let thread = self.thread.take().expect("stopped once");
        thread.join().expect("target thread")
    }
}

/// Poll `ev` (and `t`) for `d`, or until `until_done` says so; what `ev` gave.
fn poll_for(
    ev: &mut EventLoop,
    t: &mut Target,
    d: Duration,
    until_done: impl Fn() -> bool,
) -> Vec<Completion> {
    let mut got = Vec::new();
    let mut batch = Vec::new();
    let until = Instant::now() + d;
    while Instant::now() < until && !until_done() {
        ev.poll(&mut batch, Some(Duration::from_millis(1))).expect("poll");
        got.append(&mut batch);
        t.tick();
    }
    got
}

/// Poll the origin (and `t`) until `n` completions came.
fn complete(origin: &mut EventLoop, t: &mut Target, n: usize) -> Vec<Completion> {
    let got = try_complete(origin, t, n);
    assert_eq!(got.len(), n, "{} of {n} atomics completed", got.len());
    got
}

/// Poll the origin (and `t`) until `n` completions came, or TIMEOUT passed.
fn try_complete(origin: &mut EventLoop, t: &mut Target, n: usize) -> Vec<Completion> {
    let mut got = Vec::new();
    let mut batch = Vec::new();
    let until = Instant::now() + TIMEOUT;
    while got.len() < n && Instant::now() < until {
        origin
            .poll(&mut batch, Some(Duration::from_millis(1)))
            .expect("poll");
        got.append(&mut batch);
        t.tick();
    }
    got
}

fn value(c: &Completion) -> u64 {
    fetched_value(c, "a fetching atomic")
}

/// Send `msgs` from the forger, keeping at most a window in flight, until
/// they are all sent or the receiver stops taking them (shm holds only so
/// many unmatched messages: the forger is then simply held up); how many
/// were sent.
fn flood(forger: &mut EventLoop, to: &Peer, msgs: impl Iterator<Item = (u64, Vec<u8>)>) -> u64 {
    let mut out = Vec::new();
    let mut sent = 0;
    let until = Instant::now() + TIMEOUT;
    for (i, (tag, bytes)) in msgs.enumerate() {
        while forger.in_flight() >= 64 && Instant::now() < until {
            forger
                .poll(&mut out, Some(Duration::from_millis(1)))
                .expect("forger poll");
            out.clear();
        }
        if Instant::now() >= until {
            break;
        }
        let opts = SendOpts {
            tag: Some(tag),
            data: None,
        };
        match forger.send(to, Buffer::from_slice(&bytes), opts, Token(i as u64)) {
            Ok(()) => sent += 1,
            Err(_) => break,
        }
    }
    let until = Instant::now() + Duration::from_secs(2);
    while forger.in_flight() > 0 && Instant::now() < until {
        forger
            .poll(&mut out, Some(Duration::from_millis(1)))
            .expect("forger poll");
        out.clear();
    }
    sent
}

fn forged_replies_complete_nothing(provider: &str) {
    let p = atomics_profile(provider);
    let (mut origin, mut target, remote) = start(
        &p,
        LoopConfig {
            rma_timeout: None,
            ..Default::default()
        },
        [41, 0],
    );
    let to_target = origin.peer;
    // A loop without atomics: no tag bit reserved, so it may send in the space.
    let mut forger = node(&profile(provider), LoopConfig::default());
    let origin_name = origin.ev.endpoint_name(origin.ep).unwrap();
    let to_origin = link_to(&mut forger, &origin_name);
    // Connected first (a read), then the target computes.
    origin
        .ev
        .atomic(&to_target, Atomic::Read, &remote, 0, Token(0))
        .unwrap();
    assert_eq!(value(&complete(&mut origin.ev, &mut target, 1)[0]), 41);
    target.pause(true);
    origin
        .ev
        .atomic(&to_target, Atomic::FetchAdd(1), &remote, 0, Token(1))
        .unwrap();
    // Replies for slots 0..40 at generations 0..100 (the tags the old scheme
    // gave), each "Ok, 0x4242…" in the old layout and the new one. shm keeps
    // unmatched messages in the receiver's one command queue, which a flood
    // fills for every sender (a denial of service docs/atomics.md names):
    // there, 20 slots at 10 generations.
    let (slots, generations) = if provider == "shm" { (20, 10) } else { (40, 100) };
    let bits = p.tag_bits.clamp(40, 64);
    let (request_bit, reply_bit) = (1u64 << (bits - 1), 1u64 << (bits - 2));
    let forged: Vec<(u64, Vec<u8>)> = (0..slots)
        .flat_map(|slot| {
            (0..generations).map(move |generation| {
                let mut reply = Vec::with_capacity(16);
                if generation % 2 == 0 {
                    reply.extend_from_slice(b"FMAr\0\0\0\0");
                } else {
                    reply.extend_from_slice(&[0; 8]);
                }
                reply.extend_from_slice(&0x4242_4242_4242_4242u64.to_le_bytes());
                (request_bit | reply_bit | generation << 32 | slot, reply)
            })
        })
        .collect();
    let done = Arc::new(AtomicBool::new(false));
    let d = done.clone();
    let flooding = std::thread::spawn(move || {
        let n = flood(&mut forger.ev, &to_origin, forged.into_iter());
        d.store(true, Ordering::SeqCst);
        n
    });
    let early = poll_for(&mut origin.ev, &mut target, TIMEOUT, || {
        done.load(Ordering::SeqCst)
    });
    let sent = flooding.join().expect("forger");
    assert_eq!(sent, slots * generations);
    let early2 = poll_for(&mut origin.ev, &mut target, Duration::from_millis(500), || false);
    assert!(
        early.is_empty() && early2.is_empty(),
        "completed before the target polled: {early:?} {early2:?}"
    );
    // The target polls: the real answer, and the next operations' too.
    target.pause(false);
    assert_eq!(
        value(&complete(&mut origin.ev, &mut target, 1)[0]),
        41,
        "the target's old value, not a forged one"
    );
    origin
        .ev
        .atomic(&to_target, Atomic::FetchAdd(1), &remote, 0, Token(2))
        .unwrap();
    assert_eq!(value(&complete(&mut origin.ev, &mut target, 1)[0]), 42);
    origin
        .ev
        .atomic(&to_target, Atomic::Read, &remote, 0, Token(3))
        .unwrap();
    assert_eq!(value(&complete(&mut origin.ev, &mut target, 1)[0]), 43);
    let (_, words) = target.stop();
    assert_eq!(words[0], 43, "two fetch-adds, each applied once");
    eprintln!(
        "{provider}: {sent} forged replies sent; origin counted {:?}",
        origin.ev.atomic_counters()
    );
}

#[test]
fn forged_replies_complete_nothing_tcp_rxm() {
    forged_replies_complete_nothing("tcp;ofi_rxm");
}

#[test]
fn forged_replies_complete_nothing_shm() {
    forged_replies_complete_nothing("shm");
}

fn a_request_sent_again_is_applied_once(provider: &str) {
    let p = atomics_profile(provider);
    let cfg = LoopConfig {
        rma_timeout: Some(Duration::from_secs(6)),
        ..Default::default()
    };
    let (mut origin, mut target, remote) = start(&p, cfg, [0, 100]);
    let to_target = origin.peer;
    origin
        .ev
        .atomic(&to_target, Atomic::Read, &remote, 8, Token(6))
        .unwrap();
    assert_eq!(value(&complete(&mut origin.ev, &mut target, 1)[0]), 100);
    target.pause(true);
    origin
        .ev
        .atomic(&to_target, Atomic::FetchAdd(5), &remote, 8, Token(7))
        .unwrap();
    // Past half the timeout with the target silent: the request goes again.
    let early = poll_for(&mut origin.ev, &mut target, Duration::from_millis(3600), || false);
    assert!(early.is_empty(), "{early:?}");
    target.pause(false);
    let c = complete(&mut origin.ev, &mut target, 1);
    assert_eq!(value(&c[0]), 100);
    // The second copy arrives too, and is answered from memory.
    let more = poll_for(&mut origin.ev, &mut target, Duration::from_millis(500), || false);
    assert!(more.is_empty(), "one completion per operation: {more:?}");
    let (counted, words) = target.stop();
    assert_eq!(words[1], 105, "applied exactly once");
    assert_eq!(counted.repeated_requests, 1, "{counted:?}");
}

#[test]
fn a_request_sent_again_is_applied_once_tcp_rxm() {
    a_request_sent_again_is_applied_once("tcp;ofi_rxm");
}

#[test]
fn a_request_sent_again_is_applied_once_shm() {
    a_request_sent_again_is_applied_once("shm");
}

/// A request as docs/atomics.md lays it out, naming `origin`.
fn request(addr: u64, key: u64, cookie: u64, reply_tag: u64, origin: &[u8]) -> Vec<u8> {
    let op = AtomicKind::ALL
        .iter()
        .position(|&o| o == AtomicKind::FetchAdd)
        .unwrap() as u8;
    let mut r = vec![0u8; 64];
    r[..4].copy_from_slice(b"FMAq");
    r[4] = op;
    for (at, v) in [
        (8, reply_tag),
        (16, addr),
        (24, key),
        (32, 1),
        (40, 0),
        (56, cookie),
    ] {
        r[at..at + 8].copy_from_slice(&v.to_le_bytes());
    }
    r[48..50].copy_from_slice(&(origin.len() as u16).to_le_bytes());
    r.extend_from_slice(origin);
    r
}

/// tcp;ofi_rxm reports no sender, so the target answers the name a request
/// carries, and only a peer's: 4,100 requests from the forger, each naming
/// another address (127.77.x.y, port 9, where nothing listens), are dropped
/// unapplied without an address inserted for any. An honest origin (a peer)
/// is answered with the right value, and the memory changed once.
#[test]
fn requests_naming_other_origins_are_dropped_and_an_honest_one_is_answered() {
    let provider = "tcp;ofi_rxm";
    let p = atomics_profile(provider);
    let (mut origin, mut target, remote) = start(&p, LoopConfig::default(), [7, 0]);
    let honest = origin.peer;
    let mut forger = node(&profile(provider), LoopConfig::default());
    let to_target = link_to(&mut forger, &target.name);
    let own = forger.ev.endpoint_name(forger.ep).unwrap();
    assert_eq!(own.len(), 16, "a sockaddr_in");
    let bits = p.tag_bits.clamp(40, 64);
    let request_bit = 1u64 << (bits - 1);
    // The real region's address and key: applied, each would add 1.
    let desc = serde_json::to_value(&remote).unwrap();
    let (addr, key) = (desc["addr"].as_u64().unwrap(), desc["key"].as_u64().unwrap());
    let fakes = (0..4100u32).map(|i| {
        let mut name = own.clone();
        name[2..4].copy_from_slice(&9u16.to_be_bytes());
        name[4..8].copy_from_slice(&[127, 77, (i >> 8) as u8, i as u8]);
        (request_bit, request(addr, key, u64::from(i) + 1, 0, &name))
    });
    let sent = flood(&mut forger.ev, &to_target, fakes);
    assert_eq!(sent, 4100);
    // Let the target answer (or fail to reach) the fake origins.
    std::thread::sleep(Duration::from_secs(3));
    // The honest origin's first atomic: a new origin for the full table.
    origin
        .ev
        .atomic(&honest, Atomic::FetchAdd(1), &remote, 0, Token(1))
        .unwrap();
    let c = try_complete(&mut origin.ev, &mut target, 1);
    let (counted, words) = target.stop();
    eprintln!("{provider}: target counted {counted:?}");
    assert_eq!(c.len(), 1, "the honest origin was not answered: {counted:?}");
    assert_eq!(value(&c[0]), 7, "{counted:?}");
    assert_eq!(words[0], 8);
    assert_eq!(counted.unknown_origins, 4100, "{counted:?}");
}

/// The origin's "target" is a forger's endpoint (it knows the reply tag and
/// the cookie, as only the real target can): its reply with another cookie
/// is dropped and counted, and the operation waits; the reply with the
/// cookie completes it.
fn a_reply_counts_only_with_the_cookie(provider: &str) {
    let p = atomics_profile(provider);
    let mut origin = node(&p, LoopConfig::default());
    let mut forger = node(&profile(provider), LoopConfig::default());
    // A region only for a well-formed descriptor; the request goes to the forger.
    let region = origin.ev.register(64, Access::ReadWrite).unwrap();
    let remote = origin.ev.import(&region.remote().encode()).unwrap();
    let to_forger = link_to(&mut origin, &forger.ev.endpoint_name(forger.ep).unwrap());
    let origin_name = origin.ev.endpoint_name(origin.ep).unwrap();
    let bits = p.tag_bits.clamp(40, 64);
    let request_bit = 1u64 << (bits - 1);
    let forging = std::thread::spawn(move || {
        let opts = fabric_msg::RecvOpts {
            tag: Some((request_bit, 0)),
            from: None,
        };
        forger
            .ev
            .recv(forger.ep, Buffer::new(512), opts, Token(1))
            .unwrap();
        let mut batch = Vec::new();
        let until = Instant::now() + TIMEOUT;
        let request = loop {
            assert!(Instant::now() < until, "no request reached the forger");
            forger
                .ev
                .poll(&mut batch, Some(Duration::from_millis(2)))
                .unwrap();
            if let Some(c) = batch.pop() {
                break c.buffer.unwrap().as_slice().to_vec();
            }
        };
        let word = |at: usize| u64::from_le_bytes(request[at..at + 8].try_into().unwrap());
        let (reply_tag, cookie) = (word(8), word(56));
        let to_origin = link_to(&mut forger, &origin_name);
        let reply = |cookie: u64, value: u64| {
            let mut r = ((cookie & ((1 << 56) - 1)) << 8).to_le_bytes().to_vec();
            r.extend_from_slice(&value.to_le_bytes());
            r
        };
        for (c, v) in [(cookie ^ 0x100, 0x4242), (cookie, 77)] {
            let opts = SendOpts {
                tag: Some(reply_tag),
                data: None,
            };
            forger
                .ev
                .send(&to_origin, Buffer::from_slice(&reply(c, v)), opts, Token(2))
                .unwrap();
            let until = Instant::now() + Duration::from_millis(500);
            while Instant::now() < until {
                forger
                    .ev
                    .poll(&mut batch, Some(Duration::from_millis(2)))
                    .unwrap();
            }
        }
    });
    origin
        .ev
        .atomic(&to_forger, Atomic::FetchAdd(1), &remote, 0, Token(9))
        .unwrap();
    let mut got = Vec::new();
    let mut batch = Vec::new();
    let until = Instant::now() + TIMEOUT;
    while got.is_empty() && Instant::now() < until {
        origin
            .ev
            .poll(&mut batch, Some(Duration::from_millis(2)))
            .unwrap();
        got.append(&mut batch);
    }
    forging.join().expect("forger");
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(
        value(&got[0]),
        77,
        "the reply with the cookie, not the one without"
    );
    assert_eq!(
        origin.ev.atomic_counters().forged_replies,
        1,
        "{:?}",
        origin.ev.atomic_counters()
    );
}

#[test]
fn a_reply_counts_only_with_the_cookie_tcp_rxm() {
    a_reply_counts_only_with_the_cookie("tcp;ofi_rxm");
}

#[test]
fn a_reply_counts_only_with_the_cookie_shm() {
    a_reply_counts_only_with_the_cookie("shm");
}

/// Frames longer than a request, at every size class (eager, segmented,
/// rendezvous on tcp;ofi_rxm), sent on the requests' tag by a forger: each
/// is cut and dropped at the target (counted), which stays up and answers
/// the next honest request.
fn oversized_frames_to_the_request_receive_are_dropped(provider: &str) {
    let p = atomics_profile(provider);
    let (mut origin, target, remote) = start(&p, LoopConfig::default(), [5, 0]);
    let honest = origin.peer;
    let mut forger = node(&profile(provider), LoopConfig::default());
    let to_target = link_to(&mut forger, &target.name);
    let bits = p.tag_bits.clamp(40, 64);
    let request_bit = 1u64 << (bits - 1);
    let sizes = [300usize, 4097, 20_000, 70_000, 1 << 20];
    let frames = sizes.iter().map(|&n| (request_bit, vec![0x5a; n]));
    let sent = flood(&mut forger.ev, &to_target, frames);
    assert_eq!(sent, sizes.len() as u64, "the forger's frames were not all sent");
    let mut target = target;
    origin
        .ev
        .atomic(&honest, Atomic::FetchAdd(1), &remote, 0, Token(1))
        .unwrap();
    let c = try_complete(&mut origin.ev, &mut target, 1);
    let (counted, words) = target.stop();
    eprintln!("{provider}: target counted {counted:?}");
    assert_eq!(c.len(), 1, "the honest origin was not answered: {counted:?}");
    assert_eq!(value(&c[0]), 5);
    assert_eq!(words[0], 6, "applied once");
    assert_eq!(counted.refused_requests, sizes.len() as u64, "{counted:?}");
}

#[test]
fn oversized_frames_to_the_request_receive_are_dropped_tcp_rxm() {
    oversized_frames_to_the_request_receive_are_dropped("tcp;ofi_rxm");
}

#[test]
fn oversized_frames_to_the_request_receive_are_dropped_shm() {
    oversized_frames_to_the_request_receive_are_dropped("shm");
}
