//! The event loop's public vocabulary: tokens, endpoint ids, peers,
//! operation kinds, options, completions and their errors, and the loop's
//! configuration with its defaults.

use crate::discovery::profile::Agreement;
use crate::error::{Error, ErrorCode};
use crate::ffi;
use crate::memory::buffer::Buffer;
use std::fmt;
use std::time::Duration;

/// A value chosen by the application to recognise an operation's completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Token(pub u64);

impl Token {
    /// The token of a [`OpKind::RemoteWrite`] notice that used up no
    /// receive of this side (the provider delivers remote CQ data on its own).
    pub const REMOTE: Token = Token(u64::MAX);
    /// The token of an [`OpKind::PeerLost`] notice.
    pub const PEER_LOST: Token = Token(u64::MAX - 1);
}

/// An endpoint of an [`EventLoop`](super::EventLoop).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EndpointId(pub(crate) u32);

impl EndpointId {
    pub(crate) fn new(index: u32) -> Self {
        EndpointId(index)
    }

    /// The endpoint's index in its loop (what logs and `--stats` print).
    pub fn index(self) -> u32 {
        self.0
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

    /// Whether `c` is the notice that this peer is lost
    /// ([`OpKind::PeerLost`]).
    pub fn is_lost_in(&self, c: &Completion) -> bool {
        c.kind == OpKind::PeerLost && c.endpoint == self.endpoint && c.source == Some(self.addr)
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
    /// A peer's [`EventLoop::write_data`](super::EventLoop::write_data) landed here: its data is in place
    /// and its immediate value is in [`Completion::data`]. Where the
    /// fabric delivers that value through a receive (`FI_RX_CQ_DATA`, or
    /// fabric-msg's follow-up message where there is no remote CQ data),
    /// the receive's token and (empty) buffer come back with it; elsewhere
    /// the token is [`Token::REMOTE`].
    RemoteWrite,
    /// A peer connected through the bootstrap is lost: it died or went
    /// silent for [`LoopConfig::peer_timeout`] ([`CompletionError::PeerLost`]
    /// says which and names it). A peer that closed its loop departs
    /// without this notice; its operations end as below all the same. Token
    /// [`Token::PEER_LOST`]; `endpoint` and `source` identify the peer
    /// ([`Peer::is_lost_in`]). Its operations then complete with the same
    /// error, and later posts to it fail with [`Error::PeerLost`].
    PeerLost,
    /// A look at the messages waiting for a receive
    /// ([`EventLoop::peek`](super::EventLoop::peek)): what it found is in
    /// [`Completion::peeked`] (`None`: no message matched).
    Peek,
}

/// What a peek found: a message waiting to be received.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peeked {
    /// The message's length in bytes: a receive of at least this many
    /// takes it whole.
    pub len: usize,
}

/// How `poll` waits when nothing is ready (`transport/event_loop/idle.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum WaitMode {
    /// Spin on the CQ: lowest latency, one busy core, and on a core shared
    /// with other ranks the time they need to answer.
    Spin,
    /// Spin for [`LoopConfig::spin_before_block`], then sleep on the CQ's
    /// wait fd (after `fi_trywait`); spins where the provider has no wait
    /// object.
    Block,
    /// Spin for [`LoopConfig::spin_before_block`], then give the core away
    /// (`sched_yield`) between looks until [`LoopConfig::yield_before_block`]
    /// has passed with nothing done, then sleep on the CQ's wait fd where
    /// the provider has one (yielding on where it has none, or where
    /// `yield_before_block` is `None`). What a World waits with; it yields
    /// from the start, and sleeps after 2 ms, when its node runs more ranks
    /// than it has cores.
    Adaptive,
}

/// Whether an [`EventLoop`](super::EventLoop) runs a progress thread,
/// so that peers' one-sided operations on this side's memory complete
/// while the application does not call `poll` (see
/// [`LoopConfig::progress_thread`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProgressThread {
    /// No thread: peers' RMA to this side (and `shm`'s native atomics)
    /// progress only while the application polls, on the providers where
    /// [`ProgressThread::needed`] is true.
    Off,
    /// A thread wherever the domain allows it (`FI_THREAD_SAFE`); opening
    /// the loop fails at any other threading level.
    On,
    /// A thread where the provider needs one ([`ProgressThread::needed`])
    /// and the domain allows it; none elsewhere.
    WhereNeeded,
}

