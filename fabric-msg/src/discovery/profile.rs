//! The negotiated profile: what the fabric granted, as typed values the rest
//! of fabric-msg obeys instead of reading `fi_info`, and the part of it two
//! peers compare when they connect.

use crate::discovery::atomic::{AtomicCarrier, AtomicKind, AtomicPolicy};
use crate::discovery::classify::{Classification, FabricKind};
use crate::discovery::info::{
    bit_names, EndpointType, FabricInfo, Progress, Threading, CAP_NAMES, MODE_NAMES, MR_MODE_NAMES,
};
use crate::discovery::probe::{AtomicSupport, ProbeResult};
use crate::discovery::protection::RemoteProtection;
use crate::discovery::quirks::Quirks;
use crate::discovery::requirements::Requirements;
use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};

/// Version of fabric-msg's wire protocol (handshake and headers). Peers with
/// different versions refuse each other.
pub const PROTOCOL_VERSION: u16 = 3;

/// Queue sizes chosen to fit the domain's limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueSizes {
    /// Transmit queue depth per endpoint.
    pub tx: usize,
    /// Receive queue depth per endpoint.
    pub rx: usize,
    /// Completion queue entries.
    pub cq: usize,
    /// Address vector entries.
    pub av: usize,
}

impl QueueSizes {
    /// Fit the requested depths to what the provider granted and, for a
    /// verbs device, to its `max_cqe`.
    pub fn fit(req: &Requirements, info: &FabricInfo, max_cqe: Option<u32>) -> QueueSizes {
        let cap = |want: usize, limit: usize| if limit == 0 { want } else { want.min(limit) };
        let tx = cap(req.queue_depth, info.tx_size).max(1);
        let rx = cap(req.queue_depth, info.rx_size).max(1);
        let mut cq = tx + rx;
        if let Some(m) = max_cqe {
            cq = cq.min(m as usize);
        }
        QueueSizes {
            tx,
            rx,
            cq,
            av: req.max_peers.max(1),
        }
    }
}

/// `FI_UNIVERSE_SIZE` in effect.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Universe {
    /// The value, if set (by the user or fabric-msg).
    pub size: Option<u64>,
    /// Whether fabric-msg chose it.
    pub set_by_fabric_msg: bool,
    /// The largest value RDMA devices here allow for ofi_rxm, if any.
    pub bound: Option<u64>,
}

