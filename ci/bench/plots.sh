#!/usr/bin/env bash
# docs/benchmarks.md's figures from one command: latency and bandwidth
# against message size (ours beside fi_pingpong, UCX and Open MPI, on TCP
# and on shared memory) and the collectives against Open MPI by rank count,
# with p50-p99 bands. The sweeps and the drawing are ci/bench/plots.py's.
#
#   ci/bench/plots.sh                           # about 5 minutes
#   ci/bench/plots.sh --quick                   # fewer sizes and iterations, 2 and 4 ranks
#   ci/bench/plots.sh --figures docs/figures    # refresh the documented figures
#   ci/bench/plots.sh --rounds 3                # median of 3 rounds per point
#   /usr/bin/python3 ci/bench/plots.py --draw-only --out target/bench/plots-X  # redraw
#
# Results (results.json, results.csv, every tool's raw output) go to $OUT
# (default target/bench/plots-<time>/), the SVGs to its figures/ unless
# --figures says where. Set-up installs what is missing: python3-matplotlib,
# libfabric-bin (fi_pingpong), ucx-utils (ucx_perftest), Open MPI (mpirun,
# mpicc). The machine's load is recorded with the results and printed on
# every figure: on a shared machine run it when the load is low (uptime).
set -euo pipefail
cd "$(dirname "$0")/../.."

# Debian's python3-matplotlib is for Debian's python (/usr/bin/python3),
# which may not be the first python3 on PATH (pyenv).
PY=/usr/bin/python3
need=()
"$PY" -c 'import matplotlib' 2>/dev/null || need+=(python3-matplotlib)
command -v fi_pingpong >/dev/null || need+=(libfabric-bin)
command -v ucx_perftest >/dev/null || need+=(ucx-utils)
source ci/install.sh
need_openmpi
install_packages plots.sh "${need[@]}"

# Under ci/libfabric2.sh, CARGO_TARGET_DIR keeps the 2.1 builds apart.
TARGET=${CARGO_TARGET_DIR:-target}
cargo build --release --locked -q -p fabric-msg-examples --bin pingpong --bin bandwidth --bin world_bench
mkdir -p "$TARGET/bench"
mpicc -O2 -Wall -o "$TARGET/bench/pingpong_mpi" ci/bench/pingpong_mpi.c
mpicc -O2 -Wall -o "$TARGET/bench/world_vs_mpi" ci/bench/world_vs_mpi.c
OUT=${OUT:-$TARGET/bench/plots-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT"
echo "plots.sh: $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg); results in $OUT" >&2
exec "$PY" ci/bench/plots.py --out "$OUT" --target "$TARGET" "$@"
