//! The same-node loop: tagged messages between the ranks of one node over
//! their segments' rings, with fabric-msg's own matching.
//!
//! Every rank owns one segment holding one inbound ring per rank of the
//! node (its own included, for messages to itself): ring `s` of rank `r`'s
//! segment carries `s`'s messages to `r`. A message is cut into frames of
//! at most [`NodeConfig::max_frame`] bytes, so a large one streams through
//! the ring while the receiver copies out the frames before it (two
//! copies, pipelined). A sender writes one message's frames to a ring
//! before the next message's; what does not fit waits in the sender's
//! queue for that peer and moves on as [`NodeLoop::poll`] finds room.
//!
//! Nothing here blocks or sleeps: `poll` does what can be done now and
//! returns. Waiting (spin, yield, sleep) is the caller's.

use super::matching::{Matcher, Posted};
use super::ring::{ring_bytes, Consumer, Frame, Producer, FIRST, LAST};
use super::segment::{Segment, SegmentName, HEADER};
use crate::error::{Error, Result};
use crate::memory::buffer::Buffer;
use crate::transport::event_loop::{CompletionError, OpKind, Token};
use std::collections::VecDeque;
use std::sync::Arc;

/// Sizes of the rings; every rank of a node must use the same.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeConfig {
    /// Cells (64 bytes) per ring. 1024 (64 KiB) by default: with 128
    /// ranks on a node, 8 MiB per rank.
    pub cells: usize,
    /// Payload bytes per frame: a message longer than this streams in
    /// several. 16 KiB by default (a quarter of the ring).
    pub max_frame: usize,
}

impl Default for NodeConfig {
    fn default() -> Self {
        NodeConfig { cells: 1024, max_frame: 16 << 10 }
    }
}

impl NodeConfig {
    /// The length of a segment for `ranks` ranks.
    pub fn segment_len(&self, ranks: usize) -> usize {
        HEADER + ranks * ring_bytes(self.cells)
    }
}

/// One finished operation of a [`NodeLoop`].
#[derive(Debug)]
pub struct NodeCompletion {
    /// The token given when posting.
    pub token: Token,
    /// [`OpKind::Send`] or [`OpKind::Recv`].
    pub kind: OpKind,
    /// The buffer, given back; for a receive its length is what arrived
    /// (at most its capacity).
    pub buffer: Buffer,
    /// The peer (node index): the sender of a receive, the destination of
    /// a send.
    pub peer: usize,
    /// The message's tag.
    pub tag: u64,
    /// Success, or what went wrong ([`CompletionError::Truncated`] for a
    /// message larger than the receive: its first bytes are delivered).
    pub result: std::result::Result<(), CompletionError>,
}

/// A send waiting for room in its ring, or part-written.
#[derive(Debug)]
struct Outgoing {
    token: Token,
    tag: u64,
    buf: Buffer,
    /// Bytes written to the ring so far.
    sent: usize,
    started: bool,
}

/// Where the message being read from one peer goes.
#[derive(Debug)]
enum Into {
    /// A posted receive, straight from the ring.
    Posted(Posted),
    /// An unexpected message's buffer (found with `arriving_from`).
    Arrived,
}

#[derive(Debug)]
struct Assembly {
    tag: u64,
    total: u64,
    got: u64,
    into: Into,
}

/// Frames read from one ring per poll at most, so that one busy sender
/// does not starve the others or the sends.
const FRAMES_PER_POLL: usize = 64;

/// Tagged messages between the ranks of one node. See the module docs.
#[derive(Debug)]
pub struct NodeLoop {
    me: usize,
    cfg: NodeConfig,
    own: Arc<Segment>,
    /// By sender: the ring it writes to us.
    inbox: Vec<Consumer>,
    /// By receiver: our ring in its segment, once connected.
    outbox: Vec<Option<Producer>>,
    sends: Vec<VecDeque<Outgoing>>,
    assembling: Vec<Option<Assembly>>,
    /// Peers whose ring held a corrupt frame: not read any more.
    broken: Vec<Option<String>>,
    matcher: Matcher,
    done: VecDeque<NodeCompletion>,
}

