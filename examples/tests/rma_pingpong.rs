//! `rma_pingpong` as a user runs it: RMA-write ping-pongs and RMA reads
//! (`-o read`) in loopback on live providers with every byte checked, in
//! both memory modes, and bad arguments refused.

use crate::support;

use std::process::Output;
use std::time::Duration;

/// Run with a hard limit, so a hang fails the test instead of CI.
fn run(args: &[&str]) -> Output {
    support::run_tool(env!("CARGO_BIN_EXE_rma_pingpong"), args, Duration::from_secs(60))
}

fn json_lines(o: &Output) -> Vec<serde_json::Value> {
    assert!(
        o.status.success(),
        "exit {:?}: {}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

/// 1 B, 64 KiB and 1 MiB (one run each: the tool takes one size or all).
fn loopback_sizes(provider: &str, mode: &str) {
    let mut all = Vec::new();
    for s in ["1", "65536", "1048576"] {
        let lines = json_lines(&run(&[
            "--loopback",
            "--verify",
            "--json",
            "-p",
            provider,
            "-I",
            "20",
            "-W",
            "2",
            "-S",
            s,
            "--mr",
            mode,
        ]));
        assert_eq!(lines[0]["provider"], provider, "{lines:?}");
        assert_eq!(lines[0]["mr"], mode);
        assert_eq!(lines[1]["iters"], 20);
        support::assert_tail(&lines[1], Some("usec_per_xfer"));
        all.push(lines[1]["bytes"].as_u64().unwrap());
    }
    assert_eq!(all, [1, 65536, 1 << 20]);
}

#[test]
fn tcp_rxm_pooled_and_registered_per_write() {
    loopback_sizes("tcp;ofi_rxm", "pool");
    loopback_sizes("tcp;ofi_rxm", "each");
}

#[test]
fn shm() {
    loopback_sizes("shm", "pool");
}

#[test]
fn tcp_msg_endpoints() {
    let lines = json_lines(&run(&[
        "--loopback",
        "--verify",
        "--json",
        "-p",
        "tcp",
        "-e",
        "msg",
        "-I",
        "10",
        "-S",
        "4096",
    ]));
    assert_eq!(
        (lines[0]["provider"].as_str(), lines[0]["endpoint_type"].as_str()),
        (Some("tcp"), Some("msg"))
    );
}

/// `-o read`: the client reads the server's memory, every byte checked,
/// on RDM and connected endpoints.
#[test]
fn reads_on_rdm_and_msg() {
    for args in [
        &["-p", "tcp;ofi_rxm"][..],
        &["-p", "shm"],
        &["-p", "tcp", "-e", "msg"],
    ] {
        let mut all = vec![
            "--loopback",
            "--verify",
            "--json",
            "-o",
            "read",
            "-I",
            "10",
            "-S",
            "1,4097,1048576",
        ];
        all.extend_from_slice(args);
        let lines = json_lines(&run(&all));
        assert_eq!(lines[0]["op"], "read", "{lines:?}");
        let sizes: Vec<_> = lines[1..].iter().map(|l| l["bytes"].as_u64().unwrap()).collect();
        assert_eq!(sizes, [1, 4097, 1 << 20], "{args:?}");
        assert!(lines[1..].iter().all(|l| l["iters"] == 10), "{lines:?}");
    }
}

#[test]
fn bad_arguments_are_refused_with_a_reason() {
    for (args, says) in [
        (&["-S", "0"][..], "at least 1 byte"),
        (&["--mr", "sometimes"][..], "expected pool or each"),
        (&["-o", "swap"][..], "expected write or read"),
        (&["--bogus"][..], "unknown option"),
        (&["--loopback", "-p", "nosuch"][..], "nosuch"),
    ] {
        let o = run(args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{args:?} succeeded");
        assert!(err.contains(says), "{args:?}: {err}");
    }
}

/// Reads from a busy target (`--idle-ms`: it polls every 200 ms) served
/// by its progress thread (`--progress-us`): 20 reads take far less than
/// one of its polls each, every byte checked, and the header says so.
#[test]
fn reads_from_a_busy_target_with_a_progress_thread() {
    let started = std::time::Instant::now();
    let lines = json_lines(&run(&[
        "--loopback",
        "--verify",
        "--json",
        "-p",
        "tcp;ofi_rxm",
        "-o",
        "read",
        "--idle-ms",
        "200",
        "--progress-us",
        "100",
        "-I",
        "20",
        "-W",
        "2",
        "-S",
        "4096",
    ]));
    assert_eq!(lines[0]["progress_us"], 100, "{lines:?}");
    let usec = lines[1]["usec_per_xfer"].as_f64().unwrap();
    assert!(
        usec < 50_000.0,
        "{usec} µs per read: the thread did not serve them"
    );
    assert!(started.elapsed() < Duration::from_secs(30));
}
