//! The [`EventLoop`] itself: its fields, how it opens (fabric, domain, CQ,
//! AV or EQ, progress thread) and its plain accessors. What it does lives
//! beside it, one file per responsibility: posting (`post.rs`), the send
//! backlog (`backlog.rs`), completions (`completions.rs`), endpoints and
//! peers (`endpoint.rs`), emulated atomics (`am.rs`), lost peers
//! (`lost_peers.rs`), overdue one-sided operations (`deadlines.rs`) and
//! closing (`teardown.rs`).

use super::resources::EndpointState;
use super::slab::{Groups, Slab};
use super::types::{Completion, LoopConfig, ProgressThread, WaitMode};
use super::{am_state, backlog, lost_peers, stats, tag_space};
use crate::discovery::info::EndpointType;
use crate::discovery::profile::Profile;
use crate::error::Result;
use crate::libfabric::{Av, Cq, CqEntries, Eq, PassiveEndpoint, CQ_BATCH};
use crate::memory::buffer::{Buffer, HEADROOM};
use crate::memory::domain::DomainInner;
use std::fmt;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Instant;

/// One completion queue and the endpoints, peers and operations that use it.
pub struct EventLoop {
    // Dropped explicitly in `Drop` (teardown.rs): the progress thread,
    // then the endpoints, then operations (their buffers); the rest drop in
    // this order after it: the passive endpoint, EQ, AV and CQ
    // (`objects`) after every endpoint bound to them, the domain last of
    // all (each object holds it too).
    pub(crate) endpoints: Vec<Option<EndpointState>>,
    /// Every operation in flight, by slot, with its buffer.
    pub(super) slab: Slab,
    /// Completions reaped and not yet handed out, oldest first.
    pub(super) pending: Vec<Completion>,
    /// Sends the provider had no room for, posted again as the loop progresses.
    pub(super) backlog: backlog::Backlog,
    /// Counters a user can read ([`EventLoop::stats`]).
    pub(super) stats: stats::Stats,
    /// Emulated atomics: pools, posted request receives, regions by key.
    pub(crate) am: am_state::AmState,
    /// Peers watched through their lifelines, and those lost.
    pub(crate) lost: lost_peers::LostPeers,
    /// How posts behave here: the provider's traits and the World's rules.
    pub(super) rules: Rules,
    /// Memory kept for reuse, and keys to unmap.
    pub(super) spare: Spare,
    /// The libfabric objects besides the endpoints and the domain.
    pub(crate) objects: Objects,
    pub(crate) domain: Arc<DomainInner>,
    pub(crate) cfg: LoopConfig,
}

/// The libfabric objects a loop owns besides its endpoints and domain, in
/// the order they close.
pub(crate) struct Objects {
    pub(crate) pep: Option<PassiveEndpoint>,
    pub(crate) eq: Option<Arc<Eq>>,
    pub(super) av: Option<Arc<Av>>,
    pub(crate) cq: Arc<Cq>,
    /// Most operations in flight at once: the CQ's size (kept here, as
    /// every post compares with it).
    pub(crate) cq_capacity: usize,
    /// The thread that drives progress while the application does not
    /// poll ([`LoopConfig::progress_thread`]); stopped first in `Drop`.
    pub(crate) progress: Option<crate::transport::progress::Progress>,
    /// An endpoint failed to close: its operations' slots are kept for
    /// good, and leaked when the loop drops.
    pub(super) close_failed: bool,
}

/// How posts behave on this loop: what the provider does (fixed when the
/// loop opens) and what the layer above asked (`give_up_when`,
/// `set_fail_fast`, `as_world`).
pub(super) struct Rules {
    /// Completions report their sender (`FI_SOURCE`).
    pub(super) has_source: bool,
    /// Receives can name their sender (`FI_DIRECTED_RECV`).
    pub(super) directed: bool,
    /// Remote CQ data uses up a posted receive (`FI_RX_CQ_DATA` mode).
    pub(super) rx_cq_data: bool,
    /// Tagged receives are checked against their message's tag: the
    /// provider matches masked receives wrongly (`Profile::tag_mask_defect`).
    pub(super) check_tags: bool,
    /// Whether the first masked receive on such a provider was warned of.
    pub(super) warned_tag_mask: bool,
    /// Whose posts are being made: the application's, unless the World's
    /// collectives post through [`EventLoop::as_world`].
    pub(super) poster: tag_space::Poster,
    /// Set by the layer above when waiting for room is pointless (the World
    /// sets it once a rank is lost): a post retrying on a full queue then
    /// gives up at once with [`Error::QueueFull`](crate::Error::QueueFull)
    /// instead of after `post_timeout`.
    pub(super) give_up: Option<Arc<AtomicBool>>,
    /// Set by the World's collectives while they post: a post the provider
    /// refuses fails at once ([`Error::QueueFull`](crate::Error::QueueFull))
    /// instead of waiting for room, and the collective posts it again at
    /// its next progress (`world/collectives/io.rs`). Their sends are not
    /// ordered behind the application's backlog either.
    pub(super) no_wait: bool,
}

