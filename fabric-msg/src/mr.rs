//! Memory registration for one-sided operations, with `mr_mode` hidden.
//!
//! A [`MemoryRegion`] is memory the NIC may read or write on a peer's
//! behalf. It is registered once ([`EventLoop::register`]) and described to
//! peers by a [`RemoteMemory`]: the address or offset they must use, the key,
//! the length and the access granted. Whatever the provider's `mr_mode` asks
//! for is done here:
//!
//! - `FI_MR_LOCAL`: the local descriptor goes with every operation.
//! - `FI_MR_VIRT_ADDR`: peers address the region by virtual address;
//!   otherwise by offset from 0. [`RemoteMemory`] carries the right base, so
//!   peers only ever give offsets.
//! - `FI_MR_PROV_KEY`: the provider picks keys; otherwise fabric-msg does,
//!   from a counter that never hands out a key twice in a domain, so a
//!   revoked key can never open a newer region.
//! - `FI_MR_ENDPOINT`: the region is bound to an endpoint and enabled.
//! - `FI_MR_ALLOCATED`: owned regions are allocated (and zeroed) before
//!   registration.
//! - `FI_MR_RAW`: keys wider than 8 bytes travel whole and are mapped by the
//!   peer on [`EventLoop::import`].
//!
//! Remote access is least privilege: read, write, or both, as asked.
//!
//! # Ownership
//!
//! A region owns its memory. Each operation in flight holds the region (an
//! `Arc` inside), so dropping a [`MemoryRegion`] with operations in flight
//! defers deregistration and freeing until their completions; nothing is
//! freed under the NIC. [`MemoryRegion::close`] refuses instead of waiting.
//! Once deregistered, the key is revoked: a peer's next access fails with an
//! error completion at the peer.
//!
//! The remote bounds a [`RemoteMemory`] carries are checked before every
//! post, so a mistaken offset is a local error. The NIC itself enforces the
//! whole registration: to give a peer less, register less.
//!
//! [`EventLoop::register`]: crate::EventLoop::register
//! [`EventLoop::import`]: crate::EventLoop::import

use crate::domain::{close_fid, DomainInner};
use crate::error::{check, Error, Result};
use crate::ffi;
use crate::info::Threading;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::alloc::{self, Layout};
use std::fmt;
use std::os::raw::c_void;
use std::ptr::{self, NonNull};
use std::sync::Arc;

/// Remote access a region grants its peers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Access {
    /// Peers may read (`FI_REMOTE_READ`).
    Read,
    /// Peers may write (`FI_REMOTE_WRITE`).
    Write,
    /// Peers may read, write and use atomics.
    ReadWrite,
}

impl Access {
    /// Whether peers may read.
    pub fn read(self) -> bool {
        matches!(self, Access::Read | Access::ReadWrite)
    }

    /// Whether peers may write.
    pub fn write(self) -> bool {
        matches!(self, Access::Write | Access::ReadWrite)
    }

    /// Whether this grants everything `other` does.
    pub fn covers(self, other: Access) -> bool {
        (self.read() || !other.read()) && (self.write() || !other.write())
    }

    fn remote_bits(self) -> u64 {
        let mut bits = 0;
        if self.read() {
            bits |= ffi::FI_REMOTE_READ as u64;
        }
        if self.write() {
            bits |= ffi::FI_REMOTE_WRITE as u64;
        }
        bits
    }
}

impl fmt::Display for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Access::Read => "remote read",
            Access::Write => "remote write",
            Access::ReadWrite => "remote read and write",
        })
    }
}

/// Alignment of owned regions: a page, as registration pins whole pages.
const REGION_ALIGN: usize = 4096;

/// The registration and its memory. Shared by the user's handle and by
/// every operation in flight that uses it.
pub(crate) struct RegionInner {
    ptr: NonNull<u8>,
    len: usize,
    /// Some: fabric-msg allocated the memory and frees it after closing the
    /// registration. None: borrowed from the caller.
    layout: Option<Layout>,
    raw: *mut ffi::fid_mr,
    pub(crate) desc: *mut c_void,
    key: u64,
    raw_key: Vec<u8>,
    /// What peers add offsets to: the virtual address under
    /// `FI_MR_VIRT_ADDR`, 0 otherwise.
    remote_base: u64,
    access: Access,
    /// Under `FI_MR_ENDPOINT`, keeps the bound endpoint from being closed first.
    _bound: Option<Arc<()>>,
    _domain: Arc<DomainInner>,
}

