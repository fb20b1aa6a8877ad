//! The [`Comm`] handle itself: what a rank holds of a communicator (its
//! members, its rank among them, its context id, where all its members
//! share this node its collective slots, and where they span nodes its
//! two levels). `comm.rs` makes communicators and lends the World to them;
//! this file names nothing that holds the World, so the World can hold
//! communicators of its own ([`TwoLevel`]).

use super::collectives::on_node::NodeColl;
use super::collectives::scope::Scope;
use crate::error::Error;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// A communicator: a group of the World's ranks, numbered from 0 in the
/// order its split chose, with a message space of its own. Made by
/// [`World::split`](crate::World::split),
/// [`World::split_shared`](crate::World::split_shared),
/// [`World::dup`](crate::World::dup) (or the same on a
/// [`CommView`](crate::world::CommView), to split a communicator further);
/// used through [`World::on`](crate::World::on). Dropping it frees its
/// context id once the operations started on it are done.
#[derive(Debug, Clone)]
pub struct Comm {
    pub(crate) scope: Scope,
    pub(crate) rank: u32,
    /// Its collective slots, where every member shares this node
    /// (`comm_slots.rs`); shared by the handle's clones, which are the
    /// same communicator.
    pub(crate) node: Option<Arc<parking_lot::Mutex<NodeColl>>>,
    /// Where its members span nodes and some node has several of them:
    /// its node's and its node leaders' communicators, for its blocking
    /// collectives in two levels (`two_level.rs`).
    pub(crate) levels: Option<Arc<TwoLevel>>,
    /// Whether it made `levels` itself (not shared from the communicator
    /// it was split from).
    pub(crate) own_levels: bool,
}

impl Comm {
    /// This rank's rank in the communicator.
    pub fn rank(&self) -> u32 {
        self.rank
    }

    /// How many ranks it has.
    pub fn size(&self) -> u32 {
        self.members().len() as u32
    }

    /// The world rank of its rank `r`, or `None` past its size.
    pub fn world_rank(&self, r: u32) -> Option<u32> {
        self.members().get(r as usize).copied()
    }

    /// Its rank of world rank `w`, or `None` if `w` is not a member.
    pub fn rank_of(&self, w: u32) -> Option<u32> {
        self.scope.rank_of(w)
    }

    /// Rank `r` of this communicator as a rank of `other` (MPI's
    /// `MPI_Group_translate_ranks`), or `None` if it is not in `other`.
    pub fn translate(&self, r: u32, other: &Comm) -> Option<u32> {
        other.rank_of(self.world_rank(r)?)
    }

    /// Its members' world ranks, by rank.
    pub fn members(&self) -> &[u32] {
        match &self.scope.members {
            Some(m) => &m.ranks,
            None => &[],
        }
    }

    /// Its context id (1-63): what its messages' tags carry.
    pub fn context(&self) -> u8 {
        self.scope.ctx
    }

    /// Sub-communicators it keeps for itself: where its ranks span nodes
    /// and it made its own two levels for its blocking collectives (see
    /// [`World::own_communicators`](crate::World::own_communicators)), its
    /// node's and its node leaders', 2; otherwise 0 (a `dup` shares the two
    /// levels of the communicator it was made from, and keeps them leased
    /// while it lives, should that one go first). They count against the
    /// limit on live communicators while it lives.
    pub fn own_communicators(&self) -> u32 {
        if self.own_levels {
            2
        } else {
            0
        }
    }
}

/// The two levels of a communicator (or of the World) whose ranks span
/// nodes: its node's ranks and its node leaders (`two_level.rs` has the
/// algorithm). Sub-communicators of their own, so they take two context
/// ids of the communicator's ranks while it lives.
#[derive(Debug, Clone)]
pub(crate) struct TwoLevel {
    /// This rank's node (`split_shared`), with slots unless it is alone.
    pub(crate) node: Comm,
    /// The node leaders on the fabric: `Some` on leaders only.
    pub(crate) leaders: Option<Comm>,
    /// For each rank of the communicator, its node leader's rank among the
    /// leaders (`same_node::leader_places`): where a broadcast's or a
    /// reduce's root is on the leaders' level.
    pub(crate) places: Arc<[u32]>,
    /// The communicator's members' world ranks, by rank; `None` for the
    /// World (ranks are world ranks).
    pub(crate) members: Option<Arc<[u32]>>,
    /// Who uses them: see [`TwoLevel::share`] and [`TwoLevel::may_queue`].
    pub(crate) uses: Arc<Uses>,
}

