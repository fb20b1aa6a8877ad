//! The same-node loop: tagged messages between the ranks of one node over
//! their segments' rings, with fabric-msg's own matching.
//!
//! Every rank owns one segment holding one inbound ring per rank of the
//! node (its own included, for messages to itself): ring `s` of rank `r`'s
//! segment carries `s`'s messages to `r`. A message is cut into frames of
//! at most [`NodeConfig::max_frame`] bytes, so a large one streams through
//! the ring while the receiver copies out the frames before it (two
//! copies, pipelined), or, from [`NodeConfig::single_copy_from`] bytes
//! where the kernel allows it, is read by the receiver straight from the
//! sender's buffer (`single_copy`). A sender writes one message's frames to a ring
//! before the next message's; what does not fit waits in the sender's
//! queue for that peer and moves on as [`NodeLoop::poll`] finds room.
//!
//! Nothing here blocks or sleeps: `poll` does what can be done now and
//! returns. Waiting (spin, yield, sleep) is the caller's.

use super::lent::{Lent, Mem};
use super::matching::{Matcher, Posted};
use super::pidfd::Watch;
use super::ring::{ring_bytes, Consumer, Producer, ACK, FIRST, LAST, RNDV};
use super::segment::{Segment, SegmentName, HEADER};
use super::single_copy::{self, Waiting, ACK_LEN, REQUEST_LEN};
use super::slots::{self, Slots};
use crate::error::{Error, Result};
use crate::memory::buffer::Buffer;
use crate::transport::event_loop::{CompletionError, OpKind, Token};
use std::collections::VecDeque;
use std::ptr::NonNull;
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
    /// Messages of at least this many bytes are read by the receiver from
    /// the sender's memory in one copy, where the kernel lets it
    /// (`single_copy`); `usize::MAX` never. [`DEFAULT_SINGLE_COPY_FROM`]
    /// (32 KiB) by default. Which copy is faster moved between days on
    /// the 2-core VM this was built on (docs/onnode.md, "Large
    /// messages"); measure yours with `node_pingpong --copy-from`.
    pub single_copy_from: usize,
}

/// The default [`NodeConfig::single_copy_from`], 32 KiB: Open MPI's vader
/// and UCX read large messages in one copy too, and a descheduled sender
/// does not hold up a read of its memory (docs/onnode.md, "Large messages").
pub const DEFAULT_SINGLE_COPY_FROM: usize = 32 << 10;

impl Default for NodeConfig {
    fn default() -> Self {
        NodeConfig {
            cells: 1024,
            max_frame: 16 << 10,
            single_copy_from: DEFAULT_SINGLE_COPY_FROM,
        }
    }
}

impl NodeConfig {
    /// The length of a segment for `ranks` ranks: the header, a ring
    /// from each rank, then the collective slots (`slots.rs`).
    pub fn segment_len(&self, ranks: usize) -> usize {
        self.slots_at(ranks) + slots::AREA
    }

