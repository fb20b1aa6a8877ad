//! Symmetric memory: a region every rank registers with the same length in
//! one collective call, after which each rank holds every other rank's
//! descriptor, so one-sided operations name a (rank, offset) and need no
//! exchange by the application (OpenSHMEM's `shmem_malloc`, MPI's
//! `MPI_Win_allocate`).
//!
//! ```no_run
//! use fabric_msg::{Access, Atomic, Token, World};
//! let mut world = World::init()?;
//! let (rank, size) = (world.rank(), world.size());
//! let mem = world.alloc_symmetric(4096, Access::ReadWrite)?;
//! mem.region().write_at(0, &rank.to_le_bytes())?;
//! let scratch = world.event_loop().register(8, Access::Read)?;
//! world.barrier()?;
//! world.read((rank + 1) % size, scratch.local(0, 4)?, &mem, 0, Token(1))?;
//! world.atomic(0, Atomic::FetchAdd(1), &mem, 8, Token(2))?;
//! // ... World::poll until both complete ...
//! world.barrier()?;
//! world.free_symmetric(mem).map_err(|(_, e)| e)?;
//! # Ok::<(), fabric_msg::Error>(())
//! ```
//!
//! The exchange is two allgathers: first what each rank registered (its
//! length, access, whether registration worked and how long its
//! descriptor is), so that a rank whose registration failed or whose length
//! differs makes every rank fail alike instead of some waiting; then the
//! descriptors, each checked and imported (`EventLoop::import`) as one from
//! any peer would be.

use super::node_symmetric::{self, near, Mapping, NodePart, NodeSharing, NAME_WORDS};
use super::World;
use crate::discovery::atomic::AtomicCarrier;
use crate::discovery::profile::Profile;
use crate::error::{Error, Result};
use crate::memory::access::Access;
use crate::memory::mr::{Local, MemoryRegion};
use crate::memory::remote::{RemoteMemory, MAX_REMOTE_MEMORY};
use crate::transport::event_loop::rma::Atomic;
use crate::transport::event_loop::{Completion, EventLoop, OpKind, Peer, Token};
use crate::transport::node::segment::{Segment, HEADER};
use std::sync::Arc;

/// The allgather of what each rank registered: length, access, status,
/// descriptor length, the sharing it asked for, and its part's segment
/// name (`node_symmetric.rs`) from word [`NAME_AT`] on.
const SUMMARY: usize = NAME_AT + NAME_WORDS;
const NAME_AT: usize = 5;
const OK: u64 = 0;
const FAILED: u64 = 1;
/// Bytes a same-node write or read of the token interface copies at a time
/// (through the stack: no allocation per operation).
const COPY_CHUNK: usize = 4096;

/// Memory registered by every rank of a [`World`] with the same length,
/// with each rank's descriptor ([`World::alloc_symmetric`]).
#[derive(Debug)]
pub struct Symmetric {
    region: MemoryRegion,
    /// Every rank's part, by rank (this rank's own too).
    parts: Vec<RemoteMemory>,
    /// The same-node parts mapped here, if every rank agreed to use them.
    mapping: Mapping,
}

impl Symmetric {
    /// Bytes in each rank's part.
    pub fn len(&self) -> usize {
        self.region.len()
    }

    /// Whether the parts have no bytes.
    pub fn is_empty(&self) -> bool {
        self.region.is_empty()
    }

    /// This rank's part, for local reads and writes and as the local side
    /// of operations.
    pub fn region(&self) -> &MemoryRegion {
        &self.region
    }

    /// `rank`'s part as its peers name it (`None` past the world's size).
    pub fn remote(&self, rank: u32) -> Option<&RemoteMemory> {
        self.parts.get(rank as usize)
    }

