//! Emulated atomics: where the provider has no atomics (or lacks some, see
//! [`Profile::atomic_carrier`](crate::Profile::atomic_carrier)), an atomic
//! is a request message to the target, applied by the target's loop while
//! it polls, and a reply that completes the origin's operation with the
//! same [`Completion`] a native atomic gives.
//!
//! Each operation carries a random cookie: the target echoes it, and the
//! origin drops (and counts) any reply without it or from another source,
//! posting its receive again; the target checks the origin, its room to
//! answer and the whole request before it changes memory, and answers a
//! cookie it applied before from memory. Half way to its deadline an
//! operation's request is sent once more with the same cookie, so a lost
//! reply is recovered and nothing is applied twice (docs/atomics.md).
//!
//! Origin: the operation's slot posts a receive for its reply (a tag
//! naming the slot and its generation), then a request goes out from a
//! pooled buffer. Target: every endpoint keeps [`REQUEST_RECVS`] request
//! receives posted; each request is checked (key of a live exposed region,
//! bounds, alignment, access) and applied with one CPU atomic instruction,
//! the reply goes back in a pooled header-only buffer, and the receive is
//! posted again in place. Nothing is allocated per operation once the
//! pools are warm. As with libfabric's manual progress and MPI's
//! active-target RMA, the target must call `poll` for requests to be
//! applied; until then the origin's operation waits (and reports
//! [`CompletionError::TimedOut`] after `LoopConfig::rma_timeout`).

use super::am_state::AtomicCounters;
use super::am_wire::{
    decode_reply, encode_request, Request, Status, MAX_NAME, REPLY_LEN, REQUEST_LEN, REQUEST_RECVS,
};
use super::calls::raw_recv;
use super::slab;
use super::slab::Internal;
use super::slab::Role;
use super::state::EventLoop;
use super::types::{Completion, CompletionError, EndpointId, OpKind, Peer, Token};
use crate::discovery::atomic::AtomicKind;
use crate::error::{check, strerror, Error, ErrorCode, Result};
use crate::ffi;
use crate::libfabric::RawEndpoint;
use crate::memory::buffer::Buffer;
use crate::memory::remote::RemoteMemory;
use std::os::raw::c_void;
use std::ptr;

/// An atomic's operation and operands, as the emulation sends them.
pub(crate) struct AtomicRequest {
    pub(crate) op: AtomicKind,
    pub(crate) operand: u64,
    pub(crate) compare: u64,
}

impl EventLoop {
    /// Keep request receives posted on endpoint `id` (once per endpoint).
    pub(super) fn am_init(&mut self, id: EndpointId) -> Result<()> {
        let i = id.0 as usize;
        if self.am.names.get(i).is_some_and(Option::is_some) {
            return Ok(());
        }
        let raw = self.ep(id)?.raw;
        let name = self.endpoint_name(id)?;
        if name.len() > MAX_NAME {
            return Err(Error::Unsupported {
                what: format!(
                    "emulated atomics with a {}-byte endpoint name (at most {MAX_NAME})",
                    name.len()
                ),
                provider: self.domain.profile.provider.clone(),
            });
        }
        let request_tag = self.am.tags.request();
        // A quarter of the CQ at most, so a small CQ keeps room for the
        // application's operations.
        for _ in 0..REQUEST_RECVS.min(self.objects.cq_capacity / 4).max(1) {
            self.wait_for_room()?;
            let mut buf = self.am.bufs.pop().unwrap_or_else(|| Buffer::new(REQUEST_LEN));
            let desc = self.local_desc(&mut buf)?;
            let bufp = buf.ptr(false);
            let slot = self.slab.acquire(id.0, OpKind::Recv, Token::REMOTE);
            let (index, ctx) = {
                slot.role = Role::AmRequest;
                slot.buffer = Some(buf);
                slot.posted_len = REQUEST_LEN;
                (slot.index, slot.context())
            };
            let gate = self.progress_gate();
            // SAFETY: raw is enabled; the buffer (REQUEST_LEN bytes at bufp)
            // is owned by the slot until its completion; ctx is the slot's.
            let posted = self.retry("fi_trecv", || unsafe {
                let _gate = gate.as_ref().map(|g| g.lock());
                raw_recv(
                    raw,
                    bufp,
                    REQUEST_LEN,
                    desc,
                    ffi::FI_ADDR_UNSPEC,
                    Some((request_tag, 0)),
                    ctx,
                )
            });
            if let Err(e) = posted {
                if let Some(b) = self.slab.release(index) {
                    self.am.bufs.push(b);
                }
                return Err(e);
            }
            self.am.posted += 1;
        }
        if self.am.names.len() <= i {
            self.am.names.resize(i + 1, None);
        }
        self.am.names[i] = Some(name);
        self.am.applied.reserve();
        Ok(())
    }

