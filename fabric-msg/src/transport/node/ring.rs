//! One single-producer single-consumer ring of cache-line cells: how one
//! rank's messages reach another on the same node.
//!
//! The ring lies in the receiver's segment (its reads stay in memory it
//! owns; the sender's writes cross). Layout from the ring's offset:
//!
//! ```text
//! line 0    head: cells the consumer has released (written by it alone)
//! line 1    word 0: whether the consumer may read the producer's memory
//!           (set by the consumer when it connects; see `single_copy`)
//! cells     N cells of 64 bytes
//! ```
//!
//! A *frame* takes `k` consecutive cells (mod N). Its first cell starts
//! with a 32-byte header, its payload follows and runs on through the next
//! cells as one byte stream (wrapping at the ring's end):
//!
//! ```text
//! 0..8    stamp     absolute index of the frame's first cell + 1
//! 8..16   tag
//! 16..20  len       payload bytes in this frame
//! 20..24  flags     FIRST (the message starts here), LAST (it ends here)
//! 24..32  total     the message's length (in every frame; checked)
//! 32..    payload
//! ```
//!
//! **Protocol.** The producer checks room against its cached copy of
//! `head` (reloading it with `Acquire` only when the cache says full),
//! writes the header's other fields and the payload with plain stores,
//! then stores the stamp with `Release`. The consumer polls only the stamp
//! of the cell at its own `head` with `Acquire`: when it equals `head + 1`
//! the frame's header and payload are visible (they were written before
//! the `Release` that the `Acquire` read from). So a small message costs
//! one cache line moving from the sender's core to the receiver's, and no
//! lock or system call on either side. Once it has copied the payload out,
//! the consumer zeroes the first word of the frame's other cells (which
//! held payload bytes that could otherwise look like a later stamp), then
//! publishes the new `head` with `Release`; the producer's `Acquire` of
//! `head` orders those zeroes, and the consumer's reads, before it writes
//! the cells again.
//!
//! The stamp is absolute, so a stamp left from an earlier lap (`s + 1 -
//! jN`) never equals the one awaited. Every header field is checked before
//! it is used (a frame longer than the ring's limit or than its message, or
//! flags out of order, is an error the caller reports as a peer's fault);
//! the payload bytes are the sender's to choose.

use super::doorbell::Doorbell;
use super::segment::Segment;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Bytes in a cell: one cache line.
pub const CELL: usize = 64;
/// Bytes of a frame's header.
pub const FRAME_HEADER: usize = 32;

/// Cells after the next frame's first that a producer fetches into its
/// cache once it has published a frame: a next frame of up to four cells
/// (224 payload bytes) then finds every line but its first (which the
/// consumer polls) at hand (docs/onnode.md, "A frame's second cache
/// line"; 8 measured no better).
const PREFETCH_CELLS: u64 = 3;

/// The frame starts a message.
pub const FIRST: u32 = 1;
/// The frame ends a message.
pub const LAST: u32 = 2;
/// The frame asks the receiver to read the message from the sender's
/// memory (`single_copy`); with `FIRST | LAST`.
pub const RNDV: u32 = 4;
/// The frame answers such a request (no message).
pub const ACK: u32 = 8;

/// Bytes a ring of `cells` cells takes in a segment.
pub const fn ring_bytes(cells: usize) -> usize {
    2 * CELL + cells * CELL
}

/// Cells a frame of `len` payload bytes takes.
pub const fn cells_for(len: usize) -> usize {
    (FRAME_HEADER + len).div_ceil(CELL)
}

/// A frame's header as read by the consumer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame {
    /// The message's tag.
    pub tag: u64,
    /// Payload bytes in this frame.
    pub len: usize,
    /// [`FIRST`] and [`LAST`].
    pub flags: u32,
    /// The whole message's length.
    pub total: u64,
    cells: usize,
}

/// What a frame header that cannot be right says.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a corrupt frame in a node ring at cell {at}: {what}")]
pub struct Corrupt {
    /// The cell (absolute index).
    pub at: u64,
    /// What is wrong.
    pub what: String,
}