// SAFETY: the memory is reached only through raw copies (`read_at`,
// `write_at`) or `unsafe` accessors whose callers promise exclusivity, and
// the registration is only read (descriptor, key) or closed once in Drop.
// Closing a registration from another thread than the loop's is allowed at
// FI_THREAD_SAFE and FI_THREAD_FID (each fid used by one thread at a time),
// the only levels `EventLoop::register` accepts.
unsafe impl Send for RegionInner {}
// SAFETY: see Send; no &self method writes through the registration.
unsafe impl Sync for RegionInner {}

impl Drop for RegionInner {
    fn drop(&mut self) {
        if !self.raw.is_null() {
            // SAFETY: raw came from fi_mr_reg and is closed once, before the
            // memory it covers is freed and before the domain (held alive).
            unsafe { close_fid("memory region", &mut (*self.raw).fid) }
        }
        if let Some(layout) = self.layout {
            // SAFETY: allocated in `allocate` with this layout; the
            // registration is closed, so the NIC no longer touches it.
            unsafe { alloc::dealloc(self.ptr.as_ptr(), layout) }
        }
    }
}

impl RegionInner {
    fn check(&self, offset: usize, len: usize) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(Error::OutOfBounds {
                what: "local memory region",
                offset: offset as u64,
                len: len as u64,
                size: self.len as u64,
            }),
        }
    }

    pub(crate) fn same_domain(&self, domain: &Arc<DomainInner>) -> bool {
        Arc::ptr_eq(&self._domain, domain)
    }

    pub(crate) fn addr(&self, offset: usize) -> *mut c_void {
        // The caller checked offset against len.
        self.ptr.as_ptr().wrapping_add(offset).cast()
    }

    fn remote(&self, offset: usize, len: usize, access: Access) -> Result<RemoteMemory> {
        self.check(offset, len)?;
        if !self.access.covers(access) {
            return Err(Error::AccessDenied {
                operation: "sharing a window",
                needs: access.to_string(),
                granted: self.access.to_string(),
            });
        }
        Ok(RemoteMemory {
            addr: self.remote_base + offset as u64,
            len: len as u64,
            key: self.key,
            raw_key: self.raw_key.clone(),
            access,
            mapped: self.raw_key.is_empty(),
        })
    }

    fn read_at(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        self.check(offset, out.len())?;
        // SAFETY: in bounds (checked); the region's memory is live while
        // self is. A peer may be writing it: the copy then sees some mix of
        // old and new bytes, never memory outside the region.
        unsafe { ptr::copy_nonoverlapping(self.ptr.as_ptr().add(offset), out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    fn write_at(&self, offset: usize, bytes: &[u8]) -> Result<()> {
        self.check(offset, bytes.len())?;
        // SAFETY: as in read_at; `bytes` cannot overlap the region's memory
        // because no safe reference into the region exists.
        unsafe { ptr::copy_nonoverlapping(bytes.as_ptr(), self.ptr.as_ptr().add(offset), bytes.len()) };
        Ok(())
    }
}

/// Register `len` bytes at `ptr` (allocated by fabric-msg when `layout` is
/// Some) on `domain`, bound to `endpoint` under `FI_MR_ENDPOINT`. Peers get
/// `access` if `exposed`; otherwise only this side uses the memory.
///
/// # Safety
/// `ptr..ptr+len` stays allocated until the returned value is dropped.
pub(crate) unsafe fn register(
    domain: &Arc<DomainInner>,
    ptr: NonNull<u8>,
    len: usize,
    layout: Option<Layout>,
    access: Access,
    exposed: bool,
    endpoint: Option<(*mut ffi::fid_ep, Arc<()>)>,
) -> Result<RegionInner> {
    let p = &domain.profile;
    let mut inner = RegionInner {
        ptr,
        len,
        layout,
        raw: ptr::null_mut(),
        desc: ptr::null_mut(),
        key: 0,
        raw_key: Vec::new(),
        remote_base: 0,
        access,
        _bound: None,
        _domain: domain.clone(),
    };
    if !matches!(p.threading, Threading::Safe | Threading::Fid) {
        return Err(Error::Unsupported {
            what: format!(
                "memory regions at threading level {:?} (they may be dropped on any thread; fabric-msg needs \
                 FI_THREAD_SAFE or FI_THREAD_FID)",
                p.threading
            ),
            provider: p.provider.clone(),
        });
    }
    // Local use (source or sink of this side's operations) exposes nothing;
    // remote access is exactly what was asked.
    let remote = if exposed { access.remote_bits() } else { 0 };
    let flags = (ffi::FI_SEND | ffi::FI_RECV | ffi::FI_READ | ffi::FI_WRITE) as u64 | remote;
    // SAFETY: the caller keeps the memory allocated for the registration's life.
    inner.raw = unsafe { mr_reg(domain, ptr.as_ptr(), len, flags)? };
    if domain.mr_mode(ffi::FI_MR_ENDPOINT) {
        let Some((ep, keep)) = endpoint else {
            return Err(Error::Unsupported {
                what: "registering before an endpoint is open (FI_MR_ENDPOINT binds regions to one): \
                       call EventLoop::endpoint first"
                    .into(),
                provider: p.provider.clone(),
            });
        };
        // SAFETY: both objects are open; the region keeps `keep`, which the
        // loop checks before closing the endpoint.
        check("fi_mr_bind", unsafe {
            ffi::fi_mr_bind(inner.raw, &mut (*ep).fid, 0)
        })?;
        // SAFETY: the region is bound, as fi_mr_enable requires here.
        check("fi_mr_enable", unsafe { ffi::fi_mr_enable(inner.raw) })?;
        inner._bound = Some(keep);
    }
    // SAFETY: raw is a live registration.
    inner.desc = unsafe { ffi::fi_mr_desc(inner.raw) };
    let virt = domain.mr_mode(ffi::FI_MR_VIRT_ADDR);
    inner.remote_base = if virt { ptr.as_ptr() as u64 } else { 0 };
    if domain.mr_mode(ffi::FI_MR_RAW) {
        let mut base = 0u64;
        let mut size = p.mr_key_size.max(1);
        inner.raw_key = vec![0u8; size];
        // SAFETY: raw_key has `size` writable bytes; the outputs are valid.
        check("fi_mr_raw_attr", unsafe {
            ffi::fi_mr_raw_attr(inner.raw, &mut base, inner.raw_key.as_mut_ptr(), &mut size, 0)
        })?;
        inner.raw_key.truncate(size);
        if virt {
            inner.remote_base = base;
        }
    } else {
        // SAFETY: raw is a live registration.
        inner.key = unsafe { ffi::fi_mr_key(inner.raw) };
        if inner.key == u64::MAX
        /* FI_KEY_NOTAVAIL */
        {
            return Err(Error::Unsupported {
                what:
                    "a memory key that fits 64 bits (the provider gave none and does not ask for FI_MR_RAW)"
                        .into(),
                provider: p.provider.clone(),
            });
        }
    }
    Ok(inner)
}

/// `fi_mr_reg` of `len` bytes at `ptr` with access `flags`: the key is the
/// provider's under `FI_MR_PROV_KEY`, otherwise a fresh one of ours, and
/// running out of lockable memory is [`Error::MemoryLimit`].
///
/// # Safety
/// `ptr..ptr+len` stays allocated until the registration is closed.
pub(crate) unsafe fn mr_reg(
    domain: &DomainInner,
    ptr: *const u8,
    len: usize,
    flags: u64,
) -> Result<*mut ffi::fid_mr> {
    let requested_key = if domain.mr_mode(ffi::FI_MR_PROV_KEY) {
        0
    } else {
        app_key(domain)?
    };
    let mut raw = ptr::null_mut();
    // SAFETY: the caller keeps the memory allocated for the registration's
    // life; the out-pointer is valid.
    let rc = unsafe {
        ffi::fi_mr_reg(
            domain.raw,
            ptr.cast(),
            len,
            flags,
            0,
            requested_key,
            0,
            &mut raw,
            ptr::null_mut(),
        )
    };
    if rc == -(ffi::FI_ENOMEM as i32) {
        return Err(Error::MemoryLimit {
            len,
            memlock: memlock_limit(),
        });
    }
    check("fi_mr_reg", rc)?;
    Ok(raw)
}

/// The soft `RLIMIT_MEMLOCK`, in words.
fn memlock_limit() -> String {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into a valid out-pointer.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut lim) } != 0 {
        return "unknown".into();
    }
    if lim.rlim_cur == libc::RLIM_INFINITY {
        "unlimited (so the device itself is out of memory)".into()
    } else {
        format!("{} KiB", lim.rlim_cur / 1024)
    }
}

