//! What carries messages between the ranks of one node beside the World's
//! fabric ([`Side`]): fabric-msg's own same-node transport
//! (`transport/node`, the default) or a second libfabric loop on `shm`
//! (`FABRIC_MSG_SHM=libfabric`); and one way to post to a peer on
//! whichever loop carries it ([`Lane`]), so the World's sends, the
//! collectives and the failure notices need not know which it is.
//!
//! A [`NodeLoop`]'s completions become the World's [`Completion`]s here:
//! on the endpoint [`NODE_ENDPOINT`], with the sender's world rank as
//! their source (a ring has one writer, so the sender is known for
//! certain).

use crate::error::{Error, Result};
use crate::memory::buffer::Buffer;
use crate::transport::event_loop::{
    Completion, CompletionError, EndpointId, EventLoop, LoopStats, OpKind, Peer, PeerStats, PostError,
    RecvOpts, SendOpts, Token, Traffic,
};
use crate::transport::node::node_loop::LentDone;
use crate::transport::node::sleeping::Announced;
use crate::transport::node::slots::Slots;
use crate::transport::node::{NodeCompletion, NodeLoop};
use std::os::fd::RawFd;
use std::time::Duration;

/// The endpoint number a same-node loop's completions carry: no
/// libfabric endpoint has it.
pub(crate) const NODE_ENDPOINT: u32 = u32::MAX;

/// Empty looks at the node loop between two asks whether a same-node
/// rank's process ended (`NodeLoop::check_peers`, one `poll(2)` per
/// peer).
const CHECK_EVERY: u32 = 1024;

/// The loop for ranks on this node. One per World, made once and never
/// moved on a hot path, so the variants' sizes need not match.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)]
pub(crate) enum Side {
    /// libfabric's shm provider: its loop, endpoint, and by world rank the
    /// peer of each rank it carries.
    Shm {
        ev: EventLoop,
        ep: EndpointId,
        peers: Vec<Option<Peer>>,
    },
    /// fabric-msg's own rings.
    Node(NodeSide),
}

/// A [`NodeLoop`] and the World's ranks on it.
#[derive(Debug)]
pub(crate) struct NodeSide {
    pub(crate) nl: NodeLoop,
    /// By world rank: its index on the node, for the ranks this loop
    /// carries.
    index: Vec<Option<usize>>,
    /// By node index: its world rank.
    world: Vec<u32>,
    /// The node loop's finished operations, converted in `poll_now`.
    done: Vec<NodeCompletion>,
    /// The same, of operations on lent memory (the collectives' zero copy).
    lent: Vec<LentDone>,
    /// Receives taken back by `cancel`: their completions come with the
    /// next look, as a libfabric loop's would.
    cancelled: Vec<Completion>,
    /// Tokens of the receives posted for the collectives' failure notices
    /// (`collectives/notice.rs`): they stay posted for the World's life
    /// and complete only if a collective fails, so a wait does not count
    /// them as something the node loop may finish (`Side::awaits`).
    standing: Vec<Token>,
    idle_looks: u32,
    /// By node index: messages sent to it and received from it.
    traffic: Vec<(Traffic, Traffic)>,
    truncations: u64,
}

impl NodeSide {
    /// `nl`, connected to the ranks in `carried` (world ranks), whose
    /// node indices are their places in `node_ranks`.
    pub(crate) fn new(nl: NodeLoop, size: u32, node_ranks: &[u32], carried: &[u32]) -> NodeSide {
        let mut index = vec![None; size as usize];
        for &r in carried {
            index[r as usize] = node_ranks.iter().position(|&n| n == r);
        }
        NodeSide {
            nl,
            index,
            world: node_ranks.to_vec(),
            done: Vec::new(),
            lent: Vec::new(),
            cancelled: Vec::new(),
            standing: Vec::new(),
            idle_looks: 0,
            traffic: vec![Default::default(); node_ranks.len()],
            truncations: 0,
        }
    }

    /// The operation under `token` is no longer posted: if it was a
    /// standing receive, it stands no more.
    #[inline]
    fn stood(&mut self, token: Token) {
        if let Some(i) = self.standing.iter().position(|t| *t == token) {
            self.standing.swap_remove(i);
        }
    }

