//! The event loop: one completion queue per domain, every endpoint bound to
//! it, every operation handed back by its token.
//!
//! The shape is mio's: a reusable completion buffer, user-chosen tokens, and
//! `poll` with an optional timeout. An [`EventLoop`] owns its domain, its CQ
//! and AV, its endpoints and every operation in flight with that
//! operation's buffer, so nothing the NIC may still touch can be freed.
//!
//! Promises:
//! - Every posted operation yields exactly one [`Completion`], unless its
//!   endpoint is closed first; then it yields none, and its buffer is freed
//!   by the loop.
//! - A token never comes back after its endpoint was closed.
//! - When a post meets a full queue (`-FI_EAGAIN`) the loop progresses the
//!   CQ and retries, for at most [`LoopConfig::post_timeout`]; completions
//!   reaped meanwhile are kept for the next `poll`, never lost.
//! - A message larger than the posted buffer completes with
//!   [`CompletionError::Truncated`] naming both sizes; nothing overflows.
//! - Buffers are owned by the loop while their operation is in flight, and
//!   come back in the completion (or with a failed post's error).
//!
//! # Threads
//!
//! An `EventLoop` is `Send` but not `Sync`: every call takes `&mut self`,
//! so one thread drives it at a time, which is all any libfabric threading
//! level asks. [`Completion`], [`Buffer`] and [`Peer`] are `Send`, so
//! completions can be consumed on another thread ([`EventLoop::forward`]).
//!
//! Bytes of a multi-receive piece are borrowed from the loop, so the loop
//! cannot be polled (and the buffer cannot come back) while they are held:
//!
//! ```compile_fail
//! # fn f(ev: &mut fabric_msg::EventLoop, c: &fabric_msg::Completion) {
//! let bytes = ev.multi_recv_bytes(c).unwrap();
//! let mut out = Vec::new();
//! ev.poll(&mut out, None).unwrap(); // error: `ev` is borrowed by `bytes`
//! println!("{bytes:?}");
//! # }
//! ```

use crate::buffer::{Buffer, HEADROOM};
use crate::domain::{close_fid, DomainInner};
use crate::error::{check, strerror, Error, ErrorCode, Result};
use crate::ffi;
use crate::info::EndpointType;
use crate::mr::{Lease, RegionInner};
use crate::profile::{Agreement, Profile};
use std::fmt;
use std::os::raw::c_void;
use std::ptr;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A value chosen by the application to recognise an operation's completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Token(pub u64);

impl Token {
    /// The token of a [`OpKind::RemoteWrite`] notice that used up no
    /// receive of this side (the provider delivers remote CQ data on its own).
    pub const REMOTE: Token = Token(u64::MAX);
}

/// An endpoint of an [`EventLoop`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EndpointId(u32);

impl EndpointId {
    pub(crate) fn new(index: u32) -> Self {
        EndpointId(index)
    }
}

/// A peer reachable from one endpoint, as connection bootstrap returns it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peer {
    pub(crate) endpoint: EndpointId,
    pub(crate) addr: ffi::fi_addr_t,
    /// Sizes both sides agreed on.
    pub agreement: Agreement,
}

impl Peer {
    /// A peer at the other end of a connected (MSG) endpoint.
    pub(crate) fn connected(endpoint: EndpointId, agreement: Agreement) -> Peer {
        Peer {
            endpoint,
            addr: ffi::FI_ADDR_UNSPEC,
            agreement,
        }
    }

    /// The local endpoint this peer is reached through.
    pub fn endpoint(&self) -> EndpointId {
        self.endpoint
    }

    /// The peer's libfabric address (`fi_addr_t`) in the endpoint's AV;
    /// compare with [`Completion::source`].
    pub fn fi_addr(&self) -> u64 {
        self.addr
    }
}

/// What kind of operation completed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum OpKind {
    /// A send (tagged or not).
    Send,
    /// A receive (tagged or not).
    Recv,
    /// An RMA read into local memory.
    Read,
    /// An RMA write (with or without immediate data).
    Write,
    /// An atomic operation; a fetched value is in [`Completion::value`].
    Atomic,
    /// A peer's [`EventLoop::write_data`] landed here: its data is in place
    /// and its immediate value is in [`Completion::data`]. Where the
    /// fabric delivers that value through a receive (`FI_RX_CQ_DATA`, or
    /// fabric-msg's follow-up message where there is no remote CQ data),
    /// the receive's token and (empty) buffer come back with it; elsewhere
    /// the token is [`Token::REMOTE`].
    RemoteWrite,
}

/// How `poll` waits when nothing is ready.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitMode {
    /// Spin on the CQ: lowest latency, one busy core.
    Spin,
    /// Sleep on the CQ's wait fd (after `fi_trywait`); spins where the
    /// provider has no wait object.
    Block,
}

/// Tuning for an [`EventLoop`].
#[derive(Debug, Clone)]
pub struct LoopConfig {
    /// How long a post may retry on a full queue before giving up.
    pub post_timeout: Duration,
    /// How `poll` waits.
    pub wait: WaitMode,
    /// In [`WaitMode::Block`], how long `poll` spins on the CQ before it
    /// sleeps on the wait fd. Waking a sleeping thread costs tens of
    /// microseconds (more in VMs); a short spin catches replies that come
    /// quickly at the price of that much CPU per wait. `Duration::ZERO`:
    /// sleep at once.
    pub spin_before_block: Duration,
    /// Completion queue entries; `None`: room for two endpoints' queues
    /// (capped by the device's `max_cqe`). At most this many operations are
    /// in flight at once: a post beyond it waits as for a full queue.
    pub cq_size: Option<usize>,
    /// Frame every message with fabric-msg's 16-byte header (payload length
    /// and immediate data) even where the profile does not ask for it. The
    /// profile frames where the fabric has no remote CQ data (iWARP) and
    /// where a provider truncates silently (`udp;ofi_rxd`). Peers compare it
    /// at connect time.
    pub force_framing: bool,
    /// `FI_OPT_MIN_MULTI_RECV`: a multi-receive buffer is released once
    /// less than this many bytes remain free. `None`: the provider's default.
    pub min_multi_recv: Option<usize>,
    /// Most bytes one RMA post carries; larger transfers are split (and
    /// complete once, when every part has). `None`: the fabric's and the
    /// peer's `max_msg_size`.
    pub rma_chunk: Option<usize>,
    /// A one-sided operation (RMA, atomic) not completed after this long
    /// completes with [`CompletionError::TimedOut`]; some providers never
    /// complete an access the target refused (a revoked key on `shm` and
    /// `udp;ofi_rxd` in libfabric 1.17). `None`: wait for ever.
    pub rma_timeout: Option<Duration>,
}

impl Default for LoopConfig {
    fn default() -> Self {
        LoopConfig {
            post_timeout: Duration::from_secs(5),
            wait: WaitMode::Spin,
            spin_before_block: Duration::from_micros(50),
            cq_size: None,
            force_framing: false,
            min_multi_recv: None,
            rma_chunk: None,
            rma_timeout: Some(Duration::from_secs(30)),
        }
    }
}

