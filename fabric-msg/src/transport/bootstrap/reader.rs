//! Reading one length-prefixed handshake frame from a socket in as many
//! pieces as it arrives: what came so far is kept between calls, so a
//! non-blocking socket (the listener's) and a blocking one with a timeout
//! (the client's) read the same way, and a slow sender costs a buffer, not
//! a thread. The length is checked against [`MAX_FRAME`] before the body's
//! buffer is allocated, and nothing past the frame is read.

use super::protocol::{fail, io_fail, MAX_FRAME};
use crate::error::Error;
use std::io::{ErrorKind, Read};
use std::net::SocketAddr;

/// Why a frame could not be read.
pub(super) enum ReadFail {
    /// The socket failed.
    Io(std::io::Error),
    /// The peer closed the connection (after `n` bytes of the frame).
    Closed(usize),
    /// The announced length is over [`MAX_FRAME`].
    TooLong(usize),
}

impl ReadFail {
    /// As the handshake's error, naming the peer.
    pub(super) fn into_error(self, peer: &SocketAddr) -> Error {
        match self {
            ReadFail::Io(e) => io_fail(peer, "receiving", e),
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
}

/// One frame being gathered.
pub(super) struct FrameReader {
    buf: Vec<u8>,
    filled: usize,
}

impl FrameReader {
    pub(super) fn new() -> FrameReader {
        FrameReader {
            buf: vec![0; 4],
            filled: 0,
        }
    }

    /// Read what is there: `Ok(Some(body))` once the frame is whole,
    /// `Ok(None)` when the socket has no more for now (would block, or
    /// its read timeout passed).
    pub(super) fn read(&mut self, r: &mut impl Read) -> Result<Option<Vec<u8>>, ReadFail> {
        loop {
            if self.filled == self.buf.len() {
                if self.buf.len() == 4 {
                    let len =
                        u32::from_le_bytes([self.buf[0], self.buf[1], self.buf[2], self.buf[3]]) as usize;
                    if len > MAX_FRAME {
                        return Err(ReadFail::TooLong(len));
                    }
                    self.buf.resize(4 + len, 0);
                }
                if self.filled == self.buf.len() {
                    let body = self.buf[4..].to_vec();
                    *self = FrameReader::new();
                    return Ok(Some(body));
                }
            }
            match r.read(&mut self.buf[self.filled..]) {
                Ok(0) => return Err(ReadFail::Closed(self.filled)),
                Ok(n) => self.filled += n,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => return Ok(None),
                Err(e) => return Err(ReadFail::Io(e)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hands out its bytes a few at a time, then would block.
    struct Trickle(Vec<u8>, usize);

    impl Read for Trickle {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            if self.0.is_empty() {
                return Err(ErrorKind::WouldBlock.into());
            }
            let n = buf.len().min(self.1).min(self.0.len());
            buf[..n].copy_from_slice(&self.0[..n]);
            self.0.drain(..n);
            Ok(n)
        }
    }

    #[test]
    fn a_frame_arriving_byte_by_byte_is_gathered_whole() {
        let mut bytes = 3u32.to_le_bytes().to_vec();
        bytes.extend_from_slice(b"abcX");
        let mut src = Trickle(bytes, 1);
        let mut r = FrameReader::new();
        let mut got = None;
        for _ in 0..20 {
            if let Ok(Some(b)) = r.read(&mut src) {
                got = Some(b);
                break;
            }
        }
        assert_eq!(got.as_deref(), Some(&b"abc"[..]));
        assert_eq!(src.0, b"X", "nothing past the frame is read");
    }

    #[test]
    fn an_announced_length_over_the_limit_is_refused_before_allocating() {
        let mut src = Trickle(u32::MAX.to_le_bytes().to_vec(), 4);
        assert!(matches!(
            FrameReader::new().read(&mut src),
            Err(ReadFail::TooLong(_))
        ));
    }

    #[test]
    fn a_close_mid_frame_says_how_far_it_got() {
        struct Eof;
        impl Read for Eof {
            fn read(&mut self, _: &mut [u8]) -> std::io::Result<usize> {
                Ok(0)
            }
        }
        let mut r = FrameReader::new();
        assert!(matches!(r.read(&mut Eof), Err(ReadFail::Closed(0))));
    }
}
