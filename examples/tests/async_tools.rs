//! The async examples (`fabric_msg::async_loop`, the `tokio` feature):
//! `async_pingpong --loopback` measures every size it is given, with the
//! loops sleeping on their wait fd (`-c fd`) or polled (`-c spin`, and shm,
//! which has no fd); `async_rma_pingpong --loopback` measures RMA writes
//! with notices and reads through the adapter, every byte checked;
//! `async_server` serves many peers at once, one task each, and gives up
//! the one that goes silent; `async_floor` times a hand-off between two
//! tasks with no fabric at all.

use std::process::Command;

fn run(tool: &str, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(tool)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{tool}: {e}"));
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A tool's `--json` output (`what` names the run): one row per size of
/// `sizes`, in order, each with `iters` iterations, a positive time and
/// percentiles.
fn check_rows(out: &str, what: &str, sizes: &[u64], iters: u64) {
    let rows: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{what}: {e}: {l}")))
        .filter(|v: &serde_json::Value| v.get("bytes").is_some())
        .collect();
    let got: Vec<u64> = rows.iter().map(|r| r["bytes"].as_u64().unwrap()).collect();
    assert_eq!(got, sizes, "{what}: {out}");
    for r in &rows {
        assert_eq!(r["iters"].as_u64(), Some(iters), "{what}: {r}");
        let us = r["usec_per_xfer"].as_f64().unwrap();
        assert!(us > 0.0 && us.is_finite(), "{what}: {r}");
        assert!(r["p99_us"].as_f64().is_some(), "{what}: no percentiles: {r}");
    }
}

#[test]
fn async_pingpong_measures_each_size_on_tcp_rxm_and_shm() {
    let tool = env!("CARGO_BIN_EXE_async_pingpong");
    for (provider, wait) in [("tcp;ofi_rxm", "fd"), ("tcp;ofi_rxm", "spin"), ("shm", "fd")] {
        let domain = if provider == "shm" { "shm" } else { "lo" };
        let (ok, out, err) = run(
            tool,
            &[
                "--loopback",
                "-p",
                provider,
                "-d",
                domain,
                "-c",
                wait,
                "-S",
                "8,65536",
                "-I",
                "300",
                "--json",
            ],
        );
        assert!(ok, "{provider} -c {wait}: {err}\n{out}");
        check_rows(&out, &format!("{provider} -c {wait}"), &[8, 65536], 300);
    }
}

#[test]
fn async_rma_pingpong_writes_and_reads_every_size_checked_on_tcp_rxm_and_shm() {
    let tool = env!("CARGO_BIN_EXE_async_rma_pingpong");
    for provider in ["tcp;ofi_rxm", "shm"] {
        let domain = if provider == "shm" { "shm" } else { "lo" };
        for op in ["write", "read"] {
            let (ok, out, err) = run(
                tool,
                &[
                    "--loopback",
                    "-p",
                    provider,
                    "-d",
                    domain,
                    "-o",
                    op,
                    "-S",
                    "8,65536,1048576",
                    "-I",
                    "200",
                    "--verify",
                    "--json",
                ],
            );
            assert!(ok, "{provider} -o {op}: {err}\n{out}");
            check_rows(&out, &format!("{provider} -o {op}"), &[8, 65536, 1048576], 200);
        }
    }
}

#[test]
fn async_pingpong_says_it_runs_in_one_process_only() {
    let (ok, _, err) = run(
        env!("CARGO_BIN_EXE_async_pingpong"),
        &["-p", "tcp;ofi_rxm", "127.0.0.1"],
    );
    assert!(!ok);
    assert!(err.contains("only --loopback"), "{err}");
}

#[test]
fn async_server_serves_many_peers_and_gives_up_the_silent_one() {
    let tool = env!("CARGO_BIN_EXE_async_server");
    for provider in ["tcp;ofi_rxm", "shm"] {
        let (ok, out, err) = run(tool, &["-p", provider, "--clients", "12", "--idle-ms", "500"]);
        assert!(ok, "{provider}: {err}\n{out}");
        assert!(out.contains("served 11, gave up 1"), "{provider}: {out}\n{err}");
        assert_eq!(err.matches("given up").count(), 1, "{provider}: {err}");
    }
}

#[test]
fn async_floor_times_each_hand_off() {
    let (ok, out, err) = run(env!("CARGO_BIN_EXE_async_floor"), &["2000"]);
    assert!(ok, "{err}\n{out}");
    let rows: Vec<(&str, f64)> = out
        .lines()
        .map(|l| {
            let (name, rest) = l
                .split_once(": ")
                .unwrap_or_else(|| panic!("a row without a name: {l}"));
            let us = rest
                .strip_suffix(" µs one way")
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or_else(|| panic!("a row without a time: {l}"));
            (name, us)
        })
        .collect();
    let names: Vec<&str> = rows.iter().map(|r| r.0).collect();
    assert_eq!(
        names,
        ["threads", "2 workers", "1 thread", "a runtime per side"],
        "{out}"
    );
    for (name, us) in rows {
        assert!(us > 0.0 && us.is_finite(), "{name}: {us}");
    }
    let (ok, _, err) = run(env!("CARGO_BIN_EXE_async_floor"), &["0"]);
    assert!(!ok && err.contains("usage"), "0 round trips is refused: {err}");
}
