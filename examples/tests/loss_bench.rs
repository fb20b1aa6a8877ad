//! `loss_bench` as a user runs it: a few trials of a killed and a stopped
//! peer process on tcp;ofi_rxm and shm, each reported with its detection
//! and first-operation times in order; a stop is not reported before the peer
//! timeout (less the heartbeat period), a kill long before it; bad arguments refused.

use crate::support;

use std::time::Duration;
use support::assert_tail;

fn run(args: &[&str]) -> std::process::Output {
    support::run_tool(env!("CARGO_BIN_EXE_loss_bench"), args, Duration::from_secs(120))
}

#[test]
fn killed_and_stopped_peers_are_reported_and_refused() {
    let o = run(&["--trials", "3", "--json"]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{:?}: {stderr}", o.status);
    let rows: Vec<serde_json::Value> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let seen: Vec<(&str, &str)> = rows
        .iter()
        .map(|r| {
            (
                r["provider"].as_str().unwrap_or(""),
                r["kind"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            ("tcp;ofi_rxm", "kill"),
            ("tcp;ofi_rxm", "stop"),
            ("shm", "kill"),
            ("shm", "stop")
        ]
    );
    for r in &rows {
        assert_eq!(r["trials"], 3, "{r}");
        assert_eq!(r["peer_timeout_ms"], 1000, "{r}");
        let (_, detect_max) = assert_tail(&r["detect"], None);
        let (_, op_max) = assert_tail(&r["first_op"], None);
        let detect_min = r["detect"]["min_us"].as_f64().unwrap_or(0.0);
        if r["kind"] == "stop" {
            // Silence counts from the last byte heard, a heartbeat up to
            // 250 ms before the stop; judged within one more heartbeat
            // and a loaded machine's delays.
            assert!(
                detect_min >= 0.7e6,
                "a stop reported long before the timeout: {r}"
            );
            assert!(detect_max < 6e6, "{r}");
        } else {
            assert!(
                detect_max < 1e6,
                "a death is seen at once, not after the timeout: {r}"
            );
        }
        // Refused at once: no wait for the provider.
        assert!(op_max < 1e6, "{r}");
    }
}

#[test]
fn bad_arguments_are_refused_with_a_reason() {
    for (args, says) in [
        (&["--trials", "0"][..], "at least 1"),
        (&["--kinds", "pause"][..], "neither kill nor stop"),
        (&["--timeout-ms", "10"][..], "at least 1000"),
        (&["--bogus"][..], "unknown option"),
    ] {
        let o = run(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(says), "{args:?}: {err}");
    }
}