    /// Apply peers' emulated atomics on endpoint `id` from now on, also
    /// where this loop's own atomics are native: the World's symmetric
    /// memory mapped across a node takes the emulated carrier for atomics
    /// from other nodes (`world/node_symmetric.rs`). The atomics' tag bits
    /// are kept from applications from now on, as on a loop that emulates.
    pub(crate) fn serve_emulated_atomics(&mut self, id: EndpointId) -> Result<()> {
        if !self.domain.profile.can_emulate_atomics() {
            return Err(Error::Unsupported {
                what:
                    "emulated atomics (they need Capability::Atomic, tagged RDM endpoints with 40 tag bits \
                       and keys that fit 64 bits)"
                        .into(),
                provider: self.domain.profile.provider.clone(),
            });
        }
        self.am.tags = self.am.tags.reserved(true);
        self.am_init(id)
    }

    /// Post an emulated atomic (the checks on `remote` are done).
    pub(crate) fn atomic_emulated(
        &mut self,
        peer: &Peer,
        req: AtomicRequest,
        remote: &RemoteMemory,
        offset: u64,
        token: Token,
    ) -> Result<()> {
        self.am_init(peer.endpoint)?;
        self.lost.check(peer.endpoint.0, peer.addr)?;
        let raw = self.ep(peer.endpoint)?.raw;
        let (addr, key) = remote.target(offset);
        let cookie = self.am.cookies.draw()?;
        // The reply's receive: the operation's own slot.
        self.wait_for_room()?;
        let mut reply = self.spare.notify_bufs.pop().unwrap_or_else(|| Buffer::new(0));
        let desc = self.local_desc(&mut reply)?;
        let replyp = reply.ptr(true);
        let slot = self.slab.acquire(peer.endpoint.0, OpKind::Atomic, token);
        // Half the timeout: then the request goes once more (`am_resend`).
        let deadline = self.cfg.rma_timeout.map(|t| std::time::Instant::now() + t / 2);
        let (op_index, generation, ctx) = {
            slot.role = Role::AmReply;
            slot.peer = peer.addr;
            slot.buffer = Some(reply);
            slot.posted_len = REPLY_LEN;
            slot.expires = deadline;
            (slot.index, slot.generation, slot.context())
        };
        if deadline.is_some() {
            self.slab.timed += 1;
        }
        let tag = self.am.tags.reply(op_index, cookie);
        let request = Request {
            op: req.op,
            reply_tag: tag,
            addr,
            key,
            operand: req.operand,
            compare: req.compare,
            cookie,
        };
        self.am.track(op_index, request);
        let src = if self.rules.directed {
            peer.addr
        } else {
            ffi::FI_ADDR_UNSPEC
        };
        let gate = self.progress_gate();
        // SAFETY: raw is enabled; REPLY_LEN bytes at replyp are owned by the
        // slot until its completion; ctx is the slot's.
        let posted = self.retry("fi_trecv", || unsafe {
            let _gate = gate.as_ref().map(|g| g.lock());
            raw_recv(raw, replyp, REPLY_LEN, desc, src, Some((tag, 0)), ctx)
        });
        if let Err(e) = posted {
            self.am.untrack(op_index);
            if let Some(b) = self.slab.release(op_index) {
                self.spare.notify_bufs.push(b);
            }
            return Err(e);
        }
        // The request.
        let sent = self.am_send_request(
            peer.endpoint.0,
            peer.addr,
            raw,
            op_index,
            generation,
            &request,
            true,
        );
        if sent.is_err() {
            // The reply can never come: nothing reports this operation.
            self.am_abandon(op_index);
        }
        sent
    }

