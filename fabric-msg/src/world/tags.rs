//! How the World lays out the 64-bit libfabric tag, so that every receive
//! can match on, and report, the sending rank on every provider (many grant
//! no `FI_SOURCE`, and `FI_SOURCE` gives a libfabric address, not a rank):
//!
//! ```text
//!  63        57 56 55                  32 31                             0
//! ┌────────────┬──┬──────────────────────┬────────────────────────────────┐
//! │  context   │k │  source (world rank) │        application tag         │
//! └────────────┴──┴──────────────────────┴────────────────────────────────┘
//! ```
//!
//! The top byte is the class: the communicator's context id (7 bits; 0 is
//! the World itself, so at most [`MAX_CONTEXTS`]` - 1` sub-communicators
//! are alive at once on a rank) and the kind `k`, which keeps the
//! application's messages (0) apart from the collectives' (1): an
//! application cannot name another class, and messages of two
//! communicators never match each other. The source is always the sender's
//! rank in the World, whatever the communicator; the communicator
//! translates. The application keeps all 32 bits of its tag. In the
//! collectives' kind the 32-bit field is the collective's number (low 20 bits, wrapping)
//! and the step within it (12 bits), so consecutive collectives never match
//! each other's messages:
//!
//! ```text
//!  31                              12 11          0
//! ┌──────────────────────────────────┬─────────────┐
//! │     collective number (mod 2^20) │    step     │
//! └──────────────────────────────────┴─────────────┘
//! ```
//!
//! Step 4095 is reserved for failure notices (see `collectives/engine.rs`);
//! steps of an algorithm wrap below it.

use crate::memory::buffer::Buffer;
use crate::transport::event_loop::{EndpointId, EventLoop, PostError, RecvOpts, Token};

/// Messages the application sends on the World (context 0).
pub(crate) const CLASS_USER: u64 = 0;
/// The World's own messages (context 0): collectives and their failure
/// notices.
pub(crate) const CLASS_WORLD: u64 = 1;

/// How many contexts the class byte can name: the World's (0) and this
/// many less one sub-communicators alive at once.
pub const MAX_CONTEXTS: u32 = 1 << 7;

/// The class of the application's messages in context `ctx`.
pub(crate) fn user_class(ctx: u8) -> u64 {
    (u64::from(ctx) << 1) | CLASS_USER
}

/// The class of the collectives' messages in context `ctx`.
pub(crate) fn world_class(ctx: u8) -> u64 {
    (u64::from(ctx) << 1) | CLASS_WORLD
}

/// The context a received tag was sent in.
pub(crate) fn ctx_of(tag: u64) -> u8 {
    ((tag >> (CLASS_SHIFT + 1)) & 0x7f) as u8
}

const CLASS_SHIFT: u32 = 56;
const RANK_SHIFT: u32 = 32;
const RANK_MASK: u64 = (1 << 24) - 1;
const TAG_MASK: u64 = u32::MAX as u64;

/// Most ranks a world can have: the width of the rank field.
pub const MAX_RANKS: u32 = 1 << 24;

/// The tag a message from `source` with the application's `tag` carries.
pub(crate) fn encode(class: u64, source: u32, tag: u32) -> u64 {
    (class << CLASS_SHIFT) | ((u64::from(source) & RANK_MASK) << RANK_SHIFT) | u64::from(tag)
}

/// `(tag, ignore)` for a receive: from `source` or any, with `tag` or any,
/// always within `class`.
pub(crate) fn matcher(class: u64, source: Option<u32>, tag: Option<u32>) -> (u64, u64) {
    let mut ignore = 0;
    if source.is_none() {
        ignore |= RANK_MASK << RANK_SHIFT;
    }
    if tag.is_none() {
        ignore |= TAG_MASK;
    }
    (encode(class, source.unwrap_or(0), tag.unwrap_or(0)), ignore)
}

const STEP_BITS: u32 = 12;
/// The collective-number part of a World-class tag.
pub(crate) const SEQ_MASK: u32 = (1 << 20) - 1;
/// The step of failure notices; an algorithm's steps wrap below it.
pub(crate) const NOTICE_STEP: u32 = (1 << STEP_BITS) - 1;

/// The 32-bit field of a collective's message: its number and step.
pub(crate) fn world_field(seq: u32, step: u32) -> u32 {
    ((seq & SEQ_MASK) << STEP_BITS) | (step % NOTICE_STEP)
}

/// The 32-bit field of a failure notice about collective `seq`.
pub(crate) fn notice_field(seq: u32) -> u32 {
    ((seq & SEQ_MASK) << STEP_BITS) | NOTICE_STEP
}

/// The collective number (mod 2^20) of a World-class tag.
pub(crate) fn seq_of(tag: u64) -> u32 {
    (user_tag_of(tag) >> STEP_BITS) & SEQ_MASK
}

