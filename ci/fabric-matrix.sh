#!/usr/bin/env bash
# The fabric matrix: what cannot run on this kernel runs in the ci/vm guest,
# on real soft-RoCE (rxe0) and soft-iWARP (siw0) devices, with binaries
# built here. Set FABRIC_MSG_SKIP_VM=1 to skip (it says so loudly).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${FABRIC_MSG_SKIP_VM:-0}" = 1 ]; then
  echo "ci/fabric-matrix.sh: SKIPPED (FABRIC_MSG_SKIP_VM=1): RoCE and iWARP paths NOT tested" >&2
  exit 0
fi
cargo build --locked -q -p fabric-msg-examples --bin fabric_info --bin pingpong --bin rma_pingpong
ci/vm/run.sh --timeout 600 -- bash ci/matrix/negotiate-guest.sh