/// A frame's header after its stamp, as it lies in the cell.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct Header {
    tag: u64,
    len: u32,
    flags: u32,
    total: u64,
}

/// The part of a ring both sides see.
#[derive(Debug)]
struct Shared {
    /// Held, not read: it keeps the mapping the pointers point into.
    _seg: Arc<Segment>,
    head: NonNull<AtomicU64>,
    cells: NonNull<u8>,
    n: u64,
}

// SAFETY: the pointers point into `seg`, which the `Arc` keeps mapped; the
// words both processes touch are only used as atomics.
unsafe impl Send for Shared {}

impl Shared {
    fn new(seg: Arc<Segment>, offset: usize, cells: usize) -> Shared {
        assert!(
            cells >= 2 && cells.is_power_of_two() && offset % CELL == 0,
            "ring layout: {cells} cells (a power of two) at {offset}"
        );
        let head = seg.at(offset, ring_bytes(cells)).cast::<AtomicU64>();
        let cells_at = seg.at(offset + 2 * CELL, cells * CELL);
        Shared {
            _seg: seg,
            head,
            cells: cells_at,
            n: cells as u64,
        }
    }

    fn head(&self) -> &AtomicU64 {
        // SAFETY: line 0 of the ring, inside the segment (checked in `new`),
        // aligned (segments are page-aligned, offsets cell-aligned), only
        // accessed atomically.
        unsafe { self.head.as_ref() }
    }

    /// Line 1's first word: whether the consumer may read the producer's
    /// memory.
    fn reader(&self) -> &AtomicU64 {
        // SAFETY: line 1 of the ring, inside the segment and aligned as
        // `head` is; only accessed atomically.
        unsafe { &*self.head.as_ptr().cast::<u8>().add(CELL).cast::<AtomicU64>() }
    }

    /// The first word of cell `abs` (absolute index).
    fn stamp(&self, abs: u64) -> &AtomicU64 {
        let i = (abs & (self.n - 1)) as usize;
        // SAFETY: cell i < n lies inside the ring; its first word is
        // aligned; it is accessed atomically by both sides when it is a
        // frame's first cell, and otherwise only in the order the protocol
        // sets (module docs).
        unsafe { &*self.cells.as_ptr().add(i * CELL).cast::<AtomicU64>() }
    }

    /// Bring cell `abs`'s line into this core's cache ahead of its use: a
    /// hint (`prefetcht0`), which changes no memory and cannot fault. A
    /// no-op off x86-64.
    #[inline]
    fn prefetch(&self, abs: u64) {
        #[cfg(target_arch = "x86_64")]
        {
            let cell = self.stamp(abs) as *const AtomicU64;
            // SAFETY: a prefetch is only a hint to the cache: it reads
            // nothing into the program, writes nothing and never faults
            // (the address is inside the ring anyway).
            unsafe { std::arch::x86_64::_mm_prefetch(cell.cast::<i8>(), std::arch::x86_64::_MM_HINT_T0) };
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = abs;
    }

    /// Byte position in the cell area of byte `off` of the frame at `abs`.
    fn byte(&self, abs: u64, off: usize) -> usize {
        (((abs & (self.n - 1)) as usize) * CELL + off) & (self.area() - 1)
    }

    /// The header fields (after the stamp) of the frame at `abs`: they lie
    /// in its first cell, never across the ring's end.
    fn header(&self, abs: u64) -> *mut Header {
        let i = (abs & (self.n - 1)) as usize;
        // SAFETY: cell i < n is inside the ring; bytes 8..32 of it are the
        // header, aligned to 8 (cells are 64-aligned).
        unsafe { self.cells.as_ptr().add(i * CELL + 8).cast::<Header>() }
    }

    fn area(&self) -> usize {
        self.n as usize * CELL
    }

    /// Copy `src` into the cell area from byte position `at`, wrapping.
    ///
    /// # Safety
    /// The bytes written must be the producer's to write now (cells it
    /// owns under the protocol).
    unsafe fn write(&self, at: usize, src: &[u8]) {
        let first = src.len().min(self.area() - at);
        // SAFETY: `at + first <= area` and the wrapped rest starts at 0 and
        // is shorter than the area (a frame is never longer than the ring);
        // the caller owns these bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), self.cells.as_ptr().add(at), first);
            // Most frames do not wrap: no second call then.
            if first < src.len() {
                std::ptr::copy_nonoverlapping(
                    src.as_ptr().add(first),
                    self.cells.as_ptr(),
                    src.len() - first,
                );
            }
        }
    }

