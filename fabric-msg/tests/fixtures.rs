//! The classifier and the ladder on `fi_info` output and sysfs attributes
//! recorded on real hosts (`tests/fixtures/hosts/*/ORIGIN.md` says where each
//! came from). This is how InfiniBand, RoCE and iWARP hosts are covered on a
//! machine that has none.

use fabric_msg::discovery::classify::{classify, parse_sysfs_text, SysfsSnapshot};
use fabric_msg::discovery::info::FabricInfo;
use fabric_msg::discovery::info_text::parse_fi_info_text;
use fabric_msg::discovery::negotiate::{
    plan, Capability, EndpointChoice, ProviderFilter, Reason, Requirements,
};
use fabric_msg::{EndpointType, FabricKind, LadderConfig};
use std::path::PathBuf;

fn fixture(host: &str) -> (Vec<FabricInfo>, SysfsSnapshot) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/hosts")
        .join(host);
    let text = std::fs::read_to_string(dir.join("fi_info.txt")).unwrap_or_else(|e| panic!("{host}: {e}"));
    let sysfs = std::fs::read_to_string(dir.join("sysfs.txt"))
        .map(|t| parse_sysfs_text(&t))
        .unwrap_or_default();
    let entries = parse_fi_info_text(&text);
    assert!(!entries.is_empty(), "{host}: no entries parsed");
    (entries, sysfs)
}

fn kinds(entries: &[FabricInfo], sysfs: &SysfsSnapshot, provider_core: &str) -> Vec<FabricKind> {
    entries
        .iter()
        .filter(|e| e.core_provider() == provider_core)
        .map(|e| classify(e, sysfs).kind)
        .collect()
}

#[test]
fn soft_roce_rxe0_is_roce_with_and_without_sysfs() {
    let (entries, sysfs) = fixture("softroce-rxe0-qemu");
    assert_eq!(entries.len(), 14);
    let with = kinds(&entries, &sysfs, "verbs");
    assert!(with.iter().all(|k| *k == FabricKind::Roce), "{with:?}");
    // Without sysfs the NIC's network_type (Ethernet) still tells RoCE from
    // InfiniBand, despite the IB-0xfe80... fabric name they share.
    let without = kinds(&entries, &SysfsSnapshot::new(), "verbs");
    assert!(without.iter().all(|k| *k == FabricKind::Roce), "{without:?}");
    let c = classify(&entries[0], &sysfs);
    assert!(c.evidence.contains("link_layer Ethernet"), "{}", c.evidence);
}

#[test]
fn soft_iwarp_siw0_is_iwarp_with_and_without_sysfs() {
    let (entries, sysfs) = fixture("softiwarp-siw0-qemu");
    assert_eq!(entries.len(), 8);
    for s in [sysfs, SysfsSnapshot::new()] {
        let k = kinds(&entries, &s, "verbs");
        assert!(k.iter().all(|k| *k == FabricKind::Iwarp), "{k:?}");
    }
    // iWARP: no remote CQ data on its MSG endpoints.
    let msg = entries
        .iter()
        .find(|e| e.provider == "verbs" && e.endpoint_type == EndpointType::Msg)
        .unwrap();
    assert_eq!(msg.protocol, "FI_PROTO_IWARP");
    assert_eq!(msg.cq_data_size, 0);
}

#[test]
fn mlx5_connectx6_is_infiniband() {
    let (entries, sysfs) = fixture("mlx5-infiniband-libfabric-fi_info-man-2022");
    let verbs = kinds(&entries, &sysfs, "verbs");
    assert_eq!(verbs, [FabricKind::InfiniBand, FabricKind::InfiniBand]);
    let rxd = entries.iter().find(|e| e.provider == "verbs;ofi_rxd").unwrap();
    assert_eq!(rxd.network_type.as_deref(), Some("InfiniBand"));
    assert!(classify(rxd, &sysfs).evidence.contains("network_type InfiniBand"));
    assert_eq!(kinds(&entries, &sysfs, "tcp"), [FabricKind::Tcp]);
}

