//! Why a rung of the ladder (or one candidate of it) was passed over: plain
//! data, kept beside the error type so that [`Error::NoFabric`](super::Error::NoFabric)
//! can carry it without the error type importing the negotiation that
//! produces it.

use serde::{Deserialize, Serialize};
use std::fmt;

/// Why a rung (or one candidate of it) was not chosen.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rejection {
    /// The rung, e.g. `roce via verbs;ofi_rxm (rdm)`.
    pub rung: String,
    /// The domain, when the reason is about one candidate.
    pub domain: Option<String>,
    /// The reason.
    pub reason: Reason,
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.domain {
            Some(d) => write!(f, "{} on {d}: {}", self.rung, self.reason),
            None => write!(f, "{}: {}", self.rung, self.reason),
        }
    }
}

/// The reasons a rung is passed over.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "reason", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Reason {
    /// libfabric offers no such provider and endpoint type of this kind here.
    NotPresent {
        /// What the host does have from the same provider, if anything.
        detail: String,
    },
    /// `enabled = false` in the ladder.
    DisabledInConfig {
        /// The rung's `note`, if any.
        note: Option<String>,
    },
    /// `FI_PROVIDER` or `-p` names other providers.
    ExcludedByProviderFilter {
        /// The filter, e.g. `FI_PROVIDER=tcp`.
        filter: String,
    },
    /// The application does not accept this endpoint type.
    EndpointTypeNotWanted,
    /// Shared memory reaches only this host; the application did not say
    /// all peers are here.
    PeersMayBeRemote,
    /// Candidates exist, but none on the requested domain.
    OtherDomain {
        /// The requested domain.
        wanted: String,
    },
    /// Lacks capabilities the application requires.
    MissingCapabilities {
        /// The missing `FI_*` names.
        missing: Vec<String>,
    },
    /// Requires `mr_mode` bits fabric-msg does not handle.
    UnsupportedMrMode {
        /// The bits.
        bits: Vec<String>,
    },
    /// Requires mode bits fabric-msg does not handle.
    UnsupportedMode {
        /// The bits.
        bits: Vec<String>,
    },
    /// The rung needs a newer libfabric.
    NeedsNewerLibfabric {
        /// `MAJOR.MINOR` required.
        need: String,
        /// `MAJOR.MINOR` in use.
        have: String,
        /// Why, from the ladder's `note`.
        why: String,
    },
    /// The device counts registered memory against the process's
    /// locked-memory limit, and the limit is below what the provider
    /// registers for its own buffers (`ofi_rxm`: about 33 MiB per endpoint).
    LockedMemoryTooLow {
        /// The device, e.g. `siw0`.
        device: String,
        /// The soft `RLIMIT_MEMLOCK`, bytes.
        limit: u64,
        /// What the provider registers, bytes.
        need: u64,
        /// The device counts even for processes with `CAP_IPC_LOCK`
        /// (soft-iWARP).
        counts_always: bool,
    },
    /// A better rung was already chosen; this one was not tried.
    NotNeeded,
    /// Opening it failed.
    OpenFailed {
        /// libfabric's error, naming the call.
        error: String,
    },
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::NotPresent { detail } => write!(f, "not present on this host{detail}"),
            Reason::DisabledInConfig { note: None } => {
                write!(f, "excluded by configuration (enabled = false)")
            }
            Reason::DisabledInConfig { note: Some(n) } => {
                write!(f, "excluded by configuration (enabled = false): {n}")
            }
            Reason::ExcludedByProviderFilter { filter } => write!(f, "excluded by {filter}"),
            Reason::EndpointTypeNotWanted => write!(f, "endpoint type not accepted by the application"),
            Reason::PeersMayBeRemote => {
                write!(
                    f,
                    "shared memory reaches only this host; peers were not declared same-host"
                )
            }
            Reason::OtherDomain { wanted } => write!(f, "present, but not on domain `{wanted}`"),
            Reason::MissingCapabilities { missing } => {
                write!(f, "lacks required capabilities {}", missing.join(", "))
            }
            Reason::UnsupportedMrMode { bits } => {
                write!(
                    f,
                    "requires mr_mode {} which fabric-msg does not handle",
                    bits.join(", ")
                )
            }
            Reason::UnsupportedMode { bits } => {
                write!(
                    f,
                    "requires mode {} which fabric-msg does not handle",
                    bits.join(", ")
                )
            }
            Reason::NeedsNewerLibfabric { need, have, why } => {
                write!(f, "needs libfabric {need}, this is {have}: {why}")
            }
            Reason::LockedMemoryTooLow {
                device,
                limit,
                need,
                counts_always,
            } => {
                let who = if *counts_always {
                    "even for root (soft-iWARP ignores CAP_IPC_LOCK)"
                } else {
                    "as this process lacks CAP_IPC_LOCK"
                };
                write!(
                    f,
                    "{device} counts registered memory against the locked-memory limit {who}, which is \
                     {} KiB; ofi_rxm registers about {} MiB per endpoint for its buffers, so the first \
                     message would fail with FI_ENOMEM: raise the limit (`ulimit -l unlimited`, \
                     LimitMEMLOCK= for services, memlock in /etc/security/limits.conf)",
                    limit / 1024,
                    need.div_ceil(1 << 20)
                )
            }
            Reason::NotNeeded => write!(f, "not tried: a preferred rung was chosen"),
            Reason::OpenFailed { error } => write!(f, "failed to open: {error}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_low_locked_memory_limit_says_what_to_do() {
        let r = Rejection {
            rung: "iwarp via verbs;ofi_rxm (rdm)".into(),
            domain: Some("siw0".into()),
            reason: Reason::LockedMemoryTooLow {
                device: "siw0".into(),
                limit: 8 << 20,
                need: 2 * 1024 * (16384 + 512),
                counts_always: true,
            },
        };
        let text = r.to_string();
        for want in [
            "iwarp via verbs;ofi_rxm (rdm) on siw0: siw0 counts registered memory against the locked-memory limit even for root",
            "which is 8192 KiB",
            "about 33 MiB per endpoint",
            "`ulimit -l unlimited`",
        ] {
            assert!(text.contains(want), "{want:?} not in {text:?}");
        }
    }
}