    /// Copy from the cell area at byte position `at` into `dst`, wrapping.
    ///
    /// # Safety
    /// The bytes must be published to the consumer and not yet released.
    unsafe fn read(&self, at: usize, dst: &mut [u8]) {
        let first = dst.len().min(self.area() - at);
        // SAFETY: as in `write`, for reading.
        unsafe {
            std::ptr::copy_nonoverlapping(self.cells.as_ptr().add(at), dst.as_mut_ptr(), first);
            if first < dst.len() {
                std::ptr::copy_nonoverlapping(
                    self.cells.as_ptr(),
                    dst.as_mut_ptr().add(first),
                    dst.len() - first,
                );
            }
        }
    }
}

/// The sending side of a ring (in the sender's process, on the receiver's
/// segment).
#[derive(Debug)]
pub struct Producer {
    ring: Shared,
    /// The receiver's doorbell, rung after each frame (`doorbell.rs`).
    bell: Doorbell,
    tail: u64,
    head_seen: u64,
    max_frame: usize,
}

impl Producer {
    /// The producer of the ring of `cells` cells at `offset` in `seg`,
    /// with frames of at most `max_frame` payload bytes (at most what fits
    /// in half the ring).
    pub fn new(seg: Arc<Segment>, offset: usize, cells: usize, max_frame: usize) -> Producer {
        let bell = Doorbell::of(&seg);
        let ring = Shared::new(seg, offset, cells);
        let max_frame = max_frame.min(cells / 2 * CELL - FRAME_HEADER);
        // Start where the consumer is: 0 for a new ring.
        let head = ring.head().load(Ordering::Acquire);
        Producer {
            ring,
            bell,
            tail: head,
            head_seen: head,
            max_frame,
        }
    }

    /// The largest payload one frame carries.
    pub fn max_frame(&self) -> usize {
        self.max_frame
    }

    /// Whether the receiver said it may read this process's memory.
    #[inline]
    pub fn reader_can_copy(&self) -> bool {
        self.ring.reader().load(Ordering::Relaxed) == 1
    }

    /// Payload bytes one frame could carry now (0 when the ring is full),
    /// at most [`Producer::max_frame`].
    pub fn room(&mut self) -> usize {
        let free = |p: &Producer| (p.ring.n - (p.tail - p.head_seen)) as usize;
        if free(self) < cells_for(self.max_frame) {
            self.head_seen = self.ring.head().load(Ordering::Acquire);
        }
        (free(self) * CELL)
            .saturating_sub(FRAME_HEADER)
            .min(self.max_frame)
    }

    /// Write one frame of `payload` (at most [`Producer::room`] bytes);
    /// false, with nothing written, if it does not fit now.
    pub fn try_write(&mut self, tag: u64, flags: u32, total: u64, payload: &[u8]) -> bool {
        let k = cells_for(payload.len()) as u64;
        if payload.len() > self.max_frame {
            return false;
        }
        if self.ring.n - (self.tail - self.head_seen) < k {
            self.head_seen = self.ring.head().load(Ordering::Acquire);
            if self.ring.n - (self.tail - self.head_seen) < k {
                return false;
            }
        }
        let at = self.tail;
        let header = Header {
            tag,
            len: payload.len() as u32,
            flags,
            total,
        };
        // SAFETY: cells at..at+k are free (room checked against the
        // consumer's head); the consumer reads none of them before the
        // stamp below.
        unsafe {
            self.ring.header(at).write(header);
            self.ring.write(self.ring.byte(at, FRAME_HEADER), payload);
        }
        self.ring.stamp(at).store(at + 1, Ordering::Release);
        self.bell.ring();
        self.tail = at + k;
        // The cells after the next frame's first (which the consumer polls,
        // so fetching it here would only take it away): the consumer's
        // `consume` may have written them last, a lap ago, and then their
        // lines wait in its cache. Fetched now, while nothing waits, the
        // next frame's stores need not wait for them before its stamp can
        // show (docs/onnode.md, "A frame's second cache line").
        for c in 1..=PREFETCH_CELLS {
            if self.tail + c < self.head_seen + self.ring.n {
                self.ring.prefetch(self.tail + c);
            }
        }
        true
    }
}

