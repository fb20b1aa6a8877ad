//! A rank's collective slots: the end of its segment, where it posts its
//! part of a small collective for the other ranks of its node to read in
//! place (Open MPI's `coll/sm`, MPICH's shared-memory collectives). The
//! protocol that uses them, and who reads what, is in
//! `world/collectives/on_node.rs`; this file is the memory and its order.
//!
//! ```text
//!  offset 0           one cache line: `done`, the number of the first
//!                     collective whose slots this rank may still read
//!  then SLOTS slots   each one cache line of header, then SLOT_DATA bytes:
//!                     word 0   stamp: the collective's number + 1, stored
//!                              last, with Release
//!                     words 1-4  what the collective is (kind, its number
//!                              among the World's collectives, bytes, root
//!                              and op), see `on_node.rs`
//!                     words 5-6  for data larger than a slot: its address
//!                              in the owner, and whether the owner may
//!                              read every other rank's memory; for data
//!                              of at most `INLINE` bytes: the data itself,
//!                              so a reader of a small call takes one line
//!                              from the owner, not two
//!                     word 7   phase: the collective's number + 1 once the
//!                              owner's part of a single-copy allreduce is
//!                              final (Release)
//!                     data     the rank's contribution, if any (and
//!                              larger than `INLINE`)
//! ```
//!
//! Collective `k` uses slot `k % SLOTS`. Its owner writes the header words
//! and the data with relaxed atomic stores (`memory/copy.rs`), then the
//! stamp with Release; a reader loads the stamp with Acquire, and once it
//! is `k + 1` reads the rest. The owner writes slot `k % SLOTS` again (for
//! `k + SLOTS`) only once every reader's `done` has passed `k`, loaded
//! with Acquire; a reader stores `done` with Release after its last read.
//! So a slot is never written while anyone may read it, and a reader never
//! sees a stamp newer than the collective it waits for. The owner's
//! doorbell (`doorbell.rs`) is rung after a stamp, so a rank asleep in its
//! wait wakes for a collective as it does for a message.

use super::doorbell::Doorbell;
use super::segment::Segment;
use super::single_copy;
use crate::memory::copy::{copy_in, copy_out};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Slots per rank: collectives one rank may run ahead of the slowest
/// reader.
pub const SLOTS: usize = 4;

/// Bytes of data a slot holds: the largest contribution carried in place.
pub const SLOT_DATA: usize = 8 << 10;

/// Words of a slot's header after the stamp (the phase word follows).
pub const HEAD_WORDS: usize = 6;

/// Bytes of data carried in the header line itself (words 5-6, which only
/// a call larger than a slot needs for its address): an 8-byte allreduce
/// or broadcast costs a reader one cache line from each owner.
pub const INLINE: usize = 16;

/// The header words that carry data of at most `INLINE` bytes.
const INLINE_WORDS: usize = HEAD_WORDS - 2;

/// Where a slot's phase word is, after the stamp and the header words.
const PHASE: usize = 8 + HEAD_WORDS * 8;

const LINE: usize = 64;
const SLOT_BYTES: usize = LINE + SLOT_DATA;

/// Bytes the slots take at the end of a segment.
pub const AREA: usize = LINE + SLOTS * SLOT_BYTES;

/// One rank's slots, in its segment (mapped here: this rank's own, or a
/// peer's).
#[derive(Debug, Clone)]
pub(crate) struct Slots {
    seg: Arc<Segment>,
    /// Where the area starts in the segment.
    at: usize,
    /// The owner's doorbell, and the segment it lies in (kept mapped).
    bell: Doorbell,
    bell_seg: Arc<Segment>,
}

impl Slots {
    /// The area at byte `at` of `seg` (`seg.at` checks it lies inside).
    pub(crate) fn new(seg: Arc<Segment>, at: usize) -> Slots {
        let _ = seg.at(at, AREA);
        let bell = Doorbell::of(&seg);
        Slots {
            bell_seg: seg.clone(),
            seg,
            at,
            bell,
        }
    }

    /// These slots, waking their owner through `node`'s doorbell: a
    /// communicator's slots lie in a segment of their own, but their owner
    /// sleeps on the doorbell of its node segment (`NodeLoop::sleep`),
    /// whose slots `node` are. Rung on the communicator's segment, no
    /// sleeper heard a post: every wait that slept ran to the end of its
    /// 1 ms slice (a two-level barrier with `FABRIC_MSG_WAIT=block` took
    /// 1.2 ms).
    pub(crate) fn ringing(mut self, node: &Slots) -> Slots {
        self.bell = node.bell;
        self.bell_seg = node.bell_seg.clone();
        self
    }