/// Memory a loop keeps for reuse, and what it must undo when it closes.
pub(super) struct Spare {
    /// An inject's bytes with fabric-msg's header in front.
    pub(super) scratch: Vec<u8>,
    /// Header-only buffers for write_data's follow-up messages, reused.
    pub(super) notify_bufs: Vec<Buffer>,
    /// Registered operands and results of atomics, one entry per slot.
    pub(super) atomic_scratch: Option<crate::memory::mr::MemoryRegion>,
    /// Raw keys mapped by `import`, unmapped when the loop closes.
    pub(super) mapped_keys: Vec<u64>,
    /// The CQ's read buffers; taken while `read_cq` runs (it calls back
    /// into the loop).
    pub(super) cq_entries: Option<CqEntries>,
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
        crate::error::logging::init_from_env();
        let domain = DomainInner::open(profile)?;
        let q = profile.queues;
        let tagged = profile.caps_granted.iter().any(|c| c == "FI_TAGGED");
        let sleeps = match cfg.wait {
            WaitMode::Block => true,
            WaitMode::Adaptive => cfg.yield_before_block.is_some(),
            _ => false,
        };
        let want_fd = sleeps && profile.wait_fd;
        let mut size = cfg.cq_size.unwrap_or(q.cq * 2).max(1);
        if let Some(max) = profile.limits.max_cqe {
            size = size.min(max as usize);
        }
        let cq = Cq::open(&domain.domain, size, tagged, want_fd)?;
        let av = if profile.endpoint_type == EndpointType::Rdm {
            Some(Av::open(&domain.domain, q.av)?)
        } else {
            None
        };
        let eq = if profile.endpoint_type == EndpointType::Msg {
            Some(Eq::open(domain.fabric())?)
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
                next_expiry_scan: Instant::now(),
                groups: Groups::default(),
            },
            pending: Vec::with_capacity(CQ_BATCH * 4),
            backlog: backlog::Backlog::new(),
            stats: stats::Stats::default(),
            am: am_state::AmState {
                tags: tag_space::TagSpace::new(profile.tag_bits).reserved(profile.atomics_emulated()),
                ..Default::default()
            },
            lost: lost_peers::LostPeers::default(),
            rules: Rules {
                has_source: profile.source,
                directed: has("FI_DIRECTED_RECV"),
                rx_cq_data: profile.mode.iter().any(|m| m == "FI_RX_CQ_DATA"),
                check_tags: profile.tag_mask_defect.is_some(),
                warned_tag_mask: false,
                poster: tag_space::Poster::Application,
                give_up: None,
                no_wait: false,
            },
            spare: Spare {
                scratch: vec![0; profile.inject_size + HEADROOM],
                notify_bufs: Vec::new(),
                atomic_scratch: None,
                mapped_keys: Vec::new(),
                cq_entries: Some(CqEntries::default()),
            },
            objects: Objects {
                pep: None,
                eq,
                av,
                cq_capacity: cq.capacity(),
                cq,
                progress,
                close_failed: false,
            },
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
        self.objects.cq_capacity
    }

    /// Whether this loop runs a progress thread
    /// ([`LoopConfig::progress_thread`]).
    pub fn progress_thread(&self) -> bool {
        self.objects.progress.is_some()
    }

    /// How many times the progress thread has driven the provider's
    /// progress (it does only while the loop does not read its CQ); 0
    /// without a thread.
    pub fn progress_runs(&self) -> u64 {
        self.objects.progress.as_ref().map_or(0, |p| p.runs())
    }

    /// The progress thread's gate, to hold (`let _g = gate.as_ref().map(|g| g.lock())`)
    /// around opening, enabling and closing endpoints and inserting
    /// addresses; `None` without a thread.
    pub(crate) fn progress_gate(&self) -> Option<Arc<parking_lot::Mutex<()>>> {
        self.objects.progress.as_ref().map(|p| p.gate())
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
        self.rules.poster = tag_space::Poster::World;
        AsWorld(self)
    }

    /// The layer above's signal that waiting for room is pointless: once
    /// `flag` is set (the World sets it when a rank is lost), a post
    /// retrying on a full queue fails at once with
    /// [`Error::QueueFull`](crate::Error::QueueFull) instead of waiting,
    /// backlogged sends fail, `poll` reads the completion queue no more
    /// (it hands out what it already read, then returns 0 whatever its
    /// timeout) and stops the progress thread, and on `ofi_rxm` the endpoints are left open when the
    /// loop drops (`Quirks::close_hangs_after_loss`).
    pub(crate) fn give_up_when(&mut self, flag: Arc<AtomicBool>) {
        self.rules.give_up = Some(flag);
    }

    /// Whether a post the provider refuses for lack of room fails at once
    /// ([`Error::QueueFull`](crate::Error::QueueFull)) instead of waiting
    /// for room, and sends skip the backlog: on while the World's
    /// collectives post, which keep what was refused and post it again at
    /// their next progress (`world/collectives/io.rs`). Returns the old
    /// setting.
    pub(crate) fn set_fail_fast(&mut self, on: bool) -> bool {
        std::mem::replace(&mut self.rules.no_wait, on)
    }

    /// What this loop has done so far ([`LoopStats`](super::LoopStats)):
    /// messages and bytes each way, in total and per peer, the backlog,
    /// retries, truncations, lost peers, emulated atomics. Built on demand,
    /// so it allocates (the per-peer list), unlike the counting itself.
    pub fn stats(&self) -> stats::LoopStats {
        self.stats
            .report(self.backlog.len(), self.lost.lost_count(), self.am.counters)
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
        self.0.rules.poster = tag_space::Poster::Application;
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
    // SAFETY: the domain is at FI_THREAD_SAFE (checked above), and the
    // loop drops the thread (`objects.progress`) before it closes the CQ.
    let p = crate::transport::progress::Progress::start(unsafe { cq.progress_handle() }, cfg.progress_period);
    p.map(Some).map_err(|e| crate::error::Error::Io {
        context: "starting the progress thread".into(),
        source: e,
    })
}