/// An application-chosen key that fits the domain's key size and was never
/// handed out before in this domain.
fn app_key(domain: &DomainInner) -> Result<u64> {
    let key = domain.fresh_key();
    let bits = 8 * domain.profile.mr_key_size.clamp(1, 8) as u32;
    if bits < 64 && key >> bits != 0 {
        return Err(Error::Unsupported {
            what: format!(
                "more than {} registrations in one domain ({bits}-bit keys)",
                (1u64 << bits) - 1
            ),
            provider: domain.profile.provider.clone(),
        });
    }
    Ok(key)
}

/// Allocate `len` zeroed, page-aligned bytes (at least one).
pub(crate) fn allocate(len: usize) -> Result<(NonNull<u8>, Layout)> {
    let layout = Layout::from_size_align(len.max(1), REGION_ALIGN).map_err(|_| Error::TooLarge {
        what: "memory region",
        len,
        max: isize::MAX as usize - REGION_ALIGN,
    })?;
    // SAFETY: the layout has a non-zero size.
    let p = unsafe { alloc::alloc_zeroed(layout) };
    match NonNull::new(p) {
        Some(p) => Ok((p, layout)),
        None => alloc::handle_alloc_error(layout),
    }
}

/// Registered memory that peers may read or write (see the module docs).
pub struct MemoryRegion {
    pub(crate) inner: Arc<RegionInner>,
}

