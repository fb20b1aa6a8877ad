//! The World's requests as futures (feature `tokio`): every non-blocking
//! operation of the programming model — typed and serde messages,
//! one-sided operations and atomics, collectives and persistent starts,
//! on the World or any communicator — returns a [`Request`], and
//! [`World::wait_async`], [`World::wait_all_async`] and
//! [`World::wait_any_async`] await it, so an SPMD program's rank can run
//! beside its timers, its file I/O and its other tasks on one runtime.
//!
//! ```no_run
//! # async fn f() -> fabric_msg::Result<()> {
//! use fabric_msg::{Op, World};
//! use std::time::Duration;
//! let mut world = World::init()?;
//! let (rank, size) = (world.rank(), world.size());
//! let halo = world.irecv(Some((rank + size - 1) % size), Some(0), vec![0.0f64; 64])?;
//! let sent = world.isend((rank + 1) % size, 0, &[rank as f64; 64])?;
//! let got = world.wait_all_async(vec![halo, sent]).await?;
//! let total = world.iallreduce(vec![got[0][0]], Op::Sum)?;
//! match tokio::time::timeout(Duration::from_secs(5), world.wait_async(total)).await {
//!     Ok(sum) => println!("sum {:?}", sum?),
//!     Err(_) => eprintln!("the allreduce took more than 5 s"), // its request was dropped
//! }
//! # Ok(()) }
//! ```
//!
//! # How it waits
//!
//! A future holds `&mut World`: the World is one task's, as it is one
//! thread's (other tasks run while that task awaits; a program that wants
//! several tasks to use one World puts it behind a `tokio::sync::Mutex`
//! and holds the lock across the await, so they take turns; the futures
//! are `Send`, so a rank's body may run on a multi-threaded runtime). Each poll of
//! the future moves every operation of the World on, exactly as
//! [`World::test`] does, and returns the result once the request has
//! finished. Otherwise it asks to be polled again: at once (a
//! `yield_now`: other tasks run between polls) for the first [`SPIN`] of
//! the wait, and again for [`SPIN`] after every look that moved something
//! in the World (a collective's step, a send finished: a long collective
//! keeps its pace), then after [`NAP`] each time. Where the World's waits
//! give the core away (more ranks on the node than cores), so does this
//! one between polls (a `sched_yield`, which holds the runtime's thread
//! while other processes run). While the wait is young a poll
//! looks up to 32 times before it yields (a few microseconds), so a
//! message that comes meanwhile costs no turn of the runtime. A nap ends
//! early when the main loop's wait fd (after `fi_trywait`) or the node
//! doorbell's eventfd becomes readable, through tokio's reactor, as the
//! blocking wait's sleep does; what has no descriptor (a main loop opened
//! without a wait fd: the adaptive wait where ranks do not outnumber
//! cores) is found at the nap's end, so there a message that arrives
//! after a quiet spell waits up to [`NAP`]. A request that finished as
//! it started (a same-node one-sided operation) is ready at the first
//! poll.
//!
//! # Dropping a future
//!
//! Dropping a future drops its request, with [`Request`]'s rule: memory
//! the provider may still write is never freed (typed messages go through
//! the World's pool, which takes the buffer back when the operation
//! completes); a dropped receive is cancelled at the World's next wait or
//! poll, a dropped send still goes, a dropped collective goes on with its
//! result discarded. So a `tokio::time::timeout` around a receive that
//! never comes leaves nothing behind.

use super::collectives::ops::Element;
use super::request::{Request, Status};
use super::state::World;
use crate::error::Result;
use crate::transport::event_loop::{LentFd, SleepCheck};
use std::os::fd::{AsRawFd, RawFd};
use std::time::{Duration, Instant};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

/// How long a waiting future keeps looking at every poll (yielding to the
/// runtime between looks, so other tasks run) from the start of its wait,
/// or from the last look that moved something in the World (a completion
/// taken: a collective's step came, a send finished), before it looks
/// only every [`NAP`]: as long as an `EventLoop`'s future
/// spins on a loop with no wait fd (`async_loop::POLL_BEFORE_SLEEP`).
/// With 50 µs here, a peer that was descheduled for a moment (a helper
/// thread on its core) sent this rank into its 1 ms naps and a ping-pong
/// averaged 16-64 µs one way on the node transport against 1 µs blocking.
pub const SPIN: Duration = Duration::from_millis(2);

/// How long a waiting future sleeps at most between looks once the World
/// has been still for [`SPIN`] (tokio's timer granularity); a nap ends
/// sooner when a descriptor says something came (`World::nap`).
pub const NAP: Duration = Duration::from_millis(1);

/// Looks a young wait takes within one poll before it yields to the
/// runtime: a message that comes within them costs no turn of the runtime
/// (about 0.3 µs on the node transport), and other tasks still run every
/// few microseconds.
const LOOKS: u32 = 32;

/// The pace of one wait: spin, then nap. A wait whose World still moves
/// spins on, and gives the core away between polls where the World's
/// waits do. A 4 MiB allreduce of 4 ranks on 2 cores, whose steps come
/// milliseconds apart, napped between them and took 13.1-14.0 ms awaited
/// against 2.8-4.0 ms with the blocking wait. Each change alone left it at
/// 10-13 ms; both: 2.4-3.3 against 2.3-3.5 (`async_world --allreduce 30`,
/// docs/async.md).
struct Pace {
    /// The start of the wait, or the last look that moved the World.
    since: Instant,
    /// The World's waits give the core away between looks (more ranks on
    /// the node than cores): so does this one, or its spin would hold the
    /// core the rank it waits for needs.
    yield_core: bool,
}

