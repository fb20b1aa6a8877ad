//! What libfabric reports about one fabric interface, as plain Rust data.
//!
//! [`FabricInfo`] is an owned snapshot of one `struct fi_info` entry. It is
//! built either from a live `fi_getinfo` list or
//! from recorded `fi_info` text ([`parse_fi_info_text`](super::info_text::parse_fi_info_text)), so that the
//! classifier and the ladder are pure functions that can be tested on dumps
//! recorded on real InfiniBand, RoCE and iWARP hosts.

pub use crate::discovery::bits::{bit_names, CAP_NAMES, MODE_NAMES, MR_MODE_NAMES};

use crate::ffi;
use serde::{Deserialize, Serialize};
use std::ffi::CStr;
use std::fmt;

/// Endpoint type (`FI_EP_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EndpointType {
    /// Reliable datagram: connectionless, reliable (`FI_EP_RDM`).
    Rdm,
    /// Connected, reliable (`FI_EP_MSG`).
    Msg,
    /// Unreliable datagram (`FI_EP_DGRAM`).
    Dgram,
    /// Anything else or not reported.
    Unspec,
}

impl EndpointType {
    pub(crate) fn from_raw(t: ffi::fi_ep_type) -> Self {
        match t {
            ffi::FI_EP_RDM => Self::Rdm,
            ffi::FI_EP_MSG => Self::Msg,
            ffi::FI_EP_DGRAM => Self::Dgram,
            _ => Self::Unspec,
        }
    }

    pub(crate) fn to_raw(self) -> ffi::fi_ep_type {
        match self {
            Self::Rdm => ffi::FI_EP_RDM,
            Self::Msg => ffi::FI_EP_MSG,
            Self::Dgram => ffi::FI_EP_DGRAM,
            Self::Unspec => ffi::FI_EP_UNSPEC,
        }
    }

    pub(crate) fn from_name(s: &str) -> Self {
        match s {
            "FI_EP_RDM" => Self::Rdm,
            "FI_EP_MSG" => Self::Msg,
            "FI_EP_DGRAM" => Self::Dgram,
            _ => Self::Unspec,
        }
    }
}

impl fmt::Display for EndpointType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Rdm => "rdm",
            Self::Msg => "msg",
            Self::Dgram => "dgram",
            Self::Unspec => "unspec",
        })
    }
}

/// Progress model (`FI_PROGRESS_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Progress {
    /// The provider makes progress by itself.
    Auto,
    /// The application must drive progress by reading the CQ.
    Manual,
    /// Manual progress, and the application also serialises control
    /// operations with data progress (`FI_PROGRESS_CONTROL_UNIFIED`,
    /// libfabric 2.x; only granted when asked for, which fabric-msg does not).
    #[serde(rename = "control_unified")]
    ControlUnified,
    /// Not reported.
    Unspec,
}

impl Progress {
    fn from_raw(p: ffi::fi_progress) -> Self {
        match p {
            ffi::FI_PROGRESS_AUTO => Self::Auto,
            ffi::FI_PROGRESS_MANUAL => Self::Manual,
            #[cfg(libfabric_v2)]
            ffi::FI_PROGRESS_CONTROL_UNIFIED => Self::ControlUnified,
            _ => Self::Unspec,
        }
    }
    pub(crate) fn from_name(s: &str) -> Self {
        match s {
            "FI_PROGRESS_AUTO" => Self::Auto,
            "FI_PROGRESS_MANUAL" => Self::Manual,
            "FI_PROGRESS_CONTROL_UNIFIED" => Self::ControlUnified,
            _ => Self::Unspec,
        }
    }
}

/// Threading level of a domain (`FI_THREAD_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Threading {
    /// Any object may be used from any thread at once.
    Safe,
    /// Each endpoint, CQ, ... may be used by one thread at a time.
    Fid,
    /// The whole domain by one thread at a time.
    Domain,
    /// Serialised per completion object.
    Completion,
    /// Each endpoint's TX and RX sides by one thread each.
    Endpoint,
    /// Not reported.
    Unspec,
}

