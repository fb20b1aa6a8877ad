//! The listening socket and the handshakes in progress on it.
//!
//! The socket is non-blocking. Every connection it takes becomes a
//! [`Handshake`], up to a bound ([`DEFAULT_MAX_IN_PROGRESS`]); past it a
//! new connection is closed at once, counted and logged. Each handshake
//! has one deadline for all of it. [`Listener::poll_accept`] advances all
//! of them without blocking (or waits up to a timeout), so a slow or
//! silent peer holds nothing but its own slot, and a server can accept
//! new peers between polls of the event loop that serves the ones it has.

use super::done::handshake_done;
use super::handshake::{Handshake, Progress};
use super::protocol::{io, DEFAULT_TIMEOUT};
use crate::discovery::info::EndpointType;
use crate::error::{Error, Result};
use crate::libfabric::CmEvent;
use crate::transport::event_loop::cm::Prepost;
use crate::transport::event_loop::{EndpointId, EventLoop, Peer};
use std::collections::VecDeque;
use std::fmt;
use std::net::{SocketAddr, TcpListener, ToSocketAddrs};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Default bound on handshakes in progress at once.
pub const DEFAULT_MAX_IN_PROGRESS: usize = 64;

/// Connections taken from the socket in one call at most, so a flood
/// cannot keep [`Listener::poll_accept`] from returning.
const ACCEPT_BATCH: usize = 256;

/// How long a wait lasts at most while a connected (MSG) handshake waits
/// for the event queue, which has no fd to sleep on.
const FABRIC_POLL: Duration = Duration::from_millis(1);

/// How long a blocking wait lasts at most while the loop has a passive
/// endpoint, so a stray connection request is refused promptly.
const STRAY_POLL: Duration = Duration::from_millis(50);

/// What a finished handshake came to.
#[derive(Debug)]
pub enum Accepted {
    /// A peer, ready to use.
    Peer(Peer),
    /// A connection whose handshake failed; the listener goes on.
    Refused(Refusal),
}

/// A handshake that failed: who, and why.
#[derive(Debug)]
pub struct Refusal {
    /// The peer's socket address.
    pub from: SocketAddr,
    /// Why (a mismatch, a timeout, a malformed frame, a closed connection).
    pub error: Error,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "refused {}: {}", self.from, self.error)
    }
}

/// A TCP listener that accepts fabric-msg peers, many handshakes at once.
///
/// - **Bound:** at most [`Listener::set_max_in_progress`] handshakes
///   (default [`DEFAULT_MAX_IN_PROGRESS`]) at once; a connection past it is
///   closed at once and counted ([`Listener::over_bound`]).
/// - **Deadline:** each handshake has [`Listener::set_timeout`] (default
///   [`DEFAULT_TIMEOUT`]) for all of it, however its peer trickles bytes.
/// - **No head-of-line blocking:** handshakes progress side by side; a
///   stalled one delays no other.
/// - **Connected (MSG) endpoints:** a connection request is taken only if
///   its connection data is the nonce of a handshake in progress; others
///   are refused (`fi_reject`) and freed.
///
/// Its handshakes belong to the event loop and endpoint it is driven with:
/// drive one listener with one loop.
///
/// A server that accepts new peers while it serves the ones it has polls
/// the listener between polls of its loop:
///
/// ```no_run
/// # use fabric_msg::{Accepted, EventLoop, Listener};
/// # use std::time::Duration;
/// # fn serve(ev: &mut EventLoop, listener: &Listener) -> fabric_msg::Result<()> {
/// let ep = ev.open_endpoint()?;
/// let (mut peers, mut done) = (Vec::new(), Vec::new());
/// loop {
///     ev.poll(&mut done, Some(Duration::from_millis(1)))?;
///     // ... serve `peers` with what `done` holds ...
///     match listener.poll_accept(ev, ep, Some(Duration::ZERO))? {
///         Some(Accepted::Peer(peer)) => peers.push(peer),
///         Some(Accepted::Refused(r)) => eprintln!("{r}"),
///         None => {}
///     }
/// }
/// # }
/// ```
pub struct Listener {
    tcp: TcpListener,
    timeout: Duration,
    max_in_progress: usize,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    handshakes: Vec<Handshake>,
    /// Finished handshakes not yet handed out, oldest first (at most one
    /// per handshake, so bounded by the bound).
    finished: VecDeque<Accepted>,
    over_bound: u64,
    stray_requests: u64,
}

