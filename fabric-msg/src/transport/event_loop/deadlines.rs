//! Deadlines of one-sided operations: reporting those the provider never
//! completes as timed out, and swallowing their late completions.

use super::slab;
use super::slab::NO_GROUP;
use super::state::EventLoop;
use super::types::{Completion, CompletionError};
use std::time::{Duration, Instant};

impl EventLoop {
    /// The late completion of an operation already reported as timed out.
    pub(super) fn swallow(&mut self, index: u32) {
        if let Some(b) = self.slab.release(index) {
            if b.capacity() == 0 {
                self.spare.notify_bufs.push(b);
            } else {
                // An emulated atomic's request buffer.
                self.am.bufs.push(b);
            }
        }
    }

    /// Report one-sided operations past their deadline as timed out.
    pub(super) fn expire_overdue(&mut self, now: Instant) {
        // Operations to a lost peer have a deadline even without rma_timeout.
        let after = self.cfg.rma_timeout.unwrap_or(Duration::MAX);
        for i in 0..self.slab.slots.len() {
            let s = &self.slab.slots[i];
            if !s.in_use || s.abandoned || s.expires.map_or(true, |t| t > now) {
                continue;
            }
            // An emulated atomic half way: its request goes once more.
            if s.role.internal() == slab::Internal::AmReply && !s.lost && self.am_resend(i as u32, now) {
                continue;
            }
            let s = &mut self.slab.slots[i];
            s.abandoned = true;
            // Reported once: no deadline left to wake up for, so an
            // operation the provider never completes does not make every
            // later poll tick.
            s.expires = None;
            let (endpoint, kind, token, group, lost) = (s.endpoint, s.kind, s.token, s.role.group(), s.lost);
            self.slab.timed -= 1;
            let failure = if lost {
                self.lost_failure(i as u32)
            } else {
                CompletionError::TimedOut(after)
            };
            if group != NO_GROUP {
                let g = &mut self.slab.groups.list[group as usize];
                g.error.get_or_insert(failure);
                g.remaining -= 1;
                if g.remaining == 0 {
                    self.end_group(group);
                }
                continue;
            }
            self.pending
                .push(Completion::outcome(token, endpoint, kind, Err(failure)));
        }
    }
}
