//! Reading completions: `poll`, blocking waits on the CQ's fd, reading a
//! batch of entries and error entries, matching each to its slot, ending
//! split transfers, and handing completions out.

use super::frame::{decode_header, is_notify};
use super::idle::Pause;
use super::overflow::Sink;
use super::slab::Role;
use super::state::EventLoop;
use super::types::{Completion, CompletionError, EndpointId, OpKind, Token, WaitMode};
use crate::error::{Error, Result};
use crate::ffi;
use crate::libfabric::{CqEntries, CQ_BATCH};
use crate::memory::buffer::{Buffer, HEADROOM};
use std::time::Duration;

impl EventLoop {
    /// Hand out pending completions. A multi-receive buffer comes back
    /// (its slot released) only in a batch holding none of its earlier
    /// pieces, so those can be read with `multi_recv_bytes` while their
    /// batch is processed.
    pub(super) fn deliver(&mut self, out: &mut Vec<Completion>) {
        if out.is_empty() && !self.pending.iter().any(|c| c.finishes) {
            // The common case: hand over the whole batch without copying
            // (`pending` takes `out`'s empty allocation in exchange).
            std::mem::swap(out, &mut self.pending);
            return;
        }
        let start = out.len();
        let mut k = 0;
        while k < self.pending.len() {
            let c = &self.pending[k];
            let earlier = |o: &Completion| o.slot == c.slot;
            if c.finishes && (out.iter().any(earlier) || self.pending[..k].iter().any(earlier)) {
                break;
            }
            k += 1;
        }
        out.extend(self.pending.drain(..k));
        for c in &mut out[start..] {
            if let (true, Some((index, _))) = (c.finishes, c.slot) {
                let used = self.slab.slots[index as usize].used;
                c.buffer = self.slab.release(index);
                if let Some(b) = c.buffer.as_mut() {
                    b.set_received(used);
                }
            }
        }
    }

    /// Move finished operations into `out` (cleared first), waiting up to
    /// `timeout` for at least one (`None`: wait as long as it takes;
    /// `Some(ZERO)`: just look). Returns how many.
    pub fn poll(&mut self, out: &mut Vec<Completion>, timeout: Option<Duration>) -> Result<usize> {
        out.clear();
        // The clock is read only once nothing is ready, and while the wait
        // spins only every `CLOCK_EVERY`th empty look (`idle::WaitClock`).
        let mut clock = super::idle::WaitClock::new(timeout);
        let mut idler = super::idle::Idler::new(&self.cfg);
        loop {
            if self.am_pending() {
                self.am_flush();
            }
            if self.lost.changed() {
                self.take_losses();
            }
            self.flush_backlog();
            if self.pending.is_empty() {
                if self.giving_up() {
                    // The layer above lost a peer it cannot go on without
                    // (the World, a rank) and is leaving: no more reads.
                    // On ofi_rxm a read can take in the lost peer's hang-up
                    // and close its connection, which spins for ever where
                    // a message of it was half received (docs/decisions.md,
                    // "rxm's close of a message half received"); the World
                    // polls in slices of 20 ms, rxm looks at its connections
                    // every 10 ms. The progress thread stops for the same
                    // reason: it would read once the loop no longer does.
                    if let Some(p) = &self.objects.progress {
                        p.halt();
                    }
                    return Ok(0);
                }
                self.read_cq()?;
            }
            if !self.pending.is_empty() {
                self.deliver(out);
                return Ok(out.len());
            }
            if timeout == Some(Duration::ZERO)
                && self.slab.timed == 0
                && self.backlog.len() == 0
                && !self.lost.closing()
            {
                return Ok(0);
            }
            // What to do if nothing comes: a pause other than a spin reads
            // the clock, for the time left before it.
            let pause = idler.next();
            if pause != Pause::Spin {
                clock.paused();
            }
            let mut remaining = None;
            if timeout.is_some() || self.slab.timed > 0 || self.lost.closing() {
                if let Some(now) = clock.look() {
                    if self.lost.closing_due(now) {
                        self.close_lost_connections(now);
                        if !self.pending.is_empty() {
                            continue;
                        }
                    }
                    if self.slab.timed > 0 && now >= self.slab.next_expiry_scan {
                        self.slab.next_expiry_scan = now + Duration::from_millis(10);
                        self.expire_overdue(now);
                        if !self.pending.is_empty() {
                            continue;
                        }
                    }
                    match clock.left(now) {
                        Some(r) if r.is_zero() => return Ok(0),
                        r => remaining = r,
                    }
                }
            }
            if self.slab.timed > 0 || self.lost.watching() {
                // Wake up to notice overdue one-sided operations and lost peers.
                let tick = Duration::from_millis(50);
                remaining = Some(remaining.map_or(tick, |r| r.min(tick)));
            }
            if let Some(tick) = self.backlog_tick() {
                // Sends wait for room at a peer: no CQ event says when.
                remaining = Some(remaining.map_or(tick, |r| r.min(tick)));
            }
            match pause {
                Pause::Spin => std::hint::spin_loop(),
                Pause::Yield => std::thread::yield_now(),
                Pause::Block => self.wait(remaining),
            }
        }
    }

