//! `fabric_info` as a user runs it: separate processes, because libfabric
//! reads FI_PROVIDER and its other variables once per process.

use std::process::{Command, Output};

fn run(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_fabric_info"));
    cmd.args(args)
        .env_remove("FI_PROVIDER")
        .env_remove("FABRIC_MSG_PROVIDERS");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("fabric_info runs")
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

fn json(o: &Output) -> serde_json::Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {}", text(o).0))
}

#[test]
fn default_run_shows_candidates_ladder_and_profile() {
    let o = run(&[], &[]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    for section in [
        "candidates libfabric lists:",
        "ladder:",
        "profile:",
        "chosen  tcp via ",
    ] {
        assert!(out.contains(section), "missing {section:?} in\n{out}");
    }
    assert!(
        out.contains("roce via verbs;ofi_rxm (rdm): not present on this host"),
        "{out}"
    );
}

#[test]
fn json_output_has_the_profile_and_reasons() {
    let o = run(&["--json", "-c", "tagged,rma"], &[]);
    assert!(o.status.success(), "{}", text(&o).1);
    let v = json(&o);
    let p = &v["negotiation"]["profile"];
    assert_eq!(p["fabric_kind"], "tcp");
    assert!(p["caps_granted"]
        .as_array()
        .unwrap()
        .iter()
        .any(|c| c == "FI_RMA"));
    assert!(v["negotiation"]["rejections"].as_array().unwrap().len() > 3);
    // tcp lets the application choose keys: fabric-msg's are random, 64 bits.
    assert_eq!(p["remote_protection"]["kind"], "random_key", "{p}");
    assert_eq!(p["remote_protection"]["bits"], 64, "{p}");
}

/// shm before libfabric 2.1 checks no keys, and `fabric_info` says so;
/// from 2.1 it checks them at the target (`tests/forged_keys.rs`), and the
/// row names fabric-msg's random keys.
#[test]
fn shm_says_how_remote_access_is_guarded() {
    let o = run(&["-c", "tagged,rma"], &[("FI_PROVIDER", "shm")]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let row = out
        .lines()
        .find(|l| l.trim_start().starts_with("remote access"))
        .unwrap_or_else(|| panic!("no remote access row in\n{out}"));
    if fabric_msg::ffi::runtime_version() >= (2, 1) {
        assert!(row.contains("random 64-bit key per region"), "{row}");
    } else {
        assert!(row.contains("none: shm") && row.contains("same user"), "{row}");
    }
}

/// shm before libfabric 1.19 matches masked tagged receives wrongly
/// against messages that arrived first (docs/reliability.md): the text
/// says so and the JSON profile names it; from 1.19 neither does.
#[test]
fn shm_says_whether_tag_masks_are_reliable() {
    let o = run(&["-c", "tagged"], &[("FI_PROVIDER", "shm")]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let row = out.lines().find(|l| l.trim_start().starts_with("tag masks"));
    let j = run(&["-c", "tagged", "--json"], &[("FI_PROVIDER", "shm")]);
    let defect = &json(&j)["negotiation"]["profile"]["tag_mask_defect"];
    if fabric_msg::ffi::runtime_version() >= (1, 19) {
        assert_eq!(row, None, "{out}");
        assert!(defect.is_null(), "{defect}");
    } else {
        let row = row.unwrap_or_else(|| panic!("no tag masks row in\n{out}"));
        assert!(
            row.contains("NOT RELIABLE") && row.contains("ignore mask"),
            "{row}"
        );
        assert!(defect.as_str().is_some_and(|d| d.contains("1.19")), "{defect}");
    }
}

#[test]
fn fi_provider_is_honoured_and_wins() {
    let o = run(&["--json"], &[("FI_PROVIDER", "tcp")]);
    assert!(o.status.success(), "{}", text(&o).1);
    let v = json(&o);
    assert_eq!(
        v["negotiation"]["profile"]["provider"],
        best_tcp(),
        "FI_PROVIDER=tcp admits tcp and tcp;ofi_rxm"
    );
    let reasons = v["negotiation"]["rejections"].as_array().unwrap();
    assert!(
        reasons
            .iter()
            .any(|r| r["rung"] == "udp via udp;ofi_rxd (rdm)" && r["reason"]["filter"] == "FI_PROVIDER=tcp"),
        "{reasons:?}"
    );

    // A provider the ladder does not list is still used when the user names it.
    let o = run(&["--json", "-c", "tagged"], &[("FI_PROVIDER", "udp")]);
    assert!(o.status.success(), "{}", text(&o).1);
    assert_eq!(json(&o)["negotiation"]["profile"]["provider"], "udp;ofi_rxd");
}

#[test]
fn fi_provider_naming_an_absent_provider_says_what_to_change() {
    let o = run(&[], &[("FI_PROVIDER", "verbs")]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        err.contains("FI_PROVIDER=verbs") && err.contains("unset FI_PROVIDER"),
        "{err}"
    );
}

#[test]
fn a_malformed_ladder_names_the_line_and_key() {
    let dir = std::env::temp_dir().join(format!("fabric-info-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("bad.toml");
    std::fs::write(
        &bad,
        "version = 1\n\n[[rung]]\nkind = \"tcp\"\nprovider = \"tcp\"\nendpont = \"msg\"\n",
    )
    .unwrap();
    let o = run(&[], &[("FABRIC_MSG_PROVIDERS", bad.to_str().unwrap())]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        err.contains("bad.toml: line 6") && err.contains("endpont"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn provider_settings_reach_the_environment_unless_the_user_set_them() {
    let dir = std::env::temp_dir().join(format!("fabric-info-env-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("providers.toml");
    std::fs::write(
        &cfg,
        "version = 1\n[[rung]]\nkind = \"tcp\"\nprovider = \"tcp;ofi_rxm\"\nendpoint = \"rdm\"\n\
         [provider.\"tcp;ofi_rxm\".env]\nFI_OFI_RXM_BUFFER_SIZE = \"32768\"\n",
    )
    .unwrap();
    let path = cfg.to_str().unwrap();
    let o = run(&["--json", "--providers", path], &[]);
    assert!(o.status.success(), "{}", text(&o).1);
    let env = json(&o)["negotiation"]["environment"].clone();
    assert_eq!(env[0]["name"], "FI_OFI_RXM_BUFFER_SIZE");
    assert_eq!(env[0]["value"], "32768");
    assert!(
        env[0]["origin"]
            .as_str()
            .unwrap()
            .contains("[provider.\"tcp;ofi_rxm\"]"),
        "{env}"
    );

    let o = run(
        &["--json", "--providers", path],
        &[("FI_OFI_RXM_BUFFER_SIZE", "16384")],
    );
    let env = json(&o)["negotiation"]["environment"].clone();
    assert_eq!(env[0]["value"], "16384");
    assert_eq!(env[0]["origin"], "set by the user");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn impossible_requirements_exit_non_zero_with_every_reason() {
    let o = run(
        &["-p", "tcp", "-e", "msg", "-c", "atomic", "--atomics", "native"],
        &[],
    );
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        err.contains("no usable fabric") && err.contains("lacks required capabilities FI_ATOMIC"),
        "{err}"
    );
    // Without native atomics, connected endpoints cannot carry them either
    // (sockets' connected endpoints have native ones).
    let o = run(&["-p", "tcp", "-e", "msg", "-c", "atomic"], &[]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(1));
    assert!(err.contains("cannot emulate"), "{err}");
    let o = run(&["--caps", "telepathy"], &[]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o).1.contains("unknown capability `telepathy`"));
}

/// The provider of the first TCP rung this libfabric reaches
/// (providers.toml): tcp's own RDM endpoints from 1.19, `tcp;ofi_rxm` before.
fn best_tcp() -> &'static str {
    if fabric_msg::ffi::runtime_version() >= (1, 19) {
        "tcp"
    } else {
        "tcp;ofi_rxm"
    }
}

/// Atomics do not move the ladder's choice, and fabric_info shows how each
/// operation is carried, in text and JSON: emulated on the TCP rung,
/// native on sockets, and emulated on sockets when asked.
#[test]
fn atomics_carriers_are_shown() {
    let o = run(&["--json", "-c", "tagged,msg,atomic"], &[]);
    assert!(o.status.success(), "{}", text(&o).1);
    let v = json(&o);
    assert_eq!(
        v["negotiation"]["profile"]["provider"],
        best_tcp(),
        "the TCP rung, not sockets"
    );
    assert_eq!(
        v["atomics"]["carriers"]["fetch_add"], "emulated",
        "{}",
        v["atomics"]
    );
    assert_eq!(v["atomics"]["carriers"]["compare_swap"], "emulated");
    let o = run(&["-p", "sockets", "-e", "rdm", "-c", "tagged,msg,atomic"], &[]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(
        out.contains("atomics carried") && out.contains("fetch_add=native"),
        "{out}"
    );
    let o = run(
        &[
            "--json",
            "-p",
            "sockets",
            "-e",
            "rdm",
            "-c",
            "tagged,msg,atomic",
            "--atomics",
            "emulated",
        ],
        &[],
    );
    assert!(o.status.success(), "{}", text(&o).1);
    assert_eq!(json(&o)["atomics"]["carriers"]["read"], "emulated");
}
