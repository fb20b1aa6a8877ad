//! Errors: one enum for everything fabric-msg reports.
//!
//! A failed libfabric call carries the name of the call, the positive `FI_E*`
//! code and libfabric's own text for it. `FI_EAGAIN`, `FI_EOPNOTSUPP` and
//! `FI_ENODATA` have their own variants because callers act on them.

pub mod logging;
mod rejection;

pub use rejection::{Reason, Rejection};

use crate::ffi;
use std::ffi::CStr;
use std::fmt;

/// Result alias used throughout fabric-msg.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in fabric-msg.
/// `Display` is one sentence; `Debug` (what `main` returning `Result` prints)
/// adds the detail, such as every rung negotiation passed over, one per line.
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A libfabric call failed with a code that has no variant of its own.
    #[error("{call} failed: {text} ({code_name})")]
    Fabric {
        /// The libfabric function, e.g. `fi_domain`.
        call: &'static str,
        /// The positive `FI_E*` code.
        code: u32,
        /// `FI_EINVAL`, `FI_ENOMEM`, ... as a name.
        code_name: ErrorCode,
        /// libfabric's `fi_strerror` text.
        text: String,
    },
    /// `-FI_EAGAIN`: a queue is full or nothing is ready; progress and retry.
    #[error("{call}: resource temporarily unavailable (FI_EAGAIN)")]
    Again {
        /// The libfabric function that returned it.
        call: &'static str,
    },
    /// `-FI_ENODATA`: libfabric found nothing that matches the request.
    #[error("{call}: no matching fabric interface (FI_ENODATA)")]
    NoData {
        /// The libfabric function that returned it.
        call: &'static str,
    },
    /// The provider does not support what was asked (`FI_EOPNOTSUPP`), or
    /// fabric-msg knows in advance that it cannot.
    #[error("{what} is not supported by provider `{provider}`")]
    Unsupported {
        /// What was asked for.
        what: String,
        /// The provider that lacks it.
        provider: String,
    },
    /// `providers.toml` (or `FABRIC_MSG_PROVIDERS`) could not be used.
    #[error("{source_name}: {message}")]
    Config {
        /// The file (or `built-in defaults`).
        source_name: String,
        /// What is wrong, naming the line and key where known.
        message: String,
    },
    /// No rung of the ladder gave a usable fabric; `reasons` says why each
    /// was passed over. Its text names each distinct reason once; every
    /// rung's is in [`Error::rejections`] (and in `Debug`).
    #[error("no usable fabric for {wanted}: {}", summarize(.reasons))]
    NoFabric {
        /// The requirements, in words.
        wanted: String,
        /// Why each candidate was not chosen.
        reasons: Vec<Rejection>,
    },
    /// `FI_PROVIDER` (or the requested provider) names a provider this
    /// host does not offer.
    #[error("{requested}, but libfabric offers no such provider here; {}", provider_hint(.requested, .available))]
    ProviderNotAvailable {
        /// The restriction, e.g. `FI_PROVIDER=verbs` or `-p verbs`.
        requested: String,
        /// The providers libfabric does offer (empty when libfabric's own
        /// `FI_PROVIDER` filter hides them all).
        available: Vec<String>,
    },
    /// A queue stayed full: `call` kept refusing for lack of room
    /// (`FI_EAGAIN`, or `FI_ENOMEM` for a receive) although the completion
    /// queue was progressed, or the loop's own bound on operations in
    /// flight (the CQ's size) was reached and nothing completed.
    #[error("{call}: {}", queue_full_text(.call, .waited, .in_flight, .code))]
    QueueFull {
        /// The libfabric function that refused (`fi_tsend`, `fi_trecv`,
        /// ...), or `fi_cq_read` when the loop waited for its own bound.
        call: &'static str,
        /// How long the post retried.
        waited: std::time::Duration,
        /// Operations in flight at the time.
        in_flight: usize,
        /// What the call returned: `FI_EAGAIN` or `FI_ENOMEM`; `None` when
        /// the loop's bound, not the provider, kept the post waiting.
        code: Option<ErrorCode>,
    },
    /// A message (or injected message) larger than the fabric allows.
    #[error("{what} of {len} bytes exceeds the limit of {max} bytes for this fabric")]
    TooLarge {
        /// What was too large.
        what: &'static str,
        /// Its size.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The object was closed (or never existed in this loop).
    #[error("{what} is closed")]
    Closed {
        /// What.
        what: String,
    },
    /// Registering memory failed for lack of lockable memory.
    #[error(
        "registering {len} bytes failed (FI_ENOMEM): registered memory is pinned against the \
         locked-memory limit, which is {memlock}; raise it (`ulimit -l`, LimitMEMLOCK= for services) \
         or register less"
    )]
    MemoryLimit {
        /// Bytes being registered.
        len: usize,
        /// `RLIMIT_MEMLOCK` as text.
        memlock: String,
    },
    /// A one-sided operation reaches outside the memory it names; nothing
    /// was posted.
    #[error(
        "{what}: {len} bytes at offset {offset} reach beyond the {size} bytes available; nothing was \
         posted (ask the owner for a larger window, or split the transfer)"
    )]
    OutOfBounds {
        /// Which side: the local region or the peer's memory.
        what: &'static str,
        /// Offset asked for.
        offset: u64,
        /// Length asked for.
        len: u64,
        /// Bytes available from the start of the memory.
        size: u64,
    },
    /// The peer granted less access than an operation needs; nothing was posted.
    #[error("{operation} needs {needs} access, but the peer granted only {granted}; nothing was posted")]
    AccessDenied {
        /// The operation refused.
        operation: &'static str,
        /// Access it needs.
        needs: String,
        /// Access granted.
        granted: String,
    },
    /// An argument the operation cannot take; nothing was posted.
    #[error("{0}")]
    Usage(String),
    /// The object is still in use by operations in flight.
    #[error("{what} is in use by {in_flight} operation(s) in flight; poll their completions first")]
    Busy {
        /// What.
        what: &'static str,
        /// How many operations still use it.
        in_flight: usize,
    },
    /// The connection handshake failed.
    #[error("handshake with {peer}: {message}")]
    Handshake {
        /// The peer's socket address.
        peer: String,
        /// What went wrong and what to do.
        message: String,
    },
    /// The peer's negotiated profile cannot work with ours.
    #[error("peer profile mismatch: {0}")]
    PeerMismatch(String),
    /// Encoding or decoding a wire message failed.
    #[error("wire encoding: {0}")]
    Encoding(String),
    /// Forming or leaving a [`World`](crate::World) failed: the launcher
    /// (`pmix`, `rendezvous`) and what went wrong, naming the rank.
    #[error("world ({launcher}): {message}")]
    Launch {
        /// How the world was launched.
        launcher: &'static str,
        /// What went wrong and what to do.
        message: String,
    },
    /// A peer connected through the bootstrap is lost (its process ended,
    /// it closed its loop, or it was silent for `LoopConfig::peer_timeout`):
    /// nothing can be posted to it any more.
    #[error("peer {peer} is lost: {why}; connect to it again, or go on without it")]
    PeerLost {
        /// The peer's bootstrap address.
        peer: String,
        /// How it was lost.
        why: String,
    },
    /// A rank of the world is gone (its process exited or was killed
    /// without finishing); the world cannot go on.
    #[error("rank {rank} is lost: {why}")]
    RankLost {
        /// The rank.
        rank: u32,
        /// How it was noticed.
        why: String,
    },
    /// A collective of the World failed for a reason its messages showed
    /// (ranks passed different lengths, a receive failed on the fabric) or
    /// that the rank which saw it told every other rank of. `rank` is the
    /// rank that saw it; the others fail with the same message rather than
    /// wait for messages that will not come.
    #[error("{operation} (collective #{seq}) failed on rank {rank}: {message}")]
    Collective {
        /// The collective: `barrier`, `allreduce`, ...
        operation: &'static str,
        /// Its number: the world's collectives are numbered from 0 in the
        /// order every rank calls them (modulo 2^20).
        seq: u32,
        /// The rank that saw the failure.
        rank: u32,
        /// What it saw and what to do.
        message: String,
    },
    /// A typed message of the World or a communicator failed on the
    /// fabric, or arrived in a form the receive cannot take (a length that
    /// is not a whole number of elements, a value that does not decode).
    #[error("{operation} {peer}: {message}")]
    Message {
        /// `send`, `recv`, `recv_value`, ...
        operation: &'static str,
        /// `to rank 3`, `from rank 1`, `from any rank`: in the
        /// communicator's ranks.
        peer: String,
        /// What went wrong and what to do.
        message: String,
    },
    /// A message larger than the receive posted for it: it was consumed,
    /// and none of it delivered.
    #[error(
        "{operation}: a message of {} from rank {source_rank} (tag {tag}) arrived for a receive of {capacity} bytes; \
         receive into a larger buffer, or learn the size first (probe)",
        .len.map_or("unreported size".to_string(), |l| format!("{l} bytes"))
    )]
    Truncated {
        /// `recv`, `irecv`, `recv_value`.
        operation: &'static str,
        /// The sender, in the communicator's ranks, where known.
        source_rank: String,
        /// Its tag.
        tag: String,
        /// The message's size, where the provider reports it.
        len: Option<usize>,
        /// The receive's size in bytes.
        capacity: usize,
    },
    /// An operating-system error outside libfabric (sockets, files).
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
}

