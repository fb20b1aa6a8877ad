//! The ladder's decision before anything is opened: which candidates to
//! try, in which order, and why every other rung was passed over. [`plan`]
//! is a pure function of the requirements, the ladder, the candidates and
//! sysfs (no libfabric call), so it is tested on `fi_info` dumps recorded
//! on real RDMA hosts; `negotiate.rs` opens what it chose.

use crate::discovery::classify::{classify, Classification, FabricKind, SysfsSnapshot};
use crate::discovery::config::{LadderConfig, Rung};
use crate::discovery::filter::ProviderFilter;
use crate::discovery::info::{bit_names, EndpointType, FabricInfo, CAP_NAMES, MODE_NAMES, MR_MODE_NAMES};
use crate::discovery::requirements::{EndpointChoice, Requirements, SUPPORTED_MODE, SUPPORTED_MR_MODE};
use crate::error::{Reason, Rejection};

/// The decision before anything is opened: candidates to try in order, and
/// the rungs already ruled out.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Candidates in the order to try them, with their rung and kind.
    pub attempts: Vec<Attempt>,
    /// Rungs (or candidates) ruled out, with the reason.
    pub rejections: Vec<Rejection>,
}

/// One candidate to open.
#[derive(Debug, Clone)]
pub struct Attempt {
    /// The rung's label.
    pub rung: String,
    /// The entry libfabric listed.
    pub info: FabricInfo,
    /// Its classification.
    pub class: Classification,
}

pub(crate) fn rung_label(r: &Rung) -> String {
    format!(
        "{} via {} ({})",
        r.kind.as_str(),
        r.provider,
        EndpointType::from(r.endpoint)
    )
}

