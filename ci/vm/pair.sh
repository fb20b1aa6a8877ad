#!/bin/bash
# Run the same command in two test VMs joined by a virtual network: two
# hosts, each with its own soft-RoCE (rxe0) and soft-iWARP (siw0) device.
#
#   ci/vm/pair.sh [OPTIONS] -- COMMAND [ARG...]
#   ci/vm/pair.sh [OPTIONS] SCRIPT [ARG...]
#
# Guest N (1 or 2) is fabric-msg-vmN with two virtio NICs, each a link to
# the other guest (QEMU stream netdevs over UNIX sockets):
#
#   link   guest 1       guest 2       device
#   RoCE   198.18.2.1    198.18.2.2    rxe0 (soft-RoCE v2)
#   iWARP  198.18.3.1    198.18.3.2    siw0 (soft-iWARP)
#
# Both guests boot the image of ci/vm/build.sh and mount the repository (or
# --share DIR) at /host/repo, each with a scratch share of its own for its
# log and exit status (see ci/vm/run.sh). The command runs in both with
# FABRIC_MSG_NODE=1 or 2; it tells the two roles apart by that. Guest 1
# starts first (it listens on the link sockets), guest 2 once the sockets
# exist; a command that needs its peer waits for it (ping, or a client that
# retries while the server is not listening yet).
#
# Output: each guest's lines prefixed with "vm1| " or "vm2| ", as they come.
# Exit status: 0 when both commands exited 0, otherwise guest 1's non-zero
# status, else guest 2's (124: a timeout, 125: a harness failure, as in
# run.sh).
#
# Options are run.sh's (--timeout, --share, --no-share, --env, --userland,
# --console, --keep), given to both guests. Each guest has 1 vCPU and 768 MiB
# unless FABRIC_MSG_VM_CPUS or FABRIC_MSG_VM_MEM say otherwise.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

log() { echo "pair.sh: $*" >&2; }
die() { echo "pair.sh: error: $*" >&2; exit 125; }
usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0" >&2; exit "${1:-125}"; }

case ${1:-} in -h | --help) usage 0 ;; '') usage ;; esac
args=("$@")
for i in "${!args[@]}"; do
    case ${args[$i]} in
    --node | --link) die "${args[$i]} is set by pair.sh" ;;
    # For the image check below; run.sh reads the option itself too.
    --userland) export FABRIC_MSG_VM_USERLAND=${args[$((i + 1))]:-} ;;
    --) break ;;
    esac
done

export FABRIC_MSG_VM_CPUS=${FABRIC_MSG_VM_CPUS:-1}
export FABRIC_MSG_VM_MEM=${FABRIC_MSG_VM_MEM:-768M}

# Build or check the image once, before two run.sh race for it.
"$here/build.sh" || die "ci/vm/build.sh failed"

link=$(mktemp -d "${TMPDIR:-/tmp}/fabric-msg-pair.XXXXXX")
pid1=
cleanup() {
    [ -n "$pid1" ] && kill "$pid1" 2>/dev/null
    rm -rf "$link"
}
trap cleanup EXIT

# One guest, its lines prefixed; its status in $link/rcN.
guest() {  # N, then run.sh's arguments
    local n=$1 rc
    shift
    set +e
    "$here/run.sh" --node "$n" --link "$link" --env "FABRIC_MSG_NODE=$n" "$@" 2>&1 |
        sed -u "s/^/vm$n| /"
    rc=${PIPESTATUS[0]}
    set -e
    echo "$rc" >"$link/rc$n"
}

start=$SECONDS
guest 1 "$@" &
pid1=$!
# Guest 1's QEMU creates the link sockets as it starts (a second or so,
# more on a loaded machine).
for _ in $(seq 1 600); do
    [ -S "$link/roce.sock" ] && [ -S "$link/iwarp.sock" ] && break
    kill -0 "$pid1" 2>/dev/null || break
    sleep 0.1
done
if ! [ -S "$link/roce.sock" ] || ! [ -S "$link/iwarp.sock" ]; then
    wait "$pid1" || true
    die "guest 1 did not open the link sockets in $link"
fi
guest 2 "$@"
wait "$pid1" || true
pid1=
rc1=$(cat "$link/rc1" 2>/dev/null || echo 125)
rc2=$(cat "$link/rc2" 2>/dev/null || echo 125)
log "guest 1 exited with status $rc1, guest 2 with $rc2, after $((SECONDS - start)) s"
[ "$rc1" != 0 ] && exit "$rc1"
exit "$rc2"
