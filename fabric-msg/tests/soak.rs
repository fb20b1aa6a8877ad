//! Soak: several pairs of event loops, each on its own threads, exchange
//! sequenced, checksummed tagged messages on four tags and bursts of RMA
//! writes with data for a bounded time, on tcp;ofi_rxm and shm. Every
//! message and write is checked where it lands: 0 lost, 0 duplicated,
//! 0 corrupted, and per tag matched in order (completions may run ahead
//! within the window on shm, and are counted). Prints messages per second and the
//! process's resident memory before and after.
//!
//! Time per provider: `FABRIC_MSG_SOAK_SECONDS` (default 3); pairs:
//! `FABRIC_MSG_SOAK_PAIRS` (default 3).
//!
//! Any other provider and domain, e.g. soft-RoCE in the ci/vm guest
//! (`ci/matrix/negotiate-guest.sh`): run the soak in this process with
//! `FABRIC_MSG_SOAK_CHILD="verbs;ofi_rxm" FABRIC_MSG_SOAK_DOMAIN=rxe0
//! soak-<hash> --exact soak_child --ignored --nocapture`.

mod common;
use common::*;
use fabric_msg::discovery::negotiate::{EndpointChoice, Requirements};
use fabric_msg::{
    negotiate, Access, Buffer, Capability, Completion, EventLoop, LadderConfig, OpKind, Profile, RecvOpts,
    SendOpts, Token,
};
use std::time::{Duration, Instant};

const TAGS: u64 = 4;
/// Data messages on tags DATA..DATA+TAGS; the rest are control.
const DATA: u64 = 0x100;
const ACK: u64 = 0x200;
const FIN: u64 = 0x300;
const REGION: u64 = 0x400;
/// Tagged messages in flight per client, and receives posted per server.
const WINDOW: usize = 32;
const MAX_LEN: usize = 8192;
/// RMA writes per burst; the server checks a burst and acknowledges it
/// before the client writes the slots again.
const BURST: u64 = 16;
const SLOT: usize = 1024;
/// Header of a data message: tag, sequence number, checksum.
const HEAD: usize = 24;

fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    })
}

/// The payload of message `seq` on `tag`: header, then bytes from both.
fn fill(buf: &mut Buffer, tag: u64, seq: u64) {
    let len = HEAD + ((seq.wrapping_mul(2654435761) ^ tag) as usize % (MAX_LEN - HEAD));
    buf.set_len(len);
    let b = buf.as_mut_slice();
    for (i, x) in b[HEAD..].iter_mut().enumerate() {
        *x = (seq as usize ^ (tag as usize) << 5).wrapping_add(i * 13) as u8;
    }
    let sum = fnv(&b[HEAD..]);
    b[..8].copy_from_slice(&tag.to_le_bytes());
    b[8..16].copy_from_slice(&seq.to_le_bytes());
    b[16..24].copy_from_slice(&sum.to_le_bytes());
}

/// What a burst's write `k` puts in its slot.
fn slot_bytes(k: u64) -> Vec<u8> {
    (0..SLOT).map(|i| (k as usize * 7 + i * 3) as u8).collect()
}

fn word(b: &[u8], i: usize) -> u64 {
    u64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().expect("8 bytes"))
}

/// Poll once, failing on any error completion.
fn poll(ev: &mut EventLoop, out: &mut Vec<Completion>) {
    ev.poll(out, Some(Duration::from_millis(20))).expect("poll");
    for c in out.iter() {
        if let Err(e) = &c.result {
            panic!("{:?} {:?} failed: {e}", c.kind, c.token);
        }
    }
}

#[derive(Debug, Default)]
struct Tally {
    messages: u64,
    writes: u64,
    /// Messages that completed before an earlier one of their tag.
    reordered: u64,
    /// The client's time from its first message to FIN.
    busy: Duration,
}