    fn word(&self, offset: usize) -> &AtomicU64 {
        let p = self.seg.at(self.at + offset, 8);
        // SAFETY: the word lies inside the mapping (`at` checks), which
        // lives as long as `self.seg`; it is 8-byte aligned (the area
        // starts on a cache line and every offset used is a multiple of
        // 8); every process touches it only through atomics.
        unsafe { AtomicU64::from_ptr(p.as_ptr().cast::<u64>()) }
    }

    fn slot(k: u64) -> usize {
        LINE + (k % SLOTS as u64) as usize * SLOT_BYTES
    }

    /// The first collective whose slots the owner may still read.
    pub(crate) fn done(&self) -> u64 {
        self.word(0).load(Ordering::Acquire)
    }

    /// Say that the owner reads no slot of collectives below `k` any more.
    pub(crate) fn set_done(&self, k: u64) {
        self.word(0).store(k, Ordering::Release);
    }

    /// Post collective `k`: its header words and `data` (at most
    /// `SLOT_DATA` bytes), then the stamp. The caller has checked that
    /// every reader is done with `k - SLOTS`. Data of at most `INLINE`
    /// bytes goes into the last two header words, which must then be 0.
    pub(crate) fn post(&self, k: u64, mut head: [u64; HEAD_WORDS], data: &[u8]) {
        assert!(data.len() <= SLOT_DATA, "slot data of {} bytes", data.len());
        let inline = !data.is_empty() && data.len() <= INLINE;
        if inline {
            debug_assert!(head[INLINE_WORDS..] == [0, 0], "small data and an address");
            let mut b = [0u8; INLINE];
            b[..data.len()].copy_from_slice(data);
            for (w, bytes) in head[INLINE_WORDS..].iter_mut().zip(b.chunks_exact(8)) {
                *w = u64::from_ne_bytes(bytes.try_into().expect("eight bytes"));
            }
        }
        let s = Slots::slot(k);
        for (i, w) in head.iter().enumerate() {
            self.word(s + 8 + i * 8).store(*w, Ordering::Relaxed);
        }
        if !inline && !data.is_empty() {
            let p = self.seg.at(self.at + s + LINE, data.len());
            // SAFETY: inside the mapping (checked by `at`); no reader
            // reads this slot until the stamp below says so.
            unsafe { copy_in(p.as_ptr(), data) };
        }
        self.word(s).store(k + 1, Ordering::Release);
    }

    /// Say that the owner's part of collective `k` is final (the middle
    /// step of a single-copy allreduce, `world/collectives/on_node_copy.rs`).
    pub(crate) fn set_phase(&self, k: u64) {
        self.word(Slots::slot(k) + PHASE).store(k + 1, Ordering::Release);
    }

    /// Whether the owner's part of collective `k` is final.
    pub(crate) fn phase(&self, k: u64) -> bool {
        self.word(Slots::slot(k) + PHASE).load(Ordering::Acquire) == k + 1
    }

    /// The owner's process, for a read of its memory with one copy.
    pub(crate) fn owner_pid(&self) -> u32 {
        self.seg.name().pid
    }

    /// Whether this process may read the owner's memory (`single_copy`):
    /// a read of its segment's header through the kernel.
    pub(crate) fn owner_readable(&self) -> bool {
        single_copy::can_read(self.owner_pid(), self.seg.owner_base(), Segment::MAGIC)
    }

    /// Wake the owner if it sleeps in its wait.
    pub(crate) fn ring(&self) {
        self.bell.ring();
    }

    /// The stamp of the slot collective `k` uses: `k + 1` once `k` is
    /// posted; anything else from a rank that keeps the protocol is the
    /// stamp of an earlier collective.
    pub(crate) fn stamp(&self, k: u64) -> u64 {
        self.word(Slots::slot(k)).load(Ordering::Acquire)
    }

    /// The header words of collective `k` (after its stamp was seen).
    pub(crate) fn head(&self, k: u64) -> [u64; HEAD_WORDS] {
        let s = Slots::slot(k);
        std::array::from_fn(|i| self.word(s + 8 + i * 8).load(Ordering::Relaxed))
    }

    /// Copy `out.len()` (at most `SLOT_DATA`) bytes of collective `k`'s
    /// data (after its stamp was seen): the length the owner posted, which
    /// says where the data lies.
    pub(crate) fn read(&self, k: u64, out: &mut [u8]) {
        assert!(out.len() <= SLOT_DATA, "slot data of {} bytes", out.len());
        if out.len() <= INLINE {
            let head = self.head(k);
            let mut b = [0u8; INLINE];
            for (bytes, w) in b.chunks_exact_mut(8).zip(&head[INLINE_WORDS..]) {
                bytes.copy_from_slice(&w.to_ne_bytes());
            }
            out.copy_from_slice(&b[..out.len()]);
            return;
        }
        let p = self.seg.at(self.at + Slots::slot(k) + LINE, out.len());
        // SAFETY: inside the mapping (checked by `at`); `out` is this
        // process's own memory.
        unsafe { copy_out(p.as_ptr(), out) };
    }
}

