//! Messages that reached this rank another way (the World's fabric),
//! matched here beside the node's own: one matching engine for both, so a
//! receive from any rank waits in one place, and the oldest receive that
//! matches a message takes it whichever way it came (UCX's worker, Open
//! MPI's ob1 and libfabric's `lnx` shared receive context have this
//! shape). The World's side, which takes them off the fabric, is
//! `world/local/engine.rs`.
//!
//! Their sender is [`FAR`], which no receive names: the World's receives
//! name their sender in the tag, never as a node index. A far message is
//! either whole (eager: copied into the receive it matches, or kept
//! unexpected) or announced (its data still at the sender): the receive it
//! matches is handed back to the World with the announcement
//! ([`NodeLoop::take_far`]), which fetches the data into it over the
//! fabric.

use super::matching::{FarMatch, Match, Posted};
use super::node_loop::NodeLoop;
use crate::error::Result;

/// The sender index of every far message.
pub(crate) const FAR: usize = usize::MAX;

impl NodeLoop {
    /// A whole message with World tag `tag` that came another way: copied
    /// into the oldest posted receive it matches (its completion comes
    /// with the next [`NodeLoop::poll`]), or kept for the first receive
    /// that matches it.
    pub(crate) fn arrive_far(&mut self, tag: u64, data: &[u8]) -> Result<()> {
        match self.matcher.take_posted(FAR, tag) {
            Match::Take(p) => self.deliver_whole(p, FAR, tag, data),
            // No receive is paired where far messages come here.
            Match::None | Match::Ask => {
                let i = self
                    .matcher
                    .start_arrived(FAR, tag, data.len())
                    .map_err(crate::error::Error::Usage)?;
                let a = self.matcher.arrived_mut(i);
                a.data.extend_from_slice(data);
                a.complete = true;
            }
        }
        Ok(())
    }

    /// An announced message with World tag `tag` and `total` bytes: the
    /// oldest posted receive it matches goes to [`NodeLoop::take_far`]
    /// with `ticket`; or the announcement is kept for the first receive
    /// that matches it.
    pub(crate) fn announce_far(&mut self, tag: u64, total: usize, ticket: u64) {
        match self.matcher.take_posted(FAR, tag) {
            Match::Take(posted) => self.matcher.far.push(FarMatch {
                posted,
                tag,
                total,
                ticket,
            }),
            Match::None | Match::Ask => self.matcher.keep_request(FAR, tag, total, (0, ticket)),
        }
    }

    /// Receives matched to announced messages since the last call (into
    /// `out`): the caller fetches each one's data.
    pub(crate) fn take_far(&mut self, out: &mut Vec<FarMatch>) {
        out.append(&mut self.matcher.far);
    }

    /// Whether a receive waits to be handed to [`NodeLoop::take_far`].
    pub(crate) fn has_far(&self) -> bool {
        !self.matcher.far.is_empty()
    }

    /// Receive `p` takes a kept announcement (tag `tag`, `total` bytes,
    /// `ticket`): handed over to [`NodeLoop::take_far`] (a kept whole far
    /// message is copied as a node message is, `deliver_arrived`).
    pub(super) fn deliver_far(&mut self, p: Posted, tag: u64, total: usize, ticket: u64) {
        self.matcher.far.push(FarMatch {
            posted: p,
            tag,
            total,
            ticket,
        });
    }
}
