//! The handshake's frames and what both sides do with them: decoding a
//! peer's bytes (magic and version first), the checks on a `Hello`, the
//! `Reject` that tells a peer why, and the errors that name it.

use crate::discovery::profile::{check_peer, Agreement, WireProfile, PROTOCOL_VERSION};
use crate::error::{Error, Result};
use crate::transport::framing::{write_frame, ReadFail};
use serde::{Deserialize, Serialize};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// `FMSG`: the first field of every `Hello`.
const MAGIC: u32 = 0x464d_5347;

/// Largest handshake frame accepted (an endpoint name is well under 1 KiB).
pub const MAX_FRAME: usize = 16 * 1024;

/// Default time allowed for a whole handshake.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, Serialize, Deserialize)]
pub(super) enum Frame {
    Hello {
        magic: u32,
        version: u16,
        profile: WireProfile,
        name: Vec<u8>,
        /// Server → client on connected endpoints: the connection data its
        /// `fi_connect` must carry. 0 otherwise.
        nonce: u64,
    },
    Reject {
        reason: String,
    },
    Ready,
}

/// The first fields of a `Hello` as every protocol version encodes them
/// (postcard: the variant index, then the fields in order), so a peer of
/// another version is told so rather than that its frame is garbled.
fn hello_head(body: &[u8]) -> Option<(u32, u16)> {
    let (variant, rest) = postcard::take_from_bytes::<u32>(body).ok()?;
    if variant != 0 {
        return None;
    }
    let ((magic, version), _) = postcard::take_from_bytes::<(u32, u16)>(rest).ok()?;
    Some((magic, version))
}

/// One handshake frame from a peer's bytes (at most [`MAX_FRAME`]), whole
/// or refused: a `Hello`'s magic and version are checked before the rest
/// is decoded.
pub(super) fn decode_frame(body: &[u8], peer: &SocketAddr) -> Result<Frame> {
    if let Some((magic, version)) = hello_head(body) {
        if magic != MAGIC {
            return Err(fail(peer, "not a fabric-msg peer (bad magic)".into()));
        }
        if version != PROTOCOL_VERSION {
            return Err(Error::PeerMismatch(format!(
                "fabric-msg protocol version {PROTOCOL_VERSION} here, {version} at {peer}: run the same \
                 fabric-msg release on both sides"
            )));
        }
    }
    let (frame, rest) = postcard::take_from_bytes::<Frame>(body).map_err(|e| {
        fail(
            peer,
            format!("undecodable handshake frame ({e}): not a fabric-msg peer?"),
        )
    })?;
    if !rest.is_empty() {
        return Err(fail(
            peer,
            format!("{} stray bytes after a handshake frame", rest.len()),
        ));
    }
    Ok(frame)
}

/// A `Hello`'s profile, name and nonce; a `Reject` as the refusal it reports.
pub(super) fn expect_hello(frame: Frame, peer: &SocketAddr) -> Result<(WireProfile, Vec<u8>, u64)> {
    match frame {
        Frame::Hello {
            profile, name, nonce, ..
        } => Ok((profile, name, nonce)),
        Frame::Reject { reason } => Err(refused(peer, reason)),
        Frame::Ready => Err(fail(peer, "expected Hello, got Ready".into())),
    }
}

pub(super) fn expect_ready(frame: Frame, peer: &SocketAddr) -> Result<()> {
    match frame {
        Frame::Ready => Ok(()),
        Frame::Reject { reason } => Err(refused(peer, reason)),
        Frame::Hello { .. } => Err(fail(peer, "expected Ready, got Hello".into())),
    }
}

/// For the fuzz targets: a handshake frame decoded as a reader does after
/// its length check; a hello's profile, name and nonce.
pub(crate) fn fuzz_frame(body: &[u8]) -> Option<(WireProfile, Vec<u8>, u64)> {
    if body.len() > MAX_FRAME {
        return None;
    }
    let peer = SocketAddr::from(([127, 0, 0, 1], 0));
    expect_hello(decode_frame(body, &peer).ok()?, &peer).ok()
}

/// For the fuzz targets: the bodies of real frames, to mutate.
pub(crate) fn fuzz_seeds(profile: WireProfile, name: Vec<u8>) -> Vec<Vec<u8>> {
    let frames = [
        hello(profile.clone(), name.clone(), 0),
        hello(profile, name, 0x0123_4567_89ab_cdef),
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

pub(super) fn hello(profile: WireProfile, name: Vec<u8>, nonce: u64) -> Frame {
    Frame::Hello {
        magic: MAGIC,
        version: PROTOCOL_VERSION,
        profile,
        name,
        nonce,
    }
}

pub(super) fn io(context: &str, source: std::io::Error) -> Error {
    Error::Io {
        context: context.to_string(),
        source,
    }
}

pub(super) fn fail(peer: &SocketAddr, message: String) -> Error {
    Error::Handshake {
        peer: peer.to_string(),
        message,
    }
}

pub(super) fn refused(peer: &SocketAddr, reason: String) -> Error {
    Error::PeerMismatch(format!("the peer at {peer} refused: {reason}"))
}

/// Send one frame; on a non-blocking socket a frame that does not fit at
/// once fails (handshake frames are small and the socket fresh, so only a
/// peer that reads nothing at all gets there).
pub(super) fn send(tcp: &mut TcpStream, peer: &SocketAddr, f: &Frame) -> Result<()> {
    write_frame(tcp, f).map_err(|e| io_fail(peer, "sending", e))
}

/// Compare profiles; on a mismatch tell the peer why before failing, so
/// both sides report it.
pub(super) fn agree(tcp: &mut TcpStream, local: &WireProfile, remote: &WireProfile) -> Result<Agreement> {
    check_peer(local, remote).inspect_err(|e| {
        write_frame(
            tcp,
            &Frame::Reject {
                reason: e.to_string(),
            },
        )
        .ok();
    })
}

/// The peer's endpoint name could not be used: tell it why, and name it in
/// the error (a mismatch stays a mismatch).
pub(super) fn refuse_name(tcp: &mut TcpStream, peer: &SocketAddr, e: Error) -> Error {
    let Error::PeerMismatch(m) = e else { return e };
    write_frame(
        tcp,
        &Frame::Reject {
            reason: format!("your endpoint address was refused: {m}"),
        },
    )
    .ok();
    Error::PeerMismatch(format!("peer at {peer}: {m}"))
}

pub(super) fn io_fail(peer: &SocketAddr, what: &str, e: std::io::Error) -> Error {
    let message = match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
            format!("timed out {what} the handshake: the peer is stalled or not fabric-msg")
        }
        std::io::ErrorKind::UnexpectedEof => format!("connection closed while {what} the handshake"),
        _ => format!("{what} the handshake failed: {e}"),
    };
    fail(peer, message)
}

/// A frame that could not be read, as the handshake's error naming the peer.
pub(super) fn read_fail(e: ReadFail, peer: &SocketAddr) -> Error {
    match e {
        ReadFail::Io(e) => io_fail(peer, "receiving", e),
        ReadFail::TimedOut => io_fail(peer, "receiving", std::io::ErrorKind::TimedOut.into()),
        ReadFail::Closed(0) => fail(peer, "connection closed while receiving the handshake".into()),
        ReadFail::Closed(n) => fail(
            peer,
            format!("connection closed while receiving the handshake, {n} bytes into a frame"),
        ),
        ReadFail::TooLong(len) => fail(
            peer,
            format!(
                "frame of {len} bytes announced, more than the {MAX_FRAME} allowed: not a fabric-msg peer, \
                 or corrupt"
            ),
        ),
    }
}
