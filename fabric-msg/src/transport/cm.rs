//! Connected (MSG) endpoints: the event queue, the passive endpoint and
//! `fi_connect` / `fi_accept`.
//!
//! On fabrics that offer only connected endpoints (raw `verbs`, notably on
//! iWARP) every connection is its own endpoint, bound to the loop's one CQ.
//! The bootstrap calls these after the out-of-band handshake, so that
//! `connect` and `Listener::accept` look the same on every fabric; the
//! returned `Peer` names the connection's endpoint.

use crate::error::{check, Error, Result};
use crate::ffi;
use crate::memory::domain::close_fid;
use crate::transport::eq::{CmEvent, Eq, Pep};
use crate::transport::event_loop::{EndpointId, EndpointState, EventLoop};
use std::ptr;
use std::time::{Duration, Instant};

/// Posts receives on a new endpoint before its connection starts.
pub(crate) type Prepost<'a> = &'a mut dyn FnMut(&mut EventLoop, EndpointId) -> Result<()>;

impl EventLoop {
    fn eq(&self) -> Result<&Eq> {
        self.eq.as_ref().ok_or_else(|| Error::Unsupported {
            what: "connected (MSG) endpoints on a profile negotiated for RDM".into(),
            provider: self.domain.profile.provider.clone(),
        })
    }

    /// The passive endpoint's address, listening (opened on first use).
    pub(crate) fn msg_listen(&mut self) -> Result<Vec<u8>> {
        if let Some(p) = &self.pep {
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
        self.pep = Some(pep);
        Ok(name)
    }

    /// Open an endpoint from `info`, bound to the loop's CQ and EQ.
    fn msg_endpoint(&mut self, info: *mut ffi::fi_info) -> Result<*mut ffi::fid_ep> {
        let eq = self.eq()?.raw;
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
                rc = ffi::fi_ep_bind(ep, &mut (*self.cq.raw).fid, flags);
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

    /// Wait for the next connection request on the passive endpoint and
    /// accept it; `prepost` runs on the enabled endpoint before `fi_accept`.
    pub(crate) fn msg_accept(&mut self, timeout: Duration, prepost: Prepost<'_>) -> Result<EndpointId> {
        // Events of earlier connections may come first: a connection the
        // provider ended (tcp ends one over a refused one-sided access)
        // reports its shutdown here, and a new request follows it.
        let deadline = Instant::now() + timeout;
        let info = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.eq()?.next(left)? {
                CmEvent::ConnReq { info } => break info,
                CmEvent::Shutdown { fid } => {
                    log::debug!("msg_accept: an earlier connection ({fid:?}) was shut down");
                }
                CmEvent::Connected { fid } => {
                    log::debug!("msg_accept: a late connected event ({fid:?}) before the request");
                }
            }
        };
        let ep = self.msg_endpoint(info);
        // SAFETY: the connreq's info was allocated by the provider for us to free.
        unsafe { ffi::fi_freeinfo(info) };
        let ep = ep?;
        let id = self.adopt(ep);
        self.enable_and_prepost(ep, id, prepost)?;
        // SAFETY: ep was opened from the request's info, bound and enabled.
        check("fi_accept", unsafe { ffi::fi_accept(ep, ptr::null(), 0) })?;
        self.wait_connected(ep, timeout)?;
        Ok(id)
    }

    /// Connect a new endpoint to a listening peer's passive endpoint `name`;
    /// `prepost` runs on the enabled endpoint before `fi_connect`.
    pub(crate) fn msg_connect(
        &mut self,
        name: &[u8],
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
        // SAFETY: ep is bound and enabled; name is the peer's address in this
        // provider's format, read for the duration of the call.
        check("fi_connect", unsafe {
            ffi::fi_connect(ep, name.as_ptr().cast(), ptr::null(), 0)
        })?;
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
        // SAFETY: ep is open and bound to its CQ and EQ.
        check("fi_enable", unsafe { ffi::fi_enable(ep) })?;
        prepost(self, id)
    }

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
                CmEvent::ConnReq { info } => {
                    // Nobody did a handshake for this one (ours is under
                    // way): refuse it, and free its info.
                    log::warn!("refusing a connection request that arrived without a handshake");
                    if let Some(pep) = &self.pep {
                        // SAFETY: info is the provider's request, live until
                        // freed just below; the pep is listening.
                        unsafe { ffi::fi_reject(pep.raw, (*info).handle, ptr::null(), 0) };
                    }
                    // SAFETY: the request's info is ours to free, once.
                    unsafe { ffi::fi_freeinfo(info) };
                }
                _ => continue,
            }
        }
    }
}
