#!/usr/bin/env bash
# What the per-iteration timing behind the percentiles costs: the tools with
# it (default) and without (FABRIC_MSG_ITER_TIMES=off), alternately, ROUNDS
# times each, two processes over 127.0.0.1; prints each case's usec/xfer
# range and median, on and off, and the change of the median.
#
#   ci/bench/iter_times_cost.sh                # 8 rounds, the cases below
#   ROUNDS=12 ci/bench/iter_times_cost.sh
#
# Cases: pingpong 8 B on shm and on tcp;ofi_rxm (where one clock read per
# round trip weighs most), rma_pingpong 8 B on shm, bandwidth 8 B on shm
# (one clock read per window of 64).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=${ROUNDS:-8}
TARGET=${CARGO_TARGET_DIR:-target}
cargo build --release --locked -q -p fabric-msg-examples --bin pingpong --bin bandwidth --bin rma_pingpong
OUT=${OUT:-$TARGET/bench/iter-times-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT"
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
cases=(
  "pingpong|-p shm --same-host|-S 8 -I 200000 -W 1000"
  "pingpong|-p tcp;ofi_rxm -d lo|-S 8 -I 20000 -W 1000"
  "rma_pingpong|-p shm --same-host|-S 8 -I 100000 -W 1000"
  "bandwidth|-p shm --same-host|-S 8 -I 1000000 -W 6400"
)
# one TOOL FABRIC RUN MODE: usec/xfer of one client run.
one() {
  local tool=$1 fabric=$2 run=$3 mode=$4 p env=()
  [ "$mode" = off ] && env=(FABRIC_MSG_ITER_TIMES=off)
  p=$(free_port)
  # shellcheck disable=SC2086
  env "${env[@]}" timeout 120 "$TARGET/release/$tool" $fabric $run -B "$p" >/dev/null 2>&1 &
  local s=$!
  sleep 0.5
  # shellcheck disable=SC2086
  env "${env[@]}" timeout 120 "$TARGET/release/$tool" $fabric $run --json -P "$p" 127.0.0.1 2>/dev/null |
    tail -n 1 | python3 -c 'import json, sys; print(json.load(sys.stdin)["usec_per_xfer"])'
  wait "$s" || true
}
echo "load $(cut -d' ' -f1-3 /proc/loadavg)" | tee "$OUT/load.txt" >&2
for c in "${cases[@]}"; do
  IFS='|' read -r tool fabric run <<<"$c"
  : >"$OUT/on" && : >"$OUT/off"
  for r in $(seq "$ROUNDS"); do
    if ((r % 2)); then order="on off"; else order="off on"; fi
    for m in $order; do one "$tool" "$fabric" "$run" "$m" >>"$OUT/$m"; done
  done
  python3 - "$tool $fabric ${run%% -I*}" "$OUT/on" "$OUT/off" <<'PY'
import statistics, sys
name, on, off = sys.argv[1], [float(x) for x in open(sys.argv[2])], [float(x) for x in open(sys.argv[3])]
mon, moff = statistics.median(on), statistics.median(off)
print(f"| {name} | {min(on):.3f}-{max(on):.3f} ({mon:.3f}) | {min(off):.3f}-{max(off):.3f} ({moff:.3f}) "
      f"| {100 * (mon / moff - 1):+.1f} % | {len(on)} |")
PY
done
echo "load $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUT/load.txt" >&2
