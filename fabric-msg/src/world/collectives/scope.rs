//! The communicator a collective runs on, as the engine sees it: the
//! context id its messages carry (`tags.rs`), and its members' world
//! ranks. Schedules are built in the communicator's ranks and translated
//! to world ranks before they run ([`Scope::to_world`]), so the engine and
//! the runs post to, and match, world ranks only.
//!
//! Context ids are leased from this rank's [`ContextPool`]: a
//! communicator's [`Members`] hold the lease, and so does every run and
//! request on it, so an id is free again only once the communicator and
//! everything started on it are gone.

use super::schedule::Schedule;
use crate::world::tags::MAX_CONTEXTS;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// This rank's free context ids, a bit each (1 = free); 0, the World's, is
/// never free.
#[derive(Debug)]
pub(crate) struct ContextPool {
    free: [AtomicU64; 2],
}

impl ContextPool {
    pub(crate) fn new() -> ContextPool {
        debug_assert_eq!(MAX_CONTEXTS, 64);
        ContextPool {
            free: [AtomicU64::new(!1), AtomicU64::new(0)],
        }
    }

    /// The free ids now, as two words (ids 0-63, and 64-127 which are
    /// never free: `tags::MAX_CONTEXTS`).
    pub(crate) fn snapshot(&self) -> [u64; 2] {
        [
            self.free[0].load(Ordering::Relaxed),
            self.free[1].load(Ordering::Relaxed),
        ]
    }

    /// Take `ctx`; `false` if it was not free.
    pub(crate) fn take(&self, ctx: u8) -> bool {
        let (word, bit) = (usize::from(ctx / 64), 1u64 << (ctx % 64));
        self.free[word].fetch_and(!bit, Ordering::Relaxed) & bit != 0
    }

    fn give(&self, ctx: u8) {
        if ctx != 0 {
            let (word, bit) = (usize::from(ctx / 64), 1u64 << (ctx % 64));
            self.free[word].fetch_or(bit, Ordering::Relaxed);
        }
    }
}

/// The lowest id free in every mask of `masks`, or `None`.
pub(crate) fn lowest_common(masks: impl Iterator<Item = [u64; 2]>) -> Option<u8> {
    let both = masks.fold([!0u64; 2], |acc, m| [acc[0] & m[0], acc[1] & m[1]]);
    let both = [both[0] & !1, both[1]];
    if both[0] != 0 {
        Some(both[0].trailing_zeros() as u8)
    } else if both[1] != 0 {
        Some(64 + both[1].trailing_zeros() as u8)
    } else {
        None
    }
}

/// A sub-communicator's members, holding its context id's lease.
#[derive(Debug)]
pub(crate) struct Members {
    pub ctx: u8,
    /// World rank by communicator rank.
    pub ranks: Box<[u32]>,
    /// `(world rank, communicator rank)`, sorted by world rank.
    pub by_world: Box<[(u32, u32)]>,
    pool: Arc<ContextPool>,
}

impl Members {
    /// The members `ranks` (world ranks, in communicator order) on the
    /// context `ctx`, taken from `pool` already.
    pub(crate) fn new(ctx: u8, ranks: Vec<u32>, pool: Arc<ContextPool>) -> Members {
        let mut by_world: Vec<(u32, u32)> = ranks.iter().enumerate().map(|(c, &w)| (w, c as u32)).collect();
        by_world.sort_unstable();
        Members {
            ctx,
            ranks: ranks.into(),
            by_world: by_world.into(),
            pool,
        }
    }

    /// The communicator rank of world rank `w`, if it is a member.
    pub(crate) fn rank_of(&self, w: u32) -> Option<u32> {
        self.by_world
            .binary_search_by_key(&w, |&(world, _)| world)
            .ok()
            .map(|i| self.by_world[i].1)
    }
}

impl Drop for Members {
    fn drop(&mut self) {
        self.pool.give(self.ctx);
    }
}

/// A communicator as the engine needs it.
#[derive(Debug, Clone, Default)]
pub(crate) struct Scope {
    /// Its context id: 0 for the World.
    pub ctx: u8,
    /// Its members; `None` for the World, whose ranks are the world ranks.
    pub members: Option<Arc<Members>>,
}

