//! Opening endpoints, naming them, and inserting peers' addresses.

use super::overflow::{needs_sink, Sink};
use super::resources::EndpointState;
use super::state::EventLoop;
use super::types::{EndpointId, Peer};
use crate::discovery::probe::remove_stale_shm_region;
use crate::discovery::profile::Agreement;
use crate::error::{Error, Result};
use crate::ffi;
use crate::libfabric::{Av, Endpoint, RawEndpoint};
use crate::transport::address::check_name;
use std::ptr;
use std::sync::Arc;

impl EventLoop {
    /// Open an endpoint. RDM: a reliable-datagram endpoint bound to this
    /// loop's CQ and AV, which reaches every peer. MSG: the loop's base
    /// endpoint, which `accept`/`connect` take; each connection then gets
    /// its own endpoint, named by [`Peer::endpoint`] — post there.
    pub fn open_endpoint(&mut self) -> Result<EndpointId> {
        let Some(av) = self.objects.av.clone() else {
            self.endpoints.push(Some(EndpointState::new(None, self.framed())));
            return Ok(EndpointId(self.endpoints.len() as u32 - 1));
        };
        // libfabric 1.17's shm names its region /dev/shm/<pid>:<n>:<n> and
        // cannot unlink it when the process is SIGKILLed; a later process
        // with the same pid then fails here with FI_EBUSY. Such a region is
        // garbage: unlink it and try again (the next try has the next name).
        let mut tries = 0;
        let endpoint = loop {
            match self.open_rdm(&av) {
                Err((Error::Fabric { code, .. }, Some(name)))
                    if code == ffi::FI_EBUSY && tries < 8 && remove_stale_shm_region(&name) =>
                {
                    tries += 1;
                }
                r => break r.map_err(|(e, _)| e)?,
            }
        };
        let state = EndpointState::new(Some(endpoint), self.framed());
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
    fn open_rdm(&mut self, av: &Arc<Av>) -> std::result::Result<Endpoint, (Error, Option<Vec<u8>>)> {
        // The progress thread waits while the CQ gains an endpoint.
        let gate = self.progress_gate();
        let _gate = gate.as_ref().map(|g| g.lock());
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
        // SAFETY: the context is null or the sink, which lives as long as
        // the process.
        let mut ep = unsafe { Endpoint::open(&self.domain.domain, self.domain.info(), context) }
            .map_err(|e| (e, None))?;
        let bind_flags = u64::from(ffi::FI_TRANSMIT | ffi::FI_RECV);
        // `FI_OPT_MIN_MULTI_RECV` before fi_enable on libfabric 2.x, after
        // it on 1.x. From 2.0 shm and rxm copy the option into their shared
        // receive context when it is made, in fi_enable (`smr_ep_ctrl`,
        // `rxm_ep_ctrl`), and a later setopt only changes the endpoint's own
        // copy: every buffer went back after one message. Up to 1.22 shm's
        // setopt writes through its shared receive context, which exists
        // only once enabled (before it, a null dereference).
        let (early, late) = match self.cfg.min_multi_recv {
            Some(min) if self.domain.profile.libfabric_version.0 >= 2 => (Some(min), None),
            min => (None, min),
        };
        let set_up = ep
            .bind_cq(&self.objects.cq, bind_flags)
            .and_then(|()| ep.bind_av(av))
            .and_then(|()| early.map_or(Ok(()), |min| ep.set_min_multi_recv(min)))
            .and_then(|()| ep.enable())
            .and_then(|()| late.map_or(Ok(()), |min| ep.set_min_multi_recv(min)));
        match set_up {
            Ok(()) => Ok(ep),
            // `ep` closes as it drops here.
            Err(e) => Err((e, ep.name().ok())),
        }
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

    /// The handle of endpoint `id` if it is open, without the checks
    /// `ep` makes for the application's posts: for the loop's own posts
    /// (emulated atomics' receives and replies), which stop where an
    /// endpoint closed (a lost peer's connection closes before its entry
    /// goes).
    pub(super) fn open_raw(&self, id: u32) -> Option<RawEndpoint> {
        match self.endpoints.get(id as usize) {
            Some(Some(ep)) if !ep.raw.is_null() => Some(ep.raw),
            _ => None,
        }
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
        ep.endpoint
            .as_ref()
            .ok_or_else(|| Error::Closed {
                what: format!("endpoint {}", id.0),
            })?
            .name()
    }

    /// Refuse a peer's endpoint name that libfabric could not read safely:
    /// empty, of the wrong length or family for the provider's address
    /// format, or an unterminated string ([`check_name`]).
    pub(crate) fn check_peer_name(&self, own: &[u8], name: &[u8], whose: &str) -> Result<()> {
        let format = self.domain.info().get().addr_format;
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
        let mut addr = [ffi::FI_ADDR_NOTAVAIL];
        let gate = self.progress_gate();
        let _gate = gate.as_ref().map(|g| g.lock());
        // SAFETY: `name` is a well-formed address of the provider's format
        // (checked above).
        if unsafe { av.insert(name, &mut addr)? } != 1 {
            return Err(Error::PeerMismatch(format!(
                "fi_av_insert accepted none of the peer's {}-byte address: is it from the same provider?",
                name.len()
            )));
        }
        let addr = addr[0];
        self.am.peers.record(name, addr);
        self.stats.peer_inserted(id.0, addr);
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
        // SAFETY: `packed` holds names.len() well-formed addresses of the
        // provider's format back to back (checked above: each is read to
        // its own length or NUL).
        let rc = unsafe { av.insert(&packed, &mut addrs)? };
        if let Some(i) = addrs.iter().position(|a| *a == ffi::FI_ADDR_NOTAVAIL) {
            return Err(Error::PeerMismatch(format!(
                "fi_av_insert took {rc} of {} addresses; address {i} was refused",
                names.len()
            )));
        }
        drop(_gate);
        for (name, &addr) in names.iter().zip(&addrs) {
            self.am.peers.record(name, addr);
            self.stats.peer_inserted(id.0, addr);
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