fn provider_hint(requested: &str, available: &[String]) -> String {
    let what = if requested.starts_with("FI_PROVIDER") {
        "unset FI_PROVIDER"
    } else {
        "drop the provider restriction"
    };
    if available.is_empty() {
        format!("{what}, or run fabric_info without it to see the providers this host has")
    } else {
        format!("{what}, or choose one of: {}", available.join(", "))
    }
}

/// The reasons in one sentence: each distinct reason once, with how many
/// rungs it stopped. Reasons that only say a rung was absent, excluded or
/// not needed are left out when others exist: they rarely explain a failure.
fn summarize(reasons: &[Rejection]) -> String {
    if reasons.is_empty() {
        return "libfabric reported no candidates".into();
    }
    let telling = |r: &&Rejection| {
        !matches!(
            r.reason,
            Reason::NotPresent { .. }
                | Reason::NotNeeded
                | Reason::ExcludedByProviderFilter { .. }
                | Reason::DisabledInConfig { .. }
                | Reason::EndpointTypeNotWanted
        )
    };
    let shown: Vec<&Rejection> = if reasons.iter().any(|r| telling(&r)) {
        reasons.iter().filter(telling).collect()
    } else {
        reasons.iter().collect()
    };
    let mut groups: Vec<(String, usize)> = Vec::new();
    for r in shown {
        let text = r.reason.to_string();
        match groups.iter_mut().find(|(t, _)| *t == text) {
            Some((_, n)) => *n += 1,
            None => groups.push((text, 1)),
        }
    }
    let parts: Vec<String> = groups
        .into_iter()
        .map(|(t, n)| if n > 1 { format!("{t} ({n} rungs)") } else { t })
        .collect();
    format!(
        "{} (of {} rungs passed over; fabric_info, or the error's rejections(), lists each)",
        parts.join("; "),
        reasons.len()
    )
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)?;
        for r in self.rejections() {
            write!(f, "\n  passed over {r}")?;
        }
        Ok(())
    }
}