/// A completion error reported by the provider.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CompletionError {
    /// The message was larger than the posted buffer.
    #[error(
        "message of {} truncated to the {buffer_len}-byte buffer posted for it (FI_ETRUNC); post a larger buffer",
        .message_len.map_or("unreported size (the provider does not say)".to_string(), |l| format!("{l} bytes"))
    )]
    Truncated {
        /// Size of the message that arrived, where the provider reports it
        /// (`tcp;ofi_rxm` in libfabric 1.17 does not).
        message_len: Option<usize>,
        /// Capacity of the buffer posted.
        buffer_len: usize,
    },
    /// A one-sided operation did not complete within
    /// [`LoopConfig::rma_timeout`]. Its memory stays registered and held
    /// until the provider lets go of it or the endpoint is closed.
    #[error(
        "no completion after {0:?}: the peer may have revoked the key, died, or stopped polling its loop \
         (needed for progress on some providers); the operation's memory stays held until the provider \
         releases it or the endpoint is closed"
    )]
    TimedOut(Duration),
    /// The operation was cancelled.
    #[error("operation cancelled (FI_ECANCELED)")]
    Cancelled,
    /// Any other error: libfabric's code, the provider's errno and its text
    /// (`fi_cq_strerror`).
    #[error("{code}: {text} (provider errno {prov_errno}: {prov_text})")]
    Failed {
        /// The `FI_E*` code.
        code: ErrorCode,
        /// libfabric's text for it.
        text: String,
        /// The provider's own error number.
        prov_errno: i32,
        /// The provider's text for it.
        prov_text: String,
    },
    /// A split transfer of which only some parts could be posted; the
    /// posted parts finished, the rest were never started.
    #[error("only {posted} of {parts} parts of the transfer were posted: {error}")]
    PartlyPosted {
        /// Parts posted.
        posted: usize,
        /// Parts in all.
        parts: usize,
        /// Why the next part could not be posted.
        error: String,
    },
    /// A message on a framed endpoint without a valid header: the peer does
    /// not frame its messages.
    #[error("received {0} bytes without a valid fabric-msg header: is the peer configured alike (framing)?")]
    BadFrame(usize),
}

/// One finished operation.
#[derive(Debug)]
pub struct Completion {
    /// The token given when posting.
    pub token: Token,
    /// The endpoint it was posted on.
    pub endpoint: EndpointId,
    /// Send or receive.
    pub kind: OpKind,
    /// The buffer, returned to its owner; for a receive its length is what
    /// arrived.
    pub buffer: Option<Buffer>,
    /// The tag of a tagged receive.
    pub tag: u64,
    /// Immediate data that came with a receive.
    pub data: Option<u64>,
    /// The sender's address, where the provider reports it (`FI_SOURCE`).
    pub source: Option<u64>,
    /// Success, or what went wrong.
    pub result: Result<(), CompletionError>,
    /// The value an atomic fetched (the target's value before the operation).
    pub value: Option<u64>,
    /// For a multi-receive buffer: where this message lies in it (offset,
    /// length). Read it with [`EventLoop::multi_recv_bytes`] while the
    /// buffer is still posted, or from the buffer once it comes back.
    pub multi: Option<(usize, usize)>,
    /// The multi-receive slot (index, generation) this piece lies in.
    slot: Option<(u32, u64)>,
    /// The completion that ends a multi-receive buffer: `poll` releases
    /// the slot and attaches the buffer when it hands this one out.
    finishes: bool,
}

impl Completion {
    /// A completion with no buffer, tag, data or source: of a one-sided
    /// operation, a split transfer, or a remote write's notice.
    fn outcome(token: Token, endpoint: u32, kind: OpKind, result: Result<(), CompletionError>) -> Completion {
        Completion {
            token,
            endpoint: EndpointId(endpoint),
            kind,
            buffer: None,
            tag: 0,
            data: None,
            source: None,
            result,
            value: None,
            multi: None,
            slot: None,
            finishes: false,
        }
    }
}

/// A post that failed; the buffer comes back with the error.
#[derive(Debug)]
pub struct PostError {
    /// What went wrong.
    pub error: Error,
    /// The buffer that was to be used.
    pub buffer: Option<Buffer>,
}

impl fmt::Display for PostError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.error, f)
    }
}

impl std::error::Error for PostError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

impl From<PostError> for Error {
    fn from(e: PostError) -> Error {
        e.error
    }
}

/// Options of a send.
#[derive(Debug, Clone, Copy, Default)]
pub struct SendOpts {
    /// Send tagged, with this tag.
    pub tag: Option<u64>,
    /// Immediate data delivered with the message.
    pub data: Option<u64>,
}

/// Options of a receive.
#[derive(Debug, Clone, Copy, Default)]
pub struct RecvOpts {
    /// Only from this peer (needs `FI_DIRECTED_RECV`); any peer otherwise.
    pub from: Option<Peer>,
    /// Receive tagged: `(tag, ignore)`; bits set in `ignore` are not compared.
    pub tag: Option<(u64, u64)>,
}

// Per-operation state. `ctx` must be first: its address is the context
// handed to libfabric (FI_CONTEXT / FI_CONTEXT2 give the provider this
// storage until the completion is read), and the completion's op_context
// is cast back to the slot.
#[repr(C)]
struct OpSlot {
    ctx: ffi::fi_context2,
    index: u32,
    in_use: bool,
    endpoint: u32,
    kind: OpKind,
    token: Token,
    buffer: Option<Buffer>,
    /// Bytes posted for a receive (to report truncation).
    posted_len: usize,
    /// A multi-receive buffer: completes once per message, released by
    /// the completion flagged FI_MULTI_RECV.
    multi: bool,
    /// Address of the buffer's payload, for offsets of multi-receive pieces.
    base: usize,
    /// Bytes of a multi-receive buffer filled so far.
    used: usize,
    /// Bumped at every acquire, so a completion can tell its slot from a
    /// later operation's use of it.
    generation: u64,
    /// Registration of borrowed memory, dropped when the slot is released.
    borrowed_mr: Option<crate::buffer::LocalMr>,
    /// The region a one-sided operation uses, held until its completion.
    region: Option<Arc<RegionInner>>,
    /// The pool slot it uses, returned to its pool after the completion.
    lease: Option<Arc<Lease>>,
    /// Part of a split transfer: index into the loop's groups, or NO_GROUP.
    group: u32,
    /// An atomic whose fetched value lies in the loop's atomic scratch.
    atomic: bool,
    /// When a one-sided operation is reported as timed out.
    expires: Option<Instant>,
    /// Reported as timed out; the provider still holds it, so the slot
    /// (and the memory it keeps) waits for its late completion, which is
    /// swallowed.
    abandoned: bool,
}

const NO_GROUP: u32 = u32::MAX;

