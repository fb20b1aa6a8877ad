//! The wire format of emulated atomics: requests and replies travel as
//! tagged messages whose tag has the top usable tag bit set (bit 63 where
//! the provider honours 64 bits, bit 62 on `net`'s 63), a tag space
//! applications cannot send in or receive from (`post.rs` refuses and
//! masks it), and the state the loop keeps for them.
//!
//! ```text
//! request (the reserved bit alone), little-endian:
//!  0 magic "FMAq"   4 op code   5..8 zero   8 reply tag   16 remote address
//! 24 key           32 operand  40 compare  48 name length (u16)  56 name…
//! reply (the request's reply tag, the reserved bit and the next set), 16 bytes:
//!  0 magic "FMAr"   4 status    5..8 zero   8 value
//! ```
//!
//! Everything a peer sends is checked before use: magic, length, op code,
//! name length; the reply tag is forced into the reply space.

use crate::discovery::atomic::AtomicOperation;
use crate::ffi;
use crate::memory::buffer::{Buffer, HEADROOM};
use crate::memory::mr::{AtomicRefusal, RegionInner};
use std::sync::atomic::Ordering;
use std::sync::Weak;

/// The tags reserved for fabric-msg's own messages: those with the top
/// usable tag bit set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TagSpace {
    bit: u64,
    /// Reserved from applications: only on loops that emulate atomics, so
    /// others keep every tag bit.
    reserved: bool,
}

impl TagSpace {
    /// For a provider honouring `tag_bits` tag bits (64 when unknown).
    pub(crate) fn new(tag_bits: u32) -> TagSpace {
        let bits = if tag_bits < 40 { 64 } else { tag_bits.min(64) };
        TagSpace {
            bit: 1 << (bits - 1),
            reserved: true,
        }
    }

    /// The same space, kept from applications only if `reserved`.
    pub(crate) fn reserved(self, reserved: bool) -> TagSpace {
        TagSpace { reserved, ..self }
    }

    fn reply_bit(self) -> u64 {
        self.bit >> 1
    }

    /// The tag of every request.
    pub(super) fn request(self) -> u64 {
        self.bit
    }

    /// The reply tag of the operation in slot `index` at `generation`: a
    /// stale or forged reply cannot match a later use of the slot.
    pub(super) fn reply(self, index: u32, generation: u64) -> u64 {
        let gen_mask = (self.reply_bit() >> 32) - 1;
        self.bit | self.reply_bit() | ((generation & gen_mask) << 32) | u64::from(index)
    }

    /// A peer's reply tag, forced into the reply space.
    fn force_reply(self, t: u64) -> u64 {
        (t & (self.reply_bit() - 1)) | self.bit | self.reply_bit()
    }

    /// Refuse an application's send in the reserved tag space.
    pub(super) fn check_send(self, tag: Option<u64>) -> crate::error::Result<()> {
        match tag {
            Some(t) if self.reserved && t & self.bit != 0 => Err(self.refusal(t)),
            _ => Ok(()),
        }
    }

    /// An application's receive matcher, kept out of the reserved space: a
    /// tag in it is refused, and the reserved bit is never ignored (so a
    /// wildcard receive still matches every tag an application can send).
    pub(super) fn recv(self, tag: Option<(u64, u64)>) -> crate::error::Result<Option<(u64, u64)>> {
        match tag {
            _ if !self.reserved => Ok(tag),
            Some((t, _)) if t & self.bit != 0 => Err(self.refusal(t)),
            Some((t, ignore)) => Ok(Some((t, ignore & !self.bit))),
            None => Ok(None),
        }
    }

    fn refusal(self, t: u64) -> crate::error::Error {
        crate::error::Error::Usage(format!(
            "tag {t:#x} has bit {} set: that bit is reserved for fabric-msg's own messages (emulated \
             atomics); applications use tags below {:#x}",
            self.bit.trailing_zeros(),
            self.bit
        ))
    }
}