    /// Send the request of the operation in slot `index` once more, with
    /// the same cookie, if it was not yet: called when the first half of
    /// its deadline passed. The target answers a request it applied from
    /// memory, so the operation is applied once whichever copy arrives.
    /// `false` if the operation's deadline is its last.
    pub(super) fn am_resend(&mut self, index: u32, now: std::time::Instant) -> bool {
        let (Some(mut op), Some(t)) = (self.am.tracked(index), self.cfg.rma_timeout) else {
            return false;
        };
        if op.resent {
            return false;
        }
        op.resent = true;
        self.am.in_flight[index as usize] = Some(op);
        let s = &mut self.slab.slots[index as usize];
        s.expires = Some(now + (t - t / 2));
        let (endpoint, addr, generation) = (s.endpoint, s.peer, s.generation);
        // A closed endpoint (a lost peer's connection) has a null handle.
        let Some(raw) = self.open_raw(endpoint) else {
            return true;
        };
        if let Err(e) = self.am_send_request(endpoint, addr, raw, index, generation, &op.request, false) {
            log::debug!("emulated atomic: its request could not be sent again ({e}); its deadline stands");
        }
        true
    }

    /// Send `r` for the operation in slot `op_index`; `retry` waits for
    /// room in the queue (a first send), otherwise one attempt is made.
    #[allow(clippy::too_many_arguments)]
    fn am_send_request(
        &mut self,
        endpoint: u32,
        dest: ffi::fi_addr_t,
        raw: RawEndpoint,
        op_index: u32,
        generation: u64,
        r: &Request,
        retry: bool,
    ) -> Result<()> {
        let mut buf = self.am.bufs.pop().unwrap_or_else(|| Buffer::new(REQUEST_LEN));
        buf.set_len(REQUEST_LEN);
        let name = self.am.names[endpoint as usize].as_deref().unwrap_or(&[]);
        let len = encode_request(buf.as_mut_slice(), r, name).ok_or_else(|| {
            Error::Usage("emulated atomic: the endpoint name does not fit a request".into())
        })?;
        let desc = self.local_desc(&mut buf)?;
        let bufp = buf.ptr(false);
        if retry {
            self.wait_for_room()?;
        } else if self.slab.in_flight >= self.objects.cq_capacity {
            self.am.bufs.push(buf);
            return Err(Error::Usage("no room in the completion queue".into()));
        }
        let slot = self.slab.acquire(endpoint, OpKind::Send, Token::REMOTE);
        let (index, ctx) = {
            slot.role = Role::AmSend;
            slot.link = (generation << 32) | u64::from(op_index);
            slot.buffer = Some(buf);
            (slot.index, slot.context())
        };
        let request_tag = self.am.tags.request();
        // SAFETY: raw is enabled; `len` bytes at bufp are owned by the slot
        // until its completion; ctx is the slot's.
        let post = || unsafe { raw.send(bufp, len, desc, dest, Some(request_tag), None, ctx) };
        let sent = if retry {
            self.retry("fi_tsend", post).map(|_| ())
        } else {
            check("fi_tsend", post() as i64).map(|_| ())
        };
        if sent.is_err() {
            if let Some(b) = self.slab.release(index) {
                self.am.bufs.push(b);
            }
        }
        sent
    }

    /// Report nothing more for the operation in slot `index`: its late
    /// reply (or the cancellation of its receive) is swallowed.
    fn am_abandon(&mut self, index: u32) {
        self.am.untrack(index);
        let s = &mut self.slab.slots[index as usize];
        s.abandoned = true;
        if s.expires.take().is_some() {
            self.slab.timed -= 1;
        }
        let (ctx, endpoint) = ((&mut **s as *mut slab::OpSlot).cast::<c_void>(), s.endpoint);
        if let Some(raw) = self.open_raw(endpoint) {
            // SAFETY: the endpoint is open and the slot's receive is posted
            // on it; fi_cancel only looks the context up. If it cannot be
            // cancelled, the slot waits for the endpoint's close.
            unsafe { raw.cancel(ctx) };
        }
    }

    /// An internal operation's completion (`kind` says which).
    pub(super) fn am_complete(&mut self, index: u32, kind: Internal, len: usize, source: Option<u64>) {
        match kind {
            Internal::AmRequest => self.am_request_arrived(index, len, source),
            Internal::AmReply => self.am_reply_arrived(index, len, source),
            Internal::AmSend | Internal::No => {
                if let Some(b) = self.slab.release(index) {
                    self.am_recycle(b);
                }
            }
        }
    }

