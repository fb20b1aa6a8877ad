//! The one place a finished handshake's TCP stream goes: it stays open as
//! the peer's lifeline (`transport/liveness/lifeline.rs`), on which its death or
//! stall is noticed.

use crate::error::Result;
use crate::transport::event_loop::{EventLoop, Peer};
use std::net::TcpStream;

/// Where every finished handshake's TCP stream goes, on both sides and on
/// every endpoint type, once the peer is usable: the loop keeps it as the
/// peer's lifeline, named by the peer's socket address.
pub(crate) fn handshake_done(ev: &mut EventLoop, peer: &Peer, stream: TcpStream) -> Result<()> {
    let label = stream
        .peer_addr()
        .map_or_else(|_| "a peer whose address is gone".to_string(), |a| a.to_string());
    ev.watch_peer(peer, stream, label)
}