    /// Where the collective slots start in a segment for `ranks` ranks.
    fn slots_at(&self, ranks: usize) -> usize {
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

/// A finished operation on lent memory (`NodeLoop::send_lent`,
/// `NodeLoop::recv_lent`): no buffer to give back, the length that
/// arrived instead.
#[derive(Debug)]
pub(crate) struct LentDone {
    pub(crate) token: Token,
    pub(crate) kind: OpKind,
    /// A send's length; a receive's bytes delivered.
    pub(crate) len: usize,
    pub(crate) peer: usize,
    pub(crate) tag: u64,
    pub(crate) result: std::result::Result<(), CompletionError>,
}

/// A send waiting for room in its ring, or part-written.
#[derive(Debug)]
pub(super) struct Outgoing {
    pub(super) token: Token,
    pub(super) tag: u64,
    pub(super) buf: Mem,
    /// Bytes written to the ring so far.
    pub(super) sent: usize,
    /// Read by the receiver from this buffer (`single_copy`).
    pub(super) single_copy: bool,
}

/// Where the message being read from one peer goes.
#[derive(Debug)]
pub(super) enum Into {
    /// A posted receive, straight from the ring.
    Posted(Posted),
    /// An unexpected message's buffer (found with `arriving_from`).
    Arrived,
}

#[derive(Debug)]
pub(super) struct Assembly {
    pub(super) tag: u64,
    pub(super) total: u64,
    pub(super) got: u64,
    pub(super) into: Into,
}

/// Tagged messages between the ranks of one node. See the module docs.
#[derive(Debug)]
pub struct NodeLoop {
    pub(super) me: usize,
    pub(super) cfg: NodeConfig,
    pub(super) own: Arc<Segment>,
    /// By sender: the ring it writes to us.
    pub(super) inbox: Vec<Consumer>,
    /// By receiver: our ring in its segment, once connected.
    pub(super) outbox: Vec<Option<Producer>>,
    pub(super) sends: Vec<VecDeque<Outgoing>>,
    pub(super) assembling: Vec<Option<Assembly>>,
    /// Peers whose ring held a corrupt frame: not read any more.
    pub(super) broken: Vec<Option<String>>,
    /// By rank: its process, for single-copy reads.
    pub(super) pids: Vec<u32>,
    /// By rank: its process's pidfd (none for this rank itself).
    pub(super) watch: Vec<Option<Watch>>,
    /// By rank: found gone (`check_peers`).
    pub(super) lost: Vec<bool>,
    /// Sends the receiver reads, until its ack: (peer, send).
    pub(super) waiting: Waiting<(usize, Outgoing)>,
    /// By sender: acks for it that found no room in its ring yet.
    pub(super) acks: Vec<VecDeque<[u8; ACK_LEN]>>,
    pub(super) matcher: Matcher,
    pub(super) done: Done,
    /// By rank: its segment's collective slots, once connected.
    slots: Vec<Option<Slots>>,
}

/// Finished operations, by kind of memory: for `poll` (owned buffers,
/// given back) and for `take_lent`.
#[derive(Debug, Default)]
pub(super) struct Done {
    pub(super) owned: Vec<NodeCompletion>,
    pub(super) lent: Vec<LentDone>,
}

impl Done {
    /// A finished operation on `mem`, to the completions of its kind.
    pub(super) fn push(
        &mut self,
        (token, kind): (Token, OpKind),
        mem: Mem,
        (peer, tag): (usize, u64),
        result: std::result::Result<(), CompletionError>,
    ) {
        match mem {
            Mem::Owned(buffer) => self.owned.push(NodeCompletion {
                token,
                kind,
                buffer,
                peer,
                tag,
                result,
            }),
            Mem::Lent(l) => self.lent.push(LentDone {
                token,
                kind,
                len: l.len(),
                peer,
                tag,
                result,
            }),
        }
    }
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
        let own = Arc::new(Segment::with_bell(cfg.segment_len(ranks))?);
        let inbox = (0..ranks)
            .map(|s| {
                Consumer::new(
                    own.clone(),
                    HEADER + s * ring_bytes(cfg.cells),
                    cfg.cells,
                    cfg.max_frame,
                )
            })
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
            pids: vec![0; ranks],
            watch: (0..ranks).map(|_| None).collect(),
            lost: vec![false; ranks],
            waiting: Waiting::default(),
            acks: (0..ranks).map(|_| VecDeque::new()).collect(),
            matcher: Matcher::default(),
            done: Done::default(),
            slots: vec![None; ranks],
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

    /// The longest message [`NodeLoop::inject`] takes.
    pub fn max_frame(&self) -> usize {
        self.cfg.max_frame
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
            return Err(self.no_rank(peer));
        }
        let want = self.cfg.segment_len(ranks) as u64;
        if name.len != want {
            return Err(Error::PeerMismatch(format!(
                "same-node rank {peer}'s segment is {} bytes, where rank {} expects {want} ({ranks} ranks, \
                 rings of {} cells): the ranks disagree on the node's ranks or ring size",
                name.len, self.me, self.cfg.cells
            )));
        }
        // The pidfd first, then the segment, whose header check proves the
        // pid was still the peer's when the pidfd was taken.
        let (watch, seg) = if peer == self.me {
            (None, self.own.clone())
        } else {
            let watch = Watch::open(name.pid);
            let mut seg = Segment::attach(name)?;
            seg.reach_bell(watch.as_ref());
            (watch, Arc::new(seg))
        };
        self.watch[peer] = watch;
        // May this process read the peer's memory? Try, on the header.
        let readable = single_copy::can_read(name.pid, seg.owner_base(), Segment::MAGIC);
        self.inbox[peer].set_can_copy(readable);
        self.pids[peer] = name.pid;
        let at = HEADER + self.me * ring_bytes(self.cfg.cells);
        self.slots[peer] = Some(Slots::new(seg.clone(), self.cfg.slots_at(ranks)));
        self.outbox[peer] = Some(Producer::new(seg, at, self.cfg.cells, self.cfg.max_frame));
        Ok(())
    }

    /// `peer`'s collective slots (this rank's own for `peer == me`), once
    /// connected.
    pub(crate) fn slots(&self, peer: usize) -> Option<&Slots> {
        self.slots.get(peer)?.as_ref()
    }

    fn no_rank(&self, r: usize) -> Error {
        Error::Usage(format!("node loop: no rank {r} among {}", self.ranks()))
    }

    /// How errors name rank `r` of the node.
    pub(super) fn label(&self, r: usize) -> String {
        format!("same-node rank {r} (process {})", self.pids[r])
    }

    /// Whether a send to `peer` would be taken: a connected rank, not lost,
    /// whose ring is not broken; else why not.
    #[inline]
    pub fn check_peer(&self, peer: usize) -> Result<()> {
        if matches!(self.outbox.get(peer), Some(Some(_))) && !self.lost[peer] && self.broken[peer].is_none() {
            return Ok(());
        }
        self.refusal(peer)
    }

    #[cold]
    fn refusal(&self, peer: usize) -> Result<()> {
        match self.outbox.get(peer) {
            None => Err(self.no_rank(peer)),
            Some(None) => Err(Error::Usage(format!("node loop: rank {peer} is not connected"))),
            Some(Some(_)) if self.lost[peer] => Err(Error::PeerLost {
                peer: self.label(peer),
                why: crate::transport::liveness::LossKind::Died.to_string(),
            }),
            Some(Some(_)) => match &self.broken[peer] {
                Some(why) => Err(Error::PeerMismatch(format!("same-node rank {peer}: {why}"))),
                None => Ok(()),
            },
        }
    }

    /// Send `buf` (its length) to `peer` with `tag`; the buffer comes back
    /// in a completion with `token` once the whole message is in the ring.
    pub fn send(&mut self, peer: usize, tag: u64, buf: Buffer, token: Token) -> Result<()> {
        self.queue(peer, tag, Mem::Owned(buf), token)
    }

    /// Send the `len` bytes at `data` to `peer` with `tag`, without copying
    /// them into a buffer first: read by the receiver straight from there
    /// where it may (single copy), else copied into the ring. Its
    /// completion comes from [`NodeLoop::take_lent`].
    ///
    /// # Safety
    /// `data..data + len` stays valid and unwritten until that completion
    /// is taken.
    pub(crate) unsafe fn send_lent(
        &mut self,
        peer: usize,
        tag: u64,
        data: NonNull<u8>,
        len: usize,
        token: Token,
    ) -> Result<()> {
        // SAFETY: the caller's promise, passed on.
        let lent = unsafe { Lent::new(data, len) };
        self.queue(peer, tag, Mem::Lent(lent), token)
    }

    fn queue(&mut self, peer: usize, tag: u64, buf: Mem, token: Token) -> Result<()> {
        self.check_peer(peer)?;
        let single_copy = buf.len() >= self.cfg.single_copy_from
            && self.outbox[peer].as_ref().is_some_and(Producer::reader_can_copy);
        self.sends[peer].push_back(Outgoing {
            token,
            tag,
            buf,
            sent: 0,
            single_copy,
        });
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
            return Err(Error::TooLarge {
                what: "injected same-node message",
                len: data.len(),
                max: self.cfg.max_frame,
            });
        }
        if !self.sends[peer].is_empty() || !self.acks[peer].is_empty() {
            return Ok(false);
        }
        let p = self.outbox[peer].as_mut().expect("checked");
        Ok(p.try_write(tag, FIRST | LAST, data.len() as u64, data))
    }