impl fmt::Debug for MemoryRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryRegion")
            .field("len", &self.inner.len)
            .field("access", &self.inner.access)
            .field("in_flight", &self.in_flight())
            .finish()
    }
}

impl MemoryRegion {
    pub(crate) fn new(inner: RegionInner) -> MemoryRegion {
        MemoryRegion {
            inner: Arc::new(inner),
        }
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.inner.len
    }

    /// Whether the region has no bytes.
    pub fn is_empty(&self) -> bool {
        self.inner.len == 0
    }

    /// Remote access the region was registered with.
    pub fn access(&self) -> Access {
        self.inner.access
    }

    /// This side's operations in flight that use the region.
    pub fn in_flight(&self) -> usize {
        Arc::strong_count(&self.inner) - 1
    }

    /// The whole region as peers must name it, with its full access.
    pub fn remote(&self) -> RemoteMemory {
        self.inner
            .remote(0, self.inner.len, self.inner.access)
            .expect("the whole region with its own access is always valid")
    }

    /// `len` bytes from `offset`, with `access` (at most the region's), as
    /// peers must name them.
    pub fn remote_window(&self, offset: usize, len: usize, access: Access) -> Result<RemoteMemory> {
        self.inner.remote(offset, len, access)
    }

    /// `len` bytes from `offset` as the local side of an operation.
    pub fn local(&self, offset: usize, len: usize) -> Result<Local<'_>> {
        self.inner.check(offset, len)?;
        Ok(Local {
            region: &self.inner,
            lease: None,
            offset,
            len,
        })
    }

    /// The whole region as the local side of an operation.
    pub fn all(&self) -> Local<'_> {
        Local {
            region: &self.inner,
            lease: None,
            offset: 0,
            len: self.inner.len,
        }
    }

    /// Copy `out.len()` bytes from `offset` out of the region. Bytes a
    /// peer is writing at the same moment may be old or new; wait for the
    /// peer's notice (a message, or [`write_data`]'s completion) first.
    ///
    /// [`write_data`]: crate::EventLoop::write_data
    pub fn read_at(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        self.inner.read_at(offset, out)
    }

    /// Copy `bytes` into the region at `offset`.
    pub fn write_at(&self, offset: usize, bytes: &[u8]) -> Result<()> {
        self.inner.write_at(offset, bytes)
    }

    /// The region's bytes, borrowed.
    ///
    /// # Safety
    /// Nothing may write the region while the slice lives: no peer with
    /// write access, no read or atomic of this side landing in it.
    pub unsafe fn as_slice(&self) -> &[u8] {
        // SAFETY: live memory of `len` bytes; the caller rules out writers.
        unsafe { std::slice::from_raw_parts(self.inner.ptr.as_ptr(), self.inner.len) }
    }

    /// Deregister now, revoking the key. Refused while this side's
    /// operations use the region (dropping it instead waits for them).
    #[allow(clippy::result_large_err)]
    pub fn close(self) -> std::result::Result<(), (MemoryRegion, Error)> {
        match Arc::try_unwrap(self.inner) {
            Ok(inner) => {
                drop(inner);
                Ok(())
            }
            Err(inner) => {
                let in_flight = Arc::strong_count(&inner) - 1;
                Err((
                    MemoryRegion { inner },
                    Error::Busy {
                        what: "memory region",
                        in_flight,
                    },
                ))
            }
        }
    }
}