#[cfg(test)]
mod tests {
    use super::{Slots, AREA, HEAD_WORDS, INLINE, SLOTS, SLOT_DATA};
    use crate::transport::node::doorbell::Doorbell;
    use crate::transport::node::segment::{Segment, HEADER};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    /// A communicator's slots (a segment of their own) ring the doorbell
    /// of their owner's node segment, where the owner sleeps, and not
    /// their own segment's, where nobody does.
    #[test]
    fn a_communicators_slots_wake_the_owner_sleeping_on_its_node_doorbell() {
        let node = Arc::new(Segment::create(HEADER + AREA).expect("node segment"));
        let comm = Arc::new(Segment::create(HEADER + AREA).expect("communicator segment"));
        let slots = Slots::new(comm.clone(), HEADER).ringing(&Slots::new(node.clone(), HEADER));
        let done = Arc::new(AtomicBool::new(false));
        let stop = done.clone();
        let ringer = std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(5));
                slots.ring();
            }
        });
        let t = Instant::now();
        Doorbell::of(&node).sleep(Duration::from_secs(10), || true);
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "not woken: {:?}",
            t.elapsed()
        );
        // The communicator's own doorbell is not rung: a sleep on it runs
        // to its end.
        let t = Instant::now();
        Doorbell::of(&comm).sleep(Duration::from_millis(100), || true);
        assert!(
            t.elapsed() >= Duration::from_millis(90),
            "woken after {:?}",
            t.elapsed()
        );
        done.store(true, Ordering::Relaxed);
        ringer.join().expect("the ringer");
    }

    #[test]
    fn a_posted_slot_is_read_back_whole_and_stamped_with_its_number() {
        let seg = Arc::new(Segment::create(HEADER + AREA).expect("segment"));
        let owner = Slots::new(seg.clone(), HEADER);
        let reader = Slots::new(seg, HEADER);
        assert!(reader.owner_readable(), "a process may read its own memory");
        for k in 0..(3 * SLOTS as u64) {
            assert_ne!(reader.stamp(k), k + 1, "collective {k} not posted yet");
            let data: Vec<u8> = (0..SLOT_DATA).map(|i| (i as u64 * 7 + k) as u8).collect();
            owner.post(k, [k, 2, 3, 4, 5, 6], &data[..SLOT_DATA - k as usize]);
            assert_eq!(reader.stamp(k), k + 1);
            assert_eq!(reader.head(k), [k, 2, 3, 4, 5, 6]);
            assert!(!reader.phase(k));
            owner.set_phase(k);
            assert!(reader.phase(k));
            let mut out = vec![0u8; SLOT_DATA - k as usize];
            reader.read(k, &mut out);
            assert_eq!(out, data[..SLOT_DATA - k as usize]);
            reader.set_done(k + 1);
            assert_eq!(owner.done(), k + 1);
        }
    }

    #[test]
    fn small_data_rides_in_the_header_line_and_leaves_the_call_words_alone() {
        let seg = Arc::new(Segment::create(HEADER + AREA).expect("segment"));
        let owner = Slots::new(seg.clone(), HEADER);
        let reader = Slots::new(seg, HEADER);
        for len in 1..=INLINE + 1 {
            let k = len as u64;
            let data: Vec<u8> = (0..len).map(|i| (i * 31 + len) as u8).collect();
            owner.post(k, [k, 2, 3, 4, 0, 0], &data);
            let head = reader.head(k);
            assert_eq!(head[..4], [k, 2, 3, 4], "{len} bytes");
            assert_eq!(
                head[4..] == [0, 0],
                len > INLINE,
                "{len} bytes: inline only up to {INLINE}"
            );
            let mut out = vec![0u8; len];
            reader.read(k, &mut out);
            assert_eq!(out, data, "{len} bytes read back");
            reader.set_done(k + 1);
        }
    }

    #[test]
    #[should_panic(expected = "slot data")]
    fn data_larger_than_a_slot_is_refused() {
        let seg = Arc::new(Segment::create(HEADER + AREA).expect("segment"));
        Slots::new(seg, HEADER).post(0, [0; HEAD_WORDS], &vec![0u8; SLOT_DATA + 1]);
    }
}
