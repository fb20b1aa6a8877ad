#!/usr/bin/env bash
# The whole test suite, as CI runs it: set-up, formatting, lints, tests, docs.
set -euo pipefail
cd "$(dirname "$0")/.."
# In a private mount namespace with a short /proc/kallsyms, for libfabric's
# start-up in each of the tests' processes (may run this script again).
source ci/kallsyms.sh
source ci/setup.sh

export RUSTFLAGS="${RUSTFLAGS:-} -D warnings"
export RUSTDOCFLAGS="${RUSTDOCFLAGS:-} -D warnings"
# The build every stage below shares (the host's tests and tools, ASan's,
# the 2.1 root's, the binaries the VM guests run): optimised (opt-level 1),
# with line tables for backtraces and no incremental cache, which a build
# made once never reads. The tests spend their time in fabric-msg's and the
# tools' own code (checks of every byte, reductions against references,
# ranks polling): on this 2-core machine opt-level 1 ran them in half the
# time for 1.7 times the build (docs/decisions.md, "CI's time"). Debug
# assertions and overflow checks stay on. Set any of these to override.
export CARGO_PROFILE_DEV_OPT_LEVEL=${CARGO_PROFILE_DEV_OPT_LEVEL:-1}
export CARGO_PROFILE_DEV_DEBUG=${CARGO_PROFILE_DEV_DEBUG:-line-tables-only}
export CARGO_INCREMENTAL=${CARGO_INCREMENTAL:-0}

# Each step says how long the one before took, and the last line the
# whole run's time: where CI's minutes go (it should stay under 30 warm).
started=$SECONDS last=$SECONDS
step() {
  [ "$last" != "$SECONDS" ] && printf '    (%ss)\n' "$((SECONDS - last))" >&2
  last=$SECONDS
  printf '\n==> %s\n' "$*" >&2
}
# What this run starts, it stops: the one-node Slurm that the tests bring
# up (ci/slurm.sh, reused across test binaries) is stopped at the end,
# unless it was already running before this run.
slurm_dir=${FABRIC_MSG_SLURM_DIR:-/tmp/fabric-msg-slurm}
slurm_was_up=0
if [ -s "$slurm_dir/slurmctld.pid" ] && kill -0 "$(cat "$slurm_dir/slurmctld.pid")" 2>/dev/null; then
  slurm_was_up=1
fi
ahead_pid=
finish() {
  # A stage failed before the background builds ended: they stop too.
  if [ -n "$ahead_pid" ] && kill -0 "$ahead_pid" 2>/dev/null; then
    kill -- -"$ahead_pid" 2>/dev/null || true
  fi
  printf "    (%ss)\n" "$((SECONDS - last))" >&2
  # The dependencies' builds, for the next run on this machine.
  bash ci/build-cache.sh save || echo "ci/test.sh: the build cache was not saved (ci/build-cache.sh save)" >&2
  printf "\nci/test.sh: %ss in all\n" "$((SECONDS - started))" >&2
  if [ "$slurm_was_up" = 0 ] && [ -d "$slurm_dir" ]; then
    bash ci/slurm.sh stop >&2 || echo "ci/test.sh: could not stop the tests' Slurm (ci/slurm.sh stop)" >&2
  fi
  # The tests' mpiruns' session directories (examples/tests/support):
  # Open MPI empties them; the directories themselves stay.
  rmdir /tmp/fm-ompi-* 2>/dev/null || true
  # ci/kallsyms.sh's file (its bind mount ends with this namespace).
  [ -z "${FABRIC_MSG_KALLSYMS_CUT:-}" ] || rm -f "$FABRIC_MSG_KALLSYMS_CUT"
}
trap finish EXIT

step "the dependencies' builds from the last run on this machine (ci/build-cache.sh)"
bash ci/build-cache.sh restore

step "source layout (layers, import cycles, file sizes)"
python3 ci/check-layers.py

step "cargo fmt --check"
cargo fmt --all --check

step "cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "cargo test"
timeout 1200 cargo test --workspace --locked --no-run
# The builds of the stages below (ASan's, the 2.1 root's clippy and
# build, the guests' images), made now, in the background, at idle
# priority (SCHED_IDLE: the kernel runs them only on a core nothing else
# wants). The host's tests leave about a third of the 2 cores idle (131 %
# CPU over 307 s); these builds take it, at a cost: the tests ran 25 %
# longer beside them (385 s), likely as the two cores share one physical
# core, against 3 to 4 minutes of builds saved. A stage that
# comes before its build is done waits for it (cargo's lock on its target
# directory, the trixie root's lock); a build that failed here fails again,
# in the foreground, in its stage. Its log: target/ci-ahead.log.
ahead_log=target/ci-ahead.log
ahead() {
  local t0=$SECONDS rc=0
  echo "ci-ahead: ASan's build" >&2
  bash ci/asan.sh --build || rc=$?
  echo "ci-ahead: ASan's build ended with status $rc after $((SECONDS - t0)) s" >&2
  if [ "${FABRIC_MSG_SKIP_LIBFABRIC2:-0}" != 1 ]; then
    t0=$SECONDS rc=0
    bash ci/libfabric2.sh --build || rc=$?
    echo "ci-ahead: the 2.1 root's clippy and build ended with status $rc after $((SECONDS - t0)) s" >&2
  fi
  # The guests' images (a no-op when they are up to date; 40 s each when
  # the kernel or a package changed, downloads included).
  if [ "${FABRIC_MSG_SKIP_VM:-0}" != 1 ]; then
    t0=$SECONDS rc=0
    bash ci/vm/build.sh || rc=$?
    [ "${FABRIC_MSG_SKIP_LIBFABRIC2:-0}" = 1 ] || FABRIC_MSG_VM_USERLAND=trixie bash ci/vm/build.sh || rc=$?
    echo "ci-ahead: the guests' images ended with status $rc after $((SECONDS - t0)) s" >&2
  fi
}
setsid chrt --idle 0 bash -c "$(declare -f ahead); ahead" >"$ahead_log" 2>&1 &
ahead_pid=$!
# Nothing may hang CI: the suite takes about five minutes here.
timeout 1200 cargo test --workspace --locked

