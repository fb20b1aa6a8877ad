//! Negotiation against the libfabric providers this machine really has
//! (tcp, tcp;ofi_rxm, shm, sockets, udp;ofi_rxd; `net` on libfabric 1.17,
//! tcp's own RDM endpoints from 1.18): every candidate is
//! opened for real (fabric, domain, CQ, AV or EQ, endpoint, enable).
//!
//! FI_PROVIDER is read by libfabric once per process, so the tests that set
//! it run `fabric_info` as a child process (examples/tests/fabric_info.rs).

use fabric_msg::discovery::negotiate::{Capability, EndpointChoice, Reason, Requirements};
use fabric_msg::{negotiate, Error, FabricKind, LadderConfig};

fn only(provider: &str, caps: &[Capability], endpoint: EndpointChoice) -> Requirements {
    Requirements {
        provider: Some(provider.into()),
        caps: caps.to_vec(),
        endpoint,
        same_host: provider == "shm",
        ..Default::default()
    }
}

#[test]
fn default_requirements_get_a_tcp_fabric_with_reasons_for_the_rest() {
    let n = negotiate(&Requirements::default(), &LadderConfig::default())
        .expect("a TCP provider exists on every host");
    let p = &n.profile;
    assert_eq!(p.fabric_kind, FabricKind::Tcp);
    // tcp's own RDM endpoints are the first TCP rung but need libfabric
    // 1.19 (bookworm ships 1.17, trixie 2.1).
    let new_enough = fabric_msg::ffi::runtime_version() >= (1, 19);
    let expected = if new_enough { "tcp" } else { "tcp;ofi_rxm" };
    assert_eq!(p.provider, expected);
    assert_eq!(p.endpoint_type, fabric_msg::EndpointType::Rdm);
    if !new_enough {
        let r = n
            .rejections
            .iter()
            .find(|r| r.rung == "tcp via tcp (rdm)")
            .unwrap();
        assert!(matches!(r.reason, Reason::NeedsNewerLibfabric { .. }), "{r}");
    }
    assert!(p.caps_granted.iter().any(|c| c == "FI_TAGGED"));
    assert!(p.tag_bits > 0 && p.inject_size > 0 && p.max_msg_size > 0);
    assert!(p.queues.cq >= p.queues.tx, "{:?}", p.queues);
    // Every RDMA rung is explained; this host has no RDMA device.
    for kind in ["infiniband", "roce", "iwarp"] {
        let r = n.rejections.iter().find(|r| r.rung.starts_with(kind)).unwrap();
        assert!(matches!(r.reason, Reason::NotPresent { .. }), "{r}");
    }
    let shm = n.rejections.iter().find(|r| r.rung.starts_with("shm")).unwrap();
    assert_eq!(shm.reason, Reason::PeersMayBeRemote);
    // Candidates are classified.
    assert!(n
        .candidates
        .iter()
        .any(|c| c.info.provider == "shm" && c.class.kind == FabricKind::Shm));
    assert!(n
        .candidates
        .iter()
        .any(|c| c.info.provider == "udp;ofi_rxd" && c.class.kind == FabricKind::Udp));
}

#[test]
fn each_software_provider_negotiates_and_opens() {
    use Capability::*;
    let mut cases: Vec<(&str, &[Capability], EndpointChoice, FabricKind)> = vec![
        ("tcp", &[Msg], EndpointChoice::Msg, FabricKind::Tcp),
        (
            "tcp;ofi_rxm",
            &[Tagged, Msg, Rma],
            EndpointChoice::Rdm,
            FabricKind::Tcp,
        ),
        (
            "shm",
            &[Tagged, Msg, Rma, Atomic],
            EndpointChoice::Rdm,
            FabricKind::Shm,
        ),
        (
            "sockets",
            &[Tagged, Msg, Atomic],
            EndpointChoice::Rdm,
            FabricKind::Tcp,
        ),
        // Its atomics crash the target (providers.toml: atomics_broken).
        (
            "udp;ofi_rxd",
            &[Tagged, Msg, Rma],
            EndpointChoice::Rdm,
            FabricKind::Udp,
        ),
    ];
    // `net` became tcp's own RDM endpoints in libfabric 1.18.
    if fabric_msg::ffi::runtime_version() >= (1, 18) {
        cases.push(("tcp", &[Tagged, Msg, Rma], EndpointChoice::Rdm, FabricKind::Tcp));
    } else {
        cases.push(("net", &[Tagged, Msg, Rma], EndpointChoice::Rdm, FabricKind::Tcp));
    }
    for (prov, caps, ep, kind) in cases {
        let n = negotiate(&only(prov, caps, ep), &LadderConfig::default())
            .unwrap_or_else(|e| panic!("{prov}: {e}"));
        assert_eq!(n.profile.provider, prov);
        assert_eq!(n.profile.fabric_kind, kind, "{prov}");
        if caps.contains(&Atomic) {
            let ops: Vec<&str> = n.profile.atomics.iter().map(|a| a.op.as_str()).collect();
            assert!(
                ops.contains(&"FI_SUM") && ops.contains(&"FI_CSWAP"),
                "{prov}: {ops:?}"
            );
        }
    }
}