/// What the chosen fabric granted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Profile {
    /// The ladder rung that won.
    pub rung: String,
    /// Provider, e.g. `verbs;ofi_rxm`.
    pub provider: String,
    /// Kind of fabric.
    pub fabric_kind: FabricKind,
    /// Why it is that kind.
    pub classification: String,
    /// Fabric name.
    pub fabric: String,
    /// Domain name.
    pub domain: String,
    /// Endpoint type.
    pub endpoint_type: EndpointType,
    /// Endpoint protocol.
    pub protocol: String,
    /// Capabilities the application asked for (`FI_*` names).
    pub caps_requested: Vec<String>,
    /// Capabilities granted.
    pub caps_granted: Vec<String>,
    /// Mode bits fabric-msg must honour.
    pub mode: Vec<String>,
    /// Memory-registration mode bits (raw).
    pub mr_mode_bits: u64,
    /// Memory-registration mode bits, by name.
    pub mr_mode: Vec<String>,
    /// Memory key size in bytes.
    pub mr_key_size: usize,
    /// What guards a peer's one-sided access to registered memory: a random
    /// key of ours, the provider's key, or nothing (shm). See
    /// [`RemoteProtection`].
    pub remote_protection: RemoteProtection,
    /// Largest injectable message.
    pub inject_size: usize,
    /// Largest message.
    pub max_msg_size: u64,
    /// Bytes of remote CQ data; 0 means immediate data travels in a header.
    pub cq_data_size: usize,
    /// Usable tag bits (from `mem_tag_format`); 0 without tagged messages.
    pub tag_bits: u32,
    /// Messages carry fabric-msg's 16-byte header (length and immediate
    /// data): where `cq_data_size` is 0, or the ladder sets `framed` for the
    /// provider because it truncates silently.
    pub framed: bool,
    /// Completions report the sender's address (`FI_SOURCE` granted and
    /// trusted by the ladder).
    pub source: bool,
    /// Why tagged receives with an ignore mask cannot be trusted against
    /// messages that arrived before them, on this provider and libfabric
    /// (`masked_receives_broken` in providers.toml); `None` where they can.
    /// Exact-tag receives are unaffected as long as the loop posts no
    /// masked one.
    #[serde(default)]
    pub tag_mask_defect: Option<String>,
    /// Why a peek (`FI_PEEK`, and so the World's probe) cannot be used on
    /// this provider and libfabric (`peek_broken` in providers.toml);
    /// `None` where it can.
    #[serde(default)]
    pub peek_defect: Option<String>,
    /// What fabric-msg works around on this provider ([`Quirks`]).
    #[serde(default)]
    pub quirks: Quirks,
    /// Send scatter-gather limit.
    pub iov_limit: usize,
    /// RMA scatter-gather limit.
    pub rma_iov_limit: usize,
    /// Valid u64 atomic operations (probed when atomics were asked for).
    pub atomics: Vec<AtomicSupport>,
    /// Native, emulated or as available: see [`Profile::atomic_carrier`].
    /// From [`Requirements::atomics`]; both peers must use the same.
    #[serde(default)]
    pub atomic_policy: AtomicPolicy,
    /// Data progress model (`progress` in libfabric 2.x).
    pub data_progress: Progress,
    /// Control progress model; in libfabric 2.x, where one `progress` covers
    /// both, the same as `data_progress`.
    pub control_progress: Progress,
    /// Whether completion queues can have a wait fd (blocking waits).
    pub wait_fd: bool,
    /// Threading level.
    pub threading: Threading,
    /// Domain limits as reported.
    pub limits: DomainLimits,
    /// Queue sizes fabric-msg will use.
    pub queues: QueueSizes,
    /// `FI_UNIVERSE_SIZE` in effect.
    pub universe: Universe,
    /// libfabric version at run time.
    pub libfabric_version: (u32, u32),
}

/// Limits the domain reported.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DomainLimits {
    /// Completion queues per domain.
    pub cq_cnt: usize,
    /// Endpoints per domain.
    pub ep_cnt: usize,
    /// Memory regions per domain.
    pub mr_cnt: usize,
    /// Provider's transmit queue depth.
    pub tx_size: usize,
    /// Provider's receive queue depth.
    pub rx_size: usize,
    /// The RDMA device's `max_cqe`, when known.
    pub max_cqe: Option<u32>,
}

impl Profile {
    /// Whether the provider accepted this u64 atomic operation when it was
    /// probed (`fi_atomicvalid`, `fi_fetch_atomicvalid` or
    /// `fi_compare_atomicvalid`). Atomics are probed only when
    /// [`Capability::Atomic`](crate::Capability::Atomic) was asked for, so
    /// without it every answer is `false`.
    pub fn supports(&self, op: AtomicKind) -> bool {
        let (_, name, form) = op.libfabric();
        self.atomics.iter().any(|a| a.op == name && a.form == form.name())
    }

    /// Every atomic operation [`supports`](Profile::supports) says yes to.
    pub fn supported_atomics(&self) -> Vec<AtomicKind> {
        AtomicKind::ALL
            .into_iter()
            .filter(|&op| self.supports(op))
            .collect()
    }

    /// How fabric-msg carries `op` on this profile, or `None` if it cannot.
    ///
    /// One semantics: every fabric-msg atomic on a region is atomic with
    /// respect to every other. A provider's native atomics are not atomic
    /// with respect to fabric-msg's emulation (the provider may apply them
    /// with plain loads and stores, or under its own lock), so the two are
    /// never mixed: where the provider validates every operation
    /// ([`AtomicKind::ALL`]) all are native; where it lacks any, all
    /// are emulated (also those it has). Without emulation (no tagged RDM
    /// endpoints with 64 tag bits, or [`AtomicPolicy::Native`]) only the
    /// provider's own operations are carried, natively.
    pub fn atomic_carrier(&self, op: AtomicKind) -> Option<AtomicCarrier> {
        let all_native = AtomicKind::ALL.into_iter().all(|o| self.supports(o));
        let emulate = self.can_emulate_atomics();
        match self.atomic_policy {
            AtomicPolicy::Native => self.supports(op).then_some(AtomicCarrier::Native),
            AtomicPolicy::Emulated => emulate.then_some(AtomicCarrier::Emulated),
            AtomicPolicy::Auto if all_native => Some(AtomicCarrier::Native),
            AtomicPolicy::Auto if emulate => Some(AtomicCarrier::Emulated),
            AtomicPolicy::Auto => self.supports(op).then_some(AtomicCarrier::Native),
        }
    }