impl Default for TagSpace {
    fn default() -> Self {
        TagSpace::new(64)
    }
}
/// Longest endpoint name a request carries (the origin's, for the reply).
pub(super) const MAX_NAME: usize = 192;
const NAME_AT: usize = 56;
/// Capacity of a request buffer.
pub(super) const REQUEST_LEN: usize = NAME_AT + MAX_NAME;
/// Bytes of a reply: it travels in a header-only buffer (as write_data's
/// notice does), so reply buffers and notice buffers share one pool.
pub(super) const REPLY_LEN: usize = HEADROOM;
/// Request receives each endpoint keeps posted.
pub(super) const REQUEST_RECVS: usize = 16;
/// Most replies waiting for room in the queue; past it (a peer flooding
/// the target with requests) a reply is dropped and its origin times out.
pub(super) const MAX_OUTBOX: usize = 1024;
/// Most origins whose address the loop inserts for replies (a peer
/// flooding it with forged names is refused past this).
pub(super) const MAX_ORIGINS: usize = 4096;

const REQ_MAGIC: [u8; 4] = *b"FMAq";
const REP_MAGIC: [u8; 4] = *b"FMAr";

/// A decoded request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Request {
    pub(super) op: AtomicOperation,
    pub(super) reply_tag: u64,
    pub(super) addr: u64,
    pub(super) key: u64,
    pub(super) operand: u64,
    pub(super) compare: u64,
}

/// What the target says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Status {
    Ok = 0,
    NoRegion = 1,
    OutOfBounds = 2,
    Misaligned = 3,
    AccessDenied = 4,
    Malformed = 5,
}

impl Status {
    fn from_code(c: u8) -> Option<Status> {
        [
            Status::Ok,
            Status::NoRegion,
            Status::OutOfBounds,
            Status::Misaligned,
            Status::AccessDenied,
            Status::Malformed,
        ]
        .get(c as usize)
        .copied()
    }

    /// libfabric's code and fabric-msg's text for a refusal.
    pub(super) fn failure(self) -> (u32, &'static str) {
        match self {
            Status::Ok => (0, "accepted"),
            Status::NoRegion => (
                ffi::FI_EKEYREJECTED,
                "emulated atomic refused by the target: no region there has this key (never issued, or \
                 revoked when the region was dropped)",
            ),
            Status::OutOfBounds => (
                ffi::FI_EINVAL,
                "emulated atomic refused by the target: the 8 bytes are not inside the region",
            ),
            Status::Misaligned => (
                ffi::FI_EINVAL,
                "emulated atomic refused by the target: the address is not 8-byte aligned",
            ),
            Status::AccessDenied => (
                ffi::FI_EACCES,
                "emulated atomic refused by the target: the region does not grant the access the \
                 operation needs",
            ),
            Status::Malformed => (
                ffi::FI_EINVAL,
                "emulated atomic refused by the target: the request was malformed (a different \
                 fabric-msg version?)",
            ),
        }
    }
}

impl From<AtomicRefusal> for Status {
    fn from(r: AtomicRefusal) -> Status {
        match r {
            AtomicRefusal::OutOfBounds => Status::OutOfBounds,
            AtomicRefusal::Misaligned => Status::Misaligned,
            AtomicRefusal::AccessDenied => Status::AccessDenied,
        }
    }
}

fn word(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(w)
}

/// Write a request and the origin's `name` into `out`; the length used.
/// `None` if the name is longer than [`MAX_NAME`] or `out` too short.
pub(super) fn encode_request(out: &mut [u8], r: &Request, name: &[u8]) -> Option<usize> {
    let len = NAME_AT + name.len();
    if name.len() > MAX_NAME || out.len() < len {
        return None;
    }
    out[..NAME_AT].fill(0);
    out[..4].copy_from_slice(&REQ_MAGIC);
    out[4] = r.op.code();
    for (at, v) in [
        (8, r.reply_tag),
        (16, r.addr),
        (24, r.key),
        (32, r.operand),
        (40, r.compare),
    ] {
        out[at..at + 8].copy_from_slice(&v.to_le_bytes());
    }
    out[48..50].copy_from_slice(&(name.len() as u16).to_le_bytes());
    out[NAME_AT..len].copy_from_slice(name);
    Some(len)
}