impl Threading {
    fn from_raw(t: ffi::fi_threading) -> Self {
        match t {
            ffi::FI_THREAD_SAFE => Self::Safe,
            ffi::FI_THREAD_FID => Self::Fid,
            ffi::FI_THREAD_DOMAIN => Self::Domain,
            ffi::FI_THREAD_COMPLETION => Self::Completion,
            ffi::FI_THREAD_ENDPOINT => Self::Endpoint,
            _ => Self::Unspec,
        }
    }
    pub(crate) fn from_name(s: &str) -> Self {
        match s {
            "FI_THREAD_SAFE" => Self::Safe,
            "FI_THREAD_FID" => Self::Fid,
            "FI_THREAD_DOMAIN" => Self::Domain,
            "FI_THREAD_COMPLETION" => Self::Completion,
            "FI_THREAD_ENDPOINT" => Self::Endpoint,
            _ => Self::Unspec,
        }
    }
}

/// An owned snapshot of one `fi_info` entry: the parts fabric-msg decides on.
/// Fields a recorded dump does not show are zero or empty.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FabricInfo {
    /// Provider name as libfabric reports it, e.g. `verbs;ofi_rxm`.
    pub provider: String,
    /// Fabric name, e.g. `IB-0xfe80000000000000` or `127.0.0.0/8`.
    pub fabric: String,
    /// Domain name, e.g. `mlx5_0`, `rxe0-dgram`, `lo`.
    pub domain: String,
    /// Endpoint type.
    pub endpoint_type: EndpointType,
    /// Endpoint protocol name, e.g. `FI_PROTO_IWARP`.
    pub protocol: String,
    /// Address format name, e.g. `FI_SOCKADDR_IN`.
    pub addr_format: String,
    /// Capability bits (`FI_MSG`, ...).
    pub caps: u64,
    /// Mode bits the application must honour.
    pub mode: u64,
    /// Memory-registration mode bits.
    pub mr_mode: u64,
    /// Size of a memory key in bytes.
    pub mr_key_size: usize,
    /// Largest message that may be sent with inject.
    pub inject_size: usize,
    /// Largest message.
    pub max_msg_size: u64,
    /// Bytes of remote CQ data (immediate data); 0 when there is none.
    pub cq_data_size: usize,
    /// Tag format (`mem_tag_format`).
    pub mem_tag_format: u64,
    /// Send-side scatter-gather limit.
    pub iov_limit: usize,
    /// RMA scatter-gather limit.
    pub rma_iov_limit: usize,
    /// Transmit queue depth.
    pub tx_size: usize,
    /// Receive queue depth.
    pub rx_size: usize,
    /// Data progress model: `data_progress` in libfabric 1.x, `progress`
    /// in 2.x (one field for data and control operations).
    pub data_progress: Progress,
    /// Control progress model: `control_progress` in libfabric 1.x; in 2.x,
    /// where `progress` covers control operations too, the same as
    /// `data_progress`.
    pub control_progress: Progress,
    /// Threading level.
    pub threading: Threading,
    /// Most completion queues a domain may open.
    pub cq_cnt: usize,
    /// Most endpoints a domain may open.
    pub ep_cnt: usize,
    /// Most memory regions.
    pub mr_cnt: usize,
    /// The NIC's link type (`nic.link_attr.network_type`) where reported,
    /// e.g. `InfiniBand` or `Ethernet`.
    pub network_type: Option<String>,
}

impl FabricInfo {
    pub(crate) fn empty(provider: &str) -> Self {
        FabricInfo {
            provider: provider.to_string(),
            fabric: String::new(),
            domain: String::new(),
            endpoint_type: EndpointType::Unspec,
            protocol: String::new(),
            addr_format: String::new(),
            caps: 0,
            mode: 0,
            mr_mode: 0,
            mr_key_size: 0,
            inject_size: 0,
            max_msg_size: 0,
            cq_data_size: 0,
            mem_tag_format: 0,
            iov_limit: 0,
            rma_iov_limit: 0,
            tx_size: 0,
            rx_size: 0,
            data_progress: Progress::Unspec,
            control_progress: Progress::Unspec,
            threading: Threading::Unspec,
            cq_cnt: 0,
            ep_cnt: 0,
            mr_cnt: 0,
            network_type: None,
        }
    }