    /// Every operation with its carrier, in [`AtomicKind::ALL`]'s
    /// order; operations not carried at all are left out.
    pub fn atomic_carriers(&self) -> Vec<(AtomicKind, AtomicCarrier)> {
        AtomicKind::ALL
            .into_iter()
            .filter_map(|op| self.atomic_carrier(op).map(|c| (op, c)))
            .collect()
    }

    /// Whether fabric-msg can emulate atomics here: atomics were asked for
    /// ([`Capability::Atomic`](crate::Capability::Atomic): a loop that
    /// never uses them keeps no receives posted for them), on RDM
    /// endpoints with tagged messages of at least 40 tag bits (requests
    /// and replies use the top usable bit, reserved for fabric-msg) and
    /// keys that fit 64 bits.
    pub fn can_emulate_atomics(&self) -> bool {
        self.caps_requested.iter().any(|c| c == "FI_ATOMIC")
            && self.endpoint_type == EndpointType::Rdm
            && self.caps_granted.iter().any(|c| c == "FI_TAGGED")
            && self.tag_bits >= 40
            && self.mr_mode_bits & crate::ffi::FI_MR_RAW as u64 == 0
    }

    /// Whether this loop's atomics are emulated (all or none are, see
    /// [`atomic_carrier`](Self::atomic_carrier)).
    pub(crate) fn atomics_emulated(&self) -> bool {
        self.atomic_carrier(AtomicKind::FetchAdd) == Some(AtomicCarrier::Emulated)
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        req: &Requirements,
        rung: &str,
        info: &FabricInfo,
        class: Classification,
        queues: QueueSizes,
        probed: ProbeResult,
        universe: Universe,
        max_cqe: Option<u32>,
        framed: bool,
        trust_source: bool,
    ) -> Profile {
        Profile {
            rung: rung.to_string(),
            provider: info.provider.clone(),
            fabric_kind: class.kind,
            classification: class.evidence,
            fabric: info.fabric.clone(),
            domain: info.domain.clone(),
            endpoint_type: info.endpoint_type,
            protocol: info.protocol.clone(),
            caps_requested: bit_names(req.cap_bits(), CAP_NAMES),
            caps_granted: info.cap_names(),
            mode: bit_names(info.mode, MODE_NAMES),
            mr_mode_bits: info.mr_mode,
            mr_mode: bit_names(info.mr_mode, MR_MODE_NAMES),
            mr_key_size: info.mr_key_size,
            remote_protection: RemoteProtection::of(&info.provider, info.mr_mode, info.mr_key_size),
            inject_size: info.inject_size,
            max_msg_size: info.max_msg_size,
            cq_data_size: info.cq_data_size,
            tag_bits: tag_bits(info),
            framed,
            source: trust_source && info.caps & crate::ffi::FI_SOURCE != 0,
            tag_mask_defect: None,
            peek_defect: None,
            quirks: Quirks::of(&info.provider),
            iov_limit: info.iov_limit,
            rma_iov_limit: info.rma_iov_limit,
            atomics: probed.atomics,
            atomic_policy: req.atomics,
            data_progress: info.data_progress,
            control_progress: info.control_progress,
            wait_fd: probed.wait_fd,
            threading: info.threading,
            limits: DomainLimits {
                cq_cnt: info.cq_cnt,
                ep_cnt: info.ep_cnt,
                mr_cnt: info.mr_cnt,
                tx_size: info.tx_size,
                rx_size: info.rx_size,
                max_cqe,
            },
            queues,
            universe,
            libfabric_version: crate::ffi::runtime_version(),
        }
    }