/// A request from `received` bytes, with the origin's name; `None` if
/// anything is off. The reply tag always lands in the reply space.
pub(super) fn decode_request(space: TagSpace, b: &[u8]) -> Option<(Request, &[u8])> {
    if b.len() < NAME_AT || b[..4] != REQ_MAGIC {
        return None;
    }
    let op = AtomicOperation::from_code(b[4])?;
    let name_len = u16::from_le_bytes([b[48], b[49]]) as usize;
    if name_len > MAX_NAME || b.len() != NAME_AT + name_len {
        return None;
    }
    let r = Request {
        op,
        reply_tag: space.force_reply(word(b, 8)),
        addr: word(b, 16),
        key: word(b, 24),
        operand: word(b, 32),
        compare: word(b, 40),
    };
    Some((r, &b[NAME_AT..]))
}

pub(super) fn encode_reply(status: Status, value: u64) -> [u8; REPLY_LEN] {
    let mut h = [0u8; REPLY_LEN];
    h[..4].copy_from_slice(&REP_MAGIC);
    h[4] = status as u8;
    h[8..].copy_from_slice(&value.to_le_bytes());
    h
}

pub(super) fn decode_reply(h: &[u8; REPLY_LEN], received: usize) -> Option<(Status, u64)> {
    if received != REPLY_LEN || h[..4] != REP_MAGIC {
        return None;
    }
    Some((Status::from_code(h[4])?, word(h, 8)))
}

/// Apply `r` to the live region among `regions` whose key it names.
pub(super) fn apply(regions: &[Weak<RegionInner>], r: &Request) -> Result<u64, Status> {
    let region = regions
        .iter()
        .filter_map(Weak::upgrade)
        .find(|g| g.exposed() && g.key() == r.key)
        .ok_or(Status::NoRegion)?;
    let w = region.atomic_word(r.addr, needs(r.op))?;
    // SeqCst: one total order for every operation on the word, whoever
    // (which peer, or this side through `atomic_word`) applies it.
    let o = Ordering::SeqCst;
    Ok(match r.op {
        AtomicOperation::Add | AtomicOperation::FetchAdd => w.fetch_add(r.operand, o),
        AtomicOperation::Swap => w.swap(r.operand, o),
        AtomicOperation::CompareSwap => match w.compare_exchange(r.compare, r.operand, o, o) {
            Ok(v) | Err(v) => v,
        },
        AtomicOperation::FetchMin => w.fetch_min(r.operand, o),
        AtomicOperation::FetchMax => w.fetch_max(r.operand, o),
        AtomicOperation::Read => w.load(o),
    })
}

/// The access an operation needs at the target (as for native atomics).
pub(super) fn needs(op: AtomicOperation) -> crate::memory::access::Access {
    use crate::memory::access::Access;
    match op {
        AtomicOperation::Add => Access::Write,
        AtomicOperation::Read => Access::Read,
        _ => Access::ReadWrite,
    }
}

/// A reply the target could not post yet (the queue was full).
pub(super) struct Outgoing {
    pub(super) endpoint: u32,
    pub(super) addr: ffi::fi_addr_t,
    pub(super) tag: u64,
    pub(super) buf: Buffer,
}

/// What the loop keeps for emulated atomics.
#[derive(Default)]
pub(crate) struct AmState {
    /// Request buffers, reused.
    pub(super) bufs: Vec<Buffer>,
    /// Each endpoint's own name, once its request receives are posted.
    pub(super) names: Vec<Option<Vec<u8>>>,
    /// Origins' names and their addresses in the AV, for replies.
    pub(super) origins: Vec<(Vec<u8>, ffi::fi_addr_t)>,
    /// Replies waiting for room in the queue.
    pub(super) outbox: Vec<Outgoing>,
    /// Regions peers may reach, by key (dead ones are revoked).
    pub(crate) regions: Vec<Weak<RegionInner>>,
    /// Request receives posted (not counted in `in_flight`).
    pub(super) posted: usize,
    /// Request receives to post again (the queue was full).
    pub(super) reposts: Vec<u32>,
    /// The reserved tags.
    pub(crate) tags: TagSpace,
}

