//! One matching engine for the application's messages from this node and
//! from the fabric (`WorldConfig::one_engine`): a World that spans nodes
//! matches every receive in the node loop's matcher
//! (`transport/node/matching.rs`), whichever way its message comes, so a
//! receive from any rank is posted in one place and never cancelled on
//! another loop (UCX's worker and Open MPI's ob1 have this shape;
//! libfabric's `lnx` provider, a shared receive context between
//! providers, is not in 1.17).
//!
//! The fabric's application messages reach the matcher unmatched:
//! - this rank keeps [`BOUNCES`] receives of [`EAGER`] bytes posted on the
//!   main loop that take every application message of every communicator
//!   from any rank (`tags::every_user_message`); each message goes to the
//!   matcher (`NodeLoop::arrive_far`: copied into the oldest receive it
//!   matches, or kept), and the receive is posted again;
//! - a larger message is announced: its sender injects a note of 16 bytes
//!   (its length and a number) under the message's own tag with
//!   `tags::ANNOUNCED` set, then sends the data under `tags::bulk_tag`
//!   (`world/announce.rs` says to whom, `point_to_point.rs` sends). The
//!   note goes to the matcher
//!   (`NodeLoop::announce_far`); once a receive takes it, this rank posts
//!   that receive's buffer on the main loop for the data, and the
//!   provider moves it (its own rendezvous above its eager size). A
//!   sender's notes and eager messages take the same receives, so they
//!   keep their order.
//!
//! A receive matched to an announced message cannot be cancelled any more
//! (MPI's rule for a matched receive): it completes with its data.

use super::super::tags;
use super::Local;
use crate::error::Result;
use crate::memory::buffer::Buffer;
use crate::transport::event_loop::{
    Completion, CompletionError, EndpointId, EventLoop, PostError, RecvOpts, Token,
};
use crate::transport::node::matching::FarMatch;

/// Messages of at most this many bytes go eagerly to a rank with one
/// engine; larger ones are announced. 64 KiB, as Open MPI's TCP eager
/// limit: `tcp;ofi_rxm` moves such a message into the engine's receive
/// (eagerly to 16 KiB, in segments above), where an announced one waits
/// for the receive the announcement finds, and its segments that came
/// before it are taken as unexpected by the provider, a copy more: 64 KiB
/// one way across pretend nodes was 1.19-1.23× the pairing's with 8 KiB
/// here, 1.03-1.05× with 64 KiB (docs/benchmarks.md, "One matching
/// engine").
pub(crate) const EAGER: usize = 64 << 10;

/// Receives kept posted for the fabric's application messages: 2 MiB a
/// rank. More messages than this in flight wait in the provider's own
/// buffers until a receive is posted again.
pub(crate) const BOUNCES: usize = 32;

/// The length of an announcement: the message's length and its number.
pub(crate) const NOTE_LEN: usize = 16;

/// The half number of the engine's tokens (a pair's halves stay below).
const ENGINE_HALF: u64 = 0xFF;
const BOUNCE: u64 = 0;
const BULK: u64 = 1;

fn token(kind: u64, id: u64) -> Token {
    Token((super::PAIR << 56) | (kind << 40) | ((id & 0xFFFF_FFFF) << 8) | ENGINE_HALF)
}

/// Whether `t` is one of the engine's tokens.
pub(crate) fn is_engine(t: Token) -> bool {
    super::is_pair(t) && t.0 & 0xFF == ENGINE_HALF
}

fn kind_id(t: Token) -> (u64, usize) {
    ((t.0 >> 40) & 0xFFFF, ((t.0 >> 8) & 0xFFFF_FFFF) as usize)
}

/// An announcement's bytes: the length and the number, little-endian.
pub(crate) fn note(total: usize, n: u32) -> [u8; NOTE_LEN] {
    let mut b = [0u8; NOTE_LEN];
    b[..8].copy_from_slice(&(total as u64).to_le_bytes());
    b[8..].copy_from_slice(&u64::from(n).to_le_bytes());
    b
}

