//! Waiting for room: a post the provider refuses for lack of room
//! (`FI_EAGAIN`) is retried while the loop progresses its CQ, until the
//! provider takes it, a peer is lost, the World gives up, or the
//! application's own `post_timeout` passes; and no more operations are
//! posted than the CQ can report.

use super::state::EventLoop;
use crate::error::{check, Error, Result};
use crate::ffi;
use std::time::{Duration, Instant};

impl EventLoop {
    /// Read the CQ until fewer operations than it holds are in flight.
    #[inline]
    pub(super) fn wait_for_room(&mut self) -> Result<()> {
        if self.posted() < self.objects.cq_capacity {
            return Ok(());
        }
        self.wait_for_room_slow()
    }

    #[cold]
    fn wait_for_room_slow(&mut self) -> Result<()> {
        let started = Instant::now();
        while self.posted() >= self.objects.cq_capacity {
            if !self.patient(started) {
                return Err(Error::QueueFull {
                    call: "fi_cq_read",
                    waited: started.elapsed(),
                    in_flight: self.slab.in_flight,
                    code: None,
                });
            }
            self.progress()?;
        }
        Ok(())
    }

    /// Call `op` (libfabric's `call`) until it does not return
    /// `-FI_EAGAIN`, progressing in between, while [`EventLoop::patient`].
    /// A receive's `-FI_ENOMEM` is retried the same way: shm (1.17)
    /// returns it while its receive entries are all taken by posted
    /// receives and unexpected messages, which progress frees.
    pub(super) fn retry(&mut self, call: &'static str, mut op: impl FnMut() -> isize) -> Result<isize> {
        let mut started: Option<Instant> = None;
        loop {
            let rc = op();
            if rc >= 0 {
                return Ok(rc);
            }
            let receive = || call.starts_with("fi_recv") || call.starts_with("fi_trecv");
            let no_room = rc == -(ffi::FI_EAGAIN as isize) || (rc == -(ffi::FI_ENOMEM as isize) && receive());
            if !no_room {
                return check(call, rc as i64).map(|v| v as isize);
            }
            self.stats.retries += 1;
            let t0 = *started.get_or_insert_with(Instant::now);
            if !self.patient(t0) {
                return Err(Error::QueueFull {
                    call,
                    waited: t0.elapsed(),
                    in_flight: self.slab.in_flight,
                    code: Some(crate::error::ErrorCode(rc.unsigned_abs() as u32)),
                });
            }
            self.progress()?;
        }
    }

    /// Progress while a post waits: read the CQ, then post the send
    /// backlog, which then takes room before the waiting post tries again.
    /// Flushed before the read, or not at all here, backlogged sends
    /// starved behind a retrying write in the shm soak (20 messages/s for
    /// 3 s in 4 of 32 runs; none in 16 runs with this order).
    pub(super) fn progress(&mut self) -> Result<()> {
        let read = self.read_cq();
        self.flush_backlog();
        read
    }

    /// Whether a post refused for lack of room fails at once instead of
    /// waiting: while the World's collectives post (`set_fail_fast`: they keep
    /// what was refused and post it at their next progress, where losses
    /// and other ranks' notices are seen), or where the application set a
    /// zero `post_timeout`.
    #[inline]
    pub(super) fn fail_fast(&self) -> bool {
        self.rules.no_wait || self.cfg.post_timeout == Some(Duration::ZERO)
    }

    /// Whether a wait for room that began at `since` goes on: not where
    /// posts fail fast, not once the layer above gives up (the World's
    /// liveness saw a rank lost) or a peer of this loop is newly lost (the
    /// post fails; the next `poll` reports the loss), and not past the
    /// application's `post_timeout` if it set one. Otherwise it waits as
    /// long as it takes: a peer that computes is not a failure.
    pub(crate) fn patient(&self, since: Instant) -> bool {
        !(self.fail_fast()
            || self.giving_up()
            || self.lost.changed()
            || self.cfg.post_timeout.is_some_and(|t| since.elapsed() >= t))
    }

    /// Whether the layer above asked posts to stop waiting for room.
    pub(super) fn giving_up(&self) -> bool {
        self.rules
            .give_up
            .as_ref()
            .is_some_and(|flag| flag.load(std::sync::atomic::Ordering::Acquire))
    }
}