/// Whether a communicator's two levels are shared with its dups, and
/// whether non-blocking calls went through them. The two exclude each
/// other: calls queued in the node's slots are numbered there in the
/// order each rank starts them, and MPI lets ranks start the non-blocking
/// calls of two communicators, or one's non-blocking and the other's
/// blocking calls, in different orders. Both change only in a collective
/// of the communicator that made the levels (its first non-blocking call
/// in two levels; its first dup), so every rank sees them alike.
#[derive(Debug, Default)]
pub(crate) struct Uses {
    shared: AtomicBool,
    queued: AtomicBool,
}

impl TwoLevel {
    /// These levels for a dup of their communicator, unless non-blocking
    /// calls went through them (`None`: the dup makes its own).
    pub(crate) fn share(self: &Arc<Self>) -> Option<Arc<TwoLevel>> {
        if self.uses.queued.load(Ordering::Relaxed) {
            return None;
        }
        self.uses.shared.store(true, Ordering::Relaxed);
        Some(self.clone())
    }

    /// Whether a non-blocking or persistent call may go through these
    /// levels: not once a dup shares them (it then goes on as a flat
    /// message schedule). Where it may, no dup shares them from now on.
    pub(crate) fn may_queue(&self) -> bool {
        if self.uses.shared.load(Ordering::Relaxed) {
            return false;
        }
        self.uses.queued.store(true, Ordering::Relaxed);
        true
    }

    /// How many ranks the communicator has.
    pub(crate) fn size(&self) -> u32 {
        self.places.len() as u32
    }

    /// The leaders' rank of `root`'s node, for a `root` of the communicator.
    pub(crate) fn place_of(&self, root: u32) -> Option<u32> {
        self.places.get(root as usize).copied()
    }

    /// The world rank of the communicator's rank `r`.
    pub(crate) fn world_rank(&self, r: u32) -> Option<u32> {
        match &self.members {
            Some(m) => m.get(r as usize).copied(),
            None => (r < self.size()).then_some(r),
        }
    }

    /// The communicator's rank of world rank `w`.
    pub(crate) fn rank_of(&self, w: u32) -> Option<u32> {
        match &self.members {
            Some(m) => m.iter().position(|&x| x == w).map(|p| p as u32),
            None => (w < self.size()).then_some(w),
        }
    }

    /// The node communicator's rank of the communicator's rank `r`: where
    /// `r` is in this rank's node, if it is.
    pub(crate) fn on_my_node(&self, r: u32) -> Option<u32> {
        self.node.rank_of(self.world_rank(r)?)
    }

    /// A failure in the node's slots names ranks of the node's communicator:
    /// the rank it blames becomes a rank of the communicator the caller
    /// called (world ranks for the World), and the text says how the two
    /// numberings meet.
    pub(crate) fn in_callers_ranks(&self, e: Error) -> Error {
        match e {
            Error::Collective {
                operation,
                seq,
                rank,
                message,
            } => {
                let theirs = |r: u32| self.node.world_rank(r).and_then(|w| self.rank_of(w));
                let ranks: Vec<u32> = (0..self.node.size()).filter_map(theirs).collect();
                let whose = if self.members.is_some() {
                    "ranks of the communicator"
                } else {
                    "world ranks"
                };
                Error::Collective {
                    operation,
                    seq,
                    rank: theirs(rank).unwrap_or(rank),
                    message: format!(
                        "{message} [in this node's step, where ranks 0.. are {whose} {ranks:?}]"
                    ),
                }
            }
            other => other,
        }
    }
}
