//! Posting: send, receive, inject, borrowed memory and split one-sided
//! transfers; a full queue (`FI_EAGAIN`) is progressed and retried for at
//! most `LoopConfig::post_timeout`.

use super::backlog;
use super::calls::{raw_recv, recv_call, send_call};
use super::frame::encode_header;
use super::resources::EndpointState;
use super::slab::Group;
use super::slab::Role;
use super::state::EventLoop;
use super::types::{CompletionError, EndpointId, OpKind, Peer, PostError, RecvOpts, SendOpts, Token};
use crate::error::{Error, Result};
use crate::ffi;
use crate::libfabric::RawEndpoint;
use crate::memory::buffer::{Buffer, HEADROOM};
use crate::memory::lease::Lease;
use crate::memory::mr::RegionInner;
use std::os::raw::c_void;
use std::ptr;
use std::sync::Arc;
use std::time::Instant;

/// An endpoint ready for a post, from [`EventLoop::prepare`].
pub(super) struct Prepared {
    pub(super) raw: RawEndpoint,
    pub(super) framed: bool,
    pub(super) desc: *mut c_void,
}

/// What is being posted: for [`EventLoop::post`].
pub(super) struct Posting {
    pub(super) endpoint: EndpointId,
    pub(super) kind: OpKind,
    pub(super) token: Token,
    /// Bytes handed to libfabric (header included on framed endpoints).
    pub(super) len: usize,
    pub(super) framed: bool,
    /// A multi-receive buffer.
    pub(super) multi: bool,
    /// The peer it is addressed to (`FI_ADDR_UNSPEC`: any).
    pub(super) peer: ffi::fi_addr_t,
    /// The libfabric function that posts it, for errors.
    pub(super) call: &'static str,
    /// A tagged receive's `(tag, ignore)`.
    pub(super) want: Option<(u64, u64)>,
}

/// A one-sided operation to post: for [`EventLoop::post_parts`].
pub(crate) struct Parts<'a> {
    pub(crate) endpoint: EndpointId,
    pub(crate) kind: OpKind,
    pub(crate) token: Token,
    /// Posts it takes (at least 1).
    pub(crate) count: usize,
    /// Held by every part until its completion.
    pub(crate) region: Option<&'a Arc<RegionInner>>,
    pub(crate) lease: Option<&'a Arc<Lease>>,
    pub(crate) atomic: bool,
    /// Owned by the last part (write_data's follow-up message).
    pub(crate) last_buffer: Option<Buffer>,
    /// The peer it is addressed to.
    pub(crate) peer: ffi::fi_addr_t,
    /// The libfabric function that posts it, for errors.
    pub(crate) call: &'static str,
}

impl EventLoop {
    /// Post a send of `buf` (its `len()` bytes) to `peer`.
    pub fn send(&mut self, peer: &Peer, buf: Buffer, opts: SendOpts, token: Token) -> Result<(), PostError> {
        let payload = buf.len();
        let (Prepared { raw, framed, desc }, mut buf) = self.prepare(peer.endpoint, buf, |ep| {
            self.am.tags.check_send(opts.tag, self.rules.poster)?;
            self.check_len(peer, payload, if ep.framed { HEADROOM } else { 0 })
        })?;
        let len = payload + if framed { HEADROOM } else { 0 };
        let mut data = opts.data;
        if framed {
            *buf.header_mut() = encode_header(payload, opts.data);
            data = None;
        }
        let addr = peer.addr;
        let what = Posting {
            endpoint: peer.endpoint,
            kind: OpKind::Send,
            token,
            len,
            framed,
            multi: false,
            peer: addr,
            call: send_call(opts.tag, data),
            want: None,
        };
        let args = backlog::SendArgs {
            raw,
            desc,
            addr,
            tag: opts.tag,
            data,
        };
        self.post_send(what, buf, args)
    }