impl fmt::Debug for Listener {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Listener")
            .field("local_addr", &self.tcp.local_addr().ok())
            .field("timeout", &self.timeout)
            .field("max_in_progress", &self.max_in_progress)
            .field("in_progress", &self.in_progress())
            .finish()
    }
}

impl Listener {
    /// Listen on `addr` (e.g. `0.0.0.0:9228`, or port 0 for any).
    pub fn bind(addr: impl ToSocketAddrs) -> Result<Listener> {
        let addrs: Vec<SocketAddr> = addr
            .to_socket_addrs()
            .map_err(|e| io("resolving the bootstrap listener's address", e))?
            .collect();
        let tcp = TcpListener::bind(&addrs[..]).map_err(|e| {
            let at = addrs.iter().map(|a| a.to_string()).collect::<Vec<_>>().join(", ");
            let hint = match e.kind() {
                std::io::ErrorKind::AddrInUse => {
                    ": another process is listening there; choose another port (0 for any free one) or stop it"
                }
                std::io::ErrorKind::AddrNotAvailable => ": that address is not one of this host's",
                std::io::ErrorKind::PermissionDenied => ": ports below 1024 need privileges; choose a higher one",
                _ => "",
            };
            io(&format!("binding the bootstrap listener to {at}{hint}"), e)
        })?;
        tcp.set_nonblocking(true)
            .map_err(|e| io("making the bootstrap listener non-blocking", e))?;
        Ok(Listener {
            tcp,
            timeout: DEFAULT_TIMEOUT,
            max_in_progress: DEFAULT_MAX_IN_PROGRESS,
            state: Mutex::default(),
        })
    }

    /// The address peers connect to.
    pub fn local_addr(&self) -> Result<SocketAddr> {
        self.tcp
            .local_addr()
            .map_err(|e| io("reading the listener's address", e))
    }

    /// Time allowed for a whole handshake, from its connection to its last
    /// frame (for handshakes that start from now on).
    pub fn set_timeout(&mut self, t: Duration) {
        self.timeout = t.max(Duration::from_millis(1));
    }

    /// Most handshakes in progress at once (at least 1); connections past
    /// it are closed at once.
    pub fn set_max_in_progress(&mut self, n: usize) {
        self.max_in_progress = n.max(1);
    }

    /// Handshakes in progress now.
    pub fn in_progress(&self) -> usize {
        self.lock().handshakes.len()
    }

    /// Connections closed at once because the bound was reached.
    pub fn over_bound(&self) -> u64 {
        self.lock().over_bound
    }

    /// Connection requests on the passive endpoint refused because they
    /// carried no pending handshake's nonce (connected endpoints only).
    pub fn stray_requests(&self) -> u64 {
        self.lock().stray_requests
    }

    /// The fds to poll for the listener's sake: its socket (readable when a
    /// peer connects) and each handshake's. After one is ready, or at the
    /// latest after [`Listener::poll_within`], call
    /// [`Listener::poll_accept`].
    pub fn raw_fds(&self) -> Vec<RawFd> {
        let st = self.lock();
        let mut fds = vec![self.tcp.as_raw_fd()];
        fds.extend(st.handshakes.iter().map(|h| h.as_raw_fd()));
        fds
    }

    /// How soon [`Listener::poll_accept`] is due even if no fd is ready: a
    /// handshake's deadline, or 1 ms while a connected (MSG) handshake
    /// waits for the event queue. `None` while nothing is in progress.
    pub fn poll_within(&self) -> Option<Duration> {
        let st = self.lock();
        let now = Instant::now();
        st.handshakes
            .iter()
            .map(|h| {
                let d = h.deadline().saturating_duration_since(now);
                if h.waits_for_fabric() {
                    d.min(FABRIC_POLL)
                } else {
                    d
                }
            })
            .min()
    }

    /// Wait for the next handshake to finish on endpoint `ep` and return
    /// its peer; a failed one is returned as its error, and the listener
    /// stays usable (call again to go on). Other handshakes progress
    /// meanwhile.
    pub fn accept(&self, ev: &mut EventLoop, ep: EndpointId) -> Result<Peer> {
        self.accept_with(ev, ep, |_, _| Ok(()))
    }

