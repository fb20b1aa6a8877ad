//! One-sided operations: RMA read and write, write with immediate data, and
//! u64 atomics, on memory registered with [`EventLoop::register`]. They
//! complete through the same [`EventLoop::poll`] as messages.
//!
//! Every operation is checked before anything is posted: the local range
//! lies in its region, the remote range in what the peer granted, with the
//! access it needs. Transfers larger than the fabric's (or the peer's)
//! `max_msg_size`, or [`LoopConfig::rma_chunk`](crate::LoopConfig::rma_chunk),
//! are split and complete once.
//!
//! On providers with manual data progress (`tcp;ofi_rxm`, `shm`,
//! `udp;ofi_rxd`; see [`Profile::data_progress`](crate::Profile)) the
//! target's loop must be polled for a peer's one-sided operations to
//! proceed, as with messages.

use super::am::AtomicRequest;
use super::post::Parts;
use super::state::EventLoop;
use super::types::{OpKind, Peer, Token};
use crate::discovery::atomic::{AtomicCarrier, AtomicForm, AtomicKind};
use crate::error::{Error, Result};
use crate::ffi;
use crate::libfabric::RawEndpoint;
use crate::memory::access::Access;
use crate::memory::mr::{self, Local, MemoryRegion};
use crate::memory::pool::RegionPool;
use crate::memory::remote::RemoteMemory;
use std::os::raw::c_void;
use std::ptr::{self, NonNull};
use std::sync::Arc;

/// A u64 atomic operation on a peer's memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Atomic {
    /// Add, returning nothing (`FI_SUM`).
    Add(u64),
    /// Add, returning the old value (`FI_SUM`, fetching).
    FetchAdd(u64),
    /// Store, returning the old value (`FI_ATOMIC_WRITE`, fetching).
    Swap(u64),
    /// Store `new` if the value equals `expected`; returns the old value
    /// (`FI_CSWAP`).
    CompareSwap {
        /// Value to compare with.
        expected: u64,
        /// Value to store when equal.
        new: u64,
    },
    /// Store the minimum, returning the old value (`FI_MIN`, fetching).
    FetchMin(u64),
    /// Store the maximum, returning the old value (`FI_MAX`, fetching).
    FetchMax(u64),
    /// Read atomically (`FI_ATOMIC_READ`, fetching).
    Read,
}

impl Atomic {
    /// The operation without its operands, as [`Profile::supports`](crate::Profile::supports) takes it.
    pub fn kind(self) -> AtomicKind {
        match self {
            Atomic::Add(_) => AtomicKind::Add,
            Atomic::FetchAdd(_) => AtomicKind::FetchAdd,
            Atomic::Swap(_) => AtomicKind::Swap,
            Atomic::CompareSwap { .. } => AtomicKind::CompareSwap,
            Atomic::FetchMin(_) => AtomicKind::FetchMin,
            Atomic::FetchMax(_) => AtomicKind::FetchMax,
            Atomic::Read => AtomicKind::Read,
        }
    }

    /// (operand, compare value).
    pub(crate) fn operands(self) -> (u64, u64) {
        match self {
            Atomic::Add(v)
            | Atomic::FetchAdd(v)
            | Atomic::Swap(v)
            | Atomic::FetchMin(v)
            | Atomic::FetchMax(v) => (v, 0),
            Atomic::CompareSwap { expected, new } => (new, expected),
            Atomic::Read => (0, 0),
        }
    }

    /// Apply the operation to `w` with this CPU (`cpu_atomics.rs`); the
    /// word's value before.
    pub(crate) fn apply_to(self, w: &std::sync::atomic::AtomicU64) -> u64 {
        let (operand, compare) = self.operands();
        super::cpu_atomics::apply_word(w, self.kind(), operand, compare)
    }

    /// The access the target's memory must grant (as for native atomics).
    pub(crate) fn needs(self) -> Access {
        match self {
            Atomic::Add(_) => Access::Write,
            Atomic::Read => Access::Read,
            _ => Access::ReadWrite,
        }
    }
}

