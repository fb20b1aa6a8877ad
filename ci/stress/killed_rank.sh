#!/usr/bin/env bash
# The killed-rank scene of `world_local::a_rank_killed_mid_ring_on_tcp_alone_leaves_no_survivor_to_the_watchdog`,
# by hand and many times: 4 ranks of same_node_check in a ring over
# tcp;ofi_rxm alone (two pretend nodes, FABRIC_MSG_SHM=0), rank 3 killed
# (SIGKILL) after a second; a survivor still alive 1.3 s after the kill is
# counted stuck, and gdb's stacks of its threads are kept. What it measures
# is docs/decisions.md's "rxm's segments off, tried again". Not part of CI:
# it loads the machine for as long as it runs.
#
#   ci/stress/killed_rank.sh [RUNS=30]
#
# Results in target/stress/: killed-rank-stuck-RUN-RANK.txt, and the count.
set -euo pipefail
cd "$(dirname "$0")/../.."
runs=${1:-30}
cargo build --locked --release -p fabric-msg-examples --bin same_node_check >/dev/null
bin=target/release/same_node_check out=target/stress
mkdir -p "$out"
stuck=0
for i in $(seq 1 "$runs"); do
  port=$((20000 + RANDOM % 20000))
  pids=()
  for r in 0 1 2 3; do
    FABRIC_MSG_RANK=$r FABRIC_MSG_SIZE=4 FABRIC_MSG_ROOT=127.0.0.1:$port FABRIC_MSG_NODE=node$((r / 2)) \
      FABRIC_MSG_SHM=0 "$bin" -n 100000000 -a 0 >"$out/killed-rank-$r.log" 2>&1 &
    pids+=($!)
  done
  sleep 1
  kill -9 "${pids[3]}"
  sleep 1.3
  alive=()
  for r in 0 1 2; do kill -0 "${pids[$r]}" 2>/dev/null && alive+=("$r"); done
  if [ ${#alive[@]} -gt 0 ]; then
    stuck=$((stuck + 1))
    echo "run $i: stuck: ranks ${alive[*]}"
    for r in "${alive[@]}"; do
      timeout 20 gdb -p "${pids[$r]}" -batch -ex "thread apply all bt 12" >"$out/killed-rank-stuck-$i-$r.txt" 2>&1 || true
    done
  fi
  for r in 0 1 2; do kill -9 "${pids[$r]}" 2>/dev/null || true; done
  wait 2>/dev/null || true
done
echo "stuck $stuck of $runs"