/// The local side of a one-sided operation: bytes of a registered region.
#[derive(Clone, Copy)]
pub struct Local<'a> {
    pub(crate) region: &'a Arc<RegionInner>,
    pub(crate) lease: Option<&'a Arc<Lease>>,
    pub(crate) offset: usize,
    pub(crate) len: usize,
}

impl fmt::Debug for Local<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Local")
            .field("offset", &self.offset)
            .field("len", &self.len)
            .finish()
    }
}

impl Local<'_> {
    /// Bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// The largest encoded [`RemoteMemory`] accepted from a peer.
pub const MAX_REMOTE_MEMORY: usize = 128;

/// Memory of a peer, as that peer described it: where to address it, the
/// key, how many bytes and what access. Send it in a message
/// ([`RemoteMemory::encode`]) and bring it in with
/// [`EventLoop::import`](crate::EventLoop::import), which checks it and maps
/// raw keys. It also serialises with serde, inside your own messages.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteMemory {
    addr: u64,
    len: u64,
    key: u64,
    /// The whole key, under `FI_MR_RAW`; empty otherwise.
    raw_key: Vec<u8>,
    access: Access,
    /// A raw key was mapped by `import` (not consulted without raw keys,
    /// so a descriptor deserialised by the application's own serde works).
    #[serde(skip)]
    mapped: bool,
}

impl RemoteMemory {
    /// Bytes the peer made available.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Access the peer granted.
    pub fn access(&self) -> Access {
        self.access
    }

    /// A narrower window of this memory (to hand on to another peer).
    pub fn window(&self, offset: u64, len: u64, access: Access) -> Result<RemoteMemory> {
        self.check(offset, len, access, "narrowing a window")?;
        Ok(RemoteMemory {
            addr: self.addr + offset,
            len,
            access,
            ..self.clone()
        })
    }

    /// Encode with postcard, to send to a peer.
    pub fn encode(&self) -> Vec<u8> {
        postcard::to_stdvec(self).expect("a RemoteMemory always encodes")
    }

    /// Decode bytes from a peer, refusing oversized or malformed input.
    /// Raw keys still need [`EventLoop::import`](crate::EventLoop::import).
    pub fn decode(bytes: &[u8]) -> Result<RemoteMemory> {
        if bytes.len() > MAX_REMOTE_MEMORY {
            return Err(Error::Encoding(format!(
                "remote memory descriptor of {} bytes, more than the {MAX_REMOTE_MEMORY} allowed",
                bytes.len()
            )));
        }
        let (mut m, rest): (RemoteMemory, &[u8]) = postcard::take_from_bytes(bytes)
            .map_err(|e| Error::Encoding(format!("remote memory descriptor does not decode ({e})")))?;
        if !rest.is_empty() {
            return Err(Error::Encoding(format!(
                "{} trailing bytes after the remote memory descriptor",
                rest.len()
            )));
        }
        if m.addr.checked_add(m.len).is_none() {
            return Err(Error::Encoding(format!(
                "remote memory descriptor wraps the address space ({:#x} + {})",
                m.addr, m.len
            )));
        }
        m.mapped = m.raw_key.is_empty();
        Ok(m)
    }