/// Bytes of atomic scratch per operation slot: operand, compare, result.
const SCRATCH_ENTRY: usize = 24;

impl EventLoop {
    /// Register `len` zeroed bytes that peers may access as `access` says.
    /// Under `FI_MR_ENDPOINT` the region is bound to the loop's first open
    /// endpoint, so open endpoints first.
    pub fn register(&mut self, len: usize, access: Access) -> Result<MemoryRegion> {
        self.register_owned(len, access, true)
    }

    /// Register `len` zeroed bytes for this side's use only (the local
    /// side of one-sided operations): no peer gets a key to them.
    pub(crate) fn register_local(&mut self, len: usize) -> Result<MemoryRegion> {
        self.register_owned(len, Access::ReadWrite, false)
    }

    /// Register `len` bytes at `ptr`, memory that `keep` owns (a shared
    /// mapping: `world/node_symmetric.rs`), exposed to peers as `access`
    /// says; the region holds `keep` until the registration is closed.
    ///
    /// # Safety
    /// `ptr..ptr + len` is live, writable memory for as long as `keep` is.
    pub(crate) unsafe fn register_kept(
        &mut self,
        ptr: NonNull<u8>,
        len: usize,
        access: Access,
        keep: Arc<dyn std::any::Any + Send + Sync>,
    ) -> Result<MemoryRegion> {
        let bind = self.bind_target();
        // SAFETY: the caller's promise; `keep` goes into the region, which
        // drops it only after deregistering.
        let mut inner = unsafe { mr::register(&self.domain, ptr, len, None, access, true, bind)? };
        inner.keep(keep);
        Ok(self.expose(MemoryRegion::new(inner), true))
    }

    fn register_owned(&mut self, len: usize, access: Access, exposed: bool) -> Result<MemoryRegion> {
        let (ptr, layout) = mr::allocate(len)?;
        let bind = self.bind_target();
        // SAFETY: the memory was just allocated and belongs to the region,
        // which frees it only after deregistering (also on error).
        let inner = unsafe { mr::register(&self.domain, ptr, len, Some(layout), access, exposed, bind)? };
        Ok(self.expose(MemoryRegion::new(inner), exposed))
    }

    /// Let peers' emulated atomics find `region` by its key (while it lives).
    fn expose(&mut self, region: MemoryRegion, exposed: bool) -> MemoryRegion {
        if exposed {
            let regions = &mut self.am.regions;
            regions.retain(|w| w.strong_count() > 0);
            regions.push(Arc::downgrade(&region.inner));
        }
        region
    }