    /// Once per loop: a masked receive on a provider that matches masks
    /// wrongly against messages that arrived first.
    #[cold]
    fn warn_tag_mask(&mut self) {
        self.rules.warned_tag_mask = true;
        if let Some(why) = &self.domain.profile.tag_mask_defect {
            log::warn!(
                "a tagged receive with an ignore mask on {}: {why}. Receive with exact tags here, or use \
                 libfabric 1.19 or newer, or another provider (docs/reliability.md, \"Tag masks on shm\")",
                self.domain.profile.provider
            );
        }
    }

    /// Post a receive into `buf` (its whole capacity).
    pub fn recv(
        &mut self,
        id: EndpointId,
        buf: Buffer,
        opts: RecvOpts,
        token: Token,
    ) -> Result<(), PostError> {
        let mut src = ffi::FI_ADDR_UNSPEC;
        let mut tag = None;
        let (Prepared { raw, framed, desc }, buf) = self.prepare(id, buf, |_| {
            src = self.source_addr(&opts)?;
            tag = self.am.tags.recv(opts.tag, self.rules.poster)?;
            Ok(())
        })?;
        if opts.tag.is_some_and(|(_, ignore)| ignore != 0) && !self.rules.warned_tag_mask {
            self.warn_tag_mask();
        }
        let len = buf.capacity() + if framed { HEADROOM } else { 0 };
        let what = Posting {
            endpoint: id,
            kind: OpKind::Recv,
            token,
            len,
            framed,
            multi: false,
            peer: src,
            call: recv_call(tag),
            want: tag,
        };
        let gate = self.progress_gate();
        self.post(what, buf, |bufp, ctx| {
            let _gate = gate.as_ref().map(|g| g.lock());
            // SAFETY: as in `send`; the buffer has `len` writable bytes at bufp.
            unsafe { raw_recv(raw, bufp, len, desc, src, tag, ctx) }
        })
    }

    /// Send `len` bytes at `data` without handing over a [`Buffer`]. The
    /// completion comes back with `buffer: None`.
    ///
    /// # Safety
    /// The `len` bytes at `data` must stay allocated and must not be written
    /// until the loop has returned this operation's completion from
    /// [`EventLoop::poll`], or the endpoint was closed
    /// ([`EventLoop::close_endpoint`]), or the loop was dropped — whichever
    /// comes first. A failed post (an `Err`) does not use the memory.
    pub unsafe fn send_borrowed(
        &mut self,
        peer: &Peer,
        data: *const u8,
        len: usize,
        opts: SendOpts,
        token: Token,
    ) -> Result<()> {
        let ep = self.ep(peer.endpoint)?;
        let raw = ep.raw;
        self.check_borrowable(ep.framed)?;
        self.check_len(peer, len, 0)?;
        self.am.tags.check_send(opts.tag, self.rules.poster)?;
        let addr = peer.addr;
        let call = send_call(opts.tag, opts.data);
        self.behind_backlog(raw, addr, call)?;
        let what = Posting {
            endpoint: peer.endpoint,
            kind: OpKind::Send,
            token,
            len,
            framed: false,
            multi: false,
            peer: addr,
            call,
            want: None,
        };
        self.post_borrowed(what, data as *mut u8, move |bufp, desc, ctx| {
            // SAFETY: raw is enabled; the caller keeps `len` bytes at bufp
            // valid until the completion; ctx is the slot's fi_context2.
            unsafe { raw.send(bufp, len, desc, addr, opts.tag, opts.data, ctx) }
        })
    }

    /// Receive into `len` bytes at `data` without handing over a
    /// [`Buffer`]. The completion's `multi` field is `Some((0, received))`,
    /// and `buffer` is `None`.
    ///
    /// # Safety
    /// The `len` bytes at `data` must stay allocated, must not be read or
    /// written by anyone else, until the loop has returned this operation's
    /// completion from [`EventLoop::poll`], or the endpoint was closed, or
    /// the loop was dropped — whichever comes first. A failed post (an
    /// `Err`) does not use the memory.
    pub unsafe fn recv_borrowed(
        &mut self,
        id: EndpointId,
        data: *mut u8,
        len: usize,
        opts: RecvOpts,
        token: Token,
    ) -> Result<()> {
        let ep = self.ep(id)?;
        let raw = ep.raw;
        self.check_borrowable(ep.framed)?;
        let src = self.source_addr(&opts)?;
        let tag = self.am.tags.recv(opts.tag, self.rules.poster)?;
        let what = Posting {
            endpoint: id,
            kind: OpKind::Recv,
            token,
            len,
            framed: false,
            multi: false,
            peer: src,
            call: recv_call(tag),
            want: tag,
        };
        let gate = self.progress_gate();
        self.post_borrowed(what, data, move |bufp, desc, ctx| {
            let _gate = gate.as_ref().map(|g| g.lock());
            // SAFETY: as in `send_borrowed`; `len` writable bytes at bufp.
            unsafe { raw_recv(raw, bufp, len, desc, src, tag, ctx) }
        })
    }