impl Pace {
    fn new(world: &World) -> Pace {
        Pace {
            since: Instant::now(),
            yield_core: world.coll.idler().yields_at_once(),
        }
    }

    /// Look with `done` until it says so, `LOOKS` times while the wait is
    /// young, once after: whether it did.
    fn look(&mut self, world: &mut World, mut done: impl FnMut(&mut World) -> Result<bool>) -> Result<bool> {
        let looks = if self.since.elapsed() < SPIN { LOOKS } else { 1 };
        let moved = world.moved;
        for _ in 0..looks {
            if done(world)? {
                return Ok(true);
            }
            std::hint::spin_loop();
        }
        if world.moved != moved {
            self.since = Instant::now();
        }
        Ok(false)
    }

    /// Let the runtime run other tasks before the next look, and other
    /// processes where the World's waits give the core away (a
    /// `sched_yield`, as the blocking wait's: it returns once they had
    /// their turn, so this runtime's thread waits that long).
    async fn pause(&mut self, world: &mut World) {
        if self.since.elapsed() < SPIN {
            if self.yield_core {
                std::thread::yield_now();
            }
            tokio::task::yield_now().await;
        } else {
            world.nap().await;
        }
    }
}

/// Until `fd` is readable; never where there is none.
async fn readable(fd: Option<&AsyncFd<LentFd>>) {
    match fd {
        Some(fd) => drop(fd.readable().await),
        None => std::future::pending().await,
    }
}

impl World {
    /// Pass up to [`NAP`] until something may have come, as the blocking
    /// wait sleeps (`world/local.rs`, `Local::sleep`): on the main loop's
    /// wait fd where `fi_trywait` allows, and on the node doorbell's
    /// eventfd where something is awaited on the node loop and every node
    /// peer can ring it, each through tokio's reactor. What has no
    /// descriptor (a provider without a wait fd, a peer that could not
    /// take the eventfd) is found at the nap's end, as before.
    async fn nap(&mut self) {
        let main = match self.ev.prepare_sleep() {
            SleepCheck::Sleep(_) => self.ev.wait_fd().map(|f| f.as_raw_fd()),
            SleepCheck::PollFirst => None,
        };
        // Taken back when dropped: at the nap's end, or mid-nap with this
        // future (a `timeout` around the wait), so peers never go on
        // writing the eventfd for a wait that is over.
        let armed = self
            .local
            .as_ref()
            .filter(|l| l.side.awaits())
            .and_then(|l| l.side.arm());
        let join =
            |fd: Option<RawFd>| fd.and_then(|fd| AsyncFd::with_interest(LentFd(fd), Interest::READABLE).ok());
        // Declared after `armed`, so they leave the reactor before it
        // takes the announcement back and drains the eventfd.
        let (main, bell) = (join(main), join(armed.as_ref().and_then(|a| a.fd)));
        tokio::select! {
            () = readable(main.as_ref()) => {}
            () = readable(bell.as_ref()) => {}
            () = tokio::time::sleep(NAP) => {}
        }
    }

    /// Await `req`: its result, as [`World::wait`] gives it.
    pub async fn wait_async<T: Element>(&mut self, req: Request<T>) -> Result<Vec<T>> {
        self.wait_status_async(req).await.map(|(v, _)| v)
    }

    /// Await `req`: its result and status, as [`World::wait_status`] gives
    /// them.
    pub async fn wait_status_async<T: Element>(&mut self, req: Request<T>) -> Result<(Vec<T>, Status)> {
        let mut pace = Pace::new(self);
        while !pace.look(self, |w| w.test(&req))? {
            pace.pause(self).await;
        }
        self.wait_status(req)
    }

    /// Await every request of `reqs`, and return their results in order,
    /// as [`World::wait_all`] does; the first failure ends the wait.
    pub async fn wait_all_async<T: Element>(&mut self, reqs: Vec<Request<T>>) -> Result<Vec<Vec<T>>> {
        let mut pace = Pace::new(self);
        while !pace.look(self, |w| w.test_all(&reqs))? {
            pace.pause(self).await;
        }
        self.wait_all(reqs)
    }

    /// Await the first of `reqs` to finish, as [`World::wait_any`] does:
    /// its place becomes `None`, and its index, result and status come
    /// back; `Ok(None)` if every place is `None`.
    pub async fn wait_any_async<T: Element>(
        &mut self,
        reqs: &mut [Option<Request<T>>],
    ) -> Result<Option<(usize, Vec<T>, Status)>> {
        let mut pace = Pace::new(self);
        loop {
            if reqs.iter().all(Option::is_none) {
                return Ok(None);
            }
            let mut first = None;
            pace.look(self, |w| {
                for (i, slot) in reqs.iter().enumerate() {
                    if let Some(r) = slot {
                        if w.test(r)? {
                            first = Some(i);
                            return Ok(true);
                        }
                    }
                }
                Ok(false)
            })?;
            if let Some((i, r)) = first.and_then(|i| Some((i, reqs[i].take()?))) {
                return self.wait_status(r).map(|(v, s)| Some((i, v, s)));
            }
            pace.pause(self).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The futures can be spawned on a multi-threaded runtime.
    #[test]
    fn the_futures_are_send() {
        fn send<F: std::future::Future + Send>(_: F) {}
        fn all(world: &mut World, r: Request<f64>, rs: Vec<Request<u8>>, set: &mut [Option<Request<u32>>]) {
            send(world.wait_async(r));
            send(world.wait_all_async(rs));
            send(world.wait_any_async(set));
        }
        let _ = all;
    }
}
