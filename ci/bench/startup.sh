#!/usr/bin/env bash
# Start-up against Open MPI: `startup` (World::init, barrier, 8-byte
# allreduce) and `startup_mpi` (MPI_Init, the same two) alternately under
# one mpirun each, for each rank count, ROUNDS times; prints a table of
# medians of the slowest rank's times (ms), and keeps the JSON in
# target/bench/startup/.
#
#   ci/bench/startup.sh                       # 2 4 8 16 32 ranks, 3 rounds, shm
#   RANKS="2 16" ROUNDS=5 ci/bench/startup.sh
#   MPIRUN_ARGS="-x FI_PROVIDER=tcp -x FABRIC_MSG_SHM=0" ci/bench/startup.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
RANKS=${RANKS:-"2 4 8 16 32"}
ROUNDS=${ROUNDS:-3}
out=target/bench/startup
mkdir -p "$out" target/bench
cargo build --release --locked -q -p fabric-msg-examples --bin startup
mpicc -O2 -o target/bench/startup_mpi ci/bench/startup_mpi.c
run=(mpirun --allow-run-as-root --oversubscribe ${MPIRUN_ARGS:-})
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
field() { sed -n "s/.*\"$1\":\([0-9.]*\).*/\1/p"; }
printf '| ranks | fabric-msg init | fabric-msg total | Open MPI init | Open MPI total | total ratio | load |\n'
printf '|---|---|---|---|---|---|---|\n'
for n in $RANKS; do
  : >"$out/fm.$n"; : >"$out/mpi.$n"
  for _ in $(seq "$ROUNDS"); do
    "${run[@]}" -np "$n" target/release/startup >>"$out/fm.$n"
    "${run[@]}" -np "$n" target/bench/startup_mpi >>"$out/mpi.$n"
  done
  fi=$(field init_ms <"$out/fm.$n" | median); ft=$(field total_ms <"$out/fm.$n" | median)
  mi=$(field init_ms <"$out/mpi.$n" | median); mt=$(field total_ms <"$out/mpi.$n" | median)
  printf '| %s | %s | %s | %s | %s | %.2f | %s |\n' "$n" "$fi" "$ft" "$mi" "$mt" \
    "$(echo "$ft / $mt" | bc -l)" "$(cut -d' ' -f1 /proc/loadavg)"
done