    /// Refuse a message of `len` payload bytes (plus `overhead` of
    /// fabric-msg's header) that the fabric or the peer cannot take.
    pub(super) fn check_len(&self, peer: &Peer, len: usize, overhead: usize) -> Result<()> {
        self.lost.check(peer.endpoint.0, peer.addr)?;
        let max = self.domain.profile.max_msg_size.min(peer.agreement.max_msg_size);
        if (len + overhead) as u64 > max {
            let max = usize::try_from(max).unwrap_or(usize::MAX) - overhead;
            return Err(Error::TooLarge {
                what: "message",
                len,
                max,
            });
        }
        Ok(())
    }

    /// The address a receive matches: one peer (needs FI_DIRECTED_RECV) or any.
    pub(super) fn source_addr(&self, opts: &RecvOpts) -> Result<ffi::fi_addr_t> {
        match opts.from {
            None => Ok(ffi::FI_ADDR_UNSPEC),
            Some(_) if !self.rules.directed => Err(Error::Unsupported {
                what: "receiving from one peer only (FI_DIRECTED_RECV)".into(),
                provider: self.domain.profile.provider.clone(),
            }),
            Some(p) => self.lost.check(p.endpoint.0, p.addr).map(|()| p.addr),
        }
    }

    pub(super) fn check_borrowable(&self, framed: bool) -> Result<()> {
        if framed {
            return Err(Error::Unsupported {
                what: "borrowed memory on a framed endpoint (no room for fabric-msg's header): use Buffer"
                    .into(),
                provider: self.domain.profile.provider.clone(),
            });
        }
        Ok(())
    }

    /// Post on borrowed memory, registering it for the operation where the
    /// provider needs local descriptors.
    pub(super) fn post_borrowed(
        &mut self,
        what: Posting,
        data: *mut u8,
        mut op: impl FnMut(*mut c_void, *mut c_void, *mut c_void) -> isize,
    ) -> Result<()> {
        let mr = if self.domain.mr_mode(ffi::FI_MR_LOCAL) {
            Some(crate::memory::buffer::LocalMr::register(
                &self.domain,
                data,
                what.len.max(1),
            )?)
        } else {
            None
        };
        let desc = mr.as_ref().map_or(ptr::null_mut(), |m| m.desc());
        self.wait_for_room()?;
        let (index, _, ctx) = self.slot_for(&what, data as usize);
        self.slab.slots[index as usize].borrowed_mr = mr;
        let bufp = data.cast::<c_void>();
        match self.retry(what.call, || op(bufp, desc, ctx)) {
            Ok(_) => Ok(()),
            Err(e) => {
                self.slab.release(index);
                Err(e)
            }
        }
    }

    /// The largest payload [`EventLoop::inject`] takes on this loop's
    /// endpoints: the profile's `inject_size`, less fabric-msg's header
    /// where the loop frames messages.
    pub fn inject_max(&self) -> usize {
        inject_room(self.domain.profile.inject_size, self.framed())
    }

    /// Send a small message without a completion; `bytes` is copied before
    /// this returns. At most the profile's `inject_size` (less fabric-msg's
    /// header on framed endpoints).
    pub fn inject(&mut self, peer: &Peer, bytes: &[u8], opts: SendOpts) -> Result<()> {
        self.inject_or_not(peer, bytes, opts, true).map(drop)
    }

