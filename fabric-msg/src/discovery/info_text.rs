//! Recorded `fi_info` text read back into [`FabricInfo`] entries, so the
//! classifier and the ladder can be tested on dumps recorded on real
//! InfiniBand, RoCE and iWARP hosts (`tests/fixtures/`).

use crate::discovery::bits::{bits_from_names, CAP_NAMES, MODE_NAMES, MR_MODE_NAMES};
use crate::discovery::info::{EndpointType, FabricInfo, Progress, Threading};
use std::collections::HashMap;

/// Parse recorded `fi_info` output into entries.
///
/// Accepts the verbose form (`fi_info -v`: `fi_info:` blocks of nested
/// `key: value` lines), the short form (`provider:` followed by indented
/// `fabric:`, `domain:`, `type:`, `protocol:`), and the pre-1.4 short form
/// (`<provider>: <fabric>` followed by indented `type:` and `protocol:`).
/// Shell prompts, `---` separators, blank lines and tab indentation are
/// ignored, as in dumps pasted into issues and mailing lists.
pub fn parse_fi_info_text(text: &str) -> Vec<FabricInfo> {
    let mut out = Vec::new();
    // Current block: flat map of dotted paths to values, plus the indent stack.
    let mut fields: HashMap<String, String> = HashMap::new();
    let mut stack: Vec<(usize, String)> = Vec::new();
    let mut short: Option<FabricInfo> = None;

    let flush_verbose = |fields: &mut HashMap<String, String>, out: &mut Vec<FabricInfo>| {
        if !fields.is_empty() {
            out.push(from_fields(fields));
            fields.clear();
        }
    };

    for raw in text.lines() {
        let line = raw.replace('\t', "    ");
        let trimmed = line.trim();
        if trimmed.is_empty() || trimmed == "---" || is_prompt(trimmed) {
            continue;
        }
        let indent = line.len() - line.trim_start().len();
        let Some((key, value)) = trimmed.split_once(':') else {
            continue;
        };
        let (key, value) = (key.trim(), value.trim());

        if key == "fi_info" && value.is_empty() {
            out.extend(short.take());
            flush_verbose(&mut fields, &mut out);
            stack.clear();
            stack.push((indent, "fi_info".into()));
            continue;
        }
        if !stack.is_empty() {
            while stack.last().is_some_and(|(i, _)| *i >= indent) {
                stack.pop();
            }
            if stack.is_empty() {
                // A line at or left of `fi_info:` ends the verbose block.
                flush_verbose(&mut fields, &mut out);
            } else {
                let path: Vec<&str> = stack.iter().skip(1).map(|(_, k)| k.as_str()).collect();
                let mut full = path.join(".");
                if !full.is_empty() {
                    full.push('.');
                }
                full.push_str(key);
                if value.is_empty() {
                    stack.push((indent, key.to_string()));
                } else {
                    fields.insert(full, value.to_string());
                }
                continue;
            }
        }

        // Short forms.
        if indent == 0 || short.is_none() {
            if key == "provider" {
                out.extend(short.take());
                short = Some(FabricInfo::empty(value));
            } else if is_provider_name(key) && !value.is_empty() {
                // Old form: "verbs: IB-0x80fe".
                out.extend(short.take());
                let mut e = FabricInfo::empty(key);
                e.fabric = value.to_string();
                short = Some(e);
            }
            continue;
        }
        if let Some(e) = short.as_mut() {
            match key {
                "fabric" => e.fabric = value.to_string(),
                "domain" => e.domain = value.to_string(),
                "type" => e.endpoint_type = EndpointType::from_name(value),
                "protocol" => e.protocol = value.to_string(),
                _ => {}
            }
        }
    }
    out.extend(short.take());
    flush_verbose(&mut fields, &mut out);
    out
}

fn is_prompt(line: &str) -> bool {
    line.starts_with('$')
        || line.starts_with('#')
        || line.contains("$ ")
        || line.contains("# ./")
        || line.starts_with("fi_getinfo:")
}

fn is_provider_name(key: &str) -> bool {
    !key.is_empty()
        && !key.contains(' ')
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ';' || c == '-')
        && !matches!(key, "version" | "type" | "protocol" | "fabric" | "domain")
}

