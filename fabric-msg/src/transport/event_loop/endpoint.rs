//! Opening endpoints, naming them, and inserting peers' addresses.

use super::overflow::{needs_sink, Sink};
use super::resources::EndpointState;
use super::state::EventLoop;
use super::types::{EndpointId, Peer};
use crate::discovery::probe::remove_stale_shm_region;
use crate::discovery::profile::Agreement;
use crate::error::{check, Error, Result};
use crate::ffi;
use crate::memory::domain::close_fid;
use crate::transport::address::check_name;
use std::ptr;

impl EventLoop {
    /// Open an endpoint. RDM: a reliable-datagram endpoint bound to this
    /// loop's CQ and AV, which reaches every peer. MSG: the loop's base
    /// endpoint, which `accept`/`connect` take; each connection then gets
    /// its own endpoint, named by [`Peer::endpoint`] — post there.
    pub fn open_endpoint(&mut self) -> Result<EndpointId> {
        let Some(av) = &self.objects.av else {
            self.endpoints
                .push(Some(EndpointState::new(ptr::null_mut(), self.framed())));
            return Ok(EndpointId(self.endpoints.len() as u32 - 1));
        };
        let av_raw = av.raw;
        // libfabric 1.17's shm names its region /dev/shm/<pid>:<n>:<n> and
        // cannot unlink it when the process is SIGKILLed; a later process
        // with the same pid then fails here with FI_EBUSY. Such a region is
        // garbage: unlink it and try again (the next try has the next name).
        let mut tries = 0;
        let raw = loop {
            match self.open_rdm(av_raw) {
                Err((Error::Fabric { code, .. }, Some(name)))
                    if code == ffi::FI_EBUSY && tries < 8 && remove_stale_shm_region(&name) =>
                {
                    tries += 1;
                }
                r => break r.map_err(|(e, _)| e)?,
            }
        };
        let state = EndpointState::new(raw, self.framed());
        self.endpoints.push(Some(state));
        let id = EndpointId(self.endpoints.len() as u32 - 1);
        if self.domain.profile.atomics_emulated() {
            // Peers' emulated atomics land here: keep receives posted.
            if let Err(e) = self.am_init(id) {
                let _ = self.close_endpoint(id);
                return Err(e);
            }
        }
        Ok(id)
    }

    /// Open, bind and enable an RDM endpoint. On failure the endpoint is
    /// closed, and its name (what `fi_getname` said before enabling) comes
    /// back with the error.
    fn open_rdm(
        &mut self,
        av: *mut ffi::fid_av,
    ) -> std::result::Result<*mut ffi::fid_ep, (Error, Option<Vec<u8>>)> {
        // The progress thread waits while the CQ gains an endpoint.
        let gate = self.progress_gate();
        let _gate = gate.as_ref().map(|g| g.lock());
        let mut raw = ptr::null_mut();
        // Receives on providers that fail on a message larger than its
        // receive get the overflow sink behind them (overflow.rs).
        let profile = &self.domain.profile;
        let context = if needs_sink(
            &profile.quirks,
            profile.iov_limit,
            self.domain.mr_mode(ffi::FI_MR_LOCAL),
        ) {
            Sink::get().map_or(ptr::null_mut(), Sink::context)
        } else {
            ptr::null_mut()
        };
        // SAFETY: the domain and its fi_info are alive (self.domain); the
        // context is null or the sink, which lives as long as the process.
        check("fi_endpoint", unsafe {
            ffi::fi_endpoint(self.domain.raw, self.domain.info_ptr(), &mut raw, context)
        })
        .map_err(|e| (e, None))?;
        let bind_flags = u64::from(ffi::FI_TRANSMIT | ffi::FI_RECV);
        let mut name = None;
        // SAFETY: raw is a fresh endpoint; the CQ and AV outlive it (the loop
        // closes endpoints first). On error the endpoint is closed here.
        let rc = unsafe {
            let mut rc = ffi::fi_ep_bind(raw, &mut (*self.objects.cq.raw).fid, bind_flags);
            if rc == 0 {
                rc = ffi::fi_ep_bind(raw, &mut (*av).fid, 0);
            }
            if rc == 0 {
                rc = ffi::fi_enable(raw);
            }
            // After fi_enable: libfabric 1.17's shm dereferences its shared
            // receive context in setopt, and that exists only once enabled.
            if let (0, Some(min)) = (rc, self.cfg.min_multi_recv) {
                rc = ffi::fi_setopt(
                    &mut (*raw).fid,
                    ffi::FI_OPT_ENDPOINT as i32,
                    ffi::FI_OPT_MIN_MULTI_RECV as i32,
                    (&min as *const usize).cast(),
                    std::mem::size_of::<usize>(),
                );
            }
            if rc != 0 {
                let mut buf = [0u8; 256];
                let mut len = buf.len();
                if ffi::fi_getname(&mut (*raw).fid, buf.as_mut_ptr().cast(), &mut len) == 0 {
                    name = Some(buf[..len.min(buf.len())].to_vec());
                }
                close_fid("endpoint", &mut (*raw).fid);
            }
            rc
        };
        check("fi_ep_bind/fi_enable", rc).map_err(|e| (e, name))?;
        Ok(raw)
    }

