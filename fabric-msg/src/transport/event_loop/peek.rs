//! Looking at the messages waiting for a receive without taking them
//! (`FI_PEEK`): what MPI's `Iprobe` is built on, and the World's matched
//! probe too (`world/probe.rs`).
//!
//! A peek is an operation like a receive: it takes a slot and completes in
//! `poll`, as [`OpKind::Peek`] with what it found in
//! [`Completion::peeked`], or `None` when no waiting message matched (the
//! provider's `FI_ENOMSG`, which is no failure).
//!
//! `FI_CLAIM` (reserve the message found for one later receive) is not
//! offered: libfabric 1.17's ofi_rxm hands a claimed message to the receive
//! by its first segment only (`rxm_trecvmsg` calls `rxm_handle_rx_buf`
//! where an unexpected segmented message needs `rxm_handle_unexp_sar`), so
//! a claimed 20,000-byte message on tcp;ofi_rxm never completes (seen
//! here). A receive for the exact tag a peek reported, posted before any
//! other receive, takes the same message: the oldest waiting one with that
//! tag, which the peek found.
//!
//! Where a provider cannot peek the loop says so before posting: shm before
//! libfabric 1.19 ignores the flag and would take the message into no
//! memory (`Profile::peek_defect`); and on endpoints that frame messages
//! with fabric-msg's header the length a peek reports is not the payload's.

use super::calls::recv_call;
use super::slab::Role;
use super::state::EventLoop;
use super::types::{Completion, EndpointId, OpKind, Peeked, RecvOpts, Token};
use crate::error::{Error, Result};
use crate::ffi;
use std::ptr;

/// `FI_PEEK` as the flags argument (its type differs between libfabric
/// 1.17's and 2.1's headers).
#[allow(clippy::unnecessary_cast)]
const PEEK: u64 = ffi::FI_PEEK as u64;

impl EventLoop {
    /// Whether peeks work on endpoint `id`: `Err` says why not.
    pub fn check_peek(&self, id: EndpointId) -> Result<()> {
        let ep = self.ep(id)?;
        let provider = &self.domain.profile.provider;
        if let Some(why) = &self.domain.profile.peek_defect {
            return Err(Error::Unsupported {
                what: format!(
                    "a peek at waiting messages (FI_PEEK, what probe needs: {why}; use libfabric 1.19 or \
                     newer, or another provider: FABRIC_MSG_SHM=0 keeps a World off shm)"
                ),
                provider: provider.clone(),
            });
        }
        if ep.framed {
            return Err(Error::Unsupported {
                what: "a peek on an endpoint whose messages carry fabric-msg's header (the provider would \
                       report the framed length)"
                    .into(),
                provider: provider.clone(),
            });
        }
        Ok(())
    }

    /// Look for a message waiting on endpoint `id` that a receive with
    /// `opts` would take, without taking it. Completes in `poll` with
    /// `token`, kind [`OpKind::Peek`]: [`Completion::peeked`] has the
    /// message's length (its tag, data and source are the completion's),
    /// or is `None` if no message matched.
    ///
    /// A message still on its way is not waiting: a peek that finds nothing
    /// says nothing about what arrives a moment later.
    pub fn peek(&mut self, id: EndpointId, opts: RecvOpts, token: Token) -> Result<()> {
        self.check_peek(id)?;
        let raw = self.ep(id)?.raw;
        let src = self.source_addr(&opts)?;
        let (tag, ignore) = self
            .am
            .tags
            .recv(opts.tag, self.rules.poster)?
            .ok_or_else(|| Error::Usage("a peek looks for a tagged message: give its tag".into()))?;
        self.wait_for_room()?;
        let slot = self.slab.acquire(id.0, OpKind::Peek, token);
        slot.role = Role::Peek;
        slot.peer = src;
        slot.want = Some((tag, ignore));
        let (index, ctx) = (slot.index, slot.context());
        let msg = ffi::fi_msg_tagged {
            msg_iov: ptr::null(),
            desc: ptr::null_mut(),
            iov_count: 0,
            addr: src,
            tag,
            ignore,
            context: ctx,
            data: 0,
        };
        let gate = self.progress_gate();
        let posted = self.retry(recv_call(Some((tag, ignore))), || {
            let _gate = gate.as_ref().map(|g| g.lock());
            // SAFETY: raw is open (looked up above); the peek names no
            // memory; its context is the slot, which stays until its
            // completion is read; `msg` is read during the call only.
            unsafe { raw.trecvmsg(&msg, PEEK) }
        });
        if let Err(e) = posted {
            self.slab.release(index);
            return Err(e);
        }
        Ok(())
    }

    /// A peek's completion: what it found.
    pub(super) fn complete_peek(&mut self, index: u32, e: &ffi::fi_cq_tagged_entry, source: Option<u64>) {
        let endpoint = self.slab.slots[index as usize].endpoint;
        let token = self.slab.slots[index as usize].token;
        self.slab.release(index);
        let mut c = Completion::outcome(token, endpoint, OpKind::Peek, Ok(()));
        c.tag = e.tag;
        c.source = source;
        c.data = (e.flags & u64::from(ffi::FI_REMOTE_CQ_DATA) != 0).then_some(e.data);
        c.peeked = Some(Peeked { len: e.len });
        self.pending.push(c);
    }

    /// A peek that found nothing (`FI_ENOMSG`), or failed otherwise.
    pub(super) fn peek_ended(
        &mut self,
        index: u32,
        result: std::result::Result<(), super::types::CompletionError>,
    ) {
        let (endpoint, token) = {
            let s = &self.slab.slots[index as usize];
            (s.endpoint, s.token)
        };
        self.slab.release(index);
        self.pending
            .push(Completion::outcome(token, endpoint, OpKind::Peek, result));
    }
}