    /// Poll and send every completion down `tx`, for a consumer on another
    /// thread. Returns how many were sent; stops early if the receiver is gone.
    pub fn forward(
        &mut self,
        tx: &crossbeam_channel::Sender<Completion>,
        scratch: &mut Vec<Completion>,
        timeout: Option<Duration>,
    ) -> Result<usize> {
        self.poll(scratch, timeout)?;
        let mut n = 0;
        for c in scratch.drain(..) {
            if tx.send(c).is_err() {
                return Err(Error::Closed {
                    what: "completion channel receiver".into(),
                });
            }
            n += 1;
        }
        Ok(n)
    }

    pub(super) fn wait(&mut self, remaining: Option<Duration>) {
        let sleeps = matches!(self.cfg.wait, WaitMode::Block | WaitMode::Adaptive);
        if let (true, Some(fd)) = (sleeps, self.objects.cq.wait_fd()) {
            if self.objects.cq.try_wait() {
                super::wait_fd::sleep_on(fd, remaining);
            }
            return;
        }
        if self.cfg.wait == WaitMode::Adaptive {
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }

    /// Read what the CQ holds into `pending`.
    pub(super) fn read_cq(&mut self) -> Result<()> {
        // Kept in the loop, not zeroed on every call: an empty poll is the
        // hot path of a spinning loop.
        let mut entries = self.spare.cq_entries.take().unwrap_or_default();
        let r = self.read_cq_into(&mut entries);
        self.spare.cq_entries = Some(entries);
        r
    }

    pub(super) fn read_cq_into(&mut self, bufs: &mut CqEntries) -> Result<()> {
        if let Some(p) = &self.objects.progress {
            p.polled();
        }
        let tagged = self.objects.cq.tagged();
        loop {
            let rc = self.objects.cq.read(bufs, self.rules.has_source);
            if rc > 0 {
                let n = rc as usize;
                for i in 0..n {
                    let src = (self.rules.has_source && bufs.srcs[i] != ffi::FI_ADDR_NOTAVAIL)
                        .then_some(bufs.srcs[i]);
                    let entry = bufs.entry(i, tagged);
                    self.complete(&entry, src);
                }
                if n < CQ_BATCH {
                    return Ok(());
                }
            } else if rc == -(ffi::FI_EAGAIN as isize) {
                return Ok(());
            } else if rc == -(ffi::FI_EAVAIL as isize) {
                self.read_error()?;
            } else {
                return Err(Error::from_rc("fi_cq_read", rc as i64));
            }
        }
    }

    pub(super) fn complete(&mut self, e: &ffi::fi_cq_tagged_entry, source: Option<u64>) {
        let with_data = e.flags & u64::from(ffi::FI_REMOTE_CQ_DATA) != 0;
        // fi_cq(3): a peer's write with data completes with FI_REMOTE_WRITE
        // and FI_REMOTE_CQ_DATA. libfabric 2.x's shm sets FI_REMOTE_CQ_DATA
        // alone (and 2.1 an internal id as the context), so remote data on a
        // completion that is none of our operations is such a write too.
        let remote_write = e.flags & (ffi::FI_REMOTE_WRITE as u64) != 0
            || (with_data && !self.rules.rx_cq_data && self.slab.index_of(e.op_context).is_none());
        if remote_write && !self.rules.rx_cq_data {
            // A peer's write with immediate data: the entry carries no
            // context of ours (fi_cq(3)), so it is not looked up.
            if with_data {
                self.remote_write_arrived(e.data, source);
            }
            return;
        }
        let Some(index) = self.slab.index_of(e.op_context) else {
            log::warn!("completion for an unknown context {:p} ignored", e.op_context);
            return;
        };
        let slot = &self.slab.slots[index as usize];
        if slot.abandoned {
            return self.swallow(index);
        }
        match slot.role {
            Role::AmRequest | Role::AmReply => {
                let (internal, posted) = (slot.role.internal(), slot.posted_len);
                if e.len > posted {
                    // Its tail went to the overflow sink: never decoded.
                    overflowed(e.len, posted);
                    let failure = CompletionError::Truncated {
                        message_len: Some(e.len),
                        buffer_len: posted,
                    };
                    return self.am_failed(index, internal, failure);
                }
                self.am_complete(index, internal, e.len, source)
            }
            Role::AmSend => self.am_complete(index, slot.role.internal(), e.len, source),
            Role::MultiRecv => self.complete_multi(index, e, source),
            Role::Part(group) => self.finish_part(index, group, Ok(())),
            Role::Whole | Role::FetchingAtomic => self.complete_whole(index, e, source, remote_write),
            Role::Peek => self.complete_peek(index, e, source),
        }
    }

    /// An application's operation that completes on its own: its buffer
    /// back, a receive's length, header and tag checked, an atomic's value.
    fn complete_whole(
        &mut self,
        index: u32,
        e: &ffi::fi_cq_tagged_entry,
        source: Option<u64>,
        remote_write: bool,
    ) {
        let (endpoint, mut kind, token, posted, atomic, want, peer) = {
            let s = &self.slab.slots[index as usize];
            (
                s.endpoint,
                s.kind,
                s.token,
                s.posted_len,
                s.role == Role::FetchingAtomic,
                s.want,
                s.peer,
            )
        };
        let value = atomic.then(|| self.atomic_result(index));
        let mut buffer = self.slab.release(index);
        let alive = self.endpoints.get(endpoint as usize).and_then(Option::as_ref);
        let Some(ep) = alive else { return };
        let mut data = (e.flags & u64::from(ffi::FI_REMOTE_CQ_DATA) != 0).then_some(e.data);
        let mut result = Ok(());
        let borrowed_len = (buffer.is_none() && kind == OpKind::Recv).then_some((0, e.len.min(posted)));
        if borrowed_len.is_some() && e.len > posted {
            overflowed(e.len, posted);
            result = Err(CompletionError::Truncated {
                message_len: Some(e.len),
                buffer_len: posted,
            });
        }
        if kind == OpKind::Recv && remote_write {
            // FI_RX_CQ_DATA: a peer's write_data used up this receive.
            kind = OpKind::RemoteWrite;
            if let Some(b) = buffer.as_mut() {
                b.set_received(0);
            }
        } else if kind == OpKind::Recv {
            if let Some(b) = buffer.as_mut() {
                received(b, e, ep.framed, &mut kind, &mut data, &mut result);
            }
        }
        let tag = tag_of(e.flags, e.tag);
        if let Some((wanted, ignore)) = want.filter(|_| self.rules.check_tags && kind == OpKind::Recv) {
            if (e.tag & !ignore) != (wanted & !ignore) && result.is_ok() {
                result = Err(CompletionError::Misdelivered {
                    wanted,
                    ignore,
                    got: e.tag,
                });
            }
        }
        let len = buffer
            .as_ref()
            .map_or(borrowed_len.map_or(posted, |(_, n)| n), Buffer::len);
        match (kind, &result) {
            (OpKind::Send, Ok(())) => self.stats.sent(endpoint, peer, len),
            (OpKind::Recv, Ok(())) => self.stats.received(endpoint, source.unwrap_or(peer), len),
            (_, Err(CompletionError::Truncated { .. })) => self.stats.truncations += 1,
            _ => {}
        }
        self.pending.push(Completion {
            token,
            endpoint: EndpointId(endpoint),
            kind,
            buffer,
            tag,
            data,
            source,
            result,
            value,
            multi: borrowed_len,
            slot: None,
            finishes: false,
            peeked: None,
        });
    }

    /// One part of a split transfer finished; the transfer completes with
    /// its last part, reporting the first error of any part.
    pub(super) fn finish_part(&mut self, index: u32, group: u32, result: Result<(), CompletionError>) {
        if let Some(b) = self.slab.release(index) {
            // Only write_data's follow-up message holds a buffer here.
            self.spare.notify_bufs.push(b);
        }
        let g = &mut self.slab.groups.list[group as usize];
        if let Err(e) = result {
            g.error.get_or_insert(e);
        }
        g.remaining -= 1;
        if g.remaining == 0 {
            self.end_group(group);
        }
    }

    pub(super) fn end_group(&mut self, group: u32) {
        let g = &mut self.slab.groups.list[group as usize];
        let (endpoint, kind, token, error) = (g.endpoint, g.kind, g.token, g.error.take());
        g.remaining = 0;
        self.slab.groups.free.push(group);
        if self
            .endpoints
            .get(endpoint as usize)
            .and_then(Option::as_ref)
            .is_none()
        {
            return;
        }
        self.pending.push(Completion::outcome(
            token,
            endpoint,
            kind,
            error.map_or(Ok(()), Err),
        ));
    }

    /// The notice of a peer's write_data that used up no receive: it is
    /// reported on the loop's first open endpoint.
    pub(super) fn remote_write_arrived(&mut self, data: u64, source: Option<u64>) {
        let Some(endpoint) = self
            .endpoints
            .iter()
            .position(|e| e.as_ref().is_some_and(|e| !e.raw.is_null()))
        else {
            return;
        };
        let mut notice = Completion::outcome(Token::REMOTE, endpoint as u32, OpKind::RemoteWrite, Ok(()));
        notice.data = Some(data);
        notice.source = source;
        self.pending.push(notice);
    }
}

/// The tag of a completion, where it is a tagged one.
pub(super) fn tag_of(flags: u64, tag: u64) -> u64 {
    if flags & u64::from(ffi::FI_TAGGED) != 0 {
        tag
    } else {
        0
    }
}

/// A whole receive's bytes: on framed endpoints the header says the
/// payload's length and data (or that this is a write_data's follow-up
/// notice); a message longer than the buffer is `Truncated`, naming both
/// sizes.
fn received(
    b: &mut Buffer,
    e: &ffi::fi_cq_tagged_entry,
    framed: bool,
    kind: &mut OpKind,
    data: &mut Option<u64>,
    result: &mut std::result::Result<(), CompletionError>,
) {
    let capacity = b.capacity();
    if framed && is_notify(b.header_mut(), e.len) {
        // fabric-msg's follow-up message of a write_data.
        *kind = OpKind::RemoteWrite;
        b.set_received(0);
        *data = decode_header(b.header_mut(), e.len).and_then(|(_, d)| d);
    } else if framed {
        match decode_header(b.header_mut(), e.len) {
            // Some providers (udp;ofi_rxd in 1.17) truncate without
            // saying so; the header says how much was sent.
            Some((len, _)) if len > capacity || len + HEADROOM > e.len => {
                overflowed(e.len, capacity + HEADROOM);
                b.set_received(0);
                *result = Err(CompletionError::Truncated {
                    message_len: Some(len),
                    buffer_len: capacity,
                });
            }
            Some((len, d)) => {
                b.set_received(len);
                *data = d;
            }
            None => {
                b.set_received(0);
                *result = Err(CompletionError::BadFrame(e.len));
            }
        }
    } else if e.len > capacity {
        overflowed(e.len, capacity);
        b.set_received(0);
        *result = Err(CompletionError::Truncated {
            message_len: Some(e.len),
            buffer_len: capacity,
        });
    } else {
        b.set_received(e.len);
    }
}

/// A message of `len` bytes completed into a receive of `capacity`: its
/// tail went to the overflow sink, whose pages are given back once the tail
/// was large.
#[cold]
fn overflowed(len: usize, capacity: usize) {
    if len.saturating_sub(capacity) > 64 * 1024 {
        if let Some(sink) = Sink::mapped() {
            sink.give_back();
        }
    }
}