    /// The open endpoint `id`, or why it cannot be posted on. Every post
    /// asks, so the common answer (open, no peer ever lost) is inlined.
    #[inline]
    pub(crate) fn ep(&self, id: EndpointId) -> Result<&EndpointState> {
        if let Some(Some(ep)) = self.endpoints.get(id.0 as usize) {
            if !ep.raw.is_null() && self.lost.none() {
                return Ok(ep);
            }
        }
        self.ep_checked(id)
    }

    #[cold]
    fn ep_checked(&self, id: EndpointId) -> Result<&EndpointState> {
        // A lost peer's connection, still open for its grace.
        self.lost.check(id.0, ffi::FI_ADDR_UNSPEC)?;
        let ep = self
            .endpoints
            .get(id.0 as usize)
            .and_then(Option::as_ref)
            .ok_or_else(|| {
                self.lost.closed(id.0).unwrap_or_else(|| Error::Closed {
                    what: format!("endpoint {}", id.0),
                })
            })?;
        if ep.raw.is_null() {
            return Err(Error::Unsupported {
                what: "posting on a connected-endpoint loop's base endpoint (post on `peer.endpoint()`)"
                    .into(),
                provider: self.domain.profile.provider.clone(),
            });
        }
        Ok(ep)
    }

    /// The endpoint's address, to give to peers.
    pub fn endpoint_name(&self, id: EndpointId) -> Result<Vec<u8>> {
        let ep = self.ep(id)?;
        let mut name = vec![0u8; 256];
        loop {
            let mut len = name.len();
            // SAFETY: the endpoint is open; name has `len` writable bytes.
            let rc = unsafe { ffi::fi_getname(&mut (*ep.raw).fid, name.as_mut_ptr().cast(), &mut len) };
            if rc == -(ffi::FI_ETOOSMALL as i32) && len > name.len() {
                name.resize(len, 0);
                continue;
            }
            check("fi_getname", rc)?;
            name.truncate(len);
            return Ok(name);
        }
    }

    /// Refuse a peer's endpoint name that libfabric could not read safely:
    /// empty, of the wrong length or family for the provider's address
    /// format, or an unterminated string ([`check_name`]).
    pub(crate) fn check_peer_name(&self, own: &[u8], name: &[u8], whose: &str) -> Result<()> {
        // SAFETY: the domain keeps its fi_info alive.
        let format = unsafe { (*self.domain.info_ptr()).addr_format };
        check_name(format, own, name).map_err(|why| {
            Error::PeerMismatch(format!(
                "{whose} address is not one {} can use: {why}; it is not from the same provider, or it \
                 was damaged or forged on the way",
                self.domain.profile.provider
            ))
        })
    }

