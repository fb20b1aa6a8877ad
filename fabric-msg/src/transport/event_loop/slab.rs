//! The operation slab: one boxed slot per operation in flight, whose
//! address is the `fi_context2` libfabric hands back, and the groups that
//! make a split transfer complete once.

use super::types::{CompletionError, OpKind, Token};
use crate::ffi;
use crate::memory::buffer::Buffer;
use crate::memory::lease::Lease;
use crate::memory::mr::RegionInner;
use std::os::raw::c_void;
use std::sync::Arc;
use std::time::Instant;

// Per-operation state. `ctx` must be first: its address is the context
// handed to libfabric (FI_CONTEXT / FI_CONTEXT2 give the provider this
// storage until the completion is read), and the completion's op_context
// is cast back to the slot.
#[repr(C)]
pub(super) struct OpSlot {
    pub(super) ctx: ffi::fi_context2,
    pub(super) index: u32,
    pub(super) in_use: bool,
    pub(super) endpoint: u32,
    pub(super) kind: OpKind,
    pub(super) token: Token,
    pub(super) buffer: Option<Buffer>,
    /// Bytes posted for a receive (to report truncation).
    pub(super) posted_len: usize,
    /// Address of the buffer's payload, for offsets of multi-receive pieces.
    pub(super) base: usize,
    /// Bytes of a multi-receive buffer filled so far.
    pub(super) used: usize,
    /// Bumped at every acquire, so a completion can tell its slot from a
    /// later operation's use of it.
    pub(super) generation: u64,
    /// Registration of borrowed memory, dropped when the slot is released.
    pub(super) borrowed_mr: Option<crate::memory::buffer::LocalMr>,
    /// The region a one-sided operation uses, held until its completion.
    pub(super) region: Option<Arc<RegionInner>>,
    /// The pool slot it uses, returned to its pool after the completion.
    pub(super) lease: Option<Arc<Lease>>,
    /// What the operation is, and so how its completion is handled.
    pub(super) role: Role,
    /// When a one-sided operation is reported as timed out.
    pub(super) expires: Option<Instant>,
    /// Reported as timed out; the provider still holds it, so the slot
    /// (and the memory it keeps) waits for its late completion, which is
    /// swallowed.
    pub(super) abandoned: bool,
    /// AmReply: the operation's code; AmSend of a request: the operation's
    /// slot (low 32 bits) and generation (high bits).
    pub(super) link: u64,
    /// The peer an operation is addressed to (`FI_ADDR_UNSPEC`: none or
    /// any), so that a lost peer's operations can be failed.
    pub(super) peer: u64,
    /// Addressed to a peer found lost: it ends as `PeerLost` (`lost_peers`).
    pub(super) lost: bool,
    /// A tagged receive's `(tag, ignore)` as posted, checked against the
    /// message's tag where the provider matches masks wrongly.
    pub(super) want: Option<(u64, u64)>,
}

impl OpSlot {
    /// The context libfabric is handed with the operation and hands back
    /// in its completion: the slot's own address, which does not move (each
    /// slot is boxed) while the slot is in use.
    #[inline]
    pub(super) fn context(&mut self) -> *mut c_void {
        (self as *mut OpSlot).cast()
    }
}

pub(super) const NO_GROUP: u32 = u32::MAX;

/// What an operation is, and so which path its completion takes
/// (`completions.rs`, `complete`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Role {
    /// The application's operation, completed on its own.
    Whole,
    /// The application's multi-receive buffer: completes once per message,
    /// released by the completion flagged `FI_MULTI_RECV`.
    MultiRecv,
    /// One part of a split transfer: index into the loop's groups; the
    /// transfer completes when its last part does.
    Part(u32),
    /// A native atomic whose fetched value lies in the loop's atomic scratch.
    FetchingAtomic,
    /// The loop's own receive for peers' emulated-atomic requests, posted
    /// again after each (`am.rs`).
    AmRequest,
    /// The loop's own receive for an emulated atomic's reply.
    AmReply,
    /// The loop's own send of a request or a reply.
    AmSend,
    /// A peek (`FI_PEEK`, `peek.rs`).
    Peek,
}

impl Role {
    /// The loop's own operation this is, as `am.rs` handles it, or
    /// [`Internal::No`].
    #[inline]
    pub(super) fn internal(self) -> Internal {
        match self {
            Role::AmRequest => Internal::AmRequest,
            Role::AmReply => Internal::AmReply,
            Role::AmSend => Internal::AmSend,
            _ => Internal::No,
        }
    }

    /// The split transfer this is a part of, or [`NO_GROUP`].
    #[inline]
    pub(super) fn group(self) -> u32 {
        match self {
            Role::Part(g) => g,
            _ => NO_GROUP,
        }
    }
}

/// What a slot is for, when it is the loop's own operation (`am.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Internal {
    /// The application's operation.
    No,
    /// A receive for peers' emulated-atomic requests, posted again after each.
    AmRequest,
    /// An emulated atomic of the application, waiting for its reply.
    AmReply,
    /// A request or reply being sent.
    AmSend,
}

/// A transfer split into parts: completes once, when the last part does.
pub(super) struct Group {
    pub(super) endpoint: u32,
    pub(super) kind: OpKind,
    pub(super) token: Token,
    pub(super) remaining: usize,
    pub(super) error: Option<CompletionError>,
}

