#!/usr/bin/env bash
# The hash table on symmetric memory (examples/src/bin/dht.rs) against its
# C + MPI twin (examples/mpi/dht.c on Open MPI's osc/sm), alternately,
# under the same mpirun on this machine, at each rank count:
#
#   ci/bench/dht.sh                          # 5 rounds, 2 and 4 ranks, 100000 keys per rank
#   ROUNDS=3 RANKS="2 4 8" KEYS=50000 ci/bench/dht.sh
#
# Three runs per round, their order rotating: ours on the node transport
# (same-node parts mapped: CPU atomics and copies), ours on libfabric's
# shm (FABRIC_MSG_SHM=libfabric: every operation through the provider),
# and Open MPI (--mca osc sm). Each prints the slowest rank's time for
# the inserts (compare-and-swap, then put) and lookups (get); the table
# is the median per implementation and its ratio to Open MPI's. Raw
# outputs go to $OUT (default target/bench/dht-<time>/).
set -euo pipefail
cd "$(dirname "$0")/../.."

ROUNDS=${ROUNDS:-5}
RANKS=${RANKS:-"2 4"}
KEYS=${KEYS:-100000}
LIMIT=${LIMIT:-300}
OUT=${OUT:-target/bench/dht-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT"
log() { printf '%s\n' "$*" >&2; }

source ci/install.sh
need=()
need_openmpi
install_packages dht.sh "${need[@]}"
TARGET=${CARGO_TARGET_DIR:-target}
cargo build --release --locked -q -p fabric-msg-examples --bin dht
mkdir -p "$TARGET/bench"
mpicc -O2 -Wall -o "$TARGET/bench/dht_mpi" examples/mpi/dht.c
MPIRUN=(mpirun --allow-run-as-root --oversubscribe)

# run IMPL RANKS ROUND: one mpirun; its time (s) appended to $OUT/IMPL-RANKS.txt.
run() {
  local impl=$1 n=$2 round=$3 cmd
  case $impl in
    node) cmd=("${MPIRUN[@]}" -x FABRIC_MSG_SHM=node -np "$n" "$TARGET/release/dht" "$KEYS") ;;
    libfabric) cmd=("${MPIRUN[@]}" -x FABRIC_MSG_SHM=libfabric -np "$n" "$TARGET/release/dht" "$KEYS") ;;
    mpi) cmd=("${MPIRUN[@]}" --mca osc sm -np "$n" "$TARGET/bench/dht_mpi" "$KEYS") ;;
  esac
  local name="$OUT/$impl-$n-r$round"
  echo "${cmd[*]}" >"$name.cmd"
  if ! timeout "$LIMIT" "${cmd[@]}" >"$name.out" 2>"$name.err"; then
    log "dht.sh: failed or timed out: ${cmd[*]} (see $name.err)"
    return 1
  fi
  if ! grep -q ' missing 0 ' "$name.out"; then
    log "dht.sh: keys missing or no result: ${cmd[*]}: $(cat "$name.out")"
    return 1
  fi
  awk '{for (i = 1; i < NF; i++) if ($i == "time") print $(i + 1)}' "$name.out" >>"$OUT/$impl-$n.txt"
}

impls=(node libfabric mpi)
for round in $(seq 1 "$ROUNDS"); do
  log "round $round: load average $(cut -d' ' -f1-3 /proc/loadavg)"
  for n in $RANKS; do
    for k in 0 1 2; do
      impl=${impls[$(((k + round) % 3))]}
      log "round $round: $impl, $n ranks"
      run "$impl" "$n" "$round" || true
    done
  done
done

median() { sort -g "$1" | awk '{a[NR] = $1} END {if (NR) print (NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2)}'; }
{
printf '| ranks | node transport (s) | libfabric shm (s) | Open MPI osc/sm (s) | node / MPI | shm / MPI |\n'
printf '|---|---|---|---|---|---|\n'
for n in $RANKS; do
  m_node=$(median "$OUT/node-$n.txt" 2>/dev/null || true)
  m_shm=$(median "$OUT/libfabric-$n.txt" 2>/dev/null || true)
  m_mpi=$(median "$OUT/mpi-$n.txt" 2>/dev/null || true)
  ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a != "" && b > 0) printf "%.2f", a / b; else print "-" }'; }
  printf '| %s | %s | %s | %s | %s | %s |\n' "$n" "${m_node:--}" "${m_shm:--}" "${m_mpi:--}" \
    "$(ratio "$m_node" "$m_mpi")" "$(ratio "$m_shm" "$m_mpi")"
done
} | tee "$OUT/table.md"
