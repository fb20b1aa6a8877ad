//! The tag classes a loop keeps for fabric-msg's own messages, and the
//! rule that keeps applications out of them.
//!
//! Two owners reserve tags:
//! - emulated atomics: the top usable tag bit (bit 63 where the provider
//!   honours 64 bits, bit 62 on `net`'s 63), and under it the reply bit;
//!   reserved only on loops that emulate atomics, so others keep every bit;
//! - the World: every tag whose class byte (bits 56..63, `world/tags.rs`)
//!   is not the application's class 0, reserved by the World on the loops
//!   it opens ([`EventLoop::reserve_world_classes`](super::EventLoop::reserve_world_classes)).
//!
//! An application's send in a reserved class is refused, naming the class,
//! and its receives never match one (a reserved bit is never ignored in a
//! mask, so a wildcard receive still matches every tag an application can
//! send and nothing else). fabric-msg's own posts say who they are for with
//! [`Poster`]; the World's collectives post as [`Poster::World`] through
//! [`EventLoop::as_world`](super::EventLoop::as_world), and nothing
//! outside the crate can.

use crate::error::{Error, Result};

/// Who a post is for: the rule for reserved classes depends on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Poster {
    /// The application, through the public API.
    Application,
    /// The World's collectives and failure notices.
    World,
}

/// The tags reserved for fabric-msg's own messages on one loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TagSpace {
    /// The atomics' bit.
    bit: u64,
    /// The atomics' bits are kept from applications (the loop emulates).
    atomics: bool,
    /// Bits whose being set makes a tag the World's (0: no World here).
    world: u64,
}

/// The World's classes: every class byte but the application's 0.
pub(crate) const WORLD_CLASSES: u64 = 0xff << 56;

impl TagSpace {
    /// For a provider honouring `tag_bits` tag bits (64 when unknown).
    pub(crate) fn new(tag_bits: u32) -> TagSpace {
        let bits = if tag_bits < 40 { 64 } else { tag_bits.min(64) };
        TagSpace {
            bit: 1 << (bits - 1),
            atomics: true,
            world: 0,
        }
    }

    /// The same space, the atomics' bits kept from applications only if
    /// `reserved` (the loop emulates atomics).
    pub(crate) fn reserved(self, reserved: bool) -> TagSpace {
        TagSpace {
            atomics: reserved,
            ..self
        }
    }

    /// The same space with the World's classes reserved too.
    pub(crate) fn with_world(self) -> TagSpace {
        TagSpace {
            world: WORLD_CLASSES,
            ..self
        }
    }

    fn reply_bit(self) -> u64 {
        self.bit >> 1
    }

    /// The tag of every emulated-atomic request.
    pub(super) fn request(self) -> u64 {
        self.bit
    }

    /// The reply tag of the operation in slot `index` whose cookie is
    /// `nonce`: the cookie's random bits make the tag of a later use of the
    /// slot unpredictable, so a forged reply cannot wait for it as an
    /// unexpected message.
    pub(super) fn reply(self, index: u32, nonce: u64) -> u64 {
        let nonce_mask = (self.reply_bit() >> 32) - 1;
        self.bit | self.reply_bit() | ((nonce & nonce_mask) << 32) | u64::from(index)
    }

    /// A peer's reply tag, forced into the reply space.
    pub(super) fn force_reply(self, t: u64) -> u64 {
        (t & (self.reply_bit() - 1)) | self.bit | self.reply_bit()
    }

    /// The bits `who` may not use.
    fn kept_from(self, who: Poster) -> u64 {
        let atomics = if self.atomics { self.bit } else { 0 };
        match who {
            Poster::Application => atomics | self.world,
            Poster::World => atomics,
        }
    }

    /// Refuse a send in a class `who` may not use.
    #[inline]
    pub(super) fn check_send(self, tag: Option<u64>, who: Poster) -> Result<()> {
        match tag {
            Some(t) if t & self.kept_from(who) != 0 => Err(self.refusal(t, who)),
            _ => Ok(()),
        }
    }