/// A real request (with a name) and a real reply, for the fuzz targets.
pub(super) fn fuzz_seeds() -> Vec<Vec<u8>> {
    let r = Request {
        op: AtomicOperation::CompareSwap,
        reply_tag: TagSpace::new(64).reply(3, 9),
        addr: 0x7f00_0000_1000,
        key: 0x1234_5678_9abc_def0,
        operand: 2,
        compare: 1,
    };
    let mut b = vec![0u8; REQUEST_LEN];
    let n = encode_request(&mut b, &r, b"\x02\x00\x1f\x90\x7f\x00\x00\x01").unwrap_or(0);
    b.truncate(n);
    vec![b, encode_reply(Status::Ok, 41).to_vec()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_round_trip_and_hostile_ones_are_refused() {
        let r = Request {
            op: AtomicOperation::CompareSwap,
            reply_tag: 5,
            addr: 0x1000,
            key: 0xfeed,
            operand: 2,
            compare: 1,
        };
        let mut b = [0u8; REQUEST_LEN];
        let n = encode_request(&mut b, &r, b"name").unwrap();
        let space = TagSpace::new(64);
        let (d, name) = decode_request(space, &b[..n]).unwrap();
        assert_eq!(name, b"name");
        assert_eq!(d.reply_tag, 5 | 3 << 62, "reply tag forced into the reply space");
        assert_eq!(
            (d.op, d.addr, d.key, d.operand, d.compare),
            (r.op, r.addr, r.key, 2, 1)
        );
        assert!(decode_request(space, &b[..n - 1]).is_none(), "short");
        assert!(decode_request(space, &b[..10]).is_none(), "shorter than a header");
        let mut bad = b;
        bad[4] = 200;
        assert!(decode_request(space, &bad[..n]).is_none(), "unknown op");
        let mut bad = b;
        bad[48] = 0xff;
        assert!(
            decode_request(space, &bad[..n]).is_none(),
            "name length past the buffer"
        );
        assert!(encode_request(&mut b, &r, &[0; MAX_NAME + 1]).is_none());
        let h = encode_reply(Status::AccessDenied, 9);
        assert_eq!(decode_reply(&h, REPLY_LEN), Some((Status::AccessDenied, 9)));
        assert_eq!(decode_reply(&h, REPLY_LEN - 1), None);
        let mut bad = h;
        bad[4] = 77;
        assert_eq!(decode_reply(&bad, REPLY_LEN), None);
        assert_ne!(space.reply(1, 1), space.reply(1, 2), "generations differ");
        assert_eq!(space.reply(3, 7) >> 62, 3);
        assert_eq!(space.request(), 1 << 63);
        // net's 63 tag bits: the reserved space moves down one bit.
        let net = TagSpace::new(63);
        assert_eq!((net.request(), net.reply(3, u64::MAX) >> 61), (1 << 62, 3));
        assert_eq!(
            net.force_reply(u64::MAX) >> 61,
            3,
            "nothing above the usable bits"
        );
        assert!(net.check_send(Some(1 << 62)).is_err() && net.check_send(Some(1 << 61)).is_ok());
        assert_eq!(net.recv(Some((1, u64::MAX))).unwrap(), Some((1, !(1 << 62))));
        // A loop that does not emulate atomics keeps every tag bit.
        let open = space.reserved(false);
        assert!(open.check_send(Some(u64::MAX)).is_ok());
        assert_eq!(
            open.recv(Some((u64::MAX, u64::MAX))).unwrap(),
            Some((u64::MAX, u64::MAX))
        );
    }
}
