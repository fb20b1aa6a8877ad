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

mod common;
use common::*;
use fabric_msg::discovery::negotiate::{Capability, EndpointChoice, Requirements};
use fabric_msg::{
    negotiate, Access, Atomic, AtomicCarrier, AtomicOperation, EventLoop, LadderConfig, LoopConfig, OpKind,
    ProgressThread, Token,
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

fn run(provider: &str, endpoint: EndpointChoice, atomics: bool, progress: ProgressThread) -> Outcome {
    let p = profile(provider, endpoint, atomics);
    let carrier = atomics
        .then(|| p.atomic_carrier(AtomicOperation::FetchAdd))
        .flatten();
    let cfg = LoopConfig {
        progress_thread: progress,
        ..Default::default()
    };
    let (desc_tx, desc_rx) = mpsc::channel::<Vec<u8>>();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let (mut c, server) = pair(p.clone(), p, cfg, move |mut s| {
        let region = s.ev.register(2 * LEN + 64, Access::ReadWrite).unwrap();
        region.write_at(LEN, &pattern(2, LEN)).unwrap();
        region.write_at(2 * LEN, &40u64.to_ne_bytes()).unwrap();
        desc_tx.send(region.remote().encode()).unwrap();
        // Busy elsewhere: no poll for IDLE.
        std::thread::sleep(IDLE);
        let runs = s.ev.progress_runs();
        // Serve (emulated atomics, and everything on providers without a
        // thread) until the initiator is done.
        let mut batch = Vec::new();
        let deadline = Instant::now() + TIMEOUT;
        while done_rx.try_recv().is_err() {
            assert!(Instant::now() < deadline, "target: the initiator never finished");
            s.ev.poll(&mut batch, Some(Duration::from_millis(10))).unwrap();
            assert!(batch.is_empty(), "target: unexpected completions {batch:?}");
        }
        let mut written = vec![0u8; LEN];
        region.read_at(0, &mut written).unwrap();
        assert!(written == pattern(1, LEN), "target: the written bytes differ");
        let mut counter = [0u8; 8];
        region.read_at(2 * LEN, &mut counter).unwrap();
        (u64::from_ne_bytes(counter), runs)
    });
    let remote = c.ev.import(&desc_rx.recv().unwrap()).unwrap();
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
    done_tx.send(()).unwrap();
    let (counter, progress_runs) = server.join().unwrap();
    assert_eq!(counter, if atomics { 42 } else { 40 }, "{provider}: the counter");
    let out = Outcome {
        carrier,
        while_idle,
        progress_runs,
    };
    eprintln!("{provider} {endpoint:?} progress {progress:?}: {out:?}");
    out
}

/// With the thread: RMA completes while the target sleeps, and so do
/// native atomics; emulated ones wait for its poll.
fn with_thread(provider: &str, endpoint: EndpointChoice, atomics: bool) {
    let o = run(provider, endpoint, atomics, ProgressThread::On);
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

/// Without the thread: nothing completes while the target sleeps.
fn without_thread(provider: &str, endpoint: EndpointChoice, atomics: bool) {
    let o = run(provider, endpoint, atomics, ProgressThread::Off);
    assert!(
        o.while_idle.is_empty(),
        "{provider}: completed with the target idle and no progress thread: {o:?}"
    );
}

#[test]
fn idle_target_tcp_rxm_with_thread() {
    with_thread("tcp;ofi_rxm", EndpointChoice::Rdm, true);
}

#[test]
fn idle_target_tcp_rxm_stalls_without_thread() {
    without_thread("tcp;ofi_rxm", EndpointChoice::Rdm, true);
}

#[test]
fn idle_target_tcp_msg_with_thread() {
    with_thread("tcp", EndpointChoice::Msg, false);
}

#[test]
fn idle_target_tcp_msg_stalls_without_thread() {
    without_thread("tcp", EndpointChoice::Msg, false);
}

#[test]
fn idle_target_shm_with_thread() {
    with_thread("shm", EndpointChoice::Rdm, true);
}

#[test]
fn idle_target_shm_stalls_without_thread() {
    without_thread("shm", EndpointChoice::Rdm, true);
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
    let o = run("sockets", EndpointChoice::Rdm, true, ProgressThread::Off);
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