impl NodeLoop {
    /// This rank's side: `me` of `ranks` on the node, with its segment
    /// created. Publish [`NodeLoop::name`], then [`NodeLoop::connect`] to
    /// each peer's.
    pub fn create(me: usize, ranks: usize, cfg: NodeConfig) -> Result<NodeLoop> {
        if me >= ranks || cfg.cells < 8 || !cfg.cells.is_power_of_two() || cfg.max_frame == 0 {
            return Err(Error::Usage(format!(
                "node loop: rank {me} of {ranks}, {} cells (a power of two, at least 8), frames of {} bytes",
                cfg.cells, cfg.max_frame
            )));
        }
        let own = Arc::new(Segment::create(cfg.segment_len(ranks))?);
        let inbox = (0..ranks)
            .map(|s| Consumer::new(own.clone(), HEADER + s * ring_bytes(cfg.cells), cfg.cells, cfg.max_frame))
            .collect();
        Ok(NodeLoop {
            me,
            cfg,
            own,
            inbox,
            outbox: (0..ranks).map(|_| None).collect(),
            sends: (0..ranks).map(|_| VecDeque::new()).collect(),
            assembling: (0..ranks).map(|_| None).collect(),
            broken: vec![None; ranks],
            matcher: Matcher::default(),
            done: VecDeque::new(),
        })
    }

    /// What peers attach to this rank's segment with.
    pub fn name(&self) -> SegmentName {
        self.own.name()
    }

    /// This rank's index on the node.
    pub fn me(&self) -> usize {
        self.me
    }

    /// Ranks on the node.
    pub fn ranks(&self) -> usize {
        self.inbox.len()
    }

    /// Attach to `peer`'s segment (this rank's own for `peer == me`),
    /// after checking it is the size this rank expects.
    pub fn connect(&mut self, peer: usize, name: &SegmentName) -> Result<()> {
        let ranks = self.ranks();
        if peer >= ranks {
            return Err(Error::Usage(format!("node loop: no rank {peer} among {ranks}")));
        }
        let want = self.cfg.segment_len(ranks) as u64;
        if name.len != want {
            return Err(Error::PeerMismatch(format!(
                "same-node rank {peer}'s segment is {} bytes, where rank {} expects {want} ({ranks} ranks, \
                 rings of {} cells): the ranks disagree on the node's ranks or ring size",
                name.len, self.me, self.cfg.cells
            )));
        }
        let seg = if peer == self.me {
            self.own.clone()
        } else {
            Arc::new(Segment::attach(name)?)
        };
        let at = HEADER + self.me * ring_bytes(self.cfg.cells);
        self.outbox[peer] = Some(Producer::new(seg, at, self.cfg.cells, self.cfg.max_frame));
        Ok(())
    }

    fn check_peer(&self, peer: usize) -> Result<()> {
        match self.outbox.get(peer) {
            None => Err(Error::Usage(format!("node loop: no rank {peer} among {}", self.ranks()))),
            Some(None) => Err(Error::Usage(format!("node loop: rank {peer} is not connected"))),
            Some(Some(_)) => match &self.broken[peer] {
                Some(why) => Err(Error::PeerMismatch(format!("same-node rank {peer}: {why}"))),
                None => Ok(()),
            },
        }
    }

    /// Send `buf` (its length) to `peer` with `tag`; the buffer comes back
    /// in a completion with `token` once the whole message is in the ring.
    pub fn send(&mut self, peer: usize, tag: u64, buf: Buffer, token: Token) -> Result<()> {
        self.check_peer(peer)?;
        self.sends[peer].push_back(Outgoing { token, tag, buf, sent: 0, started: false });
        if self.sends[peer].len() == 1 {
            self.push(peer);
        }
        Ok(())
    }

    /// Send a small message (at most [`NodeConfig::max_frame`] bytes) now,
    /// with no completion: false if the ring has no room (or earlier sends
    /// to `peer` still wait); poll and try again.
    #[inline]
    pub fn inject(&mut self, peer: usize, tag: u64, data: &[u8]) -> Result<bool> {
        self.check_peer(peer)?;
        if data.len() > self.cfg.max_frame {
            return Err(Error::TooLarge { what: "injected same-node message", len: data.len(), max: self.cfg.max_frame });
        }
        if !self.sends[peer].is_empty() {
            return Ok(false);
        }
        let p = self.outbox[peer].as_mut().expect("checked");
        Ok(p.try_write(tag, FIRST | LAST, data.len() as u64, data))
    }

