//! One-sided operations to a target whose application does not poll
//! (issue 14, item 3). The target registers memory, hands out its
//! descriptor, then sleeps without calling `poll`; the initiator posts an
//! RMA write, an RMA read and (where the provider has them) an atomic at
//! once and records which complete while the target is idle.
//!
//! Without a progress thread, on `tcp;ofi_rxm`, `tcp`'s connected
//! endpoints and `shm`, none does: the target's provider serves them only
//! inside the target's CQ reads. With
//! [`ProgressThread::On`](fabric_msg::ProgressThread::On) the RMA and
//! `shm`'s native atomics complete; fabric-msg's emulated atomics
//! (`tcp;ofi_rxm`) still wait for the target's `poll`, which applies them.
//! `sockets` runs its own progress threads and needs none of ours: it is
//! the control. Once the target polls again everything completes and both
//! sides check every byte.
//!
//! `busy_target_*`: a target that polls every 1.5 ms and echoes messages
//! while a 100 µs thread drives its provider between polls, so the thread's
//! progress runs beside the loop's own posts.
//!
//! The target runs in a process of its own (this binary again, as
//! `target_role`), as a World's ranks do; `shm` is also tried with both
//! loops in one process, where its reads never take the cross-memory
//! attach path that lets a lone read from another process complete without
//! the target (see `without_thread`).

use crate::common;
use common::*;
use fabric_msg::discovery::atomic::AtomicCarrier;
use fabric_msg::discovery::negotiate::{Capability, EndpointChoice, Requirements};
use fabric_msg::{
    negotiate, Access, Atomic, AtomicKind, EventLoop, LadderConfig, LoopConfig, OpKind, ProgressThread, Token,
};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// How long the initiator waits for completions while the target is idle;
/// the target stays idle a little longer, so nothing it does by polling
/// can be mistaken for the thread's work.
const WAIT: Duration = Duration::from_secs(2);
const IDLE: Duration = Duration::from_millis(2500);
/// Bytes written and read: 64 KiB, more than one provider step.
const LEN: usize = 64 << 10;
const WRITE: Token = Token(1);
const READ: Token = Token(2);
const ATOMIC: Token = Token(3);

fn profile(provider: &str, endpoint: EndpointChoice, atomics: bool) -> fabric_msg::Profile {
    let mut caps = vec![Capability::Msg, Capability::Rma];
    if endpoint == EndpointChoice::Rdm {
        caps.push(Capability::Tagged);
    }
    if atomics {
        caps.push(Capability::Atomic);
    }
    let req = Requirements {
        caps,
        endpoint,
        provider: Some(provider.into()),
        domain: Some(if provider == "shm" { "shm" } else { "lo" }.into()),
        same_host: provider == "shm",
        ..Default::default()
    };
    negotiate(&req, &LadderConfig::default())
        .unwrap_or_else(|e| panic!("negotiating {provider}: {e}"))
        .profile
}

/// What happened to each operation: its token, and how long it took if it
/// completed while the target was idle.
#[derive(Debug)]
struct Outcome {
    carrier: Option<AtomicCarrier>,
    while_idle: Vec<(Token, Duration)>,
    progress_runs: u64,
}

impl Outcome {
    fn done(&self, t: Token) -> Option<Duration> {
        self.while_idle.iter().find(|(k, _)| *k == t).map(|&(_, d)| d)
    }
}

/// Where the target runs: a thread of this process, or a process of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    Thread,
    Process,
}

/// The target's side once connected: expose memory, hand out its
/// descriptor, sleep IDLE without polling, then serve until `finished`;
/// returns the counter, the progress thread's runs while idle, and whether
/// the written bytes arrived.
fn target(mut s: Side, publish: impl FnOnce(Vec<u8>), finished: impl Fn() -> bool) -> (u64, u64, bool) {
    let region = s.ev.register(2 * LEN + 64, Access::ReadWrite).unwrap();
    region.write_at(LEN, &pattern(2, LEN)).unwrap();
    region.write_at(2 * LEN, &40u64.to_ne_bytes()).unwrap();
    publish(region.remote().encode());
    // Busy elsewhere: no poll for IDLE.
    std::thread::sleep(IDLE);
    let runs = s.ev.progress_runs();
    // Serve (emulated atomics, and everything on providers without a
    // thread) until the initiator is done.
    let mut batch = Vec::new();
    let deadline = Instant::now() + TIMEOUT;
    while !finished() {
        assert!(Instant::now() < deadline, "target: the initiator never finished");
        s.ev.poll(&mut batch, Some(Duration::from_millis(10))).unwrap();
        assert!(batch.is_empty(), "target: unexpected completions {batch:?}");
    }
    let mut written = vec![0u8; LEN];
    region.read_at(0, &mut written).unwrap();
    let mut counter = [0u8; 8];
    region.read_at(2 * LEN, &mut counter).unwrap();
    (u64::from_ne_bytes(counter), runs, written == pattern(1, LEN))
}