    fn completion(&mut self, n: NodeCompletion) -> Completion {
        let len = n.buffer.len();
        let mut c = self.finished(n.token, n.kind, (n.peer, n.tag), n.result, len);
        c.buffer = Some(n.buffer);
        c
    }

    /// An operation on lent memory: no buffer; a receive's length where a
    /// libfabric loop's borrowed receive puts it (`multi`, at offset 0).
    fn lent_completion(&mut self, d: LentDone) -> Completion {
        let mut c = self.finished(d.token, d.kind, (d.peer, d.tag), d.result, d.len);
        if d.kind == OpKind::Recv {
            c.multi = Some((0, d.len));
        }
        c
    }

    /// A finished node-loop operation of `len` bytes with node index
    /// `peer`, counted in the traffic, as the World's completion.
    fn finished(
        &mut self,
        token: Token,
        kind: OpKind,
        (peer, tag): (usize, u64),
        result: std::result::Result<(), CompletionError>,
        len: usize,
    ) -> Completion {
        let count = |t: &mut Traffic, bytes: usize| {
            t.messages += 1;
            t.bytes += bytes as u64;
        };
        if let Some((sent, received)) = self.traffic.get_mut(peer) {
            match (&result, kind) {
                (Ok(()), OpKind::Send) => count(sent, len),
                (Ok(()), _) => count(received, len),
                (Err(CompletionError::Truncated { .. }), _) => self.truncations += 1,
                _ => {}
            }
        }
        let mut c = Completion::outcome(token, NODE_ENDPOINT, kind, result);
        c.tag = tag;
        if kind == OpKind::Recv {
            c.source = self.world.get(peer).map(|&r| u64::from(r));
        }
        c
    }

    /// Counters in the form of a libfabric loop's: each peer's address is
    /// its world rank.
    fn stats(&self) -> LoopStats {
        let mut s = LoopStats {
            truncations: self.truncations,
            ..LoopStats::default()
        };
        for (i, &(sent, received)) in self.traffic.iter().enumerate() {
            s.sent.messages += sent.messages;
            s.sent.bytes += sent.bytes;
            s.received.messages += received.messages;
            s.received.bytes += received.bytes;
            s.peers.push(PeerStats {
                endpoint: EndpointId(NODE_ENDPOINT),
                addr: u64::from(self.world[i]),
                sent,
                received,
            });
        }
        s
    }
}

impl Side {
    /// The loop's counters.
    pub(crate) fn stats(&self) -> LoopStats {
        match self {
            Side::Shm { ev, .. } => ev.stats(),
            Side::Node(n) => n.stats(),
        }
    }

    /// The traffic with `rank` in `stats` (`Side::stats`), if this loop
    /// carries it: (sent, received).
    pub(crate) fn traffic_with(&self, stats: &LoopStats, rank: u32) -> Option<(Traffic, Traffic)> {
        // A libfabric peer with an AV address is known by it alone; one
        // without (connected endpoints) by its endpoint.
        let (endpoint, addr, by_addr) = match self {
            Side::Shm { peers, .. } => {
                let p = peers.get(rank as usize)?.as_ref()?;
                (
                    p.endpoint(),
                    p.fi_addr(),
                    p.fi_addr() != crate::ffi::FI_ADDR_UNSPEC,
                )
            }
            Side::Node(_) => (EndpointId(NODE_ENDPOINT), u64::from(rank), false),
        };
        stats
            .peers
            .iter()
            .find(|p| p.addr == addr && (p.endpoint == endpoint || by_addr))
            .map(|p| (p.sent, p.received))
    }

    /// Every rank's collective slots, by world rank, if this loop carries
    /// every rank of a world of `size` (`collectives/on_node.rs`); none
    /// on libfabric's shm.
    pub(crate) fn slots_of_all(&self, size: u32) -> Option<Vec<Slots>> {
        (0..size).map(|w| self.slots_of(w)).collect()
    }

    /// World rank `w`'s collective slots in its node segment, if this
    /// loop carries `w` (this rank's own included); none on libfabric's
    /// shm.
    pub(crate) fn slots_of(&self, w: u32) -> Option<Slots> {
        let Side::Node(n) = self else { return None };
        let i = n.index.get(w as usize).copied().flatten()?;
        n.nl.slots(i).cloned()
    }

