#!/usr/bin/env bash
# A/B benchmark: our tools against the C tools, alternately, on loopback.
#
#   ci/bench/ab.sh                 # 5 rounds, every provider and size
#   ROUNDS=3 PROVIDERS="shm" SIZES="8 4096" ci/bench/ab.sh
#   MODES="msg tagged" ci/bench/ab.sh     # untagged (default) and tagged
#   PROVIDERS="tcp/rdm tcp;ofi_rxm" ci/bench/ab.sh  # tcp's own RDM endpoints (libfabric >= 1.18)
#   SECTIONS=pp ci/bench/ab.sh     # only part 1 (default: "pp bw wait peers")
#   SECTIONS=peers ROUNDS=3 ci/bench/ab.sh  # only part 4, UCX and Open MPI
#   SECTIONS=peers PIN=cores PEER_CLASSES=shm PEER_SIZES=8 STREAM_SIZES=8 ci/bench/ab.sh
#                                  # part 4, shm at 8 B only, each side on its own core
#
# Provider tokens: `tcp` is tcp's connected (MSG) endpoints, `tcp/rdm` its
# own RDM endpoints (libfabric 1.18 and newer; our tool is held to exactly
# that provider with a one-rung ladder), `shm`, and any other name is used
# with `-e rdm`. It runs against whatever libfabric the tools find: the
# host's, or trixie's 2.1 with `ci/libfabric2.sh -- ci/bench/ab.sh`
# (build output then goes to $CARGO_TARGET_DIR).
#
# Rounds alternate A B A B (ours, then the C tool, then ours ...) so load
# from other processes falls on both; compare ratios, not absolute numbers.
#
# 1. pingpong vs Debian's fi_pingpong (libfabric-bin): same provider,
#    endpoint type and tagged/untagged, two processes over 127.0.0.1.
# 2. bandwidth vs iperf3 at 1 MiB over 127.0.0.1, about 2 s each (10 GiB).
# 3. pingpong -c fd (blocking, after the default 50 us spin) and
#    -c fd --spin-us 0 (sleeping at once) vs -c spin on tcp;ofi_rxm at 8 bytes.
# 4. peers: ours, fi_pingpong, UCX (ucx_perftest, Debian's ucx-utils) and
#    Open MPI (ci/bench/pingpong_mpi.c, built with mpicc into target/bench/, or $CARGO_TARGET_DIR/bench/),
#    one after the other for every size of every round, per transport class:
#    TCP (ours and fi_pingpong on tcp msg endpoints and on tcp;ofi_rxm, UCX
#    with UCX_TLS=tcp,self on lo, Open MPI's tcp BTL on lo) and shared
#    memory (shm, and `node`: fabric-msg's own same-node transport,
#    node_pingpong; UCX_TLS=posix,self,cma; Open MPI's vader BTL). Latency is
#    one-way usec at PEER_SIZES, tagged (untagged on tcp msg endpoints, which
#    have no tags); message rate at 8 B and bandwidth at 1 MiB stream a
#    window of 64 (ours: `bandwidth -w 64`). The load average at the start of
#    each round goes to $OUT/loadavg.txt. PIN says where every tool of
#    part 4 runs, all alike: `none` (the default) leaves both processes to
#    the scheduler (mpirun --bind-to none; without it Open MPI binds two
#    ranks to a core each, unlike the others), `cores` puts the server (or
#    rank 1) on CPU 1 and the client (rank 0) on CPU 0 (taskset -c;
#    mpirun --bind-to core). On 2 cores unpinned runs are bimodal: both
#    processes sometimes share one core. PEER_CLASSES ("tcp shm") and
#    STREAM_SIZES ("8 1048576") narrow part 4.
#
# Every process runs under `timeout`; servers that outlive their client are
# killed; ports are free ports the kernel picked. Raw outputs go to
# $OUT (default target/bench/<time>/).
set -euo pipefail
cd "$(dirname "$0")/../.."

