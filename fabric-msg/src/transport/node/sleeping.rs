//! How a [`NodeLoop`]'s owner sleeps until a peer writes to it: on its
//! doorbell alone, or on its doorbell and another descriptor at once (the
//! World's main loop's wait fd), `doorbell.rs` says how.

use super::doorbell::Doorbell;
use super::node_loop::NodeLoop;
use std::os::fd::RawFd;
use std::time::Duration;

impl NodeLoop {
    /// Sleep until a peer writes to this rank, for at most `timeout`
    /// (`doorbell.rs`); at once if a frame has arrived already. Call it
    /// after [`NodeLoop::poll`] found nothing. A send waiting for room in a
    /// peer's ring is not a reason to wake: keep `timeout` short while
    /// sends wait ([`NodeLoop::pending`]).
    pub fn sleep(&self, timeout: Duration) {
        self.sleep_unless(timeout, || false);
    }

    /// [`NodeLoop::sleep`], but at once also if `came` says something
    /// else a peer writes has come (a collective slot: its writer rings
    /// the doorbell too). `came` is asked after the doorbell is armed, so
    /// a write it would see is never slept through.
    pub(crate) fn sleep_unless(&self, timeout: Duration, came: impl FnOnce() -> bool) {
        Doorbell::of(&self.own).sleep(timeout, || !self.frame_waits() && !came());
    }

    /// Whether [`NodeLoop::sleep_beside`] is woken by every peer that
    /// connected: this rank's segment has an eventfd and each peer took it
    /// (`pidfd_getfd`, which a kernel or ptrace policy may refuse).
    pub(crate) fn can_sleep_beside(&self) -> bool {
        self.own.all_reach_bell()
    }

    /// [`NodeLoop::sleep_unless`], also waking when `other` is readable.
    /// Only where [`NodeLoop::can_sleep_beside`]: otherwise a peer that
    /// could not take the eventfd does not wake it, and only `timeout`
    /// ends the sleep.
    pub(crate) fn sleep_beside(&self, other: RawFd, timeout: Duration, came: impl FnOnce() -> bool) {
        Doorbell::of(&self.own).sleep_beside(other, timeout, || !self.frame_waits() && !came());
    }

    /// Announce a wait on this rank's doorbell that the caller runs itself
    /// (an async runtime's reactor, beside other descriptors), where every
    /// peer can ring it ([`NodeLoop::can_sleep_beside`]); `None` where it
    /// cannot. Dropping the answer takes the announcement back. Keep it no
    /// longer than this loop.
    pub(crate) fn arm(&self) -> Option<Announced> {
        if !self.can_sleep_beside() {
            return None;
        }
        let bell = Doorbell::of(&self.own);
        let fd = bell.arm(|| !self.frame_waits());
        Some(Announced { bell, fd })
    }

    /// Whether a frame waits in a ring still read (the doorbell's last
    /// look before its owner sleeps).
    fn frame_waits(&self) -> bool {
        self.inbox
            .iter()
            .enumerate()
            .any(|(s, c)| self.broken[s].is_none() && !self.lost[s] && c.has_frame())
    }
}

/// A wait announced on a node loop's doorbell ([`NodeLoop::arm`]): peers
/// write its eventfd until it is dropped, which takes the announcement
/// back and drains the eventfd (at a wait's end, or mid-wait with an
/// async future dropped by a `timeout`).
pub(crate) struct Announced {
    bell: Doorbell,
    /// The eventfd to wait on; `None` where a frame came meanwhile (do
    /// not wait).
    #[cfg_attr(not(feature = "tokio"), allow(dead_code))] // the awaited waits read it
    pub(crate) fd: Option<RawFd>,
}

impl Drop for Announced {
    fn drop(&mut self) {
        self.bell.disarm();
    }
}
