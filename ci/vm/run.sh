#!/bin/bash
# Run a command inside the test VM (soft-RoCE rxe0 and soft-iWARP siw0).
#
#   ci/vm/run.sh [OPTIONS] -- COMMAND [ARG...]
#   ci/vm/run.sh [OPTIONS] SCRIPT [ARG...]
#
# Options:
#   --timeout SECS   wall-clock limit for the whole VM run (default 900)
#   --share DIR      directory mounted read-write at /host/repo in the guest
#                    (default: the repository root); the command starts there
#   --no-share       mount no directory at /host/repo
#   --env NAME=VAL   set a variable in the guest (repeatable). FI_*, RUST_LOG
#                    and RUST_BACKTRACE are passed through from the host;
#                    nothing else is set (FI_UNIVERSE_SIZE included).
#   --userland NAME  bookworm (default: libfabric 1.17) or trixie (libfabric
#                    2.1) packages in the guest; same kernel. Also
#                    FABRIC_MSG_VM_USERLAND. Binaries for the trixie guest
#                    are built in ci/libfabric2.sh's root (target/libfabric-2/).
#   --node 1|2       one guest of a pair (see ci/vm/pair.sh): instead of
#                    -nic none and dummy netdevs, two virtio NICs linked to
#                    the other guest through the UNIX sockets in --link DIR;
#                    guest N has 198.18.2.N (rxe0) and 198.18.3.N (siw0).
#                    Node 1 listens on the sockets, node 2 connects to them
#                    (start node 2 once DIR/roce.sock and DIR/iwarp.sock exist)
#   --link DIR       directory of the pair's link sockets (with --node)
#   --console        also stream the guest's serial console to stderr
#   --keep           keep the temporary share directory (log, rc, console.log)
#
# The command's output is streamed to stdout as the guest writes it. The exit
# status is the command's; 124 means the timeout was hit, 125 a harness
# failure (VM image missing, guest never reported a status).
#
# Environment: FABRIC_MSG_VM_CACHE (see build.sh), FABRIC_MSG_VM_MEM (2G),
# FABRIC_MSG_VM_CPUS (2), FABRIC_MSG_VM_ACCEL (tcg: KVM on this kind of
# machine is nested and hangs the guest).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
cache=${FABRIC_MSG_VM_CACHE:-$HOME/.cache/fabric-msg-vm}

log() { echo "run.sh: $*" >&2; }
die() { echo "run.sh: error: $*" >&2; exit 125; }
usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0" >&2; exit "${1:-125}"; }

timeout=900
share_dir=$repo
console=0
keep=0
node=
link=
script_mode=1  # until "--" is seen
envs=()
while [ $# -gt 0 ]; do
    case $1 in
    --timeout) timeout=${2:?--timeout needs a value}; shift 2 ;;
    --share) share_dir=$(cd "${2:?--share needs a directory}" && pwd) || die "no such directory: $2"; shift 2 ;;
    --no-share) share_dir=; shift ;;
    --env) [[ ${2:-} == [A-Za-z_]*=* ]] || die "--env needs NAME=VALUE"; envs+=("$2"); shift 2 ;;
    --userland) export FABRIC_MSG_VM_USERLAND=${2:?--userland needs bookworm or trixie}; shift 2 ;;
    --node) node=${2:?--node needs 1 or 2}; shift 2 ;;
    --link) link=$(cd "${2:?--link needs a directory}" && pwd) || die "no such directory: $2"; shift 2 ;;
    --console) console=1; shift ;;
    --keep) keep=1; shift ;;
    -h | --help) usage 0 ;;
    --) shift; script_mode=0; break ;;
    -*) die "unknown option $1 (see --help)" ;;
    *) break ;;
    esac
done
[ $# -gt 0 ] || usage
[[ $timeout =~ ^[0-9]+$ ]] || die "--timeout needs a number of seconds"
case $node in
'') [ -z "$link" ] || die "--link needs --node" ;;
1 | 2) [ -n "$link" ] || die "--node needs --link DIR" ;;
*) die "--node is 1 or 2, not $node" ;;
esac
[ "$script_mode" = 0 ] || [ -f "$1" ] ||
    die "no such script: $1 (to run a guest command, put it after --)"

# Make sure the image is there and current (quick when it is).
"$here/build.sh" || die "ci/vm/build.sh failed"
image=$cache/image
[ "${FABRIC_MSG_VM_USERLAND:-bookworm}" = trixie ] && image=$cache/image-trixie
for f in vmlinuz initrd.img; do
    [ -f "$image/$f" ] || die "missing $image/$f (run ci/vm/build.sh)"
done

share=$(mktemp -d "${TMPDIR:-/tmp}/fabric-msg-vm.XXXXXX")
pids=()
cleanup() {
    local p
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    if [ "$keep" = 1 ]; then log "kept $share"; else rm -rf "$share"; fi
}
trap cleanup EXIT