ROUNDS=${ROUNDS:-5}
SIZES=${SIZES:-"8 64 4096 65536 1048576"}
PROVIDERS=${PROVIDERS:-"tcp tcp;ofi_rxm shm"}
MODES=${MODES:-msg}
SECTIONS=${SECTIONS:-"pp bw wait peers"}
PEER_SIZES=${PEER_SIZES:-"8 64 4096 65536 1048576"}
PEER_CLASSES=${PEER_CLASSES:-"tcp shm"}
STREAM_SIZES=${STREAM_SIZES:-"8 1048576"}
PIN=${PIN:-none}
case $PIN in
  none) PIN_S=() PIN_C=() MPI_BIND=(--bind-to none) NODE_PIN=() ;;
  cores) PIN_S=(taskset -c 1) PIN_C=(taskset -c 0) MPI_BIND=(--bind-to core) NODE_PIN=(--pin) ;;
  *) echo "ab.sh: PIN is none or cores, not $PIN" >&2; exit 2 ;;
esac
LIMIT=${LIMIT:-60}     # seconds any one process may run
OUT=${OUT:-target/bench/$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT"

log() { printf '%s\n' "$*" >&2; }
section() { [[ " $SECTIONS " == *" $1 "* ]]; }

# --- set-up ---------------------------------------------------------------
need=()
command -v fi_pingpong >/dev/null || need+=(libfabric-bin)
command -v iperf3 >/dev/null || need+=(iperf3)
command -v jq >/dev/null || need+=(jq)
command -v ss >/dev/null || need+=(iproute2)
if section peers; then
  command -v ucx_perftest >/dev/null || need+=(ucx-utils)
  command -v mpicc >/dev/null || need+=(libopenmpi-dev)
  command -v mpirun >/dev/null || need+=(openmpi-bin)
fi
source ci/install.sh
install_packages ab.sh "${need[@]}"
cargo build --release --locked -q -p fabric-msg-examples --bin pingpong --bin bandwidth --bin node_pingpong
PP=${CARGO_TARGET_DIR:-target}/release/pingpong
BW=${CARGO_TARGET_DIR:-target}/release/bandwidth
NODE_PP=${CARGO_TARGET_DIR:-target}/release/node_pingpong
# Our tool's ladder for `tcp/rdm`: tcp's own RDM endpoints and nothing else.
if section peers; then
  mkdir -p "${CARGO_TARGET_DIR:-target}/bench"
  mpicc -O2 -Wall -o "${CARGO_TARGET_DIR:-target}/bench/pingpong_mpi" ci/bench/pingpong_mpi.c
fi
printf 'version = 1\n[[rung]]\nkind = "tcp"\nprovider = "tcp"\nendpoint = "rdm"\n' >"$OUT/tcp-rdm.toml"
# provider_args TOKEN: our tools' options for a provider token (`ours`,
# with `ladder` to run them under) and fi_pingpong's (`theirs`, without -m).
provider_args() {
  ladder=()
  case $1 in
    tcp) ours=(-p tcp -e msg -d lo) theirs=(-p tcp -e msg -d lo) ;;
    tcp/rdm)
      ours=(-p tcp -e rdm -d lo) theirs=(-p tcp -e rdm -d lo)
      ladder=(env FABRIC_MSG_PROVIDERS="$OUT/tcp-rdm.toml")
      ;;
    shm) ours=(-p shm --same-host) theirs=(-p shm -e rdm) ;;
    *) ours=(-p "$1" -e rdm -d lo) theirs=(-p "$1" -e rdm -d lo) ;;
  esac
}
# tcp's own RDM endpoints exist from libfabric 1.18 (the peers section adds them).
HAS_TCP_RDM=$(fi_info --version | awk -F'[ .]' '/^libfabric:/ { print ($2 > 1 || ($2 == 1 && $3 >= 18)) ? 1 : 0 }')

# --- processes ------------------------------------------------------------
servers=()
cleanup() {
  local p
  for p in "${servers[@]}"; do kill "$p" 2>/dev/null || true; done
}
trap cleanup EXIT

# A TCP port nobody listens on now (the kernel's choice).
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# Wait until something listens on TCP port $1 (at most 10 s).
await_listen() {
  for _ in $(seq 200); do
    [ -n "$(ss -Hltn "sport = :$1")" ] && return 0
    sleep 0.05
  done
  return 1
}

