#!/usr/bin/env bash
# Hangs that need a loaded machine: LOOPS launches of RANKS ranks of
# collectives_check at once, over and over, for MINUTES minutes; a launch
# that has not ended after 150 s is a hang, and every rank's stacks are
# kept (gdb) beside the summary. Not part of CI: it loads the machine for
# as long as it runs.
#
#   ci/stress/collectives.sh [LOOPS=3] [RANKS=5] [MINUTES=20] [-- mpirun options]
#   e.g.  ci/stress/collectives.sh 3 5 20 -x FABRIC_MSG_PROGRESS_THREAD=0
#
# Results in target/stress/: summary (one line per launch) and hang-*.txt.
set -euo pipefail
cd "$(dirname "$0")/../.."
loops=${1:-3} ranks=${2:-5} minutes=${3:-20}
shift $(( $# < 3 ? $# : 3 )); [ "${1:-}" = "--" ] && shift
cargo build --locked -p fabric-msg-examples --bin collectives_check >/dev/null
bin=target/debug/collectives_check out=target/stress
mkdir -p "$out"; : >"$out/summary"
end=$(( $(date +%s) + minutes * 60 ))
one_loop() {
  local id=$1 i=0; shift
  while [ "$(date +%s)" -lt "$end" ]; do
    i=$((i + 1))
    mpirun --allow-run-as-root --oversubscribe -x FABRIC_MSG_SHM=1 "$@" -np "$ranks" "$bin" \
      >"$out/run-$id-$i.log" 2>&1 &
    local mp=$! t
    for t in $(seq 150); do sleep 1; kill -0 "$mp" 2>/dev/null || break; done
    if kill -0 "$mp" 2>/dev/null; then
      echo "HANG $id $i" >>"$out/summary"
      for p in $(pgrep -P "$mp"); do
        gdb -p "$p" -batch -ex 'thread apply all bt' >"$out/hang-$id-$i-$p.txt" 2>&1 || true
      done
      pkill -9 -P "$mp" || true; kill -9 "$mp" || true
    fi
    local rc=0; wait "$mp" || rc=$?
    echo "$id $i rc=$rc" >>"$out/summary"
    [ "$rc" = 0 ] && rm -f "$out/run-$id-$i.log"
  done
}
for k in $(seq "$loops"); do one_loop "s$k" "$@" & done
wait
echo "$(grep -c rc= "$out/summary") launches, $(grep -c HANG "$out/summary" || true) hung ($out/summary)"
