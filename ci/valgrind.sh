#!/usr/bin/env bash
# The same-node transport's tests under valgrind's memcheck: its rings are
# shared memory read and written with raw pointers, where an invalid read,
# a use of uninitialised bytes or a leak is what valgrind finds and ASan
# (ci/asan.sh, which runs them too) may not. About 20 s here.
#
#   ci/valgrind.sh
#
# Runs fabric-msg/tests/node_loop.rs (every ring, matching and single-copy
# path, threads standing in for processes), and the library's unit tests
# of the node transport's lent memory (`transport::node::lent`: the
# collectives' working arrays sent from and received into), of the
# collective slots (`transport::node::slots`, and the protocol over them
# with threads standing in for ranks: `world::collectives::tests_on_node`) and of
# mapped symmetric memory's CPU atomics, with --error-exitcode, so any
# memcheck error or definite leak fails. valgrind 3.19 does not know
# pidfd_open (it warns and returns ENOSYS): the loops then watch no peer
# and take no peer's doorbell eventfd (their sleeps stay on the futex),
# which these tests do not need. Installs valgrind if missing.
set -euo pipefail
cd "$(dirname "$0")/.."
source ci/install.sh
command -v valgrind >/dev/null || install_packages valgrind.sh valgrind
# --workspace: the features the workspace's `cargo test` built fabric-msg
# with (the examples turn `tokio` on), so ci/test.sh's build serves here
# instead of a second one.
bin=$(cargo test --locked --workspace --test node_loop --no-run 2>&1 | sed -n 's/.*Executable .*(\(.*\))$/\1/p' | tail -n 1)
[ -x "$bin" ] || { echo "ci/valgrind.sh: the node_loop test binary was not built" >&2; exit 1; }
lib=$(cargo test --locked --workspace --lib --no-run 2>&1 | sed -n 's/.*Executable .*(\(.*\/fabric_msg-[0-9a-f]*\))$/\1/p' | tail -n 1)
[ -x "$lib" ] || { echo "ci/valgrind.sh: the library's test binary was not built" >&2; exit 1; }
memcheck() {
  timeout 600 valgrind --quiet --error-exitcode=9 --leak-check=full --show-leak-kinds=definite --errors-for-leak-kinds=definite \
    "$@" --test-threads 1 2> >(grep -v -e 'unhandled amd64-linux syscall: 434' -e 'You may be able to write' \
      -e 'README_MISSING_SYSCALL' -e 'Nevertheless we consider' -e 'valgrind.org/support/bug_reports' >&2)
}
memcheck "$bin"
memcheck "$lib" transport::node::lent transport::node::slots world::collectives::tests_on_node transport::event_loop::cpu_atomics