# pair NAME PORT SERVER_CMD... -- CLIENT_CMD...: run a server in the
# background and a client against it; the client's stdout goes to
# $OUT/NAME.out. Fails (returns 1) if either side fails or times out.
pair() {
  local name=$1 port=$2
  shift 2
  local server=() client=()
  while [ "$1" != "--" ]; do server+=("$1"); shift; done
  shift
  client=("$@")
  timeout -k 5 "$LIMIT" "${server[@]}" >"$OUT/$name.server" 2>&1 &
  local spid=$!
  servers+=("$spid")
  if ! await_listen "$port"; then
    log "ab.sh: $name: the server never listened on $port"
    kill "$spid" 2>/dev/null || true
    return 1
  fi
  local rc=0
  timeout -k 5 "$LIMIT" "${client[@]}" >"$OUT/$name.out" 2>"$OUT/$name.err" || rc=$?
  # The server ends with its client; give it a moment, then make sure.
  for _ in $(seq 100); do kill -0 "$spid" 2>/dev/null || break; sleep 0.05; done
  kill "$spid" 2>/dev/null || true
  local src=0
  wait "$spid" 2>/dev/null || src=$?
  [ "$rc" -ne 0 ] || rc=$src
  if [ "$rc" -ne 0 ]; then
    log "ab.sh: $name failed ($rc): $(tail -n 3 "$OUT/$name.err" "$OUT/$name.server" 2>/dev/null)"
    return 1
  fi
}

# Columns MB/sec and usec/xfer of the row of a fabtests-style table: the
# two after the time (`0.30s`). fi_pingpong's row ends with Mxfers/sec
# after them; ours adds its percentiles after that.
row_of() {
  awk '/^[0-9]/ { for (i = 2; i < NF - 1; i++) if ($i ~ /^[0-9.]+s$/) { print $(i + 1), $(i + 2); n++; break } }
       END { if (n != 1) exit 1 }' "$1"
}

# Per-size iteration counts: about half a second per run.
iters() { # PROVIDER SIZE
  local fast=1
  [ "$1" = shm ] && fast=10
  case $2 in
    8 | 64 | 4096) echo $((10000 * fast)) ;;
    65536) echo $((2000 * fast)) ;;
    *) echo $((300 * fast)) ;;
  esac
}

