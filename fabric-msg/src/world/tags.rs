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
//! The top byte is the class: the communicator's context id (7 bits, of
//! which ids below 64 are used; 0 is the World itself, so at most
//! [`MAX_CONTEXTS`]` - 1` sub-communicators are alive at once on a rank) and the kind `k`, which keeps the
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

/// How many contexts the class byte names: the World's (0) and this many
/// less one sub-communicators alive at once. The context has 7 bits, but
/// ids from 64 up would set bit 63 of the tag, which the event loop keeps
/// for its own messages (`transport/event_loop/tag_space.rs`): every
/// collective on such a communicator was refused (found 2026-11-28, once
/// each new communicator ran collectives at its creation).
pub const MAX_CONTEXTS: u32 = 1 << 6;

/// The class of the application's messages in context `ctx`.
pub(crate) fn user_class(ctx: u8) -> u64 {
    (u64::from(ctx) << 1) | CLASS_USER
}

/// The class of the collectives' messages in context `ctx`.
pub(crate) fn world_class(ctx: u8) -> u64 {
    (u64::from(ctx) << 1) | CLASS_WORLD
}

/// Whether `class` is a communicator's class of application messages
/// (not the collectives').
pub(crate) fn is_user(class: u64) -> bool {
    class & 1 == CLASS_USER
}

/// The context a received tag was sent in.
#[cfg(test)]
pub(crate) fn ctx_of(tag: u64) -> u8 {
    ((tag >> (CLASS_SHIFT + 1)) & 0x7f) as u8
}

const CLASS_SHIFT: u32 = 56;
const RANK_SHIFT: u32 = 32;
const RANK_MASK: u64 = (1 << 24) - 1;
const TAG_MASK: u64 = u32::MAX as u64;

/// Most ranks a world can have: the rank field's width less its top bit,
/// which marks an announced message (`ANNOUNCED`).
pub const MAX_RANKS: u32 = 1 << 23;

/// The top bit of the source field: set on the small message that
/// announces an application message too large to go eagerly to a rank
/// whose receives all go through one matching engine
/// (`world/local/engine.rs`). The tag is otherwise the message's own.
pub(crate) const ANNOUNCED: u64 = 1 << (RANK_SHIFT + 23);

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

/// Whether a message with World tag `tag` matches a receive's `(tag,
/// ignore)`, as a provider matches it.
pub(crate) fn matches(tag: u64, (want, ignore): (u64, u64)) -> bool {
    (tag & !ignore) == (want & !ignore)
}

const STEP_BITS: u32 = 12;
/// The collective-number part of a World-class tag.
pub(crate) const SEQ_MASK: u32 = (1 << 20) - 1;
/// The step of failure notices.
pub(crate) const NOTICE_STEP: u32 = (1 << STEP_BITS) - 1;
/// The step of an announced message's data (`world/local/engine.rs`),
/// whose number field is the sender's count of such messages to the
/// receiver. An algorithm's steps wrap below it.
pub(crate) const BULK_STEP: u32 = NOTICE_STEP - 1;

/// The 32-bit field of a collective's message: its number and step.
pub(crate) fn world_field(seq: u32, step: u32) -> u32 {
    ((seq & SEQ_MASK) << STEP_BITS) | (step % BULK_STEP)
}

/// The tag of the data of announced message number `n` (mod 2^20) from
/// `source`.
pub(crate) fn bulk_tag(source: u32, n: u32) -> u64 {
    encode(CLASS_WORLD, source, ((n & SEQ_MASK) << STEP_BITS) | BULK_STEP)
}

/// `(tag, ignore)` matching every application message of every
/// communicator from any rank with any tag, announced or not, and
/// nothing of the World's own classes: the receives of one matching
/// engine on the fabric.
pub(crate) fn every_user_message() -> (u64, u64) {
    // Every context's bits (`user_class` of the highest context).
    let contexts = user_class((MAX_CONTEXTS - 1) as u8) << CLASS_SHIFT;
    (
        encode(CLASS_USER, 0, 0),
        contexts | (RANK_MASK << RANK_SHIFT) | TAG_MASK,
    )
}

/// The collective number (mod 2^20) of a World-class tag.
#[cfg(test)]
pub(crate) fn seq_of(tag: u64) -> u32 {
    (user_tag_of(tag) >> STEP_BITS) & SEQ_MASK
}

