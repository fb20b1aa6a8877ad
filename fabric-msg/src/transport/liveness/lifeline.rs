//! Lifelines: the bootstrap's TCP connection to each peer, kept open after
//! the handshake so that a peer's death or stall is noticed on every
//! endpoint type, RDM included, where the fabric itself says nothing.
//! (The other parts of peer-loss detection are listed in
//! [`super`].)
//!
//! One thread per [`EventLoop`](crate::transport::event_loop::EventLoop) that has
//! lifelines watches them all with `poll(2)`:
//! - it writes one heartbeat byte to each every [`HEARTBEAT`];
//! - end of file or a reset (the kernel closes a dead process's sockets,
//!   at once, even on SIGKILL) is a death;
//! - a goodbye byte, written when a loop closes, is an orderly departure;
//! - no byte for `peer_timeout` (a stopped or hung peer, a cut network) is
//!   a stall: this side writes a "declared lost" byte and closes, so the
//!   peer, if it ever runs again, learns that it was given up.
//!
//! A loss bumps an epoch the loop reads with one relaxed atomic load per
//! `poll`, so the data path pays nothing until a peer is lost. The thread
//! runs whatever the application does, so a long computation between polls
//! is not mistaken for a stall.

use super::loss::{LossAlarm, LossKind};
use parking_lot::Mutex;
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How often each side writes a heartbeat.
pub const HEARTBEAT: Duration = Duration::from_millis(250);

/// The shortest `peer_timeout` honoured: four heartbeats.
pub const MIN_PEER_TIMEOUT: Duration = Duration::from_secs(1);

const BEAT: u8 = b'h';
const GOODBYE: u8 = b'g';
const GIVEN_UP: u8 = b'x';

/// One loss, as the thread reports it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Loss {
    pub(crate) id: u64,
    pub(crate) kind: LossKind,
}

struct Watch {
    id: u64,
    /// The peer's name in the alarm.
    label: String,
    stream: TcpStream,
    heard: Instant,
}

#[derive(Default)]
struct Shared {
    /// Bumped once per loss reported.
    epoch: AtomicU64,
    lost: Mutex<Vec<Loss>>,
    added: Mutex<Vec<Watch>>,
    /// Ids to say goodbye to and stop watching.
    leaving: Mutex<Vec<u64>>,
    stop: AtomicBool,
}

/// The lifelines of one event loop, and the thread that watches them.
pub(crate) struct Lifelines {
    shared: Arc<Shared>,
    wake: UnixStream,
    thread: Option<JoinHandle<()>>,
    next_id: u64,
}

impl Lifelines {
    /// Start the watching thread; `timeout` (at least [`MIN_PEER_TIMEOUT`])
    /// is how long a silent peer is waited for, `None` for ever; each loss
    /// but a departure also rings `alarm`.
    pub(crate) fn start(timeout: Option<Duration>, alarm: LossAlarm) -> std::io::Result<Lifelines> {
        let (wake, woken) = UnixStream::pair()?;
        woken.set_nonblocking(true)?;
        // A poke that finds the socket full is not needed: the thread has
        // unread pokes and will wake anyway.
        wake.set_nonblocking(true)?;
        let shared = Arc::new(Shared::default());
        let s = shared.clone();
        let timeout = timeout.map(|t| t.max(MIN_PEER_TIMEOUT));
        let thread = std::thread::Builder::new()
            .name("fabric-msg-lifelines".into())
            .spawn(move || watch(&s, woken, timeout, &alarm))?;
        Ok(Lifelines {
            shared,
            wake,
            thread: Some(thread),
            next_id: 0,
        })
    }

    /// Watch `stream`, to `label`; returns the id its loss will carry.
    pub(crate) fn add(&mut self, stream: TcpStream, label: String) -> std::io::Result<u64> {
        stream.set_nonblocking(true)?;
        stream.set_nodelay(true)?;
        let id = self.next_id;
        self.next_id += 1;
        self.shared.added.lock().push(Watch {
            id,
            label,
            stream,
            heard: Instant::now(),
        });
        self.poke();
        Ok(id)
    }

    /// Say goodbye on lifeline `id` and stop watching it.
    pub(crate) fn leave(&self, id: u64) {
        self.shared.leaving.lock().push(id);
        self.poke();
    }

