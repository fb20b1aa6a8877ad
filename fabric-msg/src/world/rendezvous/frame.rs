//! The rendezvous' frames: what each says, how one is read from a
//! connection (through `transport/framing.rs`, with the rendezvous' bound
//! and wording), and the root's reading of a first frame.

use crate::transport::framing::{write_frame, FrameReader, ReadFail};
use crate::world::admission::{Judge, Verdict};
use serde::{Deserialize, Serialize};
use std::io::ErrorKind;
use std::net::TcpStream;
use std::time::Instant;

/// Largest frame accepted: a table of every rank's endpoint name and profile.
pub(super) const MAX_FRAME: usize = 4 << 20;
/// `FMSW`: the first field of every `Join`.
pub(super) const MAGIC: u32 = 0x464d_5357;
/// Version of this exchange.
pub(super) const VERSION: u16 = 1;

/// Every frame of the rendezvous and of the liveness star after it.
#[derive(Debug, Serialize, Deserialize)]
pub(super) enum Frame {
    Join {
        magic: u32,
        version: u16,
        rank: u32,
        size: u32,
    },
    Welcome,
    Reject {
        reason: String,
    },
    Data {
        bytes: Vec<u8>,
    },
    Table {
        entries: Vec<Vec<u8>>,
    },
    Abort {
        reason: String,
    },
    Lost {
        rank: u32,
        why: String,
    },
    Bye,
    Done,
}

/// The root's reading of a first frame: a `Join` of this world, or why not.
pub(super) struct JoinJudge {
    pub(super) size: u32,
}

impl Judge for JoinJudge {
    fn judge(&mut self, body: &[u8]) -> Verdict {
        match decode_frame(body) {
            Ok(Frame::Join {
                magic,
                version,
                rank,
                size,
            }) => {
                if magic != MAGIC || version != VERSION {
                    Verdict::Refuse(format!("not a fabric-msg rendezvous {VERSION} join"))
                } else if size != self.size {
                    Verdict::Refuse(format!("FABRIC_MSG_SIZE={size} there, {} at rank 0", self.size))
                } else if rank == 0 || rank >= self.size {
                    Verdict::Refuse(format!(
                        "rank {rank} is not a joining rank of a world of {}",
                        self.size
                    ))
                } else {
                    Verdict::Join(rank)
                }
            }
            Ok(other) => Verdict::Refuse(format!("expected Join, got {}", frame_name(&other))),
            Err(e) => Verdict::Refuse(e.to_string()),
        }
    }

    fn refuse(&mut self, s: &mut TcpStream, reason: String) {
        let _ = write_frame(s, &Frame::Reject { reason });
    }
}

/// Read one frame before `deadline`. `Ok(None)`: the peer closed cleanly
/// (between frames); a close inside a frame is `UnexpectedEof`, a deadline
/// passed `TimedOut`, a length over [`MAX_FRAME`] or an undecodable body
/// `InvalidData`.
pub(super) fn read_frame(s: &mut TcpStream, deadline: Instant) -> std::io::Result<Option<Frame>> {
    let body = match FrameReader::new(MAX_FRAME).read_by(s, deadline) {
        Ok(body) => body,
        Err(ReadFail::Closed(0)) => return Ok(None),
        Err(ReadFail::Closed(_)) => return Err(ErrorKind::UnexpectedEof.into()),
        Err(ReadFail::TimedOut) => return Err(ErrorKind::TimedOut.into()),
        Err(ReadFail::TooLong(len)) => {
            return Err(std::io::Error::new(
                ErrorKind::InvalidData,
                format!("frame of {len} bytes, more than the {MAX_FRAME} allowed"),
            ))
        }
        Err(ReadFail::Io(e)) => return Err(e),
    };
    decode_frame(&body).map(Some)
}

pub(super) fn decode_frame(body: &[u8]) -> std::io::Result<Frame> {
    postcard::from_bytes(body)
        .map_err(|e| std::io::Error::new(ErrorKind::InvalidData, format!("malformed frame ({e})")))
}

/// For the fuzz targets: the bodies of real frames, to mutate.
pub(crate) fn fuzz_seeds() -> Vec<Vec<u8>> {
    let frames = [
        Frame::Join {
            magic: MAGIC,
            version: VERSION,
            rank: 3,
            size: 8,
        },
        Frame::Data { bytes: vec![7; 40] },
        Frame::Table {
            entries: vec![vec![1; 16], vec![2; 16], vec![]],
        },
        Frame::Lost {
            rank: 2,
            why: "its process exited".into(),
        },
        Frame::Done,
    ];
    frames
        .iter()
        .filter_map(|f| postcard::to_stdvec(f).ok())
        .collect()
}

/// For the fuzz targets: a frame decoded as [`read_frame`] does after its
/// length check; whether it decoded.
pub(crate) fn fuzz_frame(body: &[u8]) -> bool {
    body.len() <= MAX_FRAME && decode_frame(body).is_ok()
}

pub(super) fn frame_name(f: &Frame) -> &'static str {
    match f {
        Frame::Join { .. } => "Join",
        Frame::Welcome => "Welcome",
        Frame::Reject { .. } => "Reject",
        Frame::Data { .. } => "Data",
        Frame::Table { .. } => "Table",
        Frame::Abort { .. } => "Abort",
        Frame::Lost { .. } => "Lost",
        Frame::Bye => "Bye",
        Frame::Done => "Done",
    }
}
