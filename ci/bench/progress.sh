#!/usr/bin/env bash
# The progress thread's cost and worth (issue 14, item 3), two processes
# over 127.0.0.1 or shared memory:
#  1. latency of a spinning ping-pong without and with the thread
#     (`--progress-us 1000` on both sides), alternating A B A B per round:
#     `pingpong --msg` and `rma_pingpong` (writes with immediate data), on
#     tcp;ofi_rxm and shm, 8 B and 64 KiB;
#  2. the time of one RMA read when the target polls only once a second
#     (`rma_pingpong -o read`, server `--idle-ms`), with the thread waking
#     every 1000, 100 and 10 µs, and without it (then the server polls every
#     100 ms and the read waits for that poll), with the CPU time the
#     target's process used per second of the run (/usr/bin/time).
#
#   ROUNDS=5 ci/bench/progress.sh     # raw output in target/bench/progress-<time>/
#   PARTS=latency ci/bench/progress.sh  # only part 1 (PARTS=idle: only part 2)
set -euo pipefail
{
cd "$(dirname "$0")/../.."
ROUNDS=${ROUNDS:-5}
PARTS=${PARTS:-latency idle}
OUT=target/bench/progress-$(date -u +%Y%m%dT%H%M%S)
mkdir -p "$OUT"
cargo build -q --release -p fabric-msg-examples
bin=target/release

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}
await_listen() {
  for _ in $(seq 200); do
    [ -n "$(ss -Hltn "sport = :$1")" ] && return 0
    sleep 0.05
  done
  return 1
}
# run NAME TOOL "SERVER_ARGS" "CLIENT_ARGS": the server's /usr/bin/time
# line goes to NAME.time, the client's output to NAME.out.
run() {
  local name=$1 tool=$2 sargs=$3 cargs=$4 port
  port=$(free_port)
  # shellcheck disable=SC2086
  /usr/bin/time -f "%e %U %S" -o "$OUT/$name.time" timeout 120 "$bin/$tool" $sargs -B "$port" \
    >"$OUT/$name.server" 2>&1 &
  local spid=$!
  await_listen "$port" || { echo "$name: server did not listen" >&2; kill "$spid"; return 1; }
  # shellcheck disable=SC2086
  timeout 120 "$bin/$tool" $cargs -P "$port" 127.0.0.1 >"$OUT/$name.out" 2>&1 || echo "$name: client failed" >&2
  wait "$spid" || echo "$name: server failed" >&2
}
usec() { awk '$1 ~ /^[0-9]+$/ {print $(NF-1)}' "$1" | tail -1; }

echo -e "part\tprovider\ttool\tbytes\tmode\tround\tusec\tserver_wall_s\tserver_cpu_s" >"$OUT/results.tsv"
record() { # part provider tool bytes mode round name
  local t
  t=$(cat "$OUT/$7.time")
  read -r wall user sys <<<"$t"
  echo -e "$1\t$2\t$3\t$4\t$5\t$6\t$(usec "$OUT/$7.out")\t$wall\t$(echo "$user + $sys" | bc)" >>"$OUT/results.tsv"
}

for r in $(seq "$ROUNDS"); do
  for prov in "tcp;ofi_rxm" shm; do
    if [ "$prov" = shm ]; then common="-p shm --same-host"; n8=20000; n64=5000; else common="-p tcp;ofi_rxm -d lo"; n8=5000; n64=1000; fi
    for size in 8 65536; do
      [[ " $PARTS " == *" latency "* ]] || continue
      n=$n8; [ "$size" = 65536 ] && n=$n64
      for tool in pingpong rma_pingpong; do
        extra=""; [ "$tool" = pingpong ] && extra="--msg"
        for mode in off on; do
          pr=""; [ "$mode" = on ] && pr="--progress-us 1000"
          name="lat-${prov//;/_}-$tool-$size-$mode-$r"
          run "$name" "$tool" "$common $extra -S $size -I $n -W 100 $pr" "$common $extra -S $size -I $n -W 100 $pr"
          record latency "$prov" "$tool" "$size" "$mode" "$r" "$name"
        done
      done
    done
    # An RMA read to a target that polls once a second (every 100 ms
    # without a thread: each read then waits for that poll).
    for size in 8 65536; do
      [[ " $PARTS " == *" idle "* ]] || continue
      for mode in off on1000 on100 on10; do
        case $mode in
          off) pr=""; idle=100; n=20 ;;
          on*) pr="--progress-us ${mode#on}"; idle=1000; n=500 ;;
        esac
        name="idle-${prov//;/_}-$size-$mode-$r"
        run "$name" rma_pingpong "$common -o read -S $size -I $n -W 5 --idle-ms $idle $pr" "$common -o read -S $size -I $n -W 5"
        record idle_read "$prov" rma_pingpong "$size" "$mode" "$r" "$name"
      done
    done
  done
done

python3 - "$OUT/results.tsv" <<'PY'
import csv, statistics, sys, collections
rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
g = collections.defaultdict(list)
for r in rows:
    g[(r["part"], r["provider"], r["tool"], r["bytes"], r["mode"])].append(r)
print("part\tprovider\ttool\tbytes\tmode\tmedian_usec\tmin\tmax\tserver_cpu_per_wall_s")
for k, rs in sorted(g.items()):
    u = [float(r["usec"]) for r in rs if r["usec"]]
    cpu = [float(r["server_cpu_s"]) / float(r["server_wall_s"]) for r in rs if float(r["server_wall_s"]) > 0]
    if u:
        print("\t".join(k) + f"\t{statistics.median(u):.2f}\t{min(u):.2f}\t{max(u):.2f}\t{statistics.median(cpu):.2f}")
# per-round ratio on/off for the latency part
print()
print("provider\ttool\tbytes\tmedian ratio on/off (per round)")
by = collections.defaultdict(dict)
for r in rows:
    if r["part"] == "latency" and r["usec"]:
        by[(r["provider"], r["tool"], r["bytes"], r["round"])][r["mode"]] = float(r["usec"])
ratios = collections.defaultdict(list)
for (p, t, b, rd), m in by.items():
    if "on" in m and "off" in m:
        ratios[(p, t, b)].append(m["on"] / m["off"])
for k, v in sorted(ratios.items()):
    print("\t".join(k) + f"\t{statistics.median(v):.3f} ({min(v):.3f}-{max(v):.3f})")
PY
echo "raw: $OUT"
}
