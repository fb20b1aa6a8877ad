//! fabric-msg's own same-node transport between two processes
//! (`node_pingpong` starts its peer and maps its segment through `/proc`):
//! every size class arrives whole both ways, through the ring and by the
//! single-copy read; a peer killed mid-run is reported, not waited on.

use std::process::Command;
use std::time::{Duration, Instant};

fn run(args: &[&str]) -> (bool, String, String, Duration) {
    let t = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_node_pingpong"))
        .args(args)
        .output()
        .expect("node_pingpong runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        t.elapsed(),
    )
}

fn rows(out: &str) -> Vec<serde_json::Value> {
    out.lines().filter_map(|l| serde_json::from_str(l).ok()).collect()
}

#[test]
fn two_processes_exchange_every_size_through_the_ring_and_by_single_copy() {
    for copy in ["never", "32768"] {
        let (ok, out, err, _) = run(&[
            "-S",
            "0,8,16384,16385,65536,1048576",
            "-I",
            "200",
            "-w",
            "20",
            "--copy-from",
            copy,
            "--json",
        ]);
        assert!(ok, "--copy-from {copy}: {err}");
        let r = rows(&out);
        let sizes: Vec<u64> = r.iter().map(|v| v["bytes"].as_u64().unwrap()).collect();
        assert_eq!(sizes, [0, 8, 16384, 16385, 65536, 1048576], "{out}");
        for v in &r {
            assert_eq!(v["acked"].as_u64(), Some(200), "{v}");
            assert!(v["usec_per_xfer"].as_f64().unwrap() > 0.0);
        }
    }
}

#[test]
fn a_stream_of_small_and_large_messages_is_counted_whole() {
    for (size, iters) in [("8", "100000"), ("1048576", "256")] {
        let (ok, out, err, _) = run(&["--rate", "64", "-S", size, "-I", iters, "-w", "64", "--json"]);
        assert!(ok, "{size}: {err}");
        let r = rows(&out);
        assert_eq!(r.len(), 1, "{out}");
        assert_eq!(r[0]["sent"].as_u64().unwrap() % 64, 0);
    }
}

#[test]
fn a_peer_killed_mid_run_is_reported_within_seconds() {
    for size in ["8", "1048576"] {
        let (ok, _, err, took) = run(&["-S", size, "-I", "100000", "-w", "10", "--peer-dies-after", "50"]);
        assert!(!ok, "size {size}: the run succeeded with its peer killed");
        assert!(
            err.contains("same-node rank 1") && err.contains("ended"),
            "size {size}: the error does not name the dead rank: {err}"
        );
        assert!(
            took < Duration::from_secs(8),
            "size {size}: {took:?} to notice (the stall limit is 10 s)"
        );
    }
}
