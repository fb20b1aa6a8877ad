#!/usr/bin/env bash
# Data-parallel training's gradient allreduce (examples/src/bin/sgd.rs)
# against its C + MPI twin (examples/mpi/sgd.c), alternately, under the
# same mpirun on this machine, at each rank count and bucket count:
#
#   ci/bench/sgd.sh                              # 3 rounds, 2 and 4 ranks, 4 16 64 buckets
#   ROUNDS=5 RANKS="4" BUCKETS="64" ci/bench/sgd.sh
#
# Each run trains PARAMS f32 parameters (default 1 Mi: a 4 MiB gradient)
# for STEPS steps; each step's gradient goes out in BUCKETS non-blocking
# allreduces started in the backward pass's order. Two runs per round on
# one node, their order alternating: ours (the node transport) and Open
# MPI (vader); and, at 4 ranks, two more across two pretend nodes of two
# ranks (FABRIC_MSG_NODE): ours (tcp;ofi_rxm between the nodes, the node
# transport within) and Open MPI over TCP alone (Open MPI cannot pretend:
# its btl tcp carries every pair), as an upper reference. The table is the
# median time per step and its ratio to Open MPI's. Raw outputs go to
# $OUT (default target/bench/sgd-<time>/).
set -euo pipefail
cd "$(dirname "$0")/../.."

ROUNDS=${ROUNDS:-3}
RANKS=${RANKS:-"2 4"}
BUCKETS=${BUCKETS:-"4 16 64"}
PARAMS=${PARAMS:-1048576}
STEPS=${STEPS:-40}
LIMIT=${LIMIT:-300}
OUT=${OUT:-target/bench/sgd-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT"
log() { printf '%s\n' "$*" >&2; }

source ci/install.sh
need=()
need_openmpi
install_packages sgd.sh "${need[@]}"
TARGET=${CARGO_TARGET_DIR:-target}
cargo build --release --locked -q -p fabric-msg-examples --bin sgd
mkdir -p "$TARGET/bench"
mpicc -O2 -Wall -o "$TARGET/bench/sgd_mpi" examples/mpi/sgd.c -lm
MPIRUN=(mpirun --allow-run-as-root --oversubscribe)
OURS=$TARGET/release/sgd
THEIRS=$TARGET/bench/sgd_mpi

# run IMPL RANKS BUCKETS ROUND: one mpirun; its ms/step appended to $OUT/IMPL-RANKS-BUCKETS.txt.
run() {
  local impl=$1 n=$2 b=$3 round=$4 cmd
  local args=("$PARAMS" "$STEPS" "$b")
  case $impl in
    ours) cmd=("${MPIRUN[@]}" -np "$n" "$OURS" "${args[@]}") ;;
    mpi) cmd=("${MPIRUN[@]}" --mca btl vader,self -np "$n" "$THEIRS" "${args[@]}") ;;
    ours2) cmd=("${MPIRUN[@]}" -np "$n" sh -c \
      "FABRIC_MSG_NODE=node\$((OMPI_COMM_WORLD_RANK / 2)) exec $OURS ${args[*]}") ;;
    mpitcp) cmd=("${MPIRUN[@]}" --mca btl tcp,self --mca btl_tcp_if_include lo -np "$n" "$THEIRS" "${args[@]}") ;;
  esac
  local name="$OUT/$impl-$n-$b-r$round"
  echo "${cmd[*]}" >"$name.cmd"
  if ! timeout "$LIMIT" "${cmd[@]}" >"$name.out" 2>"$name.err"; then
    log "sgd.sh: failed or timed out: ${cmd[*]} (see $name.err)"
    return 1
  fi
  if ! grep -q ' same yes ' "$name.out"; then
    log "sgd.sh: ranks ended with different models, or no result: ${cmd[*]}: $(cat "$name.out")"
    return 1
  fi
  awk '{for (i = 1; i < NF; i++) if ($i == "time") print $(i + 1)}' "$name.out" >>"$OUT/$impl-$n-$b.txt"
}

for round in $(seq 1 "$ROUNDS"); do
  log "round $round: load average $(cut -d' ' -f1-3 /proc/loadavg)"
  for n in $RANKS; do
    for b in $BUCKETS; do
      impls=(ours mpi)
      [ "$n" = 4 ] && impls+=(ours2 mpitcp)
      ((round % 2)) || impls=("${impls[@]:1}" "${impls[0]}")
      for impl in "${impls[@]}"; do
        log "round $round: $impl, $n ranks, $b buckets"
        run "$impl" "$n" "$b" "$round" || true
      done
    done
  done
done

median() { sort -g "$1" | awk '{a[NR] = $1} END {if (NR) print (NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2)}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a != "" && b > 0) printf "%.2f", a / b; else print "-" }'; }
{
printf '| ranks | buckets | ours, one node (ms/step) | Open MPI vader | ours / MPI | ours, two pretend nodes | Open MPI, TCP alone | pretend / MPI TCP |\n'
printf '|---|---|---|---|---|---|---|---|\n'
for n in $RANKS; do
  for b in $BUCKETS; do
    o=$(median "$OUT/ours-$n-$b.txt" 2>/dev/null || true)
    m=$(median "$OUT/mpi-$n-$b.txt" 2>/dev/null || true)
    o2=$(median "$OUT/ours2-$n-$b.txt" 2>/dev/null || true)
    mt=$(median "$OUT/mpitcp-$n-$b.txt" 2>/dev/null || true)
    printf '| %s | %s | %s | %s | %s | %s | %s | %s |\n' "$n" "$b" "${o:--}" "${m:--}" "$(ratio "$o" "$m")" \
      "${o2:--}" "${mt:--}" "$(ratio "$o2" "$mt")"
  done
done
} | tee "$OUT/table.md"