/// A libfabric error code, shown by name. libfabric's own codes (256 and up,
/// such as `FI_EAVAIL` and `FI_ETRUNC`) are not errno values and are mapped
/// explicitly.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct ErrorCode(pub u32);

impl ErrorCode {
    /// The symbolic name, e.g. `FI_EINVAL`, or `None` for an unknown code.
    pub fn name(self) -> Option<&'static str> {
        let c = self.0;
        Some(match c {
            x if x == ffi::FI_EPERM => "FI_EPERM",
            x if x == ffi::FI_ENOENT => "FI_ENOENT",
            x if x == ffi::FI_EINTR => "FI_EINTR",
            x if x == ffi::FI_EIO => "FI_EIO",
            x if x == ffi::FI_E2BIG => "FI_E2BIG",
            x if x == ffi::FI_EBADF => "FI_EBADF",
            x if x == ffi::FI_EAGAIN => "FI_EAGAIN",
            x if x == ffi::FI_ENOMEM => "FI_ENOMEM",
            x if x == ffi::FI_EACCES => "FI_EACCES",
            x if x == ffi::FI_EFAULT => "FI_EFAULT",
            x if x == ffi::FI_EBUSY => "FI_EBUSY",
            x if x == ffi::FI_ENODEV => "FI_ENODEV",
            x if x == ffi::FI_EINVAL => "FI_EINVAL",
            x if x == ffi::FI_EMFILE => "FI_EMFILE",
            x if x == ffi::FI_ENOSPC => "FI_ENOSPC",
            x if x == ffi::FI_ENOSYS => "FI_ENOSYS",
            x if x == ffi::FI_ENODATA => "FI_ENODATA",
            x if x == ffi::FI_EOVERFLOW => "FI_EOVERFLOW",
            x if x == ffi::FI_EMSGSIZE => "FI_EMSGSIZE",
            x if x == ffi::FI_ENOPROTOOPT => "FI_ENOPROTOOPT",
            x if x == ffi::FI_EOPNOTSUPP => "FI_EOPNOTSUPP",
            x if x == ffi::FI_EADDRINUSE => "FI_EADDRINUSE",
            x if x == ffi::FI_EADDRNOTAVAIL => "FI_EADDRNOTAVAIL",
            x if x == ffi::FI_ENETDOWN => "FI_ENETDOWN",
            x if x == ffi::FI_ENETUNREACH => "FI_ENETUNREACH",
            x if x == ffi::FI_ECONNABORTED => "FI_ECONNABORTED",
            x if x == ffi::FI_ECONNRESET => "FI_ECONNRESET",
            x if x == ffi::FI_ENOBUFS => "FI_ENOBUFS",
            x if x == ffi::FI_EISCONN => "FI_EISCONN",
            x if x == ffi::FI_ENOTCONN => "FI_ENOTCONN",
            x if x == ffi::FI_ESHUTDOWN => "FI_ESHUTDOWN",
            x if x == ffi::FI_ETIMEDOUT => "FI_ETIMEDOUT",
            x if x == ffi::FI_ECONNREFUSED => "FI_ECONNREFUSED",
            x if x == ffi::FI_EHOSTDOWN => "FI_EHOSTDOWN",
            x if x == ffi::FI_EHOSTUNREACH => "FI_EHOSTUNREACH",
            x if x == ffi::FI_EALREADY => "FI_EALREADY",
            x if x == ffi::FI_EINPROGRESS => "FI_EINPROGRESS",
            x if x == ffi::FI_ECANCELED => "FI_ECANCELED",
            x if x == ffi::FI_EKEYREJECTED => "FI_EKEYREJECTED",
            x if x == ffi::FI_EOTHER => "FI_EOTHER",
            x if x == ffi::FI_ETOOSMALL => "FI_ETOOSMALL",
            x if x == ffi::FI_EOPBADSTATE => "FI_EOPBADSTATE",
            x if x == ffi::FI_EAVAIL => "FI_EAVAIL",
            x if x == ffi::FI_EBADFLAGS => "FI_EBADFLAGS",
            x if x == ffi::FI_ENOEQ => "FI_ENOEQ",
            x if x == ffi::FI_EDOMAIN => "FI_EDOMAIN",
            x if x == ffi::FI_ENOCQ => "FI_ENOCQ",
            x if x == ffi::FI_ECRC => "FI_ECRC",
            x if x == ffi::FI_ETRUNC => "FI_ETRUNC",
            x if x == ffi::FI_ENOKEY => "FI_ENOKEY",
            x if x == ffi::FI_ENOAV => "FI_ENOAV",
            x if x == ffi::FI_EOVERRUN => "FI_EOVERRUN",
            _ => return None,
        })
    }
}

