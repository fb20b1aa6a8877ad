//! The `tokio` feature's one-sided operations and atomics
//! (`async_loop/one_sided.rs`) on tcp;ofi_rxm and shm, both loops behind
//! `AsyncLoop`s on one runtime: reads and writes from many tasks at once,
//! every byte checked on both sides; fetch-adds and compare-swaps from
//! many tasks, atomic with respect to each other; a post out of bounds or
//! without access refused with what was wrong; and a write whose future
//! is dropped in flight, after its region's handle was dropped too, still
//! lands from memory that was not freed under it (ASan runs this); and
//! writes with a notice, each notice awaited, kept until awaited, or
//! left by a dropped future for the next.
#![cfg(feature = "tokio")]

use crate::common;

use common::pattern;
use fabric_msg::async_loop::{AsyncLoop, LoopHandle};
use fabric_msg::{Access, Atomic, Error, MemoryRegion, OpKind, Peer, RemoteMemory};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Bytes of the target's region: a part of `PART` bytes per task.
const PART: usize = 128 << 10;
const TASKS: usize = 8;

/// The initiator's handle and its peer; the target's handle (its driver
/// serves the initiator's operations where the provider needs the
/// target's progress), its region and that region as the initiator
/// imported it.
struct Scene {
    me: LoopHandle,
    peer: Peer,
    target: LoopHandle,
    region: MemoryRegion,
    remote: Arc<RemoteMemory>,
}

fn scene(provider: &str, access: Access) -> Scene {
    let (mut me, mut them) = common::sleeping_pair(common::atomic_profile(provider));
    let region = them.ev.register(TASKS * PART, access).unwrap();
    let remote = me.ev.import(&region.remote().encode()).unwrap();
    Scene {
        me: AsyncLoop::start(me.ev),
        peer: me.peer,
        target: AsyncLoop::start(them.ev),
        region,
        remote: Arc::new(remote),
    }
}

/// A region of the initiator's for `len` bytes, registered through its
/// handle.
async fn local_region(h: &LoopHandle, len: usize) -> MemoryRegion {
    h.with_loop(move |ev| ev.register(len, Access::ReadWrite))
        .await
        .unwrap()
        .unwrap()
}