/// The receiving side of a ring (in the receiver's process, on its own
/// segment).
#[derive(Debug)]
pub struct Consumer {
    ring: Shared,
    head: u64,
    max_frame: usize,
}

impl Consumer {
    /// The consumer of the ring of `cells` cells at `offset` in `seg`.
    pub fn new(seg: Arc<Segment>, offset: usize, cells: usize, max_frame: usize) -> Consumer {
        let ring = Shared::new(seg, offset, cells);
        let max_frame = max_frame.min(cells / 2 * CELL - FRAME_HEADER);
        let head = ring.head().load(Ordering::Relaxed);
        Consumer {
            ring,
            head,
            max_frame,
        }
    }

    /// Whether a frame has arrived (not checked: [`Consumer::peek`] does).
    #[inline]
    pub fn has_frame(&self) -> bool {
        self.ring.stamp(self.head).load(Ordering::Acquire) == self.head + 1
    }

    /// The next frame, if one has arrived; an error if its header cannot
    /// be right (the ring is then unusable).
    #[inline]
    pub fn peek(&self) -> Result<Option<Frame>, Corrupt> {
        if self.ring.stamp(self.head).load(Ordering::Acquire) != self.head + 1 {
            return Ok(None);
        }
        // SAFETY: the stamp's Acquire made the frame's header visible; it
        // is ours until we release it.
        let h = unsafe { self.ring.header(self.head).read() };
        let f = Frame {
            tag: h.tag,
            len: h.len as usize,
            flags: h.flags,
            total: h.total,
            cells: 0,
        };
        // The usual frame, a whole message in one: one test, then the
        // full check below for every other.
        if f.flags == FIRST | LAST && f.len <= self.max_frame && f.len as u64 <= f.total {
            return Ok(Some(Frame {
                cells: cells_for(f.len),
                ..f
            }));
        }
        self.checked(f)
    }

    /// `f` (a frame just read) if its header can be right.
    fn checked(&self, f: Frame) -> Result<Option<Frame>, Corrupt> {
        let bad = |what: String| Err(Corrupt { at: self.head, what });
        if f.len > self.max_frame {
            return bad(format!(
                "{} payload bytes, above the ring's limit of {}",
                f.len, self.max_frame
            ));
        }
        let control = f.flags & (RNDV | ACK);
        if f.flags & !(FIRST | LAST | RNDV | ACK) != 0
            || (control == RNDV && (f.flags != FIRST | LAST | RNDV || f.len != 16))
            || (control == ACK && (f.flags != ACK || f.len != 16))
            || control == RNDV | ACK
        {
            return bad(format!("flags {:#x} with {} payload bytes", f.flags, f.len));
        }
        if control == 0 && f.len as u64 > f.total {
            return bad(format!(
                "{} bytes in a frame of a {}-byte message",
                f.len, f.total
            ));
        }
        Ok(Some(Frame {
            cells: cells_for(f.len),
            ..f
        }))
    }

    /// Copy the payload bytes `at..at + dst.len()` of `frame` (the one
    /// [`Consumer::peek`] returned) into `dst`.
    #[inline]
    pub fn copy_out(&self, frame: &Frame, at: usize, dst: &mut [u8]) {
        assert!(at + dst.len() <= frame.len, "copy beyond the frame");
        // SAFETY: the frame is published and not yet released; the range
        // lies within its payload (asserted).
        unsafe { self.ring.read(self.ring.byte(self.head, FRAME_HEADER + at), dst) };
    }

    /// Release `frame` (the one [`Consumer::peek`] returned) to the
    /// producer.
    #[inline]
    pub fn consume(&mut self, frame: &Frame) {
        for c in 1..frame.cells as u64 {
            self.ring.stamp(self.head + c).store(0, Ordering::Relaxed);
        }
        self.head += frame.cells as u64;
        self.ring.head().store(self.head, Ordering::Release);
    }

