//! What stands between a peer and memory it was not given: how a provider
//! guards one-sided access, as the [`Profile`](super::profile::Profile)
//! reports it.
//!
//! A registration is reached by its key (and an address or offset inside
//! it). How hard a key is to guess depends on who chooses it:
//!
//! - fabric-msg, where the provider lets the application choose
//!   (`mr_mode` without `FI_MR_PROV_KEY`: tcp, sockets, udp;ofi_rxd): a
//!   random key over the whole key width, never reused in a domain;
//! - the provider, under `FI_MR_PROV_KEY` (verbs: the NIC's 32-bit rkey);
//! - nobody, where the provider does not check keys at all (shm before
//!   libfabric 2.1 copies with the target's virtual addresses).

use crate::ffi;
use serde::{Deserialize, Serialize};
use std::fmt;

/// A libfabric release: (major, minor).
type Release = (u32, u32);

/// Providers that reach a peer's memory without checking keys, how, and
/// the first libfabric release measured to check them (`None`: none yet).
/// shm 1.17 copies from the initiator with cross-memory attach; shm 2.1
/// goes through the target, which checks the key (a forged key gets no
/// completion: `tests/forged_keys.rs`, run by `ci/libfabric2.sh`). The
/// releases between were not measured, so they count as unguarded.
const UNGUARDED: &[(&str, &str, Option<Release>)] = &[
    (
        "shm",
        "shm copies with the target's virtual addresses through cross-memory attach \
         (process_vm_readv/writev), which checks no key: any process of the same user on this \
         host can read and write the target's memory, registered or not, as through \
         /proc/PID/mem",
        Some((2, 1)),
    ),
    (
        "sm2",
        "sm2 copies with the target's virtual addresses and does not check keys: any process \
         of the same user on this host can read and write the target's memory",
        None,
    ),
];

/// How a peer's one-sided access to registered memory is guarded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum RemoteProtection {
    /// fabric-msg draws each key from the operating system's random source
    /// over `bits` bits and never hands a key out twice in a domain: a peer
    /// holding one key learns nothing about another.
    RandomKey {
        /// Bits of each key.
        bits: u32,
    },
    /// The provider chooses keys (`FI_MR_PROV_KEY`) of `bits` bits. How
    /// guessable they are is the provider's: verbs keys are the NIC's
    /// 32-bit rkeys, on common NICs an index into its table in the upper 24
    /// bits and only 8 bits that vary.
    ProviderKey {
        /// Bits of each key.
        bits: u32,
    },
    /// Keys are not checked: the peer's access is not guarded at all.
    Unguarded {
        /// Why, and who can reach the memory.
        why: String,
    },
}

impl RemoteProtection {
    /// The protection `provider` gives with this `mr_mode` and key size,
    /// on the running libfabric.
    pub fn of(provider: &str, mr_mode: u64, mr_key_size: usize) -> RemoteProtection {
        RemoteProtection::of_release(provider, mr_mode, mr_key_size, ffi::runtime_version())
    }

    /// [`RemoteProtection::of`] on libfabric `release` (major, minor).
    pub fn of_release(
        provider: &str,
        mr_mode: u64,
        mr_key_size: usize,
        release: (u32, u32),
    ) -> RemoteProtection {
        let core = provider.split(';').next().unwrap_or(provider);
        let unguarded = UNGUARDED.iter().find(|(name, _, checked_from)| {
            *name == core && !matches!(checked_from, Some(v) if release >= *v)
        });
        if let Some((_, why, _)) = unguarded {
            return RemoteProtection::Unguarded {
                why: (*why).to_string(),
            };
        }
        if mr_mode & u64::from(ffi::FI_MR_PROV_KEY) != 0 {
            RemoteProtection::ProviderKey {
                bits: 8 * mr_key_size as u32,
            }
        } else {
            RemoteProtection::RandomKey {
                bits: 8 * mr_key_size.clamp(1, 8) as u32,
            }
        }
    }

    /// Whether a key guards remote access at all.
    pub fn is_guarded(&self) -> bool {
        !matches!(self, RemoteProtection::Unguarded { .. })
    }

    /// The chance that one blind guess of a key opens one of `live`
    /// registrations, where fabric-msg chooses keys at random; `None` where
    /// it does not (the provider's keys, or no keys).
    pub fn guess_odds(&self, live: u64) -> Option<f64> {
        match *self {
            RemoteProtection::RandomKey { bits } => Some(live as f64 / 2f64.powi(bits as i32)),
            _ => None,
        }
    }
}

impl fmt::Display for RemoteProtection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RemoteProtection::RandomKey { bits } => {
                write!(f, "random {bits}-bit key per region, chosen by fabric-msg")?;
                if *bits < 64 {
                    write!(
                        f,
                        " (narrow: one guess opens one of n live regions with odds n in 2^{bits})"
                    )?;
                }
                Ok(())
            }
            RemoteProtection::ProviderKey { bits } => {
                write!(f, "{bits}-bit key chosen by the provider (FI_MR_PROV_KEY)")
            }
            RemoteProtection::Unguarded { why } => write!(f, "none: {why}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_of_provider_reports_its_protection() {
        let prov_key = u64::from(ffi::FI_MR_PROV_KEY);
        let virt = u64::from(ffi::FI_MR_VIRT_ADDR);
        assert_eq!(
            RemoteProtection::of("tcp;ofi_rxm", 0, 8),
            RemoteProtection::RandomKey { bits: 64 }
        );
        assert_eq!(
            RemoteProtection::of("verbs;ofi_rxm", prov_key | virt, 4),
            RemoteProtection::ProviderKey { bits: 32 }
        );
        let shm = RemoteProtection::of_release("shm", virt, 8, (1, 17));
        assert!(!shm.is_guarded());
        assert!(shm.to_string().contains("same user"), "{shm}");
        assert!(!RemoteProtection::of_release("shm", virt, 8, (2, 0)).is_guarded());
        assert_eq!(
            RemoteProtection::of_release("shm", virt, 8, (2, 1)),
            RemoteProtection::RandomKey { bits: 64 }
        );
        assert!(!RemoteProtection::of_release("sm2", virt, 8, (2, 1)).is_guarded());
        assert!(RemoteProtection::of("sockets", 0, 8).is_guarded());
    }

    #[test]
    fn narrow_random_keys_state_their_odds() {
        let wide = RemoteProtection::of("tcp", 0, 8);
        assert_eq!(wide.guess_odds(1), Some(2f64.powi(-64)));
        assert!(!wide.to_string().contains("narrow"), "{wide}");
        let narrow = RemoteProtection::of("tcp", 0, 2);
        assert_eq!(narrow.guess_odds(64), Some(64.0 / 65536.0));
        assert!(narrow.to_string().contains("odds n in 2^16"), "{narrow}");
        assert_eq!(
            RemoteProtection::of("verbs", u64::from(ffi::FI_MR_PROV_KEY), 4).guess_odds(1),
            None
        );
    }
}
