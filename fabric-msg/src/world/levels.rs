//! The World's own communicators for its collectives in two levels
//! (`two_level.rs`, which has the algorithm): its node's and its node
//! leaders'. Apart from the algorithm so that the World can hold them.

use super::comm_handle::Comm;
use std::sync::Arc;

/// The two levels of a World that spans nodes.
#[derive(Debug, Clone)]
pub(crate) struct TwoLevel {
    /// This rank's node (`split_shared`), with slots unless it is alone.
    pub(crate) node: Comm,
    /// The node leaders on the fabric: `Some` on leaders only.
    pub(crate) leaders: Option<Comm>,
    /// For each world rank, its node leader's rank among the leaders
    /// (`same_node::leader_places`): where a broadcast's or a reduce's
    /// root is on the leaders' level.
    pub(crate) places: Arc<[u32]>,
}

impl TwoLevel {
    /// The leaders' rank of `root`'s node, for a `root` in the World.
    pub(crate) fn place_of(&self, root: u32) -> Option<u32> {
        self.places.get(root as usize).copied()
    }
}