/// A transfer split into parts: completes once, when the last part does.
struct Group {
    endpoint: u32,
    kind: OpKind,
    token: Token,
    remaining: usize,
    error: Option<CompletionError>,
}

/// Boxed slots, never moved while in use; freed slots are reused, so the
/// steady state allocates nothing per operation.
struct Slab {
    // Boxed on purpose: a slot's address is the context libfabric holds, so
    // it must not move when the Vec grows.
    #[allow(clippy::vec_box)]
    slots: Vec<Box<OpSlot>>,
    free: Vec<u32>,
    in_flight: usize,
    /// Slots with a deadline (one-sided operations).
    timed: usize,
}

impl Slab {
    fn acquire(&mut self, endpoint: u32, kind: OpKind, token: Token) -> *mut OpSlot {
        let index = match self.free.pop() {
            Some(i) => i,
            None => {
                let i = self.slots.len() as u32;
                self.slots.push(Box::new(OpSlot {
                    ctx: ffi::fi_context2::default(),
                    index: i,
                    in_use: false,
                    endpoint: 0,
                    kind,
                    token,
                    buffer: None,
                    posted_len: 0,
                    multi: false,
                    base: 0,
                    used: 0,
                    generation: 0,
                    borrowed_mr: None,
                    region: None,
                    lease: None,
                    group: NO_GROUP,
                    atomic: false,
                    expires: None,
                    abandoned: false,
                }));
                i
            }
        };
        let slot = &mut self.slots[index as usize];
        slot.in_use = true;
        slot.endpoint = endpoint;
        slot.kind = kind;
        slot.token = token;
        slot.buffer = None;
        slot.posted_len = 0;
        slot.multi = false;
        slot.base = 0;
        slot.used = 0;
        slot.group = NO_GROUP;
        slot.atomic = false;
        slot.expires = None;
        slot.abandoned = false;
        slot.generation += 1;
        self.in_flight += 1;
        &mut **slot
    }

    fn release(&mut self, index: u32) -> Option<Buffer> {
        let slot = &mut self.slots[index as usize];
        if !slot.in_use {
            return None;
        }
        slot.in_use = false;
        slot.borrowed_mr = None;
        slot.region = None;
        slot.lease = None;
        if slot.expires.take().is_some() {
            self.timed -= 1;
        }
        self.in_flight -= 1;
        self.free.push(index);
        slot.buffer.take()
    }

    /// The slot a completion's context points at, if it is one of ours and in use.
    fn index_of(&self, ctx: *mut c_void) -> Option<u32> {
        if ctx.is_null() {
            return None;
        }
        let candidate = ctx as *const OpSlot;
        if (candidate as usize) % std::mem::align_of::<OpSlot>() != 0 {
            return None;
        }
        // SAFETY: every context fabric-msg posts is the address of a boxed
        // slot, and boxes are freed only when the slab is dropped (after
        // every endpoint is closed), so the CQ can only hand back pointers
        // to live slots. The identity check below guards the index anyway.
        let index = unsafe { (*candidate).index };
        let slot = self.slots.get(index as usize)?;
        (ptr::eq(&**slot, candidate) && slot.in_use).then_some(index)
    }
}

/// An endpoint ready for a post, from [`EventLoop::prepare`].
struct Prepared {
    raw: *mut ffi::fid_ep,
    framed: bool,
    desc: *mut c_void,
}

/// What is being posted: for [`EventLoop::post`].
struct Posting {
    endpoint: EndpointId,
    kind: OpKind,
    token: Token,
    /// Bytes handed to libfabric (header included on framed endpoints).
    len: usize,
    framed: bool,
    /// A multi-receive buffer.
    multi: bool,
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
}

pub(crate) struct EndpointState {
    /// NULL for the base endpoint of a MSG loop, which only stands for the
    /// loop in `accept`/`connect`; each connection has its own endpoint.
    pub(crate) raw: *mut ffi::fid_ep,
    pub(crate) framed: bool,
    /// Held by memory regions bound to this endpoint (`FI_MR_ENDPOINT`).
    pub(crate) bound: Arc<()>,
}

impl EndpointState {
    pub(crate) fn new(raw: *mut ffi::fid_ep, framed: bool) -> EndpointState {
        EndpointState {
            raw,
            framed,
            bound: Arc::new(()),
        }
    }
}

/// Where `read_cq` reads entries to: one batch in the CQ's format, and
/// the source addresses.
struct CqEntries {
    tagged: Box<[ffi::fi_cq_tagged_entry; CQ_BATCH]>,
    data: Box<[ffi::fi_cq_data_entry; CQ_BATCH]>,
    srcs: Box<[ffi::fi_addr_t; CQ_BATCH]>,
}

impl Default for CqEntries {
    fn default() -> Self {
        CqEntries {
            tagged: Box::new([ffi::fi_cq_tagged_entry::default(); CQ_BATCH]),
            data: Box::new([ffi::fi_cq_data_entry::default(); CQ_BATCH]),
            srcs: Box::new([ffi::FI_ADDR_NOTAVAIL; CQ_BATCH]),
        }
    }
}

pub(crate) struct Cq {
    pub(crate) raw: *mut ffi::fid_cq,
    /// FI_CQ_FORMAT_TAGGED, or FI_CQ_FORMAT_DATA.
    tagged: bool,
    wait_fd: Option<i32>,
    capacity: usize,
    _domain: Arc<DomainInner>,
}

impl Drop for Cq {
    fn drop(&mut self) {
        // SAFETY: opened by fi_cq_open; every endpoint bound to it is closed
        // before the EventLoop drops this field.
        unsafe { close_fid("completion queue", &mut (*self.raw).fid) }
    }
}

struct Av {
    raw: *mut ffi::fid_av,
    _domain: Arc<DomainInner>,
}

impl Drop for Av {
    fn drop(&mut self) {
        // SAFETY: opened by fi_av_open; endpoints bound to it are closed first.
        unsafe { close_fid("address vector", &mut (*self.raw).fid) }
    }
}

const CQ_BATCH: usize = 32;

/// One completion queue and the endpoints, peers and operations that use it.
pub struct EventLoop {
    // Dropped explicitly in `Drop`: endpoints first, then operations (their
    // buffers), then the AV, the CQ and the domain.
    pub(crate) endpoints: Vec<Option<EndpointState>>,
    slab: Slab,
    /// Completions reaped and not yet handed out, oldest first.
    pending: Vec<Completion>,
    pub(crate) pep: Option<crate::cm::Pep>,
    pub(crate) eq: Option<crate::cm::Eq>,
    av: Option<Av>,
    pub(crate) cq: Cq,
    pub(crate) domain: Arc<DomainInner>,
    pub(crate) cfg: LoopConfig,
    scratch: Vec<u8>,
    has_source: bool,
    directed: bool,
    /// Split transfers in flight, and free entries of `groups`.
    groups: Vec<Group>,
    free_groups: Vec<u32>,
    /// Header-only buffers for write_data's follow-up messages, reused.
    pub(crate) notify_bufs: Vec<Buffer>,
    /// Registered operands and results of atomics, one entry per slot.
    pub(crate) atomic_scratch: Option<crate::mr::MemoryRegion>,
    /// Raw keys mapped by `import`, unmapped when the loop closes.
    pub(crate) mapped_keys: Vec<u64>,
    /// Remote CQ data uses up a posted receive (`FI_RX_CQ_DATA` mode).
    rx_cq_data: bool,
    /// Taken while `read_cq` runs (it calls back into the loop).
    cq_entries: Option<CqEntries>,
    /// When `poll` next looks for overdue one-sided operations.
    next_expiry_scan: Instant,
}

