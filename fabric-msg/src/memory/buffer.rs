//! Owned message buffers.
//!
//! A [`Buffer`] is handed to the event loop when an operation is posted and
//! comes back in that operation's completion: the NIC may read or write it
//! until then, and the safe API makes sure nobody else can. Where the
//! provider needs local memory registration (`FI_MR_LOCAL`), the buffer is
//! registered once, the first time it is used, and the registration is kept
//! for reuse and closed with the buffer.

use crate::discovery::info::Threading;
use crate::error::Result;
use crate::ffi;
use crate::libfabric::Mr;
use crate::memory::domain::DomainInner;
use std::fmt;
use std::os::raw::c_void;
use std::sync::Arc;

/// Bytes every buffer keeps in front of its payload for fabric-msg's message
/// header, used on framed endpoints (see `event_loop`).
pub(crate) const HEADROOM: usize = 16;

/// Payloads of at least this many bytes start on a page boundary (the
/// allocation is a page larger, at most a quarter more); smaller ones on a
/// cache line (a line larger).
const ALIGN_FROM: usize = 16 << 10;
const PAGE: usize = 4096;
const LINE: usize = 64;

/// A message buffer owned by the application or, while an operation is in
/// flight, by the event loop.
pub struct Buffer {
    /// Header and payload, and room to start the payload on a boundary
    /// (see [`Buffer::new`]), with the header just below it.
    data: Box<[u8]>,
    len: usize,
    /// Boxed: registering is rare (once per buffer, where `FI_MR_LOCAL`
    /// asks) and a buffer moves on every post and completion, so one word
    /// here, not four, is what the hot path carries.
    mr: Option<Box<LocalMr>>,
}

/// The bytes a buffer of `capacity` allocates beyond header and payload.
fn pad(capacity: usize) -> usize {
    if capacity < ALIGN_FROM {
        LINE
    } else {
        PAGE
    }
}

impl fmt::Debug for Buffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Buffer")
            .field("len", &self.len)
            .field("capacity", &self.capacity())
            .field("registered", &self.mr.is_some())
            .finish()
    }
}

impl Buffer {
    /// A zeroed buffer that can hold `capacity` bytes; its length is `capacity`.
    ///
    /// From 16 KiB the payload starts on a page boundary, as fabtests'
    /// buffers do. Providers that copy with the kernel (shm's
    /// `process_vm_readv`) copy fastest when source and destination are
    /// equally aligned; a heap allocation's payload could start at any
    /// 16-byte offset, and two peers' offsets differing by other than a
    /// multiple of 64 made the copy about 5% slower here. Smaller payloads
    /// start on a cache line: shm copies them with `memcpy`, and 4 KiB
    /// ping-pong was about 0.03 µs faster one way so (0.49–0.51 µs against
    /// 0.52–0.55, pinned, alternating).
    pub fn new(capacity: usize) -> Buffer {
        Buffer {
            data: vec![0u8; capacity + HEADROOM + pad(capacity)].into_boxed_slice(),
            len: capacity,
            mr: None,
        }
    }

    /// The boundary the payload starts on: a page from `ALIGN_FROM` bytes,
    /// else a cache line. (`data` is `capacity + HEADROOM + align`, and the
    /// two ranges of lengths cannot overlap.)
    #[inline]
    fn align(&self) -> usize {
        if self.data.len() >= ALIGN_FROM + HEADROOM + PAGE {
            PAGE
        } else {
            LINE
        }
    }

    /// Where the header starts in `data` (the heap block never moves).
    #[inline]
    fn base(&self) -> usize {
        // Both boundaries are powers of two: a mask, not a division.
        let payload = self.data.as_ptr() as usize + HEADROOM;
        payload.wrapping_neg() & (self.align() - 1)
    }

    /// Header and payload.
    #[inline]
    fn span(&self) -> &[u8] {
        let base = self.base();
        &self.data[base..base + HEADROOM + self.capacity()]
    }

    #[inline]
    fn span_mut(&mut self) -> &mut [u8] {
        let (base, end) = (self.base(), self.base() + HEADROOM + self.capacity());
        &mut self.data[base..end]
    }

    /// A buffer holding a copy of `bytes`.
    pub fn from_slice(bytes: &[u8]) -> Buffer {
        let mut b = Buffer::new(bytes.len());
        b.as_mut_slice().copy_from_slice(bytes);
        b
    }

    /// Most bytes the buffer can hold.
    #[inline]
    pub fn capacity(&self) -> usize {
        self.data.len() - HEADROOM - self.align()
    }

    /// Bytes in use: what is sent, or what a receive delivered.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether `len()` is 0.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Set the length (at most the capacity).
    ///
    /// # Panics
    /// If `len` exceeds the capacity.
    #[inline]
    pub fn set_len(&mut self, len: usize) {
        assert!(
            len <= self.capacity(),
            "Buffer::set_len({len}) beyond capacity {}",
            self.capacity()
        );
        self.len = len;
    }

    /// The bytes in use.
    #[inline]
    pub fn as_slice(&self) -> &[u8] {
        &self.span()[HEADROOM..HEADROOM + self.len]
    }