/// `(tag, ignore)` matching every failure notice, from any rank, about any
/// collective of any communicator.
pub(crate) fn notice_matcher() -> (u64, u64) {
    let ignore = (0x7f << (CLASS_SHIFT + 1)) | (RANK_MASK << RANK_SHIFT) | (u64::from(SEQ_MASK) << STEP_BITS);
    (encode(CLASS_WORLD, 0, NOTICE_STEP), ignore)
}

/// The sending rank carried in a received tag.
pub(crate) fn source_of(tag: u64) -> u32 {
    ((tag >> RANK_SHIFT) & RANK_MASK) as u32
}

/// The application's tag carried in a received tag.
pub(crate) fn user_tag_of(tag: u64) -> u32 {
    (tag & TAG_MASK) as u32
}

/// Post a receive in message class `class` on `ev`: a communicator's class
/// is the World's to post in.
pub(crate) fn post_recv_in(
    ev: &mut EventLoop,
    class: u64,
    ep: EndpointId,
    buf: Buffer,
    opts: RecvOpts,
    token: Token,
) -> std::result::Result<(), PostError> {
    if class == CLASS_USER {
        ev.recv(ep, buf, opts, token)
    } else {
        ev.as_world().recv(ep, buf, opts, token)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matches(tag: u64, (want, ignore): (u64, u64)) -> bool {
        (tag & !ignore) == (want & !ignore)
    }

    #[test]
    fn fields_round_trip_and_matching_respects_class_rank_and_tag() {
        let t = encode(CLASS_USER, 70_000, 0xdead_beef);
        assert_eq!((source_of(t), user_tag_of(t)), (70_000, 0xdead_beef));
        assert!(matches(t, matcher(CLASS_USER, Some(70_000), Some(0xdead_beef))));
        assert!(matches(t, matcher(CLASS_USER, None, Some(0xdead_beef))));
        assert!(matches(t, matcher(CLASS_USER, Some(70_000), None)));
        assert!(matches(t, matcher(CLASS_USER, None, None)));
        assert!(!matches(t, matcher(CLASS_USER, Some(1), None)), "other rank");
        assert!(!matches(t, matcher(CLASS_USER, None, Some(1))), "other tag");
        assert!(!matches(t, matcher(CLASS_WORLD, None, None)), "other class");
        let top = encode(CLASS_USER, MAX_RANKS - 1, u32::MAX);
        assert_eq!((source_of(top), user_tag_of(top)), (MAX_RANKS - 1, u32::MAX));
        assert_eq!(top >> 56, CLASS_USER, "the rank never spills into the class");
    }

    #[test]
    fn collective_fields_keep_number_step_and_notices_apart() {
        let t = encode(CLASS_WORLD, 5, world_field(SEQ_MASK + 8, 4096));
        assert_eq!((source_of(t), seq_of(t), user_tag_of(t) & 0xfff), (5, 7, 1));
        assert!(matches(t, matcher(CLASS_WORLD, Some(5), Some(world_field(7, 1)))));
        assert!(
            !matches(t, matcher(CLASS_WORLD, Some(5), Some(world_field(8, 1)))),
            "other collective"
        );
        assert!(
            !matches(t, matcher(CLASS_USER, None, None)),
            "applications never see it"
        );
        assert!(!matches(t, notice_matcher()), "a step is never a notice");
        let n = encode(CLASS_WORLD, 9, notice_field(123));
        assert!(matches(n, notice_matcher()));
        assert_eq!((source_of(n), seq_of(n)), (9, 123));
        assert!(!matches(encode(CLASS_USER, 9, notice_field(1)), notice_matcher()));
    }

    #[test]
    fn contexts_keep_communicators_apart() {
        let top = (MAX_CONTEXTS - 1) as u8;
        for ctx in [0, 1, 5, top] {
            let u = encode(user_class(ctx), MAX_RANKS - 1, u32::MAX);
            let w = encode(world_class(ctx), 3, world_field(9, 2));
            assert_eq!((ctx_of(u), ctx_of(w)), (ctx, ctx));
            assert_eq!((source_of(u), user_tag_of(u)), (MAX_RANKS - 1, u32::MAX));
            assert!(matches(u, matcher(user_class(ctx), None, None)));
            assert!(!matches(u, matcher(world_class(ctx), None, None)), "kind");
            assert!(matches(
                w,
                matcher(world_class(ctx), Some(3), Some(world_field(9, 2)))
            ));
            for other in [0, 1, 5, top].into_iter().filter(|&o| o != ctx) {
                assert!(
                    !matches(u, matcher(user_class(other), None, None)),
                    "{ctx} vs {other}"
                );
                assert!(
                    !matches(w, matcher(world_class(other), None, None)),
                    "{ctx} vs {other}"
                );
            }
            // A notice of any context is a notice; a user message never is.
            assert!(matches(
                encode(world_class(ctx), 4, notice_field(7)),
                notice_matcher()
            ));
            assert!(!matches(
                encode(user_class(ctx), 4, notice_field(7)),
                notice_matcher()
            ));
        }
        assert_eq!(user_class(0), CLASS_USER);
        assert_eq!(world_class(0), CLASS_WORLD);
    }
}