    /// `rank`'s part mapped into this process, if `rank` shares this node
    /// and the World maps symmetric memory (the node transport is on, and
    /// atomics can be made coherent; see `docs/onnode.md`). `None`
    /// otherwise: then reach it with [`World::get`](crate::World::get) and
    /// the other one-sided operations, which work everywhere.
    ///
    /// ```no_run
    /// use fabric_msg::{Access, Atomic, World};
    /// let mut world = World::init()?;
    /// let mem = world.alloc_symmetric(4096, Access::ReadWrite)?;
    /// if let Some(peer) = mem.on_node(0) {
    ///     let ticket = peer.atomic(Atomic::FetchAdd(1), 0)?; // a CPU atomic on rank 0's part
    ///     let mut row = [0.0f64; 4];
    ///     peer.load(64, &mut row)?;
    ///     # let _ = ticket;
    /// }
    /// # Ok::<(), fabric_msg::Error>(())
    /// ```
    pub fn on_node(&self, rank: u32) -> Option<NodePart<'_>> {
        Some(NodePart::new(self.mapping.get(rank)?, self.remote(rank)?, rank))
    }

    /// How an atomic `op` on this memory that goes through the provider
    /// is carried (`node_symmetric.rs`).
    pub(crate) fn carrier(&self, profile: &Profile, op: Atomic) -> Option<AtomicCarrier> {
        self.mapping.carrier(profile, op.kind())
    }
}

const ACCESS: [Access; 3] = [Access::Read, Access::Write, Access::ReadWrite];

fn access_code(a: Access) -> u64 {
    ACCESS.iter().position(|&x| x == a).unwrap_or(0) as u64
}

fn access_name(code: u64) -> String {
    ACCESS
        .get(code as usize)
        .map_or(format!("unknown access {code}"), |a| format!("{a:?}"))
}

impl World {
    /// Register `len` zeroed bytes on every rank, readable and writable by
    /// the others as `access` says, and learn every rank's descriptor.
    /// Collective: every rank calls it, in the same order as the other
    /// collectives, with the same `len` and `access`; a rank whose
    /// registration fails, or that passes something else, makes every rank
    /// fail with the reason. Same-node parts are mapped as
    /// [`NodeSharing::Auto`] says.
    pub fn alloc_symmetric(&mut self, len: usize, access: Access) -> Result<Symmetric> {
        self.alloc_symmetric_with(len, access, NodeSharing::Auto)
    }