median() { sort -g | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

# record FILE KEY VALUE...: append a result line.
results=$OUT/results.tsv
: >"$results"
record() { local IFS=$'\t'; printf '%s\n' "$*" >>"$results"; }

log "ab.sh: $(nproc) CPUs; $(fi_info --version | grep '^libfabric:'); load before: $(cut -d' ' -f1-3 /proc/loadavg); raw output in $OUT"

# --- 1. pingpong vs fi_pingpong ----------------------------------------------
section pp && for round in $(seq "$ROUNDS"); do
  for prov in $PROVIDERS; do
    provider_args "$prov"
    for mode in $MODES; do
      if [ "$mode" = tagged ]; then
        [ "$prov" = tcp ] && continue # connected tcp endpoints have no tagged messages
        om=() tm=(-m tagged)
      else
        om=(--msg) tm=(-m msg)
      fi
      for size in $SIZES; do
        n=$(iters "$prov" "$size")
        key="$prov|$mode|$size"
        tag="${prov//[;\/]/+}-$mode-$size-r$round"
        p=$(free_port)
        if pair "ours-$tag" "$p" \
          "${ladder[@]}" "$PP" "${ours[@]}" "${om[@]}" -S "$size" -I "$n" -W 0 -B "$p" -- \
          "${ladder[@]}" "$PP" "${ours[@]}" "${om[@]}" -S "$size" -I "$n" -W 0 -P "$p" 127.0.0.1; then
          # The header names the provider our tool negotiated.
          used=$(sed -n 's/^# \([^ ]*\) .*/\1/p' "$OUT/ours-$tag.out" | head -n1)
          if [ "$used" != "${prov%/rdm}" ]; then
            log "ab.sh: $tag: our tool used $used, not ${prov%/rdm}; row not recorded"
          elif read -r mb us < <(row_of "$OUT/ours-$tag.out"); then
            record pp "$key" "$round" ours "$us" "$mb"
          else
            log "ab.sh: cannot read pingpong's row in $OUT/ours-$tag.out"
          fi
        fi
        p=$(free_port)
        if pair "c-$tag" "$p" \
          fi_pingpong "${theirs[@]}" "${tm[@]}" -S "$size" -I "$n" -B "$p" -- \
          fi_pingpong "${theirs[@]}" "${tm[@]}" -S "$size" -I "$n" -P "$p" 127.0.0.1; then
          if read -r mb us < <(row_of "$OUT/c-$tag.out"); then
            record pp "$key" "$round" c "$us" "$mb"
          else
            log "ab.sh: cannot read fi_pingpong's row in $OUT/c-$tag.out"
          fi
        fi
      done
    done
  done
  log "ab.sh: pingpong round $round of $ROUNDS done; load $(cut -d' ' -f1 /proc/loadavg)"
done

# --- 2. bandwidth vs iperf3 at 1 MiB ----------------------------------------
section bw && for round in $(seq "$ROUNDS"); do
  for prov in "tcp;ofi_rxm" tcp; do
    case $prov in
      tcp) ours=(-p tcp -e msg -d lo) ;;
      *) ours=(-p "$prov" -d lo) ;;
    esac
    tag="bw-${prov//;/+}-r$round"
    p=$(free_port)
    if pair "$tag" "$p" "$BW" "${ours[@]}" -B "$p" -- \
      "$BW" "${ours[@]}" -S 1048576 -I 10000 -W 64 --json -P "$p" 127.0.0.1; then
      record bw "$prov|1048576" "$round" ours "" "$(tail -n 1 "$OUT/$tag.out" | jq .mb_per_sec)"
    fi
  done
  tag="iperf3-r$round"
  p=$(free_port)
  if pair "$tag" "$p" iperf3 -s -1 -B 127.0.0.1 -p "$p" -- \
    iperf3 -c 127.0.0.1 -p "$p" -l 1M -t 2 -J; then
    mb=$(jq '.end.sum_received.bits_per_second / 8e6' "$OUT/$tag.out")
    # iperf3 is the reference of each of our rows in this round.
    record bw "tcp;ofi_rxm|1048576" "$round" c "" "$mb"
    record bw "tcp|1048576" "$round" c "" "$mb"
  fi
done

# --- 3. blocking vs spinning ----------------------------------------------------
section wait && for round in $(seq "$ROUNDS"); do
  for wait in spin fd fd0; do
    tag="wait-$wait-r$round"
    p=$(free_port)
    case $wait in
      fd0) how=(-c fd --spin-us 0) ;;
      *) how=(-c "$wait") ;;
    esac
    args=(-p "tcp;ofi_rxm" -d lo --msg -S 8 -I 10000 -W 0 "${how[@]}")
    if pair "$tag" "$p" "$PP" "${args[@]}" -B "$p" -- "$PP" "${args[@]}" -P "$p" 127.0.0.1; then
      read -r mb us < <(row_of "$OUT/$tag.out") || continue
      record wait "tcp;ofi_rxm|8" "$round" "$wait" "$us" "$mb"
    fi
  done
done

# --- 4. peers: UCX and Open MPI ----------------------------------------------
MPI_PP=${CARGO_TARGET_DIR:-target}/bench/pingpong_mpi
MPIRUN=(mpirun --allow-run-as-root --oversubscribe -np 2 --mca pml ob1 "${MPI_BIND[@]}")
WINDOW=64

# The provider our tool's header names (its first word after `# `).
provider_of() { sed -n 's/^# \([^ ]*\) .*/\1/p' "$1" | head -n1; }

# ucx NAME TLS TEST SIZE ITERS WARMUP: ucx_perftest's server and client over
# 127.0.0.1; prints the client's final row: iterations, latency 50%ile,
# average and overall (one-way usec for tag_lat), MB/s average and overall,
# msg/s average and overall.
UCX_HAS_MPI_MODE=0
if section peers; then
  ucx_help=$(ucx_perftest -h 2>&1 || true)
  [[ $ucx_help == *'-P <0|1>'* ]] && UCX_HAS_MPI_MODE=1
