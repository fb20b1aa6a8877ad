#!/usr/bin/env bash
# Runs inside the ci/vm guest (rxe0 = soft-RoCE, siw0 = soft-iWARP): checks
# what fabric-msg negotiates on real RDMA devices. Each check prints PASS or
# FAIL with the output it judged.
set -uo pipefail
# Binaries built for the guest's libfabric: target/ (bookworm, 1.17) or
# target/libfabric-2/ (trixie, 2.1), as ci/fabric-matrix.sh passes it.
tdir=${FABRIC_MSG_TARGET_DIR:-target}
bin=$tdir/debug/fabric_info
failures=0
libfabric=$(fi_info --version | sed -n 's/^libfabric: //p')
echo "negotiate-guest: libfabric $libfabric, binaries from $tdir/debug"

# fabric_info with the same arguments prints the same report: each distinct
# command line runs once (3 to 5 s each under TCG) and its report serves
# every check that reads it.
cache=$(mktemp -d)
trap 'rm -rf "$cache"' EXIT
fabric_info() {
  local key
  key=$(printf '%s\n' "$@" | md5sum | cut -c1-16)
  [ -f "$cache/$key" ] || "$bin" "$@" >"$cache/$key" 2>&1
  cat "$cache/$key"
}

# Each verdict says how long its check took (TCG: where the matrix's
# minutes go).
took() { # start (EPOCHREALTIME): seconds since, one decimal
  awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f s", b - a }'
}
check() { # name, expected text, command...
  local name=$1 want=$2; shift 2
  local out start=$EPOCHREALTIME
  out=$("$@" 2>&1)
  if grep -qF -- "$want" <<<"$out"; then
    echo "PASS $name ($(took "$start"))"
  else
    echo "FAIL $name ($(took "$start")): expected '$want' in:"; sed 's/^/    /' <<<"$out"; failures=$((failures + 1))
  fi
}

# RDM through ofi_rxm on soft-RoCE opens: FI_UNIVERSE_SIZE sized to rxe0's max_cqe.
check roce-rdm-chosen "chosen  roce via verbs;ofi_rxm (rdm) on rxe0" fabric_info
check universe-sized "FI_UNIVERSE_SIZE=64  (fabric-msg: min(max_peers 64, 127 so ofi_rxm's CQ fits rxe0's max_cqe 32767))" fabric_info
check roce-classified "RoCE (sysfs rxe0 node_type 1: CA, port 1 link_layer Ethernet)" fabric_info
# With libfabric's default universe forced by the user, rxe0 fails to open and the ladder moves on.
check user-universe-fails "roce via verbs;ofi_rxm (rdm) on rxe0: failed to open: fi_enable failed" env FI_UNIVERSE_SIZE=256 $bin
# (siw0's max_cqe is large: its rxm rung comes next.)
check user-universe-next "chosen  iwarp via verbs;ofi_rxm (rdm) on siw0" env FI_UNIVERSE_SIZE=256 $bin
# iWARP: RDM through rxm, on 1.17 as on 2.1 (issue 14): the ladder chooses
# it for tagged messages on siw0, and its data path checks every byte.
check iwarp-rdm-chosen "chosen  iwarp via verbs;ofi_rxm (rdm) on siw0" fabric_info -d siw0
check iwarp-tagged-chosen "chosen  iwarp via verbs;ofi_rxm (rdm) on siw0" fabric_info -c tagged -d siw0
# rxm registers about 33 MiB for its buffers at the first message, and siw
# counts that against RLIMIT_MEMLOCK even for root: below it the rung is
# passed over, saying what to do (the first failure on 1.17 was this).
check iwarp-rdm-memlock "siw0 counts registered memory against the locked-memory limit even for root (soft-iWARP ignores CAP_IPC_LOCK), which is 8192 KiB" \
  bash -c "ulimit -l 8192; $bin -d siw0"
# iWARP through plain verbs MSG endpoints when connected endpoints are asked for.
check iwarp-msg "chosen  iwarp via verbs (msg) on siw0" fabric_info -e msg -c msg,rma -d siw0
check iwarp-no-cq-data "cq_data_size       0" fabric_info -e msg -c msg,rma -d siw0
check roce-msg "chosen  roce via verbs (msg) on rxe0" fabric_info -e msg -c msg,rma -d rxe0
check roce-cq-data "cq_data_size       4" fabric_info -e msg -c msg,rma -d rxe0
# Atomics no longer decide the fabric (docs/atomics.md): with atomics asked
# for, RoCE stays chosen, and verbs;ofi_rxm, which validates none, carries
# them emulated by fabric-msg.
check verbs-atomics-keep-roce "chosen  roce via verbs;ofi_rxm (rdm) on rxe0" fabric_info -c tagged,atomic
check verbs-atomics-carried "fetch_add=" fabric_info -c tagged,atomic
# verbs' connected endpoints validate u64 fetch-add and compare-swap on
# rxe0, but libfabric before 2.2 passes the operand's address as its value
# (ofiwg/libfabric#10923): providers.toml refuses them with that reason.
# siw0 does no atomics at all (atomic_cap NONE), whatever libfabric says.
check roce-msg-atomics-refused "passes the operand's address as its value" fabric_info -e msg -c msg,atomic -d rxe0
check iwarp-msg-atomics-none "siw0 does no remote atomics" fabric_info -e msg -c msg,atomic -d siw0
# Emulated atomics over RoCE's RDM endpoints: three clients, the exact total.
check roce-rdm-atomics-total "counter 600, expected 600" $tdir/debug/atomics --loopback -I 200 -p "verbs;ofi_rxm" -d rxe0
# Four fetch-adds in flight per client (issue 14): with FI_ATOMIC among the
# domain's capabilities rxm refused the second of two registrations the
# verbs cache gave one key (FI_ENOKEY); emulated atomics now open the
# domain without it. Between two processes on two hosts, the same check
# runs in ci/matrix/two-host-guest.sh (roce-rdm-atomics-window).
check roce-rdm-atomics-window "counter 600, expected 600" $tdir/debug/atomics --loopback -I 200 -w 4 -p "verbs;ofi_rxm" -d rxe0