impl ProgressThread {
    /// Whether peers' one-sided operations on this side's memory need this
    /// side to call into libfabric on the provider `profile` names: its
    /// core provider (the first of a `core;utility` chain such as
    /// `tcp;ofi_rxm`) moves bytes in software, inside a CQ read.
    /// True for `tcp` (whose connected endpoints report
    /// `FI_PROGRESS_AUTO` in libfabric 1.17 yet serve no read without
    /// one), `shm`, `udp`, `net` and `sm2`; false for `sockets`, which runs
    /// its own progress threads, and for RDMA devices, whose NICs serve
    /// one-sided operations.
    pub fn needed(profile: &crate::discovery::profile::Profile) -> bool {
        let core = profile.provider.split(';').next().unwrap_or("");
        matches!(core, "tcp" | "shm" | "udp" | "net" | "sm2")
    }
}

/// Tuning for an [`EventLoop`](super::EventLoop).
///
/// `LoopConfig::default()`:
///
/// | field | default |
/// |---|---|
/// | `post_timeout` | `None`: an operation the provider has no room for waits while its peer is alive |
/// | `max_backlog` | 65,536 sends |
/// | `wait` | [`WaitMode::Spin`] |
/// | `spin_before_block` | 50 µs (used with [`WaitMode::Block`] and [`WaitMode::Adaptive`]) |
/// | `yield_before_block` | `Some(2 ms)` (used with [`WaitMode::Adaptive`]) |
/// | `cq_size` | `None`: two endpoints' queues, capped by the device |
/// | `force_framing` | `false` |
/// | `min_multi_recv` | `None`: the provider's default |
/// | `rma_chunk` | `None`: the fabric's and the peer's `max_msg_size` |
/// | `rma_timeout` | 30 s |
/// | `peer_timeout` | 10 s |
/// | `progress_thread` | [`ProgressThread::Off`] |
/// | `progress_period` | 1 ms |
#[derive(Debug, Clone)]
pub struct LoopConfig {
    /// The application's own deadline for an operation the provider has no
    /// room for yet (`FI_EAGAIN`; a receive's `FI_ENOMEM`): a send waits in
    /// the loop's backlog and is posted as progress allows, any other post
    /// waits inside the call, progressing. `None` (the default): it waits
    /// as long as it takes (a peer that computes for minutes is no
    /// failure); it ends only when its peer is lost (the bootstrap's
    /// lifeline, [`LoopConfig::peer_timeout`], or the World's liveness),
    /// then failing with that loss. `Some(t)`: a post or a backlogged send
    /// that made no progress for `t` fails ([`Error::QueueFull`](crate::Error::QueueFull),
    /// [`CompletionError::NotPosted`]); `Some(Duration::ZERO)` fails a post
    /// the provider refuses at once, for callers that progress and retry
    /// themselves.
    pub post_timeout: Option<Duration>,
    /// Most sends the backlog holds (those the provider had no room for
    /// yet). Each holds its buffer (the caller's, no copy) and about 120 bytes of
    /// the loop's; a send beyond the bound waits inside the call,
    /// progressing, until the backlog shrinks (or, as above, its peer is
    /// lost or `post_timeout` passes). Default: 65,536.
    pub max_backlog: usize,
    /// How `poll` waits. Default: [`WaitMode::Spin`] (a World's
    /// [`WorldConfig`](crate::WorldConfig) uses [`WaitMode::Adaptive`]).
    pub wait: WaitMode,
    /// In [`WaitMode::Block`], how long `poll` spins on the CQ before it
    /// sleeps on the wait fd. Waking a sleeping thread costs tens of
    /// microseconds (more in VMs); a short spin catches replies that come
    /// quickly at the price of that much CPU per wait. `Duration::ZERO`:
    /// sleep at once. Default: 50 µs.
    pub spin_before_block: Duration,
    /// In [`WaitMode::Adaptive`], how long `poll` finds nothing (spinning,
    /// then yielding) before it sleeps on the wait fd. `None`: it never
    /// sleeps, and the CQ is opened without a wait object, which costs
    /// nothing per completion (with a wait fd an 8-byte latency on
    /// `tcp;ofi_rxm` was 10.6–11.6 µs here instead of 7.4–7.8 µs:
    /// `docs/world.md`, "Waiting"). Default: `Some(2 ms)`; a World's is `None` unless its
    /// node is oversubscribed.
    pub yield_before_block: Option<Duration>,
    /// Completion queue entries; `None`: room for two endpoints' queues
    /// (capped by the device's `max_cqe`). At most this many operations are
    /// in flight at once: a post beyond it waits as for a full queue.
    pub cq_size: Option<usize>,
    /// Frame every message with fabric-msg's 16-byte header (payload length
    /// and immediate data) even where the profile does not ask for it. The
    /// profile frames where the fabric has no remote CQ data (iWARP) and
    /// where a provider truncates silently (`udp;ofi_rxd`). Peers compare it
    /// at connect time. Default: `false`.
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
    /// `udp;ofi_rxd` in libfabric 1.17). `None`: wait for ever. Default: 30 s.
    pub rma_timeout: Option<Duration>,
    /// A peer connected through the bootstrap from which nothing (not even
    /// the heartbeat its loop sends every 250 ms on the bootstrap
    /// connection) was heard for this long is reported lost
    /// ([`OpKind::PeerLost`]): it is stopped, hung, or cut off. At least
    /// 1 s. A peer whose process ends is reported at once, whatever this
    /// is. `None`: only deaths and departures are reported. Default: 10 s.
    pub peer_timeout: Option<Duration>,
    /// Run a thread that drives the provider's progress while the
    /// application does not poll, so that peers' RMA reads and writes to
    /// this side's memory, and native atomics on it, complete while it
    /// computes or sleeps. Emulated atomics
    /// ([`AtomicCarrier::Emulated`](crate::discovery::atomic::AtomicCarrier::Emulated)) still
    /// wait for this side's `poll`: the loop applies them. The thread calls
    /// libfabric only when the loop has not read its CQ for
    /// `progress_period`, so a polling application pays one relaxed store
    /// per CQ read. Default: [`ProgressThread::Off`] (see
    /// `docs/decisions.md`, "A progress thread for idle targets").
    pub progress_thread: ProgressThread,
    /// How often the progress thread wakes: the longest a peer's one-sided
    /// operation waits for an idle target, per provider round trip (an
    /// RMA read over `tcp;ofi_rxm` takes one or two). At least 10 µs.
    /// Default: 1 ms.
    pub progress_period: Duration,
}