fi
ucx() {
  local name=$1 tls=$2 test=$3 size=$4 n=$5 w=$6 p
  local env=(env "UCX_TLS=$tls" UCX_NET_DEVICES=lo)
  local args=(-t "$test" -s "$size" -n "$n" -w "$w" -f)
  [ "$test" = tag_bw ] && args+=(-O "$WINDOW")
  # A build with MPI (UCX 1.18, trixie) defaults to MPI mode: not here.
  [ "$UCX_HAS_MPI_MODE" = 1 ] && args+=(-P 0)
  p=$(free_port)
  pair "$name" "$p" "${env[@]}" "${PIN_S[@]}" ucx_perftest "${args[@]}" -p "$p" -- \
    "${env[@]}" "${PIN_C[@]}" ucx_perftest 127.0.0.1 "${args[@]}" -p "$p" || return 1
  awk 'NF == 8 && $1 ~ /^[0-9]+$/ { row = $0; n++ } END { if (n != 1) exit 1; print row }' "$OUT/$name.out"
}

# mpi NAME CLASS ARGS...: pingpong_mpi ARGS under mpirun on the class's BTL;
# prints its JSON line.
mpi() {
  local name=$1 cls=$2 btl
  shift 2
  case $cls in
    tcp) btl=(--mca btl self,tcp --mca btl_tcp_if_include lo) ;;
    *) btl=(--mca btl self,vader) ;;
  esac
  echo "${MPIRUN[*]} ${btl[*]} $MPI_PP $*" >"$OUT/$name.cmd"
  if ! timeout -k 5 "$LIMIT" "${MPIRUN[@]}" "${btl[@]}" "$MPI_PP" "$@" >"$OUT/$name.out" 2>"$OUT/$name.err"; then
    log "ab.sh: $name failed: $(tail -n 3 "$OUT/$name.err")"
    return 1
  fi
  tail -n 1 "$OUT/$name.out"
}

# Streaming iterations (message rate at 8 B, bandwidth at 1 MiB): about half
# a second each for our tool.
stream_iters() { # CLASS SIZE
  case $1-$2 in
    shm-8) echo 1000000 ;;
    tcp-8) echo 100000 ;;
    shm-*) echo 4000 ;;
    *) echo 2000 ;;
  esac
}

