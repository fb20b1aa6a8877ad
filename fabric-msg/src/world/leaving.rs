//! How the survivors of a loss leave under a launcher that ends the whole
//! job on the first exit: `mpirun` kills the other ranks within
//! milliseconds of a non-zero one, which cut off survivors still printing
//! their error. So after a loss the liveness connections stay open past
//! the World's drop, and at exit (an `atexit` hook: the application
//! prints its error between the two) every rank other than 0 closes its
//! side and waits for rank 0 to close; rank 0 closes once every other
//! connection has. At most [`LEAVE_TOGETHER`]: a survivor stuck inside
//! libfabric does not hold the others.

use super::liveness::Liveness;
use std::io::{ErrorKind, Read};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Keep `conns` (this rank's liveness connections) open until the
/// process exits, then leave together with the other survivors.
pub(crate) fn keep_until_exit(rank: u32, conns: Vec<TcpStream>, live: Arc<Liveness>) {
    *LEAVING.lock() = Some(Leaving { rank, conns, live });
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        // SAFETY: atexit registers a function without arguments that runs
        // once at exit(3); leave_at_exit neither panics nor exits.
        if unsafe { libc::atexit(leave_at_exit) } != 0 {
            log::warn!("no exit hook: the survivors of a loss leave one by one");
        }
    });
}

/// Longest the survivors of a loss wait at exit for each other: the
/// launchers end a job about a second after a death.
const LEAVE_TOGETHER: Duration = Duration::from_millis(800);

/// What [`keep_until_exit`] keeps for the exit hook.
struct Leaving {
    rank: u32,
    conns: Vec<TcpStream>,
    live: Arc<Liveness>,
}

static LEAVING: parking_lot::Mutex<Option<Leaving>> = parking_lot::Mutex::new(None);

/// The exit hook: each rank other than 0 closes its side and waits for
/// rank 0 to close; rank 0 closes once every other connection has.
extern "C" fn leave_at_exit() {
    let Some(mut l) = LEAVING.lock().take() else {
        return;
    };
    // Past the World: nothing the watchdog guards runs any more.
    l.live.leave_for_good();
    if l.rank != 0 {
        for s in &l.conns {
            let _ = s.shutdown(std::net::Shutdown::Write);
        }
    }
    let deadline = Instant::now() + LEAVE_TOGETHER;
    let mut open: Vec<&mut TcpStream> = l.conns.iter_mut().collect();
    while !open.is_empty() && Instant::now() < deadline {
        open.retain_mut(|s| !closed_by_peer(s));
    }
    for s in &l.conns {
        let _ = s.shutdown(std::net::Shutdown::Both);
    }
}

/// Whether the other end of `s` has closed it, reading (and dropping)
/// whatever it still sent for up to 10 ms.
fn closed_by_peer(s: &mut TcpStream) -> bool {
    let mut buf = [0u8; 256];
    if s.set_read_timeout(Some(Duration::from_millis(10))).is_err() {
        return true;
    }
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => return false,
            Err(_) => return true,
        }
    }
}