impl Scope {
    /// The World's.
    #[cfg(test)]
    pub(crate) fn world() -> Scope {
        Scope::default()
    }

    /// The world rank of communicator rank `r`.
    pub(crate) fn world_rank(&self, r: u32) -> u32 {
        match &self.members {
            Some(m) => m.ranks.get(r as usize).copied().unwrap_or(u32::MAX),
            None => r,
        }
    }

    /// The communicator rank of world rank `w`, if it is a member.
    pub(crate) fn rank_of(&self, w: u32) -> Option<u32> {
        match &self.members {
            Some(m) => m.rank_of(w),
            None => Some(w),
        }
    }

    /// The world ranks other than `me` a failure notice goes to: the
    /// members, or every rank of a world of `world_size`.
    pub(crate) fn others(&self, me: u32, world_size: u32) -> Vec<u32> {
        match &self.members {
            Some(m) => m.ranks.iter().copied().filter(|&r| r != me).collect(),
            None => (0..world_size).filter(|&r| r != me).collect(),
        }
    }

    /// `sched`, built in communicator ranks, with its peers made world
    /// ranks.
    pub(crate) fn to_world(&self, mut sched: Schedule) -> Schedule {
        if self.members.is_some() {
            for round in sched.rounds.iter_mut() {
                for x in round.sends.iter_mut().chain(round.recvs.iter_mut()) {
                    x.peer = self.world_rank(x.peer);
                }
            }
        }
        sched
    }
}

#[cfg(test)]
mod tests {
    use super::{lowest_common, ContextPool, Members, Scope};
    use crate::world::collectives::schedule::{xfer, Schedule};
    use std::sync::Arc;

    #[test]
    fn schedules_move_from_communicator_ranks_to_world_ranks() {
        let pool = Arc::new(ContextPool::new());
        assert!(pool.take(3));
        let s = Scope {
            ctx: 3,
            members: Some(Arc::new(Members::new(3, vec![4, 1, 7], pool))),
        };
        assert_eq!(
            (s.rank_of(7), s.rank_of(4), s.rank_of(2)),
            (Some(2), Some(0), None)
        );
        let mut sched = Schedule::default();
        sched.send(xfer(2, 0, 0, 1));
        sched.recv(xfer(0, 1, 0, 1));
        let w = s.to_world(sched.clone());
        assert_eq!(w.rounds[0].sends[0].peer, 7);
        assert_eq!(w.rounds[1].recvs[0].peer, 4);
        assert_eq!(s.others(1, 99), vec![4, 7]);
        let world = Scope::world().to_world(sched);
        assert_eq!(world.rounds[0].sends[0].peer, 2);
        assert_eq!(Scope::world().others(1, 3), vec![0, 2]);
    }

    #[test]
    fn context_ids_are_leased_until_the_last_holder_goes() {
        let pool = Arc::new(ContextPool::new());
        assert!(!pool.take(0), "the World's is never free");
        let first = lowest_common([pool.snapshot()].into_iter()).expect("63 free");
        assert_eq!(first, 1);
        assert!(pool.take(first));
        assert!(!pool.take(first), "taken once");
        let m = Arc::new(Members::new(first, vec![0, 1], pool.clone()));
        let run_holds = m.clone();
        drop(m);
        assert_eq!(
            lowest_common([pool.snapshot()].into_iter()),
            Some(2),
            "still leased"
        );
        drop(run_holds);
        assert_eq!(
            lowest_common([pool.snapshot()].into_iter()),
            Some(1),
            "free again"
        );
        // Another rank holds 1 and 2: the common choice skips them.
        let other = [!0b111u64, !0];
        assert_eq!(lowest_common([pool.snapshot(), other].into_iter()), Some(3));
        for c in 1..64u8 {
            assert!(pool.take(c));
        }
        for c in 64..128u8 {
            assert!(!pool.take(c), "{c} would set the event loop's tag bit");
        }
        assert_eq!(lowest_common([pool.snapshot()].into_iter()), None, "all 63 taken");
    }
}