impl fmt::Debug for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(n) => f.write_str(n),
            None => write!(f, "libfabric error {}", self.0),
        }
    }
}

/// libfabric's text for a positive error code.
pub(crate) fn strerror(code: u32) -> String {
    // SAFETY: fi_strerror accepts any int and returns a pointer to a static,
    // NUL-terminated string (its own table or strerror's).
    let text = unsafe { CStr::from_ptr(ffi::fi_strerror(code as i32)) };
    text.to_string_lossy().into_owned()
}

impl Error {
    /// The error for a libfabric call that returned the negative code `rc`.
    pub(crate) fn from_rc(call: &'static str, rc: i64) -> Error {
        let code = rc.unsigned_abs().min(u64::from(u32::MAX)) as u32;
        match code {
            x if x == ffi::FI_EAGAIN => Error::Again { call },
            x if x == ffi::FI_ENODATA => Error::NoData { call },
            _ => Error::Fabric {
                call,
                code,
                code_name: ErrorCode(code),
                text: strerror(code),
            },
        }
    }

    /// Why each rung of the ladder was passed over, for [`Error::NoFabric`];
    /// empty for every other error.
    pub fn rejections(&self) -> &[Rejection] {
        match self {
            Error::NoFabric { reasons, .. } => reasons,
            _ => &[],
        }
    }

    /// The positive `FI_E*` code, if this error came from libfabric.
    pub fn fabric_code(&self) -> Option<u32> {
        match self {
            Error::Fabric { code, .. } => Some(*code),
            Error::Again { .. } => Some(ffi::FI_EAGAIN),
            Error::NoData { .. } => Some(ffi::FI_ENODATA),
            _ => None,
        }
    }
}