/// The server of one pair: checks every message and burst, acknowledges
/// bursts, and at FIN compares its counts with the client's. Gives up
/// (fails) at `give_up`: a soak that stops moving fails, it never hangs.
fn serve(mut s: Side, give_up: Instant) -> (Tally, Side) {
    let region =
        s.ev.register(BURST as usize * SLOT, Access::Write)
            .expect("register");
    s.ev.send(
        &s.peer,
        Buffer::from_slice(&region.remote().encode()),
        SendOpts {
            tag: Some(REGION),
            data: None,
        },
        Token(1),
    )
    .expect("sending the region");
    // Data receives take any of the four tags, unless the provider matches
    // masked receives wrongly (shm before libfabric 1.19: a masked receive
    // posted after its message arrived can miss it; providers.toml
    // `masked_receives_broken`, tests/tag_masks.rs): there each receive is
    // for one tag, as many per tag.
    let exact = s.ev.profile().tag_mask_defect.is_some();
    let data_opts = |tag: u64| RecvOpts {
        tag: Some(if exact { (tag, 0) } else { (DATA, TAGS - 1) }),
        ..Default::default()
    };
    for i in 0..WINDOW as u64 {
        s.ev.recv(s.ep, Buffer::new(MAX_LEN), data_opts(DATA + i % TAGS), Token(2))
            .expect("recv");
    }
    let fin = RecvOpts {
        tag: Some((FIN, 0)),
        ..Default::default()
    };
    s.ev.recv(s.ep, Buffer::new(64), fin, Token(3)).expect("recv fin");
    // write_data's notice may use up an untagged receive, and always does
    // where the fabric has no remote CQ data (iWARP: fabric-msg's follow-up
    // message), so a burst's worth stay posted.
    for _ in 0..BURST {
        s.ev.recv(s.ep, Buffer::new(64), RecvOpts::default(), Token(5))
            .expect("recv for notices");
    }
    let mut next = [0u64; TAGS as usize];
    // Per tag, what arrived ahead of `next`.
    let mut early: Vec<std::collections::BTreeSet<u64>> = vec![Default::default(); TAGS as usize];
    let mut reordered = 0u64;
    let mut burst_seen = 0u64;
    let mut writes = 0u64;
    let mut expected: Option<(Vec<u64>, u64)> = None;
    let mut out = Vec::new();
    let mut finished_at = None;
    loop {
        assert!(
            Instant::now() < give_up,
            "server: no FIN yet, with {next:?} messages and {writes} writes received (stalled)"
        );
        poll(&mut s.ev, &mut out);
        for c in out.drain(..) {
            match (c.kind, c.token) {
                (OpKind::Recv, Token(2)) => {
                    let buf = c.buffer.expect("a receive returns its buffer");
                    let b = buf.as_slice();
                    assert!(b.len() >= HEAD, "a data message of {} bytes", b.len());
                    let (tag, seq, sum) = (word(b, 0), word(b, 1), word(b, 2));
                    assert_eq!(c.tag, DATA + tag, "the header's tag is not the message's");
                    assert_eq!(fnv(&b[HEAD..]), sum, "tag {tag} seq {seq}: corrupted");
                    let t = tag as usize;
                    let want = next[t];
                    assert!(
                        seq >= want && !early[t].contains(&seq),
                        "tag {tag}: seq {seq} again (duplicate), expected {want}"
                    );
                    // Matched in order, completed in order up to the window:
                    // shm completes a message above its inject size after
                    // smaller ones matched behind it.
                    assert!(
                        seq < want + WINDOW as u64,
                        "tag {tag}: seq {seq} while {want} is missing, more than the {WINDOW} in flight (lost)"
                    );
                    if seq != want {
                        reordered += 1;
                    }
                    early[t].insert(seq);
                    while early[t].remove(&next[t]) {
                        next[t] += 1;
                    }
                    s.ev.recv(s.ep, buf, data_opts(c.tag), Token(2))
                        .expect("recv again");
                }
                (OpKind::Recv, Token(3)) => {
                    let b = c.buffer.expect("fin");
                    let counts: Vec<u64> = (0..TAGS as usize).map(|t| word(b.as_slice(), t)).collect();
                    expected = Some((counts, word(b.as_slice(), TAGS as usize)));
                    finished_at = Some(Instant::now());
                }
                (OpKind::RemoteWrite, token) => {
                    if let (Token(5), Some(b)) = (token, c.buffer) {
                        s.ev.recv(s.ep, b, RecvOpts::default(), Token(5))
                            .expect("recv for notices again");
                    }
                    let k = c.data.expect("a write's data");
                    assert_eq!(k, writes, "write {k} notified when {writes} was next");
                    writes += 1;
                    if writes % BURST == 0 {
                        for j in burst_seen..writes {
                            let mut got = vec![0u8; SLOT];
                            region
                                .read_at((j % BURST) as usize * SLOT, &mut got)
                                .expect("read");
                            assert!(got == slot_bytes(j), "write {j}: slot corrupted");
                        }
                        burst_seen = writes;
                        s.ev.send(
                            &s.peer,
                            Buffer::from_slice(&writes.to_le_bytes()),
                            SendOpts {
                                tag: Some(ACK),
                                data: None,
                            },
                            Token(4),
                        )
                        .expect("ack");
                    }
                }
                (OpKind::Send, _) => {}
                other => panic!("unexpected completion {other:?}"),
            }
        }
        if let Some((counts, w)) = &expected {
            if counts.as_slice() == next && *w == writes {
                break;
            }
            let waited = finished_at.expect("set with expected").elapsed();
            assert!(
                waited < TIMEOUT,
                "after FIN: received {next:?} of {counts:?} messages and {writes} of {w} writes (lost)"
            );
        }
    }
    drop(region);
    (
        Tally {
            messages: next.iter().sum(),
            writes,
            reordered,
            busy: Duration::ZERO,
        },
        s,
    )
}

