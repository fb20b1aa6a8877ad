#!/usr/bin/env bash
# Instructions per round trip on the hot path, counted by callgrind: the
# `hotpath` tool (two event loops in one thread, no empty polls) run at two
# lengths, and the difference divided by the difference in round trips,
# so start-up and teardown cancel out. Per library: the tool and
# fabric-msg (one binary), libfabric, libc. A round trip here is both
# sides' work: each side sends once, reads one receive completion (and a
# send's, above the inject size) and reposts one receive.
#
#   ci/bench/hotpath.sh                        # shm, 8 B and 4 KiB, tagged
#   SIZES="8 64" MODES="tagged msg" ci/bench/hotpath.sh
#   BIN=path/to/another/hotpath ci/bench/hotpath.sh   # another build
#
# Needs valgrind (installed if missing). Deterministic to a few
# instructions per round trip, whatever else the machine runs.
set -euo pipefail
cd "$(dirname "$0")/../.."

PROVIDER=${PROVIDER:-shm}
SIZES=${SIZES:-"8 4096"}
MODES=${MODES:-tagged}
N1=${N1:-1000}
N2=${N2:-11000}

source ci/install.sh
command -v valgrind >/dev/null || install_packages hotpath.sh valgrind
if [ -z "${BIN:-}" ]; then
  cargo build --release --locked -q -p fabric-msg-examples --bin hotpath
  BIN=${CARGO_TARGET_DIR:-target}/release/hotpath
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# by_object FILE: "tool+fabric-msg libfabric libc" instruction totals.
by_object() {
  callgrind_annotate --inclusive=no --auto=no --show-percs=no --threshold=100 "$1" 2>/dev/null | awk -v bin="$(basename "$BIN")" '
    /^ *[0-9,]+  / && !/PROGRAM TOTALS/ {
      v = $1; gsub(",", "", v)
      # Inlined code is listed by its source file, without the object.
      if ($0 ~ /libfabric\.so/) lf += v
      else if ($0 ~ /libc\.so|ld-linux/ || ($0 !~ /\[/ && $2 ~ /^\.\//)) lc += v
      else if (index($0, "/" bin "]") || $0 !~ /\[/) own += v
      else other += v
    }
    END { printf "%d %d %d %d\n", own, lf, lc, other }'
}

printf '| provider | messages | bytes | tool + fabric-msg | libfabric | libc | other | total |\n'
printf '|---|---|---|---|---|---|---|---|\n'
for mode in $MODES; do
  m=()
  [ "$mode" = msg ] && m=(--msg)
  for size in $SIZES; do
    for n in "$N1" "$N2"; do
      valgrind --tool=callgrind --callgrind-out-file="$out/cg.$n" \
        "$BIN" -p "$PROVIDER" -S "$size" -I "$n" "${m[@]}" >"$out/log.$n" 2>&1 ||
        { echo "hotpath.sh: $BIN failed:" >&2; tail -n 5 "$out/log.$n" >&2; exit 1; }
    done
    read -r o1 l1 c1 x1 < <(by_object "$out/cg.$N1")
    read -r o2 l2 c2 x2 < <(by_object "$out/cg.$N2")
    d=$((N2 - N1))
    printf '| %s | %s | %s | %d | %d | %d | %d | %d |\n' "$PROVIDER" "$mode" "$size" \
      $(((o2 - o1) / d)) $(((l2 - l1) / d)) $(((c2 - c1) / d)) $(((x2 - x1) / d)) \
      $(((o2 + l2 + c2 + x2 - o1 - l1 - c1 - x1) / d))
  done
done
