//! The driver task: owns the [`EventLoop`], posts what handles send it,
//! polls, answers each completion's waiter, and sleeps by the `fi_trywait`
//! rule between polls (see [`super`]).

use crate::memory::buffer::Buffer;
use crate::transport::event_loop::{
    Completion, EndpointId, EventLoop, OpKind, Peer, PostError, RecvOpts, SendOpts, SleepCheck, Token,
};
use std::os::fd::{AsRawFd, RawFd};
use std::time::{Duration, Instant};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::sync::{mpsc, oneshot};

/// Where a completion goes.
pub(super) type Reply = oneshot::Sender<Result<Completion, PostError>>;

/// What a handle asks of the driver.
pub(super) enum Command {
    Send {
        peer: Peer,
        buf: Buffer,
        opts: SendOpts,
        done: Reply,
    },
    Recv {
        ep: EndpointId,
        buf: Buffer,
        opts: RecvOpts,
        done: Reply,
    },
    With(Box<dyn FnOnce(&mut EventLoop) + Send>),
    Close(oneshot::Sender<()>),
}

/// How long the driver keeps looking (each empty look followed by a
/// `yield_now`, so other tasks run) after the last thing it did, before it
/// sleeps on the wait fd: a reply within this catches the driver awake, as
/// `WaitMode::Block`'s `spin_before_block` (the same 50 µs) does on the
/// blocking loop; a wake-up from sleep costs a thread's unpark here.
pub const SPIN_BEFORE_SLEEP: Duration = Duration::from_micros(50);

/// Where the loop has no wait fd: how long the driver keeps looking
/// (yielding between looks) after the last thing it did before it sleeps
/// [`IDLE_PERIOD`] between looks.
pub const POLL_BEFORE_SLEEP: Duration = Duration::from_millis(2);

/// How long a loop without a wait fd sleeps between looks once idle for
/// [`POLL_BEFORE_SLEEP`]: tokio's timer granularity, and the most it adds
/// to a message that arrives after a quiet spell.
pub const IDLE_PERIOD: Duration = Duration::from_millis(1);

/// The longest sleep on the wait fd, even where `prepare_sleep` sets no
/// bound: a guard, should a provider's fd miss an edge, not a clock.
const MAX_SLEEP: Duration = Duration::from_millis(100);

/// The loop's CQ wait fd, for `AsyncFd`: borrowed from the loop, which
/// outlives it (the driver drops it first).
struct WaitFd(RawFd);

impl AsRawFd for WaitFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0
    }
}

struct Driver {
    ev: EventLoop,
    /// The waiter of each operation in flight, by token.
    waiters: Vec<Option<Reply>>,
    free: Vec<u64>,
    out: Vec<Completion>,
}

impl Driver {
    fn token(&mut self, done: Reply) -> Token {
        match self.free.pop() {
            Some(t) => {
                self.waiters[t as usize] = Some(done);
                Token(t)
            }
            None => {
                self.waiters.push(Some(done));
                Token(self.waiters.len() as u64 - 1)
            }
        }
    }

    fn posted(&mut self, t: Token, r: Result<(), PostError>) {
        if let Err(e) = r {
            let done = self.waiters[t.0 as usize].take();
            self.free.push(t.0);
            if let Some(done) = done {
                let _ = done.send(Err(e));
            }
        }
    }

    /// Carry out one command; `Close` gives back its reply, for the end.
    fn take(&mut self, cmd: Command) -> Option<oneshot::Sender<()>> {
        match cmd {
            Command::Send {
                peer,
                buf,
                opts,
                done,
            } => {
                let t = self.token(done);
                let r = self.ev.send(&peer, buf, opts, t);
                self.posted(t, r);
            }
            Command::Recv { ep, buf, opts, done } => {
                let t = self.token(done);
                let r = self.ev.recv(ep, buf, opts, t);
                self.posted(t, r);
            }
            Command::With(f) => f(&mut self.ev),
            Command::Close(done) => return Some(done),
        }
        None
    }

