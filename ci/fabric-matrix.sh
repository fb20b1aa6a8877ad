#!/usr/bin/env bash
# The fabric matrix: what cannot run on this kernel runs in the ci/vm guest,
# on real soft-RoCE (rxe0) and soft-iWARP (siw0) devices, with binaries
# built here. Set FABRIC_MSG_SKIP_VM=1 to skip (it says so loudly).
#
#   ci/fabric-matrix.sh            # bookworm guest, libfabric 1.17, host-built binaries
#   ci/fabric-matrix.sh trixie     # trixie guest, libfabric 2.1, binaries built
#                                  # in ci/libfabric2.sh's root
set -euo pipefail
cd "$(dirname "$0")/.."
userland=${1:-bookworm}
if [ "${FABRIC_MSG_SKIP_VM:-0}" = 1 ]; then
  echo "ci/fabric-matrix.sh: SKIPPED (FABRIC_MSG_SKIP_VM=1): RoCE and iWARP paths NOT tested ($userland)" >&2
  exit 0
fi
bins=(-p fabric-msg-examples --bin fabric_info --bin pingpong --bin rma_pingpong --bin atomics)
case $userland in
  bookworm)
    cargo build --locked -q "${bins[@]}"
    tdir=target
    ;;
  trixie)
    bash ci/libfabric2.sh -- cargo build --locked -q "${bins[@]}"
    tdir=target/libfabric-2
    ;;
  *) echo "ci/fabric-matrix.sh: bookworm or trixie, not $userland" >&2; exit 2 ;;
esac
ci/vm/run.sh --userland "$userland" --timeout 600 --env FABRIC_MSG_TARGET_DIR="$tdir" \
  -- bash ci/matrix/negotiate-guest.sh