    /// The loss epoch: changes whenever a loss is reported.
    #[inline]
    pub(crate) fn epoch(&self) -> u64 {
        self.shared.epoch.load(Ordering::Acquire)
    }

    /// Losses reported since the last call.
    pub(crate) fn take(&self) -> Vec<Loss> {
        std::mem::take(&mut *self.shared.lost.lock())
    }

    fn poke(&self) {
        // A full pipe already wakes the thread.
        let _ = (&self.wake).write(&[0]);
    }
}

impl Drop for Lifelines {
    /// Say goodbye on every lifeline, then stop the thread.
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        self.poke();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The watching thread's body.
fn watch(shared: &Shared, mut woken: UnixStream, timeout: Option<Duration>, alarm: &LossAlarm) {
    let mut watched: Vec<Watch> = Vec::new();
    let mut fds: Vec<libc::pollfd> = Vec::new();
    let mut next_beat = Instant::now();
    let mut scratch = [0u8; 64];
    loop {
        watched.append(&mut shared.added.lock());
        let leaving = std::mem::take(&mut *shared.leaving.lock());
        if shared.stop.load(Ordering::Acquire) {
            for w in &mut watched {
                say(&mut w.stream, GOODBYE);
            }
            return;
        }
        watched.retain_mut(|w| {
            let keep = !leaving.contains(&w.id);
            if !keep {
                say(&mut w.stream, GOODBYE);
            }
            keep
        });
        let now = Instant::now();
        if now >= next_beat {
            for w in &mut watched {
                // A full socket buffer means the peer is not reading: its
                // silence is judged on our side, so the beat is just dropped.
                let _ = w.stream.write(&[BEAT]);
            }
            next_beat = now + HEARTBEAT;
        }
        fds.clear();
        fds.push(pollfd(woken.as_raw_fd()));
        fds.extend(watched.iter().map(|w| pollfd(w.stream.as_raw_fd())));
        let wait = next_beat.saturating_duration_since(Instant::now());
        // SAFETY: `fds` holds fds.len() initialised pollfds, each an fd this
        // thread owns (the wake socket and the watched streams), for the call.
        let n = unsafe {
            libc::poll(
                fds.as_mut_ptr(),
                fds.len() as libc::nfds_t,
                wait.as_millis() as i32 + 1,
            )
        };
        if n < 0 {
            continue; // EINTR
        }
        if fds[0].revents != 0 {
            while matches!(woken.read(&mut scratch), Ok(n) if n > 0) {}
        }
        let now = Instant::now();
        let mut lost = Vec::new();
        for (w, fd) in watched.iter_mut().zip(&fds[1..]) {
            let kind = if fd.revents != 0 {
                read_lifeline(&mut w.stream, &mut scratch, &mut w.heard, now)
            } else {
                None
            };
            let kind = kind.or_else(|| {
                let silent = now.saturating_duration_since(w.heard);
                timeout.filter(|t| silent >= *t).map(|_| {
                    say(&mut w.stream, GIVEN_UP);
                    LossKind::Silent(silent)
                })
            });
            if let Some(kind) = kind {
                alarm.ring(&w.label, kind);
                lost.push(Loss { id: w.id, kind });
            }
        }
        if lost.is_empty() {
            continue;
        }
        watched.retain(|w| !lost.iter().any(|l| l.id == w.id));
        let n = lost.len() as u64;
        shared.lost.lock().append(&mut lost);
        shared.epoch.fetch_add(n, Ordering::Release);
    }
}

fn pollfd(fd: i32) -> libc::pollfd {
    libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    }
}

