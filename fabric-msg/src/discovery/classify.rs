//! Which kind of fabric a libfabric entry is: InfiniBand, RoCE, iWARP, TCP,
//! shared memory, UDP or other.
//!
//! [`classify`] is a pure function of what libfabric reports ([`FabricInfo`])
//! and, for verbs devices, what sysfs says about the device
//! ([`SysfsDevice`]). It is tested on `fi_info` dumps and sysfs attributes
//! recorded on real hosts (`tests/fixtures/hosts/`).
//!
//! The evidence, strongest first, for a verbs device:
//! 1. sysfs `node_type` (`4: RNIC` is iWARP; `1: CA` is an InfiniBand
//!    channel adapter, which RoCE devices are too) and the port's
//!    `link_layer` (`InfiniBand` or `Ethernet`);
//! 2. the endpoint protocol `FI_PROTO_IWARP`, or the fabric name
//!    `Ethernet-iWARP` that the verbs provider gives iWARP devices;
//! 3. `nic.link_attr.network_type` (libfabric 1.8 and newer);
//! 4. otherwise the verbs provider's `IB-0x<subnet prefix>` fabric name, which
//!    RoCE shares, so it is taken as InfiniBand only for lack of anything
//!    better, and the evidence says so.

use crate::discovery::info::FabricInfo;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

/// The kinds of fabric fabric-msg tells apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FabricKind {
    /// InfiniBand HCAs through verbs.
    InfiniBand,
    /// RDMA over Converged Ethernet through verbs.
    Roce,
    /// iWARP RNICs through verbs.
    Iwarp,
    /// TCP sockets (`tcp`, `net`, `sockets`).
    Tcp,
    /// Shared memory between processes of one host (`shm`).
    Shm,
    /// UDP datagrams (`udp`, usually under `ofi_rxd`).
    Udp,
    /// Anything else (Omni-Path, Slingshot, EFA, usNIC, ...).
    Other,
}

impl FabricKind {
    /// Every kind, in the order of the default ladder.
    pub const ALL: [FabricKind; 7] = [
        FabricKind::InfiniBand,
        FabricKind::Roce,
        FabricKind::Iwarp,
        FabricKind::Tcp,
        FabricKind::Shm,
        FabricKind::Udp,
        FabricKind::Other,
    ];

    /// The lowercase name used in `providers.toml` and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            FabricKind::InfiniBand => "infiniband",
            FabricKind::Roce => "roce",
            FabricKind::Iwarp => "iwarp",
            FabricKind::Tcp => "tcp",
            FabricKind::Shm => "shm",
            FabricKind::Udp => "udp",
            FabricKind::Other => "other",
        }
    }

    /// Whether this kind is RDMA hardware driven through verbs.
    pub fn is_rdma(self) -> bool {
        matches!(
            self,
            FabricKind::InfiniBand | FabricKind::Roce | FabricKind::Iwarp
        )
    }
}

impl fmt::Display for FabricKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FabricKind::InfiniBand => "InfiniBand",
            FabricKind::Roce => "RoCE",
            FabricKind::Iwarp => "iWARP",
            FabricKind::Tcp => "TCP",
            FabricKind::Shm => "shared memory",
            FabricKind::Udp => "UDP",
            FabricKind::Other => "other",
        })
    }
}

/// A kind and the evidence it was decided on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Classification {
    /// The kind.
    pub kind: FabricKind,
    /// Why, in words, e.g. `sysfs node_type 4: RNIC`.
    pub evidence: String,
}

/// What sysfs says about one RDMA device (`/sys/class/infiniband/<dev>`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SysfsDevice {
    /// Contents of `node_type`, e.g. `1: CA` or `4: RNIC`.
    pub node_type: Option<String>,
    /// `link_layer` of each port, by port number.
    pub link_layers: BTreeMap<u32, String>,
}

/// sysfs attributes of every RDMA device on a host, by device name.
pub type SysfsSnapshot = BTreeMap<String, SysfsDevice>;

