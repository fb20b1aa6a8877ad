#!/usr/bin/env bash
# One matching engine against the pairing it replaced as the default
# (docs/world.md, "One matching engine"), by turns, ROUNDS times:
# `world_bench latency` between ranks 0 and 1 of a World of 4 ranks on two
# pretend nodes (the node transport within a node, tcp;ofi_rxm between),
# with FABRIC_MSG_ONE_ENGINE=0 and =1,
# - `near`: ranks 0 and 1 on one node (rank r on node r/2), so the
#   receives from any rank wait for a node message;
# - `far`: on two (rank r on node r%2), so every message crosses the
#   fabric, eagerly up to 64 KiB and announced above;
# each with receives from rank 0/1 and from any rank (`--any-source`).
# Ranks 2 and 3 only make both nodes have two ranks. LAYOUTS and MODES
# narrow it (LAYOUTS=far MODES=exact). Prints the p50 one
# way of each round and the ratio of the medians (engine / pairing).
#
#   ci/bench/one_engine.sh          # 3 rounds, 3000 iterations a size
#   ROUNDS=5 ITERS=10000 ci/bench/one_engine.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=${ROUNDS:-3}
ITERS=${ITERS:-3000}
SIZES=${SIZES:-8,4096,65536,1048576}
TARGET=${CARGO_TARGET_DIR:-target}
cargo build --release --locked -q -p fabric-msg-examples --bin world_bench
OUT=${OUT:-$TARGET/bench/one_engine-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT"
port=$((20000 + RANDOM % 20000))
for round in $(seq 1 "$ROUNDS"); do
  for layout in ${LAYOUTS:-near far}; do
    for mode in ${MODES:-exact any}; do
      for engine in 0 1; do
        port=$((port + 1))
        any=(); [ "$mode" = any ] && any=(--any-source)
        pids=()
        for r in 0 1 2 3; do
          node=node$((r / 2)); [ "$layout" = far ] && node=node$((r % 2))
          FABRIC_MSG_ONE_ENGINE=$engine FABRIC_MSG_RANK=$r FABRIC_MSG_SIZE=4 \
            FABRIC_MSG_ROOT=127.0.0.1:$port FABRIC_MSG_NODE=$node \
            "$TARGET/release/world_bench" latency -S "$SIZES" -I "$ITERS" --json "${any[@]}" \
            >"$OUT/${layout}_${mode}_${engine}_${round}_rank$r.json" 2>"$OUT/${layout}_${mode}_${engine}_${round}_rank$r.err" &
          pids+=($!)
        done
        for p in "${pids[@]}"; do wait "$p"; done
      done
    done
  done
done
python3 - "$OUT" "$ROUNDS" "${LAYOUTS:-near far}" "${MODES:-exact any}" <<'EOF'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def p50s(layout, mode, engine):
    by = {}
    for r in range(1, rounds + 1):
        for line in open(f"{out}/{layout}_{mode}_{engine}_{r}_rank0.json"):
            if line.startswith('{"avg'):
                d = json.loads(line)
                by.setdefault(d["bytes"], []).append(d["p50_us"])
    return by
print("| pair | receives | bytes | pairing, p50 µs | one engine, p50 µs | engine / pairing |")
print("|---|---|---|---|---|---|")
for layout in sys.argv[3].split():
    for mode in sys.argv[4].split():
        a, e = p50s(layout, mode, 0), p50s(layout, mode, 1)
        for b in sorted(a):
            ma, me = statistics.median(a[b]), statistics.median(e[b])
            fa = ", ".join(f"{x:.2f}" for x in a[b])
            fe = ", ".join(f"{x:.2f}" for x in e[b])
            who = "from any rank" if mode == "any" else "from the rank"
            print(f"| {layout} | {who} | {b} | {fa} | {fe} | {me / ma:.2f} |")
print(f"output in {out}")
EOF