    /// [`EventLoop::inject`] where it need not wait: `Ok(false)`, with
    /// nothing sent, where `inject` would wait for sends to `peer` still
    /// in the loop's backlog or for room in the provider's queue. For a
    /// caller that must not hold the loop (the tokio adapter's
    /// `LoopHandle::inject`, which then sends a copy instead).
    pub fn try_inject(&mut self, peer: &Peer, bytes: &[u8], opts: SendOpts) -> Result<bool> {
        self.inject_or_not(peer, bytes, opts, false)
    }

    /// `inject`'s body; with `wait` off, `Ok(false)` instead of any wait.
    fn inject_or_not(&mut self, peer: &Peer, bytes: &[u8], opts: SendOpts, wait: bool) -> Result<bool> {
        self.am.tags.check_send(opts.tag, self.rules.poster)?;
        self.lost.check(peer.endpoint.0, peer.addr)?;
        let ep = self.ep(peer.endpoint)?;
        let (raw, framed) = (ep.raw, ep.framed);
        let overhead = if framed { HEADROOM } else { 0 };
        let room = inject_room(self.domain.profile.inject_size, framed);
        if bytes.len() > room {
            return Err(Error::TooLarge {
                what: "injected message",
                len: bytes.len(),
                max: room,
            });
        }
        let len = bytes.len() + overhead;
        let mut data = opts.data;
        if framed {
            self.spare.scratch[..HEADROOM].copy_from_slice(&encode_header(bytes.len(), opts.data));
            data = None;
        }
        self.spare.scratch[overhead..len].copy_from_slice(bytes);
        let (addr, p) = (peer.addr, self.spare.scratch.as_ptr() as *const c_void);
        // Indexed, not matched: this runs for every small message.
        const CALLS: [&str; 4] = ["fi_inject", "fi_tinject", "fi_injectdata", "fi_tinjectdata"];
        let call = CALLS[usize::from(opts.tag.is_some()) | usize::from(data.is_some()) << 1];
        // SAFETY: raw is enabled; inject copies the `len` bytes at `p`
        // before returning, and `len` fits the inject size (checked).
        let post = || unsafe { raw.inject(p, len, addr, opts.tag, data) };
        if wait {
            self.behind_backlog(raw, addr, call)?;
            self.retry(call, post)?;
        } else {
            if self.backlog.holds(raw, addr) {
                return Ok(false);
            }
            let rc = post();
            if rc == -(ffi::FI_EAGAIN as isize) {
                self.stats.retries += 1;
                return Ok(false);
            }
            crate::error::check(call, rc as i64)?;
        }
        self.stats.sent(peer.endpoint.0, addr, bytes.len());
        Ok(true)
    }

    /// The checks every post of a `Buffer` makes: the endpoint is open, the
    /// operation's own `check` passes, and the buffer has its local
    /// descriptor. On failure the buffer comes back with the error.
    pub(super) fn prepare(
        &self,
        id: EndpointId,
        mut buf: Buffer,
        check: impl FnOnce(&EndpointState) -> Result<()>,
    ) -> Result<(Prepared, Buffer), PostError> {
        let prepared = self.ep(id).and_then(|ep| {
            check(ep)?;
            let desc = self.local_desc(&mut buf)?;
            Ok(Prepared {
                raw: ep.raw,
                framed: ep.framed,
                desc,
            })
        });
        match prepared {
            Ok(p) => Ok((p, buf)),
            Err(error) => Err(PostError {
                error,
                buffer: Some(buf),
            }),
        }
    }

    pub(crate) fn local_desc(&self, buf: &mut Buffer) -> Result<*mut c_void> {
        if self.domain.mr_mode(ffi::FI_MR_LOCAL) {
            buf.desc(&self.domain)
        } else {
            Ok(ptr::null_mut())
        }
    }

