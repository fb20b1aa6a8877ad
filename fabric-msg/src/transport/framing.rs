//! Out-of-band frames on a TCP stream: a little-endian `u32` length, then
//! the body (the postcard encoding of a value). The bootstrap's handshake
//! (`transport/bootstrap/`), the World's rendezvous (`world/rendezvous/`)
//! and its root's admission of joining ranks (`world/admission.rs`) all
//! speak it, each with its own bound on a frame's length and its own
//! wording of what went wrong (made from a [`ReadFail`]).
//!
//! A frame is read by a [`FrameReader`] in as many pieces as it arrives:
//! what came so far is kept between calls, so a non-blocking socket (the
//! bootstrap listener's, the admission's) and a blocking one with a
//! deadline (the bootstrap client's, the rendezvous') read the same way,
//! and a slow sender costs a buffer, not a thread. The announced length is
//! checked against the caller's bound before the body's buffer is
//! allocated, and nothing past the frame is read.

use serde::Serialize;
use std::io::{self, ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::Instant;

/// Bytes of a frame's length prefix.
const PREFIX: usize = 4;

/// Write `value` as one frame, in a single `write_all`.
pub(crate) fn write_frame<T: Serialize>(w: &mut impl Write, value: &T) -> io::Result<()> {
    let body = postcard::to_stdvec(value).map_err(|e| io::Error::new(ErrorKind::InvalidData, e))?;
    let len = u32::try_from(body.len())
        .map_err(|_| io::Error::new(ErrorKind::InvalidData, "frame larger than 4 GiB"))?;
    let mut msg = Vec::with_capacity(PREFIX + body.len());
    msg.extend_from_slice(&len.to_le_bytes());
    msg.extend_from_slice(&body);
    w.write_all(&msg)
}

/// Why a frame could not be read; each caller words it for its users.
#[derive(Debug)]
pub(crate) enum ReadFail {
    /// The socket failed.
    Io(io::Error),
    /// The peer closed the connection, `n` bytes into the frame (0: before
    /// its first byte, a clean end between frames).
    Closed(usize),
    /// The announced length is over the reader's bound.
    TooLong(usize),
    /// The deadline of [`FrameReader::read_by`] passed first.
    TimedOut,
}

/// One frame being gathered.
pub(crate) struct FrameReader {
    buf: Vec<u8>,
    filled: usize,
    max: usize,
}

impl FrameReader {
    /// A reader of frames whose body is at most `max` bytes.
    pub(crate) fn new(max: usize) -> FrameReader {
        FrameReader {
            buf: vec![0; PREFIX],
            filled: 0,
            max,
        }
    }

    /// Read what is there: `Ok(Some(body))` once the frame is whole,
    /// `Ok(None)` when the socket has no more for now (would block, or
    /// its read timeout passed).
    pub(crate) fn read(&mut self, r: &mut impl Read) -> Result<Option<Vec<u8>>, ReadFail> {
        loop {
            if let Some(body) = self.whole()? {
                return Ok(Some(body));
            }
            if !self.read_some(r)? {
                return Ok(None);
            }
        }
    }

    /// Read one whole frame from a blocking stream before `deadline` (the
    /// whole frame, not each `read()`: every read waits at most for what
    /// is left of it).
    pub(crate) fn read_by(&mut self, s: &mut TcpStream, deadline: Instant) -> Result<Vec<u8>, ReadFail> {
        loop {
            if let Some(body) = self.whole()? {
                return Ok(body);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(ReadFail::TimedOut);
            }
            s.set_read_timeout(Some(left)).map_err(ReadFail::Io)?;
            if !self.read_some(s)? {
                return Err(ReadFail::TimedOut);
            }
        }
    }

    /// The body, if the frame is whole (the reader is then ready for the
    /// next); once the prefix is in, its length is checked and the body's
    /// room made.
    fn whole(&mut self) -> Result<Option<Vec<u8>>, ReadFail> {
        if self.filled < self.buf.len() {
            return Ok(None);
        }
        if self.buf.len() == PREFIX {
            let len = u32::from_le_bytes([self.buf[0], self.buf[1], self.buf[2], self.buf[3]]) as usize;
            if len > self.max {
                return Err(ReadFail::TooLong(len));
            }
            self.buf.resize(PREFIX + len, 0);
        }
        if self.filled < self.buf.len() {
            return Ok(None);
        }
        let body = self.buf[PREFIX..].to_vec();
        *self = FrameReader::new(self.max);
        Ok(Some(body))
    }

    /// One `read()` into what the frame still lacks: `Ok(false)` when
    /// nothing is there for now.
    fn read_some(&mut self, r: &mut impl Read) -> Result<bool, ReadFail> {
        loop {
            match r.read(&mut self.buf[self.filled..]) {
                Ok(0) => return Err(ReadFail::Closed(self.filled)),
                Ok(n) => {
                    self.filled += n;
                    return Ok(true);
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    return Ok(false)
                }
                Err(e) => return Err(ReadFail::Io(e)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{write_frame, FrameReader, ReadFail};
    use std::io::{ErrorKind, Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::time::{Duration, Instant};

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

    /// Gives its bytes, then ends the stream.
    struct Ends(Vec<u8>);

    impl Read for Ends {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let n = buf.len().min(self.0.len());
            buf[..n].copy_from_slice(&self.0[..n]);
            self.0.drain(..n);
            Ok(n)
        }
    }

    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        (a, b)
    }

    #[test]
    fn a_frame_arriving_byte_by_byte_is_gathered_whole() {
        let mut bytes = 3u32.to_le_bytes().to_vec();
        bytes.extend_from_slice(b"abcX");
        let mut src = Trickle(bytes, 1);
        let mut r = FrameReader::new(16);
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
            FrameReader::new(16 * 1024).read(&mut src),
            Err(ReadFail::TooLong(len)) if len == u32::MAX as usize
        ));
        // The bound itself is allowed; one byte more is not.
        let mut at = Trickle(16u32.to_le_bytes().to_vec(), 4);
        assert!(matches!(FrameReader::new(16).read(&mut at), Ok(None)));
        let mut over = Trickle(17u32.to_le_bytes().to_vec(), 4);
        assert!(matches!(
            FrameReader::new(16).read(&mut over),
            Err(ReadFail::TooLong(17))
        ));
    }

    #[test]
    fn a_close_mid_frame_says_how_far_it_got() {
        let mut r = FrameReader::new(16);
        assert!(matches!(r.read(&mut Ends(Vec::new())), Err(ReadFail::Closed(0))));
        let mut bytes = 5u32.to_le_bytes().to_vec();
        bytes.extend_from_slice(b"ab");
        let mut r = FrameReader::new(16);
        assert!(matches!(r.read(&mut Ends(bytes)), Err(ReadFail::Closed(6))));
    }

    #[test]
    fn what_the_writer_writes_the_reader_reads_frame_by_frame() {
        let (mut a, mut b) = pair();
        write_frame(&mut a, &(7u32, "seven")).unwrap();
        write_frame(&mut a, &()).unwrap();
        let mut r = FrameReader::new(64);
        let deadline = Instant::now() + Duration::from_secs(30);
        let first = r.read_by(&mut b, deadline).unwrap();
        assert_eq!(
            postcard::from_bytes::<(u32, String)>(&first).unwrap(),
            (7, "seven".to_string())
        );
        assert_eq!(r.read_by(&mut b, deadline).unwrap(), Vec::<u8>::new());
        drop(a);
        assert!(matches!(r.read_by(&mut b, deadline), Err(ReadFail::Closed(0))));
    }

    #[test]
    fn a_deadline_bounds_the_whole_frame_not_each_read() {
        let (mut a, mut b) = pair();
        // Half a prefix now, a byte every 300 ms after: reads find
        // something, but the frame is whole only after 3.3 s.
        a.write_all(&[9, 0]).unwrap();
        let trickle = std::thread::spawn(move || {
            for _ in 0..11 {
                std::thread::sleep(Duration::from_millis(300));
                if a.write_all(&[0]).is_err() {
                    break;
                }
            }
        });
        let started = Instant::now();
        let got = FrameReader::new(64).read_by(&mut b, started + Duration::from_millis(500));
        let took = started.elapsed();
        assert!(matches!(got, Err(ReadFail::TimedOut)), "{got:?}");
        assert!(took >= Duration::from_millis(500), "gave up early: {took:?}");
        assert!(took < Duration::from_secs(3), "missed its deadline: {took:?}");
        drop(b);
        trickle.join().unwrap();
    }
}