    /// Whether this loop carries `rank`'s messages.
    pub(crate) fn carries(&self, rank: u32) -> bool {
        match self {
            Side::Shm { peers, .. } => peers.get(rank as usize).is_some_and(Option::is_some),
            Side::Node(n) => n.index.get(rank as usize).is_some_and(Option::is_some),
        }
    }

    /// The lane to `rank`, which this loop carries (`carries`).
    pub(crate) fn lane(&mut self, rank: u32) -> Option<Lane<'_>> {
        match self {
            Side::Shm { ev, ep, peers } => {
                let peer = peers.get(rank as usize)?.as_ref()?;
                Some(Lane::Fabric { ev, ep: *ep, peer })
            }
            Side::Node(n) => {
                let peer = (*n.index.get(rank as usize)?)?;
                Some(Lane::Node { nl: &mut n.nl, peer })
            }
        }
    }

    /// Whether receives with a masked tag must not be posted here
    /// (libfabric's shm before 1.19: `Profile::tag_mask_defect`).
    pub(crate) fn exact_only(&self) -> bool {
        match self {
            Side::Shm { ev, .. } => ev.profile().tag_mask_defect.is_some(),
            Side::Node(_) => false,
        }
    }

    /// Whether messages are framed, so nothing is sent from or received
    /// into borrowed memory (the collectives' zero copy). The node loop
    /// sends from and receives into lent memory (`transport/node/lent.rs`).
    pub(crate) fn framed(&self) -> bool {
        match self {
            Side::Shm { ev, .. } => ev.framed(),
            Side::Node(_) => false,
        }
    }

    /// The largest message [`Lane::inject`] sends.
    pub(crate) fn inject_max(&self) -> usize {
        match self {
            Side::Shm { ev, .. } => ev.inject_max(),
            Side::Node(n) => n.nl.max_frame(),
        }
    }

    /// `EventLoop::set_fail_fast` for shm; the node loop never refuses a
    /// send (what finds no room waits in its queue).
    pub(crate) fn set_fail_fast(&mut self, on: bool) {
        if let Side::Shm { ev, .. } = self {
            ev.set_fail_fast(on);
        }
    }

    /// Post a receive for a message whose World tag matches `want`, in
    /// message class `class`.
    pub(crate) fn post(
        &mut self,
        class: u64,
        want: (u64, u64),
        buf: Buffer,
        token: Token,
    ) -> std::result::Result<(), PostError> {
        match self {
            Side::Shm { ev, ep, .. } => fabric_recv(ev, *ep, class, want, buf, token),
            Side::Node(n) => {
                node_recv(&mut n.nl, want, buf, token)?;
                if want == super::tags::notice_matcher() {
                    n.standing.push(token);
                }
                Ok(())
            }
        }
    }

    /// Post the node loop's part of a receive from any rank whose other
    /// part goes on the main loop (`transport/node/paired.rs`): true if a
    /// message that came before it matched it now (the other part is then
    /// not needed). On libfabric's shm, an ordinary receive.
    pub(crate) fn post_paired(
        &mut self,
        class: u64,
        want: (u64, u64),
        buf: Buffer,
        token: Token,
    ) -> std::result::Result<bool, PostError> {
        match self {
            Side::Node(n) => (n.nl.recv_paired(want.0, want.1, buf, token))
                .map_err(|error| PostError { error, buffer: None }),
            Side::Shm { .. } => self.post(class, want, buf, token).map(|()| false),
        }
    }

    /// Paired receives a message waits for an answer about (into `out`).
    pub(crate) fn take_asked(&mut self, out: &mut Vec<Token>) {
        if let Side::Node(n) = self {
            n.nl.take_asked(out);
        }
    }

    /// Let the paired receive `token` take messages (`paired.rs`).
    pub(crate) fn unpair(&mut self, token: Token) {
        if let Side::Node(n) = self {
            n.nl.unpair(token);
        }
    }

    /// Take back the receive posted with `token`: it completes cancelled
    /// at a later look, unless a message matched it first.
    pub(crate) fn cancel(&mut self, token: Token) -> Result<()> {
        match self {
            Side::Shm { ev, ep, .. } => ev.cancel_recv(*ep, token).map(drop),
            Side::Node(n) => {
                n.stood(token);
                if let Some(buf) = n.nl.cancel_recv(token) {
                    let mut c = Completion::outcome(
                        token,
                        NODE_ENDPOINT,
                        OpKind::Recv,
                        Err(CompletionError::Cancelled),
                    );
                    c.buffer = Some(buf);
                    n.cancelled.push(c);
                }
                Ok(())
            }
        }
    }

    /// One look without waiting: `out` is cleared, then holds what
    /// finished.
    pub(crate) fn poll_now(&mut self, out: &mut Vec<Completion>) -> Result<usize> {
        match self {
            Side::Shm { ev, .. } => ev.poll(out, Some(Duration::ZERO)),
            Side::Node(n) => {
                out.clear();
                out.append(&mut n.cancelled);
                let mut done = std::mem::take(&mut n.done);
                if n.nl.poll(&mut done) == 0 {
                    n.idle_looks += 1;
                    if n.idle_looks >= CHECK_EVERY {
                        n.idle_looks = 0;
                        n.nl.check_peers();
                    }
                } else {
                    n.idle_looks = 0;
                }
                for c in done.drain(..) {
                    let c = n.completion(c);
                    n.stood(c.token);
                    out.push(c);
                }
                n.done = done;
                let mut lent = std::mem::take(&mut n.lent);
                n.nl.take_lent(&mut lent);
                for d in lent.drain(..) {
                    let c = n.lent_completion(d);
                    out.push(c);
                }
                n.lent = lent;
                Ok(out.len())
            }
        }
    }

    /// Pass the time when the loops had nothing: sleep on the node
    /// loop's doorbell for at most `slice` (a peer's frame wakes it at
    /// once; the main loop's completions wait for the slice's end), or
    /// yield where the same-node loop is libfabric's (no one fd serves
    /// both loops).
    pub(crate) fn sleep(&self, slice: Duration) {
        self.sleep_unless(slice, || false);
    }

    /// [`Side::sleep`], waking at once also if `came` says so once the
    /// doorbell is armed (`NodeLoop::sleep_unless`).
    pub(crate) fn sleep_unless(&self, slice: Duration, came: impl FnOnce() -> bool) {
        match self {
            Side::Shm { .. } => std::thread::yield_now(),
            Side::Node(n) if n.cancelled.is_empty() => n.nl.sleep_unless(slice, came),
            Side::Node(_) => {}
        }
    }

    /// Sleep on the node loop's doorbell and `other` (the main loop's wait
    /// fd) at once, for at most `slice`: a frame from a same-node peer or
    /// a completion on the main loop ends it. False, without sleeping,
    /// where this loop cannot (libfabric's shm; a node peer that could not
    /// take the doorbell's eventfd: `NodeLoop::can_sleep_beside`).
    pub(crate) fn sleep_beside(&self, other: RawFd, slice: Duration) -> bool {
        match self {
            Side::Node(n) if n.nl.can_sleep_beside() => {
                if n.cancelled.is_empty() {
                    n.nl.sleep_beside(other, slice, || false);
                }
                true
            }
            _ => false,
        }
    }

    /// Announce a wait on the node loop's doorbell that the caller runs
    /// (`NodeLoop::arm`; dropping the answer takes it back); `None` for
    /// libfabric's shm, a node peer that could not take the eventfd, or a
    /// cancel whose completion the next look brings.
    #[cfg_attr(not(feature = "tokio"), allow(dead_code))] // the awaited waits arm it
    pub(crate) fn arm(&self) -> Option<Announced> {
        match self {
            Side::Node(n) if n.cancelled.is_empty() => n.nl.arm(),
            _ => None,
        }
    }

    /// Whether an operation on this loop may complete: a send still queued
    /// or a receive posted on the node loop, other than the standing
    /// notice receive (or one cancelled, whose completion comes with the
    /// next look). Always so for libfabric's shm, whose loop has no wait
    /// object of its own to tell.
    pub(crate) fn awaits(&self) -> bool {
        match self {
            Side::Shm { .. } => true,
            Side::Node(n) => {
                let (sends, receives, _) = n.nl.pending();
                sends + receives.saturating_sub(n.standing.len()) > 0 || !n.cancelled.is_empty()
            }
        }
    }

    /// The tag and length of the oldest waiting message a receive for
    /// `want` would take, where this loop can tell without posting (the
    /// node loop); `Err(())` where a probe must ask the provider.
    pub(crate) fn peek(&self, want: (u64, u64)) -> std::result::Result<Option<(u64, usize)>, ()> {
        match self {
            Side::Shm { .. } => Err(()),
            Side::Node(n) => Ok(n.nl.peek(want.0, want.1)),
        }
    }
}

