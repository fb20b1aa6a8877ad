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
//! - `FI_MR_PROV_KEY`: the provider picks keys; otherwise fabric-msg draws
//!   them at random over the whole key width and never hands out a key
//!   twice in a domain, so no key can be guessed from another and a revoked
//!   key can never open a newer region (`keys`).
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

use crate::discovery::info::Threading;
use crate::error::{Error, Result};
use crate::ffi;
use crate::libfabric::{Mr, RawEndpoint};
use crate::memory::access::Access;
use crate::memory::domain::DomainInner;
use crate::memory::lease::Lease;
use crate::memory::remote::RemoteMemory;
use std::alloc::{self, Layout};
use std::fmt;
use std::os::raw::c_void;
use std::ptr::{self, NonNull};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

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
    /// The registration; `None` only while `register` builds it.
    mr: Option<Mr>,
    pub(crate) desc: *mut c_void,
    key: u64,
    raw_key: Vec<u8>,
    /// What peers add offsets to: the virtual address under
    /// `FI_MR_VIRT_ADDR`, 0 otherwise.
    remote_base: u64,
    access: Access,
    /// Registered with remote access (peers may reach it).
    exposed: bool,
    /// Under `FI_MR_ENDPOINT`, keeps the bound endpoint from being closed first.
    _bound: Option<Arc<()>>,
    _domain: Arc<DomainInner>,
    /// What owns borrowed memory that must outlive the registration (a
    /// shared mapping); dropped after it, as fields drop after `Drop`.
    _keep: Option<Arc<dyn std::any::Any + Send + Sync>>,
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
        // The registration goes before the memory it covers.
        self.mr = None;
        if let Some(layout) = self.layout {
            // SAFETY: allocated in `allocate` with this layout; the
            // registration is closed, so the NIC no longer touches it.
            unsafe { alloc::dealloc(self.ptr.as_ptr(), layout) }
        }
    }
}

/// Why a peer's emulated atomic was refused at the target, where a NIC
/// would have refused the access.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AtomicRefusal {
    /// The 8 bytes are not all inside the region.
    OutOfBounds,
    /// The address is not 8-byte aligned.
    Misaligned,
    /// The region does not grant the access the operation needs.
    AccessDenied,
}

impl RegionInner {
    /// Hold `owner` (of this region's memory) until the registration is
    /// closed.
    pub(crate) fn keep(&mut self, owner: Arc<dyn std::any::Any + Send + Sync>) {
        self._keep = Some(owner);
    }

    /// The key peers present (a plain 64-bit key; 0 under `FI_MR_RAW`).
    pub(crate) fn key(&self) -> u64 {
        self.key
    }

    /// Whether peers may reach this region (it was registered with remote
    /// access, not as this side's private scratch).
    pub(crate) fn exposed(&self) -> bool {
        self.exposed
    }

    /// The u64 a peer's emulated atomic names by remote address `addr`,
    /// checked as a NIC checks an access: inside the region, 8-byte
    /// aligned, and allowed by the region's access. The caller has matched
    /// the key.
    pub(crate) fn atomic_word(
        &self,
        addr: u64,
        needs: Access,
    ) -> std::result::Result<&AtomicU64, AtomicRefusal> {
        let offset = addr
            .checked_sub(self.remote_base)
            .ok_or(AtomicRefusal::OutOfBounds)?;
        match offset.checked_add(8) {
            Some(end) if end <= self.len as u64 => {}
            _ => return Err(AtomicRefusal::OutOfBounds),
        }
        let p = self.ptr.as_ptr().wrapping_add(offset as usize);
        if p as usize % std::mem::align_of::<AtomicU64>() != 0 {
            return Err(AtomicRefusal::Misaligned);
        }
        if !self.access.covers(needs) {
            return Err(AtomicRefusal::AccessDenied);
        }
        // SAFETY: the 8 bytes at p lie inside the region (checked above) and
        // are aligned for AtomicU64; the memory lives as long as `self`.
        // Other writers of this memory are the NIC and peers' one-sided
        // operations, exactly as for any registered memory: fabric-msg's
        // own emulated atomics reach it only through this AtomicU64.
        Ok(unsafe { AtomicU64::from_ptr(p.cast::<u64>()) })
    }

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

    pub(crate) fn remote(&self, offset: usize, len: usize, access: Access) -> Result<RemoteMemory> {
        self.check(offset, len)?;
        if !self.access.covers(access) {
            return Err(Error::AccessDenied {
                operation: "sharing a window",
                needs: access.to_string(),
                granted: self.access.to_string(),
            });
        }
        Ok(RemoteMemory::new(
            self.remote_base + offset as u64,
            len as u64,
            self.key,
            self.raw_key.clone(),
            access,
        ))
    }

