#!/usr/bin/env bash
# One shm message-rate run of our `bandwidth` at 8 B, window 64, the server
# on CPU 1 and the client on CPU 0; prints million messages per second.
#
#   ci/bench/rate_one.sh [BANDWIDTH]     # default target/release/bandwidth
#   ci/libfabric2.sh -- ci/bench/rate_one.sh target/libfabric-2/release/bandwidth
#
# The same run as ci/bench/ab.sh's peers section with PIN=cores, for quick
# A/B rounds of two builds (alternate them by hand).
set -euo pipefail
cd "$(dirname "$0")/../.."
BW=${1:-target/release/bandwidth}
command -v jq >/dev/null || { echo "rate_one.sh: needs jq (ci/bench/ab.sh installs it; or apt-get install jq)" >&2; exit 2; }
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
timeout -k 5 60 taskset -c 1 "$BW" -p shm --same-host -B "$port" >/dev/null 2>&1 &
server=$!
for _ in $(seq 200); do
  [ -n "$(ss -Hltn "sport = :$port")" ] && break
  sleep 0.02
done
timeout -k 5 60 taskset -c 0 "$BW" -p shm --same-host -S 8 -I 1000000 -W 100000 -w 64 --json \
  -P "$port" 127.0.0.1 | tail -n 1 | jq '1 / .usec_per_xfer'
wait "$server"
