//! What a loop keeps for emulated atomics, as parts with their own rules:
//! the pools and posted receives, the peers it answers (those the loop
//! inserted itself, by name: a request never makes the loop insert an
//! address), the requests it applied (so a repeated one is answered, not
//! applied again), the cookies it draws for its own operations, and what
//! it refused.
//!
//! Nothing here does I/O; `am.rs` posts and applies.

use super::am_wire::{Request, Status, APPLIED_WINDOW};
use super::tag_space::TagSpace;
use crate::error::{Error, Result};
use crate::ffi;
use crate::memory::buffer::Buffer;
use crate::memory::mr::RegionInner;
use std::collections::{HashMap, VecDeque};
use std::sync::Weak;

/// What a loop refused of its peers' emulated-atomic traffic
/// ([`EventLoop::atomic_counters`](super::EventLoop::atomic_counters)).
/// A count that grows on a loop whose peers are all fabric-msg programs
/// of one version means someone else is sending on the fabric
/// (docs/atomics.md, "What a peer can forge").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct AtomicCounters {
    /// Replies dropped at the origin: not the target's answer to the
    /// operation (another cookie, another source, malformed). The
    /// operation's receive is posted again; nothing completes.
    pub forged_replies: u64,
    /// Requests dropped at the target without being applied: malformed,
    /// oversized, or no room to queue the answer.
    pub refused_requests: u64,
    /// Requests dropped at the target without being applied because their
    /// origin is no peer of this loop (never inserted by `connect`,
    /// `accept`, `insert_peer` or the World): no answer could be addressed
    /// to it, and a forger naming other addresses gains no AV entry.
    pub unknown_origins: u64,
    /// Requests whose cookie the target had applied already (a resend, a
    /// replay): answered with the remembered result, not applied again.
    pub repeated_requests: u64,
    /// Peers' requests this loop applied to its memory, as a NIC would.
    pub applied_requests: u64,
    /// Peers' requests this loop answered with a refusal, as a NIC would
    /// (outside the region, misaligned, or an access it does not grant).
    pub denied_requests: u64,
}

/// A reply the target could not post yet (the queue was full).
pub(super) struct Outgoing {
    pub(super) endpoint: u32,
    pub(super) addr: ffi::fi_addr_t,
    pub(super) tag: u64,
    pub(super) buf: Buffer,
}

/// The peers this loop inserted, by endpoint name: the origins whose
/// requests it answers where the provider reports no source address.
#[derive(Default)]
pub(super) struct KnownPeers {
    by_name: HashMap<Vec<u8>, ffi::fi_addr_t>,
}

impl KnownPeers {
    /// Record a peer the loop inserted.
    pub(super) fn record(&mut self, name: &[u8], addr: ffi::fi_addr_t) {
        self.by_name.insert(name.to_vec(), addr);
    }

    /// The address of the peer named `name`, if the loop inserted it.
    pub(super) fn find(&self, name: &[u8]) -> Option<ffi::fi_addr_t> {
        self.by_name.get(name).copied()
    }
}

/// The results of the last [`APPLIED_WINDOW`] requests a target applied,
/// by origin address and cookie.
#[derive(Default)]
pub(super) struct Applied {
    results: HashMap<(ffi::fi_addr_t, u64), (Status, u64)>,
    order: VecDeque<(ffi::fi_addr_t, u64)>,
}

impl Applied {
    /// Room for the whole window at once, so remembering never allocates.
    pub(super) fn reserve(&mut self) {
        self.results.reserve(APPLIED_WINDOW + 1);
        self.order.reserve(APPLIED_WINDOW + 1);
    }

    /// What `from`'s request `cookie` gave, if it was applied.
    pub(super) fn get(&self, from: ffi::fi_addr_t, cookie: u64) -> Option<(Status, u64)> {
        self.results.get(&(from, cookie)).copied()
    }

    /// Remember what `from`'s request `cookie` gave, forgetting the oldest.
    pub(super) fn remember(&mut self, from: ffi::fi_addr_t, cookie: u64, result: (Status, u64)) {
        if self.order.len() >= APPLIED_WINDOW {
            if let Some(old) = self.order.pop_front() {
                self.results.remove(&old);
            }
        }
        self.results.insert((from, cookie), result);
        self.order.push_back((from, cookie));
    }
}

/// Random cookies, drawn from the operating system in batches.
#[derive(Default)]
pub(super) struct Cookies {
    batch: [u64; 32],
    left: usize,
}

