//! Emulated atomics, the target's side (`am.rs` has the whole story and
//! the origin's side): a peer's request is checked (its origin one of this
//! loop's own peers, room to answer, the request itself) before it is
//! applied, and the reply goes out from a pooled header-only buffer, or
//! waits in the outbox while the queue is full.

use super::am_state::Outgoing;
use super::am_wire::{
    apply, decode_request, encode_reply, Status, MAX_NAME, MAX_OUTBOX, REPLY_LEN, REQUEST_LEN,
};
use super::slab::Role;
use super::state::EventLoop;
use super::types::{OpKind, Token};
use crate::error::strerror;
use crate::ffi;
use crate::memory::buffer::Buffer;

impl EventLoop {
    /// A peer's request: check the origin, the room to answer and the
    /// request, then apply and answer; or drop it unapplied.
    pub(super) fn am_request_arrived(&mut self, index: u32, len: usize, source: Option<u64>) {
        let endpoint = self.slab.slots[index as usize].endpoint;
        let space = self.am.tags;
        let mut name = [0u8; MAX_NAME];
        let parsed = self.slab.slots[index as usize]
            .buffer
            .as_ref()
            .and_then(|b| b.payload_at(0, len.min(REQUEST_LEN)))
            .and_then(|b| decode_request(space, b))
            .map(|(r, n)| {
                name[..n.len()].copy_from_slice(n);
                (r, n.len())
            });
        let Some((req, name_len)) = parsed else {
            // Not a request of ours: no reply can be addressed; dropped.
            self.am.counters.refused_requests += 1;
            log::debug!("a malformed emulated-atomic request ({len} bytes) was dropped");
            return self.am_repost(index);
        };
        let to = match source.filter(|&s| s != ffi::FI_ADDR_NOTAVAIL) {
            Some(s) => Some(s),
            None => self.am_origin(&name[..name_len]),
        };
        let Some(addr) = to else {
            // No answer could reach the origin: not applied either.
            return self.am_repost(index);
        };
        let result = match self.am.applied.get(addr, req.cookie) {
            Some(result) => {
                self.am.counters.repeated_requests += 1;
                result
            }
            None if self.am.outbox.len() >= MAX_OUTBOX => {
                log::warn!(
                    "emulated atomics: {MAX_OUTBOX} replies wait for room; a request was refused unapplied"
                );
                self.am.counters.refused_requests += 1;
                return self.am_repost(index);
            }
            None => {
                let result = match apply(&self.am.regions, &req) {
                    Ok(v) => {
                        self.am.counters.applied_requests += 1;
                        (Status::Ok, v)
                    }
                    Err(s) => {
                        self.am.counters.denied_requests += 1;
                        (s, 0)
                    }
                };
                self.am.applied.remember(addr, req.cookie, result);
                result
            }
        };
        let mut buf = self.spare.notify_bufs.pop().unwrap_or_else(|| Buffer::new(0));
        *buf.header_mut() = encode_reply(result.0, req.cookie, result.1);
        let o = Outgoing {
            endpoint,
            addr,
            tag: req.reply_tag,
            buf,
        };
        if let Some(o) = self.am_post_reply(o) {
            if self.am.outbox.len() < MAX_OUTBOX {
                self.am.outbox.push(o);
            } else {
                // Only a repeated request gets here (a new one was checked
                // above): its first answer went or waits already.
                self.spare.notify_bufs.push(o.buf);
            }
        }
        self.am_repost(index);
    }

    /// The AV address of the origin that named itself `name`: a peer this
    /// loop inserted, or none (a request never inserts an address).
    fn am_origin(&mut self, name: &[u8]) -> Option<ffi::fi_addr_t> {
        let found = self.am.peers.find(name);
        if found.is_none() {
            self.am.counters.unknown_origins += 1;
            log::debug!(
                "emulated atomics: a request from an origin that is no peer of this loop was dropped"
            );
        }
        found
    }

    /// Post a reply once; it comes back if the queue has no room now.
    pub(super) fn am_post_reply(&mut self, mut o: Outgoing) -> Option<Outgoing> {
        let Some(raw) = self.open_raw(o.endpoint) else {
            self.spare.notify_bufs.push(o.buf);
            return None;
        };
        if self.slab.in_flight >= self.objects.cq_capacity {
            return Some(o);
        }
        let Ok(desc) = self.local_desc(&mut o.buf) else {
            self.spare.notify_bufs.push(o.buf);
            return None;
        };
        let (addr, tag, endpoint) = (o.addr, o.tag, o.endpoint);
        let bufp = o.buf.ptr(true);
        let slot = self.slab.acquire(endpoint, OpKind::Send, Token::REMOTE);
        let (index, ctx) = {
            slot.role = Role::AmSend;
            slot.link = u64::MAX;
            slot.buffer = Some(o.buf);
            (slot.index, slot.context())
        };
        // SAFETY: raw is enabled; REPLY_LEN bytes at bufp are owned by the
        // slot until its completion; ctx is the slot's.
        let rc = unsafe { raw.send(bufp, REPLY_LEN, desc, addr, Some(tag), None, ctx) };
        if rc == 0 {
            return None;
        }
        let buf = self.slab.release(index)?;
        if rc == -(ffi::FI_EAGAIN as isize) {
            return Some(Outgoing {
                endpoint,
                addr,
                tag,
                buf,
            });
        }
        log::warn!(
            op = "atomic reply", fi_addr = addr, fi_errno = rc.unsigned_abs(),
            fi_error = strerror(rc.unsigned_abs() as u32).as_str();
            "emulated atomic: a reply could not be sent: {}",
            strerror(rc.unsigned_abs() as u32)
        );
        self.spare.notify_bufs.push(buf);
        None
    }
}
