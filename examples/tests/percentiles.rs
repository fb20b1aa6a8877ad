//! The distribution the tools print beside the average: `world_bench`'s
//! percentiles under `mpirun` (latency, bw, and a collective's slowest rank
//! per call), and `FABRIC_MSG_ITER_TIMES=off`, which leaves them out.
//! pingpong's, bandwidth's and rma_pingpong's rows are checked where their
//! other output is (`tools.rs`, `rma_pingpong.rs`).

use crate::support;

use std::process::Command;
use std::time::{Duration, Instant};
use support::{assert_tail, clean, mpirun, wait_all, ITER_TIMES_ENV};

const WORLD_BENCH: &str = env!("CARGO_BIN_EXE_world_bench");
const PINGPONG: &str = env!("CARGO_BIN_EXE_pingpong");
/// Longest a launch may take on a loaded 2-core machine.
const DEADLINE: Duration = Duration::from_secs(120);

/// `world_bench ARGS --json` on `n` ranks: the header, then one row per size.
fn world_bench(n: u32, shm: bool, args: &[&str]) -> (serde_json::Value, Vec<serde_json::Value>) {
    let mut all = args.to_vec();
    all.push("--json");
    let e = wait_all(vec![mpirun(WORLD_BENCH, n, shm, &all)], Instant::now(), DEADLINE).remove(0);
    assert!(e.status.success(), "world_bench {args:?} on {n} ranks: {e:?}");
    let mut lines = e.stdout.lines().map(|l| {
        serde_json::from_str::<serde_json::Value>(l).unwrap_or_else(|err| panic!("not JSON ({err}): {l}"))
    });
    let header = lines.next().expect("a header");
    (header, lines.collect())
}

fn sizes(rows: &[serde_json::Value]) -> Vec<u64> {
    rows.iter()
        .map(|r| r["bytes"].as_u64().unwrap_or(u64::MAX))
        .collect()
}

#[test]
fn world_bench_latency_and_bw_give_percentiles_around_the_average() {
    let (h, rows) = world_bench(2, true, &["latency", "-S", "8,4096", "-I", "300", "-W", "20"]);
    assert_eq!(h["benchmark"], "latency");
    assert_eq!(sizes(&rows), [8, 4096]);
    for r in &rows {
        assert_eq!(r["iterations"], 300, "{r}");
        assert_tail(r, Some("avg_us"));
    }
    let (_, rows) = world_bench(2, true, &["bw", "-S", "65536", "-I", "20", "-W", "2", "-w", "16"]);
    assert_eq!(sizes(&rows), [65536]);
    // Each window's time per message, around the mean time per message.
    let r = &rows[0];
    assert!(r["mb_per_sec"].as_f64().is_some_and(|m| m > 0.0), "{r}");
    let per_message = 65536.0 / r["mb_per_sec"].as_f64().unwrap_or(1.0);
    let (min, max) = (
        r["min_us"].as_f64().unwrap_or(0.0),
        r["max_us"].as_f64().unwrap_or(0.0),
    );
    assert!(
        min * 0.999 <= per_message && per_message <= max * 1.001,
        "{per_message} µs per message within [{min}, {max}]: {r}"
    );
    assert_tail(r, None);
}

#[test]
fn world_bench_collective_percentiles_are_of_the_slowest_rank() {
    for (shm, bench, size) in [(false, "allreduce", "8,65536"), (true, "barrier", "0")] {
        let (h, rows) = world_bench(3, shm, &[bench, "-S", size, "-I", "200", "-W", "10"]);
        assert_eq!(h["ranks"], 3);
        assert!(!rows.is_empty());
        for r in &rows {
            let (_, max) = assert_tail(r, None);
            let get = |k: &str| r[k].as_f64().unwrap_or_else(|| panic!("no {k} in {r}"));
            let (avg, lo, hi) = (get("avg_us"), get("rank_min_us"), get("rank_max_us"));
            assert!(lo <= avg && avg <= hi, "OSU's mean over ranks within theirs: {r}");
            // Each call's slowest rank, at its slowest call, took at least
            // as long as the slowest rank's mean.
            assert!(max >= hi * 0.999, "max_us {max} >= rank_max_us {hi}: {r}");
        }
    }
}

/// `pingpong --loopback` on tcp;ofi_rxm, 8 B, `iters` iterations with
/// `FABRIC_MSG_ITER_TIMES` set to `timing`: its JSON row.
fn pingpong_row(timing: &str, iters: &str) -> serde_json::Value {
    let mut cmd = Command::new(PINGPONG);
    clean(&mut cmd).env(ITER_TIMES_ENV, timing).args([
        "--loopback",
        "-p",
        "tcp;ofi_rxm",
        "-d",
        "lo",
        "-S",
        "8",
        "-I",
        iters,
        "-W",
        "10",
        "--json",
    ]);
    let e = wait_all(
        vec![cmd.spawn().expect("pingpong starts")],
        Instant::now(),
        DEADLINE,
    )
    .remove(0);
    assert!(e.status.success(), "{e:?}");
    serde_json::from_str(e.stdout.lines().nth(1).unwrap_or_default())
        .unwrap_or_else(|err| panic!("{err}: {}", e.stdout))
}

#[test]
fn timing_off_leaves_the_percentiles_out() {
    let row = pingpong_row("off", "50");
    assert!(row["usec_per_xfer"].as_f64().is_some_and(|u| u > 0.0), "{row}");
    for k in ["p50_us", "p99_us", "p999_us", "max_us"] {
        assert!(row.get(k).is_none(), "{k} with timing off: {row}");
    }
}

#[test]
fn alternate_timing_reports_both_halves_of_one_run() {
    let row = pingpong_row("alternate", "4500");
    // 4500 laps (the first measured iteration has none before it): blocks
    // of 1000 timed, untimed, timed, untimed, then half a timed one.
    assert_eq!(row["alternate_blocks"], 2, "{row}");
    let get = |k: &str| row[k].as_f64().unwrap_or_else(|| panic!("no {k} in {row}"));
    let (on, off, avg) = (get("timed_us"), get("untimed_us"), get("usec_per_xfer"));
    assert!(on > 0.0 && off > 0.0, "{row}");
    // Both halves are most of the run whose mean is usec_per_xfer (the
    // last half block is in the mean only): same unit, same magnitude.
    assert!(
        on.min(off) * 0.5 <= avg && avg <= on.max(off) * 2.0,
        "the halves' means around the run's: {row}"
    );
    assert_tail(&row, Some("usec_per_xfer"));
}