section peers && for round in $(seq "$ROUNDS"); do
  echo "peers round $round: $(cut -d' ' -f1-3 /proc/loadavg)" >>"$OUT/loadavg.txt"
  log "ab.sh: peers round $round (PIN=$PIN): load $(cut -d' ' -f1-3 /proc/loadavg)"
  for cls in $PEER_CLASSES; do
    if [ "$cls" = tcp ]; then
      provs=("tcp" "tcp;ofi_rxm") tls=tcp,self
      # tcp's own RDM endpoints, which our ladder takes from 1.19.
      [ "$HAS_TCP_RDM" = 1 ] && provs+=("tcp/rdm")
    # `node`: fabric-msg's own same-node transport (node_pingpong, which
    # starts its own peer); its fi_pingpong column is shm's of the round.
    # `node-ring`: the same with every message through the ring, where
    # `node` (the default) reads messages from 32 KiB in one copy
    # (FABRIC_MSG_SINGLE_COPY_FROM=never in a World), latency only, so
    # each run shows which large-message copy is faster on this machine.
    else provs=(shm node node-ring) tls=posix,self,cma; fi
    # Latency: ours and fi_pingpong on every provider of the class, then
    # UCX and Open MPI once; each peer is the reference of every provider.
    for size in $PEER_SIZES; do
      n=$(iters "$cls" "$size")
      w=$((n / 10))
      for prov in "${provs[@]}"; do
        if [ "${prov%-ring}" = node ]; then
          tag="peers-$prov-$size-r$round"
          copy=()
          [ "$prov" = node-ring ] && copy=(--copy-from never)
          if timeout -k 5 "$LIMIT" "$NODE_PP" "${NODE_PIN[@]}" "${copy[@]}" -S "$size" -I "$n" -w "$w" --json \
            >"$OUT/ours-$tag.out" 2>"$OUT/ours-$tag.err"; then
            js=$(tail -n 1 "$OUT/ours-$tag.out")
            record lat "$prov|$size" "$round" ours "$(jq .usec_per_xfer <<<"$js")" "$(jq .mb_per_sec <<<"$js")"
          else
            log "ab.sh: $tag failed: $(tail -n 3 "$OUT/ours-$tag.err")"
          fi
          [ -n "${shm_fi:-}" ] && record lat "$prov|$size" "$round" fi "$shm_fi" ""
          continue
        fi
        provider_args "$prov"
        # Tagged, but connected tcp endpoints have no tags.
        if [ "$prov" = tcp ]; then theirs+=(-m msg); else theirs+=(-m tagged); fi
        key="$prov|$size"
        tag="peers-${prov//[;\/]/+}-$size-r$round"
        p=$(free_port)
        if pair "ours-$tag" "$p" "${PIN_S[@]}" "${ladder[@]}" "$PP" "${ours[@]}" -S "$size" -I "$n" -W "$w" -B "$p" -- \
          "${PIN_C[@]}" "${ladder[@]}" "$PP" "${ours[@]}" -S "$size" -I "$n" -W "$w" -P "$p" 127.0.0.1; then
          used=$(provider_of "$OUT/ours-$tag.out")
          if [ "$used" != "${prov%/rdm}" ]; then
            log "ab.sh: $tag: our tool used $used, not ${prov%/rdm}; row not recorded"
          elif read -r mb us < <(row_of "$OUT/ours-$tag.out"); then
            record lat "$key" "$round" ours "$us" "$mb"
          fi
        fi
        p=$(free_port)
        if pair "c-$tag" "$p" "${PIN_S[@]}" fi_pingpong "${theirs[@]}" -S "$size" -I "$n" -B "$p" -- \
          "${PIN_C[@]}" fi_pingpong "${theirs[@]}" -S "$size" -I "$n" -P "$p" 127.0.0.1 &&
          read -r mb us < <(row_of "$OUT/c-$tag.out"); then
          record lat "$key" "$round" fi "$us" "$mb"
          [ "$prov" = shm ] && shm_fi=$us
        fi
      done
      tag="peers-$cls-$size-r$round"
      if row=$(ucx "ucx-$tag" "$tls" tag_lat "$size" "$n" "$w"); then
        read -r _ _ _ us _ _ _ _ <<<"$row"
        for prov in "${provs[@]}"; do record lat "$prov|$size" "$round" ucx "$us" ""; done
      fi
      if js=$(mpi "mpi-$tag" "$cls" latency -S "$size" -I "$n" -W "$w"); then
        us=$(jq .usec_per_xfer <<<"$js")
        for prov in "${provs[@]}"; do record lat "$prov|$size" "$round" mpi "$us" ""; done
      fi
    done
    # Streaming: message rate at 8 B (column 5: million messages per
    # second) and bandwidth at 1 MiB (column 6: MB/s one way); not for
    # node-ring, which differs from node only in latency's large sizes.
    sprovs=()
    for prov in "${provs[@]}"; do if [ "$prov" != node-ring ]; then sprovs+=("$prov"); fi; done
    for size in $STREAM_SIZES; do
      n=$(stream_iters "$cls" "$size")
      w=$((n / 10))
      for prov in "${sprovs[@]}"; do
        if [ "$prov" = node ]; then
          tag="stream-node-$size-r$round"
          if timeout -k 5 "$LIMIT" "$NODE_PP" "${NODE_PIN[@]}" --rate "$WINDOW" -S "$size" -I "$n" -w "$w" --json \
            >"$OUT/ours-$tag.out" 2>"$OUT/ours-$tag.err"; then
            js=$(tail -n 1 "$OUT/ours-$tag.out")
            record stream "node|$size" "$round" ours "$(jq '1 / .usec_per_xfer' <<<"$js")" "$(jq .mb_per_sec <<<"$js")"
          else
            log "ab.sh: $tag failed: $(tail -n 3 "$OUT/ours-$tag.err")"
          fi
          continue
        fi
        provider_args "$prov"
        tag="stream-${prov//[;\/]/+}-$size-r$round"
        p=$(free_port)
        if pair "ours-$tag" "$p" "${PIN_S[@]}" "${ladder[@]}" "$BW" "${ours[@]}" -B "$p" -- \
          "${PIN_C[@]}" "${ladder[@]}" "$BW" "${ours[@]}" -S "$size" -I "$n" -W "$w" -w "$WINDOW" --json -P "$p" 127.0.0.1; then
          js=$(tail -n 1 "$OUT/ours-$tag.out")
          used=$(head -n 1 "$OUT/ours-$tag.out" | jq -r .provider)
          if [ "$used" != "${prov%/rdm}" ]; then
            log "ab.sh: $tag: our tool used $used, not ${prov%/rdm}; row not recorded"
          else
            record stream "$prov|$size" "$round" ours "$(jq '1 / .usec_per_xfer' <<<"$js")" "$(jq .mb_per_sec <<<"$js")"
          fi
        fi
      done
      tag="stream-$cls-$size-r$round"
      if row=$(ucx "ucx-$tag" "$tls" tag_bw "$size" "$n" "$w"); then
        read -r _ _ _ _ _ _ _ rate <<<"$row"
        m=$(awk -v r="$rate" -v s="$size" 'BEGIN { print r / 1e6, r * s / 1e6 }')
        for prov in "${sprovs[@]}"; do record stream "$prov|$size" "$round" ucx "${m% *}" "${m#* }"; done
      fi
      if js=$(mpi "mpi-$tag" "$cls" rate -S "$size" -I "$n" -W "$w" -w "$WINDOW"); then
        for prov in "${sprovs[@]}"; do
          record stream "$prov|$size" "$round" mpi "$(jq '.msgs_per_sec / 1e6' <<<"$js")" "$(jq .mb_per_sec <<<"$js")"
        done
      fi
    done
  done
  log "ab.sh: peers round $round of $ROUNDS done"