/// An announcement read back, checked: a length that could not have been
/// announced (not above [`EAGER`], or beyond what this process could
/// address) or a number beyond 20 bits is refused with what was wrong.
fn read_note(b: &[u8]) -> std::result::Result<(usize, u32), String> {
    if b.len() != NOTE_LEN {
        return Err(format!(
            "an announcement of {} bytes (it has {NOTE_LEN})",
            b.len()
        ));
    }
    let total = u64::from_le_bytes(b[..8].try_into().expect("8 bytes"));
    let n = u64::from_le_bytes(b[8..].try_into().expect("8 bytes"));
    if total <= EAGER as u64 || total > isize::MAX as u64 {
        return Err(format!(
            "an announced length of {total} bytes (announced messages have {}..{} bytes)",
            EAGER + 1,
            isize::MAX
        ));
    }
    if n > u64::from(tags::SEQ_MASK) {
        return Err(format!("an announcement numbered {n} (numbers have 20 bits)"));
    }
    Ok((total as usize, n as u32))
}

/// A receive fetching an announced message's data on the main loop.
#[derive(Debug)]
struct Bulk {
    user: Token,
    tag: u64,
    total: usize,
}

/// The engine's state on a rank that matches in one place.
#[derive(Debug, Default)]
pub(crate) struct Engine {
    /// Receives fetching data, by their token's id; `None`: free.
    bulks: Vec<Option<Bulk>>,
    free: Vec<usize>,
    /// Scratch for `NodeLoop::take_far`.
    far: Vec<FarMatch>,
}

impl Local {
    /// Match every application message here from now on: post the
    /// engine's receives on `main`.
    pub(crate) fn start_engine(&mut self, main: &mut EventLoop, main_ep: EndpointId) -> Result<()> {
        for i in 0..BOUNCES {
            post_bounce(main, main_ep, Buffer::new(EAGER), i).map_err(|e| e.error)?;
        }
        self.engine = Some(Engine::default());
        Ok(())
    }

    /// Whether this rank matches every application message in one place.
    pub(crate) fn one_engine(&self) -> bool {
        self.engine.is_some()
    }

    /// One completion of the engine's, from the main loop: a message for
    /// the matcher (its receive posted again), or the data of an announced
    /// message, which becomes its receive's completion in `out`.
    pub(super) fn engine_completion(
        &mut self,
        main: &mut EventLoop,
        main_ep: EndpointId,
        mut c: Completion,
        out: &mut Vec<Completion>,
    ) {
        let (kind, id) = kind_id(c.token);
        if kind == BULK {
            let Some(e) = self.engine.as_mut() else { return };
            let Some(b) = e.bulks.get_mut(id).and_then(Option::take) else {
                log::error!(
                    "the data of an announced message completed a receive no longer known ({:#x})",
                    c.token.0
                );
                return;
            };
            e.free.push(id);
            c.token = b.user;
            c.tag = b.tag;
            if let Err(CompletionError::Truncated { message_len, .. }) = &mut c.result {
                *message_len = Some(b.total);
            }
            out.push(c);
            return;
        }
        let Some(buf) = c.buffer.take() else { return };
        match &c.result {
            Ok(()) => self.hand_to_matcher(c.tag, buf.as_slice()),
            Err(CompletionError::Cancelled) => return,
            Err(e) => refuse(format!(
                "a message from rank {} with tag {:#x} that the engine's receive of {EAGER} bytes could not \
                 take ({e}): a message larger than that must be announced",
                tags::sender_of(c.tag),
                tags::user_tag_of(c.tag)
            )),
        }
        if let Err(e) = post_bounce(main, main_ep, buf, id) {
            log::error!("cannot post the engine's receive again: {}", e.error);
        }
        self.fetch_matched(main, main_ep, out);
    }

    fn hand_to_matcher(&mut self, tag: u64, data: &[u8]) {
        let source = tags::sender_of(tag);
        if source >= self.size {
            return refuse(format!(
                "a message naming rank {source} as its sender, in a World of {} ranks",
                self.size
            ));
        }
        let super::super::lane::Side::Node(n) = &mut self.side else {
            return;
        };
        if tag & tags::ANNOUNCED == 0 {
            if let Err(e) = n.nl.arrive_far(tag, data) {
                refuse(e.to_string());
            }
            return;
        }
        match read_note(data) {
            Ok((total, num)) => {
                n.nl.announce_far(
                    tag & !tags::ANNOUNCED,
                    total,
                    (u64::from(source) << 32) | u64::from(num),
                );
            }
            Err(what) => refuse(format!("rank {source}: {what}")),
        }
    }

