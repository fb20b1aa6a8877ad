#!/usr/bin/env bash
# Record what this host's libfabric lists for its software providers, as a
# classifier fixture: the entries of plain `fi_info -v` (no hints) whose
# domain is `lo`, `shm` or `sm2`, text unchanged, in the order printed.
#
#   ci/record-host-fixture.sh DIR
#       on the host: bookworm's libfabric 1.17
#   ci/libfabric2.sh -- ci/record-host-fixture.sh DIR
#       in the trixie root: libfabric 2.1
#
# Writes DIR/fi_info.txt and prints what ORIGIN.md (written by hand) needs:
# date, OS, libfabric, the command, the entry counts.
set -euo pipefail
dir=${1:?usage: ci/record-host-fixture.sh DIR}
mkdir -p "$dir"
raw=$(mktemp)
trap 'rm -f "$raw"' EXIT
fi_info -v >"$raw"
# Entries begin with a `---` line; keep those whose fi_domain_attr name is wanted.
awk '
    function flush() { if (keep) printf "%s", buf; buf = ""; keep = 0; indom = 0 }
    /^---$/ { flush() }
    { buf = buf $0 "\n" }
    /^    fi_domain_attr:$/ { indom = 1; next }
    indom && /^        name: / {
        name = substr($0, 15)
        keep = (name == "lo" || name == "shm" || name == "sm2")
        indom = 0
    }
    END { flush() }' "$raw" >"$dir/fi_info.txt"
{
    echo "recorded: $(date -u '+%Y-%m-%dT%H:%M:%SZ')"
    echo "os: $(. /etc/os-release && echo "$PRETTY_NAME")"
    fi_info --version | sed 's/^/fi_info --version: /'
    echo "libfabric1 package: $(dpkg-query -W -f='${Version}' 'libfabric1*' 2>/dev/null | head -c 40)"
    echo "command: fi_info -v (exit status 0), entries with domain lo, shm or sm2"
    echo "entries kept: $(grep -c '^---$' "$dir/fi_info.txt") of $(grep -c '^---$' "$raw")"
    echo "by provider and endpoint type:"
    awk '/^        type: FI_EP_/ { t = $2 } /^        prov_name: / { print "  " $2 " " t }' \
        "$dir/fi_info.txt" | sort | uniq -c
}