/// Drain what a readable lifeline holds; the loss it shows, if any.
fn read_lifeline(
    stream: &mut TcpStream,
    scratch: &mut [u8],
    heard: &mut Instant,
    now: Instant,
) -> Option<LossKind> {
    loop {
        match stream.read(scratch) {
            Ok(0) => return Some(LossKind::Died),
            Ok(n) => {
                *heard = now;
                // Anything but a heartbeat ends the lifeline; a peer that is
                // not fabric-msg cannot get here (the handshake checked it).
                if let Some(&b) = scratch[..n].iter().find(|&&b| b != BEAT) {
                    return Some(if b == GIVEN_UP {
                        LossKind::GaveUpOnUs
                    } else {
                        LossKind::Departed
                    });
                }
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => return None,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(_) => return Some(LossKind::Died),
        }
    }
}

/// Write a last byte and close both directions.
fn say(stream: &mut TcpStream, byte: u8) {
    let _ = stream.write(&[byte]);
    let _ = stream.shutdown(Shutdown::Both);
}

#[cfg(test)]
mod tests {
    use super::{Lifelines, Loss, LossAlarm, LossKind, BEAT, GIVEN_UP};
    use std::io::Read;
    use std::net::{TcpListener, TcpStream};
    use std::time::{Duration, Instant};

    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        (a, b)
    }

    fn wait_loss(l: &Lifelines, within: Duration) -> Option<Loss> {
        let t = Instant::now();
        let epoch = l.epoch();
        while t.elapsed() < within {
            if l.epoch() != epoch || epoch != 0 {
                return l.take().pop();
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        None
    }

    fn start(timeout: Option<Duration>) -> Lifelines {
        Lifelines::start(timeout, LossAlarm::default()).unwrap()
    }

    #[test]
    fn a_closed_socket_is_a_death_and_a_goodbye_a_departure() {
        let alarm = LossAlarm::default();
        let mut l = Lifelines::start(None, alarm.clone()).unwrap();
        let (a, b) = pair();
        let id = l.add(a, "the dead one".into()).unwrap();
        drop(b);
        let loss = wait_loss(&l, Duration::from_secs(2)).expect("loss reported");
        assert_eq!((loss.id, loss.kind), (id, LossKind::Died));
        // The alarm rang before the epoch moved, naming the peer.
        assert_eq!(alarm.losses(), 1);
        assert_eq!(
            alarm.first().map(|p| (p.peer, p.how)),
            Some(("the dead one".to_string(), LossKind::Died))
        );

        let alarm = LossAlarm::default();
        let mut l = Lifelines::start(None, alarm.clone()).unwrap();
        let mut far = start(None);
        let (a, b) = pair();
        l.add(a, "near".into()).unwrap();
        let far_id = far.add(b, "far".into()).unwrap();
        far.leave(far_id);
        let loss = wait_loss(&l, Duration::from_secs(2)).expect("departure reported");
        assert_eq!(loss.kind, LossKind::Departed);
        assert_eq!(alarm.losses(), 0, "a departure is no alarm");
        drop(far);
    }

    #[test]
    fn silence_past_the_timeout_is_a_stall_and_the_peer_hears_it() {
        let mut l = start(Some(Duration::from_secs(1)));
        let (a, mut b) = pair();
        l.add(a, "l".into()).unwrap();
        let t = Instant::now();
        let loss = wait_loss(&l, Duration::from_secs(3)).expect("stall reported");
        assert!(matches!(loss.kind, LossKind::Silent(d) if d >= Duration::from_secs(1)));
        assert!(t.elapsed() < Duration::from_millis(1600), "{:?}", t.elapsed());
        // The silent side finds heartbeats, then the verdict, then the end.
        let mut got = Vec::new();
        b.read_to_end(&mut got).unwrap();
        assert!(got.len() >= 3, "{got:?}");
        assert_eq!(got.last(), Some(&GIVEN_UP));
        assert!(got[..got.len() - 1].iter().all(|&c| c == BEAT));
    }

    #[test]
    fn heartbeats_keep_a_quiet_peer_alive() {
        let mut near = start(Some(Duration::from_secs(1)));
        let mut far = start(Some(Duration::from_secs(1)));
        let (a, b) = pair();
        near.add(a, "near".into()).unwrap();
        far.add(b, "far".into()).unwrap();
        std::thread::sleep(Duration::from_millis(2500));
        assert_eq!(near.epoch(), 0, "{:?}", near.take());
        assert_eq!(far.epoch(), 0, "{:?}", far.take());
        drop(far);
        let loss = wait_loss(&near, Duration::from_secs(2)).expect("departure on drop");
        assert_eq!(loss.kind, LossKind::Departed);
    }
}