    /// The largest payload one frame may carry.
    pub fn max_frame(&self) -> usize {
        self.max_frame
    }

    /// Tell the producer whether this process may read its memory.
    pub fn set_can_copy(&self, yes: bool) {
        self.ring.reader().store(u64::from(yes), Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(cells: usize, max: usize) -> (Producer, Consumer) {
        let own = Arc::new(Segment::create(64 + ring_bytes(cells)).unwrap());
        let peer = Arc::new(Segment::attach(&own.name()).unwrap());
        (
            Producer::new(peer, 64, cells, max),
            Consumer::new(own, 64, cells, max),
        )
    }

    #[test]
    fn frames_arrive_whole_and_in_order_across_threads() {
        let (mut p, mut c) = pair(64, 1000);
        const N: u64 = 20_000;
        let t = std::thread::spawn(move || {
            for i in 0..N {
                let len = (i * 37 % 900) as usize;
                let payload: Vec<u8> = (0..len).map(|b| (b as u64 + i) as u8).collect();
                while !p.try_write(i, FIRST | LAST, len as u64, &payload) {
                    std::hint::spin_loop();
                }
            }
        });
        let mut buf = vec![0u8; 1000];
        for i in 0..N {
            let f = loop {
                if let Some(f) = c.peek().unwrap() {
                    break f;
                }
                std::hint::spin_loop();
            };
            assert_eq!((f.tag, f.len as u64, f.flags), (i, i * 37 % 900, FIRST | LAST));
            c.copy_out(&f, 0, &mut buf[..f.len]);
            for (b, v) in buf[..f.len].iter().enumerate() {
                assert_eq!(*v, (b as u64 + i) as u8, "message {i} byte {b}");
            }
            c.consume(&f);
        }
        t.join().unwrap();
        assert_eq!(c.peek().unwrap(), None);
    }

    #[test]
    fn payload_that_looks_like_a_stamp_is_not_taken_for_one() {
        // A producer that fills every continuation cell's first word with
        // the stamps the consumer will await on later laps.
        let (mut p, mut c) = pair(8, 1000);
        let mut buf = [0u8; 200];
        for lap in 0..50u64 {
            let payload: Vec<u8> = (0..200u64 / 8)
                .flat_map(|w| (lap * 8 + w).to_ne_bytes())
                .collect();
            assert!(p.try_write(lap, FIRST | LAST, 200, &payload[..200]));
            let f = c.peek().unwrap().unwrap();
            c.copy_out(&f, 0, &mut buf);
            assert_eq!(&buf[..], &payload[..200]);
            c.consume(&f);
            assert_eq!(c.peek().unwrap(), None, "lap {lap}");
        }
    }

    #[test]
    fn a_full_ring_refuses_and_then_takes_again() {
        let (mut p, mut c) = pair(8, 1000);
        assert_eq!(p.room(), 4 * CELL - FRAME_HEADER);
        let mut written = 0;
        while p.try_write(written, FIRST | LAST, 10, &[7; 10]) {
            written += 1;
        }
        assert_eq!(written, 8);
        assert_eq!(p.room(), 0);
        let f = c.peek().unwrap().unwrap();
        c.consume(&f);
        assert!(p.try_write(99, FIRST | LAST, 10, &[1; 10]));
    }

    #[test]
    fn a_forged_header_is_an_error_not_a_read() {
        let (mut p, c) = pair(8, 100);
        // A frame longer than the limit the consumer allows.
        p.max_frame = 200;
        assert!(p.try_write(1, FIRST | LAST, 150, &[0; 150]));
        let e = c.peek().unwrap_err();
        assert!(e.to_string().contains("above the ring's limit"), "{e}");
        let (mut p, c) = pair(8, 100);
        assert!(p.try_write(1, 0x10, 5, &[0; 5]));
        assert!(c.peek().is_err());
        let (mut p, c) = pair(8, 100);
        assert!(p.try_write(1, FIRST, 5, &[0; 50]));
        assert!(c.peek().is_err());
    }
}
