//! The one-sided operations' registered scratch memory, reused once each
//! operation is done, and the operations in flight by target rank, which
//! `flush` waits for (`one_sided.rs`).

use super::messages::{Messages, Ticket};
use crate::memory::mr::MemoryRegion;

/// Scratch regions kept for reuse at most.
const KEEP: usize = 32;

#[derive(Debug, Default)]
pub(crate) struct OneSided {
    free: Vec<MemoryRegion>,
    in_flight: Vec<(Ticket, u32)>,
}

impl OneSided {
    /// A kept region of at least `len` bytes that no operation uses.
    pub(crate) fn take(&mut self, len: usize) -> Option<MemoryRegion> {
        let i = self
            .free
            .iter()
            .position(|r| r.len() >= len && r.in_flight() == 0)?;
        Some(self.free.swap_remove(i))
    }

    /// Keep `r` for reuse (up to `KEEP` regions; others are dropped).
    pub(crate) fn keep(&mut self, r: MemoryRegion) {
        if self.free.len() < KEEP {
            self.free.push(r);
        }
    }

    /// Operation `t` on `rank` was posted.
    pub(crate) fn started(&mut self, t: Ticket, rank: u32, msgs: &Messages) {
        self.in_flight.retain(|&(u, _)| msgs.in_flight(u));
        self.in_flight.push((t, rank));
    }

    /// Whether an operation on a rank `target` accepts is still in flight.
    pub(crate) fn any_to(&mut self, target: &impl Fn(u32) -> bool, msgs: &Messages) -> bool {
        self.in_flight.retain(|&(u, _)| msgs.in_flight(u));
        self.in_flight.iter().any(|&(_, r)| target(r))
    }
}