    /// Receive into `buf` (its capacity) a message from `from` (any rank
    /// for `None`) whose tag matches `tag` outside the bits of `ignore`.
    pub fn recv(
        &mut self,
        from: Option<usize>,
        tag: u64,
        ignore: u64,
        mut buf: Buffer,
        token: Token,
    ) -> Result<()> {
        buf.set_len(buf.capacity());
        self.post(from, tag, ignore, Mem::Owned(buf), token, false)
            .map(drop)
    }

    /// Receive into the `cap` bytes at `into` (no buffer of the loop's in
    /// between), as [`NodeLoop::recv`] does; its completion, with the
    /// length delivered, comes from [`NodeLoop::take_lent`]. A lent receive
    /// cannot be cancelled.
    ///
    /// # Safety
    /// `into..into + cap` stays valid, and nothing else reads or writes it,
    /// until that completion is taken.
    pub(crate) unsafe fn recv_lent(
        &mut self,
        from: Option<usize>,
        tag: u64,
        ignore: u64,
        into: NonNull<u8>,
        cap: usize,
        token: Token,
    ) -> Result<()> {
        // SAFETY: the caller's promise, passed on.
        let lent = unsafe { Lent::new(into, cap) };
        self.post(from, tag, ignore, Mem::Lent(lent), token, false)
            .map(drop)
    }