#[test]
fn truescale_qib_from_2015_is_infiniband_psm_is_other() {
    let (entries, sysfs) = fixture("qib-truescale-infiniband-ompi-users-2015");
    assert_eq!(kinds(&entries, &sysfs, "verbs"), [FabricKind::InfiniBand]);
    assert_eq!(kinds(&entries, &sysfs, "psm"), [FabricKind::Other]);
    assert!(kinds(&entries, &sysfs, "sockets")
        .iter()
        .all(|k| *k == FabricKind::Tcp));
}

#[test]
fn mlx5_bond_roce_sysfs_says_roce_over_the_ib_fabric_name() {
    // The fi_info half of this fixture is cut short in its source; its sysfs
    // (transcribed from ibv_devinfo of the same host) is whole.
    let (_, sysfs) = fixture("mlx5-bond-roce-cx6-libfabric-issue-11091-PARTIAL");
    let mut e = parse_fi_info_text(
        "fi_info:\n    fi_domain_attr:\n        name: mlx5_bond_0\n    fi_fabric_attr:\n        \
         name: IB-0xfe80000000000000\n        prov_name: verbs\n",
    )
    .remove(0);
    assert_eq!(classify(&e, &sysfs).kind, FabricKind::Roce);
    e.domain = "mlx5_bond_0-dgram".into();
    assert_eq!(classify(&e, &sysfs).kind, FabricKind::Roce);
}

#[test]
fn slingshot_usnic_and_a_host_whose_verbs_did_not_load() {
    let (cxi, s) = fixture("cxi-slingshot-libfabric-commit-2021");
    assert_eq!(kinds(&cxi, &s, "cxi"), [FabricKind::Other]);
    let (usnic, s) = fixture("usnic-cisco-libfabric-fi_info-man-2016");
    assert_eq!(kinds(&usnic, &s, "usnic"), [FabricKind::Other]);
    // Chelsio iWARP and QLogic IB cards present, but libfabric listed no
    // verbs: nothing may be invented.
    let (multi, s) = fixture("chelsio-iwarp-qlogic-ib-multinic-noverbs-ompi-users-2016");
    assert!(kinds(&multi, &s, "verbs").is_empty());
    assert!(multi.iter().all(|e| !classify(e, &s).kind.is_rdma()));
}

/// The VM host has both devices: rxe0 and siw0.
fn soft_rdma_host() -> (Vec<FabricInfo>, SysfsSnapshot) {
    let (mut a, mut sa) = fixture("softroce-rxe0-qemu");
    let (b, sb) = fixture("softiwarp-siw0-qemu");
    a.extend(b);
    sa.extend(sb);
    (a, sa)
}

#[test]
fn ladder_prefers_roce_over_iwarp_and_says_why_infiniband_was_passed() {
    let (entries, sysfs) = soft_rdma_host();
    let req = Requirements::default();
    let p = plan(
        &req,
        &LadderConfig::default(),
        &entries,
        &[],
        &sysfs,
        &[],
        (1, 17),
    );
    let first = &p.attempts[0];
    assert_eq!(first.rung, "roce via verbs;ofi_rxm (rdm)");
    assert_eq!(first.info.domain, "rxe0");
    // RoCE first, then iWARP through rxm, on 1.17 (issue 14: the early
    // failure was the locked-memory limit) as on 2.1.
    for version in [(1, 17), (2, 1)] {
        let pv = plan(
            &req,
            &LadderConfig::default(),
            &entries,
            &[],
            &sysfs,
            &[],
            version,
        );
        let rungs: Vec<(&str, &str)> = pv
            .attempts
            .iter()
            .map(|a| (a.rung.as_str(), a.info.domain.as_str()))
            .collect();
        assert_eq!(
            rungs,
            [
                ("roce via verbs;ofi_rxm (rdm)", "rxe0"),
                ("iwarp via verbs;ofi_rxm (rdm)", "siw0")
            ],
            "libfabric {version:?}"
        );
    }
    let ib = p
        .rejections
        .iter()
        .find(|r| r.rung == "infiniband via verbs;ofi_rxm (rdm)")
        .unwrap();
    match &ib.reason {
        Reason::NotPresent { detail } => {
            assert!(
                detail.contains("rxe0 is RoCE") && detail.contains("siw0 is iWARP"),
                "{detail}"
            )
        }
        other => panic!("{other:?}"),
    }
    // The plain verbs MSG endpoints lack tagged messages: a reason, not a choice.
    let msg = p
        .rejections
        .iter()
        .find(|r| r.rung == "roce via verbs (msg)")
        .unwrap();
    assert!(matches!(&msg.reason, Reason::MissingCapabilities { missing } if missing == &["FI_TAGGED"]));
}

