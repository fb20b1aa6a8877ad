//! What the tokio adapter allocates per operation once warmed up: nothing
//! (the slots are reused, a waker is a reference count; `async_loop`'s
//! docs say so). A counting global allocator watches ping-pongs between
//! two AsyncLoops on a current-thread runtime: every operation, both
//! drivers and both loops run on the test's thread, and only that
//! thread's allocations count. (Counting every thread's, the test once
//! failed under load with 1 allocation in 8,000 operations: the lifeline
//! thread's own set-up, a peer's watch registered after the warm-up.)
//! The same for one-sided operations: writes, reads and fetch-adds
//! through a handle into the other loop's region; and for the pieces of
//! multi-receive buffers posted again and again.
#![cfg(feature = "tokio")]

mod common;

use common::profile;
use fabric_msg::async_loop::AsyncLoop;
use fabric_msg::{Access, Atomic, Buffer, RecvOpts, SendOpts};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};

struct Counting;

thread_local! {
    /// Set on the test's thread while it counts.
    static COUNTING: Cell<bool> = const { Cell::new(false) };
}
static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

/// Whether this thread counts now (not during its own teardown).
fn counting() -> bool {
    COUNTING.try_with(Cell::get).unwrap_or(false)
}

// SAFETY: forwards every call to the system allocator unchanged; it only
// counts allocations on a thread while its COUNTING is set.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if counting() {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: same contract as our caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as our caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if counting() {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: same contract as our caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const ROUNDS: usize = 2000;

