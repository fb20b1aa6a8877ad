//! Reading completions: `poll`, blocking waits on the CQ's fd, reading a
//! batch of entries and error entries, matching each to its slot, ending
//! split transfers, and handing completions out.

use super::frame::{decode_header, is_notify};
use super::idle::Pause;
use super::overflow::Sink;
use super::resources::{CqEntries, CQ_BATCH};
use super::slab;
use super::slab::NO_GROUP;
use super::state::EventLoop;
use super::types::{Completion, CompletionError, EndpointId, OpKind, Token, WaitMode};
use crate::error::{strerror, Error, ErrorCode, Result};
use crate::ffi;
use crate::memory::buffer::HEADROOM;
use std::os::raw::c_void;
use std::ptr;
use std::time::{Duration, Instant};

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
        // The clock is read only once nothing is ready, once per pass.
        let mut deadline: Option<Instant> = None;
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
            let mut remaining = None;
            if timeout.is_some() || self.slab.timed > 0 || self.lost.closing() {
                let now = Instant::now();
                if self.lost.closing_due(now) {
                    self.close_lost_connections(now);
                    if !self.pending.is_empty() {
                        continue;
                    }
                }
                if self.slab.timed > 0 && now >= self.next_expiry_scan {
                    self.next_expiry_scan = now + Duration::from_millis(10);
                    self.expire_overdue(now);
                    if !self.pending.is_empty() {
                        continue;
                    }
                }
                if let Some(t) = timeout {
                    match deadline.get_or_insert(now + t).checked_duration_since(now) {
                        Some(r) if !r.is_zero() => remaining = Some(r),
                        _ => return Ok(0),
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
            match idler.next() {
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
        if let (true, Some(fd)) = (sleeps, self.cq.wait_fd) {
            let mut fids = [ptr::null_mut::<ffi::fid>(); 1];
            // SAFETY: the CQ is open; fi_trywait reads `fids` for the call only.
            let ready = unsafe {
                fids[0] = &mut (*self.cq.raw).fid;
                ffi::fi_trywait(self.domain.fabric.raw, fids.as_mut_ptr(), 1)
            };
            if ready == 0 {
                let ms = remaining.map_or(-1, |r| r.as_millis().clamp(1, i32::MAX as u128) as i32);
                let mut pfd = libc::pollfd {
                    fd,
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: one valid pollfd; poll returns on readiness, timeout or signal.
                unsafe { libc::poll(&mut pfd, 1, ms) };
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
        let mut entries = self.cq_entries.take().unwrap_or_default();
        let r = self.read_cq_into(&mut entries);
        self.cq_entries = Some(entries);
        r
    }

    pub(super) fn read_cq_into(&mut self, bufs: &mut CqEntries) -> Result<()> {
        let CqEntries { tagged, data, srcs } = bufs;
        if let Some(p) = &self.progress {
            p.polled();
        }
        loop {
            // The buffer must have the CQ's own entry format: entries are
            // written back to back at that format's size.
            let buf: *mut c_void = if self.cq.tagged {
                tagged.as_mut_ptr().cast()
            } else {
                data.as_mut_ptr().cast()
            };
            // SAFETY: the CQ is open; `buf` holds CQ_BATCH entries of the CQ's
            // format and `srcs` as many addresses.
            let rc = unsafe {
                if self.has_source {
                    ffi::fi_cq_readfrom(self.cq.raw, buf, CQ_BATCH, srcs.as_mut_ptr())
                } else {
                    ffi::fi_cq_read(self.cq.raw, buf, CQ_BATCH)
                }
            };
            if rc > 0 {
                let n = rc as usize;
                for i in 0..n {
                    let src = (self.has_source && srcs[i] != ffi::FI_ADDR_NOTAVAIL).then_some(srcs[i]);
                    let entry = if self.cq.tagged {
                        tagged[i]
                    } else {
                        let d = &data[i];
                        ffi::fi_cq_tagged_entry {
                            op_context: d.op_context,
                            flags: d.flags,
                            len: d.len,
                            buf: d.buf,
                            data: d.data,
                            tag: 0,
                        }
                    };
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
            || (with_data && !self.rx_cq_data && self.slab.index_of(e.op_context).is_none());
        if remote_write && !self.rx_cq_data {
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
        if self.slab.slots[index as usize].abandoned {
            return self.swallow(index);
        }
        let internal = self.slab.slots[index as usize].internal;
        if internal != slab::Internal::No {
            let posted = self.slab.slots[index as usize].posted_len;
            let receive = matches!(internal, slab::Internal::AmRequest | slab::Internal::AmReply);
            if receive && e.len > posted {
                // Its tail went to the overflow sink: never decoded.
                overflowed(e.len, posted);
                let failure = CompletionError::Truncated {
                    message_len: Some(e.len),
                    buffer_len: posted,
                };
                return self.am_failed(index, internal, failure);
            }
            return self.am_complete(index, internal, e.len, source);
        }
        let (endpoint, mut kind, token, multi, posted, group, atomic, want) = {
            let s = &self.slab.slots[index as usize];
            (
                s.endpoint,
                s.kind,
                s.token,
                s.multi,
                s.posted_len,
                s.group,
                s.atomic,
                s.want,
            )
        };
        if multi {
            return self.complete_multi(index, e, source);
        }
        if group != NO_GROUP {
            return self.finish_part(index, group, Ok(()));
        }
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
                let capacity = b.capacity();
                if ep.framed && is_notify(b.header_mut(), e.len) {
                    // fabric-msg's follow-up message of a write_data.
                    kind = OpKind::RemoteWrite;
                    b.set_received(0);
                    data = decode_header(b.header_mut(), e.len).and_then(|(_, d)| d);
                } else if ep.framed {
                    match decode_header(b.header_mut(), e.len) {
                        // Some providers (udp;ofi_rxd in 1.17) truncate without
                        // saying so; the header says how much was sent.
                        Some((len, _)) if len > capacity || len + HEADROOM > e.len => {
                            overflowed(e.len, capacity + HEADROOM);
                            b.set_received(0);
                            result = Err(CompletionError::Truncated {
                                message_len: Some(len),
                                buffer_len: capacity,
                            });
                        }
                        Some((len, d)) => {
                            b.set_received(len);
                            data = d;
                        }
                        None => {
                            b.set_received(0);
                            result = Err(CompletionError::BadFrame(e.len));
                        }
                    }
                } else if e.len > capacity {
                    overflowed(e.len, capacity);
                    b.set_received(0);
                    result = Err(CompletionError::Truncated {
                        message_len: Some(e.len),
                        buffer_len: capacity,
                    });
                } else {
                    b.set_received(e.len);
                }
            }
        }
        let tag = tag_of(e.flags, e.tag);
        if let Some((wanted, ignore)) = want.filter(|_| self.check_tags && kind == OpKind::Recv) {
            if (e.tag & !ignore) != (wanted & !ignore) && result.is_ok() {
                result = Err(CompletionError::Misdelivered {
                    wanted,
                    ignore,
                    got: e.tag,
                });
            }
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
        });
    }

    pub(super) fn read_error(&mut self) -> Result<()> {
        let mut err = ffi::fi_cq_err_entry::default();
        // The provider's error data is copied here, not lent: a lent buffer
        // lives only until the CQ's next read (libfabric 2.1 frees it
        // there), which a progress thread may make at any time.
        let mut err_data = [0u8; 256];
        err.err_data = err_data.as_mut_ptr().cast();
        err.err_data_size = err_data.len();
        // SAFETY: the CQ is open and reported FI_EAVAIL; err is a valid
        // out-struct, and err_data (valid for its length) outlives every
        // use of `err` in this function, fi_cq_strerror's included.
        let rc = unsafe { ffi::fi_cq_readerr(self.cq.raw, &mut err, 0) };
        if rc == -(ffi::FI_EAGAIN as isize) {
            return Ok(());
        }
        if rc < 0 {
            return Err(Error::from_rc("fi_cq_readerr", rc as i64));
        }
        let Some(index) = self.slab.index_of(err.op_context) else {
            log::warn!(
                "error completion for an unknown context: {}",
                strerror(err.err as u32)
            );
            return Ok(());
        };
        if self.slab.slots[index as usize].abandoned {
            self.swallow(index);
            return Ok(());
        }
        let code = err.err.unsigned_abs();
        let internal = self.slab.slots[index as usize].internal;
        if internal != slab::Internal::No {
            let failure = if code == ffi::FI_ETRUNC {
                CompletionError::Truncated {
                    message_len: None,
                    buffer_len: self.slab.slots[index as usize].posted_len,
                }
            } else {
                self.failure_of(index, &err, code)
            };
            self.am_failed(index, internal, failure);
            return Ok(());
        }
        let (endpoint, kind, token, posted, group, lost) = {
            let s = &self.slab.slots[index as usize];
            (s.endpoint, s.kind, s.token, s.posted_len, s.group, s.lost)
        };
        if group != NO_GROUP {
            let failure = self.failure_of(index, &err, code);
            self.finish_part(index, group, Err(failure));
            return Ok(());
        }
        let mut buffer = self.slab.release(index);
        if self
            .endpoints
            .get(endpoint as usize)
            .and_then(Option::as_ref)
            .is_none()
        {
            return Ok(());
        }
        let result = if code == ffi::FI_ETRUNC {
            let framed = self.endpoints[endpoint as usize]
                .as_ref()
                .is_some_and(|e| e.framed);
            let overhead = if framed { HEADROOM } else { 0 };
            let mut message_len = None;
            if let Some(b) = buffer.as_mut() {
                if framed {
                    // The header arrived even if the payload did not fit.
                    message_len = decode_header(b.header_mut(), HEADROOM).map(|(len, _)| len);
                }
                b.set_received(0);
            }
            // fi_cq(3): `len` bytes arrived and `olen` did not fit; ofi_rxm
            // instead reports the whole message in `len`. With no overflow
            // length the provider did not say how large the message was.
            if message_len.is_none() && err.olen > 0 {
                let total = if err.len > posted {
                    err.len
                } else {
                    err.len + err.olen
                };
                message_len = Some(total.saturating_sub(overhead));
            }
            Err(CompletionError::Truncated {
                message_len,
                buffer_len: posted.saturating_sub(overhead),
            })
        } else if lost {
            Err(self.lost_failure(index))
        } else {
            Err(self.cq_failure(&err, code))
        };
        let tag = tag_of(err.flags, err.tag);
        let mut failed = Completion::outcome(token, endpoint, kind, result);
        failed.buffer = buffer;
        failed.tag = tag;
        self.pending.push(failed);
        Ok(())
    }

    /// The error of a failed operation: `PeerLost` if its peer is lost,
    /// else the provider's.
    fn failure_of(&self, index: u32, err: &ffi::fi_cq_err_entry, code: u32) -> CompletionError {
        if self.slab.slots[index as usize].lost {
            self.lost_failure(index)
        } else {
            self.cq_failure(err, code)
        }
    }

    /// A completion error other than truncation, with the provider's text.
    pub(super) fn cq_failure(&self, err: &ffi::fi_cq_err_entry, code: u32) -> CompletionError {
        if code == ffi::FI_ECANCELED {
            return CompletionError::Cancelled;
        }
        let mut text = [0 as std::os::raw::c_char; 256];
        // SAFETY: the CQ is open; fi_cq_strerror writes at most len bytes
        // into `text` and returns a C string valid while err_data is.
        let prov = unsafe {
            let p = ffi::fi_cq_strerror(
                self.cq.raw,
                err.prov_errno,
                err.err_data,
                text.as_mut_ptr(),
                text.len(),
            );
            if p.is_null() {
                String::new()
            } else {
                std::ffi::CStr::from_ptr(p).to_string_lossy().into_owned()
            }
        };
        CompletionError::Failed {
            code: ErrorCode(code),
            text: strerror(code),
            prov_errno: err.prov_errno,
            prov_text: prov,
        }
    }

    /// One part of a split transfer finished; the transfer completes with
    /// its last part, reporting the first error of any part.
    pub(super) fn finish_part(&mut self, index: u32, group: u32, result: Result<(), CompletionError>) {
        if let Some(b) = self.slab.release(index) {
            // Only write_data's follow-up message holds a buffer here.
            self.notify_bufs.push(b);
        }
        let g = &mut self.groups[group as usize];
        if let Err(e) = result {
            g.error.get_or_insert(e);
        }
        g.remaining -= 1;
        if g.remaining == 0 {
            self.end_group(group);
        }
    }

    pub(super) fn end_group(&mut self, group: u32) {
        let g = &mut self.groups[group as usize];
        let (endpoint, kind, token, error) = (g.endpoint, g.kind, g.token, g.error.take());
        g.remaining = 0;
        self.free_groups.push(group);
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
