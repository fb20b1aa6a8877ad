//! The connecting side of the handshake: blocking, one handshake, one
//! deadline for all of it (a server that trickles its frames is cut off
//! when the deadline passes, however often it sends a byte).

use super::done::handshake_done;
use super::protocol::{
    agree, decode_frame, expect_hello, expect_ready, fail, hello, io, read_fail, refuse_name, send, Frame,
    MAX_FRAME,
};
use crate::discovery::info::EndpointType;
use crate::error::{Error, Result};
use crate::transport::event_loop::{EndpointId, EventLoop, Peer};
use crate::transport::framing::FrameReader;
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// Connect to a [`Listener`](super::Listener) at `addr` and complete the
/// handshake on `ep` within `timeout`.
pub fn connect(
    ev: &mut EventLoop,
    ep: EndpointId,
    addr: impl ToSocketAddrs,
    timeout: Duration,
) -> Result<Peer> {
    connect_with(ev, ep, addr, timeout, |_, _| Ok(()))
}

/// [`connect`], calling `prepost(ev, endpoint)` before the peer can send
/// (see [`Listener::accept_with`](super::Listener::accept_with)).
pub fn connect_with(
    ev: &mut EventLoop,
    ep: EndpointId,
    addr: impl ToSocketAddrs,
    timeout: Duration,
    mut prepost: impl FnMut(&mut EventLoop, EndpointId) -> Result<()>,
) -> Result<Peer> {
    let deadline = Instant::now() + timeout;
    let addrs: Vec<SocketAddr> = addr
        .to_socket_addrs()
        .map_err(|e| io("resolving the peer's address", e))?
        .collect();
    let mut last = None;
    let mut stream = None;
    for a in &addrs {
        let left = deadline.saturating_duration_since(Instant::now());
        match TcpStream::connect_timeout(a, left.max(Duration::from_millis(1))) {
            Ok(s) => {
                stream = Some((s, *a));
                break;
            }
            Err(e) => last = Some(io(&format!("connecting to {a}"), e)),
        }
    }
    let Some((tcp, peer)) = stream else {
        return Err(last.unwrap_or_else(|| Error::Handshake {
            peer: "?".into(),
            message: "the address resolved to nothing".into(),
        }));
    };
    tcp.set_nodelay(true).ok();
    let mut s = Client {
        tcp,
        peer,
        deadline,
        timeout,
    };
    let local = ev.wire_profile();
    let msg = ev.profile().endpoint_type == EndpointType::Msg;
    // A connecting MSG endpoint has no address to give: it connects to the server's.
    let own = if msg { Vec::new() } else { ev.endpoint_name(ep)? };
    s.send(&hello(local.clone(), own, 0))?;
    let (profile, name, nonce) = expect_hello(s.read()?, &peer)?;
    let agreement = agree(&mut s.tcp, &local, &profile)?;
    let peer_handle = if msg {
        let left = deadline.saturating_duration_since(Instant::now());
        let conn = ev
            .msg_connect(&name, &nonce.to_le_bytes(), left, &mut prepost)
            .map_err(|e| refuse_name(&mut s.tcp, &peer, e))?;
        Peer::connected(conn, agreement)
    } else {
        let p = ev
            .insert_peer(ep, &name, agreement)
            .map_err(|e| refuse_name(&mut s.tcp, &peer, e))?;
        prepost(ev, ep)?;
        p
    };
    s.send(&Frame::Ready)?;
    expect_ready(s.read()?, &peer)?;
    let stream = s.into_stream();
    handshake_done(ev, &peer_handle, stream)?;
    Ok(peer_handle)
}

/// The client's socket and its one deadline.
struct Client {
    tcp: TcpStream,
    peer: SocketAddr,
    deadline: Instant,
    timeout: Duration,
}

impl Client {
    /// Time left, as a socket timeout (never zero, which means none).
    fn left(&self, what: &str) -> Result<Duration> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(fail(
                &self.peer,
                format!(
                    "timed out {what} the handshake after {:?} (the whole handshake's deadline): the peer is \
                     stalled or not fabric-msg",
                    self.timeout
                ),
            ));
        }
        Ok(left)
    }

    fn send(&mut self, f: &Frame) -> Result<()> {
        let left = self.left("sending")?;
        self.tcp
            .set_write_timeout(Some(left))
            .map_err(|e| io("setting a timeout", e))?;
        send(&mut self.tcp, &self.peer, f)
    }

    fn read(&mut self) -> Result<Frame> {
        let mut r = FrameReader::new(MAX_FRAME);
        loop {
            let left = self.left("receiving")?;
            self.tcp
                .set_read_timeout(Some(left))
                .map_err(|e| io("setting a timeout", e))?;
            match r.read(&mut self.tcp) {
                Ok(Some(body)) => return decode_frame(&body, &self.peer),
                Ok(None) => {}
                Err(e) => return Err(read_fail(e, &self.peer)),
            }
        }
    }

    /// The stream as `handshake_done` takes it: blocking, no timeouts.
    fn into_stream(self) -> TcpStream {
        self.tcp.set_read_timeout(None).ok();
        self.tcp.set_write_timeout(None).ok();
        self.tcp
    }
}
