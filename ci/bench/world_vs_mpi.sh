#!/usr/bin/env bash
# The World's collectives (world_bench) against Open MPI's (world_vs_mpi.c),
# alternately, under the same mpirun on this machine.
#
#   ci/bench/world_vs_mpi.sh                       # 3 rounds, 2 4 8 ranks, tcp, shm and node
#   ROUNDS=5 RANKS="4" TRANSPORTS="shm" ci/bench/world_vs_mpi.sh
#   CASES="barrier -S 0;bcast -S 8" ci/bench/world_vs_mpi.sh   # some cases only
#   CASES="scatter -S 8,65536;alltoall -S 8,65536;scan -S 8,65536" ci/bench/world_vs_mpi.sh
#   BEFORE=path/to/an/older/world_bench ci/bench/world_vs_mpi.sh
#   ci/libfabric2.sh -- ci/bench/world_vs_mpi.sh   # libfabric 2.1, Open MPI 5 (trixie)
#
# BEFORE adds a third run to every case, alternating with the other two:
# another build of world_bench (an older commit's), so that a change is
# measured against its predecessor in the same period as against Open MPI.
#
# Cases: barrier; allreduce of 8 B, 64 KiB and 4 MiB (f32 sum); broadcast of
# 8 B and 1 MiB from rank 0. CASES may also name scatter and alltoall
# (bytes per rank, per pair) and scan (f32 sum). Transports, each side on its own kind:
#   tcp  ours: FABRIC_MSG_SHM=0 (tcp;ofi_rxm on lo)
#        Open MPI: --mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include lo
#   shm  ours: FABRIC_MSG_SHM=libfabric (libfabric's shm)
#        Open MPI: --mca pml ob1 --mca btl vader,self
#   node ours: FABRIC_MSG_SHM=node (fabric-msg's node transport, the default)
#        Open MPI: --mca pml ob1 --mca btl vader,self
# Both time each call with an untimed barrier between calls and report
# each rank's mean; the ratio is ours / Open MPI of the slowest rank's mean
# (rank_max_us), taken per round (the two runs of a round are next to each other
# in time) and then the median over rounds. Every run is under `timeout`.
# Raw outputs, results.tsv and the load average at the start of each round
# (loadavg.txt) go to $OUT (default target/bench/world_vs_mpi-<time>/).
set -euo pipefail
cd "$(dirname "$0")/../.."

ROUNDS=${ROUNDS:-3}
RANKS=${RANKS:-"2 4 8"}
TRANSPORTS=${TRANSPORTS:-"tcp shm node"}
LIMIT=${LIMIT:-300}
OUT=${OUT:-target/bench/world_vs_mpi-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT"

log() { printf '%s\n' "$*" >&2; }

# Open MPI (mpirun, and mpicc for the C side), installed where missing: in
# the host, or in ci/libfabric2.sh's trixie root (Open MPI 5 there).
source ci/install.sh
need=()
need_openmpi
install_packages world_vs_mpi.sh "${need[@]}"
# Under ci/libfabric2.sh, CARGO_TARGET_DIR keeps the 2.1 builds apart.
TARGET=${CARGO_TARGET_DIR:-target}
cargo build --release --locked -q -p fabric-msg-examples --bin world_bench
mkdir -p "$TARGET/bench"
mpicc -O2 -Wall -o "$TARGET/bench/world_vs_mpi" ci/bench/world_vs_mpi.c
OURS=$TARGET/release/world_bench
THEIRS=$TARGET/bench/world_vs_mpi
BEFORE=${BEFORE:-}
if [ -n "$BEFORE" ] && [ ! -x "$BEFORE" ]; then
  log "world_vs_mpi.sh: BEFORE=$BEFORE is not an executable"
  exit 2
fi

if [ -n "${CASES:-}" ]; then
  IFS=';' read -r -a CASES <<<"$CASES"
else
  CASES=("barrier -S 0" "allreduce -S 8,65536,4194304" "bcast -S 8,1048576")
fi
MPIRUN=(mpirun --allow-run-as-root --oversubscribe)

# run IMPL TRANSPORT RANKS ROUND CASE...: one mpirun, its JSON to $OUT.
run() {
  local impl=$1 tr=$2 n=$3 round=$4
  shift 4
  local name="$OUT/$impl-$tr-$n-$1-r$round.json" cmd
  if [ "$impl" = ours ] || [ "$impl" = before ]; then
    local bin=$OURS
    [ "$impl" = before ] && bin=$BEFORE
    local shm
    case $tr in
      shm) shm=libfabric ;;
      node) shm=node ;;
      *) shm=0 ;;
    esac
    cmd=("${MPIRUN[@]}" -x "FABRIC_MSG_SHM=$shm" -np "$n" "$bin" "$@" --json)
  elif [ "$tr" = tcp ]; then
    cmd=("${MPIRUN[@]}" --mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include lo -np "$n" "$THEIRS" "$@")
  else
    cmd=("${MPIRUN[@]}" --mca pml ob1 --mca btl vader,self -np "$n" "$THEIRS" "$@")
  fi
  echo "${cmd[*]}" >"$name.cmd"
  if ! timeout "$LIMIT" "${cmd[@]}" >"$name" 2>"$name.err"; then
    log "world_vs_mpi.sh: failed or timed out: ${cmd[*]} (see $name.err)"
    return 1
  fi
}

