//! Connection bootstrap over a plain TCP socket, out of band.
//!
//! [`Listener::accept`] and [`connect`] exchange, in postcard frames
//! prefixed with a little-endian `u32` length:
//!
//! 1. client → server: `Hello { magic, version, profile, name }`
//! 2. server → client: its own `Hello`, or `Reject { reason }`
//! 3. client → server: `Ready`, or `Reject { reason }`
//!
//! Each side checks the other's [`WireProfile`] with [`check_peer`] and, if
//! it does not fit, tells the other why before failing, so both report the
//! same mismatch. Frames larger than [`MAX_FRAME`] are refused before any
//! allocation; every read and write has a timeout. The endpoint names are
//! then inserted into the address vector (`fi_av_insert`), and the TCP
//! connection stays open as the peer's lifeline: its heartbeats, or their
//! end, tell the loop that the peer is alive, stalled or gone
//! ([`lifeline`](super::lifeline)).

use crate::discovery::info::EndpointType;
use crate::discovery::profile::{check_peer, Agreement, WireProfile, PROTOCOL_VERSION};
use crate::error::{Error, Result};
use crate::transport::event_loop::{EndpointId, EventLoop, Peer};
use crate::transport::framing::write_frame;
use serde::{Deserialize, Serialize};
use std::io::Read;
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::Duration;

/// `FMSG`: the first field of every `Hello`.
const MAGIC: u32 = 0x464d_5347;

/// Largest handshake frame accepted (an endpoint name is well under 1 KiB).
pub const MAX_FRAME: usize = 16 * 1024;

/// Default time allowed for each step of the handshake.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, Serialize, Deserialize)]
enum Frame {
    Hello {
        magic: u32,
        version: u16,
        profile: WireProfile,
        name: Vec<u8>,
    },
    Reject {
        reason: String,
    },
    Ready,
}

/// A TCP listener that accepts fabric-msg peers.
#[derive(Debug)]
pub struct Listener {
    tcp: TcpListener,
    timeout: Duration,
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
        Ok(Listener {
            tcp,
            timeout: DEFAULT_TIMEOUT,
        })
    }

    /// The address peers connect to.
    pub fn local_addr(&self) -> Result<SocketAddr> {
        self.tcp
            .local_addr()
            .map_err(|e| io("reading the listener's address", e))
    }

    /// Time allowed for each handshake step.
    pub fn set_timeout(&mut self, t: Duration) {
        self.timeout = t;
    }

    /// Wait for one peer and complete its handshake on endpoint `ep`.
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
        let (stream, addr) = self
            .tcp
            .accept()
            .map_err(|e| io("accepting a bootstrap connection", e))?;
        let mut s = Stream::new(stream, addr, self.timeout)?;
        let (profile, name) = s.read_hello()?;
        let local = ev.wire_profile();
        let agreement = s.agree(&local, &profile)?;
        let peer = if ev.profile().endpoint_type == EndpointType::Msg {
            // Connected endpoints: the peer connects to our passive endpoint.
            let pep_name = ev.msg_listen()?;
            s.hello(local, pep_name)?;
            let conn = ev.msg_accept(self.timeout, &mut prepost)?;
            Peer::connected(conn, agreement)
        } else {
            let peer = ev
                .insert_peer(ep, &name, agreement)
                .map_err(|e| s.refuse_name(e))?;
            prepost(ev, ep)?;
            s.hello(local, ev.name(ep)?)?;
            peer
        };
        s.read_ready()?;
        s.keep_as_lifeline(ev, &peer)?;
        Ok(peer)
    }
}

/// Connect to a [`Listener`] at `addr` and complete the handshake on `ep`.
pub fn connect(
    ev: &mut EventLoop,
    ep: EndpointId,
    addr: impl ToSocketAddrs,
    timeout: Duration,
) -> Result<Peer> {
    connect_with(ev, ep, addr, timeout, |_, _| Ok(()))
}