    /// Post a receive: true if a message that arrived before it matched
    /// it at once.
    pub(super) fn post(
        &mut self,
        from: Option<usize>,
        tag: u64,
        ignore: u64,
        buf: Mem,
        token: Token,
        paired: bool,
    ) -> Result<bool> {
        if let Some(f) = from {
            if f >= self.ranks() {
                return Err(self.no_rank(f));
            }
        }
        let p = Posted {
            token,
            from,
            tag: (tag, ignore),
            buf,
            paired,
        };
        match self.matcher.find_arrived(&p) {
            None => {
                self.matcher.post(p);
                return Ok(false);
            }
            Some(i) if self.matcher.arrived_mut(i).complete => {
                let a = self.matcher.remove_arrived(i);
                self.deliver_arrived(p, a);
            }
            Some(i) => self.matcher.arrived_mut(i).claimed = Some(p),
        }
        Ok(true)
    }

    /// Move the finished operations on lent memory to `out`.
    pub(crate) fn take_lent(&mut self, out: &mut Vec<LentDone>) {
        out.append(&mut self.done.lent);
    }

    /// The tag and length of the oldest message that arrived before its
    /// receive and that a receive for `tag` outside `ignore` would take
    /// (MPI's probe); `None` if none has. A message still streaming in
    /// counts (its length is known from its first frame).
    pub fn peek(&self, tag: u64, ignore: u64) -> Option<(u64, usize)> {
        self.matcher.peek(tag, ignore)
    }

    /// Take back a receive no message has matched yet; `None` if it has
    /// (its completion will come) or there is none with `token`.
    pub fn cancel_recv(&mut self, token: Token) -> Option<Buffer> {
        self.matcher.cancel(token).and_then(|p| p.buf.into_buffer())
    }

    /// Sends queued, receives posted, unexpected messages kept.
    pub fn pending(&self) -> (usize, usize, usize) {
        let (posted, arrived) = self.matcher.counts();
        (
            self.sends.iter().map(VecDeque::len).sum::<usize>() + self.waiting.len(),
            posted,
            arrived,
        )
    }

    /// Move what can move now: queued sends into rings with room, arrived
    /// frames to their receives. Finished operations go to `out`; how many.
    pub fn poll(&mut self, out: &mut Vec<NodeCompletion>) -> usize {
        for peer in 0..self.sends.len() {
            if !self.sends[peer].is_empty() || !self.acks[peer].is_empty() {
                self.push(peer);
            }
        }
        for s in 0..self.inbox.len() {
            // Looked at here first: an empty ring costs no call.
            if self.broken[s].is_none() && !self.lost[s] && self.inbox[s].has_frame() {
                self.drain(s);
            }
        }
        let n = self.done.owned.len();
        if out.is_empty() {
            // The usual case: hand over the whole vector (the caller's
            // empty one, with its capacity, becomes ours).
            std::mem::swap(out, &mut self.done.owned);
        } else {
            out.append(&mut self.done.owned);
        }
        n
    }

    /// Write queued sends to `peer` while its ring has room.
    pub(super) fn push(&mut self, peer: usize) {
        let Some(p) = self.outbox[peer].as_mut() else {
            return;
        };
        while let Some(a) = self.acks[peer].front() {
            if !p.try_write(0, ACK, 0, a) {
                return;
            }
            self.acks[peer].pop_front();
        }
        while let Some(o) = self.sends[peer].front_mut() {
            if o.single_copy {
                if p.room() < REQUEST_LEN {
                    return;
                }
                let o = self.sends[peer].pop_front().expect("front");
                let (tag, total, addr) = (o.tag, o.buf.len() as u64, o.buf.as_slice().as_ptr() as u64);
                let id = self.waiting.insert((peer, o));
                let req = single_copy::encode(addr, id);
                let written = p.try_write(tag, FIRST | LAST | RNDV, total, &req);
                debug_assert!(written, "room was checked");
                continue;
            }
            let total = o.buf.len();
            loop {
                let left = total - o.sent;
                let chunk = left.min(p.max_frame());
                let room = p.room();
                // Frames smaller than the whole rest only when a good part
                // of a frame fits: tiny frames would cost more than waiting.
                let len = if chunk <= room {
                    chunk
                } else if room >= chunk / 4 && room > 0 {
                    room
                } else {
                    return;
                };
                // A message's first frame is the one written with nothing sent yet
                // (a frame carries at least one byte, or is the whole message).
                let mut flags = if o.sent == 0 { FIRST } else { 0 };
                if o.sent + len == total {
                    flags |= LAST;
                }
                let bytes = &o.buf.as_slice()[o.sent..o.sent + len];
                if !p.try_write(o.tag, flags, total as u64, bytes) {
                    return;
                }
                o.sent += len;
                if o.sent == total {
                    break;
                }
            }
            let o = self.sends[peer].pop_front().expect("front");
            // Not `finish_send`: `p` still borrows the outbox.
            self.done
                .push((o.token, OpKind::Send), o.buf, (peer, o.tag), Ok(()));
        }
    }
}
