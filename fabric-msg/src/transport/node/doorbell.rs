//! Sleeping until a same-node peer writes: one futex word in the header of
//! each rank's segment, which its owner sets before it sleeps and which a
//! sender clears, waking the owner, after it publishes a frame.
//!
//! The handshake is Dekker's. The owner stores 1, fences, then looks at
//! every inbound ring once more before it sleeps; a sender publishes its
//! frame (the stamp's Release store), fences, then loads the word. With a
//! sequentially consistent fence on both sides, at least one of them sees
//! the other's store: the owner sees the frame and does not sleep, or the
//! sender sees 1 and wakes it. `futex(2)`'s wait sleeps only while the
//! word still holds 1, so a wake between the owner's look and its wait is
//! not lost. The word is in shared memory (`MAP_SHARED` memfd), so the
//! futex is not `FUTEX_PRIVATE_FLAG`.
//!
//! Every sleep is bounded by its caller's timeout: a peer that writes the
//! word (or a hostile one that never wakes anyone) costs at most a
//! spurious wake or a full timeout, never a hang. A sender whose ring is
//! full is not woken when room appears (consumers ring no bell), which is
//! one more reason the sleep is bounded.

use super::segment::Segment;
use std::sync::atomic::{fence, AtomicU32, Ordering};
use std::time::Duration;

/// Byte offset of the word in the segment's header line (after the magic,
/// pid, cookie, length and mapping address: `segment.rs`).
pub const DOORBELL: usize = 48;

/// The word of one segment: a peer's, to ring; this rank's own, to sleep on.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Doorbell {
    word: *const AtomicU32,
}

// SAFETY: the pointer is into a shared mapping held alive by the
// `Arc<Segment>` of whoever holds the doorbell (the producer's or the
// node loop's), and only atomics are done through it.
unsafe impl Send for Doorbell {}
// SAFETY: as for `Send`: every access through the pointer is atomic.
unsafe impl Sync for Doorbell {}

impl Doorbell {
    /// The doorbell of `seg`. The caller keeps `seg` alive as long as the
    /// doorbell.
    pub(crate) fn of(seg: &Segment) -> Doorbell {
        Doorbell {
            word: seg.at(DOORBELL, 4).cast::<AtomicU32>().as_ptr(),
        }
    }

    fn word(&self) -> &AtomicU32 {
        // SAFETY: 4-aligned (the segment is page-aligned) and inside the
        // header of a live mapping (`Doorbell::of`).
        unsafe { &*self.word }
    }

    /// After publishing a frame: wake the owner if it sleeps. One fence
    /// and one load when it does not.
    #[inline]
    pub(crate) fn ring(&self) {
        fence(Ordering::SeqCst);
        if self.word().load(Ordering::Relaxed) != 0 && self.word().swap(0, Ordering::Relaxed) != 0 {
            futex(self.word, libc::FUTEX_WAKE, i32::MAX as u32, None);
        }
    }

    /// Sleep on this rank's own doorbell for at most `timeout`, unless
    /// `nothing_came()` (a last look at the inbound rings, after the
    /// announcement) says a frame is there.
    pub(crate) fn sleep(&self, timeout: Duration, nothing_came: impl FnOnce() -> bool) {
        self.word().store(1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        if nothing_came() {
            futex(self.word, libc::FUTEX_WAIT, 1, Some(timeout));
        }
        self.word().store(0, Ordering::Relaxed);
    }
}

/// `futex(2)` on `word`; its result is not needed (a wait ends woken, timed
/// out, interrupted or because the word changed: each means look again).
fn futex(word: *const AtomicU32, op: libc::c_int, val: u32, timeout: Option<Duration>) {
    let ts = timeout.map(|t| libc::timespec {
        tv_sec: t.as_secs().min(i64::MAX as u64) as libc::time_t,
        tv_nsec: libc::c_long::from(t.subsec_nanos() as i32),
    });
    let ts_ptr = ts
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: `word` is a valid, aligned u32 in a live shared mapping;
    // the timeout, where given, outlives the call; FUTEX_WAIT and
    // FUTEX_WAKE read nothing else.
    unsafe {
        libc::syscall(libc::SYS_futex, word, op, val, ts_ptr, std::ptr::null::<u32>(), 0);
    }
}

#[cfg(test)]
mod tests {
    use super::Doorbell;
    use crate::transport::node::segment::Segment;
    use std::time::{Duration, Instant};

    #[test]
    fn a_sleeper_is_woken_by_a_ring_and_otherwise_times_out() {
        let seg = Segment::create(4096).expect("segment");
        let bell = Doorbell::of(&seg);
        let t = Instant::now();
        bell.sleep(Duration::from_millis(30), || true);
        assert!(
            t.elapsed() >= Duration::from_millis(25),
            "slept {:?}",
            t.elapsed()
        );
        // Something came before the sleep: no sleep at all.
        let t = Instant::now();
        bell.sleep(Duration::from_secs(5), || false);
        assert!(t.elapsed() < Duration::from_secs(1));
        // A ring from another thread ends a long sleep early.
        let ringer = bell;
        let waker = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            for _ in 0..200 {
                ringer.ring();
                std::thread::sleep(Duration::from_millis(5));
            }
        });
        let t = Instant::now();
        bell.sleep(Duration::from_secs(5), || true);
        assert!(
            t.elapsed() < Duration::from_secs(2),
            "woken after {:?}",
            t.elapsed()
        );
        waker.join().expect("ringer");
    }
}
