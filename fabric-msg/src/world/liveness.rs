//! What the World knows of ranks that went away: set by whichever launcher
//! watches them (the rendezvous' sockets, PMIx events), read by every World
//! call with one atomic load, so the hot path pays nothing for it.

use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;

const NONE: u32 = u32::MAX;

/// The first rank lost, and why.
#[derive(Debug)]
pub(crate) struct Liveness {
    first: AtomicU32,
    detail: Mutex<Vec<(u32, String)>>,
    /// Set with the first loss; the event loop's `give_up`, so a post
    /// blocked on a queue full of messages for the dead rank ends at once.
    any: Arc<AtomicBool>,
}

impl Default for Liveness {
    fn default() -> Self {
        Liveness {
            first: AtomicU32::new(NONE),
            detail: Mutex::new(Vec::new()),
            any: Arc::new(AtomicBool::new(false)),
        }
    }
}

impl Liveness {
    /// Record that `rank` is gone; the first one recorded is what
    /// [`Liveness::first_lost`] reports.
    pub(crate) fn lose(&self, rank: u32, why: String) {
        let mut detail = self.detail.lock();
        if detail.iter().any(|(r, _)| *r == rank) {
            return;
        }
        log::warn!("rank {rank} lost: {why}");
        detail.push((rank, why));
        let _ = self
            .first
            .compare_exchange(NONE, rank, Ordering::Release, Ordering::Relaxed);
        self.any.store(true, Ordering::Release);
    }

    /// A flag that turns true with the first loss.
    pub(crate) fn flag(&self) -> Arc<AtomicBool> {
        self.any.clone()
    }

    /// The first rank lost, if any (one atomic load).
    pub(crate) fn first_lost(&self) -> Option<u32> {
        match self.first.load(Ordering::Acquire) {
            NONE => None,
            r => Some(r),
        }
    }

    /// Why `rank` was lost, if it was.
    pub(crate) fn why(&self, rank: u32) -> Option<String> {
        self.detail
            .lock()
            .iter()
            .find(|(r, _)| *r == rank)
            .map(|(_, w)| w.clone())
    }

    /// Every rank lost so far.
    pub(crate) fn all(&self) -> Vec<u32> {
        self.detail.lock().iter().map(|(r, _)| *r).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_loss_is_kept_and_each_rank_is_recorded_once() {
        let l = Liveness::default();
        assert_eq!(l.first_lost(), None);
        assert!(!l.flag().load(Ordering::Acquire));
        l.lose(3, "killed".into());
        assert!(l.flag().load(Ordering::Acquire));
        l.lose(1, "exited".into());
        l.lose(3, "again".into());
        assert_eq!(l.first_lost(), Some(3));
        assert_eq!(l.why(3).as_deref(), Some("killed"));
        assert_eq!(l.all(), vec![3, 1]);
    }
}