/// The tag of every failure notice `source` sends, whatever the
/// communicator and collective (those travel in the notice: `engine.rs`),
/// so that a rank can receive notices with exact receives only: on
/// libfabric 1.17's shm a masked receive poisons later exact ones
/// (`Profile::tag_mask_defect`).
pub(crate) fn notice_tag(source: u32) -> u64 {
    encode(CLASS_WORLD, source, NOTICE_STEP)
}

/// `(tag, ignore)` matching every failure notice from any rank.
pub(crate) fn notice_matcher() -> (u64, u64) {
    (notice_tag(0), RANK_MASK << RANK_SHIFT)
}

/// The sending rank carried in a received tag.
pub(crate) fn source_of(tag: u64) -> u32 {
    ((tag >> RANK_SHIFT) & RANK_MASK) as u32
}

/// The sending rank of an application message's tag, whether or not it
/// is an announcement's (`ANNOUNCED`).
pub(crate) fn sender_of(tag: u64) -> u32 {
    source_of(tag) & (MAX_RANKS - 1)
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
        let t = encode(CLASS_WORLD, 5, world_field(SEQ_MASK + 8, BULK_STEP + 1));
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
        let n = notice_tag(9);
        assert!(matches(n, notice_matcher()));
        assert!(matches(n, (notice_tag(9), 0)), "exact, from its rank");
        assert!(!matches(n, (notice_tag(8), 0)), "not from another");
        assert_eq!(source_of(n), 9);
        for seq in [0, 1, SEQ_MASK] {
            for step in [0, 1, BULK_STEP - 1, BULK_STEP, NOTICE_STEP - 1] {
                let c = encode(CLASS_WORLD, 9, world_field(seq, step));
                assert!(
                    !matches(c, notice_matcher()),
                    "collective #{seq} step {step} is no notice"
                );
            }
        }
        assert!(!matches(encode(CLASS_USER, 9, NOTICE_STEP), notice_matcher()));
    }

    #[test]
    fn one_engines_receives_take_every_application_message_and_no_other() {
        let every = every_user_message();
        for ctx in 0..MAX_CONTEXTS as u8 {
            for (source, tag) in [(0, 0), (MAX_RANKS - 1, u32::MAX), (5, 77)] {
                let t = encode(user_class(ctx), source, tag);
                assert!(matches(t, every), "context {ctx}");
                assert!(matches(t | ANNOUNCED, every), "announced, context {ctx}");
                assert_eq!(sender_of(t | ANNOUNCED), source);
                assert_eq!(sender_of(t), source);
                assert!(!matches(encode(world_class(ctx), source, tag), every));
            }
        }
        for n in [0, 1, SEQ_MASK, SEQ_MASK + 1] {
            let b = bulk_tag(3, n);
            assert!(!matches(b, every), "data of an announced message");
            assert!(!matches(b, notice_matcher()));
            assert_eq!(source_of(b), 3);
            for seq in [0, n] {
                for step in [0, BULK_STEP - 1, BULK_STEP, BULK_STEP + 5] {
                    assert_ne!(
                        encode(CLASS_WORLD, 3, world_field(seq, step)),
                        b,
                        "no step is a bulk"
                    );
                }
            }
        }
    }

    /// Bit 63 is the event loop's: it refuses any other message with it
    /// set, so no context's tag may reach it.
    #[test]
    fn no_context_sets_the_event_loops_bit() {
        for ctx in 0..MAX_CONTEXTS as u8 {
            for class in [user_class(ctx), world_class(ctx)] {
                let t = encode(class, MAX_RANKS - 1, u32::MAX);
                assert_eq!(t >> 63, 0, "context {ctx}: {t:#x}");
            }
        }
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
            // No message of any communicator is a notice (notices travel in
            // the World's class, their context inside).
            assert!(!matches(
                encode(world_class(ctx), 4, world_field(7, 1)),
                notice_matcher()
            ));
            assert!(!matches(
                encode(user_class(ctx), 4, NOTICE_STEP),
                notice_matcher()
            ));
        }
        assert_eq!(user_class(0), CLASS_USER);
        assert_eq!(world_class(0), CLASS_WORLD);
    }
}
