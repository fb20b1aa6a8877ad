//! The `atomics` tool as a user runs it: in loopback, three clients
//! increment one counter on every provider here (natively on shm and
//! sockets, emulated elsewhere, and emulated on shm by request), and the
//! server's check passes; what cannot work says why and exits non-zero.

use crate::support;

use std::process::Output;
use std::time::Duration;

/// Run with a hard limit, so a hang fails the test instead of CI.
fn run(args: &[&str]) -> Output {
    support::run_tool(env!("CARGO_BIN_EXE_atomics"), args, Duration::from_secs(180))
}

fn loopback(provider: &str, extra: &[&str], carrier: &str) {
    let mut args = vec![
        "--loopback",
        "--json",
        "-c",
        "fd",
        "-w",
        "8",
        "-I",
        "300",
        "-p",
        provider,
    ];
    args.extend_from_slice(extra);
    let o = run(&args);
    assert!(
        o.status.success(),
        "{provider} {extra:?}: exit {:?}: {}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    assert_eq!(lines.len(), 5, "header, three clients, result: {lines:?}");
    assert_eq!(lines[0]["provider"], provider);
    assert_eq!(lines[0]["atomics"]["fetch_add"], carrier, "{}", lines[0]);
    assert_eq!(lines[0]["atomics"]["compare_swap"], carrier, "{}", lines[0]);
    let result = &lines[4];
    assert_eq!(result["ok"], true, "{result}");
    assert_eq!(result["counter"], 900, "{result}");
}

#[test]
fn loopback_tcp_rxm_emulated() {
    loopback("tcp;ofi_rxm", &[], "emulated");
}

#[test]
fn loopback_net_or_tcp_rdm_emulated() {
    let provider = if fabric_msg::ffi::runtime_version() >= (1, 18) {
        "tcp"
    } else {
        "net"
    };
    loopback(provider, &["-e", "rdm"], "emulated");
}

#[test]
fn loopback_udp_rxd_emulated() {
    loopback("udp;ofi_rxd", &[], "emulated");
}

#[test]
fn loopback_sockets_native_and_emulated() {
    loopback("sockets", &[], "native");
    loopback("sockets", &["--emulated"], "emulated");
}

#[test]
fn loopback_shm_native_and_emulated() {
    loopback("shm", &[], "native");
    loopback("shm", &["--emulated"], "emulated");
}

/// tcp's connected endpoints have no atomics and no tagged messages to
/// emulate them with; --native on tcp;ofi_rxm finds no native atomics.
/// Both say so and exit 1; a bad option exits 2.
#[test]
fn what_cannot_work_says_why() {
    let o = run(&["--loopback", "-p", "tcp", "-e", "msg", "-I", "10"]);
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("cannot emulate"), "{err}");
    let o = run(&["--loopback", "-p", "tcp;ofi_rxm", "--native", "-I", "10"]);
    assert_eq!(o.status.code(), Some(1));
    let o = run(&["--loopback", "-x"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("unknown option -x"));
}