/// Boxed slots, never moved while in use; freed slots are reused, so the
/// steady state allocates nothing per operation.
pub(super) struct Slab {
    // Boxed on purpose: a slot's address is the context libfabric holds, so
    // it must not move when the Vec grows.
    #[allow(clippy::vec_box)]
    pub(super) slots: Vec<Box<OpSlot>>,
    /// Every slot's address with its index, sorted by address: a
    /// completion's context is looked up here, never dereferenced, because
    /// a provider may hand back a context that is not ours (libfabric 2.1's
    /// shm puts an internal id there for a peer's write with data).
    pub(super) by_addr: Vec<(usize, u32)>,
    pub(super) free: Vec<u32>,
    pub(super) in_flight: usize,
    /// Slots with a deadline (one-sided operations).
    pub(super) timed: usize,
    /// When `poll` next looks for overdue ones (`deadlines.rs`).
    pub(super) next_expiry_scan: std::time::Instant,
    /// Split transfers in flight.
    pub(super) groups: Groups,
}

/// Split transfers in flight, and the free entries of `list`.
#[derive(Default)]
pub(super) struct Groups {
    pub(super) list: Vec<Group>,
    pub(super) free: Vec<u32>,
}

impl Slab {
    #[inline]
    pub(super) fn acquire(&mut self, endpoint: u32, kind: OpKind, token: Token) -> &mut OpSlot {
        let index = match self.free.pop() {
            Some(i) => i,
            None => self.grow(kind, token),
        };
        // One deref of the Box: through `&mut Box` every store reloads it.
        let slot: &mut OpSlot = &mut self.slots[index as usize];
        slot.in_use = true;
        slot.endpoint = endpoint;
        slot.kind = kind;
        slot.token = token;
        slot.buffer = None;
        slot.posted_len = 0;
        slot.base = 0;
        slot.used = 0;
        slot.role = Role::Whole;
        slot.expires = None;
        slot.abandoned = false;
        slot.link = 0;
        slot.peer = ffi::FI_ADDR_UNSPEC;
        slot.lost = false;
        slot.generation += 1;
        self.in_flight += 1;
        slot
    }

    /// A new slot (the slab grows only until the most operations in
    /// flight at once have been seen).
    #[cold]
    fn grow(&mut self, kind: OpKind, token: Token) -> u32 {
        let i = self.slots.len() as u32;
        self.slots.push(Box::new(OpSlot {
            ctx: ffi::fi_context2::default(),
            index: i,
            in_use: false,
            endpoint: 0,
            kind,
            token,
            buffer: None,
            posted_len: 0,
            base: 0,
            used: 0,
            generation: 0,
            borrowed_mr: None,
            region: None,
            lease: None,
            role: Role::Whole,
            expires: None,
            abandoned: false,
            link: 0,
            peer: ffi::FI_ADDR_UNSPEC,
            lost: false,
            want: None,
        }));
        let addr = &*self.slots[i as usize] as *const OpSlot as usize;
        let at = self.by_addr.partition_point(|&(a, _)| a < addr);
        self.by_addr.insert(at, (addr, i));
        i
    }

    #[inline]
    pub(super) fn release(&mut self, index: u32) -> Option<Buffer> {
        let slot: &mut OpSlot = &mut self.slots[index as usize];
        if !slot.in_use {
            return None;
        }
        slot.in_use = false;
        slot.borrowed_mr = None;
        slot.region = None;
        slot.lease = None;
        if slot.expires.take().is_some() {
            self.timed -= 1;
        }
        self.in_flight -= 1;
        self.free.push(index);
        slot.buffer.take()
    }

    /// The slot a completion's context points at, if it is one of ours and in use.
    #[inline]
    pub(super) fn index_of(&self, ctx: *mut c_void) -> Option<u32> {
        let at = self
            .by_addr
            .binary_search_by_key(&(ctx as usize), |&(a, _)| a)
            .ok()?;
        let index = self.by_addr[at].1;
        self.slots[index as usize].in_use.then_some(index)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contexts_that_are_not_slots_are_not_followed() {
        let mut slab = Slab {
            slots: Vec::new(),
            by_addr: Vec::new(),
            free: Vec::new(),
            in_flight: 0,
            timed: 0,
            next_expiry_scan: std::time::Instant::now(),
            groups: Groups::default(),
        };
        let slots: Vec<*mut OpSlot> = (0..5)
            .map(|i| slab.acquire(0, OpKind::Send, Token(i)) as *mut OpSlot)
            .collect();
        for (i, s) in slots.iter().enumerate() {
            assert_eq!(slab.index_of(s.cast()), Some(i as u32));
        }
        // Small integers and addresses inside a slot are not slots; none is
        // dereferenced (an internal id such as 8 would fault if it were).
        for bogus in [8usize, 16, 4096, slots[2] as usize + 8] {
            assert_eq!(slab.index_of(bogus as *mut c_void), None, "{bogus:#x}");
        }
        assert_eq!(slab.index_of(std::ptr::null_mut()), None);
        slab.release(3);
        assert_eq!(
            slab.index_of(slots[3].cast()),
            None,
            "a released slot is not in use"
        );
    }
}
