#!/usr/bin/env bash
# The two-host matrix: two ci/vm guests joined by a virtual network
# (ci/vm/pair.sh), each with its own soft-RoCE (rxe0) and soft-iWARP (siw0)
# device, run pingpong (tagged and untagged), rma_pingpong, atomics and the
# World's spmd ring between them on RoCE RDM, RoCE MSG, iWARP MSG and
# iWARP RDM, every byte checked, with binaries built here. Set FABRIC_MSG_SKIP_VM=1 to skip (it says so loudly).
#
#   ci/two-host.sh            # bookworm guests, libfabric 1.17, host-built binaries
#   ci/two-host.sh trixie     # trixie guests, libfabric 2.1, binaries built
#                             # in ci/libfabric2.sh's root
set -euo pipefail
cd "$(dirname "$0")/.."
userland=${1:-bookworm}
if [ "${FABRIC_MSG_SKIP_VM:-0}" = 1 ]; then
  echo "ci/two-host.sh: SKIPPED (FABRIC_MSG_SKIP_VM=1): RoCE and iWARP between two hosts NOT tested ($userland)" >&2
  exit 0
fi
bins=(-p fabric-msg-examples --bin fabric_info --bin pingpong --bin rma_pingpong --bin atomics --bin spmd)
case $userland in
  bookworm)
    cargo build --locked -q "${bins[@]}"
    tdir=target
    ;;
  trixie)
    bash ci/libfabric2.sh -- cargo build --locked -q "${bins[@]}"
    tdir=target/libfabric-2
    ;;
  *) echo "ci/two-host.sh: bookworm or trixie, not $userland" >&2; exit 2 ;;
esac
envs=(--env FABRIC_MSG_TARGET_DIR="$tdir")
# FABRIC_MSG_TWO_HOST_ONLY=ERE: only the pair checks whose name matches.
[ -n "${FABRIC_MSG_TWO_HOST_ONLY:-}" ] && envs+=(--env FABRIC_MSG_TWO_HOST_ONLY="$FABRIC_MSG_TWO_HOST_ONLY")
start=$SECONDS
rc=0
ci/vm/pair.sh --userland "$userland" --timeout 600 "${envs[@]}" \
  -- bash ci/matrix/two-host-guest.sh || rc=$?
echo "ci/two-host.sh: $userland, status $rc after $((SECONDS - start)) s" >&2
exit "$rc"
