//! Closing an endpoint, and dropping the loop: endpoints first, then the
//! operations' memory, then the queues and the domain.

use super::slab;
use super::state::EventLoop;
use super::types::EndpointId;
use crate::error::{Error, Result};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a loop on `verbs;ofi_rxm` reads its completion queue before it
/// closes an endpoint ([`EventLoop::settle_rxm`]): long enough for the
/// receive credits a peer sent as it took the last messages to arrive and
/// be taken (the same host's soft-RoCE delivers in microseconds; a
/// hardware fabric's round trip is a few).
const RXM_SETTLE: Duration = Duration::from_millis(5);
/// Reads at least this many times, even if the thread was descheduled for
/// the whole of [`RXM_SETTLE`]: rxm takes at most 32 completions from its
/// own queue per read.
const RXM_SETTLE_READS: u32 = 16;

impl EventLoop {
    /// Close an endpoint. Its operations still in flight produce no
    /// completions; their buffers are freed by the loop. Completions of its
    /// operations already reaped but not yet returned are dropped too. If
    /// `fi_close` fails, the error is returned and the operations' memory
    /// is kept for good (leaked when the loop drops): the provider may
    /// still write into it.
    pub fn close_endpoint(&mut self, id: EndpointId) -> Result<()> {
        let Some(slot) = self.endpoints.get_mut(id.0 as usize) else {
            return Err(Error::Closed {
                what: format!("endpoint {}", id.0),
            });
        };
        if let Some(state) = slot.as_ref() {
            let bound = Arc::strong_count(&state.bound) - 1;
            if bound > 0 {
                return Err(Error::Busy {
                    what: "endpoint with memory regions bound to it (FI_MR_ENDPOINT); drop them first",
                    in_flight: bound,
                });
            }
        }
        let Some(state) = slot.take() else {
            return Err(Error::Closed {
                what: format!("endpoint {}", id.0),
            });
        };
        // Its peers learn that it departs, and are watched no more.
        self.lost.leave_endpoint(id.0);
        let Some(endpoint) = state.endpoint else {
            return Ok(());
        };
        // Completions read here for this endpoint are dropped below with
        // the rest of its operations; others wait for the next poll.
        self.settle_rxm();
        let gate = self.progress_gate();
        let gated = gate.as_ref().map(|g| g.lock());
        // It is removed from the table, so nothing posts to it again;
        // closing it stops the provider using its buffers.
        let closed = endpoint.close();
        drop(gated);
        // Entries already in the CQ for it are discarded by `complete`, which
        // ignores closed endpoints; read them now so their slots are freed.
        // Whatever that read says, the endpoint's operations are reclaimed
        // and none of its tokens comes back; errors are reported after.
        let drained = self.read_cq();
        for i in 0..self.slab.slots.len() {
            let s = &mut self.slab.slots[i];
            if s.in_use && s.endpoint == id.0 {
                if closed.is_err() {
                    // The endpoint may still be open and write into this
                    // slot and its memory: keep both for good (never
                    // reused, never freed under the NIC).
                    s.abandoned = true;
                    self.objects.close_failed = true;
                    continue;
                }
                self.slab.release(i as u32);
            }
        }
        self.pending.retain(|c| c.endpoint != id);
        self.forget_reclaimed(id.0);
        for (i, g) in self.slab.groups.list.iter_mut().enumerate() {
            if g.remaining > 0 && g.endpoint == id.0 {
                g.remaining = 0;
                self.slab.groups.free.push(i as u32);
            }
        }
        closed?;
        drained
    }
}

impl EventLoop {
    /// On `verbs;ofi_rxm`, read the completion queue for [`RXM_SETTLE`]
    /// before an endpoint closes, so that rxm's own queue is empty when the
    /// endpoint's connections close.
    ///
    /// Without a shared receive context (RoCE and InfiniBand; fabric-msg
    /// sets one only on iWARP) a receiver gives a sender its credits back
    /// in a message of rxm's own every 64 receive buffers it reposts
    /// (verbs' flow control), whatever the application does. Closing the
    /// endpoint, `rxm_close_conn` (libfabric 1.17 and 2.1) closes each
    /// connection's MSG endpoint, then handles what is left in rxm's queue
    /// and reposts each receive buffer it finds there on the endpoint it
    /// has just closed: SIGSEGV. A credit that came after the application's
    /// last poll is such a buffer (`close_race`: 1024 messages, then 20 ms
    /// before closing, crashed 5 of 5 runs on rxe0). Each read here hands
    /// rxm's queue to rxm while the connections are open. What this leaves:
    /// a credit that lands in the moment between the last read and the
    /// close, which only a peer still receiving then can send (one that
    /// lands after the close is dropped by the device). docs/decisions.md,
    /// "The receive that is left: rxm's credits".
    pub(super) fn settle_rxm(&mut self) {
        if !self.domain.profile.quirks.reposts_credits_on_close {
            return;
        }
        let until = Instant::now() + RXM_SETTLE;
        let mut reads = 0;
        while reads < RXM_SETTLE_READS || Instant::now() < until {
            if let Err(e) = self.read_cq() {
                log::warn!("reading the completion queue before closing: {e}");
                return;
            }
            reads += 1;
        }
    }

