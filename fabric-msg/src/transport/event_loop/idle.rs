//! How a wait passes the time while nothing completes: one rule for
//! [`EventLoop::poll`](super::EventLoop::poll), the World's shared-memory
//! lane and its collectives' waits.
//!
//! [`WaitMode::Adaptive`] spins for `spin_before_block` (a reply that comes
//! within microseconds is caught at spinning's latency), then gives the core
//! away between looks (`sched_yield`: a rank that shares its core with the
//! rank it waits for lets that rank run) until `yield_before_block` has
//! passed with nothing done, then sleeps on the completion queue's wait fd
//! where the provider has one (after `fi_trywait`), yielding on where it
//! has none or `yield_before_block` is `None`. A World whose node runs
//! more ranks than it has cores sets `spin_before_block` to zero (it
//! yields from the first empty look) and sleeps after 2 ms; one that does
//! not never sleeps (a wait fd costs every completion: `LoopConfig::yield_before_block`).

use super::types::{LoopConfig, WaitMode};
use std::time::{Duration, Instant};

/// What a wait does next, having found nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pause {
    /// Look again at once.
    Spin,
    /// Give the core away, then look again.
    Yield,
    /// Sleep on the wait fd (where there is none: yield in
    /// [`WaitMode::Adaptive`], spin in [`WaitMode::Block`]).
    Block,
}

/// The rule, and when the current stretch of empty looks began.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Idler {
    mode: WaitMode,
    spin: Duration,
    /// `None`: never sleep.
    block_after: Option<Duration>,
    since: Option<Instant>,
    /// Empty looks still to pass without reading the clock: while a wait
    /// spins, the clock is read every [`CLOCK_EVERY`] looks.
    unread: u32,
}

/// How often a spinning wait reads the clock to see whether its spin is
/// over: every sixteenth empty look. Read at every look (twice, with the
/// World's deadline), `clock_gettime` was 28 % of a World's 8 B ping-pong
/// on the node transport (`perf record`, 2026-12-01); a spin overshoots
/// by at most fifteen looks, a few microseconds.
pub(crate) const CLOCK_EVERY: u32 = 16;

impl Idler {
    pub(crate) fn new(cfg: &LoopConfig) -> Idler {
        Idler {
            mode: cfg.wait,
            spin: cfg.spin_before_block,
            block_after: cfg.yield_before_block.map(|b| b.max(cfg.spin_before_block)),
            since: None,
            unread: 0,
        }
    }

    /// Something completed: the next empty look starts a new stretch.
    #[inline]
    pub(crate) fn busy(&mut self) {
        self.since = None;
    }

    /// What to do after one more empty look.
    #[inline]
    pub(crate) fn next(&mut self) -> Pause {
        if self.mode == WaitMode::Spin {
            return Pause::Spin;
        }
        if self.mode == WaitMode::Block && self.spin.is_zero() {
            return Pause::Block;
        }
        if self.unread > 0 {
            self.unread -= 1;
            return Pause::Spin;
        }
        let now = Instant::now();
        let idle = now.saturating_duration_since(*self.since.get_or_insert(now));
        let pause = match self.mode {
            WaitMode::Block if idle >= self.spin => Pause::Block,
            WaitMode::Adaptive if self.block_after.is_some_and(|b| idle >= b) => Pause::Block,
            WaitMode::Adaptive if idle >= self.spin => Pause::Yield,
            _ => Pause::Spin,
        };
        if pause == Pause::Spin {
            self.unread = CLOCK_EVERY - 1;
        }
        pause
    }

    /// Whether a wait gives the core away from its first empty look (a
    /// World whose node runs more ranks than it has cores).
    #[cfg_attr(not(feature = "tokio"), allow(dead_code))] // the awaited waits ask
    pub(crate) fn yields_at_once(&self) -> bool {
        self.mode == WaitMode::Adaptive && self.spin.is_zero()
    }

    /// Whether the next pause sleeps: waits that look with a zero timeout
    /// then look with a timeout instead, so the loop's own wait sleeps.
    pub(crate) fn sleeping(&self) -> bool {
        let idle = self.since.map_or(Duration::ZERO, |s| s.elapsed());
        match self.mode {
            WaitMode::Spin => false,
            WaitMode::Block => idle >= self.spin,
            _ => self.block_after.is_some_and(|b| idle >= b),
        }
    }
}