/// Read `/sys/class/infiniband` (or the same layout under `root`). A host
/// without RDMA devices gives an empty snapshot.
pub fn read_sysfs(root: &Path) -> SysfsSnapshot {
    let mut snap = SysfsSnapshot::new();
    let Ok(devices) = std::fs::read_dir(root) else {
        return snap;
    };
    for dev in devices.flatten() {
        let name = dev.file_name().to_string_lossy().into_owned();
        let path = dev.path();
        let read = |p: &Path| std::fs::read_to_string(p).ok().map(|s| s.trim().to_string());
        let mut d = SysfsDevice {
            node_type: read(&path.join("node_type")),
            ..Default::default()
        };
        if let Ok(ports) = std::fs::read_dir(path.join("ports")) {
            for port in ports.flatten() {
                let Ok(n) = port.file_name().to_string_lossy().parse::<u32>() else {
                    continue;
                };
                if let Some(ll) = read(&port.path().join("link_layer")) {
                    d.link_layers.insert(n, ll);
                }
            }
        }
        snap.insert(name, d);
    }
    snap
}

/// Parse recorded sysfs attributes: lines of `<path>: <contents>`, e.g.
/// `/sys/class/infiniband/mlx5_0/ports/1/link_layer: InfiniBand`.
/// Lines that are not about a device's `node_type` or a port's `link_layer`
/// are ignored.
pub fn parse_sysfs_text(text: &str) -> SysfsSnapshot {
    let mut snap = SysfsSnapshot::new();
    for line in text.lines() {
        let Some((path, value)) = line.split_once(": ") else {
            continue;
        };
        let Some(rest) = path.trim().strip_prefix("/sys/class/infiniband/") else {
            continue;
        };
        let parts: Vec<&str> = rest.split('/').collect();
        let value = value.trim().to_string();
        match parts.as_slice() {
            [dev, "node_type"] => snap.entry((*dev).to_string()).or_default().node_type = Some(value),
            [dev, "ports", port, "link_layer"] => {
                if let Ok(n) = port.parse() {
                    snap.entry((*dev).to_string())
                        .or_default()
                        .link_layers
                        .insert(n, value);
                }
            }
            _ => {}
        }
    }
    snap
}

/// Classify one libfabric entry. `sysfs` is the host's snapshot (empty when
/// unknown); only the entry's own device is looked at.
pub fn classify(info: &FabricInfo, sysfs: &SysfsSnapshot) -> Classification {
    let c = |kind, evidence: String| Classification { kind, evidence };
    match info.core_provider() {
        "shm" | "sm2" => return c(FabricKind::Shm, format!("provider {}", info.core_provider())),
        "tcp" | "net" | "sockets" => return c(FabricKind::Tcp, format!("provider {}", info.core_provider())),
        "udp" | "UDP" => return c(FabricKind::Udp, format!("provider {}", info.core_provider())),
        "verbs" => {}
        other => {
            return c(
                FabricKind::Other,
                format!("provider {other} is not verbs, tcp, shm or udp"),
            )
        }
    }

    // A verbs device.
    if let Some(dev) = sysfs.get(info.device()) {
        match dev.node_type.as_deref().map(node_type_number) {
            Some(Some(4)) => {
                return c(
                    FabricKind::Iwarp,
                    format!("sysfs {} node_type 4: RNIC", info.device()),
                )
            }
            Some(Some(1)) => {
                // An InfiniBand channel adapter: the link layer says IB or RoCE.
                // RDMA devices fabric-msg has seen have all ports on one link
                // layer; a mixed device is judged by its first port.
                if let Some((port, ll)) = dev.link_layers.iter().next() {
                    let kind = match ll.as_str() {
                        "Ethernet" => Some(FabricKind::Roce),
                        "InfiniBand" => Some(FabricKind::InfiniBand),
                        _ => None,
                    };
                    if let Some(kind) = kind {
                        return c(
                            kind,
                            format!(
                                "sysfs {} node_type 1: CA, port {port} link_layer {ll}",
                                info.device()
                            ),
                        );
                    }
                }
            }
            _ => {}
        }
    }
    if info.protocol == "FI_PROTO_IWARP" || info.protocol == "FI_PROTO_IWARP_RDM" {
        return c(FabricKind::Iwarp, format!("endpoint protocol {}", info.protocol));
    }
    if info.fabric.contains("iWARP") {
        return c(FabricKind::Iwarp, format!("fabric name {}", info.fabric));
    }
    match info.network_type.as_deref() {
        Some("Ethernet") => {
            return c(
                FabricKind::Roce,
                "verbs on a NIC with network_type Ethernet".into(),
            )
        }
        Some("InfiniBand") => return c(FabricKind::InfiniBand, "NIC network_type InfiniBand".into()),
        _ => {}
    }
    if info.fabric.starts_with("IB-") {
        return c(
            FabricKind::InfiniBand,
            format!(
                "fabric name {} (RoCE shares this form; no sysfs or NIC link data to tell them apart)",
                info.fabric
            ),
        );
    }
    c(
        FabricKind::Other,
        format!("verbs device {} with no recognisable link data", info.device()),
    )
}

