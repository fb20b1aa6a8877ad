//! Cancelling a posted receive (`fi_cancel`), for the layer above that
//! posts one receive on two loops and keeps whichever matches first (the
//! World's any-source receives over shared memory and the network).
//!
//! A cancelled receive completes with [`CompletionError::Cancelled`] and
//! its buffer; a receive that matched a message before the cancel took
//! effect completes as usual. Either way it completes exactly once, so
//! the loop's promise (one completion per operation) holds.

use super::slab::{Internal, NO_GROUP};
use super::state::EventLoop;
use super::types::{Completion, EndpointId, OpKind, Token};
use crate::error::{Error, Result};
use crate::ffi;

impl EventLoop {
    /// Ask the provider to cancel the receive posted on `id` with `token`
    /// (the oldest such, if several). `Ok(true)`: the provider took the
    /// request, and the receive completes either cancelled or, if a message
    /// matched it first, with that message. `Ok(false)`: no such receive is
    /// in flight any more (it completed already, or was never posted).
    /// A multi-receive buffer ([`EventLoop::recv_multi`]) is cancelled the
    /// same way: it comes back with `Cancelled`, after the pieces that
    /// landed in it.
    pub fn cancel_recv(&mut self, id: EndpointId, token: Token) -> Result<bool> {
        let raw = self.ep(id)?.raw;
        let found = self.slab.slots.iter_mut().find(|s| {
            s.in_use
                && s.endpoint == id.0
                && s.kind == OpKind::Recv
                && s.token == token
                && s.role.internal() == Internal::No
                && s.role.group() == NO_GROUP
                && !s.abandoned
        });
        let Some(slot) = found else {
            return Ok(false);
        };
        let ctx: *mut ffi::fi_context2 = &mut slot.ctx;
        // SAFETY: `raw` is this loop's open endpoint (checked by `ep`), and
        // `ctx` is the context of a receive in flight on it: its slot is
        // boxed and stays in place until the completion is read.
        let rc = unsafe { raw.cancel(ctx.cast()) };
        match rc {
            0 => Ok(true),
            rc if rc == -(ffi::FI_ENOENT as isize) => Ok(false),
            rc => Err(Error::from_rc("fi_cancel", rc as i64)),
        }
    }

    /// [`EventLoop::cancel_recv`], then the completion the provider wrote
    /// for it in `fi_cancel`, where that is the first in the queue: read
    /// with `fi_cq_readerr`, which runs none of the provider's progress (a
    /// look with `poll` runs it, and on `tcp;ofi_rxm` that is a system
    /// call). What was read is appended to `out`; the caller looks there
    /// for the receive's completion, and polls if it is not there (other
    /// completions came first, or a message had matched the receive).
    pub fn cancel_recv_now(
        &mut self,
        id: EndpointId,
        token: Token,
        out: &mut Vec<Completion>,
    ) -> Result<bool> {
        let found = self.cancel_recv(id, token)?;
        if found && self.pending.is_empty() {
            self.read_error()?;
            self.deliver(out);
        }
        Ok(found)
    }
}
