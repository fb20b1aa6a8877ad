//! A loss: how a peer was lost ([`LossKind`]), and the loss alarm, the
//! lifelines' verdicts readable from any thread while the thread that
//! polls the loop is busy — or stuck.
//!
//! The loop reports a lost peer through `poll` (an [`OpKind::PeerLost`]
//! notice, then the failure of what was addressed to it). That needs the
//! polling thread to come back from libfabric, and a provider whose state
//! lives in memory the lost process shared can keep it inside for ever:
//! libfabric 1.17's shm provider spins on a lock a killed process held.
//! The World ends the process then (its watchdog, `world/liveness.rs`); an
//! [`EventLoop`](crate::EventLoop) user gets this alarm instead, to decide
//! for themselves: a watchdog thread that sees [`LossAlarm::first`] set and
//! the loop still inside the same call a while later knows it is stuck,
//! and what on.
//!
//! The lifelines' thread rings it (one mutex and one atomic, once per lost
//! peer); reading [`LossAlarm::losses`] is one relaxed load. An orderly
//! departure does not ring it.
//!
//! [`OpKind::PeerLost`]: crate::OpKind::PeerLost

use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How a peer was lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LossKind {
    /// Its process ended (or closed the connection) without saying goodbye:
    /// killed, crashed, or exited without closing its event loop.
    Died,
    /// It closed its event loop or the endpoint: an orderly departure.
    Departed,
    /// Nothing heard from it for this long (stopped, hung, or the network
    /// between us is cut).
    Silent(Duration),
    /// It stopped hearing from us for its `peer_timeout` and gave us up
    /// (this process was stopped or starved), so it is gone for us too.
    GaveUpOnUs,
}

impl std::fmt::Display for LossKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LossKind::Died => write!(
                f,
                "its process ended without closing its event loop (killed or crashed)"
            ),
            LossKind::Departed => write!(f, "it closed its event loop or endpoint"),
            LossKind::Silent(d) => write!(
                f,
                "nothing heard from it for {d:?} (stopped, hung or cut off; LoopConfig::peer_timeout)"
            ),
            LossKind::GaveUpOnUs => write!(
                f,
                "it heard nothing from this process for its peer_timeout and gave it up (was this process \
                 stopped or starved?)"
            ),
        }
    }
}

/// A peer the lifelines found lost (dead, silent, or giving this process
/// up), as the [`LossAlarm`] keeps it.
#[derive(Debug, Clone)]
pub struct LostPeer {
    /// The peer's bootstrap address, as the loop's errors name it.
    pub peer: String,
    /// How it was lost.
    pub how: LossKind,
    /// When the lifelines' thread saw it.
    pub at: Instant,
}

impl std::fmt::Display for LostPeer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "peer {} is lost: {}", self.peer, self.how)
    }
}

#[derive(Default)]
struct Rung {
    count: AtomicU64,
    first: Mutex<Option<LostPeer>>,
}

/// The lost peers of one event loop, shared with any thread
/// ([`EventLoop::loss_alarm`](crate::EventLoop::loss_alarm)); cheap to
/// clone.
#[derive(Clone, Default)]
pub struct LossAlarm {
    rung: Arc<Rung>,
}

impl LossAlarm {
    /// How many peers have been lost so far (departures not counted).
    #[inline]
    pub fn losses(&self) -> u64 {
        self.rung.count.load(Ordering::Relaxed)
    }

    /// The first peer lost, if any.
    pub fn first(&self) -> Option<LostPeer> {
        self.rung.first.lock().clone()
    }

    /// Record a loss (the lifelines' thread).
    pub(crate) fn ring(&self, peer: &str, how: LossKind) {
        if how == LossKind::Departed {
            return;
        }
        let mut first = self.rung.first.lock();
        if first.is_none() {
            *first = Some(LostPeer {
                peer: peer.to_string(),
                how,
                at: Instant::now(),
            });
        }
        self.rung.count.fetch_add(1, Ordering::Relaxed);
    }
}

impl std::fmt::Debug for LossAlarm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LossAlarm")
            .field("losses", &self.losses())
            .field("first", &self.first())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::{LossAlarm, LossKind};

    #[test]
    fn departures_do_not_ring_and_the_first_loss_is_kept() {
        let a = LossAlarm::default();
        let seen = a.clone();
        a.ring("10.0.0.1:5000", LossKind::Departed);
        assert_eq!(seen.losses(), 0);
        assert!(seen.first().is_none());
        a.ring("10.0.0.2:5000", LossKind::Died);
        a.ring("10.0.0.3:5000", LossKind::GaveUpOnUs);
        assert_eq!(seen.losses(), 2);
        let first = seen.first().unwrap();
        assert_eq!(first.peer, "10.0.0.2:5000");
        assert_eq!(first.how, LossKind::Died);
        assert!(first
            .to_string()
            .starts_with("peer 10.0.0.2:5000 is lost: its process ended"));
    }
}
