//! The slots' counts and the driver's alarm, on a state with no loop.

use super::{closed, State};
use crate::error::Error;
use crate::memory::buffer::Buffer;
use crate::transport::event_loop::PostError;
use std::sync::Arc;
use std::task::Waker;
use std::time::Duration;
use tokio::sync::Notify;

/// A shared state with no loop: enough for the slots' counts.
fn no_loop() -> State {
    State::new(None, Duration::from_micros(50), Arc::new(Notify::new()))
}

async fn told(st: &State) -> bool {
    tokio::time::timeout(Duration::from_millis(20), st.driver.notified())
        .await
        .is_ok()
}

fn waker() -> Waker {
    struct Nothing;
    impl std::task::Wake for Nothing {
        fn wake(self: Arc<Self>) {}
    }
    Waker::from(Arc::new(Nothing))
}

/// The driver is told when the last spinning wait stops while another
/// wait sleeps, and only then.
#[tokio::test(flavor = "current_thread")]
async fn the_driver_is_told_when_the_last_spinner_leaves_a_sleeper() {
    let mut st = no_loop();
    let w = waker();
    let (a, b) = (st.open(), st.open());
    assert_eq!((st.spinners, st.sleepers), (2, 0));
    st.wait(a, &w, false);
    assert_eq!((st.spinners, st.sleepers), (1, 1));
    assert!(!told(&st).await, "told while a wait still looks");
    st.abandon(b);
    assert_eq!((st.spinners, st.sleepers), (0, 2));
    assert!(told(&st).await, "not told when nobody looks for a sleeping wait");
}

/// Spinning waits that end with no sleeper behind them leave the
/// driver alone (a ping-pong does not wake it at every message), and
/// their slots are reused.
#[tokio::test(flavor = "current_thread")]
async fn spinners_alone_do_not_wake_the_driver() {
    let mut st = no_loop();
    let w = waker();
    for _ in 0..3 {
        let (a, b) = (st.open(), st.open());
        st.wait(a, &w, true);
        st.finish(a.0 as usize, Err(closed()));
        st.finish(b.0 as usize, Err(closed()));
        assert!(st.take(a).is_some() && st.take(b).is_some());
    }
    assert_eq!(st.slots.len(), 2, "the slots are reused");
    assert_eq!((st.spinners, st.sleepers), (0, 0));
    assert!(!told(&st).await);
}

/// A wait that ends while another sleeps tells the driver nothing
/// new; the last spinner to end does.
#[tokio::test(flavor = "current_thread")]
async fn the_last_spinner_to_end_beside_a_sleeper_tells() {
    let mut st = no_loop();
    let w = waker();
    let (a, b) = (st.open(), st.open());
    st.wait(a, &w, false);
    assert!(!told(&st).await);
    st.finish(b.0 as usize, Err(closed()));
    assert!(told(&st).await, "not told when the last spinner ended");
}

/// Closing answers every waiting slot with `Closed`, keeps results not
/// yet taken, and frees abandoned slots.
#[tokio::test(flavor = "current_thread")]
async fn closing_answers_every_wait() {
    let mut st = no_loop();
    let w = waker();
    let (a, b) = (st.open(), st.open());
    st.wait(a, &w, false);
    st.abandon(b);
    assert!(st.close().is_none());
    assert_eq!((st.spinners, st.sleepers), (0, 0));
    assert!(matches!(
        st.take(a),
        Some(Err(PostError {
            error: Error::Closed { .. },
            ..
        }))
    ));
    assert_eq!(st.free.len(), 2, "both slots free again");
    let posted = st.post(Buffer::new(8), |_, _, _| Ok(()));
    assert_eq!(posted.unwrap_err().buffer.map(|b| b.capacity()), Some(8));
}
