//! Where this rank stands: rank, size, and the ranks on its node.

/// Rank, size and the node's ranks, as the launcher tells them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Placement {
    pub rank: u32,
    pub size: u32,
    pub local_rank: u32,
    /// Ranks on this node, this one included, ascending.
    pub local_ranks: Vec<u32>,
}
