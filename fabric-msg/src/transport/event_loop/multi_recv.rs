//! Multi-receive buffers (`FI_MULTI_RECV`): many messages back to back in
//! one posted buffer, each reported as a piece, the buffer returned last.

use super::completions::tag_of;
use super::post::{Posting, Prepared};
use super::slab::Role;
use super::state::EventLoop;
use super::types::{Completion, EndpointId, OpKind, PostError, Token};
use crate::error::{Error, Result};
use crate::ffi;
use crate::memory::buffer::Buffer;

impl EventLoop {
    /// Post a multi-receive buffer (`FI_MULTI_RECV`): many messages land in
    /// it back to back, each completing with [`Completion::multi`] set; the
    /// completion that returns the buffer is the last. Needs
    /// [`Capability::MultiRecv`](crate::Capability::MultiRecv) and an
    /// unframed endpoint. [`LoopConfig::min_multi_recv`](super::types::LoopConfig::min_multi_recv) sets how much room
    /// must remain for the buffer to stay posted.
    pub fn recv_multi(&mut self, id: EndpointId, buf: Buffer, token: Token) -> Result<(), PostError> {
        let multi_recv = self
            .domain
            .profile
            .caps_granted
            .iter()
            .any(|c| c == "FI_MULTI_RECV");
        let (Prepared { raw, mut desc, .. }, buf) = self.prepare(id, buf, |ep| {
            if ep.framed || !multi_recv {
                return Err(Error::Unsupported {
                    what: "multi-receive buffers (needs FI_MULTI_RECV granted and unframed messages)".into(),
                    provider: self.domain.profile.provider.clone(),
                });
            }
            Ok(())
        })?;
        let len = buf.capacity();
        let what = Posting {
            endpoint: id,
            kind: OpKind::Recv,
            token,
            len,
            framed: false,
            multi: true,
            peer: ffi::FI_ADDR_UNSPEC,
            call: "fi_recvmsg",
            want: None,
        };
        let gate = self.progress_gate();
        self.post(what, buf, |bufp, ctx| {
            let _gate = gate.as_ref().map(|g| g.lock());
            let iov = libc::iovec {
                iov_base: bufp,
                iov_len: len,
            };
            let msg = ffi::fi_msg {
                msg_iov: &iov,
                desc: &mut desc,
                iov_count: 1,
                addr: ffi::FI_ADDR_UNSPEC,
                context: ctx,
                data: 0,
            };
            // SAFETY: as in `recv`; fi_recvmsg reads `msg` and `iov` during the
            // call only, and the buffer stays owned by the loop until the
            // completion flagged FI_MULTI_RECV.
            unsafe { raw.recvmsg(&msg, u64::from(ffi::FI_MULTI_RECV)) }
        })
    }

    /// The bytes of one message in a multi-receive buffer that is still
    /// posted. `None` once the buffer has come back (read it from there),
    /// or for a completion that is not a multi-receive piece.
    pub fn multi_recv_bytes(&self, c: &Completion) -> Option<&[u8]> {
        let (offset, len) = c.multi?;
        let (index, generation) = c.slot?;
        let slot = self.slab.slots.get(index as usize)?;
        if !slot.in_use || !(slot.role == Role::MultiRecv) || slot.generation != generation {
            return None;
        }
        // The provider wrote these bytes before reporting them and writes
        // only further on in the buffer until it returns it.
        slot.buffer.as_ref()?.payload_at(offset, len)
    }

    pub(super) fn complete_multi(&mut self, index: u32, e: &ffi::fi_cq_tagged_entry, source: Option<u64>) {
        let last = e.flags & u64::from(ffi::FI_MULTI_RECV) != 0;
        let slot = &mut self.slab.slots[index as usize];
        let (endpoint, token, generation) = (slot.endpoint, slot.token, slot.generation);
        let piece = (e.len > 0).then(|| ((e.buf as usize).wrapping_sub(slot.base), e.len));
        if let Some((offset, len)) = piece {
            slot.used = slot.used.max(offset + len);
        }
        if self
            .endpoints
            .get(endpoint as usize)
            .and_then(Option::as_ref)
            .is_none()
        {
            if last {
                self.slab.release(index);
            }
            return;
        }
        let data = (e.flags & u64::from(ffi::FI_REMOTE_CQ_DATA) != 0).then_some(e.data);
        let tag = tag_of(e.flags, e.tag);
        self.pending.push(Completion {
            token,
            endpoint: EndpointId(endpoint),
            kind: OpKind::Recv,
            buffer: None,
            tag,
            data,
            source,
            result: Ok(()),
            value: None,
            multi: piece,
            slot: Some((index, generation)),
            finishes: last,
            peeked: None,
        });
    }
}
