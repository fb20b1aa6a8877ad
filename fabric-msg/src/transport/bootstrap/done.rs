//! The one place a finished handshake's TCP stream goes.

use crate::transport::event_loop::{EventLoop, Peer};
use std::net::TcpStream;

/// Where every finished handshake's TCP stream goes, on both sides and on
/// every endpoint type, once the peer is usable. The stream is blocking,
/// without timeouts. For now it is closed here.
pub(crate) fn handshake_done(_ev: &mut EventLoop, _peer: &Peer, stream: TcpStream) {
    drop(stream);
}
