//! Sorting the completions of a receive's parts, in the order each loop
//! matched them.
//!
//! The hand-on and the hold below are for libfabric's shm as the
//! same-node loop, which matches on its own. On fabric-msg's node loop no
//! part takes a message another part of its receive took
//! (`local/claims.rs`): nothing is handed on and nothing waits.
//!
//! A receive from any rank is posted on both loops (`local.rs`); the first
//! part to complete is handed out and the others cancelled, and a message
//! a cancelled part had matched already goes to the oldest receive still
//! waiting that it matches (`rematch`). That keeps one rank's messages in
//! order as long as each loop completes its receives in the order it
//! matched them: the part that matched a rank's message 4 then completes
//! before the one that matched its message 5.
//!
//! ofi_rxm does not: it matches a rendezvous message (above its segmented
//! range, 128 KiB on `tcp;ofi_rxm`) when the sender's request comes, and
//! completes it after reading the data, by which time later, smaller
//! messages of the same rank have completed the receives they matched.
//! Receive 5 then held message 5, and message 4, whose receive 4 had been
//! handed a node peer's message meanwhile, went to receive 6 (seen with
//! 200,001-byte messages in `same_node_check`: "receive 24 holds message 5
//! where message 4 was due").
//!
//! So a completion waits here while an older receive still has a part on
//! the same loop that could have matched its message: a loop matches in
//! the order receives were posted, so that part either matched an earlier
//! message, whose completion is on its way, or is being cancelled. It is
//! sorted once that part's completion is, oldest receive first. Nothing
//! waits for the application: only for completions the loop owes.

use super::{is_pair, Local, ID_MASK};
use crate::memory::buffer::Buffer;
use crate::transport::event_loop::{Completion, CompletionError, EndpointId, EventLoop, Token};
use crate::world::tags;

/// The pair number and the half of a pair's token.
fn parts(t: Token) -> (u64, u8) {
    ((t.0 >> 8) & ID_MASK, t.0 as u8)
}

impl Local {
    /// Sort one loop's batch into `out`: completions of pairs become the
    /// application's (the first half of each) or left-overs, each once
    /// no older receive's part on its loop is still unsorted.
    pub(super) fn sort(&mut self, main: &mut EventLoop, main_ep: EndpointId, out: &mut Vec<Completion>) {
        let mut batch = std::mem::take(&mut self.batch);
        for c in batch.drain(..) {
            if !is_pair(c.token) {
                out.push(c);
                continue;
            }
            if super::engine::is_engine(c.token) {
                self.engine_completion(main, main_ep, c, out);
                continue;
            }
            if self.must_wait(&c) {
                self.held.push(c);
                continue;
            }
            self.settle(main, main_ep, c, out);
            if !self.held.is_empty() {
                self.release(main, main_ep, out);
            }
        }
        self.batch = batch;
    }

    /// Whether an older receive has a part on `c`'s loop, not yet sorted,
    /// that matches `c`'s message: the loop matched a message to it before
    /// `c`'s, or is cancelling it. A cancellation carries no message and
    /// never waits.
    fn must_wait(&self, c: &Completion) -> bool {
        // On the node loop no part takes a message another part took
        // (`local/claims.rs`): nothing is left over, nothing to wait for.
        if self.is_node() || matches!(c.result, Err(CompletionError::Cancelled)) {
            return false;
        }
        let (id, h) = parts(c.token);
        self.pairs.range(..id).any(|(_, p)| {
            let out = if h == 0 {
                p.main_out
            } else {
                p.left > u8::from(p.main_out)
            };
            out && tags::matches(c.tag, p.want)
        })
    }

    /// Sort the held completions that need wait no longer, the oldest
    /// receive's first (each one sorted may free the next).
    fn release(&mut self, main: &mut EventLoop, main_ep: EndpointId, out: &mut Vec<Completion>) {
        loop {
            let next = self
                .held
                .iter()
                .enumerate()
                .filter(|(_, c)| !self.must_wait(c))
                .min_by_key(|(_, c)| parts(c.token).0)
                .map(|(i, _)| i);
            let Some(i) = next else {
                return;
            };
            let c = self.held.remove(i);
            self.settle(main, main_ep, c, out);
        }
    }

    /// One completion of a pair's half: the application's if its pair was
    /// not handed out yet (then the other halves are cancelled), nothing if
    /// cancelled, else a left-over for `rematch`.
    fn settle(
        &mut self,
        main: &mut EventLoop,
        main_ep: EndpointId,
        mut c: Completion,
        out: &mut Vec<Completion>,
    ) {
        let (id, h) = parts(c.token);
        let Some(p) = self.pairs.get_mut(&id) else {
            log::warn!(
                "a completion of an unknown any-source receive ({:#x}) dropped",
                c.token.0
            );
            return;
        };
        p.left = p.left.saturating_sub(1);
        if h == 0 {
            p.main_out = false;
        }
        // A part taken back carries no message: it ends the receive only
        // as its last part (the application cancelled it, and no part had
        // matched a message).
        let cancelled = matches!(c.result, Err(CompletionError::Cancelled));
        let fresh = !p.delivered && (!cancelled || p.left == 0);
        let (user, first, halves) = (p.user, p.first, p.halves);
        p.delivered |= fresh;
        if p.left == 0 {
            self.pairs.remove(&id);
        }
        if fresh {
            c.token = user;
            out.push(c);
            if halves - first > 1 {
                self.cancel_halves(main, main_ep, id, first, halves, Some(h));
            }
        } else if cancelled {
            if let Some(b) = c.buffer.take() {
                self.give_spare(b);
            }
        } else {
            self.rematch(main, main_ep, c, out);
        }
    }

    /// A message a half matched after its pair was handed out: it goes to
    /// the oldest pair still waiting that it matches (whose halves are then
    /// cancelled, and what they matched meanwhile comes back here), or is
    /// kept for the next receive. Messages of one rank arrive on one loop
    /// and are sorted in the order it matched them, so they are given out
    /// in that order.
    fn rematch(
        &mut self,
        main: &mut EventLoop,
        main_ep: EndpointId,
        mut c: Completion,
        out: &mut Vec<Completion>,
    ) {
        let fits = |p: &super::Pair| !p.delivered && tags::matches(c.tag, p.want);
        let Some((&id, p)) = self.pairs.iter_mut().find(|(_, p)| fits(p)) else {
            c.token = Token(0);
            self.unclaimed.push_back(c);
            return;
        };
        p.delivered = true;
        let len = c.buffer.as_ref().map_or(0, Buffer::len);
        if c.result.is_ok() && len > p.capacity {
            c.result = Err(CompletionError::Truncated {
                message_len: Some(len),
                buffer_len: p.capacity,
            });
        }
        c.token = p.user;
        let (first, halves) = (p.first, p.halves);
        out.push(c);
        self.cancel_halves(main, main_ep, id, first, halves, None);
    }
}
