//! Which part of a receive from any rank takes a message, where the other
//! loop is fabric-msg's node loop.
//!
//! Such a receive has a part on the node loop, paired
//! (`transport/node/paired.rs`), and one on the main loop. Before the node
//! loop gives a message to its part, it asks here, and the message waits
//! in its ring until the answer:
//!
//! - the main loop's part is cancelled (`fi_cancel`), and its completion
//!   read at once: every provider here writes a cancelled receive's
//!   completion inside `fi_cancel` (1.17's and 2.1's `rxm_ep.c`,
//!   `xnet_srx.c`, `rxd_ep.c`, `sock_ep.c`, `smr_ep.c`), most often
//!   first in the queue, where `fi_cq_readerr` takes it without a
//!   progress call (`EventLoop::cancel_recv_now`). Cancelled: the node
//!   part is unpaired and takes the message.
//! - Otherwise the main loop's part has matched a message already (its
//!   completion is here, or coming: a rendezvous still reading): the node
//!   part is taken back, and the node loop gives the message to the next
//!   receive that matches it, or keeps it.
//!
//! So every message goes to one part only, chosen before the next message
//! is matched on the node loop, and each loop matches in the order the
//! receives were posted: one rank's messages are taken in the order it
//! sent them, whatever the receives name (MPI's non-overtaking rule), and
//! nothing is left over to hand on (`local/order.rs` does that for
//! libfabric's shm, which matches on its own).

use super::{half, is_pair, Local, ID_MASK};
use crate::error::Result;
use crate::transport::event_loop::{Completion, CompletionError, EndpointId, EventLoop, Token};
use std::time::Duration;

impl Local {
    /// Answer what the node loop asks; whether it asked anything (then
    /// the messages that waited move at its next look).
    pub(super) fn answer_claims(&mut self, main: &mut EventLoop, main_ep: EndpointId) -> Result<bool> {
        let mut asked = std::mem::take(&mut self.asked);
        self.side.take_asked(&mut asked);
        let any = !asked.is_empty();
        for t in asked.drain(..) {
            if self.may_take(main, main_ep, t)? {
                self.side.unpair(t);
            } else {
                self.side.cancel(t)?;
            }
        }
        self.asked = asked;
        Ok(any)
    }

    /// Whether the node part `t` may take a message: its receive is still
    /// the application's to give, and its main loop part is cancelled.
    fn may_take(&mut self, main: &mut EventLoop, main_ep: EndpointId, t: Token) -> Result<bool> {
        let id = (t.0 >> 8) & ID_MASK;
        let Some(p) = self.pairs.get(&id).filter(|_| is_pair(t)) else {
            // Not a receive of ours: a message given to it would be lost.
            log::warn!("the node loop asked about an unknown receive ({:#x})", t.0);
            return Ok(false);
        };
        if p.delivered {
            return Ok(false);
        }
        if !p.main_out {
            return Ok(true);
        }
        if let Some(c) = self.main_part(id) {
            return Ok(cancelled(c));
        }
        // Its completion is in the queue now if it was cancelled, most
        // often first, where it is taken without the provider's progress;
        // else one look reads the queue to its end (more only where the
        // loop had completions in hand already, which that look gives
        // first).
        let mut more = std::mem::take(&mut self.more);
        let cancel = main.cancel_recv_now(main_ep, half(id, 0), &mut more);
        self.batch.append(&mut more);
        self.more = more;
        cancel?;
        if let Some(c) = self.main_part(id) {
            return Ok(cancelled(c));
        }
        loop {
            let mut more = std::mem::take(&mut self.more);
            let n = main.poll(&mut more, Some(Duration::ZERO));
            self.batch.append(&mut more);
            self.more = more;
            if let Some(c) = self.main_part(id) {
                return Ok(cancelled(c));
            }
            if n? == 0 {
                return Ok(false);
            }
        }
    }

    /// The completion of pair `id`'s main loop part, read and not yet
    /// sorted.
    fn main_part(&self, id: u64) -> Option<&Completion> {
        let t = half(id, 0);
        self.batch.iter().chain(&self.held).find(|c| c.token == t)
    }
}

fn cancelled(c: &Completion) -> bool {
    matches!(c.result, Err(CompletionError::Cancelled))
}
