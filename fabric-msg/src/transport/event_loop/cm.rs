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
use crate::error::{check, Error, Result};
use crate::ffi;
use crate::memory::domain::close_fid;
use crate::transport::eq::{CmEvent, Eq, Pep};
use std::ptr;
use std::time::{Duration, Instant};

/// Posts receives on a new endpoint before its connection starts.
pub(crate) type Prepost<'a> = &'a mut dyn FnMut(&mut EventLoop, EndpointId) -> Result<()>;

impl EventLoop {
    fn eq(&self) -> Result<&Eq> {
        self.objects.eq.as_ref().ok_or_else(|| Error::Unsupported {
            what: "connected (MSG) endpoints on a profile negotiated for RDM".into(),
            provider: self.domain.profile.provider.clone(),
        })
    }

    /// The passive endpoint's address, listening (opened on first use).
    pub(crate) fn msg_listen(&mut self) -> Result<Vec<u8>> {
        if let Some(p) = &self.objects.pep {
            return Ok(p.name.clone());
        }
        let eq = self.eq()?.raw;
        let mut raw = ptr::null_mut();
        // SAFETY: the fabric and its info are alive (self.domain).
        check("fi_passive_ep", unsafe {
            ffi::fi_passive_ep(
                self.domain.fabric.raw,
                self.domain.info_ptr(),
                &mut raw,
                ptr::null_mut(),
            )
        })?;
        let mut pep = Pep {
            raw,
            name: Vec::new(),
        };
        // SAFETY: pep and eq are open; the EQ outlives the pep (closed after it).
        check("fi_pep_bind", unsafe {
            ffi::fi_pep_bind(pep.raw, &mut (*eq).fid, 0)
        })?;
        // SAFETY: pep is bound to an EQ, as fi_listen requires.
        check("fi_listen", unsafe { ffi::fi_listen(pep.raw) })?;
        let mut name = vec![0u8; 256];
        let mut len = name.len();
        // SAFETY: pep is open; name has len writable bytes.
        check("fi_getname", unsafe {
            ffi::fi_getname(&mut (*pep.raw).fid, name.as_mut_ptr().cast(), &mut len)
        })?;
        name.truncate(len);
        pep.name = name.clone();
        self.objects.pep = Some(pep);
        Ok(name)
    }

    /// Open an endpoint from `info`, bound to the loop's CQ and EQ.
    fn msg_endpoint(&mut self, info: *mut ffi::fi_info) -> Result<*mut ffi::fid_ep> {
        let eq = self.eq()?.raw;
        // The progress thread waits while the CQ gains an endpoint.
        let gate = self.progress_gate();
        let _gate = gate.as_ref().map(|g| g.lock());
        let mut ep = ptr::null_mut();
        // SAFETY: the domain is open and `info` is a live fi_info.
        check("fi_endpoint", unsafe {
            ffi::fi_endpoint(self.domain.raw, info, &mut ep, ptr::null_mut())
        })?;
        let flags = u64::from(ffi::FI_TRANSMIT | ffi::FI_RECV);
        // SAFETY: ep is fresh; the CQ and EQ outlive it. On error it is closed here.
        let rc = unsafe {
            let mut rc = ffi::fi_ep_bind(ep, &mut (*eq).fid, 0);
            if rc == 0 {
                rc = ffi::fi_ep_bind(ep, &mut (*self.objects.cq.raw).fid, flags);
            }
            if rc != 0 {
                close_fid("endpoint", &mut (*ep).fid);
            }
            rc
        };
        check("fi_ep_bind", rc)?;
        Ok(ep)
    }

    fn adopt(&mut self, ep: *mut ffi::fid_ep) -> EndpointId {
        let framed = self.framed();
        self.endpoints.push(Some(EndpointState::new(ep, framed)));
        EndpointId::new(self.endpoints.len() as u32 - 1)
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
        info: *mut ffi::fi_info,
        prepost: Prepost<'_>,
    ) -> Result<(EndpointId, usize)> {
        // SAFETY: info is the provider's live request.
        let handle = unsafe { (*info).handle };
        let ep = self.msg_endpoint(info);
        // SAFETY: the connreq's info was allocated by the provider for us to
        // free, once; the handle it names lives on (fi_accept or fi_reject
        // releases it).
        unsafe { ffi::fi_freeinfo(info) };
        let ep = match ep {
            Ok(ep) => ep,
            Err(e) => {
                self.reject_handle(handle);
                return Err(e);
            }
        };
        let id = self.adopt(ep);
        // SAFETY: ep is live; only its fid's address is kept, for matching.
        let fid = unsafe { &mut (*ep).fid as *mut ffi::fid } as usize;
        if let Err(e) = self.enable_and_prepost(ep, id, prepost) {
            self.close_endpoint(id).ok();
            self.reject_handle(handle);
            return Err(e);
        }
        let gate = self.progress_gate();
        let gated = gate.as_ref().map(|g| g.lock());
        // SAFETY: ep was opened from the request's info, bound and enabled.
        let accepted = check("fi_accept", unsafe { ffi::fi_accept(ep, ptr::null(), 0) });
        drop(gated);
        if let Err(e) = accepted {
            self.close_endpoint(id).ok();
            return Err(e);
        }
        Ok((id, fid))
    }