fn from_fields(f: &HashMap<String, String>) -> FabricInfo {
    let s = |k: &str| f.get(k).cloned().unwrap_or_default();
    let n = |k: &str| -> u64 {
        f.get(k)
            .and_then(|v| match v.strip_prefix("0x") {
                Some(hex) => u64::from_str_radix(hex, 16).ok(),
                None => v.parse().ok(),
            })
            .unwrap_or(0)
    };
    let us = |k: &str| usize::try_from(n(k)).unwrap_or(usize::MAX);
    let mut e = FabricInfo::empty(&s("fi_fabric_attr.prov_name"));
    e.fabric = s("fi_fabric_attr.name");
    e.domain = s("fi_domain_attr.name");
    e.endpoint_type = EndpointType::from_name(&s("fi_ep_attr.type"));
    e.protocol = s("fi_ep_attr.protocol");
    e.addr_format = s("addr_format");
    e.caps = bits_from_names(&s("caps"), CAP_NAMES);
    e.mode = bits_from_names(&s("mode"), MODE_NAMES);
    e.mr_mode = bits_from_names(&s("fi_domain_attr.mr_mode"), MR_MODE_NAMES);
    e.mr_key_size = us("fi_domain_attr.mr_key_size");
    e.inject_size = us("fi_tx_attr.inject_size");
    e.max_msg_size = n("fi_ep_attr.max_msg_size");
    e.cq_data_size = us("fi_domain_attr.cq_data_size");
    e.mem_tag_format = n("fi_ep_attr.mem_tag_format");
    e.iov_limit = us("fi_tx_attr.iov_limit");
    e.rma_iov_limit = us("fi_tx_attr.rma_iov_limit");
    e.tx_size = us("fi_tx_attr.size");
    e.rx_size = us("fi_rx_attr.size");
    match f.get("fi_domain_attr.progress") {
        // libfabric 2.x prints one `progress` for data and control.
        Some(p) => {
            e.data_progress = Progress::from_name(p);
            e.control_progress = e.data_progress;
        }
        None => {
            e.data_progress = Progress::from_name(&s("fi_domain_attr.data_progress"));
            e.control_progress = Progress::from_name(&s("fi_domain_attr.control_progress"));
        }
    }
    e.threading = Threading::from_name(&s("fi_domain_attr.threading"));
    e.cq_cnt = us("fi_domain_attr.cq_cnt");
    e.ep_cnt = us("fi_domain_attr.ep_cnt");
    e.mr_cnt = us("fi_domain_attr.mr_cnt");
    e.network_type = f
        .get("nic.fi_link_attr.network_type")
        .filter(|v| !v.is_empty() && v.as_str() != "(null)")
        .cloned();
    e
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ffi;

    const VERBOSE: &str = "\
---
fi_info:
    caps: [ FI_MSG, FI_RMA, FI_TAGGED ]
    mode: [ FI_RX_CQ_DATA ]
    addr_format: FI_SOCKADDR_IN
    fi_tx_attr:
        inject_size: 256
        size: 384
        iov_limit: 4
        rma_iov_limit: 1
    fi_rx_attr:
        size: 512
    fi_ep_attr:
        type: FI_EP_MSG
        protocol: FI_PROTO_IWARP
        max_msg_size: 8388608
        mem_tag_format: 0x0000000000000000
    fi_domain_attr:
        name: siw0
        threading: FI_THREAD_SAFE
        data_progress: FI_PROGRESS_MANUAL
        mr_mode: [ FI_MR_LOCAL, FI_MR_VIRT_ADDR ]
        mr_key_size: 4
        cq_data_size: 0
    fi_fabric_attr:
        name: Ethernet-iWARP
        prov_name: verbs
    nic:
        fi_link_attr:
            network_type: Ethernet
---
fi_info:
    fi_fabric_attr:
        prov_name: tcp
";

    #[test]
    fn verbose_blocks_become_entries_with_every_field() {
        let v = parse_fi_info_text(VERBOSE);
        assert_eq!(v.len(), 2);
        let e = &v[0];
        assert_eq!(e.provider, "verbs");
        assert_eq!(e.fabric, "Ethernet-iWARP");
        assert_eq!(e.domain, "siw0");
        assert_eq!(e.endpoint_type, EndpointType::Msg);
        assert_eq!(e.protocol, "FI_PROTO_IWARP");
        assert_eq!(e.cap_names(), ["FI_MSG", "FI_RMA", "FI_TAGGED"]);
        assert_eq!(e.mode, ffi::FI_RX_CQ_DATA as u64);
        assert_eq!(e.mr_mode_names(), ["FI_MR_LOCAL", "FI_MR_VIRT_ADDR"]);
        assert_eq!((e.inject_size, e.tx_size, e.rx_size), (256, 384, 512));
        assert_eq!((e.iov_limit, e.rma_iov_limit, e.mr_key_size), (4, 1, 4));
        assert_eq!(e.max_msg_size, 8 << 20);
        assert_eq!(e.data_progress, Progress::Manual);
        assert_eq!(e.threading, Threading::Safe);
        assert_eq!(e.network_type.as_deref(), Some("Ethernet"));
        assert_eq!(v[1].provider, "tcp");
    }

    #[test]
    fn libfabric_2_prints_one_progress_for_data_and_control() {
        let v2 = "fi_info:\n    mode: [  ]\n    fi_domain_attr:\n        name: lo\n        \
                  progress: FI_PROGRESS_MANUAL\n    fi_fabric_attr:\n        prov_name: tcp\n";
        let e = &parse_fi_info_text(v2)[0];
        assert_eq!(
            (e.data_progress, e.control_progress),
            (Progress::Manual, Progress::Manual)
        );
        let v1 = VERBOSE.replace(
            "data_progress: FI_PROGRESS_MANUAL",
            "control_progress: FI_PROGRESS_AUTO\n        data_progress: FI_PROGRESS_MANUAL",
        );
        let e = &parse_fi_info_text(&v1)[0];
        assert_eq!(
            (e.data_progress, e.control_progress),
            (Progress::Manual, Progress::Auto)
        );
    }

    #[test]
    fn short_forms_old_and_new_with_prompts() {
        let text = "$ ./fi_info -p verbs\nprovider: verbs\n    fabric: IB-0xfe80000000000000\n    \
                    domain: mlx5_0-dgram\n    version: 116.0\n    type: FI_EP_DGRAM\n    \
                    protocol: FI_PROTO_IB_UD\n\n[u@h lib]$ fi_info\nverbs: IB-0x80fe\n    \
                    version: 1.0\n    type: FI_EP_MSG\n    protocol: FI_PROTO_RDMA_CM_IB_RC\n";
        let v = parse_fi_info_text(text);
        assert_eq!(v.len(), 2, "{v:#?}");
        assert_eq!(v[0].provider, "verbs");
        assert_eq!(v[0].domain, "mlx5_0-dgram");
        assert_eq!(v[0].device(), "mlx5_0");
        assert_eq!(v[0].endpoint_type, EndpointType::Dgram);
        assert_eq!(v[1].fabric, "IB-0x80fe");
        assert_eq!(v[1].protocol, "FI_PROTO_RDMA_CM_IB_RC");
        assert_eq!(v[1].domain, "");
    }
}