#[test]
fn connected_endpoints_on_iwarp_when_asked_for() {
    let (entries, sysfs) = fixture("softiwarp-siw0-qemu");
    let req = Requirements {
        caps: vec![Capability::Msg, Capability::Rma],
        endpoint: EndpointChoice::Msg,
        ..Default::default()
    };
    let p = plan(
        &req,
        &LadderConfig::default(),
        &entries,
        &[],
        &sysfs,
        &[],
        (1, 17),
    );
    assert_eq!(p.attempts[0].rung, "iwarp via verbs (msg)");
    assert_eq!(
        p.attempts[0].info.inject_size, 2,
        "the tiny iWARP inject size is what the profile will obey"
    );
}

#[test]
fn configuration_and_filters_give_their_own_reasons() {
    let (entries, sysfs) = soft_rdma_host();
    let mut cfg = LadderConfig::default();
    for r in cfg.rungs.iter_mut().filter(|r| r.kind == FabricKind::Roce) {
        r.enabled = false;
    }
    let msg_only = Requirements {
        caps: vec![Capability::Msg],
        ..Default::default()
    };
    let p = plan(&msg_only, &cfg, &entries, &[], &sysfs, &[], (1, 17));
    assert_eq!(p.attempts[0].rung, "iwarp via verbs (msg)");
    assert_eq!(p.attempts[0].info.domain, "siw0");
    assert!(p
        .rejections
        .iter()
        .any(|r| r.rung.starts_with("roce") && matches!(r.reason, Reason::DisabledInConfig { .. })));

    let filter = ProviderFilter::from_fi_provider("^verbs");
    let p = plan(
        &Requirements::default(),
        &LadderConfig::default(),
        &entries,
        &[],
        &sysfs,
        &[filter],
        (1, 17),
    );
    assert!(p.attempts.is_empty(), "only verbs entries in this fixture");
    assert!(p.rejections.iter().any(|r| r.rung == "roce via verbs;ofi_rxm (rdm)"
        && matches!(&r.reason, Reason::ExcludedByProviderFilter { filter } if filter == "FI_PROVIDER=^verbs")));

    let req = Requirements {
        domain: Some("mlx5_0".into()),
        ..Default::default()
    };
    let p = plan(
        &req,
        &LadderConfig::default(),
        &entries,
        &[],
        &sysfs,
        &[],
        (1, 17),
    );
    assert!(p.attempts.is_empty());
    assert!(p
        .rejections
        .iter()
        .any(|r| matches!(&r.reason, Reason::OtherDomain { wanted } if wanted == "mlx5_0")));
}

#[test]
fn a_provider_visible_only_with_an_unsupported_mr_mode_is_named() {
    let (entries, sysfs) = fixture("softroce-rxe0-qemu");
    let mut hidden: Vec<FabricInfo> = entries.clone();
    for h in &mut hidden {
        h.mr_mode |= fabric_msg::ffi::FI_MR_HMEM as u64;
    }
    let p = plan(
        &Requirements::default(),
        &LadderConfig::default(),
        &[],
        &hidden,
        &sysfs,
        &[],
        (1, 17),
    );
    let r = p
        .rejections
        .iter()
        .find(|r| r.rung == "roce via verbs;ofi_rxm (rdm)")
        .unwrap();
    assert_eq!(
        r.reason,
        Reason::UnsupportedMrMode {
            bits: vec!["FI_MR_HMEM".into()]
        }
    );
    assert!(r
        .to_string()
        .contains("requires mr_mode FI_MR_HMEM which fabric-msg does not handle"));
}