    /// Refuse the connection request `info` and free it (once).
    pub(crate) fn msg_reject(&mut self, info: *mut ffi::fi_info) {
        // SAFETY: info is the provider's live request.
        self.reject_handle(unsafe { (*info).handle });
        // SAFETY: the request's info is ours to free, once; fi_freeinfo
        // does not touch the handle fi_reject released.
        unsafe { ffi::fi_freeinfo(info) };
    }

    /// `fi_reject` a request's handle (which that releases).
    fn reject_handle(&mut self, handle: *mut ffi::fid) {
        let Some(pep) = &self.objects.pep else { return };
        // SAFETY: handle is a pending request's, not yet accepted or
        // rejected; the pep that received it is listening.
        let rc = unsafe { ffi::fi_reject(pep.raw, handle, ptr::null(), 0) };
        if rc != 0 {
            log::warn!("{}", Error::from_rc("fi_reject", rc.into()));
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
        // SAFETY: the domain keeps its info alive; src_addr, where set, has
        // src_addrlen bytes.
        let own = unsafe {
            let i = self.domain.info_ptr();
            if (*i).src_addr.is_null() {
                Vec::new()
            } else {
                std::slice::from_raw_parts((*i).src_addr.cast::<u8>(), (*i).src_addrlen).to_vec()
            }
        };
        self.check_peer_name(&own, name, "the listening peer's")?;
        // SAFETY: fi_dupinfo copies the live info; the copy is freed below.
        let info = unsafe { ffi::fi_dupinfo(self.domain.info_ptr()) };
        if info.is_null() {
            return Err(Error::from_rc("fi_dupinfo", -(ffi::FI_ENOMEM as i64)));
        }
        // verbs resolves the route when the endpoint is created, so the
        // destination goes into the info (tcp would also take it in fi_connect).
        // SAFETY: info is our copy; dest_addr gets malloc'd memory that
        // fi_freeinfo frees with it.
        unsafe {
            let dest = libc::malloc(name.len().max(1));
            if dest.is_null() {
                ffi::fi_freeinfo(info);
                return Err(Error::from_rc("malloc", -(ffi::FI_ENOMEM as i64)));
            }
            ptr::copy_nonoverlapping(name.as_ptr(), dest.cast::<u8>(), name.len());
            libc::free((*info).dest_addr);
            (*info).dest_addr = dest;
            (*info).dest_addrlen = name.len();
        }
        let ep = self.msg_endpoint(info);
        // SAFETY: info came from fi_dupinfo and is freed once.
        unsafe { ffi::fi_freeinfo(info) };
        let ep = ep?;
        let id = self.adopt(ep);
        self.enable_and_prepost(ep, id, prepost)?;
        let gate = self.progress_gate();
        let gated = gate.as_ref().map(|g| g.lock());
        // SAFETY: ep is bound and enabled; name is the peer's address in this
        // provider's format and cm_data its private data, both read for the
        // duration of the call.
        let connected = check("fi_connect", unsafe {
            ffi::fi_connect(ep, name.as_ptr().cast(), cm_data.as_ptr().cast(), cm_data.len())
        });
        drop(gated);
        connected?;
        self.wait_connected(ep, timeout)?;
        Ok(id)
    }

    /// Enable the endpoint so receives can be posted before the connection
    /// exists: iWARP has no receiver-not-ready retry, and a message that
    /// finds no posted receive ends the connection.
    fn enable_and_prepost(
        &mut self,
        ep: *mut ffi::fid_ep,
        id: EndpointId,
        prepost: Prepost<'_>,
    ) -> Result<()> {
        let gate = self.progress_gate();
        let gated = gate.as_ref().map(|g| g.lock());
        // SAFETY: ep is open and bound to its CQ and EQ.
        let enabled = check("fi_enable", unsafe { ffi::fi_enable(ep) });
        drop(gated);
        enabled?;
        prepost(self, id)
    }

    /// Wait for `ep`'s `FI_CONNECTED`. A connection request arriving
    /// meanwhile is refused (freed): this loop is connecting, and a
    /// [`Listener`](crate::Listener) driven with the same loop would not
    /// see it. Other connections' events are logged and dropped.
    fn wait_connected(&mut self, ep: *mut ffi::fid_ep, timeout: Duration) -> Result<()> {
        // SAFETY: ep is a live endpoint; only its fid address is compared.
        let want = unsafe { &mut (*ep).fid as *mut ffi::fid };
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
