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
//! - When a post meets a full queue (`-FI_EAGAIN`, or `-FI_ENOMEM` for a
//!   receive) the loop progresses the CQ and retries until the provider
//!   takes it, a peer is lost, or the application's own
//!   [`LoopConfig::post_timeout`] (none by default) passes; completions
//!   reaped meanwhile are kept for the next `poll`, never lost. A
//!   [`send`](EventLoop::send) of a [`Buffer`] is not held at all: the loop
//!   keeps it (in order per peer, at most [`LoopConfig::max_backlog`]) and
//!   posts it as `poll` progresses, so an application that sends before it
//!   receives cannot deadlock with a peer doing the same; it fails only
//!   with its peer's loss, or with [`CompletionError::NotPosted`] if a
//!   `post_timeout` was set and the peer took none of the sends waiting for
//!   it for that long.
//! - A message larger than the posted buffer completes with
//!   [`CompletionError::Truncated`] naming both sizes; nothing overflows,
//!   and the next message is delivered. On `ofi_rxm` and `shm`, which
//!   cannot cut every message themselves, receives take an overflow sink
//!   behind the buffer for the tail (`overflow.rs`).
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

mod am;
mod am_state;
mod am_wire;
mod backlog;
mod cancel;
mod completions;
mod deadlines;
mod endpoint;
mod frame;
pub(crate) mod idle;
mod lost_peers;
mod multi_recv;
mod overflow;
mod post;
mod resources;
mod slab;
mod tag_space;
mod teardown;
mod types;

pub(crate) use am::AtomicRequest;
pub use am_state::AtomicCounters;
pub(crate) use frame::encode_notify;

/// For the fuzz targets: fabric-msg's message header as a receive reads
/// it from whatever arrived.
pub(crate) fn fuzz_header(bytes: &[u8]) {
    let mut h = [0u8; crate::memory::buffer::HEADROOM];
    let n = bytes.len().min(crate::memory::buffer::HEADROOM);
    h[..n].copy_from_slice(&bytes[..n]);
    if let Some((len, _)) = frame::decode_header(&h, bytes.len()) {
        let _ = len.checked_add(crate::memory::buffer::HEADROOM);
    }
    let _ = frame::is_notify(&h, bytes.len());
}

/// For the fuzz targets: an emulated atomic's request (as a target on 64
/// and on 63 tag bits decodes it) and reply.
pub(crate) fn fuzz_atomic_message(bytes: &[u8]) {
    for bits in [64, 63] {
        let _ = am_wire::decode_request(tag_space::TagSpace::new(bits), bytes);
    }
    let mut h = [0u8; am_wire::REPLY_LEN];
    let n = bytes.len().min(am_wire::REPLY_LEN);
    h[..n].copy_from_slice(&bytes[..n]);
    for cookie in [0, u64::MAX, 0x5eed_c0ff_ee00_0009] {
        let _ = am_wire::decode_reply(&h, bytes.len(), cookie);
    }
}

/// For the fuzz targets: a real request and a real reply.
pub(crate) fn fuzz_atomic_seeds() -> Vec<Vec<u8>> {
    am_wire::fuzz_seeds()
}

/// For the fuzz targets: real headers (with and without data, a notice).
pub(crate) fn fuzz_header_seeds() -> Vec<Vec<u8>> {
    vec![
        frame::encode_header(4096, Some(7)).to_vec(),
        frame::encode_header(0, None).to_vec(),
        frame::encode_notify(42).to_vec(),
    ]
}
pub(crate) use post::Parts;
pub(crate) use resources::{Cq, EndpointState};
pub use types::{
    Completion, CompletionError, EndpointId, LoopConfig, OpKind, Peer, PostError, ProgressThread, RecvOpts,
    SendOpts, Token, WaitMode,
};

use crate::discovery::info::EndpointType;
use crate::discovery::profile::Profile;
use crate::error::{check, Result};
use crate::ffi;
use crate::memory::buffer::{Buffer, HEADROOM};
use crate::memory::domain::DomainInner;
use crate::transport::eq::{Eq, Pep};
use frame::{decode_header, encode_header, is_notify};
use resources::{Av, CqEntries, CQ_BATCH};
use slab::{Group, Slab, NO_GROUP};
use std::fmt;
use std::ptr;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Instant;

