//! Connected (MSG) endpoints: the event queue, the passive endpoint and
//! `fi_connect` / `fi_accept`.
//!
//! On fabrics that offer only connected endpoints (raw `verbs`, notably on
//! iWARP) every connection is its own endpoint, bound to the loop's one CQ.
//! The bootstrap calls these after the out-of-band handshake, so that
//! `connect` and `Listener::accept` look the same on every fabric; the
//! returned `Peer` names the connection's endpoint.

use super::resources::EndpointState;
use super::state::EventLoop;
use super::types::EndpointId;
use crate::error::{Error, Result};
use crate::ffi;
use crate::libfabric::{CmEvent, Endpoint, Eq, Info, InfoRef, PassiveEndpoint};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Posts receives on a new endpoint before its connection starts.
pub(crate) type Prepost<'a> = &'a mut dyn FnMut(&mut EventLoop, EndpointId) -> Result<()>;

impl EventLoop {
    fn eq(&self) -> Result<&Arc<Eq>> {
        self.objects.eq.as_ref().ok_or_else(|| Error::Unsupported {
            what: "connected (MSG) endpoints on a profile negotiated for RDM".into(),
            provider: self.domain.profile.provider.clone(),
        })
    }

    /// The passive endpoint's address, listening (opened on first use).
    pub(crate) fn msg_listen(&mut self) -> Result<Vec<u8>> {
        if let Some(p) = &self.objects.pep {
            return p.name();
        }
        let eq = self.eq()?.clone();
        let mut pep = PassiveEndpoint::open(self.domain.fabric(), self.domain.info())?;
        pep.bind_eq(&eq)?;
        pep.listen()?;
        let name = pep.name()?;
        self.objects.pep = Some(pep);
        Ok(name)
    }

    /// Open an endpoint from `info`, bound to the loop's CQ and EQ.
    fn msg_endpoint(&mut self, info: InfoRef<'_>) -> Result<Endpoint> {
        let eq = self.eq()?.clone();
        // The progress thread waits while the CQ gains an endpoint.
        let gate = self.progress_gate();
        let _gate = gate.as_ref().map(|g| g.lock());
        // SAFETY: no context.
        let mut ep = unsafe { Endpoint::open(&self.domain.domain, info, std::ptr::null_mut())? };
        let flags = u64::from(ffi::FI_TRANSMIT | ffi::FI_RECV);
        // On error `ep` closes as it drops.
        ep.bind_eq(&eq)?;
        ep.bind_cq(&self.objects.cq, flags)?;
        Ok(ep)
    }

    fn adopt(&mut self, ep: Endpoint) -> EndpointId {
        let framed = self.framed();
        self.endpoints.push(Some(EndpointState::new(Some(ep), framed)));
        let id = self.endpoints.len() as u32 - 1;
        self.stats.connection_opened(id);
        EndpointId::new(id)
    }

    /// The endpoint `id` (just adopted).
    fn adopted(&self, id: EndpointId) -> Result<&Endpoint> {
        self.endpoints
            .get(id.0 as usize)
            .and_then(Option::as_ref)
            .and_then(|s| s.endpoint.as_ref())
            .ok_or_else(|| Error::Closed {
                what: format!("endpoint {}", id.0),
            })
    }

    /// The next connection-management event, if any; never waits.
    pub(crate) fn cm_try_next(&mut self) -> Result<Option<CmEvent>> {
        self.eq()?.try_next()
    }