done

log "ab.sh: load after: $(cut -d' ' -f1-3 /proc/loadavg)"

# --- summary --------------------------------------------------------------
# values KIND KEY WHO COLUMN(5 usec, 6 MB/s)
values() { awk -F'\t' -v k="$1" -v key="$2" -v who="$3" -v c="$4" '$1 == k && $2 == key && $4 == who { print $c }' "$results"; }
# Median over rounds of ours/theirs, pairing each round's two runs.
ratio() { # KIND KEY A B COLUMN
  awk -F'\t' -v k="$1" -v key="$2" -v a="$3" -v b="$4" -v c="$5" '
    $1 == k && $2 == key && $4 == a { x[$3] = $c }
    $1 == k && $2 == key && $4 == b { y[$3] = $c }
    END { for (r in x) if ((r in y) && y[r] > 0) print x[r] / y[r] }' "$results" | median
}
# Keys in first-seen order.
keys() { awk -F'\t' -v k="$1" '$1 == k && !seen[$2]++ { print $2 }' "$results"; }
med() { values "$@" | median; }

if section pp; then
  echo
  echo "pingpong vs fi_pingpong, median of $ROUNDS rounds (usec/xfer one-way; MB/sec both directions)"
  printf '| %-12s | %-8s | %8s | %10s | %10s | %9s | %10s | %10s | %8s |\n' \
    provider messages bytes "usec ours" "usec C" "lat ratio" "MB/s ours" "MB/s C" "bw ratio"
  printf '|%s|\n' "--------------|----------|----------|------------|------------|-----------|------------|------------|----------"
  while IFS='|' read -r prov mode size; do
    key="$prov|$mode|$size"
    printf '| %-12s | %-8s | %8s | %10.2f | %10.2f | %9.3f | %10.2f | %10.2f | %8.3f |\n' \
      "$prov" "$mode" "$size" "$(med pp "$key" ours 5)" "$(med pp "$key" c 5)" "$(ratio pp "$key" ours c 5)" \
      "$(med pp "$key" ours 6)" "$(med pp "$key" c 6)" "$(ratio pp "$key" ours c 6)"
  done < <(keys pp)
fi