// SAFETY: an EventLoop is used through `&mut self` only, so by one thread at
// a time; moving it between threads is allowed at every libfabric threading
// level (FI_THREAD_DOMAIN and up require only that the application
// serialises access, which `&mut` guarantees). It is not Sync.
unsafe impl Send for EventLoop {}

impl fmt::Debug for EventLoop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EventLoop")
            .field("provider", &self.domain.profile.provider)
            .field("domain", &self.domain.profile.domain)
            .field(
                "endpoints",
                &self.endpoints.iter().filter(|e| e.is_some()).count(),
            )
            .field("in_flight", &self.slab.in_flight)
            .finish()
    }
}

impl EventLoop {
    /// Open the fabric, domain, completion queue and (for RDM) address
    /// vector the profile describes.
    pub fn new(profile: &Profile, cfg: LoopConfig) -> Result<EventLoop> {
        let domain = DomainInner::open(profile)?;
        let q = profile.queues;
        let tagged = profile.caps_granted.iter().any(|c| c == "FI_TAGGED");
        let format = if tagged {
            ffi::FI_CQ_FORMAT_TAGGED
        } else {
            ffi::FI_CQ_FORMAT_DATA
        };
        let want_fd = cfg.wait == WaitMode::Block && profile.wait_fd;
        let mut attr = ffi::fi_cq_attr {
            size: cfg.cq_size.unwrap_or(q.cq * 2).max(1),
            format,
            wait_obj: if want_fd {
                ffi::FI_WAIT_FD
            } else {
                ffi::FI_WAIT_NONE
            },
            ..Default::default()
        };
        if let Some(max) = profile.limits.max_cqe {
            attr.size = attr.size.min(max as usize);
        }
        let mut raw = ptr::null_mut();
        // SAFETY: the domain is open; attr lives for the call.
        check("fi_cq_open", unsafe {
            ffi::fi_cq_open(domain.raw, &mut attr, &mut raw, ptr::null_mut())
        })?;
        let mut cq = Cq {
            raw,
            tagged,
            wait_fd: None,
            capacity: attr.size,
            _domain: domain.clone(),
        };
        if want_fd {
            let mut fd: i32 = -1;
            // SAFETY: FI_GETWAIT on a CQ opened with FI_WAIT_FD writes an int.
            let rc = unsafe {
                ffi::fi_control(
                    &mut (*cq.raw).fid,
                    ffi::FI_GETWAIT as i32,
                    (&mut fd as *mut i32).cast(),
                )
            };
            if rc == 0 && fd >= 0 {
                cq.wait_fd = Some(fd);
            }
        }
        let av = if profile.endpoint_type == EndpointType::Rdm {
            let mut av_attr = ffi::fi_av_attr {
                type_: ffi::FI_AV_UNSPEC,
                count: q.av,
                ..Default::default()
            };
            let mut raw = ptr::null_mut();
            // SAFETY: the domain is open; av_attr lives for the call.
            check("fi_av_open", unsafe {
                ffi::fi_av_open(domain.raw, &mut av_attr, &mut raw, ptr::null_mut())
            })?;
            Some(Av {
                raw,
                _domain: domain.clone(),
            })
        } else {
            None
        };
        let eq = if profile.endpoint_type == EndpointType::Msg {
            Some(crate::cm::Eq::open(&domain)?)
        } else {
            None
        };
        let has = |c: &str| profile.caps_granted.iter().any(|g| g == c);
        Ok(EventLoop {
            endpoints: Vec::new(),
            slab: Slab {
                slots: Vec::new(),
                free: Vec::new(),
                in_flight: 0,
                timed: 0,
            },
            pending: Vec::with_capacity(CQ_BATCH * 4),
            pep: None,
            eq,
            av,
            cq,
            has_source: profile.source,
            directed: has("FI_DIRECTED_RECV"),
            groups: Vec::new(),
            free_groups: Vec::new(),
            notify_bufs: Vec::new(),
            atomic_scratch: None,
            mapped_keys: Vec::new(),
            rx_cq_data: profile.mode.iter().any(|m| m == "FI_RX_CQ_DATA"),
            cq_entries: Some(CqEntries::default()),
            next_expiry_scan: Instant::now(),
            scratch: vec![0; profile.inject_size + HEADROOM],
            domain,
            cfg,
        })
    }

    /// The profile this loop was opened with.
    pub fn profile(&self) -> &Profile {
        &self.domain.profile
    }

    /// Whether this loop's endpoints frame messages.
    pub fn framed(&self) -> bool {
        self.cfg.force_framing || self.domain.profile.framed
    }

    /// What peers compare at connect time: the profile, with this loop's framing.
    pub fn wire_profile(&self) -> crate::profile::WireProfile {
        let mut w = self.domain.profile.wire();
        w.framed = self.framed();
        w
    }

    /// Most operations in flight at once: the completion queue's size.
    pub fn cq_capacity(&self) -> usize {
        self.cq.capacity
    }

    /// Operations posted and not yet completed.
    pub fn in_flight(&self) -> usize {
        self.slab.in_flight
    }

    /// Open an endpoint. RDM: a reliable-datagram endpoint bound to this
    /// loop's CQ and AV, which reaches every peer. MSG: the loop's base
    /// endpoint, which `accept`/`connect` take; each connection then gets
    /// its own endpoint, named by [`Peer::endpoint`] — post there.
    pub fn endpoint(&mut self) -> Result<EndpointId> {
        let Some(av) = &self.av else {
            self.endpoints
                .push(Some(EndpointState::new(ptr::null_mut(), self.framed())));
            return Ok(EndpointId(self.endpoints.len() as u32 - 1));
        };
        let mut raw = ptr::null_mut();
        // SAFETY: the domain and its fi_info are alive (self.domain).
        check("fi_endpoint", unsafe {
            ffi::fi_endpoint(self.domain.raw, self.domain.info_ptr(), &mut raw, ptr::null_mut())
        })?;
        let state = EndpointState::new(raw, self.framed());
        let bind_flags = u64::from(ffi::FI_TRANSMIT | ffi::FI_RECV);
        // SAFETY: raw is a fresh endpoint; the CQ and AV outlive it (the loop
        // closes endpoints first). On error the endpoint is closed here.
        let rc = unsafe {
            let mut rc = ffi::fi_ep_bind(raw, &mut (*self.cq.raw).fid, bind_flags);
            if rc == 0 {
                rc = ffi::fi_ep_bind(raw, &mut (*av.raw).fid, 0);
            }
            if rc == 0 {
                rc = ffi::fi_enable(raw);
            }
            // After fi_enable: libfabric 1.17's shm dereferences its shared
            // receive context in setopt, and that exists only once enabled.
            if let (0, Some(min)) = (rc, self.cfg.min_multi_recv) {
                rc = ffi::fi_setopt(
                    &mut (*raw).fid,
                    ffi::FI_OPT_ENDPOINT as i32,
                    ffi::FI_OPT_MIN_MULTI_RECV as i32,
                    (&min as *const usize).cast(),
                    std::mem::size_of::<usize>(),
                );
            }
            if rc != 0 {
                close_fid("endpoint", &mut (*raw).fid);
            }
            rc
        };
        check("fi_ep_bind/fi_enable", rc)?;
        self.endpoints.push(Some(state));
        Ok(EndpointId(self.endpoints.len() as u32 - 1))
    }

