//! One-sided operations on symmetric memory in the programming model:
//! [`World::put`], [`World::get`] and [`World::fetch_atomic`] return a
//! [`Request`] like every other non-blocking operation, [`World::flush`]
//! and [`World::flush_all`] wait for what this rank started, and
//! [`Symmetric::load`] / [`Symmetric::store`] read and write one's own part
//! as elements.
//!
//! ```no_run
//! use fabric_msg::{Access, Atomic, World};
//! let mut world = World::init()?;
//! let (rank, size) = (world.rank(), world.size());
//! let mem = world.alloc_symmetric(4096, Access::ReadWrite)?;
//! let right = (rank + 1) % size;
//! let put = world.put(right, &mem, 0, &[rank as f64; 8])?;
//! let count = world.fetch_atomic(0, Atomic::FetchAdd(1), &mem, 64)?;
//! world.wait(put)?;                        // in place at `right`
//! let before = world.wait(count)?[0];      // rank 0's counter before this add
//! world.barrier()?;                        // every rank's puts are in place
//! let mut from_left = [0.0f64; 8];
//! mem.load(0, &mut from_left)?;
//! let req = world.get::<f64>(right, &mem, 0, 8)?;
//! let got = world.wait(req)?;              // what this rank put there
//! # let _ = (before, got);
//! # Ok::<(), fabric_msg::Error>(())
//! ```
//!
//! **When data is visible.** A put's request finishes when its bytes are
//! in place in the target's memory (`FI_DELIVERY_COMPLETE`); a get's when
//! the bytes are here; an atomic's when it was applied, with the value it
//! replaced. The target learns of it only through a later message or
//! collective (a barrier after `flush_all`, as MPI's `Win_flush_all` then
//! `Barrier`). Progress: this rank's operations move whenever it waits,
//! tests or polls; the target needs no call on fabrics that carry RMA and
//! atomics in hardware or in the provider's own thread, and on the others
//! the World runs a progress thread for it (`docs/world.md`, "Waiting").
//!
//! **Memory.** Each operation goes through registered scratch memory of the
//! World's (a put copies `data` in when posted, so the slice is free at
//! once; a get copies out when waited for), reused once the operation
//! completes; dropping a request never frees memory the NIC may still use:
//! the scratch lives until the operation's completion, which still comes.
//! **Own part.** No `&[T]` into symmetric memory is ever handed out: a peer
//! may write it at any moment, and a Rust reference to memory that changes
//! under it is undefined behaviour. `load` and `store` copy word by word
//! (each word atomic: a reader sees a peer's word whole, old or new).

use super::collectives::ops::{bytes_of, bytes_of_mut, Element};
use super::messages::Ticket;
use super::node_symmetric::near;
use super::request::{Of, Request, Status};
use super::symmetric::Symmetric;
use super::World;
use crate::error::{Error, Result};
use crate::memory::mr::MemoryRegion;
use crate::transport::event_loop::rma::Atomic;
use crate::transport::event_loop::Completion;

impl Symmetric {
    /// Copy `out.len()` elements of this rank's part, from byte `offset`.
    pub fn load<T: Element>(&self, offset: usize, out: &mut [T]) -> Result<()> {
        self.region().read_at(offset, bytes_of_mut(out))
    }

    /// Copy `data` into this rank's part at byte `offset`.
    pub fn store<T: Element>(&self, offset: usize, data: &[T]) -> Result<()> {
        self.region().write_at(offset, bytes_of(data))
    }
}

impl World {
    /// Start writing `data` into `rank`'s part of `mem` at byte `offset`:
    /// the request finishes when the bytes are in place there.
    pub fn put<T: Element>(
        &mut self,
        rank: u32,
        mem: &Symmetric,
        offset: u64,
        data: &[T],
    ) -> Result<Request<T>> {
        if let Some(part) = mem.on_node(rank) {
            part.store_bytes(near(offset)?, bytes_of(data))?;
            return Ok(ready("put", Vec::new(), rank));
        }
        let scratch = self.scratch(std::mem::size_of_val(data))?;
        scratch.write_at(0, bytes_of(data))?;
        let ticket = self.msgs.open(false);
        let local = scratch.local(0, std::mem::size_of_val(data))?;
        let token = ticket.token();
        let posted = self.one_sided(mem, rank, |ev, peer, remote| {
            ev.write(peer, local, remote, offset, token)
        });
        self.started("put", ticket, rank, Some(scratch), 0, posted)
    }

    /// Start reading `count` elements of `rank`'s part of `mem` from byte
    /// `offset`: [`World::wait`] gives them.
    pub fn get<T: Element>(
        &mut self,
        rank: u32,
        mem: &Symmetric,
        offset: u64,
        count: usize,
    ) -> Result<Request<T>> {
        if let Some(part) = mem.on_node(rank) {
            let mut v = vec![T::ZERO; count];
            part.load(near(offset)?, &mut v)?;
            return Ok(ready("get", v, rank));
        }
        let bytes = count
            .checked_mul(T::SIZE)
            .ok_or_else(|| Error::Usage(format!("get: {count} elements")))?;
        let scratch = self.scratch(bytes)?;
        let ticket = self.msgs.open(false);
        let local = scratch.local(0, bytes)?;
        let token = ticket.token();
        let posted = self.one_sided(mem, rank, |ev, peer, remote| {
            ev.read(peer, local, remote, offset, token)
        });
        self.started("get", ticket, rank, Some(scratch), count, posted)
    }