/// Run `f` on a current-thread runtime, so every operation, both drivers
/// and both loops run on the test's thread, whose allocations count.
fn on_this_thread(f: impl std::future::Future<Output = f64>) -> f64 {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

/// Allocations per operation over `ROUNDS` ping-pongs (four operations
/// each: a send and a receive on either side) after a warm-up; with
/// `inject`, the first side injects its sends (`LoopHandle::inject`).
fn per_operation(provider: &str, inject: bool) -> f64 {
    let (me, them) = common::sleeping_pair(profile(provider));
    on_this_thread(async move {
        let (a, b) = (AsyncLoop::start(me.ev), AsyncLoop::start(them.ev));
        let send = SendOpts {
            tag: Some(1),
            data: None,
        };
        let recv = RecvOpts {
            tag: Some((1, 0)),
            from: None,
        };
        let (mut ta, mut ra, mut rb) = (Buffer::new(64), Buffer::new(64), Buffer::new(64));
        let mut count = 0;
        for round in 0..500 + ROUNDS {
            if round == 500 {
                ALLOCATIONS.store(0, Ordering::SeqCst);
                COUNTING.with(|c| c.set(true));
            }
            ta.set_len(8);
            let sent = async {
                if inject {
                    a.inject(me.peer, ta.as_slice(), send).await.unwrap();
                    ta
                } else {
                    a.send(me.peer, ta, send).await.unwrap().buffer.unwrap()
                }
            };
            let (back, sent, echoed) = tokio::join!(a.recv(me.ep, ra, recv), sent, async {
                // The echo sends back the buffer it received into.
                let got = b.recv(them.ep, rb, recv).await.unwrap().buffer.unwrap();
                b.send(them.peer, got, send).await.unwrap().buffer.unwrap()
            });
            (ra, ta) = (back.unwrap().buffer.unwrap(), sent);
            rb = echoed;
            count += 1;
        }
        COUNTING.with(|c| c.set(false));
        assert_eq!(count, 500 + ROUNDS);
        let n = ALLOCATIONS.load(Ordering::SeqCst);
        n as f64 / (ROUNDS * 4) as f64
    })
}

/// Allocations per operation over `ROUNDS` rounds of a 64-byte write, a
/// 64-byte read and a fetch-add (three operations) through a handle into
/// the other loop's region, after a warm-up. The target's loop is behind
/// a handle too: its driver serves the fetch-adds where they are emulated
/// (tcp;ofi_rxm).
fn one_sided_per_operation(provider: &str) -> f64 {
    let (mut me, mut them) = common::sleeping_pair(common::atomic_profile(provider));
    let region = them.ev.register(4096, Access::ReadWrite).unwrap();
    let remote = me.ev.import(&region.remote().encode()).unwrap();
    let local = me.ev.register(4096, Access::ReadWrite).unwrap();
    on_this_thread(async move {
        let (a, _b) = (AsyncLoop::start(me.ev), AsyncLoop::start(them.ev));
        for round in 0..500 + ROUNDS {
            if round == 500 {
                ALLOCATIONS.store(0, Ordering::SeqCst);
                COUNTING.with(|c| c.set(true));
            }
            let w = a.write(me.peer, local.local(0, 64).unwrap(), &remote, 0).await;
            w.unwrap().result.unwrap();
            let r = a.read(me.peer, local.local(64, 64).unwrap(), &remote, 0).await;
            r.unwrap().result.unwrap();
            let f = a
                .atomic(me.peer, Atomic::FetchAdd(1), &remote, 128)
                .await
                .unwrap();
            assert_eq!(f.value, Some(round as u64), "{provider}: fetch-add {round}");
        }
        COUNTING.with(|c| c.set(false));
        let n = ALLOCATIONS.load(Ordering::SeqCst);
        n as f64 / (ROUNDS * 3) as f64
    })
}

/// Allocations per message over `ROUNDS` messages of 40 bytes sent into
/// 1 KiB multi-receive buffers, each posted again when it comes back (a
/// post of a buffer every 20-odd messages), after a warm-up: the send, the
/// piece, reading its bytes, and the buffers' posts all count.
fn multi_recv_per_message(provider: &str) -> f64 {
    let (me, them) = common::multi_recv_pair(provider);
    on_this_thread(async move {
        let (a, b) = (AsyncLoop::start(me.ev), AsyncLoop::start(them.ev));
        let mut pieces = a.recv_multi(me.ep, Buffer::new(1024)).await.unwrap();
        let mut out = Buffer::new(40);
        let mut sum = 0u64;
        for round in 0..500 + ROUNDS {
            if round == 500 {
                ALLOCATIONS.store(0, Ordering::SeqCst);
                COUNTING.with(|c| c.set(true));
            }
            out.as_mut_slice()[..8].copy_from_slice(&(round as u64).to_le_bytes());
            out = b
                .send(them.peer, out, SendOpts::default())
                .await
                .unwrap()
                .buffer
                .unwrap();
            loop {
                let c = pieces.next().await.unwrap().unwrap();
                c.result.as_ref().unwrap();
                let mut got = None;
                if let Some((offset, len)) = c.multi {
                    let read = |b: &[u8]| u64::from_le_bytes(b[..8].try_into().unwrap());
                    got = pieces.bytes(&c, read).or_else(|| {
                        c.buffer
                            .as_ref()
                            .map(|b| read(&b.as_slice()[offset..offset + len]))
                    });
                }
                if let Some(buf) = c.buffer {
                    pieces = a.recv_multi(me.ep, buf).await.unwrap();
                }
                if let Some(v) = got {
                    sum += v;
                    break;
                }
            }
        }
        COUNTING.with(|c| c.set(false));
        let n = 500 + ROUNDS as u64;
        assert_eq!(sum, n * (n - 1) / 2, "{provider}: every message once");
        ALLOCATIONS.load(Ordering::SeqCst) as f64 / ROUNDS as f64
    })
}

/// `per(provider)`, the allocations per `what`, on tcp;ofi_rxm and shm:
/// none, as the docs promise after warm-up.
fn none_per(what: &str, per: impl Fn(&str) -> f64) {
    for provider in ["tcp;ofi_rxm", "shm"] {
        let n = per(provider);
        eprintln!("{provider}: {n:.4} allocations per {what}");
        assert!(
            n == 0.0,
            "{provider}: {n:.4} allocations per {what}, where the docs promise none after warm-up"
        );
    }
}

#[test]
fn no_allocation_per_multi_recv_piece_on_tcp_rxm_and_shm() {
    none_per("message into multi-receive buffers", multi_recv_per_message);
}

#[test]
fn no_allocation_per_one_sided_operation_on_tcp_rxm_and_shm() {
    none_per("write, read or fetch-add", one_sided_per_operation);
}

#[test]
fn no_allocation_per_operation_on_tcp_rxm_and_shm() {
    none_per("operation", |p| per_operation(p, false));
    none_per("operation, injecting", |p| per_operation(p, true));
}
