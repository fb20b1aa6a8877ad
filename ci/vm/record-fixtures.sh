#!/bin/bash
# Record the soft-RoCE (rxe0) and soft-iWARP (siw0) host fixtures in the
# test VM:
#   fabric-msg/tests/fixtures/hosts/softroce-rxe0-qemu/
#   fabric-msg/tests/fixtures/hosts/softiwarp-siw0-qemu/
# Writes fi_info.txt (fi_info -v -p verbs), fi_info-no-hints.txt (plain
# fi_info -v), sysfs.txt and ibv_devinfo.txt there (ORIGIN.md is written by
# hand) and prints the extra checks of record-fixtures-guest.sh.
#
# With --userland trixie the guest has trixie's libfabric 2.1 and the
# fixtures go to softroce-rxe0-qemu-libfabric-2.1/ and
# softiwarp-siw0-qemu-libfabric-2.1/ instead.
#
# usage: ci/vm/record-fixtures.sh [--keep] [--userland bookworm|trixie]
#        (--keep: keep the raw output)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
fixtures=$(cd "$here/../.." && pwd)/fabric-msg/tests/fixtures/hosts
keep=0
userland=bookworm
while [ $# -gt 0 ]; do
    case $1 in
    --keep) keep=1; shift ;;
    --userland) userland=${2:?--userland needs bookworm or trixie}; shift 2 ;;
    *) echo "record-fixtures.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
suffix=
[ "$userland" = trixie ] && suffix=-libfabric-2.1

raw_dir=$(mktemp -d "${TMPDIR:-/tmp}/fabric-msg-fixtures.XXXXXX")
[ "$keep" = 1 ] || trap 'rm -rf "$raw_dir"' EXIT
"$here/run.sh" --userland "$userland" --timeout 900 --share "$raw_dir" "$here/record-fixtures-guest.sh"
raw=$raw_dir/raw

# fi_info -v entries (each starts with a "---" line) whose domain is DEV or
# DEV-dgram, in the order printed, text unchanged.
entries_of() {  # FILE DEV
    awk -v dev="$2" '
        function flush() { if (keep) printf "%s", buf; buf = ""; keep = 0; indom = 0 }
        /^---$/ { flush() }
        { buf = buf $0 "\n" }
        /^    fi_domain_attr:$/ { indom = 1; next }
        indom && /^        name: / {
            name = substr($0, 15)
            keep = (name == dev || name == dev "-dgram")
            indom = 0
        }
        END { flush() }' "$1"
}
# The entries of a FILE whose provider is exactly "verbs;ofi_rxm".
rxm_entries() {
    awk '
        function flush() { if (keep) printf "%s", buf; buf = ""; keep = 0 }
        /^---$/ { flush() }
        { buf = buf $0 "\n" }
        /^        prov_name: verbs;ofi_rxm$/ { keep = 1 }
        END { flush() }' "$1"
}

for f in fi_info-v.txt fi_info-v-p-verbs.txt fi_info-v-p-verbs_ofi_rxm.txt; do
    [ "$(cat "$raw/$f.rc")" = 0 ] || echo "record-fixtures.sh: warning: $f: exit status $(cat "$raw/$f.rc")" >&2
done

declare -A dirs=([rxe0]=softroce-rxe0-qemu$suffix [siw0]=softiwarp-siw0-qemu$suffix)
for dev in rxe0 siw0; do
    dir=$fixtures/${dirs[$dev]}
    mkdir -p "$dir"
    entries_of "$raw/fi_info-v-p-verbs.txt" "$dev" >"$dir/fi_info.txt"
    entries_of "$raw/fi_info-v.txt" "$dev" >"$dir/fi_info-no-hints.txt"
    cp "$raw/sysfs-$dev.txt" "$dir/sysfs.txt"
    cp "$raw/ibv_devinfo-v-d-$dev.txt" "$dir/ibv_devinfo.txt"
    [ -s "$dir/fi_info.txt" ] || echo "record-fixtures.sh: warning: no fi_info entries for $dev" >&2

    # Cross-checks for ORIGIN.md.
    cp "$dir/fi_info-no-hints.txt" "$raw/plain-$dev.txt"
    entries_of "$raw/fi_info-v-p-verbs_ofi_rxm.txt" "$dev" >"$raw/rxm-$dev.txt"
    rxm_entries "$dir/fi_info.txt" >"$raw/rxm-subset-$dev.txt"
    echo "== $dev -> $dir"
    echo "   entries: $(grep -c '^---$' "$dir/fi_info.txt") (fi_info -v -p verbs)," \
        "$(grep -c '^---$' "$raw/plain-$dev.txt") (plain fi_info -v)," \
        "$(grep -c '^---$' "$raw/rxm-$dev.txt") (fi_info -v -p 'verbs;ofi_rxm')"
    if cmp -s "$raw/rxm-$dev.txt" "$raw/rxm-subset-$dev.txt"; then
        echo "   -p 'verbs;ofi_rxm' output == the verbs;ofi_rxm entries of -p verbs"
    else
        echo "   -p 'verbs;ofi_rxm' output DIFFERS from the verbs;ofi_rxm entries of -p verbs"
    fi
    if cmp -s "$raw/plain-$dev.txt" "$dir/fi_info.txt"; then
        echo "   plain fi_info -v entries == fi_info -v -p verbs entries"
    else
        echo "   plain fi_info -v entries differ from fi_info -v -p verbs entries"
    fi
done
echo "== recorded $(cat "$raw/date.txt"), kernel $(cat "$raw/uname.txt")"
sed 's/^/   /' "$raw/fi_info-version.txt"
echo "== checks (not fixtures)"
cat "$raw/checks.txt"
[ "$keep" = 1 ] && echo "raw output kept in $raw"
exit 0