    /// An internal operation's error completion.
    pub(super) fn am_failed(&mut self, index: u32, kind: Internal, failure: CompletionError) {
        let s = &self.slab.slots[index as usize];
        let (endpoint, token, link) = (s.endpoint, s.token, s.link);
        match kind {
            // A hostile or oversized message, or a flush: post it again
            // while the endpoint lives.
            Internal::AmRequest => {
                log::debug!("emulated-atomic request receive failed: {failure}");
                if matches!(failure, CompletionError::Truncated { .. }) {
                    self.am.counters.refused_requests += 1;
                }
                self.am_repost(index);
            }
            // A message longer than a reply on the reply's tag is none.
            Internal::AmReply if matches!(failure, CompletionError::Truncated { .. }) => {
                self.am.counters.forged_replies += 1;
                self.am_repost(index);
            }
            Internal::AmReply => {
                self.am.untrack(index);
                if let Some(b) = self.slab.release(index) {
                    self.spare.notify_bufs.push(b);
                }
                self.am_report(endpoint, token, Err(failure));
            }
            Internal::AmSend | Internal::No => {
                if let Some(b) = self.slab.release(index) {
                    self.am_recycle(b);
                }
                // A request that never left: its operation fails now.
                let (op, generation) = ((link & u64::from(u32::MAX)) as usize, link >> 32);
                let live = self.slab.slots.get(op).is_some_and(|s| {
                    s.in_use
                        && !s.abandoned
                        && s.role.internal() == Internal::AmReply
                        && s.generation == generation
                });
                if kind == Internal::AmSend && live {
                    let (endpoint, token) = (self.slab.slots[op].endpoint, self.slab.slots[op].token);
                    self.am_abandon(op as u32);
                    self.am_report(endpoint, token, Err(failure));
                }
            }
        }
    }

    fn am_report(
        &mut self,
        endpoint: u32,
        token: Token,
        result: std::result::Result<Option<u64>, CompletionError>,
    ) {
        if self
            .endpoints
            .get(endpoint as usize)
            .and_then(Option::as_ref)
            .is_none()
        {
            return;
        }
        let (result, value) = match result {
            Ok(v) => (Ok(()), v),
            Err(e) => (Err(e), None),
        };
        let mut c = Completion::outcome(token, endpoint, OpKind::Atomic, result);
        c.value = value;
        self.pending.push(c);
    }

    fn am_reply_arrived(&mut self, index: u32, len: usize, source: Option<u64>) {
        let s = &mut self.slab.slots[index as usize];
        let (endpoint, token, target) = (s.endpoint, s.token, s.peer);
        let Some(op) = self.am.tracked(index) else {
            // Not an operation in flight (cannot happen: abandoned slots
            // are swallowed before this); nothing to report.
            if let Some(b) = self.slab.release(index) {
                self.spare.notify_bufs.push(b);
            }
            return;
        };
        let decoded = s
            .buffer
            .as_mut()
            .ok_or(())
            .and_then(|b| decode_reply(b.header_mut(), len, op.request.cookie));
        // Where the provider says who sent it, the target alone may answer.
        let elsewhere = source.is_some_and(|a| a != ffi::FI_ADDR_NOTAVAIL && a != target);
        let (status, v) = match decoded {
            Ok(answer) if !elsewhere => answer,
            _ => {
                // Not the target's answer to this operation: dropped, and
                // the operation keeps waiting for the real one.
                self.am.counters.forged_replies += 1;
                log::debug!("emulated atomic: a reply that is not the target's answer was dropped");
                return self.am_repost(index);
            }
        };
        self.am.untrack(index);
        if let Some(b) = self.slab.release(index) {
            self.spare.notify_bufs.push(b);
        }
        // As natively: a fetching operation returns the old value.
        let result = match status {
            Status::Ok => Ok(op.request.op.fetches().then_some(v)),
            refusal => Err(refused(refusal.failure())),
        };
        self.am_report(endpoint, token, result);
    }

    /// What this loop refused of its peers' emulated-atomic traffic:
    /// forged replies, requests dropped unapplied, repeated requests,
    /// requests from origins that are no peer (docs/atomics.md, "What a
    /// peer can forge").
    pub fn atomic_counters(&self) -> AtomicCounters {
        self.am.counters
    }