step "the World's tests on libfabric's shm, the same-node side's fall-back (FABRIC_MSG_TEST_SHM=libfabric)"
# The step above ran them on fabric-msg's node transport (the default);
# these are the tests whose ranks share a node (docs/onnode.md, "Both
# same-node sides are tested"). 122 s in CI on 2026-12-02.
FABRIC_MSG_TEST_SHM=libfabric timeout 900 cargo test --workspace --locked --test examples -- \
  world:: collectives:: model:: symmetric:: world_soak:: --skip async_world::

step "the World over pretend nodes without one matching engine, its fall-back (FABRIC_MSG_ONE_ENGINE=0)"
# The suite above matches every application message of a World over
# nodes in one engine (the default: docs/world.md, "One matching
# engine"); these run the pairing it falls back to (a rank that refuses
# the engine, a fabric whose masked receives match wrongly).
FABRIC_MSG_ONE_ENGINE=0 timeout 600 cargo test --workspace --locked --test examples -- \
  world_soak::random_mixes_over_two_nodes model::model_check_under_mpirun_on_two_pretend_nodes \
  world_local::any_source world_local::receives_from_one_rank_and_from_any

step "valgrind memcheck: the same-node transport's rings"
bash ci/valgrind.sh

step "AddressSanitizer and LeakSanitizer (nightly): the tests, no invalid access, no leak of ours"
# 4 to 9 minutes here (ci/asan.sh; docs/reliability.md, "Hygiene").
bash ci/asan.sh

step "cargo doc"
cargo doc --workspace --no-deps --locked

step "libfabric 2.1: clippy, tests and tools in a Debian trixie root"
if [ "${FABRIC_MSG_SKIP_LIBFABRIC2:-0}" = 1 ]; then
  echo "ci/test.sh: SKIPPED (FABRIC_MSG_SKIP_LIBFABRIC2=1): libfabric 2.x NOT tested" >&2
else
  # The background builds (above) end first: their log goes here.
  if [ -n "$ahead_pid" ]; then
    wait "$ahead_pid" || true
    ahead_pid=
    sed 's/^/    ahead| /' "$ahead_log" | grep -v '^    ahead|  *\(Compiling\|Checking\)' >&2 || true
  fi
  bash ci/libfabric2.sh
fi

step "fabric matrix (soft-RoCE and soft-iWARP in a QEMU guest), libfabric 1.17 and 2.1 side by side"
# One guest each, at once: a TCG guest here keeps about one of the 2
# cores busy, so the two took 190 s side by side against 245 s one after
# the other (2026-11-29). Each line says which guest it is from.
matrix() { # USERLAND LABEL
  local rc=0
  bash ci/fabric-matrix.sh "$1" 2>&1 | sed -u "s/^/$2| /" || rc=$?
  echo "ci/test.sh: the fabric matrix on $2 ended with status $rc" >&2
  return "$rc"
}
matrix bookworm 1.17 &
m117=$!
if [ "${FABRIC_MSG_SKIP_LIBFABRIC2:-0}" = 1 ]; then
  echo "ci/test.sh: SKIPPED (FABRIC_MSG_SKIP_LIBFABRIC2=1): RoCE and iWARP on libfabric 2.x NOT tested" >&2
  m21=
else
  matrix trixie 2.1 &
  m21=$!
fi
rc117=0 rc21=0
wait "$m117" || rc117=$?
[ -z "$m21" ] || wait "$m21" || rc21=$?
[ "$rc117" = 0 ] && [ "$rc21" = 0 ] || { echo "ci/test.sh: the fabric matrix FAILED (1.17: $rc117, 2.1: $rc21)" >&2; exit 1; }

step "two hosts: RoCE and iWARP between two QEMU guests, libfabric 1.17"
bash ci/two-host.sh

step "two hosts, libfabric 2.1 (trixie's packages in both guests)"
if [ "${FABRIC_MSG_SKIP_LIBFABRIC2:-0}" = 1 ]; then
  echo "ci/test.sh: SKIPPED (FABRIC_MSG_SKIP_LIBFABRIC2=1): RoCE and iWARP between two hosts on libfabric 2.x NOT tested" >&2
else
  bash ci/two-host.sh trixie
fi
