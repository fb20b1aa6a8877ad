//! The progress thread: one per [`EventLoop`](super::event_loop::EventLoop)
//! that asks for it ([`LoopConfig::progress_thread`](super::event_loop::LoopConfig::progress_thread)),
//! so that one-sided operations *to* this process complete while its
//! application does not call `poll`.
//!
//! On `tcp;ofi_rxm`, on `tcp`'s connected endpoints and on `shm`, a peer's
//! RMA read or write (and `shm`'s native atomics) is carried out by this
//! side's provider, and the provider works only inside a libfabric call on
//! this side's CQ: a target that computes or sleeps stalls its initiators.
//!
//! The thread wakes every `period` and, if the loop has not read its CQ
//! since the last wake, calls `fi_cq_read(cq, buf, 0)`; while the loop
//! does read it, the thread sleeps longer and longer, up to
//! `QUIET_PERIODS` periods. In libfabric 1.17
//! and 2.1 every one of those providers reads through `ofi_cq_readfrom`
//! (`prov/util/src/util_cq.c`; `tcp` in 2.1 through `xnet_cq_readfrom`,
//! which wraps it), which runs the provider's progress first and then
//! copies at most `count` entries: with a count of 0 it copies none, so no
//! completion is taken from the application. That needs a domain opened
//! at `FI_THREAD_SAFE` (two threads call into one CQ): the loop refuses to
//! start the thread at any other level.
//!
//! A loop that polls pays one relaxed store per CQ read ([`Progress::polled`]);
//! the thread then sleeps through its period without calling libfabric,
//! and sleeps twice as long the next time.
//!
//! `FI_THREAD_SAFE` was not enough in practice: with `tcp;ofi_rxm` in
//! libfabric 1.17 the thread crashed (SIGSEGV inside `fi_cq_read`) in 5 of
//! 6 runs of `tests/idle_target.rs`, while loops were being set up, and in
//! none since the thread holds a gate for each progress call and the loop
//! holds the same gate around what changes the set of endpoints and
//! addresses the CQ serves: opening, binding, enabling, accepting,
//! connecting and closing endpoints, and inserting addresses
//! ([`Progress::gate`]). None of those is on the data path.

use crate::ffi;
use crate::libfabric::CqProgress;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

#[derive(Default)]
struct Shared {
    /// Set by the loop on every CQ read; cleared by the thread.
    polled: AtomicBool,
    stop: AtomicBool,
    /// Progress calls the thread made (for tests and diagnostics).
    runs: AtomicU64,
    /// Held by the thread for each progress call, and by the loop around
    /// endpoint and address changes.
    gate: Arc<Mutex<()>>,
}

/// A running progress thread; dropping it stops and joins it.
pub(crate) struct Progress {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Progress {
    /// Start driving `cq`'s progress every `period` (at least 10 µs). Its
    /// maker ([`Cq::progress_handle`](crate::libfabric::Cq::progress_handle))
    /// promised the CQ stays open until the returned value is dropped.
    pub(crate) fn start(cq: CqProgress, period: Duration) -> std::io::Result<Progress> {
        let shared = Arc::new(Shared::default());
        let s = shared.clone();
        let period = period.max(Duration::from_micros(10));
        let thread = std::thread::Builder::new()
            .name("fabric-msg-progress".into())
            .spawn(move || drive(&s, cq, period))?;
        Ok(Progress {
            shared,
            thread: Some(thread),
        })
    }

    /// The loop read its CQ (and so ran the provider's progress) itself.
    #[inline]
    pub(crate) fn polled(&self) {
        self.shared.polled.store(true, Ordering::Relaxed);
    }

    /// The gate the thread holds while it calls into libfabric: the loop
    /// holds it around opening, enabling and closing endpoints and inserting
    /// addresses (a clone, so the loop can lock it while it borrows itself).
    pub(crate) fn gate(&self) -> Arc<Mutex<()>> {
        self.shared.gate.clone()
    }

    /// Stop calling libfabric (the thread ends at its next wake; the drop
    /// still joins it): for a loop whose owner gave up after a loss, where
    /// a progress call could take in the lost peer's hang-up
    /// (`EventLoop::give_up_when`).
    pub(crate) fn halt(&self) {
        self.shared.stop.store(true, Ordering::Release);
    }

    /// Progress calls the thread has made so far.
    pub(crate) fn runs(&self) -> u64 {
        self.shared.runs.load(Ordering::Relaxed)
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            if t.join().is_err() {
                log::warn!("the progress thread panicked");
            }
        }
    }
}

/// While the loop polls by itself, the thread's sleep doubles up to this
/// many periods. Each wake takes a core from a rank that may be spinning
/// on it: with a wake every millisecond, a 2-rank barrier on this 2-core
/// machine had a p99.9 of 27-60 µs against 3.4-9.1 µs with no thread
/// (`world_bench barrier -S 8 -I 50000`, 2026-11-29). The cost: once the
/// loop stops polling, the first progress call comes within this many
/// periods (16 ms by default), then every period.
const QUIET_PERIODS: u32 = 16;

/// The thread's body.
fn drive(shared: &Shared, cq: CqProgress, period: Duration) {
    let mut warned = false;
    let mut sleep = period;
    loop {
        std::thread::park_timeout(sleep);
        if shared.stop.load(Ordering::Acquire) {
            return;
        }
        if shared.polled.swap(false, Ordering::Relaxed) {
            sleep = (sleep * 2).min(period * QUIET_PERIODS);
            continue;
        }
        sleep = period;
        let rc = {
            // The loop changes no endpoint while the gate is held.
            let _gate = shared.gate.lock();
            cq.drive()
        };
        shared.runs.fetch_add(1, Ordering::Relaxed);
        let eagain = -(ffi::FI_EAGAIN as isize);
        let eavail = -(ffi::FI_EAVAIL as isize);
        if rc < 0 && rc != eagain && rc != eavail && !warned {
            warned = true;
            log::warn!(
                call = "fi_cq_read", fi_errno = rc.unsigned_abs(), op = "progress";
                "progress thread: {}",
                crate::error::Error::from_rc("fi_cq_read", rc as i64)
            );
        }
    }
}
