//! How the World lays out the 64-bit libfabric tag, so that every receive
//! can match on, and report, the sending rank on every provider (many grant
//! no `FI_SOURCE`, and `FI_SOURCE` gives a libfabric address, not a rank):
//!
//! ```text
//!  63      56 55                    32 31                             0
//! ┌──────────┬────────────────────────┬────────────────────────────────┐
//! │  class   │      source rank       │        application tag         │
//! └──────────┴────────────────────────┴────────────────────────────────┘
//! ```
//!
//! The class keeps the application's messages apart from the World's own
//! (and, later, the collectives'): an application cannot name another class.

/// Messages the application sends with [`World::send`](super::World::send).
pub(crate) const CLASS_USER: u64 = 0;
/// The World's own messages (reserved for collectives and control).
#[allow(dead_code)]
pub(crate) const CLASS_WORLD: u64 = 1;

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

/// The sending rank carried in a received tag.
pub(crate) fn source_of(tag: u64) -> u32 {
    ((tag >> RANK_SHIFT) & RANK_MASK) as u32
}

/// The application's tag carried in a received tag.
pub(crate) fn user_tag_of(tag: u64) -> u32 {
    (tag & TAG_MASK) as u32
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
}
