//! The driver task: looks at the loop for the operations no future looks
//! for (waits past their spin, dropped futures, the loop's own upkeep),
//! sleeping by the `fi_trywait` rule between looks, and closes the loop
//! (see [`super`]).

use super::shared::Shared;
use crate::transport::event_loop::{LentFd, SleepCheck};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

/// How long a waiting future keeps looking at the loop itself (the runtime
/// runs other tasks between its looks) before it leaves the loop to the
/// driver, which sleeps on the wait fd: a reply within this is seen by the
/// task that waits for it, with no hop between tasks or threads, as
/// `WaitMode::Block`'s `spin_before_block` (the same 50 µs) does on the
/// blocking loop; after it, a wake-up costs the driver's and the task's.
pub const SPIN_BEFORE_SLEEP: Duration = Duration::from_micros(50);

/// Where the loop has no wait fd: how long a waiting future keeps looking
/// itself before the driver takes over, looking every [`IDLE_PERIOD`].
pub const POLL_BEFORE_SLEEP: Duration = Duration::from_millis(2);

/// How long the driver of a loop without a wait fd sleeps between looks
/// once no future looks: tokio's timer granularity, and the most it adds
/// to a message that arrives after a quiet spell.
pub const IDLE_PERIOD: Duration = Duration::from_millis(1);

/// How often the driver checks, while waits spin, that they still look.
const CHECK_SPINNERS: Duration = Duration::from_millis(10);

/// The longest sleep on the wait fd, even where `prepare_sleep` sets no
/// bound: a guard, should a provider's fd miss an edge, not a clock.
const MAX_SLEEP: Duration = Duration::from_millis(100);

/// Closes the loop when the driver ends, however it ends (its loop's
/// end, or the task dropped with its runtime).
struct CloseOnExit(Arc<Shared>);

impl Drop for CloseOnExit {
    fn drop(&mut self) {
        let (ev, closers) = {
            let mut st = self.0.lock();
            (st.close(), std::mem::take(&mut st.closers))
        };
        // Outside the lock: the loop waits for the provider to let go.
        drop(ev);
        for done in closers {
            let _ = done.send(());
        }
    }
}

/// What the driver does after a look.
enum Next {
    /// Futures look themselves: wait to be told they stopped.
    Told(Duration),
    /// Sleep on the wait fd (and the alarm), at most this long.
    Fd(Duration),
    /// Look again after letting the runtime run other tasks: the loop
    /// was busy within a spin, or `prepare_sleep` asks for a look first.
    Yield,
}

/// The driver's body: runs until the loop closes or a look fails.
pub(super) async fn drive(shared: Arc<Shared>) {
    let closer = CloseOnExit(shared.clone());
    let fd = shared
        .lock()
        .ev
        .as_ref()
        .and_then(|ev| ev.wait_fd())
        .map(|f| f.as_raw_fd());
    // Declared after `closer`, so dropped before it: the fd leaves tokio's
    // reactor before the loop closes it.
    let afd = fd.and_then(
        |fd| match AsyncFd::with_interest(LentFd(fd), Interest::READABLE) {
            Ok(a) => Some(a),
            Err(e) => {
                log::warn!("async loop: the wait fd cannot join tokio's reactor ({e}); polling instead");
                None
            }
        },
    );
    // The loop's count of looks after the driver's last one.
    let mut seen = 0;
    // The loop's count of things done at the driver's last look, and when
    // the driver first saw it so.
    let mut busy = (0, Instant::now());
    // One timer for every turn, moved on each time. A new `sleep` per turn
    // registers a new timer, and tokio wakes its own driver (an eventfd
    // write) whenever that timer is the next to fire: a system call for
    // every turn of a ping-pong. Moving a timer's deadline later only
    // writes it down (tokio's `extend_expiration`).
    let timer = tokio::time::sleep(MAX_SLEEP);
    tokio::pin!(timer);
    loop {
        let next = {
            let mut st = shared.lock();
            if st.closing {
                break;
            }
            let others_looked = st.looks != seen;
            if st.look().is_err() {
                break; // `look` logged it; the loop closes below
            }
            seen = st.looks;
            if st.spinners > 0 && others_looked {
                // Each looks at every poll; the last to stop tells. A
                // spinning wait whose task stopped polling it (a future
                // polled once and put aside) looks no more: the driver
                // finds nobody looked since its last look, and sleeps on
                // the fd instead.
                Next::Told(CHECK_SPINNERS)
            } else if recently(&mut busy, st.busy, st.spin) {
                Next::Yield
            } else {
                match (&afd, st.ev.as_mut().map(|ev| ev.prepare_sleep())) {
                    (Some(_), Some(SleepCheck::Sleep(at_most))) => {
                        Next::Fd(at_most.map_or(MAX_SLEEP, |t| t.min(MAX_SLEEP)))
                    }
                    (Some(_), _) => Next::Yield,
                    (None, _) => Next::Told(IDLE_PERIOD),
                }
            }
        };
        if let Next::Fd(t) | Next::Told(t) = next {
            timer.as_mut().reset(tokio::time::Instant::now() + t);
        }
        match (next, &afd) {
            (Next::Fd(_), Some(afd)) => {
                tokio::select! {
                    _ = shared.driver.notified() => {}
                    r = afd.readable() => {
                        // Cleared before the next look, so anything that
                        // arrives after it is a new edge.
                        if let Ok(mut g) = r {
                            g.clear_ready();
                        }
                    }
                    _ = timer.as_mut() => {}
                }
            }
            (Next::Told(_), _) | (Next::Fd(_), None) => {
                tokio::select! {
                    _ = shared.driver.notified() => {}
                    _ = timer.as_mut() => {}
                }
            }
            (Next::Yield, _) => tokio::task::yield_now().await,
        }
    }
    drop(afd);
    drop(closer);
}

/// Whether the loop did something within `spin`, by the driver's clock:
/// `busy` is the count of things done it saw last and when it first saw
/// it; `now` the loop's count.
fn recently(busy: &mut (u64, Instant), now: u64, spin: Duration) -> bool {
    if busy.0 != now {
        *busy = (now, Instant::now());
    }
    busy.1.elapsed() < spin
}
