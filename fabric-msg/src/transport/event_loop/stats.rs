//! Counters a user can read ([`EventLoop::stats`](super::EventLoop::stats)): messages and bytes
//! each way, in total and per peer; the send backlog; retries on a full
//! queue; truncations; lost peers; emulated atomics.
//!
//! Cheap by design: loop-local integers (the loop is used through `&mut`),
//! no allocation on the hot path. A peer's counters sit in a `Vec` indexed
//! by its `fi_addr_t` (an index on the address-vector tables tcp;ofi_rxm,
//! shm and verbs;ofi_rxm use) or, on connected (MSG) endpoints, by its
//! endpoint; the `Vec`s grow when a peer is inserted, never while posting.
//! A peer whose address is no small index (an `FI_AV_MAP` address) is
//! counted in the totals only.
//!
//! What counts: a message is a send, inject or receive of the application
//! that completed successfully (one-sided reads, writes and atomics are
//! not messages; emulated atomics have their own counters). A receive's
//! peer is known where the provider reports sources (`FI_SOURCE`) or the
//! receive named its sender; otherwise it is counted in
//! [`LoopStats::received_from_unknown`].

use super::am_state::AtomicCounters;
use super::types::EndpointId;
use crate::ffi;
use std::time::Duration;

/// Addresses up to this are counted per peer: AV tables hand out indexes
/// from 0, so this covers a million peers at 32 bytes each, allocated only
/// as far as the largest address inserted.
const MAX_INDEXED: u64 = 1 << 20;

/// Messages and bytes (payload, without fabric-msg's header).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Traffic {
    /// Messages.
    pub messages: u64,
    /// Their payload bytes.
    pub bytes: u64,
}

impl Traffic {
    #[inline]
    fn add(&mut self, bytes: usize) {
        self.messages += 1;
        self.bytes += bytes as u64;
    }
}

/// One peer's traffic with this loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerStats {
    /// The endpoint: for an RDM loop the first one the peer was inserted
    /// on; for a connection, the connection's own.
    pub endpoint: EndpointId,
    /// The peer's address on an RDM endpoint ([`Peer::fi_addr`](super::Peer::fi_addr));
    /// `FI_ADDR_UNSPEC` for a connection.
    pub addr: u64,
    /// Messages to the peer.
    pub sent: Traffic,
    /// Messages from the peer.
    pub received: Traffic,
}

/// What [`EventLoop::stats`](super::EventLoop::stats) reports.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LoopStats {
    /// Every message sent (sends and injects that completed).
    pub sent: Traffic,
    /// Every message received.
    pub received: Traffic,
    /// Of `received`, those whose sender the loop does not know.
    pub received_from_unknown: Traffic,
    /// Per peer with any traffic, by endpoint and address.
    pub peers: Vec<PeerStats>,
    /// Sends waiting in the backlog now (the provider had no room).
    pub backlogged: usize,
    /// The longest any send waited in the backlog before it was posted.
    pub longest_backlog_wait: Duration,
    /// Posts the provider refused for lack of room (`FI_EAGAIN`, or a
    /// receive's `FI_ENOMEM`) and that were tried again or backlogged.
    pub retries: u64,
    /// Receives that completed with [`CompletionError::Truncated`](super::CompletionError::Truncated).
    pub truncations: u64,
    /// Peers given up on (lifelines' verdicts; departures not counted).
    pub lost_peers: usize,
    /// Peers' emulated atomics applied and refused here, and forged
    /// replies (docs/atomics.md).
    pub atomics: AtomicCounters,
}

/// The counters as the loop keeps them.
#[derive(Default)]
pub(super) struct Stats {
    sent: Traffic,
    received: Traffic,
    unknown: Traffic,
    /// RDM peers by `fi_addr_t`: (endpoint + 1, sent, received); 0: no peer.
    by_addr: Vec<(u32, Traffic, Traffic)>,
    /// Connections by endpoint.
    by_endpoint: Vec<(Traffic, Traffic)>,
    pub(super) longest_wait: Duration,
    pub(super) retries: u64,
    pub(super) truncations: u64,
}

impl Stats {
    /// A peer was inserted (not on the data path): make room for its counters.
    pub(super) fn peer_inserted(&mut self, endpoint: u32, addr: u64) {
        if addr < MAX_INDEXED {
            let i = addr as usize;
            if self.by_addr.len() <= i {
                self.by_addr
                    .resize(i + 1, (0, Traffic::default(), Traffic::default()));
            }
            if self.by_addr[i].0 == 0 {
                self.by_addr[i].0 = endpoint + 1;
            }
        }
    }

    /// A connection was opened.
    pub(super) fn connection_opened(&mut self, endpoint: u32) {
        let i = endpoint as usize;
        if self.by_endpoint.len() <= i {
            self.by_endpoint.resize(i + 1, Default::default());
        }
        self.by_endpoint[i] = Default::default();
    }

    /// A message of `bytes` went to `addr` on `endpoint`. (`FI_ADDR_UNSPEC`,
    /// a connection's, is past the end of `by_addr`.)
    #[inline]
    pub(super) fn sent(&mut self, endpoint: u32, addr: u64, bytes: usize) {
        self.sent.add(bytes);
        if let Some(p) = self.by_addr.get_mut(addr as usize) {
            p.1.add(bytes);
        } else if let Some(p) = self.by_endpoint.get_mut(endpoint as usize) {
            p.0.add(bytes);
        }
    }

    /// A message of `bytes` came from `addr` on `endpoint`: the source the
    /// provider reported, or the sender the receive named, or
    /// `FI_ADDR_UNSPEC` (unknown, or a connection's).
    #[inline]
    pub(super) fn received(&mut self, endpoint: u32, addr: u64, bytes: usize) {
        self.received.add(bytes);
        if let Some(p) = self.by_addr.get_mut(addr as usize) {
            p.2.add(bytes);
        } else if let Some(p) = self.by_endpoint.get_mut(endpoint as usize) {
            p.1.add(bytes);
        } else {
            self.unknown.add(bytes);
        }
    }
}

impl Stats {
    /// The counters as [`LoopStats`], with what the loop's other parts
    /// know: sends waiting now, lost peers, emulated atomics.
    pub(super) fn report(&self, backlogged: usize, lost_peers: usize, atomics: AtomicCounters) -> LoopStats {
        let rdm = self
            .by_addr
            .iter()
            .enumerate()
            .filter(|(_, (ep, sent, received))| *ep != 0 && (sent.messages | received.messages) != 0)
            .map(|(addr, (ep, sent, received))| PeerStats {
                endpoint: EndpointId(ep - 1),
                addr: addr as u64,
                sent: *sent,
                received: *received,
            });
        let connected = self
            .by_endpoint
            .iter()
            .enumerate()
            .filter(|(_, (sent, received))| (sent.messages | received.messages) != 0)
            .map(|(ep, (sent, received))| PeerStats {
                endpoint: EndpointId(ep as u32),
                addr: ffi::FI_ADDR_UNSPEC,
                sent: *sent,
                received: *received,
            });
        LoopStats {
            sent: self.sent,
            received: self.received,
            received_from_unknown: self.unknown,
            peers: rdm.chain(connected).collect(),
            backlogged,
            longest_backlog_wait: self.longest_wait,
            retries: self.retries,
            truncations: self.truncations,
            lost_peers,
            atomics,
        }
    }
}
