//! Finding the best fabric on this host for what the application needs.
//!
//! [`negotiate`] asks libfabric what is here, classifies every candidate,
//! walks the ladder from `providers.toml`, opens the first candidate that
//! fits, and returns the granted [`Profile`] together with the reason every
//! other rung was passed over. The decision itself is [`plan`], a pure
//! function of the requirements, the ladder, the candidates and sysfs, so it
//! is tested on `fi_info` dumps recorded on real RDMA hosts.

use crate::discovery::classify::{classify, read_sysfs, Classification};
use crate::discovery::config::{LadderConfig, Rung};
pub use crate::discovery::filter::ProviderFilter;
pub use crate::discovery::plan::{plan, Attempt, Plan};
pub use crate::discovery::requirements::{
    Capability, EndpointChoice, Requirements, SUPPORTED_MODE, SUPPORTED_MR_MODE,
};
pub use crate::error::{Reason, Rejection};

use crate::discovery::atomic::{AtomicKind, AtomicPolicy};
use crate::discovery::bits::{all_mode, ALL_MR_MODE};
use crate::discovery::info::{EndpointType, FabricInfo};
use crate::discovery::probe::{self, ProbeSizes};
use crate::discovery::profile::{Profile, QueueSizes, Universe};
use crate::discovery::verbs_limits::{self, DeviceLimits};
use crate::error::{Error, Result};
use crate::ffi;
use crate::libfabric::{getinfo, Hints};
use serde::{Deserialize, Serialize};
use std::path::Path;
use std::sync::OnceLock;

/// One candidate libfabric listed, with its classification (for reports).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Candidate {
    /// What libfabric reported.
    pub info: FabricInfo,
    /// Its kind and the evidence.
    pub class: Classification,
}

/// A provider setting fabric-msg applied to the environment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EnvSetting {
    /// Variable.
    pub name: String,
    /// Value in effect.
    pub value: String,
    /// Who set it and why.
    pub origin: String,
}

/// The outcome of negotiation.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Negotiation {
    /// What was granted.
    pub profile: Profile,
    /// Every rung or candidate passed over, and why.
    pub rejections: Vec<Rejection>,
    /// Everything libfabric listed, classified.
    pub candidates: Vec<Candidate>,
    /// The ladder's source.
    pub ladder: String,
    /// Environment tunables in effect for libfabric.
    pub environment: Vec<EnvSetting>,
}

struct Prepared {
    env: Vec<EnvSetting>,
    devices: Vec<DeviceLimits>,
    universe: Universe,
}

static PREPARED: OnceLock<Prepared> = OnceLock::new();

/// Set provider tunables before libfabric initialises. libfabric reads its
/// environment once, at the first `fi_getinfo` in the process, so this runs
/// once; later calls see what the first one did.
fn prepare(cfg: &LadderConfig, req: &Requirements) -> &'static Prepared {
    PREPARED.get_or_init(|| {
        let mut env = Vec::new();
        let mut set = |name: &str, value: String, why: String| {
            match std::env::var(name) {
                Ok(v) => env.push(EnvSetting {
                    name: name.into(),
                    value: v,
                    origin: "set by the user".into(),
                }),
                Err(_) => {
                    // Edition 2021: set_var is safe but not thread-safe against
                    // concurrent getenv; this runs once, before libfabric
                    // starts, and fabric-msg starts no threads before it.
                    std::env::set_var(name, &value);
                    env.push(EnvSetting {
                        name: name.into(),
                        value,
                        origin: why,
                    });
                }
            }
        };
        let mut rungs: Vec<&Rung> = cfg.rungs.iter().collect();
        rungs.extend(cfg.same_host.iter());
        let mut done = Vec::new();
        for r in rungs {
            if done.contains(&r.provider) {
                continue;
            }
            done.push(r.provider.clone());
            for (k, v) in cfg.env_for(&r.provider) {
                set(
                    k,
                    v.clone(),
                    format!("{} [provider.\"{}\"]", cfg.origin, r.provider),
                );
            }
        }

        // Before 1.19, tcp drops its stream framing after a truncated receive
        // into an ofi_rxm dynamic buffer (fixed upstream by "prov/tcp:
        // Continue receiving after truncation error"); rxm's own buffers
        // report the truncation and keep the connection.
        if ffi::runtime_version() < (1, 19) {
            set(
                "FI_OFI_RXM_ENABLE_DYN_RBUF",
                "0".into(),
                "fabric-msg: libfabric < 1.19 loses a tcp connection's stream after a truncated receive"
                    .into(),
            );
        }

        let devices = verbs_limits::query_devices();
        for (name, value, why) in verbs_limits::env_settings(&devices, req.domain.as_deref()) {
            set(name, value.into(), why);
        }

        // Size FI_UNIVERSE_SIZE so ofi_rxm's CQ fits every RDMA device.
        let universe = match std::env::var("FI_UNIVERSE_SIZE")
            .ok()
            .and_then(|v| v.parse().ok())
        {
            Some(u) => Universe {
                size: Some(u),
                set_by_fabric_msg: false,
                bound: None,
            },
            None => {
                let num = |k: &str| std::env::var(k).ok().and_then(|v| v.parse().ok());
                let srx =
                    std::env::var("FI_OFI_RXM_USE_SRX").is_ok_and(|v| v == "1" || v == "true" || v == "yes");
                let bound = verbs_limits::max_rxm_universe(
                    &devices,
                    num("FI_OFI_RXM_MSG_TX_SIZE"),
                    num("FI_OFI_RXM_MSG_RX_SIZE"),
                    srx,
                );
                match bound {
                    Some(b) => {
                        let size = (req.max_peers as u64).min(b).max(1);
                        let min_dev = devices
                            .iter()
                            .min_by_key(|d| d.max_cqe)
                            .map(|d| (&d.name, d.max_cqe));
                        let why = match min_dev {
                            Some((n, cqe)) => format!(
                                "fabric-msg: min(max_peers {}, {b} so ofi_rxm's CQ fits {n}'s max_cqe {cqe})",
                                req.max_peers
                            ),
                            None => "fabric-msg".into(),
                        };
                        set("FI_UNIVERSE_SIZE", size.to_string(), why);
                        Universe {
                            size: Some(size),
                            set_by_fabric_msg: true,
                            bound: Some(b),
                        }
                    }
                    None => Universe {
                        size: None,
                        set_by_fabric_msg: false,
                        bound: None,
                    },
                }
            }
        };
        for e in &env {
            log::info!("libfabric environment: {}={} ({})", e.name, e.value, e.origin);
        }
        Prepared {
            env,
            devices,
            universe,
        }
    })
}

