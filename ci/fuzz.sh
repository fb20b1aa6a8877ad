#!/usr/bin/env bash
# Long fuzzing runs of every decoder that takes bytes from a peer, a
# launcher or a file (fabric-msg/fuzz/, cargo-fuzz with libFuzzer). The
# test suite's bounded run is fabric-msg/tests/fuzz_decoders.rs; this is
# for hours, not for CI.
#
# usage: ci/fuzz.sh [SECONDS_PER_TARGET (60)] [TARGET ...]
#
# Installs a nightly toolchain and cargo-fuzz if missing. The corpus of
# each target grows in ${FABRIC_MSG_FUZZ_CORPUS:-$HOME/.cache/fabric-msg-fuzz}
# and starts from fabric-msg's real inputs. An input that crashes is copied
# to fabric-msg/fuzz/regressions/TARGET/, which the test suite replays:
# commit it with the fix.
set -euo pipefail
cd "$(dirname "$0")/.."

die() { echo "ci/fuzz.sh: $*" >&2; exit 1; }

secs=${1:-60}
[ $# -gt 0 ] && shift
case $secs in '' | *[!0-9]*) die "SECONDS_PER_TARGET must be a whole number, not '$secs'" ;; esac

command -v rustup >/dev/null || die "rustup is needed for a nightly toolchain (https://rustup.rs)"
rustup toolchain list | grep -q '^nightly' || rustup toolchain install nightly --profile minimal
cargo +nightly fuzz --version >/dev/null 2>&1 || cargo install cargo-fuzz --locked

corpus=${FABRIC_MSG_FUZZ_CORPUS:-$HOME/.cache/fabric-msg-fuzz}
mkdir -p "$corpus"
# The seeds: what fabric-msg itself sends, and the shipped providers.toml.
FABRIC_MSG_FUZZ_SEEDS=$corpus cargo test -q -p fabric-msg --test fuzz_decoders seeds_and_regressions >/dev/null

if [ $# -gt 0 ]; then
  targets=("$@")
else
  mapfile -t targets < <(cargo +nightly fuzz list --fuzz-dir fabric-msg/fuzz)
fi

failed=()
for t in "${targets[@]}"; do
  echo "==> $t for ${secs}s" >&2
  artifacts=fabric-msg/fuzz/artifacts/$t
  mkdir -p "$artifacts" "$corpus/$t"
  # -malloc_limit_mb: one allocation above 64 MiB is a crash (the largest
  # frame a peer may announce is 4 MiB); -timeout: 10 s for one input is a hang.
  if ! cargo +nightly fuzz run --fuzz-dir fabric-msg/fuzz "$t" "$corpus/$t" -- \
      -max_total_time="$secs" -malloc_limit_mb=64 -rss_limit_mb=1024 -timeout=10 \
      -artifact_prefix="$artifacts/"; then
    mkdir -p "fabric-msg/fuzz/regressions/$t"
    cp "$artifacts"/* "fabric-msg/fuzz/regressions/$t/" 2>/dev/null || true
    failed+=("$t")
  fi
done

if [ ${#failed[@]} -gt 0 ]; then
  die "crashes in: ${failed[*]}; the inputs are in fabric-msg/fuzz/regressions/ (the test suite replays them: fix, then commit them)"
fi
echo "ci/fuzz.sh: ${#targets[@]} targets, ${secs}s each, no crash" >&2