    /// Register the caller's `len` bytes at `data`.
    ///
    /// # Safety
    /// The memory must stay allocated until the returned region and every
    /// operation using it are finished: the region dropped, and each
    /// operation's completion returned by [`EventLoop::poll`] (or its
    /// endpoint closed, or the loop dropped). While peers have access, it
    /// may change at any time: do not hold Rust references into it then.
    pub unsafe fn register_borrowed(
        &mut self,
        data: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<MemoryRegion> {
        let ptr = NonNull::new(data).ok_or(Error::Usage("register_borrowed: null pointer".into()))?;
        let bind = self.bind_target();
        // SAFETY: the caller keeps the memory alive as the region needs.
        let inner = unsafe { mr::register(&self.domain, ptr, len, None, access, true, bind)? };
        Ok(self.expose(MemoryRegion::new(inner), true))
    }

    /// Register `count` slots of `slot_size` bytes at once, for reuse
    /// without registering again (see [`RegionPool`]).
    pub fn register_pool(&mut self, slot_size: usize, count: usize, access: Access) -> Result<RegionPool> {
        let len = slot_size.checked_mul(count).ok_or(Error::TooLarge {
            what: "region pool",
            len: usize::MAX,
            max: isize::MAX as usize,
        })?;
        let region = self.register(len, access)?;
        Ok(RegionPool::new(region, slot_size, count))
    }

    fn bind_target(&self) -> Option<(RawEndpoint, Arc<()>)> {
        self.endpoints
            .iter()
            .flatten()
            .find(|e| !e.raw.is_null())
            .map(|e| (e.raw, e.bound.clone()))
    }

    /// Bring in a peer's memory descriptor (from [`RemoteMemory::encode`]):
    /// checked, and with a raw key (`FI_MR_RAW`) mapped for this domain.
    pub fn import(&mut self, bytes: &[u8]) -> Result<RemoteMemory> {
        let mut m = RemoteMemory::decode(bytes)?;
        let raw_here = self.domain.mr_mode(ffi::FI_MR_RAW);
        if m.raw_key().is_empty() == raw_here {
            return Err(Error::PeerMismatch(format!(
                "the peer's memory key is {}, but this domain {} raw keys (FI_MR_RAW): are both sides on the \
                 same provider?",
                if raw_here { "a plain 64-bit key" } else { "raw" },
                if raw_here { "needs" } else { "does not use" }
            )));
        }
        if raw_here {
            let (addr, _) = m.target(0);
            // Unmapped when the loop drops.
            let key = self.domain.domain.map_raw_key(addr, m.raw_key())?;
            self.spare.mapped_keys.push(key);
            m.set_mapped_key(key);
        }
        Ok(m)
    }

    /// Read `local.len()` bytes of the peer's memory at `offset` into `local`.
    pub fn read(
        &mut self,
        peer: &Peer,
        local: Local<'_>,
        remote: &RemoteMemory,
        offset: u64,
        token: Token,
    ) -> Result<()> {
        self.rma(peer, local, remote, offset, token, OpKind::Read, None)
    }

    /// Write `local` into the peer's memory at `offset`.
    pub fn write(
        &mut self,
        peer: &Peer,
        local: Local<'_>,
        remote: &RemoteMemory,
        offset: u64,
        token: Token,
    ) -> Result<()> {
        self.rma(peer, local, remote, offset, token, OpKind::Write, None)
    }

    /// Write `local` into the peer's memory at `offset`, then tell the peer
    /// with `data`: its loop returns an [`OpKind::RemoteWrite`] completion
    /// carrying `data`, after the written bytes are in place. Natively
    /// (remote CQ data) where the fabric has it; where it has none (iWARP)
    /// through a 16-byte follow-up message ordered after the write
    /// (`FI_ORDER_SAW`). Either way the notice may use up one untagged
    /// receive the peer posted, so peers keep untagged receives posted.
    pub fn write_data(
        &mut self,
        peer: &Peer,
        local: Local<'_>,
        remote: &RemoteMemory,
        offset: u64,
        data: u64,
        token: Token,
    ) -> Result<()> {
        self.rma(peer, local, remote, offset, token, OpKind::Write, Some(data))
    }

    #[allow(clippy::too_many_arguments)]
    fn rma(
        &mut self,
        peer: &Peer,
        local: Local<'_>,
        remote: &RemoteMemory,
        offset: u64,
        token: Token,
        kind: OpKind,
        data: Option<u64>,
    ) -> Result<()> {
        let (needs, what) = match kind {
            OpKind::Read => (Access::Read, "RMA read"),
            _ => (Access::Write, "RMA write"),
        };
        remote.check(offset, local.len as u64, needs, what)?;
        self.require_cap("FI_RMA", "RMA (ask for Capability::Rma when negotiating)")?;
        self.same_domain(local)?;
        self.lost.check(peer.endpoint.0, peer.addr)?;
        let ep = self.ep(peer.endpoint)?;
        let raw = ep.raw;
        let profile = &self.domain.profile;
        let chunk = [
            profile.max_msg_size,
            peer.agreement.max_msg_size,
            self.cfg.rma_chunk.map_or(u64::MAX, |c| c as u64),
        ]
        .into_iter()
        .min()
        .unwrap_or(u64::MAX)
        .clamp(1, usize::MAX as u64) as usize;
        let chunks = local.len.div_ceil(chunk).max(1);
        let cq_data = peer.agreement.cq_data_size as usize;
        // The notice: native remote CQ data, or a follow-up message.
        let mut follow_up = None;
        if let Some(d) = data {
            let order = self.msg_order();
            if cq_data > 0 {
                if cq_data < 8 && d >> (8 * cq_data) != 0 {
                    return Err(Error::TooLarge {
                        what: "immediate value (in bytes of remote CQ data)",
                        len: 8 - (d.leading_zeros() / 8) as usize,
                        max: cq_data,
                    });
                }
                if chunks > 1 && order & ffi::FI_ORDER_WAW as u64 == 0 {
                    return Err(self.unsupported(
                        "write_data larger than one transfer without write-after-write ordering",
                    ));
                }
            } else {
                if order & ffi::FI_ORDER_SAW as u64 == 0 {
                    return Err(self.unsupported(
                        "write_data without remote CQ data and without send-after-write ordering",
                    ));
                }
                let mut buf = self
                    .spare
                    .notify_bufs
                    .pop()
                    .unwrap_or_else(|| crate::memory::buffer::Buffer::new(0));
                *buf.header_mut() = super::frame::encode_notify(d);
                let desc = self.local_desc(&mut buf)?;
                follow_up = Some((buf, desc));
            }
        }
        let native_data = data.filter(|_| follow_up.is_none());
        let (notify_ptr, notify_desc) = match follow_up.as_mut() {
            Some((b, desc)) => (b.ptr(true), *desc),
            None => (ptr::null_mut(), ptr::null_mut()),
        };
        let region = local.region;
        let desc = region.desc;
        let addr = peer.addr;
        let parts = Parts {
            endpoint: peer.endpoint,
            kind,
            token,
            count: chunks + usize::from(follow_up.is_some()),
            region: Some(local.region),
            lease: local.lease,
            atomic: false,
            last_buffer: follow_up.map(|(b, _)| b),
            peer: addr,
            call: if kind == OpKind::Read {
                "fi_readmsg"
            } else {
                "fi_writemsg"
            },
        };
        let (loff, len) = (local.offset, local.len);
        // A write completes once its bytes are in the peer's memory, so a
        // refused access (a revoked key) is reported, where the provider
        // can, instead of being dropped at the target unseen (tcp).
        let write_flags = ffi::FI_DELIVERY_COMPLETE as u64;
        self.post_parts(parts, |part, _, ctx| {
            if part == chunks {
                // SAFETY: raw is enabled; the follow-up buffer is owned by
                // this part's slot until its completion; ctx is the slot's.
                return unsafe {
                    raw.send(
                        notify_ptr,
                        crate::memory::buffer::HEADROOM,
                        notify_desc,
                        addr,
                        None,
                        None,
                        ctx,
                    )
                };
            }
            let at = part * chunk;
            let n = chunk.min(len - at);
            let lp = region.addr(loff + at);
            let (raddr, key) = remote.target(offset + at as u64);
            // SAFETY: raw is enabled; `n` bytes at lp lie in the registered
            // region, which this part's slot holds until its completion; the
            // remote range was checked against what the peer granted; ctx
            // is the slot's fi_context2.
            let iov = libc::iovec {
                iov_base: lp,
                iov_len: n,
            };
            let rma_iov = ffi::fi_rma_iov {
                addr: raddr,
                len: n,
                key,
            };
            let mut desc = desc;
            let imm = native_data.filter(|_| part + 1 == chunks);
            let msg = ffi::fi_msg_rma {
                msg_iov: &iov,
                desc: &mut desc,
                iov_count: 1,
                addr,
                rma_iov: &rma_iov,
                rma_iov_count: 1,
                context: ctx,
                data: imm.unwrap_or(0),
            };
            let mut flags = ffi::FI_COMPLETION as u64;
            if imm.is_some() {
                flags |= ffi::FI_REMOTE_CQ_DATA as u64;
            }
            // SAFETY: as above; the call reads `msg` and what it points at
            // during the call only.
            unsafe {
                if kind == OpKind::Read {
                    raw.readmsg(&msg, flags)
                } else {
                    flags |= write_flags;
                    raw.writemsg(&msg, flags)
                }
            }
        })
    }

    /// A u64 atomic on the peer's memory at `offset` (8-byte aligned). A
    /// fetched value comes back in [`Completion::value`](crate::Completion::value).
    ///
    /// [`Profile::atomic_carrier`](crate::Profile::atomic_carrier) says how
    /// each operation is carried: natively (what `fi_*atomicvalid`
    /// accepted, see [`Profile::atomics`](crate::Profile::atomics)), or
    /// emulated by fabric-msg where the provider has no atomics or lacks
    /// some. All atomics of one loop use one carrier, so they are atomic
    /// with respect to each other.
    ///
    /// **Emulated atomics need the target to make progress:** the target's
    /// loop applies a request while its application calls
    /// [`poll`](EventLoop::poll) (as with libfabric's manual progress, or
    /// MPI's active-target RMA). The operation completes when the target's
    /// reply arrives, or fails with
    /// [`TimedOut`](crate::CompletionError::TimedOut) after
    /// [`LoopConfig::rma_timeout`](crate::LoopConfig::rma_timeout). The
    /// target checks the key (a live region of its loop), bounds,
    /// alignment and access as a NIC would; a refused request completes
    /// here with [`CompletionError::Failed`](crate::CompletionError::Failed)
    /// (`FI_EKEYREJECTED`, `FI_EINVAL` or `FI_EACCES`) and the target's
    /// memory is untouched.
    pub fn atomic(
        &mut self,
        peer: &Peer,
        op: Atomic,
        remote: &RemoteMemory,
        offset: u64,
        token: Token,
    ) -> Result<()> {
        let carrier = self.domain.profile.atomic_carrier(op.kind());
        self.atomic_by(carrier, peer, op, remote, offset, token)
    }

    /// [`atomic`](Self::atomic) by a caller's `carrier` (`world/node_symmetric.rs`).
    pub(crate) fn atomic_by(
        &mut self,
        carrier: Option<AtomicCarrier>,
        peer: &Peer,
        op: Atomic,
        remote: &RemoteMemory,
        offset: u64,
        token: Token,
    ) -> Result<()> {
        let operation = op.kind();
        let (fi_op, _, kind) = operation.libfabric();
        let (operand, compare) = op.operands();
        remote.check(offset, 8, op.needs(), "atomic")?;
        let (addr0, _) = remote.target(offset);
        if addr0 % 8 != 0 {
            return Err(Error::Usage(format!(
                "atomic at offset {offset}: the target must be 8-byte aligned"
            )));
        }
        match carrier {
            Some(AtomicCarrier::Native) => {}
            Some(AtomicCarrier::Emulated) => {
                let req = AtomicRequest {
                    op: operation,
                    operand,
                    compare,
                };
                return self.atomic_emulated(peer, req, remote, offset, token);
            }
            None => {
                return Err(self.unsupported(&format!(
                    "{operation} atomics: fi_{}atomicvalid did not accept it, and fabric-msg does not \
                     emulate it here (ask for Capability::Atomic when negotiating: atomics are then carried \
                     natively or emulated on tagged RDM endpoints; AtomicPolicy::Native chooses a provider \
                     with native ones)",
                    if kind == AtomicForm::Plain {
                        ""
                    } else {
                        kind.name()
                    }
                )));
            }
        }
        self.lost.check(peer.endpoint.0, peer.addr)?;
        let ep = self.ep(peer.endpoint)?;
        let raw = ep.raw;
        if self.spare.atomic_scratch.is_none() {
            let entries = self.cq_capacity();
            let scratch = self.register_owned(entries * SCRATCH_ENTRY, Access::Read, false)?;
            self.spare.atomic_scratch = Some(scratch);
        }
        let scratch = self.spare.atomic_scratch.as_ref().expect("registered above");
        let entries = scratch.len() / SCRATCH_ENTRY;
        let (base, desc) = (scratch.inner.addr(0).cast::<u8>(), scratch.inner.desc);
        let (raddr, key) = remote.target(offset);
        let addr = peer.addr;
        let parts = Parts {
            endpoint: peer.endpoint,
            kind: OpKind::Atomic,
            token,
            count: 1,
            region: None,
            lease: None,
            atomic: kind != AtomicForm::Plain,
            last_buffer: None,
            peer: addr,
            call: match kind {
                AtomicForm::Plain => "fi_atomic",
                AtomicForm::Fetch => "fi_fetch_atomic",
                AtomicForm::Compare => "fi_compare_atomic",
            },
        };
        self.post_parts(parts, |_, index, ctx| {
            if index as usize >= entries {
                // More slots than the CQ holds cannot be in use; refuse
                // rather than write outside the scratch.
                return -(ffi::FI_EOVERFLOW as isize);
            }
            // SAFETY: the entry lies in the registered scratch (checked);
            // only the operation in this slot uses it, until its completion.
            unsafe {
                let e = base.add(index as usize * SCRATCH_ENTRY);
                let (opnd, cmp, res) = (e.cast::<u64>(), e.add(8).cast::<u64>(), e.add(16).cast::<u64>());
                ptr::write_unaligned(opnd, operand);
                ptr::write_unaligned(cmp, compare);
                ptr::write_unaligned(res, 0);
                let (opnd, cmp, res) = (opnd.cast::<c_void>(), cmp.cast::<c_void>(), res.cast::<c_void>());
                match kind {
                    AtomicForm::Plain => raw.atomic(opnd, desc, addr, raddr, key, fi_op, ctx),
                    AtomicForm::Fetch => raw.fetch_atomic(opnd, res, desc, addr, raddr, key, fi_op, ctx),
                    AtomicForm::Compare => {
                        raw.compare_atomic(opnd, cmp, res, desc, addr, raddr, key, fi_op, ctx)
                    }
                }
            }
        })
    }

    /// The value fetched by the atomic in slot `index`.
    pub(crate) fn atomic_result(&self, index: u32) -> u64 {
        let mut v = [0u8; 8];
        if let Some(s) = &self.spare.atomic_scratch {
            // In bounds: atomics are only posted on slots with an entry.
            let _ = s.read_at(index as usize * SCRATCH_ENTRY + 16, &mut v);
        }
        u64::from_ne_bytes(v)
    }

    fn require_cap(&self, cap: &str, what: &str) -> Result<()> {
        if self.domain.profile.caps_granted.iter().any(|c| c == cap) {
            Ok(())
        } else {
            Err(self.unsupported(what))
        }
    }

    fn same_domain(&self, local: Local<'_>) -> Result<()> {
        if local.region.same_domain(&self.domain) {
            Ok(())
        } else {
            Err(Error::Usage(
                "the local region was registered by another event loop: register it on this one".into(),
            ))
        }
    }

    fn unsupported(&self, what: &str) -> Error {
        Error::Unsupported {
            what: what.into(),
            provider: self.domain.profile.provider.clone(),
        }
    }

    /// The transmit side's message ordering (`FI_ORDER_*`).
    fn msg_order(&self) -> u64 {
        let tx = self.domain.info().get().tx_attr;
        if tx.is_null() {
            0
        } else {
            // SAFETY: the domain keeps its fi_info, and so tx_attr, alive.
            unsafe { (*tx).msg_order }
        }
    }
}
