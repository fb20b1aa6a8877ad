//! Communicators: groups of the World's ranks with their own rank order and
//! their own message space, as MPI's communicators.
//!
//! A [`Comm`] is a handle this rank holds; [`World::on`] lends the World to
//! it as a [`CommView`], whose methods are the point-to-point messages and
//! collectives of that communicator (the World's own methods are those of
//! the whole World):
//!
//! ```no_run
//! use fabric_msg::{Op, World};
//! let mut world = World::init()?;
//! let rank = world.rank();
//! // Even and odd ranks, each group ordered by world rank.
//! let half = world.split(Some(rank % 2), rank as i64)?.expect("every rank has a colour");
//! let mut sum = [rank as u64];
//! world.on(&half).allreduce(&mut sum, Op::Sum)?; // over my half only
//! let node = world.split_shared()?;             // the ranks on my node
//! world.on(&node).barrier()?;
//! # Ok::<(), fabric_msg::Error>(())
//! ```
//!
//! How messages stay apart: every message's tag carries its
//! communicator's context id (`tags.rs`: 7 bits; the World is 0), so a
//! receive on one communicator never matches a message of another, and
//! the application keeps all 32 bits of its tags. A split picks the lowest
//! id free on every rank of the parent (one allgather that also carries
//! colours and keys); the new communicators of one split share it, since
//! their members are disjoint. At most 63 sub-communicators can be alive
//! on a rank at once; an id is free again once the [`Comm`] and every
//! request started on it are dropped (there is no separate `free`: drop
//! the handle, as MPI's `MPI_Comm_free`, after its operations).

use super::collectives::scope::{lowest_common, Members, Scope};
pub use super::comm_handle::Comm;
use super::state::World;
use crate::error::{Error, Result};
use std::sync::Arc;

/// The World lent to one communicator: its point-to-point messages and
/// collectives, in its ranks. From [`World::on`]; the World's own methods
/// are those of a view of the whole World.
#[derive(Debug)]
pub struct CommView<'w> {
    pub(crate) world: &'w mut World,
    pub(crate) comm: Option<&'w Comm>,
}

impl World {
    /// The communicator `comm`'s view of this World: its messages and
    /// collectives.
    pub fn on<'w>(&'w mut self, comm: &'w Comm) -> CommView<'w> {
        CommView {
            world: self,
            comm: Some(comm),
        }
    }

    /// The whole World's view: what the World's own methods use.
    pub(crate) fn whole(&mut self) -> CommView<'_> {
        CommView {
            world: self,
            comm: None,
        }
    }

    /// Split the World: ranks that pass the same `color` form one new
    /// communicator, ordered by `key` (ties by world rank); a rank that
    /// passes `None` joins none and gets `None` (MPI's `MPI_UNDEFINED`).
    /// Collective: every rank calls it.
    pub fn split(&mut self, color: Option<u32>, key: i64) -> Result<Option<Comm>> {
        self.whole().split(color, key)
    }

    /// The ranks of this rank's node, ordered by world rank (MPI's
    /// `MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)`): [`World::node_ranks`],
    /// which follow `FABRIC_MSG_NODE` where it is set, as the node
    /// transport does. Collective.
    pub fn split_shared(&mut self) -> Result<Comm> {
        self.whole().split_shared()
    }

    /// A communicator of the same ranks in the same order with a message
    /// space of its own (MPI's `MPI_Comm_dup`): for a library that must
    /// never see the application's messages. Collective.
    pub fn dup(&mut self) -> Result<Comm> {
        self.whole().dup()
    }
}