    /// Post a request receive, or an operation's reply receive, again in
    /// its own slot.
    pub(super) fn am_repost(&mut self, index: u32) {
        let s = &self.slab.slots[index as usize];
        let (endpoint, internal, target) = (s.endpoint, s.role.internal(), s.peer);
        let Some(raw) = self.open_raw(endpoint) else {
            return self.am_drop_receive(index);
        };
        let (len, header, tag, src) = match (internal, self.am.tracked(index)) {
            (Internal::AmReply, Some(op)) => (
                REPLY_LEN,
                true,
                op.request.reply_tag,
                if self.rules.directed {
                    target
                } else {
                    ffi::FI_ADDR_UNSPEC
                },
            ),
            (Internal::AmReply, None) => return self.am_drop_receive(index),
            _ => (REQUEST_LEN, false, self.am.tags.request(), ffi::FI_ADDR_UNSPEC),
        };
        let domain = self.domain.clone();
        let s = &mut self.slab.slots[index as usize];
        let ctx = (&mut **s as *mut slab::OpSlot).cast::<c_void>();
        let Some(buf) = s.buffer.as_mut() else {
            return self.am_drop_receive(index);
        };
        let desc = if domain.mr_mode(ffi::FI_MR_LOCAL) {
            match buf.desc(&domain) {
                Ok(d) => d,
                Err(_) => return self.am_drop_receive(index),
            }
        } else {
            ptr::null_mut()
        };
        let bufp = buf.ptr(header);
        let gate = self.progress_gate();
        let rc = {
            let _gate = gate.as_ref().map(|g| g.lock());
            // SAFETY: the slot still owns its buffer (`len` bytes at bufp)
            // and stays in use; raw is enabled; ctx is the slot's.
            unsafe { raw_recv(raw, bufp, len, desc, src, Some((tag, 0)), ctx) }
        };
        if rc == -(ffi::FI_EAGAIN as isize) {
            self.am.reposts.push(index);
        } else if rc != 0 {
            log::warn!(
                op = "atomic receive", endpoint = endpoint, fi_errno = rc.unsigned_abs(),
                fi_error = strerror(rc.unsigned_abs() as u32).as_str();
                "emulated atomics: a receive could not be posted again: {}",
                strerror(rc.unsigned_abs() as u32)
            );
            self.am_drop_receive(index);
        }
    }

    /// A receive that cannot be posted again: a request receive is given
    /// up, an operation waiting for its reply fails.
    fn am_drop_receive(&mut self, index: u32) {
        let s = &self.slab.slots[index as usize];
        if s.role.internal() == Internal::AmReply {
            let (endpoint, token) = (s.endpoint, s.token);
            self.am.untrack(index);
            if let Some(b) = self.slab.release(index) {
                self.spare.notify_bufs.push(b);
            }
            let failure = refused((
                ffi::FI_EIO,
                "emulated atomic: its reply's receive could not be posted again after a forged reply",
            ));
            return self.am_report(endpoint, token, Err(failure));
        }
        self.am_drop_request(index);
    }

    fn am_drop_request(&mut self, index: u32) {
        if let Some(b) = self.slab.release(index) {
            self.am.bufs.push(b);
        }
        self.am.posted = self.am.posted.saturating_sub(1);
    }

    fn am_recycle(&mut self, b: Buffer) {
        if b.capacity() == 0 {
            self.spare.notify_bufs.push(b);
        } else {
            self.am.bufs.push(b);
        }
    }

    /// Post replies and receives that met a full queue. Called by `poll`.
    pub(super) fn am_flush(&mut self) {
        let reposts = std::mem::take(&mut self.am.reposts);
        for &i in &reposts {
            self.am_repost(i);
        }
        let mut outbox = std::mem::take(&mut self.am.outbox);
        for o in outbox.drain(..) {
            if let Some(o) = self.am_post_reply(o) {
                self.am.outbox.push(o);
            }
        }
        if self.am.outbox.is_empty() {
            self.am.outbox = outbox;
        }
        if self.am.reposts.is_empty() {
            let mut r = reposts;
            r.clear();
            self.am.reposts = r;
        }
    }

    /// Whether `am_flush` has work.
    pub(super) fn am_pending(&self) -> bool {
        !self.am.outbox.is_empty() || !self.am.reposts.is_empty()
    }
}

fn refused((code, text): (u32, &'static str)) -> CompletionError {
    CompletionError::Failed {
        code: ErrorCode(code),
        text: strerror(code),
        prov_errno: 0,
        prov_text: text.into(),
    }
}