/// Decide which candidates to try, in order. Pure: no libfabric calls.
///
/// `candidates` is what libfabric listed with the mr_mode and mode bits
/// fabric-msg supports; `hidden` is what appears only when every bit is
/// offered (providers that need a bit fabric-msg does not handle). `filters`
/// is `FI_PROVIDER` and/or the requested provider.
pub fn plan(
    req: &Requirements,
    cfg: &LadderConfig,
    candidates: &[FabricInfo],
    hidden: &[FabricInfo],
    sysfs: &SysfsSnapshot,
    filters: &[ProviderFilter],
    libfabric: (u32, u32),
) -> Plan {
    let classified: Vec<(FabricInfo, Classification)> = candidates
        .iter()
        .map(|c| (c.clone(), classify(c, sysfs)))
        .collect();
    let mut attempts = Vec::new();
    let mut rejections = Vec::new();

    let mut rungs: Vec<&Rung> = Vec::new();
    if let Some(sh) = &cfg.same_host {
        rungs.push(sh);
    }
    rungs.extend(cfg.rungs.iter());

    for rung in rungs {
        let label = rung_label(rung);
        let reject = |reason| Rejection {
            rung: label.clone(),
            domain: None,
            reason,
        };
        let is_same_host_rung = cfg.same_host.as_ref().is_some_and(|s| std::ptr::eq(s, rung));
        if !rung.enabled {
            rejections.push(reject(Reason::DisabledInConfig {
                note: rung.note.clone(),
            }));
            continue;
        }
        if let Some(need) = rung.min_version().filter(|need| libfabric < *need) {
            rejections.push(reject(Reason::NeedsNewerLibfabric {
                need: format!("{}.{}", need.0, need.1),
                have: format!("{}.{}", libfabric.0, libfabric.1),
                why: rung.note.clone().unwrap_or_else(|| "see providers.toml".into()),
            }));
            continue;
        }
        if let Some(f) = filters.iter().find(|f| !f.allows(&rung.provider)) {
            rejections.push(reject(Reason::ExcludedByProviderFilter {
                filter: f.origin.clone(),
            }));
            continue;
        }
        let ep = EndpointType::from(rung.endpoint);
        let wanted_ep = match req.endpoint {
            EndpointChoice::Any => true,
            EndpointChoice::Rdm => ep == EndpointType::Rdm,
            EndpointChoice::Msg => ep == EndpointType::Msg,
        };
        if !wanted_ep {
            rejections.push(reject(Reason::EndpointTypeNotWanted));
            continue;
        }
        if (rung.kind == FabricKind::Shm || is_same_host_rung) && !req.same_host {
            rejections.push(reject(Reason::PeersMayBeRemote));
            continue;
        }
        let same_provider: Vec<&(FabricInfo, Classification)> = classified
            .iter()
            .filter(|(i, _)| i.provider == rung.provider && i.endpoint_type == ep)
            .collect();
        let matching: Vec<&(FabricInfo, Classification)> = same_provider
            .iter()
            .copied()
            .filter(|(_, c)| c.kind == rung.kind)
            .collect();
        if matching.is_empty() {
            let needs_more = hidden.iter().find(|i| {
                i.provider == rung.provider && i.endpoint_type == ep && classify(i, sysfs).kind == rung.kind
            });
            if let Some(h) = needs_more {
                let per = |reason| Rejection {
                    rung: label.clone(),
                    domain: Some(h.domain.clone()),
                    reason,
                };
                if h.mr_mode & !SUPPORTED_MR_MODE != 0 {
                    let bits = bit_names(h.mr_mode & !SUPPORTED_MR_MODE, MR_MODE_NAMES);
                    rejections.push(per(Reason::UnsupportedMrMode { bits }));
                } else {
                    let bits = bit_names(h.mode & !SUPPORTED_MODE, MODE_NAMES);
                    rejections.push(per(Reason::UnsupportedMode { bits }));
                }
                continue;
            }
            let detail = if same_provider.is_empty() {
                String::new()
            } else {
                let others: Vec<String> = same_provider
                    .iter()
                    .map(|(i, c)| format!("{} is {}", i.domain, c.kind))
                    .collect();
                format!(" ({})", dedup(others).join(", "))
            };
            rejections.push(reject(Reason::NotPresent { detail }));
            continue;
        }
        let on_domain: Vec<&(FabricInfo, Classification)> = match &req.domain {
            Some(d) => matching.iter().copied().filter(|(i, _)| &i.domain == d).collect(),
            None => matching,
        };
        if on_domain.is_empty() {
            let wanted = req.domain.clone().unwrap_or_default();
            rejections.push(reject(Reason::OtherDomain { wanted }));
            continue;
        }
        let mut seen_domains = Vec::new();
        for (info, class) in on_domain {
            if seen_domains.contains(&info.domain) {
                continue; // libfabric lists one entry per address format; the first is enough.
            }
            seen_domains.push(info.domain.clone());
            let per = |reason| Rejection {
                rung: label.clone(),
                domain: Some(info.domain.clone()),
                reason,
            };
            let missing = req.required_bits() & !info.caps;
            if missing != 0 {
                rejections.push(per(Reason::MissingCapabilities {
                    missing: bit_names(missing, CAP_NAMES),
                }));
            } else if info.mr_mode & !SUPPORTED_MR_MODE != 0 {
                let bits = bit_names(info.mr_mode & !SUPPORTED_MR_MODE, MR_MODE_NAMES);
                rejections.push(per(Reason::UnsupportedMrMode { bits }));
            } else {
                // No mode check here: a provider lists the optional modes it
                // was offered and would use (the `fi_info` tool offers them
                // all), so only an entry that vanishes with fabric-msg's
                // modes (`hidden`) shows a mode is needed.
                attempts.push(Attempt {
                    rung: label.clone(),
                    info: info.clone(),
                    class: class.clone(),
                });
            }
        }
    }
    Plan { attempts, rejections }
}

fn dedup(mut v: Vec<String>) -> Vec<String> {
    let mut seen = std::collections::HashSet::new();
    v.retain(|s| seen.insert(s.clone()));
    v
}