    /// A slot for `what`, whose memory starts at `base`, with every field
    /// a posting sets (one place, so none is forgotten on one path): its
    /// index, generation and the context libfabric is handed.
    pub(super) fn slot_for(&mut self, what: &Posting, base: usize) -> (u32, u64, *mut c_void) {
        let slot = self.slab.acquire(what.endpoint.0, what.kind, what.token);
        slot.posted_len = what.len;
        if what.multi {
            slot.role = Role::MultiRecv;
        }
        slot.base = base;
        slot.peer = what.peer;
        slot.want = what.want;
        (slot.index, slot.generation, slot.context())
    }

    /// Take a slot, post, and retry on `-FI_EAGAIN` while progressing.
    pub(super) fn post(
        &mut self,
        what: Posting,
        mut buf: Buffer,
        mut op: impl FnMut(*mut c_void, *mut c_void) -> isize,
    ) -> Result<(), PostError> {
        // Never more operations in flight than the CQ can hold.
        if let Err(error) = self.wait_for_room() {
            return Err(PostError {
                error,
                buffer: Some(buf),
            });
        }
        let bufp = buf.ptr(what.framed);
        let (index, _, ctx) = self.slot_for(&what, bufp as usize);
        self.slab.slots[index as usize].buffer = Some(buf);
        match self.retry(what.call, || op(bufp, ctx)) {
            Ok(_) => Ok(()),
            Err(error) => Err(PostError {
                error,
                buffer: self.slab.release(index),
            }),
        }
    }

    /// Post a one-sided operation in `p.count` parts; `op(part, slot, ctx)`
    /// posts one. Several parts complete once, as a group. If the first
    /// part cannot be posted the error comes back and nothing is in
    /// flight; if a later one cannot, the transfer completes (after the
    /// posted parts) with [`CompletionError::PartlyPosted`].
    pub(crate) fn post_parts(
        &mut self,
        mut p: Parts<'_>,
        mut op: impl FnMut(usize, u32, *mut c_void) -> isize,
    ) -> Result<()> {
        let group = (p.count > 1).then(|| {
            let g = Group {
                endpoint: p.endpoint.0,
                kind: p.kind,
                token: p.token,
                remaining: p.count,
                error: None,
            };
            match self.slab.groups.free.pop() {
                Some(i) => {
                    self.slab.groups.list[i as usize] = g;
                    i
                }
                None => {
                    self.slab.groups.list.push(g);
                    self.slab.groups.list.len() as u32 - 1
                }
            }
        });
        let timeout = self.cfg.rma_timeout;
        for part in 0..p.count {
            let posted = self.wait_for_room().and_then(|()| {
                let slot = self.slab.acquire(p.endpoint.0, p.kind, p.token);
                let (index, ctx) = {
                    slot.region = p.region.cloned();
                    slot.lease = p.lease.cloned();
                    slot.role = match group {
                        Some(g) => Role::Part(g),
                        None if p.atomic => Role::FetchingAtomic,
                        None => Role::Whole,
                    };
                    slot.expires = timeout.map(|t| Instant::now() + t);
                    slot.peer = p.peer;
                    if part + 1 == p.count {
                        slot.buffer = p.last_buffer.take();
                    }
                    (slot.index, slot.context())
                };
                if timeout.is_some() {
                    self.slab.timed += 1;
                }
                self.retry(p.call, || op(part, index, ctx))
                    .map(|_| ())
                    .inspect_err(|_| {
                        if let Some(b) = self.slab.release(index) {
                            self.spare.notify_bufs.push(b);
                        }
                    })
            });
            let Err(error) = posted else { continue };
            let Some(g) = group else { return Err(error) };
            if part == 0 {
                self.slab.groups.list[g as usize].remaining = 0;
                self.slab.groups.free.push(g);
                return Err(error);
            }
            let entry = &mut self.slab.groups.list[g as usize];
            entry.error.get_or_insert(CompletionError::PartlyPosted {
                posted: part,
                parts: p.count,
                error: error.to_string(),
            });
            entry.remaining -= p.count - part;
            if entry.remaining == 0 {
                self.end_group(g);
            }
            return Ok(());
        }
        Ok(())
    }
}

/// What an inject of `inject_size` bytes leaves for the payload.
fn inject_room(inject_size: usize, framed: bool) -> usize {
    inject_size.saturating_sub(if framed { HEADROOM } else { 0 })
}