    /// The bytes in use, writable.
    #[inline]
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        let len = self.len;
        &mut self.span_mut()[HEADROOM..HEADROOM + len]
    }

    /// `len` payload bytes from `offset`, if within the capacity.
    pub(crate) fn payload_at(&self, offset: usize, len: usize) -> Option<&[u8]> {
        let end = offset.checked_add(len).filter(|&e| e <= self.capacity())?;
        self.span().get(HEADROOM + offset..HEADROOM + end)
    }

    /// The header room in front of the payload.
    #[inline]
    pub(crate) fn header_mut(&mut self) -> &mut [u8; HEADROOM] {
        (&mut self.span_mut()[..HEADROOM])
            .try_into()
            .expect("HEADROOM bytes")
    }

    /// Set the length after a receive; `len` is at most the capacity.
    #[inline]
    pub(crate) fn set_received(&mut self, len: usize) {
        self.len = len.min(self.capacity());
    }

    /// Where an operation starts: at the header on framed endpoints, at the
    /// payload otherwise.
    #[inline]
    pub(crate) fn ptr(&mut self, framed: bool) -> *mut c_void {
        let offset = if framed { 0 } else { HEADROOM };
        self.span_mut()[offset..].as_mut_ptr().cast()
    }

    /// The local descriptor for `domain`, registering on first use (or again
    /// if the buffer moved to another domain).
    pub(crate) fn desc(&mut self, domain: &Arc<DomainInner>) -> Result<*mut c_void> {
        match &self.mr {
            Some(mr) if Arc::ptr_eq(&mr.domain, domain) => Ok(mr.desc),
            _ => {
                self.mr = None;
                let span = self.span();
                let mr = LocalMr::register(domain, span.as_ptr(), span.len())?;
                let desc = mr.desc;
                self.mr = Some(Box::new(mr));
                Ok(desc)
            }
        }
    }
}

/// A registration of memory for local access.
pub(crate) struct LocalMr {
    _mr: Mr,
    desc: *mut c_void,
    domain: Arc<DomainInner>,
}

// SAFETY: the registration (an `Mr`, Send and Sync) is only used to read its
// descriptor and to close it; the descriptor is an opaque value passed
// back to libfabric, never dereferenced by Rust.
unsafe impl Send for LocalMr {}
// SAFETY: no &self method mutates or calls into libfabric.
unsafe impl Sync for LocalMr {}

impl LocalMr {
    /// Register `len` bytes at `ptr`.
    pub(crate) fn register(domain: &Arc<DomainInner>, ptr: *const u8, len: usize) -> Result<LocalMr> {
        // A Buffer is Send: its registration may be closed on whichever
        // thread drops it, beside the loop's own calls on the domain, which
        // only these levels allow (as for a MemoryRegion, mr.rs).
        let p = &domain.profile;
        if !matches!(p.threading, Threading::Safe | Threading::Fid) {
            return Err(crate::error::Error::Unsupported {
                what: format!(
                    "registering a buffer at threading level {:?} (a Buffer may be dropped on any thread, and \
                     its registration with it; fabric-msg needs FI_THREAD_SAFE or FI_THREAD_FID)",
                    p.threading
                ),
                provider: p.provider.clone(),
            });
        }
        let access = u64::from(ffi::FI_SEND | ffi::FI_RECV);
        // SAFETY: callers register memory that outlives the registration: a
        // Buffer's own allocation (the registration is dropped first), or
        // borrowed memory whose owner promised it lives until the operation's
        // completion, when the registration is dropped.
        let mr = unsafe { crate::memory::mr::mr_reg(domain, ptr, len, access)? };
        let desc = mr.desc();
        Ok(LocalMr {
            _mr: mr,
            desc,
            domain: domain.clone(),
        })
    }

    pub(crate) fn desc(&self) -> *mut c_void {
        self.desc
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        // The registration must go before the memory it covers.
        self.mr = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn length_capacity_and_contents() {
        let mut b = Buffer::new(8);
        assert_eq!((b.len(), b.capacity()), (8, 8));
        b.as_mut_slice().copy_from_slice(b"abcdefgh");
        b.set_len(3);
        assert_eq!(b.as_slice(), b"abc");
        assert_eq!(Buffer::from_slice(b"xy").as_slice(), b"xy");
        assert!(Buffer::new(0).is_empty());
    }

    #[test]
    fn payloads_start_on_a_line_or_a_page() {
        for cap in [
            0,
            1,
            8,
            63,
            64,
            4096,
            ALIGN_FROM - 1,
            ALIGN_FROM,
            ALIGN_FROM + 1,
            65536,
            1 << 20,
        ] {
            let align = if cap < ALIGN_FROM { LINE } else { PAGE };
            let mut b = Buffer::new(cap);
            assert_eq!(b.capacity(), cap);
            assert_eq!(b.as_slice().as_ptr() as usize % align, 0, "capacity {cap}");
            assert_eq!(b.ptr(false) as usize % align, 0);
            if cap == 0 {
                continue;
            }
            assert_eq!(b.ptr(true) as usize + HEADROOM, b.ptr(false) as usize);
            b.as_mut_slice()[cap - 1] = 7;
            assert_eq!(b.payload_at(cap - 1, 1), Some(&[7u8][..]));
            assert_eq!(b.payload_at(cap, 1), None);
            let first = b.as_slice()[0];
            b.header_mut().fill(1);
            assert_eq!(b.as_slice()[0], first, "the header lies below the payload");
        }
    }

    #[test]
    #[should_panic(expected = "beyond capacity")]
    fn set_len_beyond_capacity_panics() {
        Buffer::new(4).set_len(5);
    }
}
