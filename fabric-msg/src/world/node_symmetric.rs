//! Symmetric memory on the node is shared memory: where the World sends
//! same-node messages over its own node transport, each rank's part of a
//! [`Symmetric`](crate::Symmetric) lives in a `memfd` segment (`transport/node/segment.rs`)
//! that the other ranks of its node map, so a same-node `put` or `get` is
//! a copy and a same-node atomic is one CPU atomic instruction — no
//! provider, no message, no wait for the target (MPI's `osc/sm`).
//!
//! - **Allocation** (`symmetric.rs`): each rank creates its segment and
//!   registers the part inside it with the provider (peers on other nodes
//!   still reach it over the fabric), announces the segment's name in the
//!   allocation's first allgather, maps its same-node peers' parts, and
//!   says in one more allgather whether every mapping worked. Only if every
//!   rank mapped every same-node part does any rank use them ([`Mapping::agreed`]);
//!   otherwise every rank uses the provider for everything, as before.
//! - **One semantics for atomics.** All atomics on a region are atomic
//!   with respect to each other only if one mechanism applies them all. A
//!   same-node atomic is a CPU atomic on the mapping; an atomic from
//!   another node must then be applied by the target's CPU as well, which
//!   fabric-msg's emulated atomics are (`transport/event_loop/
//!   cpu_atomics.rs`; both use the same SeqCst instructions), and a NIC's
//!   or a provider's native atomics are not (they are atomic only with
//!   respect to each other). So parts are mapped only when the world is on
//!   one node (no atomic comes from elsewhere) or when its fabric's atomics
//!   are all emulated (`AtomicPolicy::Emulated`, or a provider without
//!   them); with native atomics across nodes, the provider carries every
//!   operation, same-node ones included ([`coherent`]), unless the
//!   allocation asks for the mapping ([`NodeSharing::Mapped`]): then every
//!   atomic on it from another node takes the emulated carrier, which
//!   every rank serves from then on, and the target's CPU applies it
//!   (Open MPI's `osc/rdma` has the same rule: CPU atomics only where the
//!   NIC's can be mixed with them, which libfabric 1.17 cannot say).
//! - **Visibility.** A same-node `put` is in place when the call returns,
//!   its words stored with relaxed atomic stores (`memory/copy.rs`); a
//!   peer sees them after any later message or collective from this rank,
//!   whose release and acquire order them, as it sees a completed
//!   fabric `put`'s.
//! - **Checks.** Every same-node operation is checked against the part's
//!   descriptor exactly as a fabric one is (bounds, the access the owner
//!   granted; atomics 8-byte aligned), with the same errors.
//!
//! [`Symmetric::on_node`](crate::Symmetric::on_node) gives a same-node part for direct use
//! (`MPI_Win_shared_query`): [`NodePart::load`], [`NodePart::store`] and
//! [`NodePart::atomic`] copy and operate word by word, without `unsafe`
//! for the caller and without a Rust reference into memory a peer may
//! change at any moment.

use super::collectives::ops::{bytes_of, bytes_of_mut, Element};
use crate::discovery::atomic::{AtomicCarrier, AtomicKind};
use crate::discovery::profile::Profile;
use crate::error::{Error, Result};
use crate::memory::access::Access;
use crate::memory::copy::{copy_in, copy_out};
use crate::memory::remote::RemoteMemory;
use crate::transport::event_loop::rma::Atomic;
use crate::transport::node::segment::{Segment, SegmentName, HEADER};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

/// Words of a segment name in the allocation's allgather: pid, fd, length,
/// cookie (all 0 where a rank has no segment).
pub(crate) const NAME_WORDS: usize = 4;

/// Whether a symmetric allocation maps the parts of the ranks that share a
/// node ([`World::alloc_symmetric_with`](crate::World::alloc_symmetric_with)).
/// Every rank passes the same; the mapping is used only where the node
/// transport is on and every rank of the World mapped every part of its
/// node ([`Symmetric::on_node`](crate::Symmetric::on_node) says whether).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum NodeSharing {
    /// Map where every atomic on the memory can be a CPU atomic as the
    /// fabric carries them: the World is on one node, or the fabric's
    /// atomics are emulated. With native atomics across nodes the
    /// provider carries every operation, same-node ones too, and other
    /// nodes' atomics are applied by the NIC whatever the target does.
    #[default]
    Auto,
    /// Map also where the fabric's atomics are native: atomics on this
    /// memory from other nodes are then emulated, applied by the target's
    /// CPU while it is in a World call or polls, so that they stay atomic
    /// with respect to the same-node CPU ones. For programs whose ranks
    /// call into the World often (a hash table serving its peers): a
    /// rank that computes for long without a World call holds other
    /// nodes' atomics on its part until it calls, and they fail with
    /// `TimedOut` past the loop's `rma_timeout`. Where atomics cannot be
    /// emulated (no `Capability::Atomic`, or a fabric without tagged RDM
    /// endpoints) it is `Auto`, with a warning.
    Mapped,
    /// Never map: the provider carries every operation.
    Never,
}