# The command. After "--" it runs as given (from /host/repo). A SCRIPT (a
# host path) runs in place when it lies inside the shared directory, so it
# can find its neighbours, otherwise from a copy.
cmd=("$@")
if [ "$script_mode" = 1 ]; then
    script=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
    if [ -n "$share_dir" ] && [[ $script == "$share_dir"/* ]]; then
        cmd[0]=/host/repo/${script#"$share_dir"/}
    else
        cp "$script" "$share/job"
        chmod +x "$share/job"
        cmd[0]=/host/job
    fi
fi

# Variables for the guest: pass-through first, --env last (wins).
while IFS= read -r name; do
    envs=("$name=${!name}" "${envs[@]}")
done < <(compgen -e | grep -E '^(FI_[A-Za-z0-9_]*|RUST_LOG|RUST_BACKTRACE)$' || true)

{
    echo '#!/bin/bash'
    echo '# Generated by ci/vm/run.sh'
    for e in "${envs[@]}"; do printf 'export %s=%q\n' "${e%%=*}" "${e#*=}"; done
    if [ -n "$share_dir" ]; then echo 'cd /host/repo'; else echo 'cd /host'; fi
    printf 'exec'
    printf ' %q' "${cmd[@]}"
    echo
} >"$share/run.sh"
chmod +x "$share/run.sh"

virtfs=(-virtfs "local,path=$share,mount_tag=host0,security_model=none,multidevs=remap,id=host0")
if [ -n "$share_dir" ]; then
    mkdir "$share/repo"  # mount point; tells the guest's /init to mount host1
    virtfs+=(-virtfs "local,path=$share_dir,mount_tag=host1,security_model=none,multidevs=remap,id=host1")
fi

# Networking: none, or (--node) two virtio NICs joined to the other guest
# of a pair by QEMU stream netdevs over UNIX sockets, one link for rxe0 and
# one for siw0. The MACs tell the guest's /init which NIC is which.
net=(-nic none)
append="console=ttyS0 quiet loglevel=3 panic=-1"
if [ -n "$node" ]; then
    server=on
    [ "$node" = 2 ] && server=off
    net=()
    # event_idx=off,mrg_rxbuf=off: with QEMU 7.2's virtio-net under TCG
    # and both on (QEMU's defaults), a link between the two guests stopped
    # for good after minutes of 1 MiB iWARP ping-pongs: a dozen frames
    # stuck each way, no error in either guest, the same with a dgram
    # netdev (ci/matrix/link-stress-guest.sh: round 9, and 7 with dgram);
    # with both off it passed 30 and 45 rounds (docs/two-host.md).
    for l in 2:roce 3:iwarp; do
        net+=(-netdev "stream,id=${l#*:},server=$server,addr.type=unix,addr.path=$link/${l#*:}.sock"
            -device "virtio-net-pci,netdev=${l#*:},mac=02:00:c6:12:0${l%%:*}:0$node,event_idx=off,mrg_rxbuf=off")
    done
    append+=" fabric_msg.node=$node"
fi

accel=${FABRIC_MSG_VM_ACCEL:-tcg}
cpu=max
[ "$accel" = kvm ] && cpu=host
qemu=(qemu-system-x86_64 -machine "q35,accel=$accel" -cpu "$cpu"
    -m "${FABRIC_MSG_VM_MEM:-2G}" -smp "${FABRIC_MSG_VM_CPUS:-2}"
    -nographic "${net[@]}" -no-reboot
    -kernel "$image/vmlinuz" -initrd "$image/initrd.img"
    -append "$append"
    "${virtfs[@]}")

start=$SECONDS
# timeout(1) sends TERM at the limit, KILL 10 s later; it exits 124 then.
timeout -k 10 "$timeout" "${qemu[@]}" </dev/null >"$share/console.log" 2>&1 &
qpid=$!
pids+=("$qpid")
# Stream the job's log (written by the guest over 9p) while the VM runs;
# tail exits after a last read once QEMU is gone.
tail -n +1 -s 0.2 -F --pid="$qpid" "$share/log" 2>/dev/null &
pids+=("$!")
if [ "$console" = 1 ]; then
    tail -n +1 -s 0.2 -F --pid="$qpid" "$share/console.log" >&2 2>/dev/null &
    pids+=("$!")
fi
qrc=0
wait "$qpid" || qrc=$?
wait "${pids[@]:1}" 2>/dev/null || true
elapsed=$((SECONDS - start))

show_console() {
    local where="--keep keeps it"
    [ "$keep" = 1 ] && where=$share/console.log
    log "last lines of the guest console ($where):"
    # Drop the terminal escapes (reset, clear screen) that SeaBIOS prints.
    tail -n 30 "$share/console.log" | sed -e 's/\x1bc//g' -e 's/\x1b\[[0-9;?]*[A-Za-z]//g' -e 's/^/    /' >&2
}
# The guest's /init reports set-up problems as "init: WARNING|FATAL ...".
grep -E '^init: (WARNING|FATAL)' "$share/console.log" | sed 's/^/run.sh: guest /' >&2 || true

if [ "$qrc" = 124 ] || [ "$qrc" = 137 ]; then
    log "error: timed out after ${timeout} s; QEMU killed"
    show_console
    exit 124
fi
if [ ! -s "$share/rc" ]; then
    log "error: the guest reported no exit status (QEMU exit $qrc after ${elapsed} s)"
    show_console
    exit 125
fi
rc=$(cat "$share/rc")
log "guest command exited with status $rc after ${elapsed} s"
exit "$rc"