    /// Insert a peer's address (from its [`EventLoop::endpoint_name`]). The name is
    /// checked before libfabric sees it.
    pub fn insert_peer(&mut self, id: EndpointId, name: &[u8], agreement: Agreement) -> Result<Peer> {
        let own = self.endpoint_name(id)?;
        self.check_peer_name(&own, name, "the peer's")?;
        let av = self.objects.av.as_ref().ok_or(Error::Closed {
            what: "address vector".into(),
        })?;
        let mut addr: ffi::fi_addr_t = ffi::FI_ADDR_NOTAVAIL;
        let gate = self.progress_gate();
        let _gate = gate.as_ref().map(|g| g.lock());
        // SAFETY: av is open; `name` is a readable address of the provider's
        // format (the peer's fi_getname); one address is inserted into `addr`.
        let rc = unsafe { ffi::fi_av_insert(av.raw, name.as_ptr().cast(), 1, &mut addr, 0, ptr::null_mut()) };
        if rc != 1 {
            return Err(if rc < 0 {
                Error::from_rc("fi_av_insert", rc.into())
            } else {
                Error::PeerMismatch(format!(
                    "fi_av_insert accepted none of the peer's {}-byte address: is it from the same provider?",
                    name.len()
                ))
            });
        }
        self.am.peers.record(name, addr);
        Ok(Peer {
            endpoint: id,
            addr,
            agreement,
        })
    }

    /// Insert many peers' addresses in one `fi_av_insert` call, in order:
    /// the `Peer` at index `i` is `names[i]`. Every name is checked before
    /// libfabric sees it (length and family for socket addresses, a
    /// terminated printable string for string addresses), so a short, empty
    /// or unterminated name from a peer is an error naming its index, not a
    /// read past its end.
    pub fn insert_peers(
        &mut self,
        id: EndpointId,
        names: &[Vec<u8>],
        agreements: &[Agreement],
    ) -> Result<Vec<Peer>> {
        let own = self.endpoint_name(id)?;
        if names.len() != agreements.len() {
            return Err(Error::Usage(format!(
                "insert_peers: {} names but {} agreements",
                names.len(),
                agreements.len()
            )));
        }
        for (i, n) in names.iter().enumerate() {
            self.check_peer_name(&own, n, &format!("address {i}:"))?;
        }
        let av = self.objects.av.as_ref().ok_or(Error::Closed {
            what: "address vector".into(),
        })?;
        let packed: Vec<u8> = names.concat();
        let mut addrs: Vec<ffi::fi_addr_t> = vec![ffi::FI_ADDR_NOTAVAIL; names.len()];
        let gate = self.progress_gate();
        let _gate = gate.as_ref().map(|g| g.lock());
        // SAFETY: av is open; `packed` holds names.len() well-formed
        // addresses of the provider's format back to back (checked above:
        // each is read to its own length or NUL), and `addrs` has room for
        // one fi_addr_t each.
        let rc = unsafe {
            ffi::fi_av_insert(
                av.raw,
                packed.as_ptr().cast(),
                names.len(),
                addrs.as_mut_ptr(),
                0,
                ptr::null_mut(),
            )
        };
        if rc < 0 {
            return Err(Error::from_rc("fi_av_insert", rc.into()));
        }
        if let Some(i) = addrs.iter().position(|a| *a == ffi::FI_ADDR_NOTAVAIL) {
            return Err(Error::PeerMismatch(format!(
                "fi_av_insert took {rc} of {} addresses; address {i} was refused",
                names.len()
            )));
        }
        drop(_gate);
        for (name, &addr) in names.iter().zip(&addrs) {
            self.am.peers.record(name, addr);
        }
        Ok(addrs
            .into_iter()
            .zip(agreements)
            .map(|(addr, agreement)| Peer {
                endpoint: id,
                addr,
                agreement: *agreement,
            })
            .collect())
    }
}