impl NodeSharing {
    /// Its word in the allocation's allgather.
    pub(crate) fn code(self) -> u64 {
        match self {
            NodeSharing::Auto => 0,
            NodeSharing::Mapped => 1,
            NodeSharing::Never => 2,
        }
    }

    /// The name of an allgather word, as a rank reads another's.
    pub(crate) fn name_of(code: u64) -> String {
        match code {
            0 => "NodeSharing::Auto".into(),
            1 => "NodeSharing::Mapped".into(),
            2 => "NodeSharing::Never".into(),
            other => format!("an unknown NodeSharing ({other})"),
        }
    }
}

/// Whether same-node CPU atomics can be atomic with respect to every other
/// atomic on the region: the world is on one node, or no atomic from
/// another node is native.
pub(crate) fn coherent(profile: &Profile, one_node: bool) -> bool {
    one_node
        || AtomicKind::ALL
            .iter()
            .all(|&k| profile.atomic_carrier(k) != Some(AtomicCarrier::Native))
}

/// How an allocation's same-node parts are reached, from what it asked
/// for and what the fabric carries: `None` through the provider alone;
/// `Some(false)` mapped, atomics as the fabric carries them; `Some(true)`
/// mapped, with every atomic that goes through the provider emulated.
/// The same on every rank of a World: its profile, its placement and the
/// allocation's `sharing` (checked) are.
pub(crate) fn plan(sharing: NodeSharing, profile: &Profile, one_node: bool) -> Option<bool> {
    let coherent = coherent(profile, one_node);
    match sharing {
        NodeSharing::Never => None,
        _ if coherent => Some(false),
        NodeSharing::Auto => None,
        NodeSharing::Mapped if profile.can_emulate_atomics() => Some(true),
        NodeSharing::Mapped => {
            log::warn!(
                "symmetric memory: NodeSharing::Mapped asked for, but atomics cannot be emulated on {} \
                 (Profile::can_emulate_atomics): same-node parts are not mapped",
                profile.provider
            );
            None
        }
    }
}

/// This rank's new part: a segment with `len` zeroed bytes after its
/// header.
pub(crate) fn create_part(len: usize) -> Result<Arc<Segment>> {
    Segment::create(HEADER + len.max(1)).map(Arc::new)
}

/// A byte offset into a mapped part as an address offset (every offset
/// fits on the 64-bit machines fabric-msg runs on; the part's bounds are
/// checked after).
pub(crate) fn near(offset: u64) -> Result<usize> {
    usize::try_from(offset).map_err(|_| Error::OutOfBounds {
        what: "peer's memory",
        offset,
        len: 0,
        size: usize::MAX as u64,
    })
}

/// A segment's name as allgather words.
pub(crate) fn name_words(seg: Option<&Segment>) -> [u64; NAME_WORDS] {
    match seg.map(Segment::name) {
        Some(n) => [u64::from(n.pid), n.fd as u64, n.len, n.cookie],
        None => [0; NAME_WORDS],
    }
}

/// A segment name from allgather words (`None`: the rank has none).
pub(crate) fn name_of(w: &[u64]) -> Option<SegmentName> {
    if w.iter().all(|&x| x == 0) {
        return None;
    }
    Some(SegmentName {
        pid: u32::try_from(w[0]).unwrap_or(u32::MAX),
        fd: i32::try_from(w[1]).unwrap_or(-1),
        len: w[2],
        cookie: w[3],
    })
}

/// The same-node parts of one symmetric allocation, by rank (this rank's
/// own included); empty when the parts are not used.
#[derive(Debug, Default)]
pub(crate) struct Mapping {
    parts: Vec<Option<Arc<Segment>>>,
    /// Atomics that go through the provider take the emulated carrier
    /// (`plan`'s `Some(true)`).
    emulated: bool,
}