    /// [`Listener::accept`], calling `prepost(ev, endpoint)` before the
    /// peer can send: post the first receives there. On connected (MSG)
    /// endpoints this runs on the new connection's endpoint before
    /// `fi_accept`; iWARP ends a connection whose message finds no receive.
    pub fn accept_with(
        &self,
        ev: &mut EventLoop,
        ep: EndpointId,
        mut prepost: impl FnMut(&mut EventLoop, EndpointId) -> Result<()>,
    ) -> Result<Peer> {
        loop {
            match self.poll_accept_with(ev, ep, None, &mut prepost)? {
                Some(Accepted::Peer(p)) => return Ok(p),
                Some(Accepted::Refused(r)) => return Err(r.error),
                None => {}
            }
        }
    }

    /// Advance every handshake as far as it can go and return the next one
    /// that finished, waiting up to `timeout` for one (`Some(ZERO)`: never
    /// wait, for a server that calls this between
    /// [`EventLoop::poll`]s; `None`: until one finishes). `Err` only for
    /// the listener's own failures; a peer's is [`Accepted::Refused`].
    pub fn poll_accept(
        &self,
        ev: &mut EventLoop,
        ep: EndpointId,
        timeout: Option<Duration>,
    ) -> Result<Option<Accepted>> {
        self.poll_accept_with(ev, ep, timeout, |_, _| Ok(()))
    }

    /// [`Listener::poll_accept`] with a `prepost` as in
    /// [`Listener::accept_with`]: it runs once per handshake, when that
    /// handshake reaches the loop.
    pub fn poll_accept_with(
        &self,
        ev: &mut EventLoop,
        ep: EndpointId,
        timeout: Option<Duration>,
        mut prepost: impl FnMut(&mut EventLoop, EndpointId) -> Result<()>,
    ) -> Result<Option<Accepted>> {
        let until = timeout.map(|t| Instant::now() + t);
        let msg = ev.profile().endpoint_type == EndpointType::Msg;
        let mut st = self.lock();
        loop {
            if let Some(a) = st.finished.pop_front() {
                return Ok(Some(a));
            }
            self.take_connections(&mut st)?;
            if msg && ev.objects.pep.is_some() {
                fabric_events(ev, &mut st, &mut prepost)?;
            }
            let now = Instant::now();
            let mut i = 0;
            while i < st.handshakes.len() {
                match st.handshakes[i].advance(ev, ep, now, &mut prepost) {
                    Progress::Pending => i += 1,
                    Progress::Done(peer) => {
                        let h = st.handshakes.swap_remove(i);
                        let from = h.from;
                        let done = match handshake_done(ev, &peer, h.into_stream()) {
                            Ok(()) => Accepted::Peer(peer),
                            Err(error) => Accepted::Refused(Refusal { from, error }),
                        };
                        st.finished.push_back(done);
                    }
                    Progress::Failed(error) => {
                        let h = st.handshakes.swap_remove(i);
                        finish_failed(ev, &mut st, h, error);
                    }
                }
            }
            if let Some(a) = st.finished.pop_front() {
                return Ok(Some(a));
            }
            let now = Instant::now();
            if until.is_some_and(|u| now >= u) {
                return Ok(None);
            }
            // Sleep until a socket is ready, a deadline passes, or (on MSG)
            // the event queue is due another look.
            let mut wait = until.map(|u| u - now);
            let mut cap = |d: Duration| wait = Some(wait.map_or(d, |w| w.min(d)));
            for h in &st.handshakes {
                cap(h.deadline().saturating_duration_since(now));
                if h.waits_for_fabric() {
                    cap(FABRIC_POLL);
                }
            }
            if msg && ev.objects.pep.is_some() {
                cap(STRAY_POLL);
            }
            let mut fds: Vec<libc::pollfd> = std::iter::once(self.tcp.as_raw_fd())
                .chain(st.handshakes.iter().map(|h| h.as_raw_fd()))
                .map(|fd| libc::pollfd {
                    fd,
                    events: libc::POLLIN,
                    revents: 0,
                })
                .collect();
            let ms = wait.map_or(-1, |w| w.as_millis().clamp(1, i32::MAX as u128) as i32);
            // Not locked while asleep, so `in_progress` and the like answer
            // from other threads meanwhile.
            drop(st);
            // SAFETY: fds is a live array of fds.len() pollfd structs; poll
            // only reads the fd numbers (one closed meanwhile reports
            // POLLNVAL, which only ends the wait early).
            let rc = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
            st = self.lock();
            if rc < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() != std::io::ErrorKind::Interrupted {
                    return Err(io("waiting for bootstrap connections (poll)", e));
                }
            }
        }
    }

    /// Take the connections waiting on the socket: each becomes a
    /// handshake, or is closed at once past the bound.
    fn take_connections(&self, st: &mut State) -> Result<()> {
        for _ in 0..ACCEPT_BATCH {
            match self.tcp.accept() {
                Ok((tcp, from)) => {
                    if st.handshakes.len() >= self.max_in_progress {
                        st.over_bound += 1;
                        log::warn!(
                            "closed the connection from {from} at once: {} handshakes already in progress \
                             (the bound); {} closed so far",
                            st.handshakes.len(),
                            st.over_bound
                        );
                        continue;
                    }
                    if let Err(e) = tcp.set_nonblocking(true) {
                        log::warn!("dropping the connection from {from}: cannot make it non-blocking: {e}");
                        continue;
                    }
                    st.handshakes.push(Handshake::new(tcp, from, self.timeout));
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if transient(&e) => {
                    // The connection is gone, or this process is out of
                    // fds for now: the handshakes in progress go on.
                    log::warn!("accepting a bootstrap connection: {e}");
                    return Ok(());
                }
                Err(e) => return Err(io("accepting a bootstrap connection", e)),
            }
        }
        Ok(())
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic inside a prepost leaves the state consistent: each
        // handshake is either in the list or handed out.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Errors from `accept(2)` that say nothing about the listening socket.
fn transient(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ECONNABORTED | libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM | libc::EPROTO)
    ) || e.kind() == std::io::ErrorKind::Interrupted
}

