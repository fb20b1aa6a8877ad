//! Probes: how ranks that called different collectives find out, where
//! the collectives run as message schedules. Two ranks in collective `k`
//! of one communicator, one in a barrier and one in an allreduce, post
//! receives for steps the other never sends, and would wait for ever (an
//! MPI job does). So a run that has waited [`PROBE_AFTER`] tells each
//! rank it still waits for which collective it is in: a notice with the
//! probe bit (`notice.rs`) and the collective's name. A rank that runs
//! collective `k` of that communicator under another name fails it,
//! saying both, and its failure notice fails the others' runs of `k`
//! (`engine.rs`); a rank in the same collective ignores the probe; a rank
//! that has not reached `k` keeps it and compares when it starts `k`; a
//! rank past it drops it. One probe per peer per run that waits that long,
//! so a peer that computes for a minute costs each waiting rank a few
//! small messages. The blocking calls in the node's slots compare their
//! headers instead (`on_node.rs`); a probe that reaches one (its number
//! run as a message schedule elsewhere: the non-blocking form) fails it
//! (`Engine::slot_call_heard`).

use super::run::Progress;
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// How long a run waits before it probes the ranks it waits for.
pub(crate) const PROBE_AFTER: Duration = Duration::from_secs(1);

/// Empty looks of a wait between two readings of the clock.
const LOOKS_PER_CLOCK: u32 = 256;

/// Runs not yet probed for, oldest first.
#[derive(Debug, Default)]
pub(super) struct Probes {
    /// (engine id, start) of each run until it is probed for or ends.
    waiting: VecDeque<(u32, Instant)>,
    /// Empty looks since the clock was last read.
    looks: u32,
    /// The ranks one run waits for (kept to spare an allocation).
    peers: Vec<u32>,
}

impl Probes {
    /// Run `id` starts.
    pub(super) fn started(&mut self, id: u32) {
        self.waiting.push_back((id, Instant::now()));
    }

    /// Whether an empty look of a wait should give the engine a pass, so
    /// that a probe that is due goes out: the clock is read once every
    /// `LOOKS_PER_CLOCK` looks, or at every look of a wait that sleeps
    /// between looks.
    pub(super) fn due(&mut self, sleeping: bool) -> bool {
        let Some(&(_, since)) = self.waiting.front() else {
            return false;
        };
        self.looks = self.looks.wrapping_add(1);
        (sleeping || self.looks % LOOKS_PER_CLOCK == 0) && since.elapsed() >= PROBE_AFTER
    }

    /// Probe for the runs of `runs` that have waited `PROBE_AFTER`:
    /// `send(ctx, seq, ranks, name)` for each, with the ranks it waits for;
    /// forget the runs that ended.
    pub(super) fn send_due(
        &mut self,
        runs: &[Box<dyn Progress>],
        mut send: impl FnMut(u8, u32, &[u32], &str),
    ) {
        if self.waiting.len() > 2 * runs.len() + 8 {
            // Runs that ended behind a young one at the front: forget them,
            // so the queue stays as long as the runs in flight.
            self.waiting.retain(|(id, _)| runs.iter().any(|r| r.id() == *id));
        }
        let mut now = None;
        while let Some(&(id, since)) = self.waiting.front() {
            let Some(run) = runs.iter().find(|r| r.id() == id) else {
                self.waiting.pop_front();
                continue;
            };
            if now
                .get_or_insert_with(Instant::now)
                .saturating_duration_since(since)
                < PROBE_AFTER
            {
                return;
            }
            self.waiting.pop_front();
            self.peers.clear();
            run.awaited(&mut self.peers);
            let (seq, what) = (run.seq(), run.what());
            if !self.peers.is_empty() {
                log::debug!(
                    "{what} (collective #{seq}) has waited {PROBE_AFTER:?} for ranks {:?}: telling them which \
                     collective this is",
                    self.peers
                );
                send(run.scope().ctx, seq, &self.peers, what);
            }
        }
    }
}
