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
bins=(-p fabric-msg-examples --bin fabric_info --bin pingpong --bin rma_pingpong --bin atomics --bin monitor_race --bin close_race)
# The soak (fabric-msg/tests/soak.rs) is a test binary: cargo names it
# soak-<hash>; its path comes from cargo's JSON messages. --workspace: the
# features ci/test.sh's `cargo test --workspace` built it with, so that
# build serves (-p fabric-msg alone built fabric-msg again without tokio).
soak=(test --locked --no-run -q --workspace --test soak --message-format=json)
soak_exe() {
  python3 -c '
import json, os, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "soak" and m.get("executable"):
        print(os.path.relpath(m["executable"]))
'
}
case $userland in
  bookworm)
    cargo build --locked -q "${bins[@]}"
    soak_bin=$(cargo "${soak[@]}" | soak_exe)
    tdir=target
    ;;
  trixie)
    bash ci/libfabric2.sh -- cargo build --locked -q "${bins[@]}"
    soak_bin=$(bash ci/libfabric2.sh -- cargo "${soak[@]}" | soak_exe)
    tdir=target/libfabric-2
    ;;
  *) echo "ci/fabric-matrix.sh: bookworm or trixie, not $userland" >&2; exit 2 ;;
esac
[ -n "$soak_bin" ] || { echo "ci/fabric-matrix.sh: cargo named no soak test binary" >&2; exit 1; }
ci/vm/run.sh --userland "$userland" --timeout 600 --env FABRIC_MSG_TARGET_DIR="$tdir" \
  --env FABRIC_MSG_SOAK_BIN="$soak_bin" -- bash ci/matrix/negotiate-guest.sh