    /// [`World::alloc_symmetric`], with the same-node parts mapped as
    /// `sharing` says (the same on every rank, or every rank fails with the
    /// reason). [`NodeSharing::Mapped`] maps them also where the fabric's
    /// atomics are native, and then carries this memory's atomics from
    /// other nodes emulated: see there for what that asks of the ranks.
    pub fn alloc_symmetric_with(
        &mut self,
        len: usize,
        access: Access,
        sharing: NodeSharing,
    ) -> Result<Symmetric> {
        let size = self.size();
        let plan = self.node_plan(sharing);
        let own = plan.and_then(|_| self.own_part(len));
        let mut registered = match &own {
            // SAFETY: the part's bytes lie inside the segment's mapping,
            // which lives as long as the `Arc` the region keeps.
            Some(seg) => unsafe {
                self.ev
                    .register_kept(seg.at(HEADER, len), len, access, seg.clone())
            },
            None => self.ev.register(len, access),
        };
        let encoded = match &registered {
            Ok(region) => region.remote().encode(),
            Err(_) => Vec::new(),
        };
        if encoded.len() > MAX_REMOTE_MEMORY {
            registered = Err(Error::Encoding(format!(
                "this rank's descriptor is {} bytes, more than the {MAX_REMOTE_MEMORY} a peer accepts",
                encoded.len()
            )));
        }
        if own.is_some() && plan == Some(true) {
            // Other nodes' atomics on this memory come as emulated requests
            // from now on: serve them before any rank can send one (after
            // the allgathers below).
            registered = registered.and_then(|r| self.ev.serve_emulated_atomics(self.ep).map(|()| r));
        }
        let status = if registered.is_ok() { OK } else { FAILED };
        let mut mine = vec![
            len as u64,
            access_code(access),
            status,
            encoded.len() as u64,
            sharing.code(),
        ];
        mine.extend(node_symmetric::name_words(own.as_deref()));
        let req = self.iallgatherv(mine, &vec![SUMMARY; size as usize])?;
        let seq = req.number().unwrap_or_default();
        let summary = self.wait(req)?;
        let me = self.rank();
        let fail = |message: String| Error::Collective {
            operation: "alloc_symmetric",
            seq,
            rank: me,
            message,
        };
        // This rank's own failure first, with its own words.
        let region = registered?;
        for (r, s) in summary.chunks_exact(SUMMARY).enumerate() {
            if s[2] != OK {
                return Err(fail(format!(
                    "rank {r} could not register {len} bytes (its own error says why)"
                )));
            }
            if s[0] != len as u64 || s[1] != access_code(access) || s[4] != sharing.code() {
                return Err(fail(format!(
                    "rank {r} asked for {} bytes with {} access and {}, this rank for {len} bytes with \
                     {access:?} access and {}: every rank must pass the same length, access and sharing",
                    s[0],
                    access_name(s[1]),
                    NodeSharing::name_of(s[4]),
                    NodeSharing::name_of(sharing.code()),
                )));
            }
            if s[3] == 0 || s[3] > MAX_REMOTE_MEMORY as u64 {
                return Err(fail(format!("rank {r} announced a descriptor of {} bytes", s[3])));
            }
        }
        let counts: Vec<usize> = summary.chunks_exact(SUMMARY).map(|s| s[3] as usize).collect();
        let all = self.allgatherv(&encoded, &counts)?;
        let mut parts = Vec::with_capacity(size as usize);
        let mut at = 0;
        for (r, &n) in counts.iter().enumerate() {
            let bytes = &all[at..at + n];
            at += n;
            let part = self
                .ev
                .import(bytes)
                .map_err(|e| fail(format!("rank {r}'s descriptor was refused: {e}")))?;
            if part.len() != len as u64 || part.access() != access {
                return Err(fail(format!(
                    "rank {r}'s descriptor covers {} bytes with {:?}, not the {len} bytes with {access:?} it announced",
                    part.len(),
                    part.access()
                )));
            }
            parts.push(part);
        }
        let mapping = self.map_parts(&summary, own, len, plan == Some(true))?;
        Ok(Symmetric {
            region,
            parts,
            mapping,
        })
    }

    /// Whether an allocation with `sharing` maps same-node parts, and
    /// whether its atomics through the provider are then emulated
    /// (`node_symmetric::plan`); `None` where the node transport is off.
    fn node_plan(&self, sharing: NodeSharing) -> Option<bool> {
        let local = self.local.as_ref().filter(|l| l.is_node())?;
        node_symmetric::plan(sharing, self.profile(), local.carries_all())
    }

    /// This rank's part in a segment of its own, where same-node parts are
    /// to be mapped (`node_plan` said so); `None` for a registered heap
    /// part.
    fn own_part(&self, len: usize) -> Option<Arc<Segment>> {
        if len == 0 {
            return None;
        }
        node_symmetric::create_part(len)
            .inspect_err(|e| log::warn!("symmetric memory: no shared segment for this rank's part ({e}); same-node operations go through the provider"))
            .ok()
    }