    pub(crate) fn read_at(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        self.check(offset, out.len())?;
        // SAFETY: in bounds (checked); the region's memory is live while
        // self is, and `out` is not part of it. A peer (or this process's
        // emulated atomics) may be writing it: the copy is atomic word by
        // word (copy.rs), so it sees old or new words, never a data race.
        unsafe { super::copy::copy_out(self.ptr.as_ptr().add(offset), out) };
        Ok(())
    }

    pub(crate) fn write_at(&self, offset: usize, bytes: &[u8]) -> Result<()> {
        self.check(offset, bytes.len())?;
        // SAFETY: as in read_at; `bytes` cannot overlap the region's memory
        // because no safe reference into the region exists.
        unsafe { super::copy::copy_in(self.ptr.as_ptr().add(offset), bytes) };
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
    endpoint: Option<(RawEndpoint, Arc<()>)>,
) -> Result<RegionInner> {
    let p = &domain.profile;
    let mut inner = RegionInner {
        ptr,
        len,
        layout,
        mr: None,
        desc: ptr::null_mut(),
        key: 0,
        raw_key: Vec::new(),
        remote_base: 0,
        access,
        exposed,
        _bound: None,
        _domain: domain.clone(),
        _keep: None,
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
    let mr = unsafe { mr_reg(domain, ptr.as_ptr(), len, flags)? };
    if domain.mr_mode(ffi::FI_MR_ENDPOINT) {
        let Some((ep, keep)) = endpoint else {
            return Err(Error::Unsupported {
                what: "registering before an endpoint is open (FI_MR_ENDPOINT binds regions to one): \
                       call EventLoop::open_endpoint first"
                    .into(),
                provider: p.provider.clone(),
            });
        };
        // SAFETY: the endpoint is open; the region keeps `keep`, which the
        // loop checks before closing the endpoint.
        unsafe { mr.bind(ep)? };
        inner._bound = Some(keep);
    }
    inner.desc = mr.desc();
    let virt = domain.mr_mode(ffi::FI_MR_VIRT_ADDR);
    inner.remote_base = if virt { ptr.as_ptr() as u64 } else { 0 };
    if domain.mr_mode(ffi::FI_MR_RAW) {
        let (base, raw_key) = mr.raw_key(p.mr_key_size)?;
        inner.raw_key = raw_key;
        if virt {
            inner.remote_base = base;
        }
    } else {
        inner.key = mr.key();
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
    inner.mr = Some(mr);
    Ok(inner)
}

/// Attempts at an application key before giving up: only a provider that
/// refuses fresh random keys with `FI_ENOKEY` again and again gets there.
const KEY_ATTEMPTS: usize = 8;

/// `fi_mr_reg` of `len` bytes at `ptr` with access `flags`: the key is the
/// provider's under `FI_MR_PROV_KEY`, otherwise a fresh random one of ours
/// (drawn again if the provider says it is taken), and running out of
/// lockable memory is [`Error::MemoryLimit`].
///
/// # Safety
/// `ptr..ptr+len` stays allocated until the registration is closed.
pub(crate) unsafe fn mr_reg(domain: &DomainInner, ptr: *const u8, len: usize, flags: u64) -> Result<Mr> {
    let provider_keys = domain.mr_mode(ffi::FI_MR_PROV_KEY);
    let mut attempt = 0;
    loop {
        attempt += 1;
        let requested_key = if provider_keys {
            0
        } else {
            domain.keys.draw(&domain.profile.provider)?
        };
        // SAFETY: the caller keeps the memory allocated for the
        // registration's life.
        let rc = match unsafe { Mr::register(&domain.domain, ptr, len, flags, requested_key) } {
            Ok(mr) => return Ok(mr),
            Err(rc) => rc,
        };
        if rc == -(ffi::FI_ENOMEM as i32) {
            return Err(Error::MemoryLimit {
                len,
                memlock: memlock_limit(),
            });
        }
        if rc == -(ffi::FI_ENOKEY as i32) && !provider_keys && attempt < KEY_ATTEMPTS {
            log::debug!("fi_mr_reg: key {requested_key:#x} taken (FI_ENOKEY); drawing another");
            continue;
        }
        return Err(Error::from_rc("fi_mr_reg", rc.into()));
    }
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