    /// Accept the connection request `info` (which this takes and frees):
    /// open its endpoint, run `prepost` on it once enabled, then
    /// `fi_accept`. Returns the endpoint and its fid (as an address, to
    /// match the `FI_CONNECTED` that follows). On failure the request is
    /// rejected and whatever was opened for it is closed.
    pub(crate) fn msg_accept_request(
        &mut self,
        info: Info,
        prepost: Prepost<'_>,
    ) -> Result<(EndpointId, usize)> {
        let ep = match self.msg_endpoint(info.as_ref()) {
            Ok(ep) => ep,
            Err(e) => {
                self.msg_reject(info);
                return Err(e);
            }
        };
        // Only the fid's address is kept, for matching.
        let fid = ep.fid_addr() as usize;
        let id = self.adopt(ep);
        if let Err(e) = self.enable_and_prepost(id, prepost) {
            self.close_endpoint(id).ok();
            self.msg_reject(info);
            return Err(e);
        }
        let gate = self.progress_gate();
        let gated = gate.as_ref().map(|g| g.lock());
        let accepted = self.adopted(id).and_then(Endpoint::accept);
        drop(gated);
        if let Err(e) = accepted {
            self.close_endpoint(id).ok();
            return Err(e);
        }
        Ok((id, fid))
    }

    /// Refuse the connection request `info` and free it.
    pub(crate) fn msg_reject(&mut self, info: Info) {
        if let Some(pep) = &self.objects.pep {
            pep.reject(&info);
        }
    }

    /// Connect a new endpoint to a listening peer's passive endpoint `name`;
    /// `prepost` runs on the enabled endpoint before `fi_connect`.
    /// `cm_data` goes to the listener as the connection's private data: the
    /// handshake's nonce, by which it knows this request is ours.
    pub(crate) fn msg_connect(
        &mut self,
        name: &[u8],
        cm_data: &[u8],
        timeout: Duration,
        prepost: Prepost<'_>,
    ) -> Result<EndpointId> {
        let own = self.domain.info().src_addr();
        self.check_peer_name(&own, name, "the listening peer's")?;
        let mut info = Info::dup(self.domain.info())?;
        // verbs resolves the route when the endpoint is created, so the
        // destination goes into the info (tcp would also take it in fi_connect).
        info.set_dest_addr(name)?;
        let ep = self.msg_endpoint(info.as_ref())?;
        drop(info);
        let want = ep.fid_addr();
        let id = self.adopt(ep);
        self.enable_and_prepost(id, prepost)?;
        let gate = self.progress_gate();
        let gated = gate.as_ref().map(|g| g.lock());
        // SAFETY: name is the peer's address in this provider's format
        // (checked above).
        let connected = self
            .adopted(id)
            .and_then(|ep| unsafe { ep.connect(name, cm_data) });
        drop(gated);
        connected?;
        self.wait_connected(want, timeout)?;
        Ok(id)
    }

    /// Enable the endpoint so receives can be posted before the connection
    /// exists: iWARP has no receiver-not-ready retry, and a message that
    /// finds no posted receive ends the connection.
    fn enable_and_prepost(&mut self, id: EndpointId, prepost: Prepost<'_>) -> Result<()> {
        let gate = self.progress_gate();
        let gated = gate.as_ref().map(|g| g.lock());
        let enabled = self.adopted(id).and_then(Endpoint::enable);
        drop(gated);
        enabled?;
        prepost(self, id)
    }

    /// Wait for `ep`'s `FI_CONNECTED`. A connection request arriving
    /// meanwhile is refused (freed): this loop is connecting, and a
    /// [`Listener`](crate::Listener) driven with the same loop would not
    /// see it. Other connections' events are logged and dropped.
    fn wait_connected(&mut self, want: *mut ffi::fid, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.eq()?.next(left)? {
                CmEvent::Connected { fid } if fid == want => return Ok(()),
                CmEvent::Shutdown { fid } if fid == want => {
                    return Err(Error::Handshake {
                        peer: "fabric".into(),
                        message: "the peer shut the connection down".into(),
                    })
                }
                // A provider that names no fid can only mean this attempt:
                // nothing else on this loop is connecting now.
                CmEvent::Failed { fid, message } if fid == want || fid.is_null() => {
                    return Err(Error::Handshake {
                        peer: "fabric".into(),
                        message,
                    })
                }
                CmEvent::ConnReq { info, .. } => {
                    log::warn!("refusing a connection request that arrived while this loop was connecting");
                    self.msg_reject(info);
                }
                CmEvent::Failed { message, .. } => log::debug!("another connection: {message}"),
                CmEvent::Connected { .. } | CmEvent::Shutdown { .. } => continue,
            }
        }
    }
}