    /// The part both peers must agree on.
    pub fn wire(&self) -> WireProfile {
        WireProfile {
            protocol_version: PROTOCOL_VERSION,
            provider: self.provider.clone(),
            fabric_kind: self.fabric_kind,
            endpoint_type: self.endpoint_type,
            mr_key_size: self.mr_key_size as u32,
            virt_addr: self.mr_mode_bits & crate::ffi::FI_MR_VIRT_ADDR as u64 != 0,
            cq_data_size: self.cq_data_size as u32,
            max_msg_size: self.max_msg_size,
            tag_bits: self.tag_bits,
            framed: self.framed,
            atomics_emulated: self.atomics_emulated(),
        }
    }
}

fn tag_bits(info: &FabricInfo) -> u32 {
    if info.caps & crate::ffi::FI_TAGGED as u64 == 0 || info.mem_tag_format == 0 {
        0
    } else {
        64 - info.mem_tag_format.leading_zeros()
    }
}

/// The profile as one peer tells the other: small, versioned, postcard-encoded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireProfile {
    /// [`PROTOCOL_VERSION`] of the sender.
    pub protocol_version: u16,
    /// Provider name.
    pub provider: String,
    /// Fabric kind.
    pub fabric_kind: FabricKind,
    /// Endpoint type.
    pub endpoint_type: EndpointType,
    /// Memory key size.
    pub mr_key_size: u32,
    /// Remote addresses are virtual addresses (`FI_MR_VIRT_ADDR`) rather
    /// than offsets into the region.
    pub virt_addr: bool,
    /// Bytes of remote CQ data.
    pub cq_data_size: u32,
    /// Largest message.
    pub max_msg_size: u64,
    /// Usable tag bits.
    pub tag_bits: u32,
    /// Messages carry fabric-msg's header.
    pub framed: bool,
    /// Atomics are emulated by fabric-msg (not the provider's own).
    pub atomics_emulated: bool,
}

/// The largest encoded [`WireProfile`] accepted, checked before decoding.
pub const MAX_WIRE_PROFILE: usize = 1024;

impl WireProfile {
    /// Encode with postcard.
    pub fn encode(&self) -> Result<Vec<u8>> {
        postcard::to_stdvec(self).map_err(|e| Error::Encoding(format!("encoding the profile: {e}")))
    }

    /// Decode bytes received from a peer, refusing oversized input first.
    pub fn decode(bytes: &[u8]) -> Result<WireProfile> {
        if bytes.len() > MAX_WIRE_PROFILE {
            return Err(Error::Encoding(format!(
                "peer profile is {} bytes, more than the {MAX_WIRE_PROFILE} allowed; the peer is not fabric-msg or is corrupt",
                bytes.len()
            )));
        }
        let (p, rest): (WireProfile, &[u8]) = postcard::take_from_bytes(bytes).map_err(|e| {
            Error::Encoding(format!(
                "peer profile does not decode ({e}); is the peer fabric-msg?"
            ))
        })?;
        if !rest.is_empty() {
            return Err(Error::Encoding(format!(
                "{} trailing bytes after the peer profile",
                rest.len()
            )));
        }
        Ok(p)
    }
}

/// What two compatible peers use: the smaller of each size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Agreement {
    /// Largest message both can take.
    pub max_msg_size: u64,
    /// Remote CQ data both can carry (0: use a header).
    pub cq_data_size: u32,
    /// Tag bits both honour.
    pub tag_bits: u32,
}

