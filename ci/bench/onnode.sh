#!/usr/bin/env bash
# Issue 28's measurements of the same-node path, from one command, and
# every target of the issue judged against them:
#
#   ci/bench/onnode.sh                 # 3 rounds of each part (about 40 minutes here)
#   ROUNDS=1 ci/bench/onnode.sh        # one round (a quick look, about 15 minutes)
#   ci/bench/onnode_targets.py DIR     # the verdicts again, from a run's directory
#
# The parts, each by the script that measures it (whose header says how),
# one after the other, into $OUT (default target/bench/onnode-<time>/):
#   1. point to point (ab.sh, SECTIONS=peers PEER_CLASSES=shm): the node
#      transport (node_pingpong), libfabric's shm, fi_pingpong, UCX
#      (posix, cma) and Open MPI (vader), latency 8 B to 4 MiB and a
#      window of 64 at 8 B and 1 MiB; pinned (PIN=cores), then not.
#   2. collectives (world_vs_mpi.sh, TRANSPORTS=node): the World's barrier,
#      allreduce of 8 B, 64 KiB and 4 MiB and broadcast of 8 B and 1 MiB
#      at 2, 4 and 8 ranks, against Open MPI vader.
#   3. a hash table on symmetric memory (dht.sh) at 2 and 4 ranks, against
#      Open MPI's osc/sm.
#   4. waiting (waits): 4 ranks on 2 cores around a ring, 64 B, and a rank
#      that waits 5 s for one that computes with FABRIC_MSG_WAIT=block (the
#      job's user CPU seconds), the node transport against libfabric's shm,
#      by turns.
# Then targets.md: each target, what was measured and whether it is met
# (ci/bench/onnode_targets.py). Each part's own table is beside it.
set -euo pipefail
cd "$(dirname "$0")/../.."

ROUNDS=${ROUNDS:-3}
OUT=${OUT:-target/bench/onnode-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT"
log() { printf 'onnode.sh: %s\n' "$*" >&2; }
started=$(date +%s)

for pin in cores none; do
  log "point to point, PIN=$pin"
  SECTIONS=peers PEER_CLASSES=shm PEER_SIZES="8 64 4096 65536 1048576 4194304" \
    ROUNDS=$ROUNDS PIN=$pin OUT=$OUT/peers-$pin ci/bench/ab.sh >"$OUT/peers-$pin.md"
done

log "collectives"
ROUNDS=$ROUNDS RANKS="2 4 8" TRANSPORTS=node \
  CASES="barrier -S 0;allreduce -S 8,65536,4194304;bcast -S 8,1048576" \
  OUT=$OUT/collectives ci/bench/world_vs_mpi.sh >"$OUT/collectives.md"

log "hash table on symmetric memory"
ROUNDS=$ROUNDS OUT=$OUT/dht ci/bench/dht.sh >"$OUT/dht.md"

log "waiting"
cargo build --release --locked -q -p fabric-msg-examples --bin waits
MPIRUN=(timeout 300 mpirun --allow-run-as-root --oversubscribe)
printf 'case\ttransport\tround\tvalue\n' >"$OUT/waits.tsv"
for round in $(seq "$ROUNDS"); do
  for shm in node libfabric; do
    line=$("${MPIRUN[@]}" -x FABRIC_MSG_SHM=$shm -np 4 target/release/waits ring -n 5000 -S 64 |
      grep 'us per round')
    echo "$line" >>"$OUT/waits-ring-$shm.txt"
    us=$(sed -E 's/.* ([0-9.]+) us per round.*/\1/' <<<"$line")
    printf 'ring\t%s\t%s\t%s\n' "$shm" "$round" "$us" >>"$OUT/waits.tsv"
    cpu=$( { /usr/bin/time -f 'cpu %U' "${MPIRUN[@]}" -x FABRIC_MSG_SHM=$shm -x FABRIC_MSG_WAIT=block \
      -np 2 target/release/waits peer --compute 5 --spin >>"$OUT/waits-block-$shm.txt"; } 2>&1 |
      sed -nE 's/^cpu ([0-9.]+)$/\1/p')
    printf 'block\t%s\t%s\t%s\n' "$shm" "$round" "$cpu" >>"$OUT/waits.tsv"
  done
done

python3 ci/bench/onnode_targets.py "$OUT" >"$OUT/targets.md"
cat "$OUT/targets.md"
log "done in $(( $(date +%s) - started )) s; every part's table and raw output: $OUT"