    /// A receive matcher kept out of the classes `who` may not use: a tag
    /// in one is refused, and their bits are never ignored.
    #[inline]
    pub(super) fn recv(self, tag: Option<(u64, u64)>, who: Poster) -> Result<Option<(u64, u64)>> {
        let kept = self.kept_from(who);
        match tag {
            _ if kept == 0 => Ok(tag),
            Some((t, _)) if t & kept != 0 => Err(self.refusal(t, who)),
            Some((t, ignore)) => Ok(Some((t, ignore & !kept))),
            None => Ok(None),
        }
    }

    #[cold]
    fn refusal(self, t: u64, who: Poster) -> Error {
        if self.atomics && t & self.bit != 0 {
            return Error::Usage(format!(
                "tag {t:#x} has bit {} set: that bit is reserved for fabric-msg's own messages (emulated \
                 atomics); applications use tags below {:#x}",
                self.bit.trailing_zeros(),
                self.bit
            ));
        }
        debug_assert_eq!(who, Poster::Application);
        Error::Usage(format!(
            "tag {t:#x} is in the World's own class {} (bits 56..63 not zero: collectives and their failure \
             notices); an application on a World's loop uses tags below {:#x}, or World::send and \
             World::recv, whose tags never reach that class",
            t >> 56,
            1u64 << 56
        ))
    }
}

impl Default for TagSpace {
    fn default() -> Self {
        TagSpace::new(64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserved_classes_are_refused_and_never_matched_by_a_wildcard() {
        let space = TagSpace::new(64);
        assert_eq!(space.reply(3, 7) >> 62, 3);
        assert_eq!(space.request(), 1 << 63);
        assert_ne!(space.reply(1, 1), space.reply(1, 2), "nonces differ");
        let app = Poster::Application;
        // net's 63 tag bits: the reserved space moves down one bit.
        let net = TagSpace::new(63);
        assert_eq!((net.request(), net.reply(3, u64::MAX) >> 61), (1 << 62, 3));
        assert_eq!(
            net.force_reply(u64::MAX) >> 61,
            3,
            "nothing above the usable bits"
        );
        assert!(net.check_send(Some(1 << 62), app).is_err() && net.check_send(Some(1 << 61), app).is_ok());
        assert_eq!(net.recv(Some((1, u64::MAX)), app).unwrap(), Some((1, !(1 << 62))));
        // A loop that does not emulate atomics keeps every tag bit...
        let open = space.reserved(false);
        assert!(open.check_send(Some(u64::MAX), app).is_ok());
        assert_eq!(
            open.recv(Some((u64::MAX, u64::MAX)), app).unwrap(),
            Some((u64::MAX, u64::MAX))
        );
        // ...unless it is a World's: then every class but 0 is the World's.
        let world = open.with_world();
        for class in 1..=255u64 {
            let t = class << 56 | 5;
            let e = world.check_send(Some(t), app).unwrap_err().to_string();
            assert!(e.contains("World's own class"), "{e}");
            assert!(world.recv(Some((t, 0)), app).is_err());
            assert!(world.check_send(Some(t), Poster::World).is_ok());
        }
        assert!(world.check_send(Some((1 << 56) - 1), app).is_ok());
        assert_eq!(
            world.recv(Some((0, u64::MAX)), app).unwrap(),
            Some((0, (1 << 56) - 1)),
            "a wildcard keeps the class byte at 0"
        );
        assert_eq!(
            world.recv(Some((0, u64::MAX)), Poster::World).unwrap(),
            Some((0, u64::MAX))
        );
        // Both: the World may not use the atomics' bit either.
        let both = space.with_world();
        assert!(both.check_send(Some(1 << 63), Poster::World).is_err());
        assert!(both.check_send(Some(1 << 56), Poster::World).is_ok());
        let e = both.check_send(Some(1 << 63), app).unwrap_err().to_string();
        assert!(e.contains("emulated atomics"), "{e}");
    }
}