    /// The loop's bookkeeping once endpoint `id`'s operations were
    /// reclaimed: backlogged sends whose slots went, and the request
    /// receives for emulated atomics that went with the endpoint.
    pub(super) fn forget_reclaimed(&mut self, id: u32) {
        self.drop_stale_backlog();
        self.am.posted = self
            .slab
            .slots
            .iter()
            .filter(|s| s.in_use && s.role.internal() == slab::Internal::AmRequest)
            .count();
        self.am.reposts.retain(|&i| self.slab.slots[i as usize].in_use);
        if let Some(n) = self.am.names.get_mut(id as usize) {
            *n = None;
        }
    }
}

impl EventLoop {
    /// Whether the loop's endpoints must be left open when it drops: on
    /// `ofi_rxm`, once a peer was lost (a lifeline's verdict, or the
    /// World's `give_up`, set when a rank is lost).
    ///
    /// A peer that died or stopped in the middle of a message that rxm
    /// sends in segments (its SAR protocol: above the eager size, 16 KiB,
    /// up to 128 KiB) leaves that message half received, and rxm cannot
    /// close the connection it came on: `rxm_close_conn` (prov/rxm/src/rxm_conn.c)
    /// unlinks each entry of the connection's `deferred_sar_msgs` through
    /// another link, so the list never empties and 1.17 to 1.22 spin there
    /// for ever; 2.0 to 2.6 take the entry for a receive and call through
    /// it (SIGSEGV). `fi_close` of the endpoint closes every connection,
    /// so a survivor's teardown never returned (the World's watchdog ended
    /// it after 3 s, status 70). docs/decisions.md, "rxm's close of a
    /// message half received".
    fn rxm_left_open(&mut self) -> bool {
        if !self.domain.profile.quirks.close_hangs_after_loss {
            return false;
        }
        if self.lost.changed() {
            self.take_losses();
        }
        (self.giving_up() || self.lost.any_lost())
            && self.endpoints.iter().flatten().any(|s| s.endpoint.is_some())
    }

    /// Leave the endpoints open, and with them what they are bound to and
    /// may still use: the operations' memory, the CQ, the AV, the domain
    /// and the fabric. Nothing of the loop touches them again; the process
    /// keeps them (and the endpoints' sockets) until it ends.
    fn leave_open(&mut self) {
        log::warn!(
            "leaving this loop's {} endpoint(s) open (and their memory, queue and domain) instead of \
             closing them: a peer was lost, and ofi_rxm never returns from closing a connection with \
             a message half received (docs/decisions.md)",
            self.domain.profile.provider
        );
        keep_until_exit((
            std::mem::take(&mut self.endpoints),
            std::mem::take(&mut self.slab.slots),
            self.spare.atomic_scratch.take(),
            self.objects.pep.take(),
            self.objects.eq.take(),
            self.objects.av.take(),
            self.domain.clone(),
            self.objects.cq.clone(),
        ));
        self.pending.clear();
        self.spare.mapped_keys.clear();
    }
}

/// The addresses of what loops left open (`EventLoop::leave_open`).
static LEFT_OPEN: std::sync::Mutex<Vec<usize>> = std::sync::Mutex::new(Vec::new());

/// Never drop `parts`, and keep them reachable from a static until the
/// process ends: libfabric may still hold pointers into them, and a leak
/// checker (LeakSanitizer in `ci/asan.sh`) sees them held, not lost.
fn keep_until_exit<T: 'static>(parts: T) {
    let at = Box::into_raw(Box::new(parts)) as usize;
    LEFT_OPEN
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .push(at);
}

impl Drop for EventLoop {
    fn drop(&mut self) {
        // The progress thread calls into the CQ: stop it before anything closes.
        self.objects.progress = None;
        if self.rxm_left_open() {
            // Not even the settling read below: rxm closes a lost peer's
            // connection in it too, when it takes in the peer's hang-up.
            self.leave_open();
            return;
        }
        if self.endpoints.iter().flatten().any(|s| s.endpoint.is_some()) {
            self.settle_rxm();
        }
        let mut all_closed = true;
        for endpoint in self
            .endpoints
            .iter_mut()
            .filter_map(Option::take)
            .filter_map(|s| s.endpoint)
        {
            // Each closes before the CQ, AV and EQ it is bound to (which it
            // holds; one that fails to close keeps them open for good).
            if let Err(e) = endpoint.close() {
                all_closed = false;
                log::warn!(op = "close", error:% = e; "closing endpoint: {e}");
            }
        }
        if !all_closed || self.objects.close_failed {
            // An endpoint that did not close may still write into its
            // operations' contexts and memory: leak them, never free them
            // under the NIC.
            log::warn!("leaking the operation slots of endpoints that did not close");
            std::mem::forget(std::mem::take(&mut self.slab.slots));
        }
        // The passive endpoint goes before the EQ it is bound to.
        self.objects.pep = None;
        // With every endpoint closed the provider no longer touches buffers
        // of operations in flight: free them (and their registrations)
        // before the CQ, AV and domain go.
        self.slab.slots.clear();
        self.pending.clear();
        self.spare.atomic_scratch = None;
        for key in self.spare.mapped_keys.drain(..) {
            if let Err(e) = self.domain.domain.unmap_key(key) {
                log::warn!("unmapping a raw key: {e}");
            }
        }
    }
}