/// Find the best fabric for `req` using the ladder in `cfg`.
pub fn negotiate(req: &Requirements, cfg: &LadderConfig) -> Result<Negotiation> {
    let prepared = prepare(cfg, req);
    let mut filters = Vec::new();
    if let Ok(v) = std::env::var("FI_PROVIDER") {
        if !v.trim().is_empty() {
            filters.push(ProviderFilter::from_fi_provider(&v));
        }
    }
    if let Some(p) = &req.provider {
        filters.push(if req.provider_layered {
            ProviderFilter::like_libfabric(p)
        } else {
            ProviderFilter::exactly(p)
        });
    }

    // Everything usable with the bits fabric-msg honours; then, offering
    // every bit, what only appears with bits it does not, so the reasons
    // can name them. (Offering a bit lets a provider use it without needing
    // it, so the wide listing is only consulted for entries the narrow one
    // lacks.)
    let list_all = |mode, mr_mode| match getinfo(&Hints {
        mode,
        mr_mode,
        ..Default::default()
    }) {
        Ok(list) => Ok(probe::entries(&list)),
        Err(Error::NoData { .. }) => Ok(Vec::new()),
        Err(e) => Err(e),
    };
    let listed = list_all(SUPPORTED_MODE, SUPPORTED_MR_MODE)?;
    let key = |i: &FabricInfo| (i.provider.clone(), i.endpoint_type, i.domain.clone());
    let hidden: Vec<FabricInfo> = list_all(all_mode(ffi::runtime_version()), ALL_MR_MODE)?
        .into_iter()
        .filter(|w| !listed.iter().any(|l| key(l) == key(w)))
        .collect();
    let allowed: Vec<&FabricInfo> = listed
        .iter()
        .filter(|i| filters.iter().all(|f| f.allows(&i.provider)))
        .collect();
    if allowed.is_empty() {
        if let Some(f) = filters.first() {
            let mut available: Vec<String> = listed.iter().map(|i| i.provider.clone()).collect();
            available.sort();
            available.dedup();
            return Err(Error::ProviderNotAvailable {
                requested: f.origin.clone(),
                available,
            });
        }
    }

    let sysfs = read_sysfs(Path::new("/sys/class/infiniband"));
    let mut the_plan = plan(
        req,
        cfg,
        &listed,
        &hidden,
        &sysfs,
        &filters,
        ffi::runtime_version(),
    );

    // FI_PROVIDER wins: a provider the user named that no rung covers is
    // still used, in libfabric's order.
    if the_plan.attempts.is_empty() && !filters.is_empty() {
        let wanted_ep = |t: EndpointType| match req.endpoint {
            EndpointChoice::Any => matches!(t, EndpointType::Rdm | EndpointType::Msg),
            EndpointChoice::Rdm => t == EndpointType::Rdm,
            EndpointChoice::Msg => t == EndpointType::Msg,
        };
        for info in allowed {
            let fits = wanted_ep(info.endpoint_type)
                && req.required_bits() & !info.caps == 0
                && info.mr_mode & !SUPPORTED_MR_MODE == 0
                && info.mode & !SUPPORTED_MODE == 0
                && req.domain.as_ref().map_or(true, |d| d == &info.domain);
            if fits {
                let class = classify(info, &sysfs);
                let rung = format!(
                    "{} via {} ({}, named by the user)",
                    class.kind.as_str(),
                    info.provider,
                    info.endpoint_type
                );
                the_plan.attempts.push(Attempt {
                    rung,
                    info: info.clone(),
                    class,
                });
                break;
            }
        }
    }

    let candidates: Vec<Candidate> = listed
        .iter()
        .map(|i| Candidate {
            info: i.clone(),
            class: classify(i, &sysfs),
        })
        .collect();
    let mut rejections = the_plan.rejections;
    let mut chosen = None;
    for attempt in the_plan.attempts {
        if chosen.is_some() {
            rejections.push(Rejection {
                rung: attempt.rung,
                domain: Some(attempt.info.domain),
                reason: Reason::NotNeeded,
            });
            continue;
        }
        if let Some(reason) = memlock_too_low(&attempt, prepared) {
            log::info!("{} on {}: {reason}", attempt.rung, attempt.info.domain);
            rejections.push(Rejection {
                rung: attempt.rung,
                domain: Some(attempt.info.domain),
                reason,
            });
            continue;
        }
        match open(req, cfg, &attempt, prepared) {
            Ok(profile) => chosen = Some(profile),
            Err(e) => {
                log::info!("{} on {}: failed to open: {e}", attempt.rung, attempt.info.domain);
                rejections.push(Rejection {
                    rung: attempt.rung,
                    domain: Some(attempt.info.domain),
                    reason: Reason::OpenFailed { error: e.to_string() },
                });
            }
        }
    }
    for r in &rejections {
        log::debug!("passed over: {r}");
    }
    match chosen {
        Some(profile) => {
            log::info!(
                "fabric-msg chose {} ({}) on {} [{}]",
                profile.provider,
                profile.fabric_kind,
                profile.domain,
                profile.endpoint_type
            );
            Ok(Negotiation {
                profile,
                rejections,
                candidates,
                ladder: cfg.origin.clone(),
                environment: prepared.env.clone(),
            })
        }
        None => Err(Error::NoFabric {
            wanted: req.describe(),
            reasons: rejections,
        }),
    }
}