/// With the default `AtomicPolicy::Auto`, asking for atomics does not
/// change the fabric: the ladder picks what it picks without them, and
/// the profile says how atomics are carried there.
#[test]
fn atomics_do_not_decide_the_fabric() {
    let without = Requirements {
        caps: vec![Capability::Tagged, Capability::Msg],
        ..Default::default()
    };
    let with = Requirements {
        caps: vec![Capability::Tagged, Capability::Msg, Capability::Atomic],
        ..Default::default()
    };
    let a = negotiate(&without, &LadderConfig::default()).unwrap().profile;
    let b = negotiate(&with, &LadderConfig::default()).unwrap().profile;
    assert_eq!((&a.provider, &a.domain), (&b.provider, &b.domain));
    assert_ne!(b.provider, "sockets", "atomics no longer push to the slow rung");
    for op in fabric_msg::AtomicKind::ALL {
        assert!(b.atomic_carrier(op).is_some(), "{}: {op}", b.provider);
    }
}

/// Atomics over connected (MSG) endpoints without native ones: fabric-msg
/// cannot emulate there (no tagged messages), and says so.
#[test]
fn emulated_atomics_over_msg_endpoints_are_a_clear_error() {
    let req = Requirements {
        caps: vec![Capability::Msg, Capability::Atomic],
        endpoint: EndpointChoice::Msg,
        provider: Some("tcp".into()),
        domain: Some("lo".into()),
        ..Default::default()
    };
    let e = negotiate(&req, &LadderConfig::default()).unwrap_err().to_string();
    assert!(e.contains("cannot emulate") && e.contains("msg"), "{e}");
}

#[test]
fn atomics_skip_net_which_lists_them_but_implements_none() {
    let req = Requirements {
        caps: vec![Capability::Tagged, Capability::Atomic],
        atomics: fabric_msg::AtomicPolicy::Native,
        ..Default::default()
    };
    let n = negotiate(&req, &LadderConfig::default()).unwrap();
    assert_ne!(n.profile.provider, "net");
    assert!(!n.profile.atomics.is_empty());
    if fabric_msg::ffi::runtime_version() >= (1, 18) {
        // From 1.18 tcp (which absorbed net) no longer lists FI_ATOMIC.
        let only_tcp = Requirements {
            provider: Some("tcp".into()),
            endpoint: EndpointChoice::Rdm,
            ..req
        };
        let e = negotiate(&only_tcp, &LadderConfig::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("lacks required capabilities FI_ATOMIC"), "{e}");
        return;
    }
    // net lists FI_ATOMIC; asked for by name it is opened and found wanting.
    let only_net = Requirements {
        provider: Some("net".into()),
        ..req
    };
    let e = negotiate(&only_net, &LadderConfig::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("fi_atomicvalid accepts no u64 operation"), "{e}");
}

#[test]
fn same_host_peers_get_shared_memory() {
    let req = Requirements {
        same_host: true,
        ..Default::default()
    };
    let n = negotiate(&req, &LadderConfig::default()).unwrap();
    assert_eq!(n.profile.provider, "shm");
    assert_eq!(n.profile.fabric_kind, FabricKind::Shm);
}

