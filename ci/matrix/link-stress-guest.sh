#!/usr/bin/env bash
# Runs in both guests of ci/vm/pair.sh: heavy iWARP traffic between the
# two hosts until the link between them stops or N rounds pass. Each round
# is a pingpong of 40 1 MiB messages over verbs MSG on siw0 (guest 1 the
# server), then a ping of the other guest. This is what found the QEMU 7.2
# virtio-net stall that ci/vm/run.sh's NIC options avoid: with QEMU's
# defaults the link died for good within 7 to 9 rounds, with a dozen
# frames stuck each way and no error in either guest.
#
#   ci/vm/pair.sh --timeout 1200 --env STRESS_ROUNDS=30 -- bash ci/matrix/link-stress-guest.sh
set -uo pipefail
node=${FABRIC_MSG_NODE:?FABRIC_MSG_NODE is 1 or 2 (ci/vm/pair.sh sets it)}
bin=${FABRIC_MSG_TARGET_DIR:-target}/debug
other=198.18.3.$((3 - node))
rounds=${STRESS_ROUNDS:-30}
pp=("$bin/pingpong" -e msg -p verbs -d siw0 -S 1048576 -I 40 -W 1)
for i in $(seq 1 "$rounds"); do
  port=$((9600 + i))
  if [ "$node" = 1 ]; then
    out=$(timeout -k 5 60 "${pp[@]}" -B "$port" 2>&1)
    rc=$?
  else
    for _ in $(seq 1 60); do
      out=$(timeout -k 5 60 "${pp[@]}" -P "$port" 198.18.3.1 2>&1)
      rc=$?
      [ "$rc" != 0 ] && grep -q 'Connection refused' <<<"$out" && { sleep 0.5; continue; }
      break
    done
  fi
  if ! ping -c 3 -W 1 "$other" >/dev/null 2>&1; then
    echo "link-stress: vm$node: the link to $other stopped in round $i (pingpong exit $rc)"
    tail -n 3 <<<"$out"
    ip -s link show eth1
    exit 1
  fi
  echo "link-stress: vm$node: round $i, pingpong exit $rc"
done
echo "link-stress: vm$node: $rounds rounds, the link still up"