#[test]
fn a_custom_ladder_can_use_rxd_on_infiniband() {
    let (entries, sysfs) = fixture("mlx5-infiniband-libfabric-fi_info-man-2022");
    let cfg = LadderConfig::parse(
        "version = 1\n[[rung]]\nkind = \"infiniband\"\nprovider = \"verbs;ofi_rxd\"\nendpoint = \"rdm\"\n",
        "test",
    )
    .unwrap();
    let req = Requirements {
        caps: vec![Capability::Tagged, Capability::Atomic],
        ..Default::default()
    };
    let p = plan(&req, &cfg, &entries, &[], &sysfs, &[], (1, 17));
    assert_eq!(p.attempts.len(), 1, "{:?}", p.rejections);
    assert_eq!(p.attempts[0].info.domain, "mlx5_0-dgram");
}

#[test]
fn tcp_rdm_waits_for_libfabric_1_19_and_the_reason_says_why() {
    // tcp's own RDM endpoints (the former `net`) as libfabric 2.1 lists them.
    let (host, _) = fixture("trixie-libfabric-2.1-host");
    let entries: Vec<FabricInfo> = host
        .into_iter()
        .filter(|e| e.domain == "lo" && e.provider.starts_with("tcp"))
        .collect();
    let sysfs = SysfsSnapshot::new();
    let plan_on = |version| {
        plan(
            &Requirements::default(),
            &LadderConfig::default(),
            &entries,
            &[],
            &sysfs,
            &[],
            version,
        )
    };
    let old = plan_on((1, 18));
    assert_eq!(old.attempts[0].info.provider, "tcp;ofi_rxm");
    let why = old
        .rejections
        .iter()
        .find(|r| r.rung == "tcp via tcp (rdm)")
        .unwrap()
        .to_string();
    assert!(
        why.contains("needs libfabric 1.19, this is 1.18") && why.contains("truncated receive"),
        "{why}"
    );
    let new = plan_on((2, 1));
    assert_eq!(new.attempts[0].info.provider, "tcp");
    assert_eq!(new.attempts[0].info.endpoint_type, EndpointType::Rdm);
    assert_eq!(new.attempts[1].info.provider, "tcp;ofi_rxm");
}

/// What each libfabric lists for its software providers on this project's
/// CI host: bookworm's 1.17 and trixie's 2.1 (ORIGIN.md beside each).
fn software_host(version: &str) -> Vec<FabricInfo> {
    fixture(&format!("{version}-host")).0
}

#[test]
fn software_providers_of_1_17_and_2_1_are_classified_alike() {
    for (dump, providers) in [
        (
            "bookworm-libfabric-1.17",
            &[
                "net",
                "net;ofi_rxm",
                "shm",
                "sockets",
                "tcp",
                "tcp;ofi_rxm",
                "udp",
                "udp;ofi_rxd",
            ][..],
        ),
        (
            "trixie-libfabric-2.1",
            &[
                "shm",
                "sm2",
                "sockets",
                "tcp",
                "tcp;ofi_rxm",
                "udp",
                "udp;ofi_rxd",
            ][..],
        ),
    ] {
        let entries = software_host(dump);
        let mut seen: Vec<&str> = entries.iter().map(|e| e.provider.as_str()).collect();
        seen.sort();
        seen.dedup();
        assert_eq!(seen, providers, "{dump}");
        for e in &entries {
            let want = match e.core_provider() {
                "tcp" | "net" | "sockets" => FabricKind::Tcp,
                "shm" | "sm2" => FabricKind::Shm,
                "udp" => FabricKind::Udp,
                other => panic!("{dump}: unexpected provider {other}"),
            };
            let c = classify(e, &SysfsSnapshot::new());
            assert_eq!(
                c.kind, want,
                "{dump}: {} on {}: {}",
                e.provider, e.domain, c.evidence
            );
        }
    }
}

