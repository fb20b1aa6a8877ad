//! The wait of one posted operation: it looks at the loop itself while
//! the wait is young, so the task that waits is the one that sees its
//! completion, then leaves the loop to the driver.

use super::shared::{closed, Shared};
use crate::transport::event_loop::{Completion, EndpointId, PostError, Token};
use std::future::poll_fn;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

type Outcome = Result<Completion, PostError>;

/// What a wait dropped before it took its result does besides marking
/// its slot abandoned (see [`super`], "Dropping a future").
#[derive(Clone, Copy)]
pub(super) enum OnDrop {
    /// The operation goes on (a send, a one-sided operation, a peek).
    GoOn,
    /// A receive on this endpoint: cancelled.
    CancelRecv(EndpointId),
    /// A wait for a notice of a peer's `write_data`: no operation behind
    /// it, so its slot is freed at once.
    Forget,
}

/// Marks the operation abandoned if its wait is dropped before it took
/// the result, and does what [`OnDrop`] says.
struct Abandon {
    shared: Arc<Shared>,
    token: Token,
    on_drop: OnDrop,
    taken: bool,
}

impl Drop for Abandon {
    fn drop(&mut self) {
        if self.taken {
            return;
        }
        let mut st = self.shared.lock();
        match self.on_drop {
            OnDrop::Forget => st.forget_notice_wait(self.token),
            OnDrop::CancelRecv(ep) => {
                if st.abandon(self.token) {
                    st.cancel_recv(ep, self.token);
                }
            }
            OnDrop::GoOn => {
                st.abandon(self.token);
            }
        }
    }
}

/// What one look for an operation found.
// A result is held in place: boxing it would allocate per operation.
#[allow(clippy::large_enum_variant)]
enum Step {
    Done(Outcome),
    /// Not yet, within the spin: look again after the runtime's turn.
    Spin,
    /// Not yet, past the spin (or the loop is closing): the waker is with
    /// the slot, for the driver.
    Sleep,
}

/// How often a spinning wait yields to the runtime's drivers: every
/// sixteenth look. The other looks only go to the back of the runtime's
/// queue, so other tasks run but the runtime does not poll its IO driver
/// (a system call) between every two looks. Measured with
/// `async_pingpong --loopback` (8 B, one way, 2026-11-28): yielding at
/// every look, shm took 2.7 µs on two workers and 3.9 µs on one thread;
/// every 16th, 2.1 and 2.8 µs; tcp;ofi_rxm 13-14 µs and 19-20 µs either
/// way. Every 64th, tcp;ofi_rxm on one thread took 60 µs: its wait then
/// starves the runtime's drivers.
const DEFER_EVERY: u32 = 16;

/// How often a spinning wait reads the clock to see whether its spin is
/// over: every eighth look. Read at every look, the clock was 6 % of a shm
/// ping-pong's time (`perf record`, 2026-11-29); a spin of 50 µs or more
/// overshoots by at most seven looks.
const CLOCK_EVERY: u32 = 8;

/// Be polled again once the runtime has run the other tasks in its queue.
async fn again() {
    let mut woken = false;
    poll_fn(|cx| {
        if woken {
            return Poll::Ready(());
        }
        woken = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    })
    .await
}

/// Await the operation posted under `token`; `on_drop`: what happens if
/// this wait is dropped first.
pub(super) async fn wait(shared: Arc<Shared>, token: Token, on_drop: OnDrop) -> Outcome {
    let mut guard = Abandon {
        shared,
        token,
        on_drop,
        taken: false,
    };
    // The first poll comes straight after the post, within the task's
    // same turn as the futures beside it: in a `join!` of a receive and the
    // send whose answer it awaits, the receive is polled first. A look
    // there finds nothing (the answer cannot come before the send) and
    // holds the send back by a look: on tcp;ofi_rxm a progress call with
    // system calls. So the first poll only asks to be polled again, and the
    // futures beside it run first (`async_pingpong --loopback`, 8 B one
    // way, two workers, by turns: tcp;ofi_rxm 10.7-12.2 → 7.9-8.1 µs, shm
    // 1.6-2.0 → 1.36-1.41 µs; docs/async.md).
    again().await;
    let since = Instant::now();
    let mut seen = None;
    let mut spins = 0u32;
    loop {
        let clock = spins % CLOCK_EVERY == 0;
        let step =
            poll_fn(|cx| Poll::Ready(look_for(&guard.shared, token, since, clock, &mut seen, cx))).await;
        match step {
            Step::Done(r) => {
                guard.taken = true;
                return r;
            }
            Step::Spin => {
                spins = spins.wrapping_add(1);
                if spins % DEFER_EVERY == 0 {
                    // tokio's yield defers this task until the runtime has
                    // run the others and looked at its own drivers (IO,
                    // timers).
                    tokio::task::yield_now().await
                } else {
                    again().await
                }
            }
            Step::Sleep => break,
        }
    }
    let r = poll_fn(|cx| {
        let mut st = guard.shared.lock();
        match st.take(token) {
            Some(r) => Poll::Ready(r),
            None => {
                st.wait(token, cx.waker(), false);
                Poll::Pending
            }
        }
    })
    .await;
    guard.taken = true;
    r
}

/// One look for the operation under `t`, whose wait began at `since`
/// (the clock is read to see whether the spin is over only if `clock`);
/// `seen` is the loop's count of looks after the last one.
fn look_for(
    shared: &Shared,
    t: Token,
    since: Instant,
    clock: bool,
    seen: &mut Option<u64>,
    cx: &mut Context<'_>,
) -> Step {
    let mut st = shared.lock();
    if let Some(r) = st.take(t) {
        return Step::Done(r);
    }
    if st.ev.is_none() {
        // Closed, and this slot was not waiting (cannot happen: the close
        // answers every waiting slot); say so rather than hang.
        return Step::Done(Err(closed()));
    }
    if st.closing {
        // The driver closes the loop, and answers this slot then.
        st.wait(t, cx.waker(), false);
        return Step::Sleep;
    }
    // Someone else looked since this wait's last look (another operation
    // of this task, as in a `join!` of a receive and a send, or another
    // task's): what they found is in the slots already, and a look now
    // would most likely find nothing. One look per round of the runtime
    // is enough.
    if seen.map_or(true, |s| s == st.looks) {
        match st.look_for(Some(t)) {
            Ok(Some(c)) => return Step::Done(Ok(c)),
            Ok(None) => {}
            Err(_) => {
                // The driver closes the loop, and answers this slot then.
                st.wait(t, cx.waker(), false);
                return Step::Sleep;
            }
        }
    }
    *seen = Some(st.looks);
    let spinning = !clock || since.elapsed() < st.spin;
    st.wait(t, cx.waker(), spinning);
    if spinning {
        Step::Spin
    } else {
        Step::Sleep
    }
}