/// One completion queue and the endpoints, peers and operations that use it.
pub struct EventLoop {
    // Dropped explicitly in `Drop`: endpoints first, then operations (their
    // buffers), then the AV, the CQ and the domain.
    pub(crate) endpoints: Vec<Option<EndpointState>>,
    slab: Slab,
    /// Completions reaped and not yet handed out, oldest first.
    pending: Vec<Completion>,
    /// Sends the provider had no room for, posted again as the loop progresses.
    backlog: backlog::Backlog,
    pub(crate) pep: Option<Pep>,
    pub(crate) eq: Option<Eq>,
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
    pub(crate) atomic_scratch: Option<crate::memory::mr::MemoryRegion>,
    /// Emulated atomics: pools, posted request receives, regions by key.
    pub(crate) am: am_state::AmState,
    /// Whose posts are being made: the application's, unless the World's
    /// collectives post through [`EventLoop::as_world`].
    poster: tag_space::Poster,
    /// Raw keys mapped by `import`, unmapped when the loop closes.
    pub(crate) mapped_keys: Vec<u64>,
    /// Remote CQ data uses up a posted receive (`FI_RX_CQ_DATA` mode).
    rx_cq_data: bool,
    /// Taken while `read_cq` runs (it calls back into the loop).
    cq_entries: Option<CqEntries>,
    /// When `poll` next looks for overdue one-sided operations.
    next_expiry_scan: Instant,
    /// Whether the first masked receive on a provider that matches them
    /// wrongly (`Profile::tag_mask_defect`) was warned of.
    warned_tag_mask: bool,
    /// Tagged receives are checked against their message's tag: the
    /// provider matches masked receives wrongly (`Profile::tag_mask_defect`).
    check_tags: bool,
    /// An endpoint failed to close: its operations' slots are kept for
    /// good, and leaked when the loop drops.
    close_failed: bool,
    /// Set by the layer above when waiting for room is pointless (the World
    /// sets it once a rank is lost): a post retrying on a full queue then
    /// gives up at once with [`Error::QueueFull`](crate::Error::QueueFull)
    /// instead of after `post_timeout`.
    pub(crate) give_up: Option<Arc<AtomicBool>>,
    /// Set by the World's collectives while they post: a post the provider
    /// refuses fails at once ([`Error::QueueFull`](crate::Error::QueueFull))
    /// instead of waiting for room, and the collective posts it again at
    /// its next progress (`world/collectives/io.rs`, `Io::posting`). Their
    /// sends are not ordered behind the application's backlog either.
    pub(crate) no_wait: bool,
    /// Peers watched through their lifelines, and those lost.
    pub(crate) lost: lost_peers::LostPeers,
    /// The thread that drives progress while the application does not
    /// poll ([`LoopConfig::progress_thread`]); stopped first in `Drop`.
    pub(crate) progress: Option<crate::transport::progress::Progress>,
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
        let sleeps = match cfg.wait {
            WaitMode::Block => true,
            WaitMode::Adaptive => cfg.yield_before_block.is_some(),
            _ => false,
        };
        let want_fd = sleeps && profile.wait_fd;
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
            Some(Eq::open(&domain)?)
        } else {
            None
        };
        let has = |c: &str| profile.caps_granted.iter().any(|g| g == c);
        let progress = start_progress(profile, &cfg, &cq)?;
        Ok(EventLoop {
            endpoints: Vec::new(),
            slab: Slab {
                slots: Vec::new(),
                by_addr: Vec::new(),
                free: Vec::new(),
                in_flight: 0,
                timed: 0,
            },
            pending: Vec::with_capacity(CQ_BATCH * 4),
            backlog: backlog::Backlog::new(),
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
            am: am_state::AmState {
                tags: tag_space::TagSpace::new(profile.tag_bits).reserved(profile.atomics_emulated()),
                ..Default::default()
            },
            poster: tag_space::Poster::Application,
            mapped_keys: Vec::new(),
            rx_cq_data: profile.mode.iter().any(|m| m == "FI_RX_CQ_DATA"),
            cq_entries: Some(CqEntries::default()),
            next_expiry_scan: Instant::now(),
            warned_tag_mask: false,
            check_tags: profile.tag_mask_defect.is_some(),
            close_failed: false,
            give_up: None,
            no_wait: false,
            lost: lost_peers::LostPeers::default(),
            progress,
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
    pub fn wire_profile(&self) -> crate::discovery::profile::WireProfile {
        let mut w = self.domain.profile.wire();
        w.framed = self.framed();
        w
    }

    /// Most operations in flight at once: the completion queue's size.
    pub fn cq_capacity(&self) -> usize {
        self.cq.capacity
    }

    /// Whether this loop runs a progress thread
    /// ([`LoopConfig::progress_thread`]).
    pub fn progress_thread(&self) -> bool {
        self.progress.is_some()
    }

    /// How many times the progress thread has driven the provider's
    /// progress (it does only while the loop does not read its CQ); 0
    /// without a thread.
    pub fn progress_runs(&self) -> u64 {
        self.progress.as_ref().map_or(0, |p| p.runs())
    }

    /// The progress thread's gate, to hold (`let _g = gate.as_ref().map(|g| g.lock())`)
    /// around opening, enabling and closing endpoints and inserting
    /// addresses; `None` without a thread.
    pub(crate) fn progress_gate(&self) -> Option<Arc<parking_lot::Mutex<()>>> {
        self.progress.as_ref().map(|p| p.gate())
    }

    /// Reserve the World's tag classes on this loop (every class byte but
    /// the application's 0, `world/tags.rs`): from now on the application's
    /// sends there are refused, naming the class, and its receives never
    /// match them; the World's collectives post through [`EventLoop::as_world`].
    pub(crate) fn reserve_world_classes(&mut self) {
        self.am.tags = self.am.tags.with_world();
    }

    /// This loop, posting for the World's collectives and notices (their
    /// tag classes allowed) until the guard drops.
    pub(crate) fn as_world(&mut self) -> AsWorld<'_> {
        self.poster = tag_space::Poster::World;
        AsWorld(self)
    }

    /// Operations posted and not yet completed (the loop's own receives
    /// for peers' emulated atomics are not counted).
    pub fn in_flight(&self) -> usize {
        self.slab.in_flight.saturating_sub(self.am.posted)
    }
}