    /// Map the parts of the ranks the node transport carries (those that
    /// share this node) from their names in `summary`, then
    /// agree: the mapping is used only if every rank has mapped every part
    /// of its node, so that no atomic goes through the CPU on one rank and
    /// the provider on another. `emulated`: the provider's atomics on
    /// mapped memory are emulated (`node_symmetric::plan`).
    fn map_parts(
        &mut self,
        summary: &[u64],
        own: Option<Arc<Segment>>,
        len: usize,
        emulated: bool,
    ) -> Result<Mapping> {
        let (me, size) = (self.rank(), self.size() as usize);
        let mut parts: Vec<Option<Arc<Segment>>> = vec![None; size];
        let mut mapped = own.is_some();
        parts[me as usize] = own;
        let node = self.local.as_ref().map_or(Vec::new(), |l| l.ranks());
        for r in node {
            if !mapped {
                break;
            }
            let words = &summary[r as usize * SUMMARY + NAME_AT..(r as usize + 1) * SUMMARY];
            let attached = match node_symmetric::name_of(words) {
                None => Err("it has no shared segment".to_string()),
                Some(n) if n.len != (HEADER + len.max(1)) as u64 => Err(format!(
                    "its segment is {} bytes, not {}",
                    n.len,
                    HEADER + len.max(1)
                )),
                Some(n) => Segment::attach(&n).map_err(|e| e.to_string()),
            };
            match attached {
                Ok(seg) => parts[r as usize] = Some(Arc::new(seg)),
                Err(why) => {
                    log::warn!("symmetric memory: rank {r}'s part is not mapped here ({why}); the provider carries it");
                    mapped = false;
                }
            }
        }
        let all = self.allgather(&[u8::from(mapped)])?;
        Ok(if all.iter().all(|&m| m == 1) {
            Mapping::agreed(parts, emulated)
        } else {
            Mapping::default()
        })
    }

    /// Free symmetric memory on every rank. Collective: it returns once
    /// every rank has called it, so no rank frees its part while another
    /// may still reach it. Complete (poll for) this rank's operations on
    /// the memory first: if any rank still has operations using its part
    /// as their local side, every rank gets its memory back with the
    /// reason, and may free it again later.
    #[allow(clippy::result_large_err)]
    pub fn free_symmetric(&mut self, mem: Symmetric) -> std::result::Result<(), (Symmetric, Error)> {
        if mem.parts.len() != self.size() as usize {
            let e = Error::Usage(format!(
                "free_symmetric: the memory has parts for {} ranks, this world has {}",
                mem.parts.len(),
                self.size()
            ));
            return Err((mem, e));
        }
        let busy = mem.region.in_flight() as u64;
        let req = match self.iallgatherv(vec![busy], &vec![1; self.size() as usize]) {
            Ok(r) => r,
            Err(e) => return Err((mem, e)),
        };
        let seq = req.number().unwrap_or_default();
        let all = match self.wait(req) {
            Ok(all) => all,
            Err(e) => return Err((mem, e)),
        };
        if let Some((r, &n)) = all.iter().enumerate().find(|(_, &n)| n > 0) {
            let e = Error::Collective {
                operation: "free_symmetric",
                seq,
                rank: r as u32,
                message: format!(
                    "rank {r} still has {n} operation(s) using its part: poll for their completions, then free"
                ),
            };
            return Err((mem, e));
        }
        let Symmetric {
            region,
            parts,
            mapping,
        } = mem;
        region.close().map_err(|(region, e)| {
            let mem = Symmetric {
                region,
                parts,
                mapping,
            };
            (mem, e)
        })
    }

    /// Write `local` into `rank`'s part of `mem` at `offset`; its completion
    /// (`OpKind::Write`) comes from [`World::poll`] with `token`. The verbs
    /// and the order of arguments are the event loop's
    /// ([`EventLoop::write`](crate::transport::event_loop::EventLoop::write)):
    /// the target, the local memory, the remote memory, the offset in it.
    pub fn write(
        &mut self,
        rank: u32,
        local: Local<'_>,
        mem: &Symmetric,
        offset: u64,
        token: Token,
    ) -> Result<()> {
        super::point_to_point::check_token(token)?;
        if let Some(part) = mem.on_node(rank) {
            let at = near(offset)?;
            part.check(at, local.len, Access::Write, "write")?;
            let mut chunk = [0u8; COPY_CHUNK];
            for start in (0..local.len).step_by(COPY_CHUNK) {
                let n = COPY_CHUNK.min(local.len - start);
                local.region.read_at(local.offset + start, &mut chunk[..n])?;
                part.store_bytes(at + start, &chunk[..n])?;
            }
            self.done_near(token, OpKind::Write, None);
            return Ok(());
        }
        self.one_sided(mem, rank, |ev, peer, remote| {
            ev.write(peer, local, remote, offset, token)
        })
    }