/// [`connect`], calling `prepost(ev, endpoint)` before the peer can send
/// (see [`Listener::accept_with`]).
pub fn connect_with(
    ev: &mut EventLoop,
    ep: EndpointId,
    addr: impl ToSocketAddrs,
    timeout: Duration,
    mut prepost: impl FnMut(&mut EventLoop, EndpointId) -> Result<()>,
) -> Result<Peer> {
    let addrs: Vec<SocketAddr> = addr
        .to_socket_addrs()
        .map_err(|e| io("resolving the peer's address", e))?
        .collect();
    let mut last = None;
    let mut stream = None;
    for a in &addrs {
        match TcpStream::connect_timeout(a, timeout) {
            Ok(s) => {
                stream = Some((s, *a));
                break;
            }
            Err(e) => last = Some(io(&format!("connecting to {a}"), e)),
        }
    }
    let Some((stream, addr)) = stream else {
        return Err(last.unwrap_or_else(|| Error::Handshake {
            peer: "?".into(),
            message: "the address resolved to nothing".into(),
        }));
    };
    let mut s = Stream::new(stream, addr, timeout)?;
    let local = ev.wire_profile();
    let msg = ev.profile().endpoint_type == EndpointType::Msg;
    // A connecting MSG endpoint has no address to give: it connects to the server's.
    s.hello(local.clone(), if msg { Vec::new() } else { ev.name(ep)? })?;
    let (profile, name) = s.read_hello()?;
    let agreement = s.agree(&local, &profile)?;
    let peer = if msg {
        let conn = ev
            .msg_connect(&name, timeout, &mut prepost)
            .map_err(|e| s.refuse_name(e))?;
        Peer::connected(conn, agreement)
    } else {
        let peer = ev
            .insert_peer(ep, &name, agreement)
            .map_err(|e| s.refuse_name(e))?;
        prepost(ev, ep)?;
        peer
    };
    s.write(&Frame::Ready)?;
    s.keep_as_lifeline(ev, &peer)?;
    Ok(peer)
}

/// One handshake frame from a peer's bytes (at most [`MAX_FRAME`]), whole
/// or refused.
fn decode_frame(body: &[u8]) -> std::result::Result<Frame, String> {
    let (frame, rest) = postcard::take_from_bytes::<Frame>(body)
        .map_err(|e| format!("undecodable handshake frame ({e}): not a fabric-msg peer?"))?;
    if !rest.is_empty() {
        return Err(format!("{} stray bytes after a handshake frame", rest.len()));
    }
    Ok(frame)
}

/// For the fuzz targets: a handshake frame decoded as [`Stream::read`]
/// does after its length check; a hello's profile and name.
pub(crate) fn fuzz_frame(body: &[u8]) -> Option<(WireProfile, Vec<u8>)> {
    if body.len() > MAX_FRAME {
        return None;
    }
    match decode_frame(body).ok()? {
        Frame::Hello { profile, name, .. } => Some((profile, name)),
        Frame::Reject { .. } | Frame::Ready => None,
    }
}

/// For the fuzz targets: the bodies of real frames, to mutate.
pub(crate) fn fuzz_seeds(profile: WireProfile, name: Vec<u8>) -> Vec<Vec<u8>> {
    let frames = [
        Frame::Hello {
            magic: MAGIC,
            version: PROTOCOL_VERSION,
            profile,
            name,
        },
        Frame::Reject {
            reason: "provider mismatch".into(),
        },
        Frame::Ready,
    ];
    frames
        .iter()
        .filter_map(|f| postcard::to_stdvec(f).ok())
        .collect()
}

fn frame_name(f: &Frame) -> &'static str {
    match f {
        Frame::Hello { .. } => "Hello",
        Frame::Reject { .. } => "Reject",
        Frame::Ready => "Ready",
    }
}

fn io(context: &str, source: std::io::Error) -> Error {
    Error::Io {
        context: context.to_string(),
        source,
    }
}

struct Stream {
    tcp: TcpStream,
    peer: SocketAddr,
}

impl Stream {
    fn new(tcp: TcpStream, peer: SocketAddr, timeout: Duration) -> Result<Stream> {
        let t = Some(timeout.max(Duration::from_millis(1)));
        tcp.set_read_timeout(t)
            .and_then(|_| tcp.set_write_timeout(t))
            .map_err(|e| io("setting timeouts", e))?;
        tcp.set_nodelay(true).ok();
        Ok(Stream { tcp, peer })
    }

