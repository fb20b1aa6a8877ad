//! The job around this process: who launched it, its rank, its peers.
pub(crate) mod pmix;