    /// Read `local.len()` bytes of `rank`'s part of `mem` at `offset` into
    /// `local` (`OpKind::Read`).
    pub fn read(
        &mut self,
        rank: u32,
        local: Local<'_>,
        mem: &Symmetric,
        offset: u64,
        token: Token,
    ) -> Result<()> {
        super::point_to_point::check_token(token)?;
        if let Some(part) = mem.on_node(rank) {
            let at = near(offset)?;
            part.check(at, local.len, Access::Read, "read")?;
            let mut chunk = [0u8; COPY_CHUNK];
            for start in (0..local.len).step_by(COPY_CHUNK) {
                let n = COPY_CHUNK.min(local.len - start);
                part.load_bytes(at + start, &mut chunk[..n])?;
                local.region.write_at(local.offset + start, &chunk[..n])?;
            }
            self.done_near(token, OpKind::Read, None);
            return Ok(());
        }
        self.one_sided(mem, rank, |ev, peer, remote| {
            ev.read(peer, local, remote, offset, token)
        })
    }

    /// A u64 atomic on `rank`'s part of `mem` at `offset` (8-byte aligned);
    /// a fetched value comes back in the completion's `value`.
    pub fn atomic(
        &mut self,
        rank: u32,
        op: Atomic,
        mem: &Symmetric,
        offset: u64,
        token: Token,
    ) -> Result<()> {
        super::point_to_point::check_token(token)?;
        if let Some(part) = mem.on_node(rank) {
            let old = part.atomic(op, near(offset)?)?;
            self.done_near(token, OpKind::Atomic, op.kind().fetches().then_some(old));
            return Ok(());
        }
        let carrier = mem.carrier(self.profile(), op);
        self.one_sided(mem, rank, |ev, peer, remote| {
            ev.atomic_by(carrier, peer, op, remote, offset, token)
        })
    }

    /// Post one operation on `rank`'s part, checked first (any token: the
    /// World's own requests post here too, `one_sided.rs`); a refusal while
    /// a rank is being lost is that loss.
    pub(super) fn one_sided(
        &mut self,
        mem: &Symmetric,
        rank: u32,
        post: impl FnOnce(&mut EventLoop, &Peer, &RemoteMemory) -> Result<()>,
    ) -> Result<()> {
        let _call = self.live.call();
        let remote = self.part(mem, rank)?;
        let r = post(&mut self.ev, &self.peers[rank as usize], remote);
        r.map_err(|e| self.live.first_lost().map_or(e, |r| self.lost(r)))
    }

    /// The completion of a same-node operation done on mapped memory,
    /// handed out by the next [`World::poll`] as the provider's would be.
    fn done_near(&mut self, token: Token, kind: OpKind, value: Option<u64>) {
        let mut c = Completion::outcome(token, self.ep.0, kind, Ok(()));
        c.value = value;
        self.coll.kept_mut().push(c);
    }

    fn part<'m>(&self, mem: &'m Symmetric, rank: u32) -> Result<&'m RemoteMemory> {
        self.check_rank(rank)?;
        if mem.parts.len() != self.size() as usize {
            return Err(Error::Usage(format!(
                "symmetric memory of a world of {} ranks used in one of {}",
                mem.parts.len(),
                self.size()
            )));
        }
        Ok(&mem.parts[rank as usize])
    }
}
