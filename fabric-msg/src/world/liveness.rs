//! What the World knows of ranks that went away: set by whichever launcher
//! watches them (the rendezvous' sockets, PMIx events), read by every World
//! call with one atomic load, so the hot path pays nothing for it.
//!
//! And the last resort when a loss cannot be reported: a rank SIGKILLed
//! while it held one of libfabric 1.17 shm's locks in shared memory leaves
//! every rank that sends to it spinning inside `fi_tsend` or `fi_cq_read`
//! for ever, where no error can reach the application. World calls mark
//! their entry and exit (a relaxed load and store of two counters, no
//! locked instruction: [`Calls`]); once a rank is
//! lost, a watchdog thread ends the process, naming the lost rank, if one
//! World call has not returned [`STUCK`] after the loss was noticed.
//!
//! This is the World's part of peer-loss detection; the whole, the event
//! loop's lifelines included, is listed in [`crate::transport::liveness`].

use super::kept::keep;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const NONE: u32 = u32::MAX;

/// How long one World call may go on after a loss was noticed before the
/// process is taken to be stuck inside libfabric. A call that is not stuck
/// returns within [`LOSS_GRACE`](crate::transport::liveness::LOSS_GRACE)
/// (300 ms) of the loss.
pub(crate) const STUCK: Duration = Duration::from_secs(3);

/// How long one call may go on after a loss before the watchdog says so
/// (without ending anything yet).
const NOTICE: Duration = Duration::from_millis(500);

/// The exit status of a process the watchdog ends.
const STUCK_EXIT: i32 = 70;

/// The first rank lost, and why.
#[derive(Debug)]
pub(crate) struct Liveness {
    first: AtomicU32,
    detail: Mutex<Vec<(u32, String)>>,
    /// Set with the first loss; the event loop's `give_up`, so a post
    /// blocked on a queue full of messages for the dead rank ends at once.
    any: Arc<AtomicBool>,
    /// The World's calls, for the watchdog.
    calls: &'static Calls,
    watching: AtomicBool,
    /// What a call that does not end is doing (see
    /// [`Liveness::enter_for_good`]); `None`: an ordinary World call.
    doing: Mutex<Option<String>>,
    /// This rank and its provider, for the watchdog's last words.
    me: u32,
    provider: String,
}

impl Default for Liveness {
    fn default() -> Self {
        Liveness::new(0, String::new())
    }
}

impl Liveness {
    pub(crate) fn new(me: u32, provider: String) -> Liveness {
        Liveness {
            first: AtomicU32::new(NONE),
            detail: Mutex::new(Vec::new()),
            any: Arc::new(AtomicBool::new(false)),
            calls: Calls::new(),
            watching: AtomicBool::new(false),
            doing: Mutex::new(None),
            me,
            provider,
        }
    }

    /// A World call begins; it ends when the guard drops.
    #[inline]
    pub(crate) fn call(&self) -> Call {
        self.calls.enter();
        Call(self.calls)
    }

    /// A call that does not end: the World's teardown, where closing an
    /// endpoint may wait for a lock a lost rank held. `doing` is what the
    /// watchdog names if it stalls.
    pub(crate) fn enter_for_good(&self, doing: String) {
        *self.doing.lock() = Some(doing);
        self.calls.enter();
    }

    /// The call begun with [`Liveness::enter_for_good`] is over after all:
    /// the process is exiting, past the World.
    pub(crate) fn leave_for_good(&self) {
        self.calls.leave();
        bump(&self.calls.entered);
    }

    /// The teardown moved on to `doing` (a new step: the watchdog's clock
    /// starts again).
    pub(crate) fn now_doing(&self, doing: String) {
        *self.doing.lock() = Some(doing);
        bump(&self.calls.entered);
    }

    /// What the watchdog says is blocking.
    fn blocked_in(&self) -> String {
        self.doing.lock().clone().unwrap_or_else(|| {
            format!(
                "a World call (inside libfabric's {} provider, where a lock the lost process held can \
                 keep it)",
                self.provider
            )
        })
    }

    /// Start the watchdog (once), after the first loss.
    pub(crate) fn watch_for_stuck(self: &Arc<Self>) {
        if self.watching.swap(true, Ordering::AcqRel) {
            return;
        }
        let live = self.clone();
        let spawned = std::thread::Builder::new()
            .name("fabric-msg-stuck".into())
            .spawn(move || live.watchdog());
        if let Err(e) = spawned {
            log::warn!("no watchdog for calls stuck after a loss: {e}");
        }
    }