/// The client of one pair: keeps WINDOW tagged messages in flight over
/// four tags for `soak_time`, and a burst of RMA writes going whenever the
/// previous one was acknowledged. Fails if nothing completes for TIMEOUT.
/// The clock starts once the server's region descriptor is in: with
/// ofi_rxm, that first message also sets the connection up (seconds in
/// the VM).
fn client(mut c: Side, soak_time: Duration) -> (Tally, Side) {
    let mut out = Vec::new();
    c.ev.recv(
        c.ep,
        Buffer::new(256),
        RecvOpts {
            tag: Some((REGION, 0)),
            ..Default::default()
        },
        Token(10),
    )
    .expect("recv region");
    let deadline = Instant::now() + TIMEOUT;
    let remote = loop {
        assert!(
            Instant::now() < deadline,
            "client: no region descriptor within {TIMEOUT:?}"
        );
        poll(&mut c.ev, &mut out);
        if let Some(r) = out.iter().find(|x| x.token == Token(10)) {
            let b = r.buffer.as_ref().expect("region");
            break c.ev.import(b.as_slice()).expect("import");
        }
    };
    let started = Instant::now();
    let until = started + soak_time;
    let local =
        c.ev.register(BURST as usize * SLOT, Access::Read)
            .expect("register");
    let ack = RecvOpts {
        tag: Some((ACK, 0)),
        ..Default::default()
    };
    c.ev.recv(c.ep, Buffer::new(64), ack, Token(11))
        .expect("recv ack");
    let mut pool: Vec<Buffer> = (0..WINDOW).map(|_| Buffer::new(MAX_LEN)).collect();
    let mut seq = [0u64; TAGS as usize];
    let mut turn = 0u64;
    let mut writes = 0u64;
    let mut burst_open = false;
    let mut in_flight = 0usize;
    let mut progress_at = Instant::now();
    while Instant::now() < until || in_flight > 0 || burst_open {
        let running = Instant::now() < until;
        assert!(
            progress_at.elapsed() < TIMEOUT,
            "client: nothing completed for {TIMEOUT:?} with {in_flight} messages in flight and \
             a burst of writes {} (stalled; sent {seq:?}, {writes} writes)",
            if burst_open { "unacknowledged" } else { "done" }
        );
        while running && !pool.is_empty() {
            let tag = turn % TAGS;
            turn += 1;
            let mut buf = pool.pop().expect("non-empty");
            fill(&mut buf, tag, seq[tag as usize]);
            seq[tag as usize] += 1;
            let opts = SendOpts {
                tag: Some(DATA + tag),
                data: None,
            };
            c.ev.send(&c.peer, buf, opts, Token(12)).expect("send");
            in_flight += 1;
        }
        if running && !burst_open {
            for k in writes..writes + BURST {
                let off = (k % BURST) as usize * SLOT;
                local.write_at(off, &slot_bytes(k)).expect("fill");
                let l = local.local(off, SLOT).expect("local");
                c.ev.write_data(&c.peer, l, &remote, off as u64, k, Token(13))
                    .expect("write");
            }
            writes += BURST;
            burst_open = true;
        }
        poll(&mut c.ev, &mut out);
        if !out.is_empty() {
            progress_at = Instant::now();
        }
        for x in out.drain(..) {
            match x.token {
                Token(12) => {
                    in_flight -= 1;
                    pool.push(x.buffer.expect("a send returns its buffer"));
                }
                Token(13) => {}
                Token(11) => {
                    let b = x.buffer.expect("ack");
                    assert_eq!(word(b.as_slice(), 0), writes, "acknowledged the wrong burst");
                    burst_open = false;
                    c.ev.recv(c.ep, b, ack, Token(11)).expect("recv ack");
                }
                other => panic!("unexpected completion {other:?}"),
            }
        }
    }
    let mut fin = Vec::new();
    for s in seq {
        fin.extend_from_slice(&s.to_le_bytes());
    }
    fin.extend_from_slice(&writes.to_le_bytes());
    let opts = SendOpts {
        tag: Some(FIN),
        data: None,
    };
    c.ev.send(&c.peer, Buffer::from_slice(&fin), opts, Token(14))
        .expect("fin");
    let deadline = Instant::now() + TIMEOUT;
    loop {
        poll(&mut c.ev, &mut out);
        if out.drain(..).any(|x| x.token == Token(14)) {
            break;
        }
        assert!(Instant::now() < deadline, "FIN not sent");
    }
    drop(local);
    (
        Tally {
            messages: seq.iter().sum(),
            writes,
            reordered: 0,
            busy: started.elapsed(),
        },
        c,
    )
}

