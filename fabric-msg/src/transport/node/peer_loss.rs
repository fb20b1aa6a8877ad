//! A same-node rank that dies: noticed through a pidfd (`pidfd_open(2)`,
//! Linux 5.3), which becomes readable when the process ends, so a dead
//! rank's ring is never waited on for ever and a recycled pid is never
//! mistaken for it.
//!
//! [`NodeLoop::check_peers`] asks every peer's pidfd without blocking;
//! the caller calls it when it has waited a while with nothing done (a
//! loop that is busy needs no answer). For a rank that is gone it first
//! reads what is left in that rank's ring (the ring is in this rank's
//! segment, so whole messages sent before the death are still delivered),
//! then fails what still needs the rank: receives from exactly that rank,
//! the message it was in the middle of, sends to it, and large messages
//! it was waiting to be read. Receives from any rank stay posted.
//! Where a frame of the rank's waits for an answer about a paired
//! receive (`matching.rs`), all of this waits for a call after it.

use super::node_loop::NodeLoop;
use super::pidfd::Watch;
use crate::transport::event_loop::CompletionError;
use crate::transport::liveness::LossKind;

impl NodeLoop {
    /// Look for ranks whose process has ended; fail what waits on them
    /// (module docs). How many ranks were newly found gone. Cheap (one
    /// `poll` per peer): call it after a while with nothing done.
    pub fn check_peers(&mut self) -> usize {
        let mut found = 0;
        for s in 0..self.ranks() {
            if self.lost[s] || !self.watch[s].as_ref().is_some_and(Watch::gone) {
                continue;
            }
            // What it wrote before it died is whole in our segment; a
            // frame for a paired receive waits for its owner's answer,
            // and the rank is seen gone at a later call.
            if !self.read_all_from(s) {
                continue;
            }
            found += 1;
            self.lost[s] = true;
            let label = self.label(s);
            let how = || CompletionError::PeerLost {
                peer: label.clone(),
                how: LossKind::Died,
            };
            let mut failed = Vec::new();
            if let Some(p) = self.assembling_into(s) {
                failed.push(p);
            }
            failed.extend(self.matcher.cancel_from(s));
            for p in failed {
                let tag = p.tag.0;
                self.fail_recv(p, s, tag, how());
            }
            self.matcher.drop_arriving_from(s);
            while let Some(o) = self.sends[s].pop_front() {
                self.finish_send(s, o, Err(how()));
            }
            self.acks[s].clear();
            for o in self.waiting.take_all(|(peer, _)| *peer == s) {
                self.finish_send(s, o.1, Err(how()));
            }
        }
        found
    }
}