/// Compare our profile with a peer's. Errors say what differs and what to do.
pub fn check_peer(local: &WireProfile, remote: &WireProfile) -> Result<Agreement> {
    let fix = "start both sides with the same FI_PROVIDER (or providers.toml), or let both negotiate on the same fabric";
    if local.protocol_version != remote.protocol_version {
        return Err(Error::PeerMismatch(format!(
            "fabric-msg protocol version {} here, {} at the peer: run the same fabric-msg release on both sides",
            local.protocol_version, remote.protocol_version
        )));
    }
    if local.provider != remote.provider || local.endpoint_type != remote.endpoint_type {
        return Err(Error::PeerMismatch(format!(
            "provider `{}` ({}) here, `{}` ({}) at the peer: {fix}",
            local.provider, local.endpoint_type, remote.provider, remote.endpoint_type
        )));
    }
    if local.fabric_kind != remote.fabric_kind {
        return Err(Error::PeerMismatch(format!(
            "fabric {} here, {} at the peer (same provider `{}`): {fix}",
            local.fabric_kind, remote.fabric_kind, local.provider
        )));
    }
    if local.mr_key_size != remote.mr_key_size {
        return Err(Error::PeerMismatch(format!(
            "memory keys are {} bytes here, {} at the peer: the two libfabric builds differ; use the same version",
            local.mr_key_size, remote.mr_key_size
        )));
    }
    if local.framed != remote.framed {
        return Err(Error::PeerMismatch(format!(
            "messages are {} here and {} at the peer: use the same providers.toml (`framed`) and LoopConfig \
             (`force_framing`) on both sides",
            if local.framed { "framed" } else { "unframed" },
            if remote.framed { "framed" } else { "unframed" }
        )));
    }
    if local.atomics_emulated != remote.atomics_emulated {
        let says = |e: bool| if e { "emulated" } else { "native" };
        return Err(Error::PeerMismatch(format!(
            "atomics are {} here and {} at the peer, and the two are not atomic with respect to each other: \
             negotiate with the same Capability::Atomic and Requirements::atomics on both sides",
            says(local.atomics_emulated),
            says(remote.atomics_emulated)
        )));
    }
    Ok(Agreement {
        max_msg_size: local.max_msg_size.min(remote.max_msg_size),
        cq_data_size: local.cq_data_size.min(remote.cq_data_size),
        tag_bits: local.tag_bits.min(remote.tag_bits),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wire() -> WireProfile {
        WireProfile {
            protocol_version: PROTOCOL_VERSION,
            provider: "verbs;ofi_rxm".into(),
            fabric_kind: FabricKind::Roce,
            endpoint_type: EndpointType::Rdm,
            mr_key_size: 4,
            virt_addr: true,
            cq_data_size: 4,
            max_msg_size: 8 << 20,
            tag_bits: 64,
            framed: false,
            atomics_emulated: false,
        }
    }

    #[test]
    fn round_trips_through_postcard() {
        let w = wire();
        let bytes = w.encode().unwrap();
        assert!(bytes.len() < 64, "{} bytes", bytes.len());
        assert_eq!(WireProfile::decode(&bytes).unwrap(), w);
    }

    #[test]
    fn hostile_bytes_are_refused_not_panicked_on() {
        assert!(WireProfile::decode(&[0u8; MAX_WIRE_PROFILE + 1])
            .unwrap_err()
            .to_string()
            .contains("more than"));
        assert!(WireProfile::decode(&[0xff; 16]).is_err());
        let mut bytes = wire().encode().unwrap();
        bytes.push(0);
        assert!(WireProfile::decode(&bytes)
            .unwrap_err()
            .to_string()
            .contains("trailing"));
        for cut in 0..bytes.len() - 1 {
            assert!(WireProfile::decode(&bytes[..cut]).is_err(), "truncated at {cut}");
        }
    }

    #[test]
    fn compatible_peers_agree_on_the_smaller_sizes() {
        let mut other = wire();
        other.max_msg_size = 1 << 20;
        other.cq_data_size = 0;
        let a = check_peer(&wire(), &other).unwrap();
        assert_eq!((a.max_msg_size, a.cq_data_size, a.tag_bits), (1 << 20, 0, 64));
    }

    #[test]
    fn mismatches_say_what_differs_and_what_to_do() {
        let mut other = wire();
        other.provider = "tcp;ofi_rxm".into();
        other.fabric_kind = FabricKind::Tcp;
        let e = check_peer(&wire(), &other).unwrap_err().to_string();
        assert!(
            e.contains("verbs;ofi_rxm") && e.contains("tcp;ofi_rxm") && e.contains("FI_PROVIDER"),
            "{e}"
        );

        let mut other = wire();
        other.protocol_version += 1;
        assert!(check_peer(&wire(), &other)
            .unwrap_err()
            .to_string()
            .contains("protocol version"));

        let mut other = wire();
        other.fabric_kind = FabricKind::InfiniBand;
        assert!(check_peer(&wire(), &other)
            .unwrap_err()
            .to_string()
            .contains("InfiniBand"));
    }
}
