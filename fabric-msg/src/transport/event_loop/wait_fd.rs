//! Waiting on the loop from someone else's event loop (epoll, mio, a
//! `poll(2)` of one's own): the completion queue's wait fd and the
//! `fi_trywait` rule that makes sleeping on it safe.
//!
//! ```no_run
//! # fn run(ev: &mut fabric_msg::EventLoop) -> fabric_msg::Result<()> {
//! use fabric_msg::SleepCheck;
//! use std::os::fd::AsRawFd;
//! let fd = ev.wait_fd().expect("WaitMode::Block on a provider with a wait object").as_raw_fd();
//! let mut out = Vec::new();
//! loop {
//!     ev.poll(&mut out, Some(std::time::Duration::ZERO))?;
//!     for c in out.drain(..) { /* ... */ }
//!     match ev.prepare_sleep() {
//!         SleepCheck::PollFirst => continue,
//!         SleepCheck::Sleep(at_most) => {
//!             // epoll_wait / mio::Poll::poll on `fd` and your own fds,
//!             // for at most `at_most` (None: as long as you like).
//!         }
//!     }
//! }
//! # }
//! ```
//!
//! The rule (fi_poll(3), `fi_trywait`): a provider may hold completions, or
//! work that produces them, that its fd does not announce — data that
//! arrived while nobody was looking, a protocol step only a read of the CQ
//! drives. [`EventLoop::prepare_sleep`] asks it (`fi_trywait`) and looks at
//! the loop's own pending work (completions already reaped, sends waiting
//! for room, emulated atomics to answer); only when it says
//! [`SleepCheck::Sleep`] may the caller sleep on the fd, and then for at
//! most the time it gives: the loop's own clocks (one-sided deadlines,
//! the lifelines' losses, backlogged sends) need a `poll` now and then,
//! which no fd announces. After a wake-up, or the time, call `poll` with a
//! zero timeout. A provider may decline for a while: libfabric 1.17's
//! `ofi_rxm` declines while it sets up a connection (the first message
//! to or from a peer, about 10 ms here), which only polls drive; the outer
//! loop then polls rather than sleeps until it is done.
//!
//! Where there is no fd: a loop has one only if it was opened to sleep
//! ([`WaitMode::Block`](crate::WaitMode::Block), or [`WaitMode::Adaptive`](crate::WaitMode::Adaptive) with a
//! `yield_before_block`) on a provider with a wait object. libfabric's
//! shm has none (1.17 opens no `FI_WAIT_FD` CQ for it): [`EventLoop::wait_fd`]
//! is `None` there, and such a loop is driven by polling — from a timer of
//! the outer loop, or on a thread of its own that hands completions over a
//! channel ([`EventLoop::forward`]). fabric-msg does not fake an fd (an
//! eventfd it would signal) for it: nothing would signal it but a thread
//! polling the CQ, which is that second design with an extra hop.

use super::state::EventLoop;
use std::os::fd::{BorrowedFd, RawFd};
use std::time::Duration;

/// A descriptor lent to a reactor's registration (tokio's `AsyncFd` wants
/// an owner that is `AsRawFd`): a loop's wait fd, the node doorbell's
/// eventfd. Closing it stays with its owner, which outlives the
/// registration (the async driver's, `async_loop/driver.rs`; an awaited
/// World wait's nap, `world/awaiting.rs`).
#[cfg(feature = "tokio")]
pub(crate) struct LentFd(pub(crate) RawFd);

#[cfg(feature = "tokio")]
impl std::os::fd::AsRawFd for LentFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0
    }
}

/// What [`EventLoop::prepare_sleep`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SleepCheck {
    /// Work is waiting that the fd may not announce: `poll` (with a zero
    /// timeout) before sleeping.
    PollFirst,
    /// Sleeping on [`EventLoop::wait_fd`] is safe, for at most this long
    /// (`None`: until it is readable).
    Sleep(Option<Duration>),
}

/// How often a sleeping outer loop must come back for the loop's clocks
/// (the same tick as `poll`'s own wait uses).
const CLOCK_TICK: Duration = Duration::from_millis(50);

impl EventLoop {
    /// The completion queue's wait fd, readable when a completion may be
    /// ready; `None` where the loop has none (see the module doc of
    /// `transport/event_loop/wait_fd.rs`: open the loop with
    /// [`WaitMode::Block`](crate::WaitMode::Block) on a provider with a wait object). It lives as
    /// long as the loop; sleep on it only after [`EventLoop::prepare_sleep`]
    /// says so.
    pub fn wait_fd(&self) -> Option<BorrowedFd<'_>> {
        let fd = self.objects.cq.wait_fd()?;
        // SAFETY: the fd belongs to the CQ, which stays open while the
        // loop (and so this borrow of it) lives.
        Some(unsafe { BorrowedFd::borrow_raw(fd) })
    }

    /// Whether the caller may sleep on [`EventLoop::wait_fd`] now, and for
    /// how long at most: `fi_trywait` on the completion queue, and the
    /// loop's own pending work and clocks. Where the loop has no wait fd it
    /// always says [`SleepCheck::PollFirst`].
    pub fn prepare_sleep(&mut self) -> SleepCheck {
        if self.objects.cq.wait_fd().is_none()
            || !self.pending.is_empty()
            || self.am_pending()
            || !self.objects.cq.try_wait()
        {
            return SleepCheck::PollFirst;
        }
        let mut at_most = None;
        if self.slab.timed > 0 || self.lost.watching() || self.lost.closing() {
            at_most = Some(CLOCK_TICK);
        }
        if let Some(tick) = self.backlog_tick() {
            at_most = Some(at_most.map_or(tick, |t: Duration| t.min(tick)));
        }
        SleepCheck::Sleep(at_most)
    }

    /// Sleep on the wait fd until it is readable, for at most `at_most`
    /// (rounded up to a millisecond): only after [`EventLoop::prepare_sleep`]
    /// said [`SleepCheck::Sleep`] (so there is an fd), and within the time
    /// it gave.
    pub(crate) fn sleep_on_fd(&self, at_most: Duration) {
        if let Some(fd) = self.objects.cq.wait_fd() {
            sleep_on(fd, Some(at_most));
        }
    }
}

/// Sleep until `fd` is readable, for at most `at_most` (`None`: no limit),
/// rounded up to a millisecond; a signal ends it early, as a wake-up does.
pub(super) fn sleep_on(fd: RawFd, at_most: Option<Duration>) {
    let ms = at_most.map_or(-1, |r| r.as_millis().clamp(1, i32::MAX as u128) as i32);
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd on the stack; poll returns on readiness,
    // timeout or a signal, and writes only `revents`.
    unsafe { libc::poll(&mut pfd, 1, ms) };
}