const ROLE: &str = "FABRIC_MSG_IDLE_TARGET";

/// Tells the target the initiator is done; returns what `target` returns.
type Finish = Box<dyn FnOnce() -> (u64, u64, bool)>;

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap())
        .collect()
}

/// The target in a process of its own (run by `Place::Process` through
/// this test binary): it talks to the initiator on stdin and stdout.
#[test]
#[ignore = "child role: run by the idle_target_* and busy_target_* tests through current_exe()"]
fn target_role() {
    use std::io::{BufRead, Write};
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    let f: Vec<&str> = role.split('|').collect();
    let endpoint = if f[1] == "msg" {
        EndpointChoice::Msg
    } else {
        EndpointChoice::Rdm
    };
    let progress = if f[3] == "on" {
        ProgressThread::On
    } else {
        ProgressThread::Off
    };
    let p = profile(f[0], endpoint, f[2] == "atomics");
    let say = |line: String| {
        let mut out = std::io::stdout().lock();
        writeln!(out, "{line}").unwrap();
        out.flush().unwrap();
    };
    let listener = fabric_msg::Listener::bind("127.0.0.1:0").unwrap();
    say(format!("LISTEN {}", listener.local_addr().unwrap()));
    let cfg = LoopConfig {
        progress_thread: progress,
        ..Default::default()
    };
    let mut ev = EventLoop::new(&p, cfg).unwrap();
    let ep = ev.open_endpoint().unwrap();
    let peer = listener.accept(&mut ev, ep).unwrap();
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let d = done.clone();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = std::io::stdin().lock().read_line(&mut line);
        d.store(true, std::sync::atomic::Ordering::Release);
    });
    let (counter, runs, written) = target(
        Side { ev, ep, peer },
        |desc| say(format!("DESC {}", hex(&desc))),
        || done.load(std::sync::atomic::Ordering::Acquire),
    );
    say(format!("RESULT {counter} {runs} {written}"));
}