if section bw; then
  echo
  echo "bandwidth at 1 MiB vs iperf3 (MB/sec = 10^6 B/s one way), median of $ROUNDS rounds"
  printf '| %-12s | %10s | %10s | %15s |\n' provider "MB/s ours" "MB/s iperf3" "ratio ours/iperf3"
  printf '|%s|\n' "--------------|------------|-------------|-------------------"
  for prov in "tcp;ofi_rxm" tcp; do
    key="$prov|1048576"
    printf '| %-12s | %10.0f | %11.0f | %17.3f |\n' "$prov" "$(med bw "$key" ours 6)" "$(med bw "$key" c 6)" \
      "$(ratio bw "$key" ours c 6)"
  done
fi

if section wait; then
  echo
  echo "pingpong tcp;ofi_rxm 8 bytes: blocking (-c fd: 50 us spin, then the fd; --spin-us 0: the fd at once)"
  echo "vs spinning, median of $ROUNDS rounds"
  printf '| usec spin %.2f | usec fd %.2f | fd/spin %.3f | usec fd, no spin %.2f | ratio %.3f |\n' \
    "$(med wait "tcp;ofi_rxm|8" spin 5)" "$(med wait "tcp;ofi_rxm|8" fd 5)" "$(ratio wait "tcp;ofi_rxm|8" fd spin 5)" \
    "$(med wait "tcp;ofi_rxm|8" fd0 5)" "$(ratio wait "tcp;ofi_rxm|8" fd0 spin 5)"
fi

if section peers; then
  # A cell with no run (every round failed) prints nan.
  med() { local v; v=$(values "$@" | median); echo "${v:-nan}"; }
  ratio_or_nan() { local v; v=$(ratio "$@"); echo "${v:-nan}"; }
  echo
  echo "peers (PIN=$PIN): load average at the start of each round (1, 5, 15 min): $(cut -d: -f2 "$OUT/loadavg.txt" | paste -sd';')"
  echo
  echo "latency against the peers, one-way usec, median of $ROUNDS rounds; ratios ours/peer (below 1: ours is faster),"
  echo "median of per-round ratios. ours and fi_pingpong tagged (untagged on tcp msg endpoints); UCX tag_lat; Open MPI pingpong_mpi"
  printf '| %-12s | %8s | %8s | %8s | %8s | %8s | %8s | %8s | %8s |\n' \
    provider bytes ours fi_pp UCX "Open MPI" "/fi_pp" "/UCX" "/MPI"
  printf '|%s|\n' "--------------|----------|----------|----------|----------|----------|----------|----------|----------"
  while IFS='|' read -r prov size; do
    key="$prov|$size"
    printf '| %-12s | %8s | %8.2f | %8.2f | %8.2f | %8.2f | %8.3f | %8.3f | %8.3f |\n' "$prov" "$size" \
      "$(med lat "$key" ours 5)" "$(med lat "$key" fi 5)" "$(med lat "$key" ucx 5)" "$(med lat "$key" mpi 5)" \
      "$(ratio_or_nan lat "$key" ours fi 5)" "$(ratio_or_nan lat "$key" ours ucx 5)" "$(ratio_or_nan lat "$key" ours mpi 5)"
  done < <(keys lat)
  echo
  echo "streaming a window of $WINDOW against the peers, median of $ROUNDS rounds: message rate at 8 B (million messages/s)"
  echo "and bandwidth at 1 MiB (MB/s = 10^6 B/s one way); ratios ours/peer (above 1: ours is faster). UCX tag_bw -O $WINDOW"
  printf '| %-12s | %8s | %9s | %8s | %8s | %8s | %8s | %8s |\n' provider bytes measure ours UCX "Open MPI" "/UCX" "/MPI"
  printf '|%s|\n' "--------------|----------|-----------|----------|----------|----------|----------|----------"
  while IFS='|' read -r prov size; do
    key="$prov|$size"
    if [ "$size" = 8 ]; then c=5 what=Mmsg/s fmt=%8.3f; else c=6 what=MB/s fmt=%8.0f; fi
    printf "| %-12s | %8s | %9s | $fmt | $fmt | $fmt | %8.3f | %8.3f |\n" "$prov" "$size" "$what" \
      "$(med stream "$key" ours $c)" "$(med stream "$key" ucx $c)" "$(med stream "$key" mpi $c)" \
      "$(ratio_or_nan stream "$key" ours ucx $c)" "$(ratio_or_nan stream "$key" ours mpi $c)"
  done < <(keys stream)
fi