    /// One look at the loop; how many completions were answered.
    fn poll(&mut self) -> crate::error::Result<usize> {
        let n = self.ev.poll(&mut self.out, Some(Duration::ZERO))?;
        for c in self.out.drain(..) {
            if c.kind == OpKind::PeerLost {
                continue; // the loss alarm tells; each operation fails on its own
            }
            let waiter = self.waiters.get_mut(c.token.0 as usize).and_then(Option::take);
            match waiter {
                Some(done) => {
                    self.free.push(c.token.0);
                    // A dropped future: the completion, and its buffer, go.
                    let _ = done.send(Ok(c));
                }
                None => log::warn!(
                    "async loop: a {:?} completion with token {} nobody waits for (posted through with_loop?) dropped",
                    c.kind,
                    c.token.0
                ),
            }
        }
        Ok(n)
    }
}

/// What a wait for commands brought.
enum Woken {
    Nothing,
    Command(Command),
    HandlesGone,
}

fn woken(c: Option<Command>) -> Woken {
    c.map_or(Woken::HandlesGone, Woken::Command)
}

/// The driver's body: runs until every handle is gone, `close` is asked
/// for, or the loop fails.
pub(super) async fn drive(ev: EventLoop, mut rx: mpsc::UnboundedReceiver<Command>) {
    let mut d = Driver {
        ev,
        waiters: Vec::new(),
        free: Vec::new(),
        out: Vec::new(),
    };
    let fd = d.ev.wait_fd().map(|f| f.as_raw_fd());
    let afd = fd.and_then(
        |fd| match AsyncFd::with_interest(WaitFd(fd), Interest::READABLE) {
            Ok(a) => Some(a),
            Err(e) => {
                log::warn!("async loop: the wait fd cannot join tokio's reactor ({e}); polling instead");
                None
            }
        },
    );
    // When the driver last did something (posted, answered).
    let mut busy = Instant::now();
    let mut closing = None;
    'run: loop {
        loop {
            match rx.try_recv() {
                Ok(c) => {
                    busy = Instant::now();
                    if let Some(done) = d.take(c) {
                        closing = Some(done);
                        break 'run;
                    }
                }
                Err(mpsc::error::TryRecvError::Empty) => break,
                Err(mpsc::error::TryRecvError::Disconnected) => break 'run,
            }
        }
        match d.poll() {
            Ok(0) => {}
            Ok(_) => {
                // Let the tasks just answered run (and send what is next).
                busy = Instant::now();
                tokio::task::yield_now().await;
                continue;
            }
            Err(e) => {
                log::error!(error:% = e; "async loop: polling the event loop failed, closing it: {e}");
                break 'run;
            }
        }
        let idle = busy.elapsed();
        let spin = if afd.is_some() {
            SPIN_BEFORE_SLEEP
        } else {
            POLL_BEFORE_SLEEP
        };
        if idle < spin {
            tokio::task::yield_now().await;
            continue;
        }
        let wake = match (&afd, d.ev.prepare_sleep()) {
            (Some(afd), SleepCheck::Sleep(at_most)) => {
                let t = at_most.map_or(MAX_SLEEP, |t| t.min(MAX_SLEEP));
                tokio::select! {
                    c = rx.recv() => woken(c),
                    r = afd.readable() => {
                        // Cleared before the next look, so anything that
                        // arrives after it is a new edge.
                        if let Ok(mut g) = r {
                            g.clear_ready();
                        }
                        Woken::Nothing
                    }
                    _ = tokio::time::sleep(t) => Woken::Nothing,
                }
            }
            (Some(_), SleepCheck::PollFirst) => {
                tokio::task::yield_now().await;
                Woken::Nothing
            }
            (None, _) => {
                tokio::select! {
                    c = rx.recv() => woken(c),
                    _ = tokio::time::sleep(IDLE_PERIOD) => Woken::Nothing,
                }
            }
        };
        match wake {
            Woken::Nothing => {}
            Woken::HandlesGone => break 'run,
            Woken::Command(c) => {
                busy = Instant::now();
                if let Some(done) = d.take(c) {
                    closing = Some(done);
                    break 'run;
                }
            }
        }
    }
    // The fd leaves tokio's reactor before the loop closes it.
    drop(afd);
    // Waiters still held fail with `Closed` as their senders go; the loop
    // keeps their buffers until the provider lets go.
    drop(d);
    if let Some(done) = closing {
        let _ = done.send(());
    }
}