fn run(
    provider: &str,
    endpoint: EndpointChoice,
    atomics: bool,
    progress: ProgressThread,
    place: Place,
) -> Outcome {
    use std::io::{BufRead, Write};
    let p = profile(provider, endpoint, atomics);
    let carrier = atomics.then(|| p.atomic_carrier(AtomicKind::FetchAdd)).flatten();
    let cfg = LoopConfig {
        progress_thread: progress,
        ..Default::default()
    };
    // The target's descriptor, a way to say "done", and its result.
    let (mut c, remote, finish): (Side, Vec<u8>, Finish) = match place {
        Place::Thread => {
            let (desc_tx, desc_rx) = mpsc::channel::<Vec<u8>>();
            let (done_tx, done_rx) = mpsc::channel::<()>();
            let (c, server) = pair(p.clone(), p, cfg, move |s| {
                target(s, |d| desc_tx.send(d).unwrap(), || done_rx.try_recv().is_ok())
            });
            let desc = desc_rx.recv().unwrap();
            let finish = move || {
                done_tx.send(()).unwrap();
                server.join().unwrap()
            };
            (c, desc, Box::new(finish))
        }
        Place::Process => {
            let role = format!(
                "{provider}|{}|{}|{}",
                if endpoint == EndpointChoice::Msg {
                    "msg"
                } else {
                    "rdm"
                },
                if atomics { "atomics" } else { "rma" },
                if progress == ProgressThread::On {
                    "on"
                } else {
                    "off"
                },
            );
            let mut child = std::process::Command::new(std::env::current_exe().unwrap())
                .args([
                    "--exact",
                    &test_name(module_path!(), "target_role"),
                    "--ignored",
                    "--test-threads=1",
                    "--nocapture",
                ])
                .env(ROLE, role)
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .spawn()
                .expect("spawn the target process");
            let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
            let mut next = move |what: &str| -> String {
                for line in lines.by_ref() {
                    let line = line.unwrap();
                    // libtest's "test target_role ... " may come first.
                    if let Some(at) = line.find(what) {
                        return line[at + what.len()..].trim().to_string();
                    }
                }
                panic!("the target process ended before saying {what}");
            };
            let addr: std::net::SocketAddr = next("LISTEN").parse().unwrap();
            let c = client(&p, addr);
            let desc = unhex(&next("DESC"));
            let mut stdin = child.stdin.take().unwrap();
            let finish = move || {
                writeln!(stdin, "done").unwrap();
                let r = next("RESULT");
                let f: Vec<&str> = r.split(' ').collect();
                let status = child.wait().unwrap();
                assert!(status.success(), "target process: {status}");
                (f[0].parse().unwrap(), f[1].parse().unwrap(), f[2] == "true")
            };
            (c, desc, Box::new(finish))
        }
    };
    let remote = c.ev.import(&remote).unwrap();
    let local = c.ev.register(2 * LEN, Access::ReadWrite).unwrap();
    local.write_at(0, &pattern(1, LEN)).unwrap();
    let started = Instant::now();
    c.ev.write(&c.peer, local.local(0, LEN).unwrap(), &remote, 0, WRITE)
        .unwrap();
    c.ev.read(&c.peer, local.local(LEN, LEN).unwrap(), &remote, LEN as u64, READ)
        .unwrap();
    let mut expected = 2;
    if atomics {
        c.ev.atomic(&c.peer, Atomic::FetchAdd(2), &remote, 2 * LEN as u64, ATOMIC)
            .unwrap();
        expected += 1;
    }
    let mut while_idle = Vec::new();
    let mut all = Vec::new();
    let mut batch = Vec::new();
    while started.elapsed() < WAIT && all.len() < expected {
        c.ev.poll(&mut batch, Some(Duration::from_millis(1))).unwrap();
        for done in batch.drain(..) {
            while_idle.push((done.token, started.elapsed()));
            all.push(done);
        }
    }
    // The rest complete once the target polls again.
    while all.len() < expected {
        all.extend(wait_n(&mut c.ev, 1));
    }
    for done in &all {
        if let Err(e) = &done.result {
            panic!("{provider}: {:?} failed: {e}", done.token);
        }
        match done.token {
            WRITE => assert_eq!(done.kind, OpKind::Write),
            READ => assert_eq!(done.kind, OpKind::Read),
            ATOMIC => assert_eq!((done.kind, done.value), (OpKind::Atomic, Some(40))),
            t => panic!("unexpected token {t:?}"),
        }
    }
    let mut read = vec![0u8; LEN];
    local.read_at(LEN, &mut read).unwrap();
    assert!(read == pattern(2, LEN), "{provider}: the bytes read differ");
    let (counter, progress_runs, written) = finish();
    assert!(written, "{provider}: the written bytes differ at the target");
    assert_eq!(counter, if atomics { 42 } else { 40 }, "{provider}: the counter");
    let out = Outcome {
        carrier,
        while_idle,
        progress_runs,
    };
    eprintln!("{provider} {endpoint:?} {place:?} progress {progress:?}: {out:?}");
    out
}

/// With the thread: RMA completes while the target sleeps, and so do
/// native atomics; emulated ones wait for its poll.
fn with_thread(provider: &str, endpoint: EndpointChoice, atomics: bool, place: Place) {
    let o = run(provider, endpoint, atomics, ProgressThread::On, place);
    for t in [WRITE, READ] {
        assert!(
            o.done(t).is_some(),
            "{provider}: {t:?} did not complete while the target was idle, progress thread on: {o:?}"
        );
    }
    assert!(o.progress_runs > 0, "{provider}: the thread never ran: {o:?}");
    match o.carrier {
        Some(AtomicCarrier::Native) => assert!(o.done(ATOMIC).is_some(), "{provider}: native atomic: {o:?}"),
        Some(AtomicCarrier::Emulated) => assert!(
            o.done(ATOMIC).is_none(),
            "{provider}: an emulated atomic completed with the target idle: {o:?}"
        ),
        _ => {}
    }
}