    /// The core provider: `verbs` for `verbs;ofi_rxm`.
    pub fn core_provider(&self) -> &str {
        self.provider.split(';').next().unwrap_or("")
    }

    /// The RDMA device behind a verbs domain: `rxe0` for `rxe0-dgram`.
    pub fn device(&self) -> &str {
        let d = self.domain.as_str();
        d.strip_suffix("-dgram")
            .or_else(|| d.strip_suffix("-xrc"))
            .unwrap_or(d)
    }

    /// Capability names.
    pub fn cap_names(&self) -> Vec<String> {
        bit_names(self.caps, CAP_NAMES)
    }

    /// `mr_mode` names.
    pub fn mr_mode_names(&self) -> Vec<String> {
        bit_names(self.mr_mode, MR_MODE_NAMES)
    }

    /// Copy one live `fi_info` entry.
    ///
    /// # Safety
    /// `info` must point to a valid entry of a list returned by `fi_getinfo`
    /// (or `fi_dupinfo`) that has not been freed.
    pub(crate) unsafe fn from_raw(info: *const ffi::fi_info) -> FabricInfo {
        fn text(p: *const std::os::raw::c_char) -> String {
            if p.is_null() {
                String::new()
            } else {
                // SAFETY: libfabric's name strings are NUL-terminated and live
                // as long as the fi_info they belong to (the caller's promise).
                unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
            }
        }
        // SAFETY: the caller promises `info` is a live fi_info; its attribute
        // pointers are either NULL or point into the same allocation set.
        let (i, fab, dom, ep, tx, rx, nic) = unsafe {
            let i = &*info;
            (
                i,
                i.fabric_attr.as_ref(),
                i.domain_attr.as_ref(),
                i.ep_attr.as_ref(),
                i.tx_attr.as_ref(),
                i.rx_attr.as_ref(),
                i.nic.as_ref(),
            )
        };
        let mut out = FabricInfo::empty("");
        out.caps = i.caps;
        out.mode = i.mode;
        out.addr_format = addr_format_name(i.addr_format);
        if let Some(f) = fab {
            out.provider = text(f.prov_name);
            out.fabric = text(f.name);
        }
        if let Some(d) = dom {
            out.domain = text(d.name);
            out.mr_mode = d.mr_mode as u64;
            out.mr_key_size = d.mr_key_size;
            out.cq_data_size = d.cq_data_size;
            #[cfg(not(libfabric_v2))]
            {
                out.data_progress = Progress::from_raw(d.data_progress);
                out.control_progress = Progress::from_raw(d.control_progress);
            }
            // 2.0 made `data_progress` a second name of `progress`, which
            // covers control operations as well; `control_progress` stays in
            // the struct for the ABI only.
            #[cfg(libfabric_v2)]
            {
                // SAFETY: both members of this anonymous union are
                // `enum fi_progress` (data_progress, progress): reading
                // either reads the value libfabric wrote.
                let progress = Progress::from_raw(unsafe { d.__bindgen_anon_1.progress });
                out.data_progress = progress;
                out.control_progress = progress;
            }
            out.threading = Threading::from_raw(d.threading);
            out.cq_cnt = d.cq_cnt;
            out.ep_cnt = d.ep_cnt;
            out.mr_cnt = d.mr_cnt;
        }
        if let Some(e) = ep {
            out.endpoint_type = EndpointType::from_raw(e.type_);
            out.protocol = protocol_name(e.protocol);
            out.max_msg_size = e.max_msg_size as u64;
            out.mem_tag_format = e.mem_tag_format;
        }
        if let Some(t) = tx {
            out.inject_size = t.inject_size;
            out.iov_limit = t.iov_limit;
            out.rma_iov_limit = t.rma_iov_limit;
            out.tx_size = t.size;
        }
        if let Some(r) = rx {
            out.rx_size = r.size;
        }
        // SAFETY: nic and its link_attr are owned by the same fi_info.
        if let Some(link) = nic.and_then(|n| unsafe { n.link_attr.as_ref() }) {
            let t = text(link.network_type);
            if !t.is_empty() && t != "(null)" {
                out.network_type = Some(t);
            }
        }
        out
    }
}