#[test]
fn progress_of_both_series_is_read_from_their_dumps() {
    use fabric_msg::discovery::info::Progress;
    // 1.17 prints data_progress and control_progress; 2.x one `progress`.
    let shm = |dump| {
        software_host(dump)
            .into_iter()
            .find(|e| e.provider == "shm")
            .unwrap()
    };
    let old = shm("bookworm-libfabric-1.17");
    assert_eq!(
        (old.data_progress, old.control_progress),
        (Progress::Manual, Progress::Auto)
    );
    let new = shm("trixie-libfabric-2.1");
    assert_eq!(
        (new.data_progress, new.control_progress),
        (Progress::Manual, Progress::Manual)
    );
    // 2.1's tcp RDM endpoints: the former net, with no atomics any more.
    let tcp = software_host("trixie-libfabric-2.1")
        .into_iter()
        .find(|e| e.provider == "tcp" && e.endpoint_type == EndpointType::Rdm)
        .unwrap();
    assert_eq!(tcp.protocol, "FI_PROTO_XNET");
    assert!(
        !tcp.cap_names().iter().any(|c| c == "FI_ATOMIC"),
        "{:?}",
        tcp.cap_names()
    );
}

#[test]
fn the_ladder_on_each_host_picks_what_its_libfabric_does_best() {
    let sysfs = SysfsSnapshot::new();
    let on = |dump: &str, version, same_host| {
        let entries = software_host(dump);
        let req = Requirements {
            same_host,
            domain: (!same_host).then(|| "lo".to_string()),
            ..Default::default()
        };
        plan(
            &req,
            &LadderConfig::default(),
            &entries,
            &[],
            &sysfs,
            &[],
            version,
        )
    };
    let old = on("bookworm-libfabric-1.17", (1, 17), false);
    assert_eq!(old.attempts[0].info.provider, "tcp;ofi_rxm");
    assert!(old
        .rejections
        .iter()
        .any(|r| r.rung == "tcp via tcp (rdm)" && matches!(r.reason, Reason::NeedsNewerLibfabric { .. })));
    let new = on("trixie-libfabric-2.1", (2, 1), false);
    assert_eq!(new.attempts[0].info.provider, "tcp");
    assert_eq!(new.attempts[0].info.endpoint_type, EndpointType::Rdm);
    for (dump, version) in [
        ("bookworm-libfabric-1.17", (1, 17)),
        ("trixie-libfabric-2.1", (2, 1)),
    ] {
        let p = on(dump, version, true);
        assert_eq!(p.attempts[0].info.provider, "shm", "{dump}");
    }
}

#[test]
fn soft_roce_and_soft_iwarp_are_told_apart_on_libfabric_2_1_too() {
    for (suffix, version) in [("", (1, 17)), ("-libfabric-2.1", (2, 1))] {
        let (rxe, rxe_sysfs) = fixture(&format!("softroce-rxe0-qemu{suffix}"));
        let (siw, siw_sysfs) = fixture(&format!("softiwarp-siw0-qemu{suffix}"));
        assert_eq!((rxe.len(), siw.len()), (14, 8), "{suffix}");
        // With sysfs and without it (a dump alone), on both versions.
        for sysfs in [rxe_sysfs.clone(), SysfsSnapshot::new()] {
            let k = kinds(&rxe, &sysfs, "verbs");
            assert!(k.iter().all(|k| *k == FabricKind::Roce), "{suffix}: {k:?}");
        }
        for sysfs in [siw_sysfs.clone(), SysfsSnapshot::new()] {
            let k = kinds(&siw, &sysfs, "verbs");
            assert!(k.iter().all(|k| *k == FabricKind::Iwarp), "{suffix}: {k:?}");
        }
        // Both dumps, as the VM has both devices: RoCE first; iWARP's rxm
        // rung only from 2.1.
        let (mut all, mut sysfs) = (rxe, rxe_sysfs);
        all.extend(siw);
        sysfs.extend(siw_sysfs);
        let p = plan(
            &Requirements::default(),
            &LadderConfig::default(),
            &all,
            &[],
            &sysfs,
            &[],
            version,
        );
        let chosen: Vec<&str> = p.attempts.iter().map(|a| a.info.domain.as_str()).collect();
        // rxm over iWARP is a rung on both (issue 14).
        assert_eq!(chosen, ["rxe0", "siw0"], "{suffix}");
        // iWARP stays without remote CQ data on 2.1.
        let msg = all
            .iter()
            .find(|e| e.domain == "siw0" && e.endpoint_type == EndpointType::Msg)
            .unwrap();
        assert_eq!((msg.protocol.as_str(), msg.cq_data_size), ("FI_PROTO_IWARP", 0));
    }
}
