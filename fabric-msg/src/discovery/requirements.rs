//! What the application asks of a fabric: capabilities, endpoint types,
//! peers, queue depth, and an optional provider or domain; and the mode bits
//! fabric-msg itself can honour.

use crate::discovery::atomic::AtomicPolicy;
use crate::ffi;
use serde::{Deserialize, Serialize};

/// What an application needs from a fabric.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Capability {
    /// Untagged send and receive.
    Msg,
    /// Tagged send and receive.
    Tagged,
    /// One-sided read and write.
    Rma,
    /// Remote atomics.
    Atomic,
    /// Receives that match one sender only (`FI_DIRECTED_RECV`).
    DirectedRecv,
    /// Buffers that take many messages (`FI_MULTI_RECV`).
    MultiRecv,
}

impl Capability {
    /// The `fi_info.caps` bits this capability needs granted.
    pub fn bits(self) -> u64 {
        match self {
            Capability::Msg => ffi::FI_MSG as u64,
            Capability::Tagged => ffi::FI_TAGGED as u64,
            Capability::Rma => {
                (ffi::FI_RMA | ffi::FI_READ | ffi::FI_WRITE) as u64
                    | ffi::FI_REMOTE_READ as u64
                    | ffi::FI_REMOTE_WRITE as u64
            }
            Capability::Atomic => ffi::FI_ATOMIC as u64,
            Capability::DirectedRecv => ffi::FI_DIRECTED_RECV as u64,
            Capability::MultiRecv => ffi::FI_MULTI_RECV as u64,
        }
    }
}

/// Which endpoint types the application can use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EndpointChoice {
    /// Reliable datagram endpoints only.
    Rdm,
    /// Connected endpoints only.
    Msg,
    /// Either; the ladder's order decides.
    Any,
}

/// What the application asks for.
///
/// `Requirements::default()` asks for what a messaging program needs
/// everywhere:
///
/// | field | default |
/// |---|---|
/// | `caps` | `[Tagged, Msg]` |
/// | `endpoint` | `Any` (the ladder's order decides) |
/// | `same_host` | `false` (shared memory is not chosen) |
/// | `max_peers` | 64 |
/// | `queue_depth` | 256 |
/// | `provider`, `domain` | `None` (any) |
/// | `provider_layered` | `false` |
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Requirements {
    /// Capabilities that must be granted. Default: tagged and untagged messages.
    pub caps: Vec<Capability>,
    /// Endpoint types the application accepts. Default: [`EndpointChoice::Any`].
    pub endpoint: EndpointChoice,
    /// Every peer is on this host, and shared memory may be used. Default: `false`.
    pub same_host: bool,
    /// Upper bound on the number of peers (sizes address vectors, and
    /// `FI_UNIVERSE_SIZE` where fabric-msg sets it). Default: 64.
    pub max_peers: usize,
    /// Wanted depth of each transmit and receive queue. Default: 256.
    pub queue_depth: usize,
    /// Only this provider (`fabric_info -p`); `FI_PROVIDER` also restricts.
    /// Default: `None`, any provider.
    pub provider: Option<String>,
    /// Let `provider` admit its layered forms, as libfabric's hints and
    /// fabtests' `-p` do (`tcp` admits `tcp;ofi_rxm`); otherwise it is exact.
    /// Default: `false`.
    pub provider_layered: bool,
    /// Only this domain (`-d`), e.g. `mlx5_0` or `lo`. Default: `None`, any.
    pub domain: Option<String>,
    /// How atomics are carried ([`AtomicPolicy`]). With the default,
    /// [`Auto`](AtomicPolicy::Auto), asking for [`Capability::Atomic`] does
    /// not change which fabric is chosen: where the provider lacks
    /// atomics, fabric-msg emulates them. [`Native`](AtomicPolicy::Native)
    /// with `Capability::Atomic` chooses only providers with native u64
    /// atomics. Default: `Auto`.
    pub atomics: AtomicPolicy,
}

impl Default for Requirements {
    fn default() -> Self {
        Requirements {
            caps: vec![Capability::Tagged, Capability::Msg],
            endpoint: EndpointChoice::Any,
            same_host: false,
            max_peers: 64,
            queue_depth: 256,
            provider: None,
            provider_layered: false,
            domain: None,
            atomics: AtomicPolicy::Auto,
        }
    }
}

impl Requirements {
    /// All capability bits required.
    pub fn cap_bits(&self) -> u64 {
        self.caps.iter().fold(0, |a, c| a | c.bits())
    }

    /// Capability bits a provider must list to be chosen: all asked for,
    /// except `FI_ATOMIC` unless [`AtomicPolicy::Native`] is asked for too
    /// (elsewhere fabric-msg emulates what the provider lacks, so atomics
    /// do not decide the fabric).
    pub fn required_bits(&self) -> u64 {
        if self.atomics == AtomicPolicy::Native {
            self.cap_bits()
        } else {
            self.cap_bits() & !(ffi::FI_ATOMIC as u64)
        }
    }

    /// Whether atomics were asked for.
    pub(crate) fn wants_atomics(&self) -> bool {
        self.caps.contains(&Capability::Atomic)
    }

    pub(crate) fn describe(&self) -> String {
        let caps: Vec<String> = self
            .caps
            .iter()
            .map(|c| format!("{c:?}").to_lowercase())
            .collect();
        let mut s = format!(
            "[{}] over {} endpoints",
            caps.join(", "),
            match self.endpoint {
                EndpointChoice::Rdm => "rdm",
                EndpointChoice::Msg => "msg",
                EndpointChoice::Any => "rdm or msg",
            }
        );
        if let Some(p) = &self.provider {
            s.push_str(&format!(" from provider `{p}`"));
        }
        if let Some(d) = &self.domain {
            s.push_str(&format!(" on domain `{d}`"));
        }
        s
    }
}

/// `mr_mode` bits fabric-msg honours; declared in every `fi_getinfo` so no
/// provider is hidden by a hint fabric-msg could have satisfied.
pub const SUPPORTED_MR_MODE: u64 = (ffi::FI_MR_LOCAL
    | ffi::FI_MR_VIRT_ADDR
    | ffi::FI_MR_ALLOCATED
    | ffi::FI_MR_PROV_KEY
    | ffi::FI_MR_ENDPOINT
    | ffi::FI_MR_RAW) as u64;

/// Mode bits fabric-msg honours: per-operation `fi_context`/`fi_context2`
/// storage it owns, and remote CQ data consuming a posted receive.
pub const SUPPORTED_MODE: u64 = (ffi::FI_CONTEXT | ffi::FI_CONTEXT2 | ffi::FI_RX_CQ_DATA) as u64;

#[cfg(test)]
mod tests {
    use super::*;

    /// The table in `Requirements`' docs is what `default()` gives.
    #[test]
    fn defaults_are_the_documented_ones() {
        let r = Requirements::default();
        assert_eq!(r.caps, vec![Capability::Tagged, Capability::Msg]);
        assert_eq!(r.endpoint, EndpointChoice::Any);
        assert!(!r.same_host && !r.provider_layered);
        assert_eq!((r.max_peers, r.queue_depth), (64, 256));
        assert_eq!((r.provider, r.domain), (None, None));
    }
}