    /// Check an operation of `len` bytes at `offset` needing `needs`.
    pub(crate) fn check(&self, offset: u64, len: u64, needs: Access, operation: &'static str) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => {}
            _ => {
                return Err(Error::OutOfBounds {
                    what: "peer's memory",
                    offset,
                    len,
                    size: self.len,
                })
            }
        }
        if !self.access.covers(needs) {
            return Err(Error::AccessDenied {
                operation,
                needs: needs.to_string(),
                granted: self.access.to_string(),
            });
        }
        if !self.raw_key.is_empty() && !self.mapped {
            return Err(Error::Usage(
                "this remote memory has a raw key (FI_MR_RAW) that was not mapped: bring it in with \
                 EventLoop::import"
                    .into(),
            ));
        }
        Ok(())
    }

    /// (address, key) of byte `offset`.
    pub(crate) fn target(&self, offset: u64) -> (u64, u64) {
        (self.addr + offset, self.key)
    }

    pub(crate) fn raw_key(&self) -> &[u8] {
        &self.raw_key
    }

    pub(crate) fn set_mapped_key(&mut self, key: u64) {
        self.key = key;
        self.mapped = true;
    }
}

/// Returns a pool slot to its pool when the last holder (the user's
/// [`PoolSlot`] or an operation in flight) lets go.
pub(crate) struct Lease {
    index: u32,
    free: Arc<Mutex<Vec<u32>>>,
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.free.lock().push(self.index);
    }
}

/// Pre-registered memory cut into equal slots: one registration for many
/// buffers, because registering per operation is costly (pinning pages on
/// RDMA devices).
pub struct RegionPool {
    region: MemoryRegion,
    slot_size: usize,
    free: Arc<Mutex<Vec<u32>>>,
}

impl fmt::Debug for RegionPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegionPool")
            .field("slot_size", &self.slot_size)
            .field("slots", &(self.region.len() / self.slot_size.max(1)))
            .field("free", &self.free.lock().len())
            .finish()
    }
}

impl RegionPool {
    pub(crate) fn new(region: MemoryRegion, slot_size: usize, count: usize) -> RegionPool {
        RegionPool {
            region,
            slot_size,
            free: Arc::new(Mutex::new((0..count as u32).rev().collect())),
        }
    }

    /// Bytes per slot.
    pub fn slot_size(&self) -> usize {
        self.slot_size
    }

    /// Slots free now.
    pub fn available(&self) -> usize {
        self.free.lock().len()
    }

    /// A free slot, or None when all are in use. The slot returns to the
    /// pool when it is dropped and no operation uses it any more.
    pub fn take(&self) -> Option<PoolSlot> {
        let index = self.free.lock().pop()?;
        Some(PoolSlot {
            region: self.region.inner.clone(),
            offset: index as usize * self.slot_size,
            len: self.slot_size,
            lease: Arc::new(Lease {
                index,
                free: self.free.clone(),
            }),
        })
    }

    /// The registration behind the pool.
    pub fn region(&self) -> &MemoryRegion {
        &self.region
    }
}

/// One slot of a [`RegionPool`].
pub struct PoolSlot {
    region: Arc<RegionInner>,
    offset: usize,
    len: usize,
    lease: Arc<Lease>,
}

impl fmt::Debug for PoolSlot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PoolSlot")
            .field("index", &self.lease.index)
            .field("len", &self.len)
            .finish()
    }
}