    /// Post a receive for the data of each announced message a receive
    /// took since the last call; one that cannot be posted completes with
    /// the error.
    pub(crate) fn fetch_matched(
        &mut self,
        main: &mut EventLoop,
        main_ep: EndpointId,
        out: &mut Vec<Completion>,
    ) {
        let (super::super::lane::Side::Node(n), Some(e)) = (&mut self.side, self.engine.as_mut()) else {
            return;
        };
        if !n.nl.has_far() {
            return;
        }
        n.nl.take_far(&mut e.far);
        for m in e.far.drain(..) {
            let user = m.posted.token;
            let Some(buf) = m.posted.buf.into_buffer() else {
                log::error!("an announced message matched a receive into lent memory; it is not fetched");
                continue;
            };
            let source = (m.ticket >> 32) as u32;
            let id = match e.free.pop() {
                Some(i) => i,
                None => {
                    e.bulks.push(None);
                    e.bulks.len() - 1
                }
            };
            let opts = RecvOpts {
                tag: Some((tags::bulk_tag(source, m.ticket as u32), 0)),
                from: None,
            };
            match main.as_world().recv(main_ep, buf, opts, token(BULK, id as u64)) {
                Ok(()) => {
                    e.bulks[id] = Some(Bulk {
                        user,
                        tag: m.tag,
                        total: m.total,
                    })
                }
                Err(PostError { error, buffer }) => {
                    e.free.push(id);
                    let mut c = Completion::outcome(
                        user,
                        super::super::lane::NODE_ENDPOINT,
                        crate::transport::event_loop::OpKind::Recv,
                        Err(CompletionError::PartlyPosted {
                            posted: 0,
                            parts: 1,
                            error: format!("the receive of an announced message's data: {error}"),
                        }),
                    );
                    c.tag = m.tag;
                    c.buffer = buffer;
                    out.push(c);
                }
            }
        }
    }
}

/// A message from the fabric that cannot be delivered, logged with why.
fn refuse(what: String) {
    log::error!("a message from the fabric was dropped: {what}");
}

fn post_bounce(
    main: &mut EventLoop,
    main_ep: EndpointId,
    mut buf: Buffer,
    i: usize,
) -> std::result::Result<(), PostError> {
    buf.set_len(buf.capacity());
    let opts = RecvOpts {
        tag: Some(tags::every_user_message()),
        from: None,
    };
    main.as_world().recv(main_ep, buf, opts, token(BOUNCE, i as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notes_round_trip_and_hostile_ones_are_refused() {
        assert_eq!(read_note(&note(EAGER + 1, 7)), Ok((EAGER + 1, 7)));
        assert_eq!(
            read_note(&note(1 << 40, tags::SEQ_MASK)),
            Ok((1 << 40, tags::SEQ_MASK))
        );
        assert!(read_note(&note(EAGER, 7))
            .unwrap_err()
            .contains(&format!("announced length of {EAGER} bytes")));
        assert!(read_note(&note(0, 7)).is_err());
        let mut huge = note(EAGER + 1, 0);
        huge[..8].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(read_note(&huge).is_err());
        let mut far = note(EAGER + 1, 0);
        far[8..].copy_from_slice(&(1u64 << 20).to_le_bytes());
        assert!(read_note(&far).unwrap_err().contains("20 bits"));
        assert!(read_note(&[0; 15]).unwrap_err().contains("15 bytes"));
    }

    #[test]
    fn engine_tokens_are_the_worlds_and_not_a_pairs_halves() {
        for (kind, id) in [(BOUNCE, 0), (BULK, 63), (BULK, 0xFFFF_FFFF)] {
            let t = token(kind, id);
            assert!(is_engine(t) && super::super::is_pair(t));
            assert_eq!(kind_id(t), (kind, id as usize));
        }
        assert!(!is_engine(super::super::half(5, 0)));
        assert!(!is_engine(super::super::half(5, 254)));
    }
}
