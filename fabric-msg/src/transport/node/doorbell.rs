//! Sleeping until a same-node peer writes: one futex word in the header of
//! each rank's segment, which its owner sets before it sleeps and which a
//! sender clears, waking the owner, after it publishes a frame.
//!
//! The handshake is Dekker's. The owner stores a non-zero value, fences,
//! then looks at every inbound ring once more before it sleeps; a sender
//! publishes its frame (the stamp's Release store), fences, then loads the
//! word. With a sequentially consistent fence on both sides, at least one
//! of them sees the other's store: the owner sees the frame and does not
//! sleep, or the sender sees the word set and wakes it. `futex(2)`'s wait
//! sleeps only while the word still holds 1, so a wake between the owner's
//! look and its wait is not lost. The word is in shared memory
//! (`MAP_SHARED` memfd), so the futex is not `FUTEX_PRIVATE_FLAG`.
//!
//! **Sleeping beside another descriptor.** A futex cannot be waited on
//! together with a descriptor, and a World rank that waits for a message
//! from its node and one from another node at once must wake for either:
//! the node's through this word, the other's through the main loop's wait
//! fd. So the owner may also have an eventfd (`Segment::with_bell`),
//! whose number it writes into its segment's header; each peer takes its
//! own descriptor of it with `pidfd_getfd(2)` when it attaches
//! (`Segment::reach_bell`), after checking it is an eventfd. To sleep
//! beside a descriptor, the owner stores 2 rather than 1 and `poll`s both;
//! a sender that swaps a 2 out writes the eventfd instead of waking the
//! futex. A peer that could not take the eventfd (an older kernel, a
//! ptrace policy that allows reading memory but not descriptors) counts
//! itself in the header; while that count is not zero the owner's sleeps
//! beside a descriptor stay short ([`Segment::all_reach_bell`]), as they were
//! before the eventfd.
//!
//! Every sleep is bounded by its caller's timeout: a peer that writes the
//! word (or a hostile one that never wakes anyone) costs at most a
//! spurious wake or a full timeout, never a hang. A sender whose ring is
//! full is not woken when room appears (consumers ring no bell), which is
//! one more reason the sleep is bounded.

use super::segment::Segment;
use std::os::fd::RawFd;
use std::sync::atomic::{fence, AtomicU32, Ordering};
use std::time::Duration;

/// Byte offset of the word in the segment's header line (after the magic,
/// pid, cookie, length and mapping address: `segment.rs`).
pub const DOORBELL: usize = 48;

/// The word's value while its owner sleeps on the futex.
const ON_FUTEX: u32 = 1;
/// The word's value while its owner sleeps on its eventfd and another
/// descriptor.
const ON_EVENTFD: u32 = 2;

/// The word of one segment: a peer's, to ring; this rank's own, to sleep on.
/// With the segment's eventfd (this process's descriptor of it), where it
/// has one.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Doorbell {
    word: *const AtomicU32,
    /// The eventfd, or -1: held open by the segment.
    event: RawFd,
}

// SAFETY: the pointer is into a shared mapping held alive by the
// `Arc<Segment>` of whoever holds the doorbell (the producer's or the
// node loop's), which also holds the eventfd open; only atomics are done
// through the pointer, and `read`/`write` on the eventfd are thread-safe.
unsafe impl Send for Doorbell {}
// SAFETY: as for `Send`: every access through the pointer is atomic.
unsafe impl Sync for Doorbell {}

