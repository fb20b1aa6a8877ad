//! One handshake on the listener's side: a small state machine over a
//! non-blocking socket, advanced whenever the listener is polled, with one
//! deadline for all of it. It never blocks: what a slow peer has sent so
//! far waits in its [`FrameReader`].

use super::protocol::{
    agree, decode_frame, expect_hello, expect_ready, fail, hello, read_fail, refuse_name, send, Frame,
    MAX_FRAME,
};
use crate::discovery::info::EndpointType;
use crate::discovery::profile::Agreement;
use crate::error::{Error, Result};
use crate::transport::event_loop::cm::Prepost;
use crate::transport::event_loop::{EndpointId, EventLoop, Peer};
use crate::transport::framing::FrameReader;
use std::net::{SocketAddr, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::time::{Duration, Instant};

/// Where a handshake stands.
enum Step {
    /// Waiting for the peer's `Hello`.
    Hello,
    /// RDM: our `Hello` is out; the peer's `Ready` says it has our name.
    Ready { agreement: Agreement, name: Vec<u8> },
    /// MSG: our `Hello` (passive endpoint, nonce) is out; waiting for the
    /// connection request that carries `nonce`.
    Request { agreement: Agreement, nonce: u64 },
    /// MSG: the request is accepted on `id`; waiting for its
    /// `FI_CONNECTED` and the peer's `Ready`.
    Connecting {
        agreement: Agreement,
        id: EndpointId,
        fid: usize,
        connected: bool,
        ready: bool,
    },
}

/// What one advance came to.
pub(super) enum Progress {
    Pending,
    Done(Peer),
    Failed(Error),
}

/// One connection being handshaken.
pub(super) struct Handshake {
    tcp: TcpStream,
    pub(super) from: SocketAddr,
    deadline: Instant,
    timeout: Duration,
    reader: FrameReader,
    step: Step,
}

impl Handshake {
    /// `tcp` must be non-blocking.
    pub(super) fn new(tcp: TcpStream, from: SocketAddr, timeout: Duration) -> Handshake {
        tcp.set_nodelay(true).ok();
        Handshake {
            tcp,
            from,
            deadline: Instant::now() + timeout,
            timeout,
            reader: FrameReader::new(MAX_FRAME),
            step: Step::Hello,
        }
    }

    pub(super) fn deadline(&self) -> Instant {
        self.deadline
    }

    /// Whether it waits on the event queue (which has no fd to poll).
    pub(super) fn waits_for_fabric(&self) -> bool {
        matches!(self.step, Step::Request { .. } | Step::Connecting { .. })
    }

    /// The socket, as `handshake_done` takes it: blocking.
    pub(super) fn into_stream(self) -> TcpStream {
        self.tcp.set_nonblocking(false).ok();
        self.tcp
    }

    /// Whether `data`, a connection request's private data, is this
    /// handshake's nonce.
    pub(super) fn expects(&self, data: &[u8]) -> bool {
        match self.step {
            Step::Request { nonce, .. } => data == nonce.to_le_bytes(),
            _ => false,
        }
    }

    /// Whether `fid` is the endpoint this handshake accepted.
    pub(super) fn owns(&self, fid: usize) -> bool {
        matches!(self.step, Step::Connecting { fid: f, .. } if f == fid)
    }

    /// The connection request carrying our nonce arrived: accept it.
    pub(super) fn take_request(
        &mut self,
        ev: &mut EventLoop,
        info: crate::libfabric::Info,
        prepost: Prepost<'_>,
    ) -> Result<()> {
        let Step::Request { agreement, .. } = self.step else {
            ev.msg_reject(info);
            return Ok(());
        };
        let (id, fid) = ev.msg_accept_request(info, prepost)?;
        self.step = Step::Connecting {
            agreement,
            id,
            fid,
            connected: false,
            ready: false,
        };
        Ok(())
    }

    /// Its endpoint reported `FI_CONNECTED`.
    pub(super) fn connected(&mut self) {
        if let Step::Connecting { connected, .. } = &mut self.step {
            *connected = true;
        }
    }

    /// A failure from the fabric side, as this handshake's error.
    pub(super) fn fabric_failed(&self, message: String) -> Error {
        fail(&self.from, message)
    }

    /// Undo what a failed handshake opened in the loop: the connection's
    /// endpoint (and the receives posted on it).
    pub(super) fn abandon(&self, ev: &mut EventLoop) {
        if let Step::Connecting { id, .. } = self.step {
            if let Err(e) = ev.close_endpoint(id) {
                log::warn!(
                    "closing the endpoint of a failed handshake with {}: {e}",
                    self.from
                );
            }
        }
    }

    /// Move on as far as what has arrived allows, without blocking.
    pub(super) fn advance(
        &mut self,
        ev: &mut EventLoop,
        ep: EndpointId,
        now: Instant,
        prepost: Prepost<'_>,
    ) -> Progress {
        match self.step(ev, ep, prepost) {
            Ok(Some(peer)) => Progress::Done(peer),
            Ok(None) if now >= self.deadline => Progress::Failed(self.timed_out()),
            Ok(None) => Progress::Pending,
            Err(e) => Progress::Failed(e),
        }
    }

    fn timed_out(&self) -> Error {
        let waiting = match self.step {
            Step::Hello | Step::Ready { .. } => "receiving the handshake",
            Step::Request { .. } => "waiting for the peer's fi_connect with the handshake's nonce",
            Step::Connecting { .. } => "waiting for the connection to be established",
        };
        fail(
            &self.from,
            format!(
                "timed out {waiting} after {:?} (the whole handshake's deadline): the peer is stalled or \
                 not fabric-msg",
                self.timeout
            ),
        )
    }

    /// The next frame, if it has arrived whole.
    fn frame(&mut self) -> Result<Option<Frame>> {
        match self.reader.read(&mut self.tcp) {
            Ok(Some(body)) => decode_frame(&body, &self.from).map(Some),
            Ok(None) => Ok(None),
            Err(e) => Err(read_fail(e, &self.from)),
        }
    }

    fn step(&mut self, ev: &mut EventLoop, ep: EndpointId, prepost: Prepost<'_>) -> Result<Option<Peer>> {
        loop {
            match self.step {
                Step::Hello => {
                    let Some(f) = self.frame()? else { return Ok(None) };
                    let (profile, name, _) = expect_hello(f, &self.from)?;
                    let local = ev.wire_profile();
                    let agreement = agree(&mut self.tcp, &local, &profile)?;
                    if ev.profile().endpoint_type == EndpointType::Msg {
                        // Connected endpoints: the peer connects to our
                        // passive endpoint, with this nonce.
                        let pep = ev.msg_listen()?;
                        let nonce = getrandom::u64().map_err(|e| {
                            Error::Usage(format!(
                                "the operating system's random source failed ({e}); no handshake nonce"
                            ))
                        })?;
                        send(&mut self.tcp, &self.from, &hello(local, pep, nonce))?;
                        self.step = Step::Request { agreement, nonce };
                    } else {
                        // Checked now, so a bad name is refused at once;
                        // it goes into the address vector only at Ready.
                        let own = ev.endpoint_name(ep)?;
                        ev.check_peer_name(&own, &name, "the peer's")
                            .map_err(|e| refuse_name(&mut self.tcp, &self.from, e))?;
                        send(&mut self.tcp, &self.from, &hello(local, own, 0))?;
                        self.step = Step::Ready { agreement, name };
                    }
                }
                Step::Ready { .. } => {
                    let Some(f) = self.frame()? else { return Ok(None) };
                    expect_ready(f, &self.from)?;
                    let Step::Ready { agreement, name } = &self.step else {
                        unreachable!("matched just above")
                    };
                    let peer = ev
                        .insert_peer(ep, name, *agreement)
                        .map_err(|e| refuse_name(&mut self.tcp, &self.from, e))?;
                    prepost(ev, ep)?;
                    send(&mut self.tcp, &self.from, &Frame::Ready)?;
                    return Ok(Some(peer));
                }
                Step::Request { .. } => {
                    // Nothing is due from the peer now; a frame is its
                    // Reject (its fi_connect failed) or a protocol error,
                    // and a close ends the handshake.
                    return match self.frame()? {
                        None => Ok(None),
                        Some(f) => Err(match expect_ready(f, &self.from) {
                            Err(e) => e,
                            Ok(()) => fail(&self.from, "Ready before connecting".into()),
                        }),
                    };
                }
                Step::Connecting { ready: false, .. } => {
                    let Some(f) = self.frame()? else { return Ok(None) };
                    expect_ready(f, &self.from)?;
                    if let Step::Connecting { ready, .. } = &mut self.step {
                        *ready = true;
                    }
                }
                Step::Connecting { connected: false, .. } => return Ok(None),
                Step::Connecting { agreement, id, .. } => {
                    send(&mut self.tcp, &self.from, &Frame::Ready)?;
                    return Ok(Some(Peer::connected(id, agreement)));
                }
            }
        }
    }
}

impl AsRawFd for Handshake {
    fn as_raw_fd(&self) -> RawFd {
        self.tcp.as_raw_fd()
    }
}