impl Cookies {
    /// The next cookie.
    pub(super) fn draw(&mut self) -> Result<u64> {
        if self.left == 0 {
            let mut bytes = [0u8; 32 * 8];
            getrandom::fill(&mut bytes).map_err(|e| {
                Error::Usage(format!(
                    "the operating system's random source failed ({e}); emulated atomics cannot draw \
                     their cookies"
                ))
            })?;
            for (w, b) in self.batch.iter_mut().zip(bytes.chunks_exact(8)) {
                let mut a = [0u8; 8];
                a.copy_from_slice(b);
                *w = u64::from_le_bytes(a);
            }
            self.left = self.batch.len();
        }
        self.left -= 1;
        Ok(self.batch[self.left])
    }
}

/// An origin's emulated atomic in flight, by its slot: what it sent, so
/// that a reply can be checked and the request sent again.
#[derive(Clone, Copy)]
pub(super) struct InFlight {
    pub(super) request: Request,
    /// Sent again already (once, half way to its deadline).
    pub(super) resent: bool,
}

/// What the loop keeps for emulated atomics.
#[derive(Default)]
pub(crate) struct AmState {
    /// Request buffers, reused.
    pub(super) bufs: Vec<Buffer>,
    /// Each endpoint's own name, once its request receives are posted.
    pub(super) names: Vec<Option<Vec<u8>>>,
    /// Peers' names and their addresses in the AV, for replies.
    pub(super) peers: KnownPeers,
    /// Results of requests applied, by origin and cookie.
    pub(super) applied: Applied,
    /// This loop's operations in flight, by slot index.
    pub(super) in_flight: Vec<Option<InFlight>>,
    /// Cookies for this loop's operations.
    pub(super) cookies: Cookies,
    /// Replies waiting for room in the queue.
    pub(super) outbox: Vec<Outgoing>,
    /// Regions peers may reach, by key (dead ones are revoked).
    pub(crate) regions: Vec<Weak<RegionInner>>,
    /// Request receives posted (not counted in `in_flight`).
    pub(super) posted: usize,
    /// Request and reply receives to post again (the queue was full).
    pub(super) reposts: Vec<u32>,
    /// The reserved tags.
    pub(crate) tags: TagSpace,
    /// What was refused.
    pub(super) counters: AtomicCounters,
}

impl AmState {
    /// Record the operation in slot `index`.
    pub(super) fn track(&mut self, index: u32, request: Request) {
        let i = index as usize;
        if self.in_flight.len() <= i {
            self.in_flight.resize(i + 1, None);
        }
        self.in_flight[i] = Some(InFlight {
            request,
            resent: false,
        });
    }

    /// The operation in slot `index`, if it is one.
    pub(super) fn tracked(&self, index: u32) -> Option<InFlight> {
        self.in_flight.get(index as usize).copied().flatten()
    }

    /// Forget the operation in slot `index`.
    pub(super) fn untrack(&mut self, index: u32) {
        if let Some(s) = self.in_flight.get_mut(index as usize) {
            *s = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_recorded_peers_are_known() {
        let mut k = KnownPeers::default();
        k.record(b"a", 3);
        assert_eq!(k.find(b"a"), Some(3));
        assert_eq!(k.find(b"b"), None);
        k.record(b"a", 4);
        assert_eq!(k.find(b"a"), Some(4), "inserted again: the newer address");
    }

    #[test]
    fn applied_results_are_remembered_for_a_window_and_forgotten_with_their_origin() {
        let mut a = Applied::default();
        a.reserve();
        a.remember(1, 0xc0, (Status::Ok, 5));
        a.remember(2, 0xc0, (Status::NoRegion, 0));
        assert_eq!(a.get(1, 0xc0), Some((Status::Ok, 5)));
        assert_eq!(a.get(2, 0xc0), Some((Status::NoRegion, 0)), "per origin");
        assert_eq!(a.get(1, 0xc1), None);
        for c in 0..APPLIED_WINDOW as u64 {
            a.remember(3, c, (Status::Ok, c));
        }
        assert_eq!(a.get(1, 0xc0), None, "the oldest went first");
        assert_eq!(a.get(3, 0), Some((Status::Ok, 0)));
    }

    #[test]
    fn cookies_differ() {
        let mut c = Cookies::default();
        let drawn: std::collections::HashSet<u64> = (0..100).map(|_| c.draw().unwrap()).collect();
        assert_eq!(drawn.len(), 100);
    }
}
