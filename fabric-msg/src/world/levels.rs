//! The World's own communicators for its collectives in two levels
//! (`two_level.rs`, which has the algorithm): its node's and its node
//! leaders'. Apart from the algorithm so that the World can hold them.

use super::comm_handle::Comm;

/// The two levels of a World that spans nodes.
#[derive(Debug, Clone)]
pub(crate) struct TwoLevel {
    /// This rank's node (`split_shared`), with slots unless it is alone.
    pub(crate) node: Comm,
    /// The node leaders on the fabric: `Some` on leaders only.
    pub(crate) leaders: Option<Comm>,
}