/// Each task writes its part of the target's region (8 B, 4 KiB, then
/// its whole 128 KiB part: each size class of the provider's RMA), reads
/// it back into other memory and compares; then the target reads every
/// part where it lies.
async fn reads_and_writes_from_many_tasks(provider: &str) {
    let s = scene(provider, Access::ReadWrite);
    let mut tasks = Vec::new();
    for task in 0..TASKS {
        let (me, peer, remote) = (s.me.clone(), s.peer, s.remote.clone());
        let provider = provider.to_string();
        tasks.push(tokio::spawn(async move {
            let local = local_region(&me, 2 * PART).await;
            let at = (task * PART) as u64;
            for len in [8, 4096, PART] {
                let bytes = pattern(task as u64 * 10 + len as u64, len);
                local.write_at(0, &bytes).unwrap();
                let w = me
                    .write(peer, local.local(0, len).unwrap(), &remote, at)
                    .await
                    .unwrap();
                assert_eq!(w.kind, OpKind::Write);
                w.result.unwrap();
                let r = me
                    .read(peer, local.local(PART, len).unwrap(), &remote, at)
                    .await
                    .unwrap();
                assert_eq!(r.kind, OpKind::Read);
                r.result.unwrap();
                let mut back = vec![0u8; len];
                local.read_at(PART, &mut back).unwrap();
                assert!(
                    back == bytes,
                    "{provider}: task {task} read back other bytes than it wrote ({len} B)"
                );
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    for task in 0..TASKS {
        let mut part = vec![0u8; PART];
        s.region.read_at(task * PART, &mut part).unwrap();
        assert!(
            part == pattern(task as u64 * 10 + PART as u64, PART),
            "{provider}: the target's part {task} is not what its task wrote last"
        );
    }
    s.me.close().await;
    s.target.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_and_writes_from_many_tasks_on_tcp_rxm() {
    reads_and_writes_from_many_tasks("tcp;ofi_rxm").await;
}

#[tokio::test(flavor = "current_thread")]
async fn reads_and_writes_from_many_tasks_on_shm() {
    reads_and_writes_from_many_tasks("shm").await;
}

/// Eight tasks, each 100 fetch-adds of 1 on word 0 and 25 increments of
/// word 1 by compare-and-swap (retried when another task got there
/// first): every old value a fetch-add saw is seen once, and both words
/// end at their counts, by an atomic read and in the target's memory.
async fn atomics_from_many_tasks(provider: &str) {
    const ADDS: u64 = 100;
    const SWAPS: u64 = 25;
    let s = scene(provider, Access::ReadWrite);
    let mut tasks = Vec::new();
    for _ in 0..TASKS {
        let (me, peer, remote) = (s.me.clone(), s.peer, s.remote.clone());
        tasks.push(tokio::spawn(async move {
            let mut seen = Vec::new();
            for _ in 0..ADDS {
                let c = me.atomic(peer, Atomic::FetchAdd(1), &remote, 0).await.unwrap();
                assert_eq!(c.kind, OpKind::Atomic);
                seen.push(common::fetched_value(&c, "fetch-add"));
            }
            for _ in 0..SWAPS {
                let mut expected = 0;
                loop {
                    let swap = Atomic::CompareSwap {
                        expected,
                        new: expected + 1,
                    };
                    let c = me.atomic(peer, swap, &remote, 8).await.unwrap();
                    let old = common::fetched_value(&c, "compare-swap");
                    if old == expected {
                        break;
                    }
                    expected = old;
                }
            }
            seen
        }));
    }
    let mut seen = Vec::new();
    for t in tasks {
        seen.extend(t.await.unwrap());
    }
    seen.sort_unstable();
    let all = TASKS as u64 * ADDS;
    assert!(
        seen == (0..all).collect::<Vec<_>>(),
        "{provider}: the fetch-adds did not each see another old value"
    );
    for (offset, want) in [(0, all), (8, TASKS as u64 * SWAPS)] {
        let c =
            s.me.atomic(s.peer, Atomic::Read, &s.remote, offset)
                .await
                .unwrap();
        assert_eq!(
            common::fetched_value(&c, "atomic read"),
            want,
            "{provider}: word at {offset}"
        );
        let mut word = [0u8; 8];
        s.region.read_at(offset as usize, &mut word).unwrap();
        assert_eq!(
            u64::from_le_bytes(word),
            want,
            "{provider}: the target's word at {offset}"
        );
    }
    s.me.close().await;
    s.target.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn atomics_from_many_tasks_are_atomic_on_tcp_rxm() {
    atomics_from_many_tasks("tcp;ofi_rxm").await;
}

#[tokio::test(flavor = "current_thread")]
async fn atomics_from_many_tasks_are_atomic_on_shm() {
    atomics_from_many_tasks("shm").await;
}

/// A read past the end, a write to memory exposed for reading only and a
/// misaligned atomic are refused before anything is posted, each saying
/// what was wrong; then a 1 MiB write whose future is dropped after its
/// first poll, its local region's handle dropped too, still lands whole.
async fn refusals_and_a_dropped_write(provider: &str) {
    let s = scene(provider, Access::Read);
    let local = local_region(&s.me, TASKS * PART).await;
    let len = TASKS * PART;
    let past =
        s.me.read(s.peer, local.local(0, 16).unwrap(), &s.remote, len as u64 - 8)
            .await;
    assert!(
        matches!(past, Err(Error::OutOfBounds { offset, len: 16, .. }) if offset == len as u64 - 8),
        "{provider}: a read past the end gave {past:?}"
    );
    let denied =
        s.me.write(s.peer, local.local(0, 16).unwrap(), &s.remote, 0)
            .await;
    assert!(
        matches!(denied, Err(Error::AccessDenied { .. })),
        "{provider}: a write to memory exposed for reading gave {denied:?}"
    );
    let misaligned = s.me.atomic(s.peer, Atomic::Read, &s.remote, 4).await;
    assert!(
        matches!(&misaligned, Err(Error::Usage(m)) if m.contains("aligned")),
        "{provider}: an atomic at offset 4 gave {misaligned:?}"
    );

    // The write needs write access: a second region, exposed for it.
    let region = s
        .target
        .with_loop(move |ev| ev.register(len, Access::ReadWrite))
        .await
        .unwrap()
        .unwrap();
    let remote =
        s.me.with_loop({
            let bytes = region.remote().encode();
            move |ev| ev.import(&bytes)
        })
        .await
        .unwrap()
        .unwrap();
    // A first write connects the pair where the provider connects on
    // first use (tcp;ofi_rxm refuses an RMA for room until then, and a
    // future dropped while its post waits for room posts nothing).
    let first = s.me.write(s.peer, local.local(0, 8).unwrap(), &remote, 0).await;
    first.unwrap().result.unwrap();
    let bytes = pattern(77, len);
    local.write_at(0, &bytes).unwrap();
    let before = s.me.with_loop(|ev| ev.in_flight()).await.unwrap();
    let mut write = Box::pin(s.me.write(s.peer, local.local(0, len).unwrap(), &remote, 0));
    // Polled until the loop holds it: a post the provider refuses for
    // room is retried at the next poll (tcp;ofi_rxm does refuse at times,
    // under ASan's pace), and one refused is not in flight. The count is
    // read right after the poll, with nothing run between (this test's
    // runtime has one thread).
    let deadline = Instant::now() + common::TIMEOUT;
    loop {
        assert!(
            common::poll_once(&mut write).await.is_none(),
            "{provider}: a 1 MiB write completed before the loop was seen to hold it"
        );
        if s.me.with_loop(|ev| ev.in_flight()).await.unwrap() > before {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{provider}: the write was never posted"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    drop(write);
    drop(local);
    let deadline = Instant::now() + common::TIMEOUT;
    let mut landed = vec![0u8; len];
    loop {
        region.read_at(0, &mut landed).unwrap();
        if landed == bytes {
            break;
        }
        if Instant::now() >= deadline {
            let first = landed.iter().zip(&bytes).position(|(a, b)| a != b);
            panic!("{provider}: the dropped write never landed whole (first byte wrong: {first:?})");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    s.me.close().await;
    s.target.close().await;
}

// One thread: between the poll that posts the write and the look at the
// loop's count, no driver can take the write's completion (on two
// workers tcp;ofi_rxm's driver did, once, in CI).
#[tokio::test(flavor = "current_thread")]
async fn refusals_say_why_and_a_dropped_write_still_lands_on_tcp_rxm() {
    refusals_and_a_dropped_write("tcp;ofi_rxm").await;
}

#[tokio::test(flavor = "current_thread")]
async fn refusals_say_why_and_a_dropped_write_still_lands_on_shm() {
    refusals_and_a_dropped_write("shm").await;
}

/// Three writes with a notice, each awaited by the target as it comes:
/// in order, with its value, the bytes in place at the notice. Two more
/// sent before anyone awaits: kept, and handed out in order. A notice
/// awaited under a timeout that expires: the next notice goes to the next
/// future. A notice handed to a future that is then dropped: it goes to
/// the next, or to one that already waits.
async fn notices(provider: &str) {
    let s = scene(provider, Access::ReadWrite);
    let local = local_region(&s.me, 4096).await;
    let write = |i: u64| {
        local.write_at(0, &pattern(i, 4096)).unwrap();
        s.me.write_data(s.peer, local.all(), &s.remote, i * 4096, 0xabcd_0000 + i)
    };
    let heard = |i: u64, c: fabric_msg::Completion| {
        assert_eq!(c.kind, OpKind::RemoteWrite, "{provider}: {c:?}");
        c.result.unwrap();
        assert_eq!(c.data, Some(0xabcd_0000 + i), "{provider}: notice {i}");
        let mut got = vec![0u8; 4096];
        s.region.read_at(i as usize * 4096, &mut got).unwrap();
        assert!(
            got == pattern(i, 4096),
            "{provider}: write {i} not in place at its notice"
        );
    };
    for i in 0..3 {
        let (sent, notice) = tokio::join!(write(i), s.target.remote_write());
        sent.unwrap().result.unwrap();
        heard(i, notice.unwrap());
    }
    for i in 3..5 {
        write(i).await.unwrap().result.unwrap();
    }
    for i in 3..5 {
        let c = tokio::time::timeout(common::TIMEOUT, s.target.remote_write())
            .await
            .unwrap_or_else(|_| {
                panic!("{provider}: notice {i}, sent before anyone awaited it, was not kept")
            });
        heard(i, c.unwrap());
    }
    let none = tokio::time::timeout(Duration::from_millis(50), s.target.remote_write()).await;
    assert!(none.is_err(), "{provider}: a notice came with no write: {none:?}");
    write(5).await.unwrap().result.unwrap();
    let c = tokio::time::timeout(common::TIMEOUT, s.target.remote_write())
        .await
        .unwrap_or_else(|_| panic!("{provider}: notice 5 went to the dropped future"));
    heard(5, c.unwrap());
    // A future polled once, then left while the notice comes (the
    // target's driver looks for it within 10 ms and hands the notice to
    // its slot), then dropped: the notice goes to the next future.
    let mut left = Box::pin(s.target.remote_write());
    assert!(common::poll_once(&mut left).await.is_none());
    write(6).await.unwrap().result.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    drop(left);
    let c = tokio::time::timeout(common::TIMEOUT, s.target.remote_write())
        .await
        .unwrap_or_else(|_| panic!("{provider}: notice 6 was lost with the future it was handed to"));
    heard(6, c.unwrap());
    // Two futures wait; the notice goes to the first, which is then
    // dropped: it goes to the second, which is still waiting.
    let mut first = Box::pin(s.target.remote_write());
    let mut second = Box::pin(s.target.remote_write());
    assert!(common::poll_once(&mut first).await.is_none());
    assert!(common::poll_once(&mut second).await.is_none());
    write(7).await.unwrap().result.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    drop(first);
    let c = tokio::time::timeout(common::TIMEOUT, second)
        .await
        .unwrap_or_else(|_| panic!("{provider}: notice 7 did not pass to the future still waiting"));
    heard(7, c.unwrap());
    s.me.close().await;
    s.target.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notices_of_writes_are_awaited_kept_and_never_lost_to_a_dropped_future_on_tcp_rxm() {
    notices("tcp;ofi_rxm").await;
}

#[tokio::test(flavor = "current_thread")]
async fn notices_of_writes_are_awaited_kept_and_never_lost_to_a_dropped_future_on_shm() {
    notices("shm").await;
}
