//! The CQ's error entries (`fi_cq_readerr`): which operation failed and
//! why, as a [`CompletionError`](super::types::CompletionError) that names
//! the provider's own error where it gives one; truncation, cancellation,
//! a lost peer and a timed-out one-sided operation each reported as such.

use super::completions::tag_of;
use super::frame::decode_header;
use super::slab;
use super::slab::NO_GROUP;
use super::state::EventLoop;
use super::types::{Completion, CompletionError, OpKind};
use crate::error::{strerror, Error, ErrorCode, Result};
use crate::ffi;
use crate::libfabric::CqError;
use crate::memory::buffer::HEADROOM;

impl EventLoop {
    pub(super) fn read_error(&mut self) -> Result<()> {
        let mut full = CqError::default();
        let rc = self.objects.cq.read_error(&mut full);
        let err = &full.entry;
        if rc == -(ffi::FI_EAGAIN as isize) {
            return Ok(());
        }
        if rc < 0 {
            return Err(Error::from_rc("fi_cq_readerr", rc as i64));
        }
        let Some(index) = self.slab.index_of(err.op_context) else {
            log::warn!(
                op = "completion", fi_errno = err.err.unsigned_abs(), fi_error = strerror(err.err.unsigned_abs()).as_str(),
                prov_errno = err.prov_errno;
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
        if self.slab.slots[index as usize].role == slab::Role::Peek {
            // FI_ENOMSG: no waiting message matched, which a peek reports
            // as having found nothing (peek.rs).
            let result = if code == ffi::FI_ENOMSG {
                Ok(())
            } else {
                Err(self.failure_of(index, &full, code))
            };
            self.peek_ended(index, result);
            return Ok(());
        }
        let internal = self.slab.slots[index as usize].role.internal();
        if internal != slab::Internal::No {
            let failure = if code == ffi::FI_ETRUNC {
                CompletionError::Truncated {
                    message_len: None,
                    buffer_len: self.slab.slots[index as usize].posted_len,
                }
            } else {
                self.failure_of(index, &full, code)
            };
            self.am_failed(index, internal, failure);
            return Ok(());
        }
        let (endpoint, kind, token, posted, group, lost) = {
            let s = &self.slab.slots[index as usize];
            (s.endpoint, s.kind, s.token, s.posted_len, s.role.group(), s.lost)
        };
        if group != NO_GROUP {
            let failure = self.failure_of(index, &full, code);
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
            self.stats.truncations += 1;
            Err(CompletionError::Truncated {
                message_len,
                buffer_len: posted.saturating_sub(overhead),
            })
        } else if lost || self.connection_closed(index, code) {
            Err(self.lost_failure(index))
        } else {
            Err(self.cq_failure(&full, code))
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
    fn failure_of(&self, index: u32, err: &CqError, code: u32) -> CompletionError {
        if self.slab.slots[index as usize].lost || self.connection_closed(index, code) {
            self.lost_failure(index)
        } else {
            self.cq_failure(err, code)
        }
    }

    /// Whether the provider cancelled a send on a connected (MSG)
    /// endpoint: the application cannot cancel a send, so its connection
    /// closed under it (tcp cancels what is in flight when the peer goes,
    /// before any lifeline can tell). That is the peer's loss, not a
    /// cancellation.
    fn connection_closed(&self, index: u32, code: u32) -> bool {
        code == ffi::FI_ECANCELED
            && self.objects.eq.is_some()
            && self.slab.slots[index as usize].kind == OpKind::Send
    }

    /// A completion error other than truncation, with the provider's text.
    pub(super) fn cq_failure(&self, full: &CqError, code: u32) -> CompletionError {
        if code == ffi::FI_ECANCELED {
            return CompletionError::Cancelled;
        }
        let prov = self.objects.cq.error_text(full);
        let err = &full.entry;
        CompletionError::Failed {
            code: ErrorCode(code),
            text: strerror(code),
            prov_errno: err.prov_errno,
            prov_text: prov,
        }
    }
}
