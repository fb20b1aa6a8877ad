#!/usr/bin/env bash
# What the per-iteration timing behind the percentiles costs, measured
# inside each run: with FABRIC_MSG_ITER_TIMES=alternate a tool times every
# iteration in one block of 1000 and not in the next, by turns, over one
# connection, and reports both blocks' mean usec/xfer (`timed_us`,
# `untimed_us`). Load, process placement and warm-up then hit both halves
# alike, which comparing separate runs could not achieve here (the spread
# between runs was 5-50 times the effect). Each case runs ROUNDS times, two
# processes over 127.0.0.1; prints each run's change and their median.
#
#   ci/bench/iter_times_cost.sh                # 3 rounds, the cases below
#   ROUNDS=5 ci/bench/iter_times_cost.sh
#
# Cases: pingpong 8 B on shm and on tcp;ofi_rxm (where one clock read per
# round trip weighs most), rma_pingpong 8 B on shm, bandwidth 8 B on shm
# (one clock read per window of 64).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=${ROUNDS:-3}
TARGET=${CARGO_TARGET_DIR:-target}
cargo build --release --locked -q -p fabric-msg-examples --bin pingpong --bin bandwidth --bin rma_pingpong
OUT=${OUT:-$TARGET/bench/iter-times-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT"
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
cases=(
  "pingpong|-p shm --same-host|-S 8 -I 400000 -W 2000"
  "pingpong|-p tcp;ofi_rxm -d lo|-S 8 -I 60000 -W 2000"
  "rma_pingpong|-p shm --same-host|-S 8 -I 400000 -W 2000"
  "bandwidth|-p shm --same-host|-S 8 -I 8000000 -W 64000"
)
# one TOOL FABRIC RUN: the client's JSON row, timing alternating.
one() {
  local tool=$1 fabric=$2 run=$3 p
  p=$(free_port)
  # shellcheck disable=SC2086
  FABRIC_MSG_ITER_TIMES=alternate timeout 120 "$TARGET/release/$tool" $fabric $run -B "$p" >/dev/null 2>&1 &
  local s=$!
  sleep 0.5
  # shellcheck disable=SC2086
  FABRIC_MSG_ITER_TIMES=alternate timeout 120 "$TARGET/release/$tool" $fabric $run --json -P "$p" 127.0.0.1 2>/dev/null | tail -n 1
  wait "$s" || true
}
echo "load $(cut -d' ' -f1-3 /proc/loadavg)" | tee "$OUT/load.txt" >&2
echo "| case | timed / untimed usec/xfer per run (blocks of each) | change per run | median |"
echo "|---|---|---|---|"
for c in "${cases[@]}"; do
  IFS='|' read -r tool fabric run <<<"$c"
  : >"$OUT/rows"
  for _ in $(seq "$ROUNDS"); do one "$tool" "$fabric" "$run" >>"$OUT/rows"; done
  python3 - "$tool $fabric ${run%% -I*}" "$OUT/rows" <<'PY'
import json, statistics, sys
name, rows = sys.argv[1], [json.loads(l) for l in open(sys.argv[2]) if l.strip()]
rows = [r for r in rows if "timed_us" in r]
if not rows:
    sys.exit(f"{name}: no run reported timed_us/untimed_us")
runs = ", ".join(f"{r['timed_us']:.3f} / {r['untimed_us']:.3f} ({r['alternate_blocks']})" for r in rows)
changes = [100 * (r["timed_us"] / r["untimed_us"] - 1) for r in rows]
print(f"| {name} | {runs} | {', '.join(f'{c:+.1f} %' for c in changes)} | {statistics.median(changes):+.1f} % |")
PY
done
echo "load $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUT/load.txt" >&2