impl Default for LoopConfig {
    fn default() -> Self {
        LoopConfig {
            post_timeout: None,
            max_backlog: 65_536,
            wait: WaitMode::Spin,
            spin_before_block: Duration::from_micros(50),
            yield_before_block: Some(Duration::from_millis(2)),
            cq_size: None,
            force_framing: false,
            min_multi_recv: None,
            rma_chunk: None,
            rma_timeout: Some(Duration::from_secs(30)),
            peer_timeout: Some(Duration::from_secs(10)),
            progress_thread: ProgressThread::Off,
            progress_period: Duration::from_millis(1),
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
        "no completion after {0:?}: the peer may have refused the access (a wrong or revoked key, or an \
         address outside the region: shm and udp;ofi_rxd never complete a refused operation), died, or \
         stopped polling its loop (needed for progress on some providers); the operation's memory stays \
         held until the provider releases it or the endpoint is closed"
    )]
    TimedOut(Duration),
    /// The operation was cancelled: by [`EventLoop::cancel_recv`](super::EventLoop::cancel_recv)
    /// (the World cancels the unused half of an any-source receive it
    /// posted on two loops, and never hands that one out), or by the
    /// provider, which flushed it because the endpoint closed or its
    /// connection to the peer ended.
    #[error(
        "operation cancelled (FI_ECANCELED): the endpoint closed, or the provider's connection to the \
         peer ended (tcp and tcp;ofi_rxm end it when the peer refuses a one-sided access: a wrong or \
         revoked key, or memory outside the region); later operations to that peer fail too \
         (FI_ENOTCONN): connect to it again from a new endpoint"
    )]
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
    /// A send the loop kept while the provider had no room for it (see
    /// [`EventLoop::send`](super::EventLoop::send)) and could not post: the
    /// peer made no room within [`LoopConfig::post_timeout`] (it is not
    /// posting receives, or a rank was lost), or `call` failed otherwise.
    /// Nothing was sent.
    #[error("{call}: the send was never posted: {reason}")]
    NotPosted {
        /// The libfabric function (`fi_tsend`, ...).
        call: &'static str,
        /// Why, in words.
        reason: String,
    },
    /// The provider gave this tagged receive a message whose tag its
    /// `(tag, ignore)` does not match. Seen only where the provider matches
    /// masked receives wrongly (shm before libfabric 1.19:
    /// [`Profile::tag_mask_defect`](crate::Profile::tag_mask_defect)), where
    /// the loop checks every tagged receive. The message is in this
    /// completion (its buffer, [`Completion::tag`](super::Completion::tag)),
    /// and the receive it was meant for will not get it.
    #[error(
        "the provider gave a receive for tag {wanted:#x} (ignoring {ignore:#x}) a message with tag {got:#x}; \
         the message is in this completion. libfabric's shm before 1.19 matches receives against earlier \
         messages with a stale ignore mask: receive with exact tags only there, or use libfabric 1.19 or \
         newer, or another provider"
    )]
    Misdelivered {
        /// The tag the receive was posted for.
        wanted: u64,
        /// Its ignore mask.
        ignore: u64,
        /// The tag of the message it got.
        got: u64,
    },
    /// A message on a framed endpoint without a valid header: the peer does
    /// not frame its messages.
    #[error("received {0} bytes without a valid fabric-msg header: is the peer configured alike (framing)?")]
    BadFrame(usize),
    /// The peer this operation was addressed to is lost (see
    /// [`OpKind::PeerLost`]). On an RDM endpoint an operation the provider
    /// still held after [`LOSS_GRACE`](crate::transport::liveness::LOSS_GRACE) comes back
    /// without its buffer, which the loop frees once the provider lets go
    /// of it or the endpoint closes.
    #[error("peer {peer} is lost: {how}; connect to it again, or go on without it")]
    PeerLost {
        /// The peer's bootstrap address.
        peer: String,
        /// How it was lost.
        how: crate::transport::liveness::LossKind,
    },
    /// A same-node rank wrote a frame into its ring that cannot be right
    /// (`transport/node`): a bug or memory corruption in that process, or
    /// a hostile one. Nothing more is read from its ring.
    #[error(
        "same-node rank {peer} wrote a corrupt frame into its ring ({what}); nothing more is read from it"
    )]
    CorruptRing {
        /// The rank, by its index on the node.
        peer: usize,
        /// What was wrong.
        what: String,
    },
    /// A large same-node message could not be read from the sender's
    /// memory (`process_vm_readv`, `transport/node/single_copy.rs`): the
    /// sender's process is gone (`ESRCH`), its buffer was not where it
    /// said (`EFAULT`), or reading it was refused (`EPERM`). Reported to
    /// both ends; nothing of the message is delivered.
    #[error(
        "the single-copy transfer of a same-node message with rank {peer} failed: {}",
        std::io::Error::from_raw_os_error(*.errno)
    )]
    CopyFailed {
        /// The other rank, by its index on the node.
        peer: usize,
        /// The `errno` of the failed read.
        errno: i32,
    },
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
    /// length). Read it with [`EventLoop::multi_recv_bytes`](super::EventLoop::multi_recv_bytes) while the
    /// buffer is still posted, or from the buffer once it comes back.
    pub multi: Option<(usize, usize)>,
    /// The multi-receive slot (index, generation) this piece lies in.
    pub(crate) slot: Option<(u32, u64)>,
    /// The completion that ends a multi-receive buffer: `poll` releases
    /// the slot and attaches the buffer when it hands this one out.
    pub(crate) finishes: bool,
    /// What a peek ([`OpKind::Peek`]) found; `None` for every other kind.
    pub peeked: Option<Peeked>,
}

impl Completion {
    /// A completion with no buffer, tag, data or source: of a one-sided
    /// operation, a split transfer, or a remote write's notice.
    pub(crate) fn outcome(
        token: Token,
        endpoint: u32,
        kind: OpKind,
        result: Result<(), CompletionError>,
    ) -> Completion {
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
            peeked: None,
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
    /// Send tagged, with this tag. On a loop that emulates atomics
    /// ([`Profile::atomic_carrier`](crate::Profile::atomic_carrier)) the
    /// top usable tag bit (bit 63) is fabric-msg's own: tags with it are
    /// refused, and receives never match them.
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