impl PoolSlot {
    /// Bytes in the slot.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the slot has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The first `len` bytes of the slot as the local side of an operation.
    pub fn local(&self, len: usize) -> Result<Local<'_>> {
        if len > self.len {
            return Err(Error::OutOfBounds {
                what: "pool slot",
                offset: 0,
                len: len as u64,
                size: self.len as u64,
            });
        }
        Ok(Local {
            region: &self.region,
            lease: Some(&self.lease),
            offset: self.offset,
            len,
        })
    }

    /// The slot as peers must name it.
    pub fn remote(&self, access: Access) -> Result<RemoteMemory> {
        self.region.remote(self.offset, self.len, access)
    }

    /// Copy bytes out of the slot (see [`MemoryRegion::read_at`]).
    pub fn read_at(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        self.in_slot(offset, out.len())?;
        self.region.read_at(self.offset + offset, out)
    }

    /// Copy bytes into the slot.
    pub fn write_at(&self, offset: usize, bytes: &[u8]) -> Result<()> {
        self.in_slot(offset, bytes.len())?;
        self.region.write_at(self.offset + offset, bytes)
    }

    fn in_slot(&self, offset: usize, len: usize) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(Error::OutOfBounds {
                what: "pool slot",
                offset: offset as u64,
                len: len as u64,
                size: self.len as u64,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn remote(len: u64, access: Access) -> RemoteMemory {
        RemoteMemory {
            addr: 0x1000,
            len,
            key: 7,
            raw_key: Vec::new(),
            access,
            mapped: true,
        }
    }

    #[test]
    fn access_is_least_privilege() {
        assert!(Access::ReadWrite.covers(Access::Read));
        assert!(!Access::Read.covers(Access::Write));
        assert!(!Access::Write.covers(Access::ReadWrite));
        assert_eq!(Access::Read.remote_bits(), ffi::FI_REMOTE_READ as u64);
    }

    #[test]
    fn remote_checks_bounds_and_access_before_anything_is_posted() {
        let m = remote(100, Access::Read);
        assert!(m.check(0, 100, Access::Read, "read").is_ok());
        let e = m.check(90, 11, Access::Read, "read").unwrap_err();
        assert!(
            matches!(
                e,
                Error::OutOfBounds {
                    offset: 90,
                    len: 11,
                    size: 100,
                    ..
                }
            ),
            "{e}"
        );
        assert!(
            m.check(u64::MAX, 2, Access::Read, "read").is_err(),
            "overflow is out of bounds"
        );
        let e = m.check(0, 1, Access::Write, "write").unwrap_err().to_string();
        assert!(
            e.contains("remote write") && e.contains("granted only remote read"),
            "{e}"
        );
        assert_eq!(m.target(5), (0x1005, 7));
        let w = m.window(10, 20, Access::Read).unwrap();
        assert_eq!((w.target(0), w.len()), ((0x100a, 7), 20));
        assert!(m.window(90, 20, Access::Read).is_err());
        assert!(
            m.window(0, 1, Access::ReadWrite).is_err(),
            "a window cannot widen access"
        );
    }

    #[test]
    fn descriptors_inside_the_applications_own_serde_messages_work() {
        let m = remote(64, Access::ReadWrite);
        let bytes = postcard::to_stdvec(&(7u32, m.clone())).unwrap();
        let (_, back): (u32, RemoteMemory) = postcard::from_bytes(&bytes).unwrap();
        assert!(back.check(0, 8, Access::Write, "write").is_ok());
        assert_eq!(back.target(8), m.target(8));
    }

    #[test]
    fn descriptors_round_trip_and_hostile_ones_are_refused() {
        let m = remote(4096, Access::ReadWrite);
        assert_eq!(RemoteMemory::decode(&m.encode()).unwrap(), m);
        assert!(RemoteMemory::decode(&[0u8; MAX_REMOTE_MEMORY + 1]).is_err());
        assert!(RemoteMemory::decode(&[0xff; 12]).is_err());
        let mut wraps = m.clone();
        wraps.addr = u64::MAX - 10;
        assert!(RemoteMemory::decode(&wraps.encode())
            .unwrap_err()
            .to_string()
            .contains("wraps"));
        let bytes = m.encode();
        for cut in 0..bytes.len() {
            assert!(RemoteMemory::decode(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        let mut raw = m.clone();
        raw.raw_key = vec![1; 16];
        let raw = RemoteMemory::decode(&raw.encode()).unwrap();
        assert!(raw
            .check(0, 1, Access::Read, "read")
            .unwrap_err()
            .to_string()
            .contains("import"));
    }

    #[test]
    fn pool_slots_come_back_when_released() {
        let free = Arc::new(Mutex::new(vec![1, 0]));
        {
            let _a = Lease {
                index: free.lock().pop().unwrap(),
                free: free.clone(),
            };
            assert_eq!(free.lock().len(), 1);
        }
        assert_eq!(free.lock().len(), 2);
    }
}