    /// The handshake is done: the connection stays open as the peer's
    /// lifeline (`lifeline.rs`), on which its death or stall is noticed.
    fn keep_as_lifeline(self, ev: &mut EventLoop, peer: &Peer) -> Result<()> {
        ev.watch_peer(peer, self.tcp, self.peer.to_string())
    }

    fn fail(&self, message: String) -> Error {
        Error::Handshake {
            peer: self.peer.to_string(),
            message,
        }
    }

    fn check_hello(&self, magic: u32, version: u16) -> Result<()> {
        if magic != MAGIC {
            return Err(self.fail("not a fabric-msg peer (bad magic)".into()));
        }
        if version != PROTOCOL_VERSION {
            return Err(Error::PeerMismatch(format!(
                "fabric-msg protocol version {PROTOCOL_VERSION} here, {version} at {}: run the same fabric-msg \
                 release on both sides",
                self.peer
            )));
        }
        Ok(())
    }

    fn hello(&mut self, profile: WireProfile, name: Vec<u8>) -> Result<()> {
        self.write(&Frame::Hello {
            magic: MAGIC,
            version: PROTOCOL_VERSION,
            profile,
            name,
        })
    }

    /// The peer's Hello, checked; its Reject as the mismatch it reports.
    fn read_hello(&mut self) -> Result<(WireProfile, Vec<u8>)> {
        match self.read()? {
            Frame::Hello {
                magic,
                version,
                profile,
                name,
            } => {
                self.check_hello(magic, version)?;
                Ok((profile, name))
            }
            Frame::Reject { reason } => Err(self.refused(reason)),
            other => Err(self.fail(format!("expected Hello, got {}", frame_name(&other)))),
        }
    }

    fn read_ready(&mut self) -> Result<()> {
        match self.read()? {
            Frame::Ready => Ok(()),
            Frame::Reject { reason } => Err(self.refused(reason)),
            other => Err(self.fail(format!("expected Ready, got {}", frame_name(&other)))),
        }
    }

    /// Compare profiles; on a mismatch tell the peer why before failing,
    /// so both sides report it.
    fn agree(&mut self, local: &WireProfile, remote: &WireProfile) -> Result<Agreement> {
        check_peer(local, remote).inspect_err(|e| {
            self.write(&Frame::Reject {
                reason: e.to_string(),
            })
            .ok();
        })
    }

    /// The peer's endpoint name could not be used: tell it why, and name
    /// it in the error (a mismatch stays a mismatch).
    fn refuse_name(&mut self, e: Error) -> Error {
        let Error::PeerMismatch(m) = e else { return e };
        self.write(&Frame::Reject {
            reason: format!("your endpoint address was refused: {m}"),
        })
        .ok();
        Error::PeerMismatch(format!("peer at {}: {m}", self.peer))
    }

    fn refused(&self, reason: String) -> Error {
        Error::PeerMismatch(format!("the peer at {} refused: {reason}", self.peer))
    }

    fn write(&mut self, f: &Frame) -> Result<()> {
        write_frame(&mut self.tcp, f).map_err(|e| self.io_fail("sending", e))
    }

    fn read(&mut self) -> Result<Frame> {
        let mut len = [0u8; 4];
        self.tcp
            .read_exact(&mut len)
            .map_err(|e| self.io_fail("receiving", e))?;
        let len = u32::from_le_bytes(len) as usize;
        if len > MAX_FRAME {
            return Err(self.fail(format!(
                "frame of {len} bytes announced, more than the {MAX_FRAME} allowed: not a fabric-msg peer, or corrupt"
            )));
        }
        let mut body = vec![0u8; len];
        self.tcp
            .read_exact(&mut body)
            .map_err(|e| self.io_fail("receiving", e))?;
        decode_frame(&body).map_err(|m| self.fail(m))
    }

    fn io_fail(&self, what: &str, e: std::io::Error) -> Error {
        let message = match e.kind() {
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
                format!("timed out {what} the handshake: the peer is stalled or not fabric-msg")
            }
            std::io::ErrorKind::UnexpectedEof => format!("connection closed while {what} the handshake"),
            _ => format!("{what} the handshake failed: {e}"),
        };
        self.fail(message)
    }
}