fn protocol_name(p: u32) -> String {
    // libfabric's protocol values are anonymous enum constants; name the ones
    // the classifier looks at and show the rest by number.
    let known: &[(&str, u32)] = &[
        ("FI_PROTO_UNSPEC", ffi::FI_PROTO_UNSPEC),
        ("FI_PROTO_RDMA_CM_IB_RC", ffi::FI_PROTO_RDMA_CM_IB_RC),
        ("FI_PROTO_IWARP", ffi::FI_PROTO_IWARP),
        ("FI_PROTO_IB_UD", ffi::FI_PROTO_IB_UD),
        ("FI_PROTO_PSMX", ffi::FI_PROTO_PSMX),
        ("FI_PROTO_UDP", ffi::FI_PROTO_UDP),
        ("FI_PROTO_SOCK_TCP", ffi::FI_PROTO_SOCK_TCP),
        ("FI_PROTO_IB_RDM", ffi::FI_PROTO_IB_RDM),
        ("FI_PROTO_IWARP_RDM", ffi::FI_PROTO_IWARP_RDM),
        ("FI_PROTO_GNI", ffi::FI_PROTO_GNI),
        ("FI_PROTO_RXM", ffi::FI_PROTO_RXM),
        ("FI_PROTO_RXD", ffi::FI_PROTO_RXD),
        ("FI_PROTO_MLX", ffi::FI_PROTO_MLX),
        ("FI_PROTO_NETWORKDIRECT", ffi::FI_PROTO_NETWORKDIRECT),
        ("FI_PROTO_SHM", ffi::FI_PROTO_SHM),
        ("FI_PROTO_RSTREAM", ffi::FI_PROTO_RSTREAM),
        ("FI_PROTO_RDMA_CM_IB_XRC", ffi::FI_PROTO_RDMA_CM_IB_XRC),
        ("FI_PROTO_EFA", ffi::FI_PROTO_EFA),
        ("FI_PROTO_PSMX3", ffi::FI_PROTO_PSMX3),
        ("FI_PROTO_RXM_TCP", ffi::FI_PROTO_RXM_TCP),
        ("FI_PROTO_OPX", ffi::FI_PROTO_OPX),
        ("FI_PROTO_CXI", ffi::FI_PROTO_CXI),
        ("FI_PROTO_XNET", ffi::FI_PROTO_XNET),
    ];
    known
        .iter()
        .find(|(_, v)| *v == p)
        .map(|(n, _)| (*n).to_string())
        .unwrap_or_else(|| format!("protocol {p}"))
}

fn addr_format_name(f: u32) -> String {
    match f {
        ffi::FI_SOCKADDR_IN => "FI_SOCKADDR_IN",
        ffi::FI_SOCKADDR_IN6 => "FI_SOCKADDR_IN6",
        ffi::FI_SOCKADDR_IB => "FI_SOCKADDR_IB",
        ffi::FI_SOCKADDR => "FI_SOCKADDR",
        ffi::FI_ADDR_STR => "FI_ADDR_STR",
        ffi::FI_ADDR_IB_UD => "FI_ADDR_IB_UD",
        ffi::FI_ADDR_PSMX => "FI_ADDR_PSMX",
        ffi::FI_ADDR_EFA => "FI_ADDR_EFA",
        _ => return format!("format {f}"),
    }
    .to_string()
}