/// Without the thread: nothing completes while the target sleeps, except
/// a read from another process on `shm`: libfabric's shm copies it with
/// `process_vm_readv` (its "fast RMA": no ordering asked, no delivery
/// completion, cross-memory attach allowed) and completes it at once,
/// without the target. Whether that path is taken depends on the host
/// (ptrace permission), so that read is reported, not asserted.
fn without_thread(provider: &str, endpoint: EndpointChoice, atomics: bool, place: Place) {
    let o = run(provider, endpoint, atomics, ProgressThread::Off, place);
    let cma_read = provider == "shm" && place == Place::Process;
    for (t, _) in &o.while_idle {
        assert!(
            *t == READ && cma_read,
            "{provider}: {t:?} completed with the target idle and no progress thread: {o:?}"
        );
    }
}

#[test]
fn idle_target_tcp_rxm_with_thread() {
    with_thread("tcp;ofi_rxm", EndpointChoice::Rdm, true, Place::Process);
}

#[test]
fn idle_target_tcp_rxm_stalls_without_thread() {
    without_thread("tcp;ofi_rxm", EndpointChoice::Rdm, true, Place::Process);
}

#[test]
fn idle_target_tcp_msg_with_thread() {
    with_thread("tcp", EndpointChoice::Msg, false, Place::Process);
}

#[test]
fn idle_target_tcp_msg_stalls_without_thread() {
    without_thread("tcp", EndpointChoice::Msg, false, Place::Process);
}

#[test]
fn idle_target_shm_with_thread() {
    with_thread("shm", EndpointChoice::Rdm, true, Place::Process);
}

#[test]
fn idle_target_shm_stalls_without_thread() {
    without_thread("shm", EndpointChoice::Rdm, true, Place::Process);
}

/// Both loops in one process: shm's reads need the target too.
#[test]
fn idle_target_shm_in_one_process() {
    with_thread("shm", EndpointChoice::Rdm, true, Place::Thread);
    without_thread("shm", EndpointChoice::Rdm, true, Place::Thread);
    let o = run(
        "shm",
        EndpointChoice::Rdm,
        false,
        ProgressThread::Off,
        Place::Thread,
    );
    assert!(o.while_idle.is_empty(), "shm in one process: {o:?}");
}

/// `sockets` progresses by itself: no thread of ours, and no stall.
#[test]
fn idle_target_sockets_needs_no_thread() {
    let p = profile("sockets", EndpointChoice::Rdm, true);
    assert!(!ProgressThread::needed(&p));
    let ev = EventLoop::new(
        &p,
        LoopConfig {
            progress_thread: ProgressThread::WhereNeeded,
            ..Default::default()
        },
    )
    .unwrap();
    assert!(!ev.progress_thread());
    drop(ev);
    let o = run(
        "sockets",
        EndpointChoice::Rdm,
        true,
        ProgressThread::Off,
        Place::Process,
    );
    for t in [WRITE, READ, ATOMIC] {
        assert!(o.done(t).is_some(), "sockets: {t:?} stalled: {o:?}");
    }
}

/// `WhereNeeded` starts the thread on the providers that need it.
#[test]
fn where_needed_starts_the_thread_where_progress_is_manual() {
    let cfg = LoopConfig {
        progress_thread: ProgressThread::WhereNeeded,
        ..Default::default()
    };
    for (provider, endpoint) in [
        ("tcp;ofi_rxm", EndpointChoice::Rdm),
        ("tcp", EndpointChoice::Msg),
        ("shm", EndpointChoice::Rdm),
    ] {
        let p = profile(provider, endpoint, false);
        let ev = EventLoop::new(&p, cfg.clone()).unwrap();
        assert!(ev.progress_thread(), "{provider}");
    }
}

