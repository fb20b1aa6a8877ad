//! Each endpoint's state in the loop's table: the endpoint itself (owned,
//! `libfabric/endpoint.rs`), the handle posts go through, whether its
//! messages are framed, and what memory regions bound to it hold.

use crate::libfabric::{Endpoint, RawEndpoint};
use std::sync::Arc;

pub(crate) struct EndpointState {
    /// The handle to post through: `endpoint`'s, or null for the base
    /// endpoint of a MSG loop, which only stands for the loop in
    /// `accept`/`connect` (each connection has its own endpoint), and for
    /// an endpoint closed while its entry stays (a lost peer's, until its
    /// operations are failed).
    pub(crate) raw: RawEndpoint,
    /// The endpoint; closed when this state drops, or by the loop
    /// (`close_endpoint`, teardown), which reports failure.
    pub(crate) endpoint: Option<Endpoint>,
    pub(crate) framed: bool,
    /// Held by memory regions bound to this endpoint (`FI_MR_ENDPOINT`).
    pub(crate) bound: Arc<()>,
}

impl EndpointState {
    pub(crate) fn new(endpoint: Option<Endpoint>, framed: bool) -> EndpointState {
        EndpointState {
            raw: endpoint.as_ref().map_or(RawEndpoint::NULL, Endpoint::raw),
            endpoint,
            framed,
            bound: Arc::new(()),
        }
    }

    /// Close the endpoint now (under the caller's progress gate), leaving
    /// this state with a null handle. `Ok` if there was none.
    pub(crate) fn close(&mut self) -> crate::error::Result<()> {
        self.raw = RawEndpoint::NULL;
        self.endpoint.take().map_or(Ok(()), Endpoint::close)
    }
}