/// The loop and address that carry messages to one peer.
#[derive(Debug)]
pub(crate) enum Lane<'a> {
    /// A libfabric loop: the World's fabric, or shm beside it.
    Fabric {
        ev: &'a mut EventLoop,
        ep: EndpointId,
        peer: &'a Peer,
    },
    /// fabric-msg's node loop, to the rank with this node index.
    Node { nl: &'a mut NodeLoop, peer: usize },
}

impl Lane<'_> {
    /// Send `buf` with World tag `tag`; `user`: in the application's class
    /// (checked as the application's), otherwise in one of the World's.
    pub(crate) fn send(
        self,
        user: bool,
        tag: u64,
        buf: Buffer,
        token: Token,
    ) -> std::result::Result<(), PostError> {
        match self {
            Lane::Fabric { ev, peer, .. } => {
                let opts = SendOpts {
                    tag: Some(tag),
                    data: None,
                };
                if user {
                    ev.send(peer, buf, opts, token)
                } else {
                    ev.as_world().send(peer, buf, opts, token)
                }
            }
            Lane::Node { nl, peer } => match nl.check_peer(peer) {
                Ok(()) => nl
                    .send(peer, tag, buf, token)
                    .map_err(|error| PostError { error, buffer: None }),
                Err(error) => Err(PostError {
                    error,
                    buffer: Some(buf),
                }),
            },
        }
    }

    /// Send `bytes` (at most `Side::inject_max`) in one of the World's
    /// classes with no completion; [`Error::QueueFull`] when there is no
    /// room now.
    pub(crate) fn inject(self, tag: u64, bytes: &[u8]) -> Result<()> {
        match self {
            Lane::Fabric { ev, peer, .. } => {
                let opts = SendOpts {
                    tag: Some(tag),
                    data: None,
                };
                ev.as_world().inject(peer, bytes, opts)
            }
            Lane::Node { nl, peer } => match nl.inject(peer, tag, bytes)? {
                true => Ok(()),
                false => Err(Error::QueueFull {
                    call: "same-node ring",
                    waited: Duration::ZERO,
                    in_flight: nl.pending().0,
                    code: None,
                }),
            },
        }
    }

    /// Receive into `buf` a message in one of the World's classes whose tag
    /// matches `want`.
    pub(crate) fn recv(
        self,
        want: (u64, u64),
        buf: Buffer,
        token: Token,
    ) -> std::result::Result<(), PostError> {
        match self {
            Lane::Fabric { ev, ep, .. } => fabric_recv(ev, ep, super::tags::CLASS_WORLD, want, buf, token),
            Lane::Node { nl, .. } => node_recv(nl, want, buf, token),
        }
    }

    /// Whether `c`, whose tag names world rank `claimed` (this lane's
    /// peer) as its sender, came from elsewhere: a forged message.
    pub(crate) fn forged(&self, c: &Completion, claimed: u32) -> bool {
        match self {
            Lane::Fabric { ev, peer, .. } => ev.profile().source && c.source != Some(peer.addr),
            Lane::Node { .. } => {
                c.endpoint != EndpointId(NODE_ENDPOINT) || c.source != Some(u64::from(claimed))
            }
        }
    }
}

/// Post a receive on a libfabric loop for a World tag matching `want`, in
/// message class `class` (the application's is checked as the
/// application's).
fn fabric_recv(
    ev: &mut EventLoop,
    ep: EndpointId,
    class: u64,
    want: (u64, u64),
    buf: Buffer,
    token: Token,
) -> std::result::Result<(), PostError> {
    let opts = RecvOpts {
        tag: Some(want),
        from: None,
    };
    super::tags::post_recv_in(ev, class, ep, buf, opts, token)
}

/// Post a receive on the node loop for a World tag matching `want` (the
/// tag names the sender, so the loop is asked for any sender; it refuses
/// only a named sender it does not know).
fn node_recv(
    nl: &mut NodeLoop,
    want: (u64, u64),
    buf: Buffer,
    token: Token,
) -> std::result::Result<(), PostError> {
    nl.recv(None, want.0, want.1, buf, token)
        .map_err(|error| PostError { error, buffer: None })
}