    /// Receive into `buf` (its capacity) a message from `from` (any rank
    /// for `None`) whose tag matches `tag` outside the bits of `ignore`.
    pub fn recv(&mut self, from: Option<usize>, tag: u64, ignore: u64, mut buf: Buffer, token: Token) -> Result<()> {
        if let Some(f) = from {
            if f >= self.ranks() {
                return Err(Error::Usage(format!("node loop: no rank {f} among {}", self.ranks())));
            }
        }
        buf.set_len(buf.capacity());
        let p = Posted { token, from, tag: (tag, ignore), buf };
        match self.matcher.find_arrived(&p) {
            None => self.matcher.post(p),
            Some(i) if self.matcher.arrived_mut(i).complete => {
                let a = self.matcher.remove_arrived(i);
                let mut p = p;
                let n = a.total.min(p.buf.capacity());
                p.buf.as_mut_slice()[..n].copy_from_slice(&a.data[..n]);
                self.complete_recv(p, a.from, a.tag, a.total as u64);
                self.matcher.recycle(a.data);
            }
            Some(i) => self.matcher.arrived_mut(i).claimed = Some(p),
        }
        Ok(())
    }

    /// Take back a receive no message has matched yet; `None` if it has
    /// (its completion will come) or there is none with `token`.
    pub fn cancel_recv(&mut self, token: Token) -> Option<Buffer> {
        self.matcher.cancel(token).map(|p| p.buf)
    }

    /// Sends queued, receives posted, unexpected messages kept.
    pub fn pending(&self) -> (usize, usize, usize) {
        let (posted, arrived) = self.matcher.counts();
        (self.sends.iter().map(VecDeque::len).sum(), posted, arrived)
    }

    /// Move what can move now: queued sends into rings with room, arrived
    /// frames to their receives. Finished operations go to `out`; how many.
    pub fn poll(&mut self, out: &mut Vec<NodeCompletion>) -> usize {
        for peer in 0..self.sends.len() {
            if !self.sends[peer].is_empty() {
                self.push(peer);
            }
        }
        for s in 0..self.inbox.len() {
            if self.broken[s].is_none() {
                self.drain(s);
            }
        }
        let n = self.done.len();
        out.extend(self.done.drain(..));
        n
    }

    /// Write queued sends to `peer` while its ring has room.
    fn push(&mut self, peer: usize) {
        let Some(p) = self.outbox[peer].as_mut() else { return };
        while let Some(o) = self.sends[peer].front_mut() {
            let total = o.buf.len();
            loop {
                let left = total - o.sent;
                let chunk = left.min(p.max_frame());
                let room = p.room();
                // Frames smaller than the whole rest only when a good part
                // of a frame fits: tiny frames would cost more than waiting.
                let len = if chunk <= room { chunk } else if room >= chunk / 4 && room > 0 { room } else { return };
                let mut flags = if o.started { 0 } else { FIRST };
                if o.sent + len == total {
                    flags |= LAST;
                }
                let bytes = &o.buf.as_slice()[o.sent..o.sent + len];
                if !p.try_write(o.tag, flags, total as u64, bytes) {
                    return;
                }
                o.started = true;
                o.sent += len;
                if o.sent == total {
                    break;
                }
            }
            let o = self.sends[peer].pop_front().expect("front");
            self.done.push_back(NodeCompletion {
                token: o.token,
                kind: OpKind::Send,
                buffer: o.buf,
                peer,
                tag: o.tag,
                result: Ok(()),
            });
        }
    }

    /// Read what `s` has written to us.
    fn drain(&mut self, s: usize) {
        for _ in 0..FRAMES_PER_POLL {
            let f = match self.inbox[s].peek() {
                Ok(Some(f)) => f,
                Ok(None) => return,
                Err(e) => return self.break_peer(s, e.to_string()),
            };
            if let Err(what) = self.take(s, &f) {
                return self.break_peer(s, what);
            }
            self.inbox[s].consume(&f);
        }
    }