    pub(crate) fn ep(&self, id: EndpointId) -> Result<&EndpointState> {
        let ep = self
            .endpoints
            .get(id.0 as usize)
            .and_then(Option::as_ref)
            .ok_or_else(|| Error::Closed {
                what: format!("endpoint {}", id.0),
            })?;
        if ep.raw.is_null() {
            return Err(Error::Unsupported {
                what: "posting on a connected-endpoint loop's base endpoint (post on `peer.endpoint()`)"
                    .into(),
                provider: self.domain.profile.provider.clone(),
            });
        }
        Ok(ep)
    }

    /// The endpoint's address, to give to peers.
    pub fn name(&self, id: EndpointId) -> Result<Vec<u8>> {
        let ep = self.ep(id)?;
        let mut name = vec![0u8; 256];
        loop {
            let mut len = name.len();
            // SAFETY: the endpoint is open; name has `len` writable bytes.
            let rc = unsafe { ffi::fi_getname(&mut (*ep.raw).fid, name.as_mut_ptr().cast(), &mut len) };
            if rc == -(ffi::FI_ETOOSMALL as i32) && len > name.len() {
                name.resize(len, 0);
                continue;
            }
            check("fi_getname", rc)?;
            name.truncate(len);
            return Ok(name);
        }
    }

    /// Insert a peer's address (from its [`EventLoop::name`]).
    pub fn insert_peer(&mut self, id: EndpointId, name: &[u8], agreement: Agreement) -> Result<Peer> {
        self.ep(id)?;
        let av = self.av.as_ref().ok_or(Error::Closed {
            what: "address vector".into(),
        })?;
        let mut addr: ffi::fi_addr_t = ffi::FI_ADDR_NOTAVAIL;
        // SAFETY: av is open; `name` is a readable address of the provider's
        // format (the peer's fi_getname); one address is inserted into `addr`.
        let rc = unsafe { ffi::fi_av_insert(av.raw, name.as_ptr().cast(), 1, &mut addr, 0, ptr::null_mut()) };
        if rc != 1 {
            return Err(if rc < 0 {
                Error::from_rc("fi_av_insert", rc.into())
            } else {
                Error::PeerMismatch(format!(
                    "fi_av_insert accepted none of the peer's {}-byte address: is it from the same provider?",
                    name.len()
                ))
            });
        }
        Ok(Peer {
            endpoint: id,
            addr,
            agreement,
        })
    }