/// The text of [`Error::QueueFull`]: what refused, and what to do.
fn queue_full_text(
    call: &str,
    waited: &std::time::Duration,
    in_flight: &usize,
    code: &Option<ErrorCode>,
) -> String {
    match code {
        None => format!(
            "{in_flight} operations in flight, as many as the completion queue holds, and none completed \
             in {waited:?}: poll more often, post fewer at once, or raise cq_size"
        ),
        Some(c) if c.0 == ffi::FI_ENOMEM => format!(
            "the provider had no room for another receive ({c}) for {waited:?}, with {in_flight} \
             operations in flight: its receive entries are all taken by receives already posted and by \
             messages that arrived before a matching receive (shm shares one pool of rx_size entries \
             between both); post fewer receives at once, consume the messages that arrived, or raise \
             queue_depth"
        ),
        Some(c) if call.starts_with("fi_recv") || call.starts_with("fi_trecv") => format!(
            "the provider's receive queue stayed full ({c}) for {waited:?} with {in_flight} operations \
             in flight: post fewer receives at once, or raise queue_depth"
        ),
        Some(c) => format!(
            "the provider refused for lack of room ({c}) for {waited:?} with {in_flight} operations in \
             flight although this loop kept progressing: the peer's provider holds as many of our \
             messages as it can take (it is not posting receives for them, or is itself blocked), or \
             this side's transmit queue is full; poll more often, post fewer at once, or raise \
             queue_depth"
        ),
    }
}

/// Turn a libfabric return value into a `Result`: negative is an error,
/// anything else is returned as it is (some calls return a count).
#[inline]
pub(crate) fn check(call: &'static str, rc: impl Into<i64>) -> Result<i64> {
    let rc = rc.into();
    if rc < 0 {
        Err(Error::from_rc(call, rc))
    } else {
        Ok(rc)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn library_codes_above_256_are_named_not_treated_as_errno() {
        let e = Error::from_rc("fi_cq_read", -(ffi::FI_EAVAIL as i64));
        let text = e.to_string();
        assert!(text.contains("FI_EAVAIL"), "{text}");
        assert!(text.starts_with("fi_cq_read failed"), "{text}");
        assert_eq!(ErrorCode(ffi::FI_ETRUNC).name(), Some("FI_ETRUNC"));
    }

    #[test]
    fn eagain_and_enodata_have_their_own_variants() {
        assert!(matches!(
            Error::from_rc("fi_send", -(ffi::FI_EAGAIN as i64)),
            Error::Again { call: "fi_send" }
        ));
        assert!(matches!(
            check("fi_getinfo", -(ffi::FI_ENODATA as i32)),
            Err(Error::NoData { .. })
        ));
        assert_eq!(check("fi_cq_read", 3).unwrap(), 3);
    }

    #[test]
    fn unknown_codes_are_shown_by_number() {
        assert_eq!(ErrorCode(9999).to_string(), "libfabric error 9999");
    }

    #[test]
    fn no_fabric_is_one_sentence_and_debug_lists_every_rung() {
        let rung = |name: &str, reason| Rejection {
            rung: name.into(),
            domain: None,
            reason,
        };
        let lacks = || Reason::MissingCapabilities {
            missing: vec!["FI_ATOMIC".into()],
        };
        let e = Error::NoFabric {
            wanted: "[atomic] over msg endpoints".into(),
            reasons: vec![
                rung(
                    "ib via verbs (msg)",
                    Reason::NotPresent {
                        detail: String::new(),
                    },
                ),
                rung("tcp via tcp (msg)", lacks()),
                rung("tcp via sockets (msg)", lacks()),
                rung(
                    "tcp via net (msg)",
                    Reason::OpenFailed {
                        error: "fi_atomicvalid: none".into(),
                    },
                ),
            ],
        };
        let text = e.to_string();
        assert!(!text.contains('\n'), "{text}");
        assert_eq!(
            text.matches("lacks required capabilities FI_ATOMIC").count(),
            1,
            "{text}"
        );
        assert!(
            text.contains("(2 rungs)") && text.contains("fi_atomicvalid: none"),
            "{text}"
        );
        assert!(
            !text.contains("not present"),
            "absent rungs explain nothing: {text}"
        );
        assert!(text.contains("of 4 rungs passed over"), "{text}");
        assert_eq!(e.rejections().len(), 4);
        let debug = format!("{e:?}");
        assert_eq!(debug.lines().count(), 5, "{debug}");
        assert!(
            debug.contains("passed over ib via verbs (msg): not present"),
            "{debug}"
        );
        let only_absent = Error::NoFabric {
            wanted: "x".into(),
            reasons: vec![rung(
                "ib",
                Reason::NotPresent {
                    detail: String::new(),
                },
            )],
        };
        assert!(only_absent.to_string().contains("not present"), "{only_absent}");
    }
}
