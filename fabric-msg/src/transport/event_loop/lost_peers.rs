//! Peers lost, as the loop reports them (one part of liveness: the whole
//! is listed in [`crate::transport::liveness`]): the lifelines' verdicts
//! turned into a [`OpKind::PeerLost`] notice
//! (for a death or a stall; a peer that closed its loop departs quietly)
//! and the failure of every operation addressed to the lost peer.
//!
//! - On a connected (MSG) endpoint, the peer's connection endpoint is
//!   closed after [`LOSS_GRACE`](crate::transport::liveness::LOSS_GRACE), in which what the peer sent before it
//!   went is still delivered; once `fi_close` returns, the provider no
//!   longer touches its operations' buffers, so each operation still
//!   posted completes with [`CompletionError::PeerLost`] and its buffer.
//! - On an RDM endpoint, shared with other peers, the operations addressed
//!   to the lost peer (sends, directed receives, one-sided operations) are
//!   given [`LOSS_GRACE`](crate::transport::liveness::LOSS_GRACE) to come back from the provider, with their
//!   buffers (a failure among them is reported as `PeerLost`); those the
//!   provider still holds after that complete with `PeerLost` without their
//!   buffer, which stays with the loop until the provider lets go of it or
//!   the endpoint closes, as for a timed-out one-sided operation.
//! - Later posts to the peer fail at once with [`Error::PeerLost`].

use super::types::CompletionError;
use crate::error::{Error, Result};
use crate::ffi;
use crate::transport::liveness::{Lifelines, LossAlarm, LossKind};
use std::time::Instant;

/// A peer watched through its lifeline.
pub(super) struct Watched {
    pub(super) id: u64,
    pub(super) endpoint: u32,
    pub(super) addr: u64,
    /// Its bootstrap socket address, to name it.
    pub(super) label: String,
    pub(super) lost: Option<LossKind>,
}

/// The loop's lifelines and what it has learnt from them.
#[derive(Default)]
pub(crate) struct LostPeers {
    pub(super) lifelines: Option<Lifelines>,
    /// What the lifelines ring for other threads (kept for the loop's
    /// life: the lifelines start only with the first peer).
    pub(super) alarm: LossAlarm,
    pub(super) watched: Vec<Watched>,
    /// The lifelines' epoch last handled.
    pub(super) seen: u64,
    /// Lost peers: (endpoint, fi_addr), `FI_ADDR_UNSPEC` for a connection.
    pub(super) addrs: Vec<(u32, u64)>,
    /// Lost peers' connections to close once the provider had its grace
    /// to deliver what had arrived: (endpoint, when, why).
    pub(super) closing: Vec<(u32, Instant, CompletionError)>,
}

impl LostPeers {
    /// Whether a loss is waiting to be handled: one atomic load.
    #[inline]
    pub(super) fn changed(&self) -> bool {
        self.lifelines.as_ref().is_some_and(|l| l.epoch() != self.seen)
    }

    /// Whether `poll` must wake now and then to look for losses.
    pub(super) fn watching(&self) -> bool {
        self.lifelines.is_some()
    }

    /// Whether a lost peer's connection waits for its grace to end (so
    /// `poll` must read the clock).
    #[inline]
    pub(super) fn closing(&self) -> bool {
        !self.closing.is_empty()
    }

    /// Whether a lost peer's connection is due to be closed.
    pub(super) fn closing_due(&self, now: Instant) -> bool {
        self.closing.iter().any(|&(_, t, _)| t <= now)
    }

    fn error(&self, w: &Watched, how: LossKind) -> Error {
        Error::PeerLost {
            peer: w.label.clone(),
            why: how.to_string(),
        }
    }

    /// Whether no peer is lost (then `check` passes everything).
    #[inline]
    pub(crate) fn none(&self) -> bool {
        self.addrs.is_empty()
    }

    /// `Err` if the peer at (`endpoint`, `addr`) is lost.
    #[inline]
    pub(crate) fn check(&self, endpoint: u32, addr: u64) -> Result<()> {
        if self.addrs.is_empty() || !self.addrs.contains(&(endpoint, addr)) {
            return Ok(());
        }
        match self
            .watched
            .iter()
            .find(|w| w.endpoint == endpoint && w.addr == addr)
        {
            Some(w) => Err(self.error(w, w.lost.unwrap_or(LossKind::Died))),
            None => Ok(()),
        }
    }

    /// Why endpoint `endpoint` is gone, if it was a lost peer's connection.
    pub(crate) fn closed(&self, endpoint: u32) -> Option<Error> {
        self.watched
            .iter()
            .find(|w| w.endpoint == endpoint && w.addr == ffi::FI_ADDR_UNSPEC)
            .and_then(|w| w.lost.map(|how| self.error(w, how)))
    }

    /// Stop watching the peers of `endpoint`, saying goodbye: it is closing.
    pub(super) fn leave_endpoint(&mut self, endpoint: u32) {
        let Some(l) = &self.lifelines else { return };
        for w in self
            .watched
            .iter_mut()
            .filter(|w| w.endpoint == endpoint && w.lost.is_none())
        {
            l.leave(w.id);
            w.lost = Some(LossKind::Departed);
        }
    }

    /// Whether a peer was lost (died, fell silent, or gave us up), as
    /// opposed to departing in order.
    pub(super) fn lost_count(&self) -> usize {
        self.watched
            .iter()
            .filter(|w| w.lost.is_some_and(|k| k != LossKind::Departed))
            .count()
    }

    pub(super) fn any_lost(&self) -> bool {
        self.watched
            .iter()
            .any(|w| w.lost.is_some_and(|k| k != LossKind::Departed))
    }
}
