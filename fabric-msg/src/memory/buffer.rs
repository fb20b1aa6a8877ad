//! Owned message buffers.
//!
//! A [`Buffer`] is handed to the event loop when an operation is posted and
//! comes back in that operation's completion: the NIC may read or write it
//! until then, and the safe API makes sure nobody else can. Where the
//! provider needs local memory registration (`FI_MR_LOCAL`), the buffer is
//! registered once, the first time it is used, and the registration is kept
//! for reuse and closed with the buffer.

use crate::error::Result;
use crate::ffi;
use crate::memory::domain::{close_fid, DomainInner};
use std::fmt;
use std::os::raw::c_void;
use std::sync::Arc;

/// Bytes every buffer keeps in front of its payload for fabric-msg's message
/// header, used on framed endpoints (see `event_loop`).
pub(crate) const HEADROOM: usize = 16;

/// Payloads of at least this many bytes start on a page boundary (the
/// allocation is a page larger, at most a quarter more).
const ALIGN_FROM: usize = 16 << 10;
const PAGE: usize = 4096;

/// A message buffer owned by the application or, while an operation is in
/// flight, by the event loop.
pub struct Buffer {
    /// Header and payload; a page more from `ALIGN_FROM` bytes of
    /// payload, with the header just below the first page boundary.
    data: Box<[u8]>,
    len: usize,
    mr: Option<LocalMr>,
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
    /// multiple of 64 made the copy about 5% slower here.
    pub fn new(capacity: usize) -> Buffer {
        let page = if capacity < ALIGN_FROM { 0 } else { PAGE };
        Buffer {
            data: vec![0u8; capacity + HEADROOM + page].into_boxed_slice(),
            len: capacity,
            mr: None,
        }
    }

    /// Whether `data` has the page more (the lengths cannot overlap:
    /// smaller buffers have less than `ALIGN_FROM + HEADROOM` bytes).
    fn aligned(&self) -> bool {
        self.data.len() >= ALIGN_FROM + HEADROOM + PAGE
    }

    /// Where the header starts in `data` (the heap block never moves).
    fn base(&self) -> usize {
        if self.aligned() {
            let payload = self.data.as_ptr() as usize + HEADROOM;
            (PAGE - payload % PAGE) % PAGE
        } else {
            0
        }
    }

    /// Header and payload.
    fn span(&self) -> &[u8] {
        let base = self.base();
        &self.data[base..base + HEADROOM + self.capacity()]
    }

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
    pub fn capacity(&self) -> usize {
        self.data.len() - HEADROOM - if self.aligned() { PAGE } else { 0 }
    }

    /// Bytes in use: what is sent, or what a receive delivered.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether `len()` is 0.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Set the length (at most the capacity).
    ///
    /// # Panics
    /// If `len` exceeds the capacity.
    pub fn set_len(&mut self, len: usize) {
        assert!(
            len <= self.capacity(),
            "Buffer::set_len({len}) beyond capacity {}",
            self.capacity()
        );
        self.len = len;
    }

    /// The bytes in use.
    pub fn as_slice(&self) -> &[u8] {
        &self.span()[HEADROOM..HEADROOM + self.len]
    }

    /// The bytes in use, writable.
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
    pub(crate) fn header_mut(&mut self) -> &mut [u8; HEADROOM] {
        (&mut self.span_mut()[..HEADROOM])
            .try_into()
            .expect("HEADROOM bytes")
    }

    /// Set the length after a receive; `len` is at most the capacity.
    pub(crate) fn set_received(&mut self, len: usize) {
        self.len = len.min(self.capacity());
    }

    /// Where an operation starts: at the header on framed endpoints, at the
    /// payload otherwise.
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
                self.mr = Some(mr);
                Ok(desc)
            }
        }
    }
}

/// A registration of memory for local access.
pub(crate) struct LocalMr {
    raw: *mut ffi::fid_mr,
    desc: *mut c_void,
    domain: Arc<DomainInner>,
}

// SAFETY: the registration is only used to read its descriptor and to close
// it; libfabric allows both from any thread for a registration nobody else
// touches, and the Buffer owning it is used by one thread at a time.
unsafe impl Send for LocalMr {}
// SAFETY: no &self method mutates or calls into libfabric.
unsafe impl Sync for LocalMr {}

impl LocalMr {
    /// Register `len` bytes at `ptr`.
    pub(crate) fn register(domain: &Arc<DomainInner>, ptr: *const u8, len: usize) -> Result<LocalMr> {
        let access = u64::from(ffi::FI_SEND | ffi::FI_RECV);
        // SAFETY: callers register memory that outlives the registration: a
        // Buffer's own allocation (the registration is dropped first), or
        // borrowed memory whose owner promised it lives until the operation's
        // completion, when the registration is dropped.
        let raw = unsafe { crate::memory::mr::mr_reg(domain, ptr, len, access)? };
        // SAFETY: raw is a live registration.
        let desc = unsafe { ffi::fi_mr_desc(raw) };
        Ok(LocalMr {
            raw,
            desc,
            domain: domain.clone(),
        })
    }

    pub(crate) fn desc(&self) -> *mut c_void {
        self.desc
    }
}

impl Drop for LocalMr {
    fn drop(&mut self) {
        // SAFETY: raw came from fi_mr_reg and is closed once, before the
        // domain (held by the Arc in this value).
        unsafe { close_fid("memory registration", &mut (*self.raw).fid) }
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
    fn large_payloads_start_on_a_page() {
        for cap in [ALIGN_FROM, ALIGN_FROM + 1, 65536, 1 << 20] {
            let mut b = Buffer::new(cap);
            assert_eq!(b.capacity(), cap);
            assert_eq!(b.as_slice().as_ptr() as usize % PAGE, 0, "capacity {cap}");
            assert_eq!(b.ptr(false) as usize % PAGE, 0);
            assert_eq!(b.ptr(true) as usize + HEADROOM, b.ptr(false) as usize);
            b.as_mut_slice()[cap - 1] = 7;
            assert_eq!(b.payload_at(cap - 1, 1), Some(&[7u8][..]));
            assert_eq!(b.payload_at(cap, 1), None);
            b.header_mut()[0] = 1;
            assert_eq!(b.as_slice()[0], 0);
        }
    }

    #[test]
    #[should_panic(expected = "beyond capacity")]
    fn set_len_beyond_capacity_panics() {
        Buffer::new(4).set_len(5);
    }
}