/// `ofi_rxm` over verbs registers its buffers at its first message; where
/// the device counts them against a lower `RLIMIT_MEMLOCK` that message
/// fails with `FI_ENOMEM` (soft-iWARP with 8 MiB: issue 14). Say so first.
fn memlock_too_low(attempt: &Attempt, prepared: &Prepared) -> Option<Reason> {
    let s = (attempt.info.provider == "verbs;ofi_rxm")
        .then(|| verbs_limits::rxm_memlock_here(&prepared.devices, &attempt.info.domain))??;
    Some(Reason::LockedMemoryTooLow {
        device: s.device,
        limit: s.limit,
        need: s.need,
        counts_always: s.counts_always,
    })
}

/// Ask libfabric for exactly this candidate with the capabilities required
/// and only the modes fabric-msg supports, then open it for real.
fn open(req: &Requirements, cfg: &LadderConfig, attempt: &Attempt, prepared: &Prepared) -> Result<Profile> {
    // Secondary capabilities fabric-msg uses where the entry lists them:
    // libfabric 2.x grants only the secondary capabilities asked for
    // (fi_getinfo(3)), where 1.x reported them unasked. FI_SOURCE gives
    // receives their sender; a provider whose source is wrong is not asked.
    let source = if cfg.trust_source(&attempt.info.provider) {
        attempt.info.caps & ffi::FI_SOURCE
    } else {
        0
    };
    // Atomics, where they do not decide the fabric: the provider's own if
    // it lists them, and tagged messages (on RDM) to emulate them otherwise.
    let listed = attempt.info.caps;
    let for_atomics = if req.wants_atomics() && req.atomics != AtomicPolicy::Native {
        let tagged = if attempt.info.endpoint_type == EndpointType::Rdm {
            ffi::FI_TAGGED as u64
        } else {
            0
        };
        listed & (ffi::FI_ATOMIC as u64 | tagged)
    } else {
        0
    };
    let hints = Hints {
        caps: req.required_bits() | source | for_atomics,
        mode: SUPPORTED_MODE,
        mr_mode: SUPPORTED_MR_MODE,
        endpoint_type: Some(attempt.info.endpoint_type.to_raw()),
        provider: Some(attempt.info.provider.clone()),
        domain: Some(attempt.info.domain.clone()),
    };
    let list = getinfo(&hints)?;
    // Providers may list other domains first despite the hint.
    let entry = probe::position(&list, &attempt.info.domain).ok_or(Error::NoData { call: "fi_getinfo" })?;
    let granted = probe::entries(&list).swap_remove(entry);
    let max_cqe = prepared
        .devices
        .iter()
        .find(|d| d.name == granted.device())
        .map(|d| d.max_cqe);
    let queues = QueueSizes::fit(req, &granted, max_cqe);
    let mut probed = probe::open_candidate(
        &list,
        entry,
        ProbeSizes {
            cq: queues.cq,
            av: queues.av,
        },
        req.wants_atomics() && listed & ffi::FI_ATOMIC as u64 != 0,
    )?;
    let native_only = req.wants_atomics() && req.atomics == AtomicPolicy::Native;
    let device = prepared.devices.iter().find(|d| d.name == granted.device());
    let no_device_atomics = device
        .filter(|d| !d.atomics)
        .map(|d| format!("{} does no remote atomics (atomic_cap IBV_ATOMIC_NONE)", d.name));
    // The device's own answer first: it holds whatever libfabric says.
    let broken = cfg.atomics_broken(&granted.provider).map(str::to_owned);
    if let Some(why) = no_device_atomics.or(broken) {
        probed.atomics.clear();
        // Connected endpoints cannot carry fabric-msg's emulation either.
        let msg = granted.endpoint_type == EndpointType::Msg;
        if native_only || (req.wants_atomics() && msg) {
            let no_emulation = if msg {
                "; fabric-msg emulates atomics only over tagged RDM endpoints"
            } else {
                ""
            };
            return Err(Error::Unsupported {
                what: format!("u64 atomics (listed and validated, but {why}{no_emulation})"),
                provider: granted.provider.clone(),
            });
        }
    }
    if native_only && probed.atomics.is_empty() {
        // libfabric 1.17's `net` lists FI_ATOMIC but implements none (FI_ENOSYS).
        return Err(Error::Unsupported {
            what: "u64 atomics (FI_ATOMIC is listed, but fi_atomicvalid accepts no u64 operation)".into(),
            provider: granted.provider.clone(),
        });
    }
    let framed = granted.cq_data_size == 0 || cfg.framed(&granted.provider);
    let mut profile = Profile::new(
        req,
        &attempt.rung,
        &granted,
        attempt.class.clone(),
        queues,
        probed,
        prepared.universe.clone(),
        max_cqe,
        framed,
        cfg.trust_source(&granted.provider),
    );
    profile.tag_mask_defect = cfg.masked_receives_broken(&granted.provider).map(str::to_owned);
    profile.peek_defect = cfg.peek_broken(&granted.provider).map(str::to_owned);
    if req.wants_atomics() && profile.atomic_carrier(AtomicKind::FetchAdd).is_none() {
        return Err(Error::Unsupported {
            what: format!(
                "u64 atomics: the provider validates {} of fabric-msg's operations, and fabric-msg cannot \
                 emulate them on its {} endpoints (emulation needs tagged RDM endpoints with at least 40 \
                 tag bits)",
                profile.supported_atomics().len(),
                profile.endpoint_type
            ),
            provider: granted.provider.clone(),
        });
    }
    Ok(profile)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fi_provider_syntax_matches_libfabrics() {
        let f = ProviderFilter::from_fi_provider("tcp");
        assert!(f.allows("tcp") && f.allows("tcp;ofi_rxm") && !f.allows("net"));
        let f = ProviderFilter::from_fi_provider("^sockets,udp");
        assert!(!f.allows("sockets") && !f.allows("udp;ofi_rxd") && f.allows("tcp"));
        let f = ProviderFilter::exactly("tcp");
        assert!(f.allows("tcp") && !f.allows("tcp;ofi_rxm"));
        let f = ProviderFilter::like_libfabric("tcp");
        assert!(f.allows("tcp") && f.allows("tcp;ofi_rxm") && !f.allows("net;ofi_rxm"));
    }

    #[test]
    fn supported_mr_mode_covers_what_verbs_requires() {
        let verbs =
            (ffi::FI_MR_LOCAL | ffi::FI_MR_VIRT_ADDR | ffi::FI_MR_ALLOCATED | ffi::FI_MR_PROV_KEY) as u64;
        assert_eq!(verbs & !SUPPORTED_MR_MODE, 0);
    }
}