impl Doorbell {
    /// The doorbell of `seg`. The caller keeps `seg` alive as long as the
    /// doorbell.
    pub(crate) fn of(seg: &Segment) -> Doorbell {
        Doorbell {
            word: seg.at(DOORBELL, 4).cast::<AtomicU32>().as_ptr(),
            event: seg.bell().unwrap_or(-1),
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
        if self.word().load(Ordering::Relaxed) != 0 {
            self.wake();
        }
    }

    #[cold]
    fn wake(&self) {
        match self.word().swap(0, Ordering::Relaxed) {
            0 => {}
            ON_EVENTFD if self.event >= 0 => {
                let one = 1u64.to_ne_bytes();
                // SAFETY: 8 bytes from the stack to an eventfd this
                // process holds open (the segment's, checked to be an
                // eventfd when taken); non-blocking, so a full counter
                // (which a wake never needs) fails at once.
                unsafe { libc::write(self.event, one.as_ptr().cast(), one.len()) };
            }
            // Asleep on the futex, or on an eventfd this process could not
            // take (the owner's sleep is short then: `Segment::all_reach_bell`).
            _ => futex(self.word, libc::FUTEX_WAKE, i32::MAX as u32, None),
        }
    }

    /// Sleep on this rank's own doorbell for at most `timeout`, unless
    /// `nothing_came()` (a last look at the inbound rings, after the
    /// announcement) says a frame is there.
    pub(crate) fn sleep(&self, timeout: Duration, nothing_came: impl FnOnce() -> bool) {
        self.word().store(ON_FUTEX, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        if nothing_came() {
            futex(self.word, libc::FUTEX_WAIT, ON_FUTEX, Some(timeout));
        }
        self.word().store(0, Ordering::Relaxed);
    }

    /// Sleep until a peer rings this rank's own doorbell or `other` is
    /// readable, for at most `timeout`, unless `nothing_came()` says a
    /// frame is there. Needs the segment's eventfd: without one it sleeps
    /// on the futex alone.
    pub(crate) fn sleep_beside(&self, other: RawFd, timeout: Duration, nothing_came: impl FnOnce() -> bool) {
        if self.event < 0 {
            return self.sleep(timeout, nothing_came);
        }
        if let Some(event) = self.arm(nothing_came) {
            let mut fds = [
                libc::pollfd {
                    fd: other,
                    events: libc::POLLIN,
                    revents: 0,
                },
                libc::pollfd {
                    fd: event,
                    events: libc::POLLIN,
                    revents: 0,
                },
            ];
            let ts = timespec(timeout);
            // SAFETY: two pollfds and a timespec on the stack; ppoll
            // writes only the `revents` fields, and no signal mask is
            // given.
            unsafe { libc::ppoll(fds.as_mut_ptr(), 2, &ts, std::ptr::null()) };
            if fds[1].revents & libc::POLLIN != 0 {
                self.drain();
            }
        }
        self.word().store(0, Ordering::Relaxed);
    }

    /// Announce that the owner is about to wait on its eventfd (beside
    /// other descriptors, in a wait the caller runs: an async runtime's
    /// reactor), then ask `nothing_came()`: the eventfd to wait on, or
    /// `None` where the segment has none or something came. Peers that see
    /// the announcement write the eventfd. Call [`Doorbell::disarm`] after,
    /// whichever the answer.
    pub(crate) fn arm(&self, nothing_came: impl FnOnce() -> bool) -> Option<RawFd> {
        if self.event < 0 {
            return None;
        }
        self.word().store(ON_EVENTFD, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        nothing_came().then_some(self.event)
    }

    /// End the wait [`Doorbell::arm`] announced: peers ring no more, and
    /// a ring that came is taken off the eventfd.
    pub(crate) fn disarm(&self) {
        self.word().store(0, Ordering::Relaxed);
        if self.event >= 0 {
            self.drain();
        }
    }

    /// Mark the owner asleep beside a descriptor, without sleeping.
    #[cfg(test)]
    pub(crate) fn arm_beside_for_test(&self) {
        self.word().store(ON_EVENTFD, Ordering::Relaxed);
    }

    /// Reset the eventfd's count (a ring that came after the owner woke
    /// for another reason leaves it readable: one spurious wake at most).
    fn drain(&self) {
        let mut count = [0u8; 8];
        // SAFETY: reads 8 bytes into the stack from the non-blocking
        // eventfd the segment holds open.
        unsafe { libc::read(self.event, count.as_mut_ptr().cast(), count.len()) };
    }
}

fn timespec(t: Duration) -> libc::timespec {
    libc::timespec {
        tv_sec: t.as_secs().min(i64::MAX as u64) as libc::time_t,
        tv_nsec: libc::c_long::from(t.subsec_nanos() as i32),
    }
}

/// `futex(2)` on `word`; its result is not needed (a wait ends woken, timed
/// out, interrupted or because the word changed: each means look again).
fn futex(word: *const AtomicU32, op: libc::c_int, val: u32, timeout: Option<Duration>) {
    let ts = timeout.map(timespec);
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
    use crate::transport::node::pidfd::Watch;
    use crate::transport::node::segment::Segment;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::time::{Duration, Instant};

    /// A pipe: (read end, write end).
    fn pipe() -> (OwnedFd, OwnedFd) {
        let mut fds = [0; 2];
        // SAFETY: pipe fills the two ints it is given.
        assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        // SAFETY: two descriptors pipe2 just returned, owned by nothing else.
        unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
    }

    /// From 50 ms on, ring `ringer` every 5 ms for a second.
    fn keep_ringing(ringer: Doorbell) -> std::thread::JoinHandle<()> {
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            for _ in 0..200 {
                ringer.ring();
                std::thread::sleep(Duration::from_millis(5));
            }
        })
    }

    /// An owner's segment with an eventfd, and a peer's mapping of it that
    /// took the eventfd through a pidfd (of this same process).
    fn owner_and_peer() -> (Segment, Segment) {
        let own = Segment::with_bell(4096).expect("segment");
        let mut peer = Segment::attach(&own.name()).expect("attach");
        let watch = Watch::open(std::process::id()).expect("pidfd of this process");
        assert!(
            peer.reach_bell(Some(&watch)),
            "pidfd_getfd of this process's own eventfd"
        );
        assert!(own.all_reach_bell());
        (own, peer)
    }

    /// A 10 s sleep beside `fd` ends within 2 s.
    fn woken_beside(bell: &Doorbell, fd: std::os::fd::RawFd) {
        let t = Instant::now();
        bell.sleep_beside(fd, Duration::from_secs(10), || true);
        assert!(
            t.elapsed() < Duration::from_secs(2),
            "woken after {:?}",
            t.elapsed()
        );
    }

    #[test]
    fn a_sleep_beside_a_descriptor_wakes_for_a_peers_ring_or_the_descriptor() {
        let (own, peer) = owner_and_peer();
        let (r, w) = pipe();
        let bell = Doorbell::of(&own);
        // Nothing: the sleep runs to its timeout.
        let t = Instant::now();
        bell.sleep_beside(r.as_raw_fd(), Duration::from_millis(30), || true);
        assert!(
            t.elapsed() >= Duration::from_millis(25),
            "slept {:?}",
            t.elapsed()
        );
        // A peer's ring, through its own descriptor of the eventfd.
        let ringer = Doorbell::of(&peer);
        let waker = keep_ringing(ringer);
        woken_beside(&bell, r.as_raw_fd());
        waker.join().expect("ringer");
        // The other descriptor.
        let writer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            // SAFETY: one byte from the stack to a pipe we own.
            unsafe { libc::write(w.as_raw_fd(), [1u8].as_ptr().cast(), 1) };
            w
        });
        woken_beside(&bell, r.as_raw_fd());
        drop(writer.join().expect("writer"));
    }

    /// Whether `fd` is readable now.
    fn readable(fd: std::os::fd::RawFd) -> bool {
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one pollfd on the stack; timeout 0.
        unsafe { libc::poll(&mut p, 1, 0) == 1 }
    }

    /// A wait the owner runs itself (an async runtime's): while armed, a
    /// peer's ring writes the eventfd the arm gave; once disarmed, a ring
    /// writes nothing and what an earlier ring wrote is drained; where a
    /// frame came before the arm, no eventfd is given to wait on.
    #[test]
    fn an_armed_wait_is_rung_through_the_eventfd_and_a_disarmed_one_never() {
        let (own, peer) = owner_and_peer();
        let (bell, ringer) = (Doorbell::of(&own), Doorbell::of(&peer));
        let fd = bell.arm(|| true).expect("the segment's eventfd");
        assert!(!readable(fd));
        ringer.ring();
        assert!(readable(fd), "a ring while armed");
        bell.disarm();
        assert!(!readable(fd), "drained when disarmed");
        ringer.ring();
        assert!(!readable(fd), "a ring after the wait ended");
        assert_eq!(bell.arm(|| false), None, "a frame came: nothing to wait on");
        bell.disarm();
        ringer.ring();
        assert!(!readable(fd));
    }

    #[test]
    fn a_bell_number_that_is_not_an_eventfd_is_never_written() {
        let mut own = Segment::with_bell(4096).expect("segment");
        let (r, w) = pipe();
        // The header names the write end of a pipe, as a hostile or broken
        // owner's might: the peer must not take it as a doorbell.
        own.name_bell_for_test(w.as_raw_fd());
        let mut peer = Segment::attach(&own.name()).expect("attach");
        let watch = Watch::open(std::process::id()).expect("pidfd of this process");
        assert!(!peer.reach_bell(Some(&watch)));
        assert!(peer.bell().is_none());
        // Counted, so the owner keeps its sleeps beside a descriptor short.
        assert!(!own.all_reach_bell());
        // A ring with the owner marked asleep beside a descriptor writes
        // nothing to the pipe.
        Doorbell::of(&own).arm_beside_for_test();
        Doorbell::of(&peer).ring();
        let mut p = libc::pollfd {
            fd: r.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one pollfd on the stack; timeout 0.
        assert_eq!(unsafe { libc::poll(&mut p, 1, 0) }, 0, "the pipe was written to");
        // No pidfd at all (a kernel without them): counted too.
        let mut other = Segment::attach(&own.name()).expect("attach");
        assert!(!other.reach_bell(None));
    }

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
        let waker = keep_ringing(ringer);
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