/// Resident memory of this process, in KiB.
fn rss_kib() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4
}

/// Tagged and untagged messages and RMA on `provider`, on the domain in
/// `FABRIC_MSG_SOAK_DOMAIN` if set (rxe0 in the VM), else on `lo` (`shm`
/// on shm) as every other test.
fn soak_profile(provider: &str) -> Profile {
    let caps = [Capability::Tagged, Capability::Msg, Capability::Rma];
    let Ok(domain) = std::env::var("FABRIC_MSG_SOAK_DOMAIN") else {
        return profile_caps(provider, &caps);
    };
    let req = Requirements {
        caps: caps.to_vec(),
        endpoint: EndpointChoice::Rdm,
        provider: Some(provider.into()),
        domain: Some(domain.clone()),
        ..Default::default()
    };
    negotiate(&req, &LadderConfig::default())
        .unwrap_or_else(|e| panic!("negotiating {provider} on {domain}: {e}"))
        .profile
}

fn soak(provider: &str) {
    let secs: f64 = std::env::var("FABRIC_MSG_SOAK_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3.0);
    let n: usize = std::env::var("FABRIC_MSG_SOAK_PAIRS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    let p = soak_profile(provider);
    let rss_before = rss_kib();
    let soak_time = Duration::from_secs_f64(secs);
    // Connect every pair first; each client's clock starts once its
    // connection carries messages (set-up takes seconds in the VM).
    let started = Instant::now();
    let give_up = started + soak_time + TIMEOUT * (3 + n as u32);
    let sides: Vec<_> = (0..n)
        .map(|_| {
            pair(p.clone(), p.clone(), Default::default(), move |s| {
                serve(s, give_up)
            })
        })
        .collect();
    let pairs: Vec<_> = sides
        .into_iter()
        .map(|(side, server)| (std::thread::spawn(move || client(side, soak_time)), server))
        .collect();
    let mut got = Tally::default();
    // The loops close only once every thread is done: shm (1.17) hands a
    // loop in the same process its peer's region by pointer, and closing
    // one while its peer still polls crashes inside libfabric (SIGSEGV in
    // pthread_spin_lock, seen in CI).
    let mut loops = Vec::new();
    for (c, s) in pairs {
        let (c, client_side) = c.join().expect("a client thread failed");
        let (s, server_side) = s.join().expect("a server thread failed");
        loops.push((client_side, server_side));
        assert_eq!(
            (c.messages, c.writes),
            (s.messages, s.writes),
            "{provider}: sent and received differ"
        );
        got.messages += s.messages;
        got.writes += s.writes;
        got.reordered += s.reordered;
        got.busy = got.busy.max(c.busy);
    }
    drop(loops);
    let took = started.elapsed().as_secs_f64();
    let busy = got.busy.as_secs_f64();
    eprintln!(
        "soak {provider}: {n} pairs, {busy:.1} s ({took:.1} s with set-up): {} messages ({:.0}/s) and \
         {} RMA writes ({:.0}/s), \
         0 lost, 0 duplicated, 0 corrupted, {} completed ahead of an earlier one of their tag; \
         RSS {} KiB before, {} KiB after",
        got.messages,
        got.messages as f64 / busy,
        got.writes,
        got.writes as f64 / busy,
        got.reordered,
        rss_before,
        rss_kib()
    );
    assert!(
        got.messages > 0 && got.writes > 0,
        "{provider}: nothing was exchanged"
    );
}

/// The soak itself, in a child process of this test binary (see
/// [`in_child`]); a no-op unless the parent asked for it.
#[test]
#[ignore = "child role: run by soak_tcp_rxm and soak_shm through current_exe()"]
fn soak_child() {
    if let Ok(provider) = std::env::var("FABRIC_MSG_SOAK_CHILD") {
        soak(&provider);
    }
}

/// Each provider's soak in a process of its own: with shm's loops and
/// tcp;ofi_rxm's opened and closed in one process, one after the other,
/// libfabric 1.17 crashed (SIGSEGV in pthread_spin_lock) in 5 of 8 runs
/// here and once in CI; each alone, never. The child's report is passed on.
fn in_child(provider: &str) {
    let out = std::process::Command::new(std::env::current_exe().expect("the test binary"))
        .args([
            "--exact",
            "soak_child",
            "--ignored",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env("FABRIC_MSG_SOAK_CHILD", provider)
        .output()
        .expect("running the soak's child");
    let err = String::from_utf8_lossy(&out.stderr);
    use std::io::Write;
    let _ = std::io::stderr().write_all(err.as_bytes());
    assert!(out.status.success(), "{provider}: {:?}\n{err}", out.status);
    assert!(err.contains(&format!("soak {provider}:")), "{err}");
}

#[test]
fn soak_tcp_rxm() {
    in_child("tcp;ofi_rxm");
}

/// shm once wedged here now and then (an RMA write refused for 5 s in 1
/// run of 5, or messages stuck for good): not room, but libfabric's shm
/// before 1.19 matching a masked receive against messages that arrived
/// first with a stale mask (tests/tag_masks.rs), which left messages of
/// three tags unmatched behind receives posted for them, and so the
/// sender's responses and SAR writes behind them. The server now receives
/// with exact tags where the profile names that defect: 20 of 20 runs
/// passed with 1 pair, 8 of 8 with 3.
#[test]
fn soak_shm() {
    in_child("shm");
}