impl CommView<'_> {
    /// This rank's rank in the communicator.
    pub fn rank(&self) -> u32 {
        match self.comm {
            Some(c) => c.rank,
            None => self.world.rank(),
        }
    }

    /// How many ranks the communicator has.
    pub fn size(&self) -> u32 {
        match self.comm {
            Some(c) => c.size(),
            None => self.world.size(),
        }
    }

    /// The communicator as the engine sees it.
    pub(crate) fn scope(&self) -> Scope {
        self.comm.map(|c| c.scope.clone()).unwrap_or_default()
    }

    /// The world rank of rank `r`, or a usage error naming the
    /// communicator's size.
    pub(crate) fn world_rank(&self, r: u32) -> Result<u32> {
        let w = match self.comm {
            None => Some(r),
            Some(c) => c.world_rank(r),
        };
        match w {
            Some(w) if r < self.size() && w < self.world.size() => Ok(w),
            Some(_) if r < self.size() => Err(Error::Usage(format!(
                "this communicator's rank {r} is not in this World of {} ranks: was the communicator \
                 made by another World?",
                self.world.size()
            ))),
            _ => Err(Error::Usage(format!(
                "rank {r} is not in this communicator of {} ranks",
                self.size()
            ))),
        }
    }

    /// The two levels its blocking allreduce, barrier, reduce and
    /// broadcast run in, where its ranks span nodes (`two_level.rs`).
    pub(crate) fn levels(&self) -> Option<Arc<super::comm_handle::TwoLevel>> {
        match self.comm {
            None => self.world.two_level(),
            Some(c) => c.levels.clone(),
        }
    }

    /// The two levels its non-blocking and persistent allreduce,
    /// barrier, reduce and broadcast run in (`two_level_requests.rs`):
    /// its own, unless a dup shares them (`TwoLevel::may_queue`).
    pub(crate) fn queue_levels(&self) -> Option<Arc<super::comm_handle::TwoLevel>> {
        self.levels().filter(|t| t.may_queue())
    }

    /// [`World::split`] on this communicator.
    pub fn split(&mut self, color: Option<u32>, key: i64) -> Result<Option<Comm>> {
        let pool = self.world.contexts.clone();
        let [lo, hi] = pool.snapshot();
        // Each rank's node too (by its lowest world rank), so a new
        // communicator whose ranks span nodes knows where each one is.
        let node = self
            .world
            .node_ranks()
            .first()
            .copied()
            .unwrap_or(self.world.rank());
        let mine = [
            color.map_or(-1, i64::from),
            key,
            lo as i64,
            hi as i64,
            i64::from(node),
        ];
        let all = self.allgather(&mine)?;
        let rows: Vec<&[i64]> = all.chunks_exact(mine.len()).collect();
        let Some(ctx) = lowest_common(rows.iter().map(|r| [r[2] as u64, r[3] as u64])) else {
            return Err(Error::Usage(format!(
                "no context id is free on every rank of this communicator: at most {} \
                 sub-communicators can be alive on a rank at once ({} of them the World's own, \
                 and 2 of each split communicator whose collectives run in two levels); drop some first",
                super::tags::MAX_CONTEXTS - 1,
                self.world.own_communicators()
            )));
        };
        // Every rank of the split reached the same choice; each opens the
        // context whether or not it joins, so that the numbering agrees.
        self.world.coll.open_context(ctx);
        let Some(color) = color else {
            return Ok(None);
        };
        let mut order: Vec<(i64, u32)> = rows
            .iter()
            .enumerate()
            .filter(|(_, r)| r[0] == i64::from(color))
            .map(|(p, r)| (r[1], p as u32))
            .collect();
        order.sort_unstable();
        let mut ranks = Vec::with_capacity(order.len());
        for &(_, p) in &order {
            ranks.push(self.world_rank(p)?);
        }
        let me = self.world.rank();
        let rank = ranks.iter().position(|&w| w == me).unwrap_or(0) as u32;
        if !pool.take(ctx) {
            return Err(Error::Usage(format!(
                "context id {ctx} was taken on this rank during the split: split communicators from one thread"
            )));
        }
        let members = Arc::new(Members::new(ctx, ranks, pool));
        let mut comm = Comm {
            scope: Scope {
                ctx,
                members: Some(members),
            },
            rank,
            node: None,
            levels: None,
            own_levels: false,
        };
        self.give_slots(&mut comm)?;
        // Where the World's collectives run in two levels, so do those of a
        // communicator that spans nodes (`two_level.rs`): a communicator of
        // the same ranks in the same order as this one (a `dup`) shares its
        // two levels; another makes its own, which take two more context
        // ids, while at least half of them stay free on all its ranks.
        // (Not where this one's non-blocking calls went through its two
        // levels: `Uses`, in comm_handle.rs, says why.)
        let members: Vec<u32> = order.iter().map(|&(_, p)| p).collect();
        let same =
            members.iter().enumerate().all(|(i, &p)| i as u32 == p) && members.len() as u32 == self.size();
        let parent = self.levels();
        let shared = parent.as_ref().filter(|_| same).and_then(|t| t.share());
        if same && (parent.is_none() || shared.is_some()) {
            comm.levels = shared;
        } else if self.world.two_level().is_some() {
            let free = members.iter().fold([!1u64, !0u64], |acc, &p| {
                let r = rows[p as usize];
                [acc[0] & r[2] as u64, acc[1] & r[3] as u64]
            });
            // Less the new communicator's own.
            let free = (free[0].count_ones() + free[1].count_ones()).saturating_sub(1);
            if free >= 2 + (super::tags::MAX_CONTEXTS as u32 - 1) / 2 {
                let nodes: Vec<u32> = members.iter().map(|&p| rows[p as usize][4] as u32).collect();
                comm.levels = self.world.on(&comm).make_levels(&nodes)?.map(Arc::new);
                comm.own_levels = comm.levels.is_some();
            }
        }
        Ok(Some(comm))
    }

    /// [`World::split_shared`] on this communicator: its ranks on this
    /// rank's node.
    pub fn split_shared(&mut self) -> Result<Comm> {
        let node = self
            .world
            .node_ranks()
            .iter()
            .copied()
            .min()
            .unwrap_or(self.world.rank());
        let key = i64::from(self.rank());
        self.split(Some(node), key)?
            .ok_or_else(|| Error::Usage("split_shared gave no communicator".into()))
    }

    /// [`World::dup`] on this communicator.
    pub fn dup(&mut self) -> Result<Comm> {
        let key = i64::from(self.rank());
        self.split(Some(0), key)?
            .ok_or_else(|| Error::Usage("dup gave no communicator".into()))
    }
}
