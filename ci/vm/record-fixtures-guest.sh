#!/bin/bash
# Guest half of ci/vm/record-fixtures.sh: runs inside the test VM with the
# output directory as its working directory and records raw command output
# under raw/. The host half cuts it into per-device fixtures.
set -uo pipefail  # no -e: a failing command is recorded, not fatal

mkdir -p raw
cd raw || exit 1

# out FILE CMD...: exact stdout to FILE, stderr to FILE.err, status to FILE.rc
out() {
    local f=$1
    shift
    "$@" >"$f" 2>"$f.err"
    echo $? >"$f.rc"
}

date -u '+%Y-%m-%dT%H:%M:%SZ' >date.txt
uname -r >uname.txt
out fi_info-version.txt fi_info --version

out fi_info-v.txt fi_info -v
out fi_info-v-p-verbs.txt fi_info -v -p verbs
out fi_info-v-p-verbs_ofi_rxm.txt fi_info -v -p 'verbs;ofi_rxm'

for dev in rxe0 siw0; do
    out "ibv_devinfo-v-d-$dev.txt" ibv_devinfo -v -d "$dev"
    d=/sys/class/infiniband/$dev
    for f in "$d/node_type" "$d/node_guid" "$d"/ports/*/link_layer \
        "$d"/ports/*/state "$d"/ports/*/rate; do
        [ -r "$f" ] && v=$(cat "$f" 2>/dev/null) || continue
        v=${v#"${v%%[![:space:]]*}"}  # trim leading white space
        v=${v%"${v##*[![:space:]]}"}  # trim trailing white space
        echo "$f: $v"
    done >"sysfs-$dev.txt"
done

# Checks that are reported, not kept as fixtures: does verbs;ofi_rxm work
# on rxe0 with libfabric's default FI_UNIVERSE_SIZE?
check() {
    echo "### \$ $*"
    "$@" 2>&1
    echo "### exit status $?"
    echo
}
# pingpong PORT DOMAIN [VAR=VALUE...]: server and client in this guest.
pingpong() {
    local port=$1 dom=$2 addr
    shift 2
    case $dom in rxe0) addr=198.18.0.1 ;; siw0) addr=198.18.1.1 ;; esac
    local args=(-p 'verbs;ofi_rxm' -e rdm -d "$dom" -S 64 -I 100)
    echo "### server: $* fi_pingpong ${args[*]} -B $port"
    echo "### client: $* fi_pingpong ${args[*]} -P $port $addr"
    env "$@" timeout 60 fi_pingpong "${args[@]}" -B "$port" >server.out 2>&1 &
    local spid=$!
    sleep 3
    env "$@" timeout 60 fi_pingpong "${args[@]}" -P "$port" "$addr" >client.out 2>&1
    local crc=$?
    wait "$spid"
    local src=$?
    echo "--- server output (exit status $src):"
    cat server.out
    echo "--- client output (exit status $crc):"
    cat client.out
    echo
}
{
    check fi_info -p 'verbs;ofi_rxm' -t FI_EP_RDM
    pingpong 47601 rxe0
    pingpong 47602 rxe0 FI_UNIVERSE_SIZE=64
    pingpong 47603 siw0
    rm -f server.out client.out
} >checks.txt 2>&1
exit 0