    /// Start a u64 atomic on `rank`'s part of `mem` at byte `offset` (8-byte
    /// aligned): [`World::wait`] gives the value it replaced (one element).
    pub fn fetch_atomic(
        &mut self,
        rank: u32,
        op: Atomic,
        mem: &Symmetric,
        offset: u64,
    ) -> Result<Request<u64>> {
        if let Some(part) = mem.on_node(rank) {
            let old = part.atomic(op, near(offset)?)?;
            return Ok(ready("fetch_atomic", vec![old], rank));
        }
        let ticket = self.msgs.open(false);
        let token = ticket.token();
        let carrier = mem.carrier(self.profile(), op);
        let posted = self.one_sided(mem, rank, |ev, peer, remote| {
            ev.atomic_by(carrier, peer, op, remote, offset, token)
        });
        self.started("fetch_atomic", ticket, rank, None, 1, posted)
    }

    /// Wait until every one-sided operation this rank started on `rank`
    /// through requests has finished (dropped requests too); their
    /// results stay with their requests.
    pub fn flush(&mut self, rank: u32) -> Result<()> {
        self.check_rank(rank)?;
        self.flush_where(|r| r == rank)
    }

    /// [`World::flush`] for every rank.
    pub fn flush_all(&mut self) -> Result<()> {
        self.flush_where(|_| true)
    }

    fn flush_where(&mut self, target: impl Fn(u32) -> bool) -> Result<()> {
        let _call = self.live.call();
        loop {
            if !self.one_sided.any_to(&target, &self.msgs) {
                return Ok(());
            }
            self.turn(true)?;
        }
    }

    /// Registered scratch memory of at least `len` bytes: a kept region,
    /// or a new one (a power of two, at least 4 KiB).
    fn scratch(&mut self, len: usize) -> Result<MemoryRegion> {
        match self.one_sided.take(len) {
            Some(r) => Ok(r),
            None => self.ev.register_local(len.max(4096).next_power_of_two()),
        }
    }

    /// The request of an operation just posted (or its error, with its
    /// ticket and scratch given back).
    fn started<T: Element>(
        &mut self,
        what: &'static str,
        ticket: Ticket,
        rank: u32,
        scratch: Option<MemoryRegion>,
        count: usize,
        posted: Result<()>,
    ) -> Result<Request<T>> {
        if let Err(e) = posted {
            self.msgs.unpost(ticket);
            if let Some(s) = scratch {
                self.one_sided.keep(s);
            }
            return Err(e);
        }
        self.one_sided.started(ticket, rank, &self.msgs);
        Ok(Request {
            what,
            of: Of::OneSided {
                ticket,
                scratch,
                count,
                rank,
                abandoned: self.msgs.abandoned(),
            },
        })
    }

    /// A finished one-sided operation's result: a get's elements, an
    /// atomic's old value, nothing for a put.
    pub(super) fn one_sided_result<T: Element>(
        &mut self,
        what: &'static str,
        c: Completion,
        scratch: Option<MemoryRegion>,
        count: usize,
        rank: u32,
    ) -> Result<(Vec<T>, Status)> {
        let status = Status {
            source: rank,
            tag: 0,
            count,
        };
        let out = match c.result {
            Err(e) => Err(self.live.first_lost().map_or_else(
                || Error::Message {
                    operation: what,
                    peer: format!("on rank {rank}"),
                    message: e.to_string(),
                },
                |r| self.lost(r),
            )),
            Ok(()) => match (&scratch, c.value) {
                (_, Some(v)) => Ok((one_value::<T>(v), status)),
                (Some(s), None) if count > 0 => {
                    let mut v = vec![T::ZERO; count];
                    s.read_at(0, bytes_of_mut(&mut v)).map(|()| (v, status))
                }
                _ => Ok((Vec::new(), Status { count: 0, ..status })),
            },
        };
        if let Some(s) = scratch {
            self.one_sided.keep(s);
        }
        out
    }
}

/// The request of a same-node operation done on mapped memory
/// (`node_symmetric.rs`): finished, with its result.
fn ready<T: Element>(what: &'static str, out: Vec<T>, rank: u32) -> Request<T> {
    let count = out.len();
    Request {
        what,
        of: Of::Ready {
            out,
            status: Status {
                source: rank,
                tag: 0,
                count,
            },
        },
    }
}

/// An atomic's old value as the request's element type (`u64`).
fn one_value<T: Element>(v: u64) -> Vec<T> {
    let mut out = vec![T::ZERO; 1];
    T::read(&v.to_ne_bytes(), &mut out);
    out
}