impl Mapping {
    /// A mapping every rank agreed to use; `emulated` as `plan` said.
    pub(crate) fn agreed(parts: Vec<Option<Arc<Segment>>>, emulated: bool) -> Mapping {
        Mapping { parts, emulated }
    }

    /// The carrier of an atomic on this memory that goes through the
    /// provider: the fabric's own (`None`), or the emulated one where the
    /// parts are mapped across native atomics.
    pub(crate) fn carrier(&self, profile: &Profile, op: AtomicKind) -> Option<AtomicCarrier> {
        if self.emulated {
            Some(AtomicCarrier::Emulated)
        } else {
            profile.atomic_carrier(op)
        }
    }

    /// `rank`'s mapped part, if it is on this node and the parts are used.
    pub(crate) fn get(&self, rank: u32) -> Option<&Segment> {
        self.parts.get(rank as usize)?.as_deref()
    }
}

/// A same-node rank's part of symmetric memory, mapped into this process
/// ([`Symmetric::on_node`](crate::Symmetric::on_node)). Every access is checked against the part's
/// descriptor as a fabric operation is, and copies or operates word by
/// word: a peer may change the memory at any moment.
#[derive(Debug, Clone, Copy)]
pub struct NodePart<'a> {
    seg: &'a Segment,
    remote: &'a RemoteMemory,
    rank: u32,
}

impl<'a> NodePart<'a> {
    pub(crate) fn new(seg: &'a Segment, remote: &'a RemoteMemory, rank: u32) -> NodePart<'a> {
        NodePart { seg, remote, rank }
    }

    /// The rank whose part this is.
    pub fn rank(&self) -> u32 {
        self.rank
    }

    /// Bytes in the part.
    pub fn len(&self) -> usize {
        self.remote.len() as usize
    }

    /// Whether the part has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Copy `out.len()` elements from byte `offset` of the part (the
    /// owner must have granted read access).
    pub fn load<T: Element>(&self, offset: usize, out: &mut [T]) -> Result<()> {
        self.load_bytes(offset, bytes_of_mut(out))
    }

    /// Copy `data` to byte `offset` of the part (the owner must have
    /// granted write access).
    pub fn store<T: Element>(&self, offset: usize, data: &[T]) -> Result<()> {
        self.store_bytes(offset, bytes_of(data))
    }

    /// Apply `op` to the u64 at byte `offset` (8-byte aligned) with one CPU
    /// atomic instruction, and return the value it had before.
    pub fn atomic(&self, op: Atomic, offset: usize) -> Result<u64> {
        let p = self.at(offset, 8, op.needs(), "atomic")?;
        if p as usize % 8 != 0 {
            return Err(Error::Usage(format!(
                "atomic at byte {offset} of rank {}'s part: atomics need an 8-byte aligned offset",
                self.rank
            )));
        }
        // SAFETY: the 8 bytes lie inside the mapping (checked by `at`), are
        // aligned (just checked), and the mapping lives as long as `self`'s
        // borrow of the `Symmetric`; every process reaches these words only
        // through atomics (CPU ones here and in the emulation, relaxed
        // atomic copies in `memory/copy.rs`) or its NIC.
        let w = unsafe { AtomicU64::from_ptr(p.cast::<u64>()) };
        Ok(op.apply_to(w))
    }

    /// Check `len` bytes at `offset` for `operation` as the fabric would.
    pub(crate) fn check(
        &self,
        offset: usize,
        len: usize,
        needs: Access,
        operation: &'static str,
    ) -> Result<()> {
        self.remote.check(offset as u64, len as u64, needs, operation)
    }

    pub(crate) fn load_bytes(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        let p = self.at(offset, out.len(), Access::Read, "read")?;
        // SAFETY: `p..p + out.len()` lies inside the mapping (checked),
        // which outlives this call; `out` is this process's own memory.
        unsafe { copy_out(p, out) };
        Ok(())
    }

    pub(crate) fn store_bytes(&self, offset: usize, bytes: &[u8]) -> Result<()> {
        let p = self.at(offset, bytes.len(), Access::Write, "write")?;
        // SAFETY: as in `load_bytes`.
        unsafe { copy_in(p, bytes) };
        Ok(())
    }

    /// The address of `len` bytes at `offset`, checked as the fabric's
    /// operation would be.
    fn at(&self, offset: usize, len: usize, needs: Access, operation: &'static str) -> Result<*mut u8> {
        self.check(offset, len, needs, operation)?;
        Ok(self.seg.at(HEADER + offset, len).as_ptr())
    }
}
