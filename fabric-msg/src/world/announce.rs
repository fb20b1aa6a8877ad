//! The sending side of one matching engine (`local/engine.rs`): an
//! application message larger than [`EAGER`] to a rank that matches every
//! message in one place is announced first, then sent as data under a tag
//! of its own, which the receiver posts for once a receive has taken the
//! announcement (`World::send_announced`, in `point_to_point.rs`).
//! Smaller ones, and every message to a rank without the engine, go as
//! before.

use super::local::engine::EAGER;
use super::tags;

/// Which ranks match every application message in one place, and how
/// many messages this rank announced to each.
#[derive(Debug)]
pub(crate) struct Announcer {
    /// By world rank: messages larger than [`EAGER`] to it are announced
    /// (it runs the engine, on another node than this rank).
    to: Vec<bool>,
    /// By world rank: the number of the next announcement to it.
    next: Vec<u32>,
}

impl Announcer {
    /// For `engine[r]`: whether rank `r` runs the engine; `mine`: the
    /// ranks on this rank's node (the node loop carries those).
    pub(crate) fn new(engine: &[bool], mine: &[u32]) -> Announcer {
        let to = engine
            .iter()
            .enumerate()
            .map(|(r, &e)| e && !mine.contains(&(r as u32)))
            .collect::<Vec<_>>();
        Announcer {
            next: vec![0; to.len()],
            to,
        }
    }

    /// Whether a message of `len` bytes to `to` in class `class` is
    /// announced: if so, the number its announcement carries.
    #[inline]
    pub(crate) fn announces(&self, class: u64, to: u32, len: usize) -> Option<u32> {
        let to = to as usize;
        (len > EAGER && tags::is_user(class) && self.to.get(to).copied().unwrap_or(false))
            .then(|| self.next[to] & tags::SEQ_MASK)
    }

    /// Announcement `n` to `to` went: the next one to it is `n + 1`.
    pub(crate) fn announced(&mut self, to: u32, n: u32) {
        self.next[to as usize] = n.wrapping_add(1);
    }
}
