//! The [`Comm`] handle itself: what a rank holds of a communicator (its
//! members, its rank among them, its context id and, where all its members
//! share this node, its collective slots). `comm.rs` makes communicators
//! and lends the World to them; this file names nothing that holds the
//! World, so the World can hold communicators of its own (`levels.rs`).

use super::collectives::on_node::NodeColl;
use super::collectives::scope::Scope;
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
}