/// An [`EventLoop`] posting for the World ([`EventLoop::as_world`]); the
/// application's rule is back when it drops.
pub(crate) struct AsWorld<'a>(&'a mut EventLoop);

impl std::ops::Deref for AsWorld<'_> {
    type Target = EventLoop;
    fn deref(&self) -> &EventLoop {
        self.0
    }
}

impl std::ops::DerefMut for AsWorld<'_> {
    fn deref_mut(&mut self) -> &mut EventLoop {
        self.0
    }
}

impl Drop for AsWorld<'_> {
    fn drop(&mut self) {
        self.0.poster = tag_space::Poster::Application;
    }
}

/// The progress thread `cfg` asks for, if the profile needs or allows it.
fn start_progress(
    profile: &Profile,
    cfg: &LoopConfig,
    cq: &Cq,
) -> Result<Option<crate::transport::progress::Progress>> {
    use crate::discovery::info::Threading;
    let want = match cfg.progress_thread {
        ProgressThread::Off => false,
        ProgressThread::On => true,
        ProgressThread::WhereNeeded => ProgressThread::needed(profile),
    };
    if !want {
        return Ok(None);
    }
    if profile.threading != Threading::Safe {
        if cfg.progress_thread == ProgressThread::WhereNeeded {
            log::warn!(
                "{}: no progress thread at threading level {:?} (it needs FI_THREAD_SAFE): peers' one-sided \
                 operations complete only while this loop polls",
                profile.provider,
                profile.threading
            );
            return Ok(None);
        }
        return Err(crate::error::Error::Unsupported {
            what: format!(
                "a progress thread at threading level {:?} (it calls into the CQ beside the loop: \
                 FI_THREAD_SAFE is needed); use ProgressThread::Off and poll",
                profile.threading
            ),
            provider: profile.provider.clone(),
        });
    }
    // SAFETY: the CQ is open, its domain is at FI_THREAD_SAFE (checked
    // above), and the loop drops the thread before it closes the CQ.
    let p = unsafe { crate::transport::progress::Progress::start(cq.raw, cq.tagged, cfg.progress_period) };
    p.map(Some).map_err(|e| crate::error::Error::Io {
        context: "starting the progress thread".into(),
        source: e,
    })
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

    /// The table in `LoopConfig`'s docs is what `default()` gives.
    #[test]
    fn loop_config_defaults_are_the_documented_ones() {
        use std::time::Duration;
        let c = LoopConfig::default();
        assert_eq!(c.post_timeout, None);
        assert_eq!(c.max_backlog, 65_536);
        assert_eq!(c.wait, WaitMode::Spin);
        assert_eq!(c.spin_before_block, Duration::from_micros(50));
        assert_eq!(c.yield_before_block, Some(Duration::from_millis(2)));
        assert_eq!(c.rma_timeout, Some(Duration::from_secs(30)));
        assert!(c.cq_size.is_none() && c.min_multi_recv.is_none() && c.rma_chunk.is_none());
        assert!(!c.force_framing);
        assert_eq!(c.progress_thread, ProgressThread::Off);
        assert_eq!(c.progress_period, Duration::from_millis(1));
    }
}