    /// Post a send of `buf` (its `len()` bytes) to `peer`.
    pub fn send(&mut self, peer: &Peer, buf: Buffer, opts: SendOpts, token: Token) -> Result<(), PostError> {
        let payload = buf.len();
        let (Prepared { raw, framed, desc }, mut buf) = self.prepare(peer.endpoint, buf, |ep| {
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
        };
        self.post(what, buf, |bufp, ctx| {
            // SAFETY: raw is an enabled endpoint; bufp/len describe memory the
            // loop owns until the completion; ctx is the slot's fi_context2.
            unsafe { raw_send(raw, bufp, len, desc, addr, opts.tag, data, ctx) }
        })
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
        let (Prepared { raw, framed, desc }, buf) = self.prepare(id, buf, |_| {
            src = self.source_addr(&opts)?;
            Ok(())
        })?;
        let len = buf.capacity() + if framed { HEADROOM } else { 0 };
        let what = Posting {
            endpoint: id,
            kind: OpKind::Recv,
            token,
            len,
            framed,
            multi: false,
        };
        self.post(what, buf, |bufp, ctx| {
            // SAFETY: as in `send`; the buffer has `len` writable bytes at bufp.
            unsafe { raw_recv(raw, bufp, len, desc, src, opts.tag, ctx) }
        })
    }

    /// Post a multi-receive buffer (`FI_MULTI_RECV`): many messages land in
    /// it back to back, each completing with [`Completion::multi`] set; the
    /// completion that returns the buffer is the last. Needs
    /// [`Capability::MultiRecv`](crate::Capability::MultiRecv) and an
    /// unframed endpoint. [`LoopConfig::min_multi_recv`] sets how much room
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
        };
        self.post(what, buf, |bufp, ctx| {
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
            unsafe { ffi::fi_recvmsg(raw, &msg, u64::from(ffi::FI_MULTI_RECV)) }
        })
    }

    /// The bytes of one message in a multi-receive buffer that is still
    /// posted. `None` once the buffer has come back (read it from there),
    /// or for a completion that is not a multi-receive piece.
    pub fn multi_recv_bytes(&self, c: &Completion) -> Option<&[u8]> {
        let (offset, len) = c.multi?;
        let (index, generation) = c.slot?;
        let slot = self.slab.slots.get(index as usize)?;
        if !slot.in_use || !slot.multi || slot.generation != generation {
            return None;
        }
        // The provider wrote these bytes before reporting them and writes
        // only further on in the buffer until it returns it.
        slot.buffer.as_ref()?.payload_at(offset, len)
    }

    fn complete_multi(&mut self, index: u32, e: &ffi::fi_cq_tagged_entry, source: Option<u64>) {
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
        });
    }

    /// Hand out pending completions. A multi-receive buffer comes back
    /// (its slot released) only in a batch holding none of its earlier
    /// pieces, so those can be read with `multi_recv_bytes` while their
    /// batch is processed.
    fn deliver(&mut self, out: &mut Vec<Completion>) {
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
        let addr = peer.addr;
        let what = Posting {
            endpoint: peer.endpoint,
            kind: OpKind::Send,
            token,
            len,
            framed: false,
            multi: false,
        };
        self.post_borrowed(what, data as *mut u8, move |bufp, desc, ctx| {
            // SAFETY: raw is enabled; the caller keeps `len` bytes at bufp
            // valid until the completion; ctx is the slot's fi_context2.
            unsafe { raw_send(raw, bufp, len, desc, addr, opts.tag, opts.data, ctx) }
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
        let what = Posting {
            endpoint: id,
            kind: OpKind::Recv,
            token,
            len,
            framed: false,
            multi: false,
        };
        self.post_borrowed(what, data, move |bufp, desc, ctx| {
            // SAFETY: as in `send_borrowed`; `len` writable bytes at bufp.
            unsafe { raw_recv(raw, bufp, len, desc, src, opts.tag, ctx) }
        })
    }

    /// Refuse a message of `len` payload bytes (plus `overhead` of
    /// fabric-msg's header) that the fabric or the peer cannot take.
    fn check_len(&self, peer: &Peer, len: usize, overhead: usize) -> Result<()> {
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
    fn source_addr(&self, opts: &RecvOpts) -> Result<ffi::fi_addr_t> {
        match opts.from {
            None => Ok(ffi::FI_ADDR_UNSPEC),
            Some(_) if !self.directed => Err(Error::Unsupported {
                what: "receiving from one peer only (FI_DIRECTED_RECV)".into(),
                provider: self.domain.profile.provider.clone(),
            }),
            Some(p) => Ok(p.addr),
        }
    }

    fn check_borrowable(&self, framed: bool) -> Result<()> {
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
    fn post_borrowed(
        &mut self,
        what: Posting,
        data: *mut u8,
        mut op: impl FnMut(*mut c_void, *mut c_void, *mut c_void) -> isize,
    ) -> Result<()> {
        let mr = if self.domain.mr_mode(ffi::FI_MR_LOCAL) {
            Some(crate::buffer::LocalMr::register(
                &self.domain,
                data,
                what.len.max(1),
            )?)
        } else {
            None
        };
        let desc = mr.as_ref().map_or(ptr::null_mut(), |m| m.desc());
        self.wait_for_room()?;
        let slot = self.slab.acquire(what.endpoint.0, what.kind, what.token);
        // SAFETY: slot points into a live Box in the slab (see `post`).
        let (index, ctx) = unsafe {
            (*slot).posted_len = what.len;
            (*slot).multi = false;
            (*slot).borrowed_mr = mr;
            (*slot).base = data as usize;
            ((*slot).index, slot.cast::<c_void>())
        };
        let bufp = data.cast::<c_void>();
        match self.retry(|| op(bufp, desc, ctx)) {
            Ok(_) => Ok(()),
            Err(e) => {
                self.slab.release(index);
                Err(e)
            }
        }
    }

    /// Send a small message without a completion; `bytes` is copied before
    /// this returns. At most the profile's `inject_size` (less fabric-msg's
    /// header on framed endpoints).
    pub fn inject(&mut self, peer: &Peer, bytes: &[u8], opts: SendOpts) -> Result<()> {
        let ep = self.ep(peer.endpoint)?;
        let (raw, framed) = (ep.raw, ep.framed);
        let overhead = if framed { HEADROOM } else { 0 };
        let room = self.domain.profile.inject_size.saturating_sub(overhead);
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
            self.scratch[..HEADROOM].copy_from_slice(&encode_header(bytes.len(), opts.data));
            data = None;
        }
        self.scratch[overhead..len].copy_from_slice(bytes);
        let (addr, p) = (peer.addr, self.scratch.as_ptr() as *const c_void);
        self.retry(|| {
            // SAFETY: raw is enabled; inject copies the `len` bytes at `p` before returning.
            unsafe {
                match (opts.tag, data) {
                    (None, None) => ffi::fi_inject(raw, p, len, addr),
                    (Some(t), None) => ffi::fi_tinject(raw, p, len, addr, t),
                    (None, Some(d)) => ffi::fi_injectdata(raw, p, len, d, addr),
                    (Some(t), Some(d)) => ffi::fi_tinjectdata(raw, p, len, d, addr, t),
                }
            }
        })
        .map(|_| ())
    }

    /// The checks every post of a `Buffer` makes: the endpoint is open, the
    /// operation's own `check` passes, and the buffer has its local
    /// descriptor. On failure the buffer comes back with the error.
    fn prepare(
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

    /// Take a slot, post, and retry on `-FI_EAGAIN` while progressing.
    fn post(
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
        let slot = self.slab.acquire(what.endpoint.0, what.kind, what.token);
        // SAFETY: slot points into a live Box in the slab that is not moved or
        // freed until released below or by its completion.
        let (index, ctx) = unsafe {
            (*slot).buffer = Some(buf);
            (*slot).posted_len = what.len;
            (*slot).multi = what.multi;
            (*slot).base = bufp as usize;
            ((*slot).index, slot.cast::<c_void>())
        };
        match self.retry(|| op(bufp, ctx)) {
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
            match self.free_groups.pop() {
                Some(i) => {
                    self.groups[i as usize] = g;
                    i
                }
                None => {
                    self.groups.push(g);
                    self.groups.len() as u32 - 1
                }
            }
        });
        let timeout = self.cfg.rma_timeout;
        for part in 0..p.count {
            let posted = self.wait_for_room().and_then(|()| {
                let slot = self.slab.acquire(p.endpoint.0, p.kind, p.token);
                // SAFETY: slot points into a live Box in the slab (see `post`).
                let (index, ctx) = unsafe {
                    (*slot).region = p.region.cloned();
                    (*slot).lease = p.lease.cloned();
                    (*slot).group = group.unwrap_or(NO_GROUP);
                    (*slot).atomic = p.atomic;
                    (*slot).expires = timeout.map(|t| Instant::now() + t);
                    if part + 1 == p.count {
                        (*slot).buffer = p.last_buffer.take();
                    }
                    ((*slot).index, slot.cast::<c_void>())
                };
                if timeout.is_some() {
                    self.slab.timed += 1;
                }
                self.retry(|| op(part, index, ctx)).map(|_| ()).inspect_err(|_| {
                    if let Some(b) = self.slab.release(index) {
                        self.notify_bufs.push(b);
                    }
                })
            });
            let Err(error) = posted else { continue };
            let Some(g) = group else { return Err(error) };
            if part == 0 {
                self.groups[g as usize].remaining = 0;
                self.free_groups.push(g);
                return Err(error);
            }
            let entry = &mut self.groups[g as usize];
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

    /// Read the CQ until fewer operations than it holds are in flight.
    fn wait_for_room(&mut self) -> Result<()> {
        if self.slab.in_flight < self.cq.capacity {
            return Ok(());
        }
        let started = Instant::now();
        while self.slab.in_flight >= self.cq.capacity {
            if started.elapsed() >= self.cfg.post_timeout {
                return Err(Error::QueueFull {
                    waited: self.cfg.post_timeout,
                    in_flight: self.slab.in_flight,
                });
            }
            self.read_cq()?;
        }
        Ok(())
    }

    /// Call `op` until it does not return `-FI_EAGAIN`, reading the CQ in
    /// between, for at most the configured time.
    fn retry(&mut self, mut op: impl FnMut() -> isize) -> Result<isize> {
        let mut started: Option<Instant> = None;
        loop {
            let rc = op();
            if rc != -(ffi::FI_EAGAIN as isize) {
                return check("post", rc as i64).map(|v| v as isize);
            }
            let t0 = *started.get_or_insert_with(Instant::now);
            if t0.elapsed() >= self.cfg.post_timeout {
                return Err(Error::QueueFull {
                    waited: self.cfg.post_timeout,
                    in_flight: self.slab.in_flight,
                });
            }
            self.read_cq()?;
        }
    }

    /// Move finished operations into `out` (cleared first), waiting up to
    /// `timeout` for at least one (`None`: wait as long as it takes;
    /// `Some(ZERO)`: just look). Returns how many.
    pub fn poll(&mut self, out: &mut Vec<Completion>, timeout: Option<Duration>) -> Result<usize> {
        out.clear();
        // The clock is read only once nothing is ready, once per pass.
        let mut deadline: Option<Instant> = None;
        let mut spin_until: Option<Instant> = None;
        loop {
            if self.pending.is_empty() {
                self.read_cq()?;
            }
            if !self.pending.is_empty() {
                self.deliver(out);
                return Ok(out.len());
            }
            if timeout == Some(Duration::ZERO) && self.slab.timed == 0 {
                return Ok(0);
            }
            let mut remaining = None;
            if timeout.is_some() || self.slab.timed > 0 {
                let now = Instant::now();
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
            if self.slab.timed > 0 {
                // Wake up to notice overdue one-sided operations.
                let tick = Duration::from_millis(50);
                remaining = Some(remaining.map_or(tick, |r| r.min(tick)));
            }
            if self.cfg.wait == WaitMode::Block && !self.cfg.spin_before_block.is_zero() {
                let now = Instant::now();
                if now < *spin_until.get_or_insert(now + self.cfg.spin_before_block) {
                    std::hint::spin_loop();
                    continue;
                }
            }
            self.wait(remaining);
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

    fn wait(&mut self, remaining: Option<Duration>) {
        if let (WaitMode::Block, Some(fd)) = (self.cfg.wait, self.cq.wait_fd) {
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
        std::hint::spin_loop();
    }

    /// Read what the CQ holds into `pending`.
    fn read_cq(&mut self) -> Result<()> {
        // Kept in the loop, not zeroed on every call: an empty poll is the
        // hot path of a spinning loop.
        let mut entries = self.cq_entries.take().unwrap_or_default();
        let r = self.read_cq_into(&mut entries);
        self.cq_entries = Some(entries);
        r
    }

    fn read_cq_into(&mut self, bufs: &mut CqEntries) -> Result<()> {
        let CqEntries { tagged, data, srcs } = bufs;
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

    fn complete(&mut self, e: &ffi::fi_cq_tagged_entry, source: Option<u64>) {
        let remote_write = e.flags & (ffi::FI_REMOTE_WRITE as u64) != 0;
        if remote_write && !self.rx_cq_data {
            // A peer's write with immediate data: the entry carries no
            // context of ours (fi_cq(3)), so it is not looked up.
            if e.flags & u64::from(ffi::FI_REMOTE_CQ_DATA) != 0 {
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
        let (endpoint, mut kind, token, multi, posted, group, atomic) = {
            let s = &self.slab.slots[index as usize];
            (
                s.endpoint,
                s.kind,
                s.token,
                s.multi,
                s.posted_len,
                s.group,
                s.atomic,
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

    fn read_error(&mut self) -> Result<()> {
        let mut err = ffi::fi_cq_err_entry::default();
        // SAFETY: the CQ is open and reported FI_EAVAIL; err is a valid out-struct.
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
        let (endpoint, kind, token, posted, group) = {
            let s = &self.slab.slots[index as usize];
            (s.endpoint, s.kind, s.token, s.posted_len, s.group)
        };
        let code = err.err.unsigned_abs();
        if group != NO_GROUP {
            let failure = self.cq_failure(&err, code);
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

    /// A completion error other than truncation, with the provider's text.
    fn cq_failure(&self, err: &ffi::fi_cq_err_entry, code: u32) -> CompletionError {
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

    /// The late completion of an operation already reported as timed out.
    fn swallow(&mut self, index: u32) {
        if let Some(b) = self.slab.release(index) {
            self.notify_bufs.push(b);
        }
    }

    /// Report one-sided operations past their deadline as timed out.
    fn expire_overdue(&mut self, now: Instant) {
        let Some(after) = self.cfg.rma_timeout else { return };
        for i in 0..self.slab.slots.len() {
            let s = &mut self.slab.slots[i];
            if !s.in_use || s.abandoned || s.expires.map_or(true, |t| t > now) {
                continue;
            }
            s.abandoned = true;
            let (endpoint, kind, token, group) = (s.endpoint, s.kind, s.token, s.group);
            if group != NO_GROUP {
                let g = &mut self.groups[group as usize];
                g.error.get_or_insert(CompletionError::TimedOut(after));
                g.remaining -= 1;
                if g.remaining == 0 {
                    self.end_group(group);
                }
                continue;
            }
            let timed_out = Err(CompletionError::TimedOut(after));
            self.pending
                .push(Completion::outcome(token, endpoint, kind, timed_out));
        }
    }

    /// One part of a split transfer finished; the transfer completes with
    /// its last part, reporting the first error of any part.
    fn finish_part(&mut self, index: u32, group: u32, result: Result<(), CompletionError>) {
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

    fn end_group(&mut self, group: u32) {
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
    fn remote_write_arrived(&mut self, data: u64, source: Option<u64>) {
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

    /// Close an endpoint. Its operations still in flight produce no
    /// completions; their buffers are freed by the loop. Completions of its
    /// operations already reaped but not yet returned are dropped too.
    pub fn close_endpoint(&mut self, id: EndpointId) -> Result<()> {
        let Some(slot) = self.endpoints.get_mut(id.0 as usize) else {
            return Err(Error::Closed {
                what: format!("endpoint {}", id.0),
            });
        };
        if let Some(state) = slot.as_ref() {
            let bound = Arc::strong_count(&state.bound) - 1;
            if bound > 0 {
                return Err(Error::Busy {
                    what: "endpoint with memory regions bound to it (FI_MR_ENDPOINT); drop them first",
                    in_flight: bound,
                });
            }
        }
        let Some(state) = slot.take() else {
            return Err(Error::Closed {
                what: format!("endpoint {}", id.0),
            });
        };
        if state.raw.is_null() {
            return Ok(());
        }
        // SAFETY: the endpoint is open and removed from the table, so nothing
        // posts to it again; closing it stops the provider using its buffers.
        let rc = unsafe { ffi::fi_close(&mut (*state.raw).fid) };
        // Entries already in the CQ for it are discarded by `complete`, which
        // ignores closed endpoints; read them now so their slots are freed.
        // Whatever that read says, the endpoint's operations are reclaimed
        // and none of its tokens comes back; errors are reported after.
        let drained = self.read_cq();
        for i in 0..self.slab.slots.len() {
            let s = &self.slab.slots[i];
            if s.in_use && s.endpoint == id.0 {
                self.slab.release(i as u32);
            }
        }
        self.pending.retain(|c| c.endpoint != id);
        for (i, g) in self.groups.iter_mut().enumerate() {
            if g.remaining > 0 && g.endpoint == id.0 {
                g.remaining = 0;
                self.free_groups.push(i as u32);
            }
        }
        check("fi_close(endpoint)", rc)?;
        drained
    }
}

impl Drop for EventLoop {
    fn drop(&mut self) {
        for state in self
            .endpoints
            .iter_mut()
            .filter_map(Option::take)
            .filter(|s| !s.raw.is_null())
        {
            // SAFETY: each endpoint is open and closed once, before the CQ,
            // AV and EQ it is bound to (fields dropped after this body).
            unsafe { close_fid("endpoint", &mut (*state.raw).fid) }
        }
        // The passive endpoint goes before the EQ it is bound to.
        self.pep = None;
        // With every endpoint closed the provider no longer touches buffers
        // of operations in flight: free them (and their registrations)
        // before the CQ, AV and domain go.
        self.slab.slots.clear();
        self.pending.clear();
        self.atomic_scratch = None;
        for key in self.mapped_keys.drain(..) {
            // SAFETY: each key was mapped by fi_mr_map_raw on this domain,
            // which is still open, and is unmapped once.
            let rc = unsafe { ffi::fi_mr_unmap_key(self.domain.raw, key) };
            if rc != 0 {
                log::warn!(
                    "unmapping a raw key: {}",
                    Error::from_rc("fi_mr_unmap_key", rc.into())
                );
            }
        }
    }
}

/// Post a send in the form its options call for.
///
/// # Safety
/// `raw` is an enabled endpoint; `bufp` and `len` describe memory that stays
/// valid until the completion; `desc` is its local descriptor (or NULL where
/// none is needed); `ctx` is an operation slot's context.
#[allow(clippy::too_many_arguments)]
unsafe fn raw_send(
    raw: *mut ffi::fid_ep,
    bufp: *mut c_void,
    len: usize,
    desc: *mut c_void,
    addr: ffi::fi_addr_t,
    tag: Option<u64>,
    data: Option<u64>,
    ctx: *mut c_void,
) -> isize {
    // SAFETY: the caller's promises are exactly these calls' requirements.
    unsafe {
        match (tag, data) {
            (None, None) => ffi::fi_send(raw, bufp, len, desc, addr, ctx),
            (Some(t), None) => ffi::fi_tsend(raw, bufp, len, desc, addr, t, ctx),
            (None, Some(d)) => ffi::fi_senddata(raw, bufp, len, desc, d, addr, ctx),
            (Some(t), Some(d)) => ffi::fi_tsenddata(raw, bufp, len, desc, d, addr, t, ctx),
        }
    }
}

/// Post a receive, tagged (`(tag, ignore)`) or not.
///
/// # Safety
/// As for [`raw_send`], with `len` writable bytes at `bufp`.
unsafe fn raw_recv(
    raw: *mut ffi::fid_ep,
    bufp: *mut c_void,
    len: usize,
    desc: *mut c_void,
    src: ffi::fi_addr_t,
    tag: Option<(u64, u64)>,
    ctx: *mut c_void,
) -> isize {
    // SAFETY: the caller's promises are exactly these calls' requirements.
    unsafe {
        match tag {
            None => ffi::fi_recv(raw, bufp, len, desc, src, ctx),
            Some((t, ignore)) => ffi::fi_trecv(raw, bufp, len, desc, src, t, ignore, ctx),
        }
    }
}

/// The tag of a completion, where it is a tagged one.
fn tag_of(flags: u64, tag: u64) -> u64 {
    if flags & u64::from(ffi::FI_TAGGED) != 0 {
        tag
    } else {
        0
    }
}

/// fabric-msg's message header on framed endpoints: the payload length
/// (little-endian u64, top bit set when immediate data follows) and the
/// immediate data (little-endian u64).
const DATA_FLAG: u64 = 1 << 63;
/// Set (with `DATA_FLAG`, length 0) in the follow-up message that carries
/// a write_data's immediate value where the fabric has no remote CQ data.
const NOTIFY_FLAG: u64 = 1 << 62;

/// The header of write_data's follow-up message.
pub(crate) fn encode_notify(data: u64) -> [u8; HEADROOM] {
    let mut h = [0u8; HEADROOM];
    h[..8].copy_from_slice(&(DATA_FLAG | NOTIFY_FLAG).to_le_bytes());
    h[8..].copy_from_slice(&data.to_le_bytes());
    h
}

/// Whether a received frame is write_data's follow-up message.
fn is_notify(h: &[u8; HEADROOM], received: usize) -> bool {
    received == HEADROOM && h[..8] == (DATA_FLAG | NOTIFY_FLAG).to_le_bytes()
}

fn encode_header(len: usize, data: Option<u64>) -> [u8; HEADROOM] {
    let mut h = [0u8; HEADROOM];
    let word = len as u64 | if data.is_some() { DATA_FLAG } else { 0 };
    h[..8].copy_from_slice(&word.to_le_bytes());
    h[8..].copy_from_slice(&data.unwrap_or(0).to_le_bytes());
    h
}

/// (payload length, data) from a header, if `received` covers one.
fn decode_header(h: &[u8; HEADROOM], received: usize) -> Option<(usize, Option<u64>)> {
    if received < HEADROOM {
        return None;
    }
    let word = u64::from_le_bytes(h[..8].try_into().ok()?);
    let data = u64::from_le_bytes(h[8..].try_into().ok()?);
    let len = usize::try_from(word & !(DATA_FLAG | NOTIFY_FLAG)).ok()?;
    Some((len, (word & DATA_FLAG != 0).then_some(data)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thread_bounds_are_what_the_docs_promise() {
        fn send<T: Send>() {}
        fn sync<T: Sync>() {}
        send::<EventLoop>();
        send::<Completion>();
        send::<Buffer>();
        sync::<Buffer>();
        send::<Peer>();
        sync::<Peer>();
    }

    #[test]
    fn header_round_trip_and_short_frames() {
        let h = encode_header(3, Some(0xfeed));
        assert_eq!(decode_header(&h, HEADROOM + 3), Some((3, Some(0xfeed))));
        assert_eq!(decode_header(&encode_header(0, None), HEADROOM), Some((0, None)));
        assert_eq!(decode_header(&h, HEADROOM - 1), None, "shorter than a header");
        let n = encode_notify(42);
        assert!(is_notify(&n, HEADROOM) && !is_notify(&h, HEADROOM) && !is_notify(&n, HEADROOM + 1));
        assert_eq!(decode_header(&n, HEADROOM), Some((0, Some(42))));
    }
}
