#!/usr/bin/env bash
# The tokio adapter against the blocking tool, side by side in one run:
# `async_pingpong --loopback` and `pingpong --loopback`, each with `-c fd`
# (the loops sleep on their wait fd; the async driver through tokio's
# AsyncFd) and `-c spin`, by turns, ROUNDS times, on tcp;ofi_rxm and shm:
# 8 B one-way latency and 1 MiB ping-pong throughput (MB/sec, both
# directions counted, as pingpong's column). Prints each case's median and
# its ratio to the blocking tool's `-c fd` and `-c spin`. The async tool
# runs on two tokio workers (as a multi-threaded tokio program would) and
# on one (FABRIC_MSG_ASYNC_RUNTIME=current: both sides, drivers and tasks
# on one thread), and on a current-thread runtime per side, each on a
# thread of its own (FABRIC_MSG_ASYNC_RUNTIME=per-side, as the blocking
# tool gives each side a thread). Then one-sided operations:
# `async_rma_pingpong --loopback` against `rma_pingpong --loopback`, both
# `-c fd`, writes with notices (`-o write`) and reads (`-o read`) of 8 B,
# 64 KiB and 1 MiB, by turns: p50 µs one way (per read for reads).
#
#   ci/bench/async.sh              # 3 rounds
#   ROUNDS=5 ci/bench/async.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=${ROUNDS:-3}
TARGET=${CARGO_TARGET_DIR:-target}
cargo build --release --locked -q -p fabric-msg-examples --bin pingpong --bin async_pingpong \
  --bin rma_pingpong --bin async_rma_pingpong
OUT=${OUT:-$TARGET/bench/async-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT"
for r in $(seq 1 "$ROUNDS"); do
  for provider in "tcp;ofi_rxm" shm; do
    domain=lo; [ "$provider" = shm ] && domain=shm
    for wait in fd spin; do
      for tool in pingpong async_pingpong async_current async_perside; do
        for size in 8 1048576; do
          iters=20000; [ "$size" = 1048576 ] && iters=300
          f="$OUT/${tool}_${provider//;/_}_${wait}_${size}_$r.json"
          bin=$tool rt=multi
          [ "$tool" = async_current ] && bin=async_pingpong rt=current
          [ "$tool" = async_perside ] && bin=async_pingpong rt=per-side
          FABRIC_MSG_ASYNC_RUNTIME=$rt "$TARGET/release/$bin" --loopback -p "$provider" -d "$domain" -c "$wait" -S "$size" -I "$iters" --json >"$f"
        done
      done
    done
  done
done
for r in $(seq 1 "$ROUNDS"); do
  for provider in "tcp;ofi_rxm" shm; do
    domain=lo; [ "$provider" = shm ] && domain=shm
    for op in write read; do
      for tool in rma_pingpong async_rma_pingpong; do
        "$TARGET/release/$tool" --loopback -p "$provider" -d "$domain" -o "$op" -c fd -S 8,65536,1048576 \
          -I 2000 --json >"$OUT/rma_${tool}_${provider//;/_}_${op}_$r.json"
      done
    done
  done
done
python3 - "$OUT" <<'PY'
import glob, json, os, statistics, sys
out = sys.argv[1]
runs = {}
for f in glob.glob(os.path.join(out, "*.json")):
    name = os.path.basename(f)[:-5]
    if name.startswith("rma_"):
        continue
    parts = name.split("_")
    tool = ("current" if name.startswith("async_current") else "perside" if name.startswith("async_perside")
            else "async" if name.startswith("async_") else "blocking")
    r, size, wait = int(parts[-1]), int(parts[-2]), parts[-3]
    provider = "shm" if "_shm_" in name else "tcp;ofi_rxm"
    for line in open(f):
        v = json.loads(line)
        if "bytes" in v:
            key = (provider, size, tool, wait)
            runs.setdefault(key, []).append(v["usec_per_xfer"] if size == 8 else v["mb_per_sec"])
print(f"# {out}: median of {len(next(iter(runs.values())))} runs")
print("| provider | measure | wait | blocking | async (2 workers) | async (current thread) | async (a runtime per side) | async / blocking -c fd | async / blocking -c spin | current / blocking -c fd | per side / blocking -c fd |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for provider in ["tcp;ofi_rxm", "shm"]:
    for size, what in [(8, "8 B latency, µs"), (1048576, "1 MiB MB/s")]:
        fd = statistics.median(runs[(provider, size, "blocking", "fd")])
        spin = statistics.median(runs[(provider, size, "blocking", "spin")])
        for wait in ["fd", "spin"]:
            b = statistics.median(runs[(provider, size, "blocking", wait)])
            a = statistics.median(runs[(provider, size, "async", wait)])
            c = statistics.median(runs[(provider, size, "current", wait)])
            p = statistics.median(runs[(provider, size, "perside", wait)])
            print(f"| {provider} | {what} | {wait} | {b:.2f} | {a:.2f} | {c:.2f} | {p:.2f} | {a/fd:.2f} | {a/spin:.2f} | {c/fd:.2f} | {p/fd:.2f} |")
rma = {}
for f in glob.glob(os.path.join(out, "rma_*.json")):
    name = os.path.basename(f)[4:-5]
    tool = "async" if name.startswith("async_") else "blocking"
    provider = "shm" if "_shm_" in name else "tcp;ofi_rxm"
    op = "read" if "_read_" in name else "write"
    for line in open(f):
        v = json.loads(line)
        if "bytes" in v:
            rma.setdefault((provider, op, v["bytes"], tool), []).append(v["p50_us"])
print()
print("| provider | op | bytes | rma_pingpong p50 µs | async_rma_pingpong p50 µs | async / blocking |")
print("|---|---|---|---|---|---|")
for provider in ["tcp;ofi_rxm", "shm"]:
    for op in ["write", "read"]:
        for size in [8, 65536, 1048576]:
            b = statistics.median(rma[(provider, op, size, "blocking")])
            a = statistics.median(rma[(provider, op, size, "async")])
            print(f"| {provider} | {op} | {size:,} | {b:.2f} | {a:.2f} | {a/b:.2f} |")
PY
