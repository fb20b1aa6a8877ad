//! Pre-registered memory cut into equal slots, and the lease that returns
//! a slot once both its user and the operation using it let go.

use crate::error::{Error, Result};
use crate::memory::access::Access;
use crate::memory::lease::Lease;
use crate::memory::mr::{Local, MemoryRegion, RegionInner};
use crate::memory::remote::RemoteMemory;
use parking_lot::Mutex;
use std::fmt;
use std::sync::Arc;

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