    /// Deliver frame `f` from `s`.
    fn take(&mut self, s: usize, f: &Frame) -> std::result::Result<(), String> {
        let mut a = match self.assembling[s].take() {
            None if f.flags & FIRST == 0 => return Err("a frame continues a message that never started".into()),
            None => {
                let total = usize::try_from(f.total).map_err(|_| format!("a message of {} bytes", f.total))?;
                let into = match self.matcher.take_posted(s, f.tag) {
                    Some(p) => Into::Posted(p),
                    None => {
                        self.matcher.start_arrived(s, f.tag, total)?;
                        Into::Arrived
                    }
                };
                Assembly { tag: f.tag, total: f.total, got: 0, into }
            }
            Some(_) if f.flags & FIRST != 0 => return Err("a message started inside another".into()),
            Some(a) if (a.tag, a.total) != (f.tag, f.total) => {
                return Err(format!(
                    "a frame of a message (tag {:#x}, {} bytes) inside another (tag {:#x}, {} bytes)",
                    f.tag, f.total, a.tag, a.total
                ))
            }
            Some(a) => a,
        };
        let at = a.got as usize;
        if a.got + f.len as u64 > a.total || (f.flags & LAST != 0) != (a.got + f.len as u64 == a.total) {
            return Err(format!(
                "frames of {} bytes at {at} of a {}-byte message, flags {:#x}",
                f.len, a.total, f.flags
            ));
        }
        match &mut a.into {
            Into::Posted(p) => {
                let cap = p.buf.capacity();
                if at < cap {
                    let n = f.len.min(cap - at);
                    self.inbox[s].copy_out(f, 0, &mut p.buf.as_mut_slice()[at..at + n]);
                }
            }
            Into::Arrived => {
                let i = self.matcher.arriving_from(s).expect("an unexpected message from s is arriving");
                let data = &mut self.matcher.arrived_mut(i).data;
                data.resize(at + f.len, 0);
                self.inbox[s].copy_out(f, 0, &mut data[at..]);
            }
        }
        a.got += f.len as u64;
        if f.flags & LAST == 0 {
            self.assembling[s] = Some(a);
            return Ok(());
        }
        match a.into {
            Into::Posted(p) => self.complete_recv(p, s, a.tag, a.total),
            Into::Arrived => {
                let i = self.matcher.arriving_from(s).expect("arriving");
                let m = self.matcher.arrived_mut(i);
                m.complete = true;
                if m.claimed.is_some() {
                    let mut m = self.matcher.remove_arrived(i);
                    let mut p = m.claimed.take().expect("claimed");
                    let n = m.total.min(p.buf.capacity());
                    p.buf.as_mut_slice()[..n].copy_from_slice(&m.data[..n]);
                    self.complete_recv(p, s, m.tag, m.total as u64);
                    self.matcher.recycle(m.data);
                }
            }
        }
        Ok(())
    }

    fn complete_recv(&mut self, mut p: Posted, from: usize, tag: u64, total: u64) {
        let cap = p.buf.capacity();
        let result = if total > cap as u64 {
            Err(CompletionError::Truncated { message_len: Some(total as usize), buffer_len: cap })
        } else {
            Ok(())
        };
        p.buf.set_len((total as usize).min(cap));
        self.done.push_back(NodeCompletion { token: p.token, kind: OpKind::Recv, buffer: p.buf, peer: from, tag, result });
    }

    /// Stop reading `s`'s ring; fail the receive it was filling.
    fn break_peer(&mut self, s: usize, what: String) {
        log::error!("same-node rank {s} (to rank {} on the node): {what}", self.me);
        if let Some(Assembly { into: Into::Posted(p), tag, .. }) = self.assembling[s].take() {
            self.done.push_back(NodeCompletion {
                token: p.token,
                kind: OpKind::Recv,
                buffer: p.buf,
                peer: s,
                tag,
                result: Err(CompletionError::CorruptRing { peer: s, what: what.clone() }),
            });
        }
        self.broken[s] = Some(what);
    }
}
