#!/usr/bin/env bash
# CI's compiled dependencies, kept between runs on one machine, as the VM
# images and the trixie root are: a fresh clone starts with every
# registry crate already built for each of CI's builds (the host's tests
# and clippy, ASan's, the libfabric 2.1 root's) and compiles only the
# workspace. On this 2-core machine that is about a third of each build
# (docs/decisions.md, "CI's time", 2026-11-30).
#
#   ci/build-cache.sh restore   # into target/, only where target/debug is absent
#   ci/build-cache.sh save      # target/'s builds, less the workspace's own
#
# What is kept holds no artifact of this workspace's crates (libfabric-sys,
# fabric-msg, fabric-msg-examples): `save` removes them with `cargo clean
# -p` before storing, so whatever the sources' timestamps, cargo compiles
# the workspace from the clone's own code. The dependencies' artifacts are
# cargo's to judge (it hashes a registry crate's version, features, flags
# and compiler into its file names). The cache is dropped whole when
# Cargo.lock, a compiler or the system libfabric changes, so it does not
# grow with old versions: ${FABRIC_MSG_BUILD_CACHE:-$HOME/.cache/fabric-msg-build},
# about 1 GB. FABRIC_MSG_BUILD_CACHE=off turns it off.
set -euo pipefail
cd "$(dirname "$0")/.."

cache=${FABRIC_MSG_BUILD_CACHE:-$HOME/.cache/fabric-msg-build}
[ "$cache" = off ] && { echo "ci/build-cache.sh: off (FABRIC_MSG_BUILD_CACHE=off): every build starts cold" >&2; exit 0; }
# The builds CI makes, each a target directory of its own under target/.
dirs=(debug asan libfabric-2)
workspace=(-p libfabric-sys -p fabric-msg -p fabric-msg-examples)

# What the kept artifacts were built with. A change drops the cache.
key() {
  sha256sum Cargo.lock | cut -d' ' -f1
  rustc -vV
  if command -v rustup >/dev/null && rustup toolchain list | grep -q '^nightly'; then rustc +nightly -vV; fi
  pkg-config --modversion libfabric 2>/dev/null || echo "no libfabric"
  cat "${FABRIC_MSG_TRIXIE_CACHE:-$HOME/.cache/fabric-msg-trixie}/root/usr/lib/x86_64-linux-gnu/pkgconfig/libfabric.pc" 2>/dev/null | grep '^Version' || true
}

case ${1:-} in
restore)
  if [ -e target/debug ]; then
    echo "ci/build-cache.sh: target/debug exists: building on it, nothing restored" >&2
    exit 0
  fi
  if [ ! -f "$cache/KEY" ] || [ "$(cat "$cache/KEY")" != "$(key)" ]; then
    echo "ci/build-cache.sh: no cache for this Cargo.lock, compilers and libfabric: a cold build" >&2
    exit 0
  fi
  t0=$SECONDS
  mkdir -p target
  for d in "${dirs[@]}"; do
    [ -d "$cache/$d" ] && cp -a "$cache/$d" target/
  done
  echo "ci/build-cache.sh: restored the dependencies' builds ($(du -sh target | cut -f1), $((SECONDS - t0)) s)" >&2
  ;;
save)
  [ -d target/debug ] || { echo "ci/build-cache.sh: nothing built, nothing saved" >&2; exit 0; }
  t0=$SECONDS
  # Hard links first (no copy of the workspace's gigabytes), the
  # workspace's artifacts unlinked from them, then a real copy of what is
  # left: the cache shares no file with a tree cargo may still write to.
  stage=target/.build-cache-stage
  rm -rf "$stage"
  mkdir -p "$stage"
  for d in "${dirs[@]}"; do
    [ -d "target/$d" ] && cp -al "target/$d" "$stage/"
  done
  # The workspace's own artifacts out (the host's layout, then ASan's
  # target-specific one; the 2.1 root's is a host layout of its own).
  [ -d "$stage/debug" ] && CARGO_TARGET_DIR=$stage cargo clean -q "${workspace[@]}"
  if [ -d "$stage/asan" ]; then
    CARGO_TARGET_DIR=$stage/asan cargo clean -q "${workspace[@]}"
    CARGO_TARGET_DIR=$stage/asan cargo clean -q "${workspace[@]}" --target x86_64-unknown-linux-gnu
  fi
  [ -d "$stage/libfabric-2" ] && CARGO_TARGET_DIR=$stage/libfabric-2 cargo clean -q "${workspace[@]}"
  mkdir -p "$(dirname "$cache")"
  tmp=$(mktemp -d "$cache.new.XXXXXX")
  cp -a "$stage"/. "$tmp"/
  rm -rf "$stage"
  key >"$tmp/KEY"
  # Swapped in whole: a run that restores meanwhile sees the old or the new.
  rm -rf "$cache.old"
  [ -d "$cache" ] && mv "$cache" "$cache.old"
  mv "$tmp" "$cache"
  rm -rf "$cache.old"
  echo "ci/build-cache.sh: saved the dependencies' builds in $cache ($(du -sh "$cache" | cut -f1), $((SECONDS - t0)) s)" >&2
  ;;
*)
  echo "ci/build-cache.sh: restore or save, not '${1:-}'" >&2
  exit 2
  ;;
esac