# libfabric's default memory monitor (memhooks) patches libc's mmap/munmap
# code as verbs domains open and close: a thread in munmap then crashed
# (issue 14's note). fabric-msg picks userfaultfd where an RDMA device is
# present; loops opened and closed beside a thread that maps and unmaps.
check mr-monitor-chosen "FI_MR_CACHE_MONITOR=userfaultfd  (fabric-msg: libfabric's default memory monitor (memhooks)" fabric_info
check mr-monitor-race "monitor_race: 200 loops opened and closed on verbs;ofi_rxm domain rxe0" \
  $tdir/debug/monitor_race -p "verbs;ofi_rxm" -d rxe0 -n 200
# rxm over verbs without a shared receive context sends receive credits
# every 64 reposted buffers; one that arrived after the last poll was
# reposted on the closed MSG endpoint by rxm's close (SIGSEGV; 1.17 crashed
# 5 of 5 runs before the loop read its queue before closing). 1024 messages
# put a credit on the wire with the last one.
check roce-rdm-close-race "close_race: 10 rounds of 1024 messages on verbs;ofi_rxm domain rxe0" \
  $tdir/debug/close_race -p "verbs;ofi_rxm" -d rxe0 -n 10 -m 1024

# The data path on real RDMA devices, every byte checked, runs between two
# hosts in ci/matrix/two-host-guest.sh: tagged and untagged messages, RMA
# writes with data and RMA reads, of 1 B to 1 MiB, on RoCE RDM, RoCE MSG,
# iWARP MSG and iWARP RDM (the ladder's own choice on siw0 included). Here,
# in one host, only what that matrix does not cover: borrowed buffers, a
# 4 MiB message, a registration per operation, the locked-memory limit.
pp="$tdir/debug/pingpong --loopback --verify"
check roce-borrowed-4K "4096           10       10" $pp --borrowed -p "verbs;ofi_rxm" -d rxe0 -I 10 -W 1 -S 4096
check iwarp-msg-4M "4194304         2        2" $pp -e msg -p verbs -d siw0 -I 2 -W 0 -S 4194304
# Pinned memory counts against RLIMIT_MEMLOCK: a low limit is a clear error.
check memlock-error "locked-memory limit, which is 1024 KiB" \
  bash -c "ulimit -l 1024; $pp -e msg -p verbs -d siw0 -I 1 -W 0 -S 4194304"
# RMA writes with data, a registration for each (rma_pingpong --mr each).
rp="$tdir/debug/rma_pingpong --loopback --verify"
check roce-rdm-rma-regeach "1048576         5        5" $rp --mr each -p "verbs;ofi_rxm" -d rxe0 -I 5 -W 1 -S 1048576

# The soak (fabric-msg/tests/soak.rs, in this process) on real RDMA
# devices: one pair exchanges sequenced, checksummed tagged messages on four
# tags and bursts of RMA writes with data for 3 s; it fails on any message
# or write lost, duplicated or corrupted, or out of order per tag. The
# PASS line carries its rates and RSS (TCG: correctness, not speed).
soak() { # name, domain[, retry]
  local name=$1 domain=$2 retry=${3:-} out rc
  if [ -z "${FABRIC_MSG_SOAK_BIN:-}" ]; then
    echo "FAIL $name: no soak binary (FABRIC_MSG_SOAK_BIN unset; ci/fabric-matrix.sh sets it)"
    failures=$((failures + 1)); return
  fi
  out=$(FABRIC_MSG_SOAK_CHILD="verbs;ofi_rxm" FABRIC_MSG_SOAK_DOMAIN=$domain FABRIC_MSG_SOAK_PAIRS=1 \
    FABRIC_MSG_SOAK_SECONDS=3 timeout 120 "$FABRIC_MSG_SOAK_BIN" --exact soak_child --ignored --nocapture \
    --test-threads 1 2>&1)
  rc=$?
  if [ -n "$retry" ] && { [ $rc != 0 ] || ! grep -q "0 lost, 0 duplicated, 0 corrupted" <<<"$out"; }; then
    echo "RETRY $name (exit $rc; $retry):"; sed 's/^/    /' <<<"$out"
    soak "$name" "$domain"
    return
  fi
  if [ $rc = 0 ] && grep -q "0 lost, 0 duplicated, 0 corrupted" <<<"$out"; then
    echo "PASS $name: $(grep -o 'soak verbs.*' <<<"$out")"
  else
    echo "FAIL $name (exit $rc):"; sed 's/^/    /' <<<"$out"; failures=$((failures + 1))
  fi
}
soak roce-rdm-soak rxe0
# Retried once: in 1 of 5 runs here the rxm connection over siw0 ended
# mid-soak (both sides' sends FI_ECANCELED; docs/reliability.md, Soak),
# not understood yet. The first attempt's output stays in the log.
soak iwarp-rdm-soak siw0 "the rxm connection over siw0 ended mid-soak in 1 of 5 runs"

echo "negotiate-guest: $failures failed"
exit $((failures > 0))