fn node_type_number(s: &str) -> Option<u32> {
    s.split(':').next()?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verbs(domain: &str, fabric: &str, protocol: &str, network: Option<&str>) -> FabricInfo {
        let text = format!(
            "fi_info:\n    fi_ep_attr:\n        protocol: {protocol}\n    fi_domain_attr:\n        name: {domain}\n    \
             fi_fabric_attr:\n        name: {fabric}\n        prov_name: verbs;ofi_rxm\n{}",
            network.map(|n| format!("    nic:\n        fi_link_attr:\n            network_type: {n}\n")).unwrap_or_default()
        );
        crate::discovery::info_text::parse_fi_info_text(&text).remove(0)
    }

    #[test]
    fn sysfs_beats_the_ambiguous_ib_fabric_name() {
        let info = verbs("mlx5_0", "IB-0xfe80000000000000", "FI_PROTO_RXM", None);
        let sysfs = parse_sysfs_text(
            "/sys/class/infiniband/mlx5_0/node_type: 1: CA\n\
             /sys/class/infiniband/mlx5_0/ports/1/link_layer: Ethernet\n",
        );
        assert_eq!(classify(&info, &sysfs).kind, FabricKind::Roce);
        assert_eq!(
            classify(&info, &SysfsSnapshot::new()).kind,
            FabricKind::InfiniBand
        );
        assert!(classify(&info, &SysfsSnapshot::new())
            .evidence
            .contains("RoCE shares"));
    }

    #[test]
    fn rnic_node_type_is_iwarp_even_through_rxm() {
        let info = verbs("siw0", "Ethernet-iWARP", "FI_PROTO_RXM", Some("Ethernet"));
        let sysfs = parse_sysfs_text("/sys/class/infiniband/siw0/node_type: 4: RNIC\n");
        assert_eq!(classify(&info, &sysfs).kind, FabricKind::Iwarp);
        // Without sysfs the fabric name still says iWARP, before network_type.
        assert_eq!(classify(&info, &SysfsSnapshot::new()).kind, FabricKind::Iwarp);
    }

    #[test]
    fn dgram_domains_use_their_device_in_sysfs() {
        let info = verbs("mlx5_0-dgram", "IB-0xfe80000000000000", "FI_PROTO_IB_UD", None);
        let sysfs = parse_sysfs_text(
            "/sys/class/infiniband/mlx5_0/node_type: 1: CA\n\
             /sys/class/infiniband/mlx5_0/ports/1/link_layer: InfiniBand\n",
        );
        let c = classify(&info, &sysfs);
        assert_eq!(c.kind, FabricKind::InfiniBand);
        assert!(c.evidence.contains("link_layer InfiniBand"), "{}", c.evidence);
    }

    #[test]
    fn software_providers_by_name() {
        for (prov, kind) in [
            ("tcp;ofi_rxm", FabricKind::Tcp),
            ("net", FabricKind::Tcp),
            ("sockets", FabricKind::Tcp),
            ("shm", FabricKind::Shm),
            ("udp;ofi_rxd", FabricKind::Udp),
            ("psm2", FabricKind::Other),
        ] {
            let mut info = verbs("x", "y", "z", None);
            info.provider = prov.into();
            assert_eq!(classify(&info, &SysfsSnapshot::new()).kind, kind, "{prov}");
        }
    }

    #[test]
    fn reads_a_sysfs_tree_laid_out_like_the_kernels() {
        let dir = std::env::temp_dir().join(format!("fabric-msg-sysfs-{}", std::process::id()));
        let port = dir.join("rxe0/ports/1");
        std::fs::create_dir_all(&port).unwrap();
        std::fs::write(dir.join("rxe0/node_type"), "1: CA\n").unwrap();
        std::fs::write(port.join("link_layer"), "Ethernet\n").unwrap();
        let snap = read_sysfs(&dir);
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(snap["rxe0"].node_type.as_deref(), Some("1: CA"));
        assert_eq!(snap["rxe0"].link_layers[&1], "Ethernet");
        assert!(read_sysfs(Path::new("/nonexistent/fabric-msg")).is_empty());
    }
}