/// A target that polls now and then (every 1.5 ms, with a 100 µs thread
/// running between its polls) while it echoes messages, posting its own
/// receives and sends as the thread drives its provider: 300 rounds of a
/// 4 KiB write, a read of it back and a tagged echo, every byte checked.
fn busy_target(provider: &str) {
    const ROUNDS: u64 = 300;
    const SIZE: usize = 4096;
    let p = profile(provider, EndpointChoice::Rdm, false);
    let cfg = LoopConfig {
        progress_thread: ProgressThread::On,
        progress_period: Duration::from_micros(100),
        ..Default::default()
    };
    let (desc_tx, desc_rx) = mpsc::channel::<Vec<u8>>();
    let (mut c, server) = pair(p.clone(), p, cfg.clone(), move |mut s| {
        let region = s.ev.register(SIZE, Access::ReadWrite).unwrap();
        desc_tx.send(region.remote().encode()).unwrap();
        let mut batch = Vec::new();
        let mut echoed = 0;
        let opts = |i: u64| fabric_msg::RecvOpts {
            tag: Some((i, 0)),
            from: None,
        };
        s.ev.recv(s.ep, fabric_msg::Buffer::new(64), opts(0), Token(0))
            .unwrap();
        let deadline = Instant::now() + TIMEOUT;
        while echoed < ROUNDS {
            assert!(Instant::now() < deadline, "target: {echoed} of {ROUNDS} echoes");
            s.ev.poll(&mut batch, Some(Duration::ZERO)).unwrap();
            for done in batch.drain(..) {
                done.result.unwrap();
                if done.kind == OpKind::Recv {
                    let tag = done.tag;
                    let buf = done.buffer.unwrap();
                    if tag + 1 < ROUNDS {
                        s.ev.recv(s.ep, fabric_msg::Buffer::new(64), opts(tag + 1), Token(tag + 1))
                            .unwrap();
                    }
                    let send = fabric_msg::SendOpts {
                        tag: Some(tag),
                        data: None,
                    };
                    s.ev.send(&s.peer, buf, send, Token(1000 + tag)).unwrap();
                    echoed += 1;
                }
            }
            std::thread::sleep(Duration::from_micros(1500));
        }
        // The last sends' completions.
        while s.ev.in_flight() > 0 {
            assert!(Instant::now() < deadline, "target: sends never completed");
            s.ev.poll(&mut batch, Some(Duration::from_millis(10))).unwrap();
        }
        assert!(s.ev.progress_runs() > 0);
    });
    let remote = c.ev.import(&desc_rx.recv().unwrap()).unwrap();
    let local = c.ev.register(2 * SIZE, Access::ReadWrite).unwrap();
    for i in 0..ROUNDS {
        let bytes = pattern(i, SIZE);
        local.write_at(0, &bytes).unwrap();
        c.ev.write(&c.peer, local.local(0, SIZE).unwrap(), &remote, 0, WRITE)
            .unwrap();
        assert!(wait_n(&mut c.ev, 1)[0].result.is_ok());
        c.ev.read(&c.peer, local.local(SIZE, SIZE).unwrap(), &remote, 0, READ)
            .unwrap();
        assert!(wait_n(&mut c.ev, 1)[0].result.is_ok());
        let mut back = vec![0u8; SIZE];
        local.read_at(SIZE, &mut back).unwrap();
        assert!(back == bytes, "{provider}: round {i}: read back differs");
        let msg = fabric_msg::Buffer::from_slice(&i.to_le_bytes());
        let send = fabric_msg::SendOpts {
            tag: Some(i),
            data: None,
        };
        let recv = fabric_msg::RecvOpts {
            tag: Some((i, 0)),
            from: None,
        };
        c.ev.recv(c.ep, fabric_msg::Buffer::new(64), recv, Token(2000 + i))
            .unwrap();
        c.ev.send(&c.peer, msg, send, Token(3000 + i)).unwrap();
        let done = wait_n(&mut c.ev, 2);
        let echo = done.iter().find(|d| d.kind == OpKind::Recv).unwrap();
        assert_eq!(echo.buffer.as_ref().unwrap().as_slice(), i.to_le_bytes());
    }
    server.join().unwrap();
}

#[test]
fn busy_target_tcp_rxm() {
    busy_target("tcp;ofi_rxm");
}

#[test]
fn busy_target_shm() {
    busy_target("shm");
}