    fn watchdog(&self) {
        let mut seen = self.calls.entered.load(Ordering::Relaxed);
        let mut since = Instant::now();
        let mut told = false;
        loop {
            std::thread::sleep(Duration::from_millis(100));
            let now = self.calls.entered.load(Ordering::Relaxed);
            if now != seen || self.calls.depth.load(Ordering::Relaxed) == 0 {
                // Outside any call, or a new call: the World reports the
                // loss there. Keep watching the calls still to come.
                seen = now;
                since = Instant::now();
                told = false;
                continue;
            }
            let stuck = since.elapsed();
            if stuck >= NOTICE && !told {
                // Say it now: a launcher may end this process before
                // STUCK (Slurm kills a step about 1 s after a task dies).
                told = true;
                self.say(&format!(
                    "is still in {} {} ms after it noticed; if that has not returned {} ms from now, \
                     the process ends with status {STUCK_EXIT}",
                    self.blocked_in(),
                    NOTICE.as_millis(),
                    (STUCK - NOTICE).as_millis()
                ));
            }
            if stuck < STUCK {
                continue;
            }
            self.say(&format!(
                "has been in {} for {} s since, which cannot be interrupted: exiting with status \
                 {STUCK_EXIT} rather than hang",
                self.blocked_in(),
                STUCK.as_secs()
            ));
            // SAFETY: _exit ends the process at once, without running
            // atexit handlers or destructors, which could wait for the same
            // lock; nothing of this process is used after it.
            unsafe { libc::_exit(STUCK_EXIT) };
        }
    }

    /// One line on stderr, in one write: the lost rank, why, and `what`
    /// this rank does about it.
    fn say(&self, what: &str) {
        let rank = self.first_lost().unwrap_or(NONE);
        let why = self.why(rank).unwrap_or_default();
        let line = format!(
            "fabric-msg: rank {}: rank {rank} is lost: {why}; this rank {what}\n",
            self.me
        );
        use std::io::Write;
        std::io::stderr().write_all(line.as_bytes()).ok();
    }