#[test]
fn a_capability_no_provider_has_is_a_clear_error() {
    // tcp's connected endpoints with native atomics: they have none.
    // (sockets' MSG endpoints do, validated on an unconnected endpoint and
    // exact under `atomics -e msg -p sockets`.)
    let req = Requirements {
        caps: vec![Capability::Atomic],
        endpoint: EndpointChoice::Msg,
        provider: Some("tcp".into()),
        atomics: fabric_msg::AtomicPolicy::Native,
        ..Default::default()
    };
    match negotiate(&req, &LadderConfig::default()) {
        Err(Error::NoFabric { wanted, reasons }) => {
            assert!(wanted.contains("atomic") && wanted.contains("msg"), "{wanted}");
            assert!(
                reasons
                    .iter()
                    .any(|r| matches!(&r.reason, Reason::MissingCapabilities { missing }
                if missing.contains(&"FI_ATOMIC".to_string()))),
                "{reasons:?}"
            );
            let text = Error::NoFabric { wanted, reasons }.to_string();
            assert!(text.contains("lacks required capabilities FI_ATOMIC"), "{text}");
        }
        other => panic!("expected NoFabric, got {other:?}"),
    }
}

#[test]
fn an_absent_provider_or_domain_names_what_to_change() {
    let req = Requirements {
        provider: Some("verbs".into()),
        ..Default::default()
    };
    let e = negotiate(&req, &LadderConfig::default()).unwrap_err();
    let text = e.to_string();
    assert!(matches!(e, Error::ProviderNotAvailable { .. }), "{text}");
    assert!(text.contains("-p verbs") && text.contains("tcp"), "{text}");

    let req = Requirements {
        domain: Some("no-such-nic0".into()),
        ..Default::default()
    };
    let text = negotiate(&req, &LadderConfig::default()).unwrap_err().to_string();
    assert!(text.contains("not on domain `no-such-nic0`"), "{text}");
}

#[test]
fn profiles_of_two_negotiations_on_one_host_agree() {
    let a = negotiate(&Requirements::default(), &LadderConfig::default()).unwrap();
    let b = negotiate(&Requirements::default(), &LadderConfig::default()).unwrap();
    let bytes = a.profile.wire().encode().unwrap();
    let remote = fabric_msg::discovery::profile::WireProfile::decode(&bytes).unwrap();
    fabric_msg::discovery::profile::check_peer(&b.profile.wire(), &remote)
        .expect("same host, same ladder: compatible");

    let shm = negotiate(
        &Requirements {
            same_host: true,
            ..Default::default()
        },
        &LadderConfig::default(),
    )
    .unwrap();
    let e = fabric_msg::discovery::profile::check_peer(&a.profile.wire(), &shm.profile.wire())
        .unwrap_err()
        .to_string();
    let provider = format!("`{}`", a.profile.provider);
    assert!(e.contains(&provider) && e.contains("`shm`"), "{e}");
}

/// The built-in ladder has sockets' progress thread sleep as soon as it
/// finds no more work (`FI_SOCKETS_PE_WAITTIME=0`, providers.toml): by
/// default it spins 10 ms first, and beside a spinning loop on a 2-core
/// machine a message then took about 5 ms (docs/decisions.md, "sockets'
/// progress thread"). Negotiation sets it before libfabric opens a
/// sockets fabric, where sockets reads it, unless the user set it.
#[test]
fn sockets_progress_thread_is_told_not_to_spin_beside_the_loop() {
    let n = negotiate(
        &only(
            "sockets",
            &[Capability::Tagged, Capability::Msg],
            EndpointChoice::Rdm,
        ),
        &LadderConfig::default(),
    )
    .expect("sockets negotiates");
    let e = n
        .environment
        .iter()
        .find(|e| e.name == "FI_SOCKETS_PE_WAITTIME")
        .unwrap_or_else(|| panic!("not in the environment negotiation reports: {:?}", n.environment));
    assert_eq!(
        std::env::var("FI_SOCKETS_PE_WAITTIME").as_deref(),
        Ok(e.value.as_str()),
        "what is reported is what libfabric reads"
    );
    if e.origin != "set by the user" {
        assert_eq!(e.value, "0", "{e:?}");
        assert!(e.origin.contains("[provider.\"sockets\"]"), "{e:?}");
    }
}