/// A wait's clock: its deadline, and when an empty look reads the time.
/// While the wait spins, every [`CLOCK_EVERY`]th look does; the first
/// does (and sets the deadline), and so does the first after a yield or a
/// sleep ([`WaitClock::paused`]), which may have lasted long. One rule for
/// [`EventLoop::poll`](super::EventLoop::poll) and the World's
/// shared-memory lane (a clock read per look was 8 % of a typed message's
/// time there, 2026-11-29).
#[derive(Debug)]
pub(crate) struct WaitClock {
    timeout: Option<Duration>,
    deadline: Option<Instant>,
    /// Empty looks still to pass without reading the clock.
    unread: u32,
}

impl WaitClock {
    /// For a wait of at most `timeout` (`None`: no end of its own).
    pub(crate) fn new(timeout: Option<Duration>) -> WaitClock {
        WaitClock {
            timeout,
            deadline: None,
            unread: 0,
        }
    }

    /// One more empty look: the time, if this look reads the clock.
    #[inline]
    pub(crate) fn look(&mut self) -> Option<Instant> {
        if self.unread > 0 {
            self.unread -= 1;
            return None;
        }
        self.unread = CLOCK_EVERY - 1;
        let now = Instant::now();
        if let (None, Some(t)) = (self.deadline, self.timeout) {
            self.deadline = Some(now + t);
        }
        Some(now)
    }

    /// The time left at `now` before the deadline (`None`: no deadline);
    /// zero once it has passed.
    pub(crate) fn left(&self, now: Instant) -> Option<Duration> {
        self.deadline.map(|d| d.saturating_duration_since(now))
    }

    /// Whether the deadline has passed at `now`.
    pub(crate) fn passed(&self, now: Instant) -> bool {
        self.left(now).is_some_and(|l| l.is_zero())
    }

    /// The wait yielded or slept: the next look reads the clock.
    pub(crate) fn paused(&mut self) {
        self.unread = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_clock_reads_the_time_every_sixteenth_look_and_after_a_pause() {
        let mut c = WaitClock::new(Some(Duration::from_millis(30)));
        let first = c.look().expect("the first look reads the clock");
        assert_eq!(c.left(first), Some(Duration::from_millis(30)));
        for _ in 1..CLOCK_EVERY {
            assert_eq!(c.look(), None);
        }
        assert!(c.look().is_some());
        assert_eq!(c.look(), None);
        c.paused();
        let now = c.look().expect("a look after a pause reads the clock");
        assert!(!c.passed(now));
        std::thread::sleep(Duration::from_millis(31));
        c.paused();
        let late = c.look().expect("read");
        assert!(c.passed(late));
        assert_eq!(c.left(late), Some(Duration::ZERO));
        let mut endless = WaitClock::new(None);
        let now = endless.look().expect("read");
        assert_eq!(endless.left(now), None);
        assert!(!endless.passed(now));
    }

    fn idler(mode: WaitMode, spin_us: u64, block_us: u64) -> Idler {
        Idler::new(&LoopConfig {
            wait: mode,
            spin_before_block: Duration::from_micros(spin_us),
            yield_before_block: Some(Duration::from_micros(block_us)),
            ..LoopConfig::default()
        })
    }

    #[test]
    fn adaptive_spins_then_yields_then_sleeps_and_starts_over_when_busy() {
        let mut i = idler(WaitMode::Adaptive, 20_000, 40_000);
        assert_eq!(i.next(), Pause::Spin);
        std::thread::sleep(Duration::from_millis(25));
        // The spin's end is seen at the next look that reads the clock.
        for _ in 1..CLOCK_EVERY {
            assert_eq!(i.next(), Pause::Spin);
        }
        assert_eq!(i.next(), Pause::Yield);
        assert!(!i.sleeping());
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(i.next(), Pause::Block);
        assert!(i.sleeping());
        i.busy();
        assert_eq!(i.next(), Pause::Spin);
    }

    #[test]
    fn with_no_spin_adaptive_yields_at_once_and_spin_never_stops_spinning() {
        assert_eq!(idler(WaitMode::Adaptive, 0, 1_000_000).next(), Pause::Yield);
        // What the World's awaited waits ask (`world/awaiting.rs`).
        assert!(idler(WaitMode::Adaptive, 0, 1_000_000).yields_at_once());
        assert!(!idler(WaitMode::Adaptive, 50, 1_000_000).yields_at_once());
        assert!(!idler(WaitMode::Spin, 0, 0).yields_at_once());
        assert_eq!(idler(WaitMode::Block, 0, 0).next(), Pause::Block);
        let mut s = idler(WaitMode::Spin, 0, 0);
        std::thread::sleep(Duration::from_millis(2));
        assert_eq!(s.next(), Pause::Spin);
        assert!(!s.sleeping());
    }
}