    /// Record that `rank` is gone; the first one recorded is what
    /// [`Liveness::first_lost`] reports.
    pub(crate) fn lose(self: &Arc<Self>, rank: u32, why: String) {
        let mut detail = self.detail.lock();
        if detail.iter().any(|(r, _)| *r == rank) {
            return;
        }
        log::warn!(peer = rank, op = "liveness", reason = why.as_str(); "rank {rank} lost: {why}");
        detail.push((rank, why));
        let _ = self
            .first
            .compare_exchange(NONE, rank, Ordering::Release, Ordering::Relaxed);
        self.any.store(true, Ordering::Release);
        drop(detail);
        self.watch_for_stuck();
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

    /// The first rank lost, waiting up to `grace` for one (sleeping 2 ms
    /// between looks): a failure that a loss may explain can come before
    /// the loss itself is heard of here (see
    /// [`LOSS_GRACE`](crate::transport::liveness::LOSS_GRACE)).
    pub(crate) fn first_lost_within(&self, grace: Duration) -> Option<u32> {
        let until = Instant::now() + grace;
        loop {
            if let Some(rank) = self.first_lost() {
                return Some(rank);
            }
            if Instant::now() >= until {
                return None;
            }
            std::thread::sleep(Duration::from_millis(2));
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

/// The rank a failure's text says is lost ("rank 2 is lost: ..."), as
/// [`Error::RankLost`](crate::Error::RankLost) words it: another rank's
/// failure that reached this one may be a loss this rank has not heard of
/// yet. Only a hint of what to wait for; never taken as a loss itself.
pub(crate) fn named_loss(text: &str) -> Option<u32> {
    text.match_indices(" is lost").find_map(|(at, _)| {
        let before = &text[..at];
        let number = before.trim_end_matches(|c: char| c.is_ascii_digit());
        let digits = &before[number.len()..];
        if number.ends_with("rank ") {
            digits.parse().ok()
        } else {
            None
        }
    })
}

/// The counters of one World's calls, which its watchdog reads.
///
/// Written only by the thread that uses the World (every World call takes
/// `&mut World`; the teardown is its drop; the exit hook of
/// `leaving.rs` comes after it) and read only by the watchdog,
/// so each change is a relaxed load and store, not a locked
/// read-modify-write. And they are kept for the process's life
/// (`kept.rs`), so that a [`Call`] holds a plain reference to them: no
/// `Arc` (two more locked instructions a call), and no borrow of the World
/// while the call runs. Before both (2026-12-01), a World's 8 B ping-pong
/// on the node transport took 0.23-0.24 µs one way, after 0.20-0.21
/// (`world_bench latency`, docs/onnode.md).
#[derive(Debug, Default)]
pub(crate) struct Calls {
    /// World calls entered so far (and teardown steps begun).
    entered: AtomicU64,
    /// World calls entered and not yet left (nested calls count each).
    depth: AtomicU32,
}

impl Calls {
    /// A new pair, kept until the process ends.
    fn new() -> &'static Calls {
        keep(Calls::default())
    }

    #[inline]
    fn enter(&self) {
        let d = &self.depth;
        d.store(d.load(Ordering::Relaxed).wrapping_add(1), Ordering::Relaxed);
        bump(&self.entered);
    }

    #[inline]
    fn leave(&self) {
        let d = &self.depth;
        d.store(d.load(Ordering::Relaxed).wrapping_sub(1), Ordering::Relaxed);
    }
}

/// Count one more on a counter only one thread writes.
#[inline]
fn bump(c: &AtomicU64) {
    c.store(c.load(Ordering::Relaxed).wrapping_add(1), Ordering::Relaxed);
}

/// One World call in progress (see [`Liveness::call`]).
pub(crate) struct Call(&'static Calls);

impl Drop for Call {
    #[inline]
    fn drop(&mut self) {
        self.0.leave();
    }
}

#[cfg(test)]
mod tests {
    use super::{named_loss, Liveness, NOTICE, STUCK, STUCK_EXIT};
    use std::sync::atomic::Ordering;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    #[test]
    fn a_loss_is_found_in_a_failures_words_and_nothing_else_is() {
        assert_eq!(named_loss("rank 2 is lost: its socket closed"), Some(2));
        assert_eq!(
            named_loss("allreduce (collective #976) failed on rank 3: rank 12 is lost: gone"),
            Some(12)
        );
        for text in [
            "rank is lost",
            "a rank 2 went",
            "rank x2 is lost",
            "rank 99999999999 is lost",
            "",
            " is lost",
        ] {
            assert_eq!(named_loss(text), None, "{text:?}");
        }
    }

    #[test]
    fn a_loss_heard_within_the_grace_is_waited_for_and_none_is_invented() {
        let l = Arc::new(Liveness::default());
        let started = Instant::now();
        assert_eq!(l.first_lost_within(Duration::from_millis(20)), None);
        assert!(started.elapsed() >= Duration::from_millis(20));
        let later = l.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            later.lose(4, "killed".into());
        });
        assert_eq!(l.first_lost_within(Duration::from_secs(5)), Some(4));
        t.join().unwrap();
    }

    #[test]
    fn the_first_loss_is_kept_and_each_rank_is_recorded_once() {
        let l = Arc::new(Liveness::default());
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

    /// The child of the test below: a call that never returns, as inside
    /// shm's spin on a dead process's lock, then a loss.
    #[test]
    #[ignore = "child role: run by the two stuck-call tests below through current_exe()"]
    fn stuck_child() {
        if std::env::var_os("FABRIC_MSG_STUCK_CHILD").is_none() {
            return;
        }
        let l = Arc::new(Liveness::new(2, "shm".into()));
        let teardown = std::env::var_os("FABRIC_MSG_STUCK_CHILD").is_some_and(|v| v == "teardown");
        let _call = if teardown {
            l.enter_for_good("the teardown's first step".into());
            None
        } else {
            Some(l.call())
        };
        l.lose(1, "its socket closed".into());
        if teardown {
            std::thread::sleep(NOTICE * 2);
            l.now_doing("the teardown's second step".into());
        }
        // Long past STUCK, so a watchdog starved of the CPU on a loaded
        // machine still ends the child before it returns on its own.
        std::thread::sleep(STUCK * 40);
    }

    /// Run the `stuck_child` role in `mode`; its output and how long it took.
    fn run_stuck_child(mode: &str) -> (std::process::Output, std::time::Duration) {
        let started = Instant::now();
        let out = std::process::Command::new(std::env::current_exe().expect("test binary"))
            .args([
                "--exact",
                "world::liveness::tests::stuck_child",
                "--ignored",
                "--nocapture",
            ])
            .env("FABRIC_MSG_STUCK_CHILD", mode)
            .output()
            .expect("running the child");
        (out, started.elapsed())
    }

    /// A teardown after a loss names the step it is stuck in, and each
    /// new step gets the whole bound again.
    #[test]
    fn a_stuck_teardown_names_its_step() {
        let (out, took) = run_stuck_child("teardown");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(STUCK_EXIT), "{err}");
        assert!(
            err.contains("this rank is still in the teardown's first step 500 ms after it noticed")
                && err.contains("this rank is still in the teardown's second step 500 ms after")
                && err.contains("this rank has been in the teardown's second step for 3 s since")
                && !err.contains("has been in the teardown's first step"),
            "{err}"
        );
        assert!(took >= STUCK + NOTICE * 2, "took {took:?}");
    }

    /// A call still inside libfabric `STUCK` after a loss ends the process
    /// with status 70 and a line naming the lost rank; one that returned
    /// does not.
    #[test]
    fn a_call_stuck_after_a_loss_ends_the_process_naming_the_rank() {
        let (out, took) = run_stuck_child("1");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(STUCK_EXIT), "{err}");
        assert!(
            err.contains("fabric-msg: rank 2: rank 1 is lost: its socket closed; this rank is still in a World call (inside libfabric's shm provider")
                && err.contains("500 ms after it noticed; if that has not returned 2500 ms from now, the process ends with status 70")
                && err.contains("fabric-msg: rank 2: rank 1 is lost: its socket closed; this rank has been in a World call (inside libfabric's shm provider"),
            "{err}"
        );
        assert!(took >= STUCK && took < STUCK * 5, "took {took:?}");

        let l = Arc::new(Liveness::new(0, "shm".into()));
        drop(l.call());
        l.lose(1, "gone".into());
        std::thread::sleep(STUCK + Duration::from_millis(500));
        // Still here: nothing was inside a call.
    }
}
