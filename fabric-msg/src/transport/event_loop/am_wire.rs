//! The wire format of emulated atomics: requests and replies travel as
//! tagged messages whose tag has the top usable tag bit set (bit 63 where
//! the provider honours 64 bits, bit 62 on `net`'s 63), a tag space
//! applications cannot send in or receive from (`post.rs` refuses and
//! masks it), and the state the loop keeps for them.
//!
//! ```text
//! request (the reserved bit alone), little-endian:
//!  0 magic "FMAq"   4 op code   5..8 zero   8 reply tag   16 remote address
//! 24 key           32 operand  40 compare  48 name length (u16)  50..56 zero
//! 56 cookie        64 name…
//! reply (the request's reply tag, the reserved bit and the next set), 16 bytes:
//!  0 status   1..8 the request's cookie (low 56 bits)   8 value
//! ```
//!
//! Everything a peer sends is checked before use: magic, length, op code,
//! name length; the reply tag is forced into the reply space. The cookie is
//! drawn at random from the operating system for each operation: the
//! target echoes it and the origin drops a reply that does not carry it
//! (docs/atomics.md, "What a peer can forge"). Random bits of it are also
//! in the reply tag, so a forged reply cannot be aimed at a later
//! operation's receive either. The cookie is the request's identifier too:
//! the target answers a request whose cookie it has applied from memory,
//! without applying it again.

use super::tag_space::TagSpace;
use crate::discovery::atomic::AtomicKind;
use crate::ffi;
use crate::memory::buffer::HEADROOM;
use crate::memory::mr::{AtomicRefusal, RegionInner};
use std::sync::Weak;

/// Longest endpoint name a request carries (the origin's, for the reply).
pub(super) const MAX_NAME: usize = 192;
const COOKIE_AT: usize = 56;
const NAME_AT: usize = 64;
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
/// Requests whose result the target remembers, so a repeated one is
/// answered without being applied again.
pub(super) const APPLIED_WINDOW: usize = 4096;

const REQ_MAGIC: [u8; 4] = *b"FMAq";
/// The cookie's bits a reply carries (the status takes its first byte).
const REPLY_COOKIE_MASK: u64 = (1 << 56) - 1;

/// A decoded request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Request {
    pub(super) op: AtomicKind,
    pub(super) reply_tag: u64,
    pub(super) addr: u64,
    pub(super) key: u64,
    pub(super) operand: u64,
    pub(super) compare: u64,
    /// Random, drawn by the origin for this operation: echoed in the reply
    /// and the request's identifier at the target.
    pub(super) cookie: u64,
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
        (COOKIE_AT, r.cookie),
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
    let op = AtomicKind::from_code(b[4])?;
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
        cookie: word(b, COOKIE_AT),
    };
    Some((r, &b[NAME_AT..]))
}

/// A reply to the request whose cookie is `cookie`.
pub(super) fn encode_reply(status: Status, cookie: u64, value: u64) -> [u8; REPLY_LEN] {
    let mut h = [0u8; REPLY_LEN];
    let first = (cookie & REPLY_COOKIE_MASK) << 8 | status as u64;
    h[..8].copy_from_slice(&first.to_le_bytes());
    h[8..].copy_from_slice(&value.to_le_bytes());
    h
}

/// What a reply says, if it is well formed and answers the request whose
/// cookie is `cookie`; `Err(())` for any other reply (malformed, or not
/// the target's answer to this operation).
pub(super) fn decode_reply(
    h: &[u8; REPLY_LEN],
    received: usize,
    cookie: u64,
) -> std::result::Result<(Status, u64), ()> {
    if received != REPLY_LEN || word(h, 0) >> 8 != cookie & REPLY_COOKIE_MASK {
        return Err(());
    }
    Ok((Status::from_code(h[0]).ok_or(())?, word(h, 8)))
}

/// Apply `r` to the live region among `regions` whose key it names.
pub(super) fn apply(regions: &[Weak<RegionInner>], r: &Request) -> Result<u64, Status> {
    let region = regions
        .iter()
        .filter_map(Weak::upgrade)
        .find(|g| g.exposed() && g.key() == r.key)
        .ok_or(Status::NoRegion)?;
    let w = region.atomic_word(r.addr, needs(r.op))?;
    Ok(super::cpu_atomics::apply_word(w, r.op, r.operand, r.compare))
}

/// The access an operation needs at the target (as for native atomics).
pub(super) fn needs(op: AtomicKind) -> crate::memory::access::Access {
    use crate::memory::access::Access;
    match op {
        AtomicKind::Add => Access::Write,
        AtomicKind::Read => Access::Read,
        _ => Access::ReadWrite,
    }
}

/// A real request (with a name) and a real reply, for the fuzz targets.
pub(super) fn fuzz_seeds() -> Vec<Vec<u8>> {
    let r = Request {
        op: AtomicKind::CompareSwap,
        reply_tag: TagSpace::new(64).reply(3, 9),
        addr: 0x7f00_0000_1000,
        key: 0x1234_5678_9abc_def0,
        operand: 2,
        compare: 1,
        cookie: 0x5eed_c0ff_ee00_0009,
    };
    let mut b = vec![0u8; REQUEST_LEN];
    let n = encode_request(&mut b, &r, b"\x02\x00\x1f\x90\x7f\x00\x00\x01").unwrap_or(0);
    b.truncate(n);
    vec![b, encode_reply(Status::Ok, r.cookie, 41).to_vec()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_round_trip_and_hostile_ones_are_refused() {
        let r = Request {
            op: AtomicKind::CompareSwap,
            reply_tag: 5,
            addr: 0x1000,
            key: 0xfeed,
            operand: 2,
            compare: 1,
            cookie: 0x0123_4567_89ab_cdef,
        };
        let mut b = [0u8; REQUEST_LEN];
        let n = encode_request(&mut b, &r, b"name").unwrap();
        let space = TagSpace::new(64);
        let (d, name) = decode_request(space, &b[..n]).unwrap();
        assert_eq!(name, b"name");
        assert_eq!(d.reply_tag, 5 | 3 << 62, "reply tag forced into the reply space");
        assert_eq!(
            (d.op, d.addr, d.key, d.operand, d.compare, d.cookie),
            (r.op, r.addr, r.key, 2, 1, r.cookie)
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
    }

    #[test]
    fn a_reply_counts_only_with_its_operations_cookie() {
        let cookie = 0xa5a5_0123_4567_89ab;
        let h = encode_reply(Status::AccessDenied, cookie, 9);
        assert_eq!(decode_reply(&h, REPLY_LEN, cookie), Ok((Status::AccessDenied, 9)));
        assert_eq!(decode_reply(&h, REPLY_LEN - 1, cookie), Err(()), "short");
        for other in [cookie ^ 1 << 8, cookie ^ 1 << 55, 0, u64::MAX] {
            assert_eq!(decode_reply(&h, REPLY_LEN, other), Err(()), "{other:#x}");
        }
        let mut bad = h;
        bad[0] = 77;
        assert_eq!(decode_reply(&bad, REPLY_LEN, cookie), Err(()), "unknown status");
        // The status byte hides no cookie bits: flipping one is a mismatch.
        let mut bad = h;
        bad[1] ^= 1;
        assert_eq!(decode_reply(&bad, REPLY_LEN, cookie), Err(()));
    }
}