/// Read the event queue: connection requests are matched to the handshake
/// whose nonce they carry (or refused), connection events to the handshake
/// whose endpoint they name.
fn fabric_events(ev: &mut EventLoop, st: &mut State, prepost: Prepost<'_>) -> Result<()> {
    while let Some(event) = ev.cm_try_next()? {
        match event {
            CmEvent::ConnReq { info, data } => {
                let Some(i) = st.handshakes.iter().position(|h| h.expects(&data)) else {
                    st.stray_requests += 1;
                    log::warn!(
                        "refused a connection request with {} bytes of connection data that match no \
                         handshake in progress: a peer that skipped the bootstrap, or one that timed out",
                        data.len()
                    );
                    ev.msg_reject(info);
                    continue;
                };
                if let Err(e) = st.handshakes[i].take_request(ev, info, prepost) {
                    let h = st.handshakes.swap_remove(i);
                    finish_failed(ev, st, h, e);
                }
            }
            CmEvent::Connected { fid } => match st.handshakes.iter_mut().find(|h| h.owns(fid as usize)) {
                Some(h) => h.connected(),
                None => log::debug!("listener: a connected event for another connection ({fid:?})"),
            },
            CmEvent::Shutdown { fid } => {
                fabric_failure(ev, st, fid as usize, "the peer shut the connection down".into())
            }
            CmEvent::Failed { fid, message } => fabric_failure(ev, st, fid as usize, message),
        }
    }
    Ok(())
}

fn fabric_failure(ev: &mut EventLoop, st: &mut State, fid: usize, message: String) {
    match st.handshakes.iter().position(|h| h.owns(fid)) {
        Some(i) => {
            let h = st.handshakes.swap_remove(i);
            let e = h.fabric_failed(message);
            finish_failed(ev, st, h, e);
        }
        None => log::debug!("listener: another connection ({fid:#x}): {message}"),
    }
}

fn finish_failed(ev: &mut EventLoop, st: &mut State, h: Handshake, error: Error) {
    h.abandon(ev);
    log::info!("bootstrap handshake with {} failed: {error}", h.from);
    st.finished
        .push_back(Accepted::Refused(Refusal { from: h.from, error }));
}

impl AsRawFd for Listener {
    /// The listening socket: readable when a peer connects. Handshakes in
    /// progress have fds of their own ([`Listener::raw_fds`]).
    fn as_raw_fd(&self) -> RawFd {
        self.tcp.as_raw_fd()
    }
}

impl AsFd for Listener {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.tcp.as_fd()
    }
}