for round in $(seq 1 "$ROUNDS"); do
  log "round $round: load average $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "round $round: $(cut -d' ' -f1-3 /proc/loadavg)" >>"$OUT/loadavg.txt"
  for n in $RANKS; do
    for tr in $TRANSPORTS; do
      for c in "${CASES[@]}"; do
        # Alternate which side goes first, so neither always runs warm.
        if ((round % 2)); then order="ours theirs"; else order="theirs ours"; fi
        if [ -n "$BEFORE" ]; then
          case $((round % 3)) in
            1) order="ours before theirs" ;;
            2) order="before theirs ours" ;;
            0) order="theirs ours before" ;;
          esac
        fi
        for impl in $order; do
          log "round $round: $impl $tr $n ranks: $c"
          # shellcheck disable=SC2086
          run "$impl" "$tr" "$n" "$round" $c || true
        done
      done
    done
  done
done

python3 - "$OUT" <<'EOF'
import glob, json, os, statistics, sys
out = sys.argv[1]
rows = {}
for path in glob.glob(os.path.join(out, "*.json")):
    impl, tr, n, bench, r = os.path.basename(path)[:-5].split("-")
    for line in open(path):
        try:
            v = json.loads(line)
        except ValueError:
            continue
        if "bytes" in v and "rank_max_us" in v:
            rows.setdefault((tr, int(n), bench, v["bytes"]), {}).setdefault(r, {})[impl] = v["rank_max_us"]
names = {"barrier": "barrier", "allreduce": "allreduce", "bcast": "broadcast",
         "scatter": "scatter", "alltoall": "alltoall", "scan": "scan"}
def size(b):
    return "" if b == 0 else (f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB" if b >= 1 << 10 else f"{b} B")
before = any("before" in v for r in rows.values() for v in r.values())
tsv = open(os.path.join(out, "results.tsv"), "w")
tsv.write("transport\tranks\tbenchmark\tbytes\tours_us\topenmpi_us\tratio\trounds"
          + ("\tbefore_us\tbefore_ratio" if before else "") + "\n")
if before:
    print("| transport | ranks | collective | size | ours µs | Open MPI µs | ratio | rounds | before µs | before ratio |")
    print("|---|---|---|---|---|---|---|---|---|---|")
else:
    print("| transport | ranks | collective | size | ours µs | Open MPI µs | ratio | rounds |")
    print("|---|---|---|---|---|---|---|---|")
order = {"tcp": 0, "shm": 1, "node": 2}
for key in sorted(rows, key=lambda k: (order.get(k[0], 2), k[1], list(names).index(k[2]), k[3])):
    tr, n, bench, b = key
    pairs = [(v["ours"], v["theirs"]) for v in rows[key].values() if "ours" in v and "theirs" in v]
    if not pairs:
        continue
    ours = statistics.median(p[0] for p in pairs)
    theirs = statistics.median(p[1] for p in pairs)
    ratio = statistics.median(p[0] / p[1] for p in pairs)
    line = f"| {tr} | {n} | {names[bench]} | {size(b)} | {ours:.1f} | {theirs:.1f} | {ratio:.2f} | {len(pairs)} |"
    row = f"{tr}\t{n}\t{bench}\t{b}\t{ours:.3f}\t{theirs:.3f}\t{ratio:.4f}\t{len(pairs)}"
    if before:
        # The older build against Open MPI, over the rounds that have all three.
        trio = [(v["before"], v["theirs"]) for v in rows[key].values() if "before" in v and "theirs" in v]
        if trio:
            old = statistics.median(p[0] for p in trio)
            old_ratio = statistics.median(p[0] / p[1] for p in trio)
            line += f" {old:.1f} | {old_ratio:.2f} |"
            row += f"\t{old:.3f}\t{old_ratio:.4f}"
        else:
            line += " | |"
            row += "\t\t"
    print(line)
    tsv.write(row + "\n")
EOF
log "raw outputs and results.tsv: $OUT"
