//! Out-of-band frames on a TCP stream: a little-endian `u32` length, then
//! the postcard encoding of the value. The bootstrap's handshake and the
//! World's rendezvous both speak it.

use serde::Serialize;
use std::io::{self, ErrorKind, Write};

/// Write `value` as one frame, in a single `write_all`.
pub(crate) fn write_frame<T: Serialize>(w: &mut impl Write, value: &T) -> io::Result<()> {
    let body = postcard::to_stdvec(value).map_err(|e| io::Error::new(ErrorKind::InvalidData, e))?;
    let len = u32::try_from(body.len())
        .map_err(|_| io::Error::new(ErrorKind::InvalidData, "frame larger than 4 GiB"))?;
    let mut msg = Vec::with_capacity(4 + body.len());
    msg.extend_from_slice(&len.to_le_bytes());
    msg.extend_from_slice(&body);
    w.write_all(&msg)
}
