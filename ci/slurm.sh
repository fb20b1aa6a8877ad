#!/usr/bin/env bash
# A one-node Slurm cluster on this host, for running the World under
# `srun --mpi=pmix` (examples/tests/slurm.rs starts it through this script).
#
#   bash ci/slurm.sh          # configure and start it (idempotent: a running one is reused)
#   bash ci/slurm.sh stop     # stop its daemons (the state directory stays)
#   bash ci/slurm.sh env      # print the SLURM_CONF=... line its clients need
#
# Then: SLURM_CONF=<dir>/slurm.conf srun --mpi=pmix -n 4 target/release/spmd
#
# It leaves any Slurm or MUNGE already set up on the host alone: its own
# slurm.conf (clients find it through SLURM_CONF), its own munged on its own
# socket and key, its own ports, state and logs, all in one directory
# (FABRIC_MSG_SLURM_DIR, default /tmp/fabric-msg-slurm). ci/setup.sh installs
# the packages (slurmctld, slurmd, slurm-client, munge).
#
# On success it prints SLURM_CONF=<dir>/slurm.conf on stdout (everything
# else goes to stderr). Exit status: 0 when the node is up (or stopped, for
# `stop`); 77 when it cannot run here at all (not root, or the packages are
# absent and cannot be installed), which the tests report as a skip (a
# failure under CI=true, unless FABRIC_MSG_SLURM=off asked for it); anything else is a real failure, shown with the
# daemons' log tails.
set -euo pipefail

SKIPPED=77
dir="${FABRIC_MSG_SLURM_DIR:-/tmp/fabric-msg-slurm}"
# Not Slurm's defaults (6817, 6818), so a cluster already on this host
# keeps its ports.
ctld_port="${FABRIC_MSG_SLURM_PORT:-16817}"
slurmd_port=$((ctld_port + 1))
conf="$dir/slurm.conf"
socket="$dir/munge/munge.socket"
node="$(hostname -s)"

say() { echo "ci/slurm.sh: $*" >&2; }

skip() {
  say "SKIPPED: $*"
  say "SKIPPED: Slurm (srun --mpi=pmix) is NOT tested on this machine"
  exit "$SKIPPED"
}

pid_alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

# An explicit opt-out, honoured under CI=true too: ci/libfabric2.sh sets it
# in its trixie root, which shares the host's network (and so the host
# run's cluster and ports) and has no Slurm of its own.
if [ "${FABRIC_MSG_SLURM:-}" = off ]; then
  skip "FABRIC_MSG_SLURM=off${FABRIC_MSG_SLURM_WHY:+: $FABRIC_MSG_SLURM_WHY}"
fi

stop() {
  local name pidfile pid
  for name in slurmd slurmctld munged; do
    pidfile="$dir/$name.pid"
    if pid_alive "$pidfile"; then
      pid="$(cat "$pidfile")"
      kill "$pid"
      for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      if kill -0 "$pid" 2>/dev/null; then
        say "$name ($pid) ignored SIGTERM for 5 s: SIGKILL"
        kill -9 "$pid" 2>/dev/null || true
      fi
      say "stopped $name ($pid)"
    fi
    rm -f "$pidfile"
  done
}

node_state() { SLURM_CONF="$conf" sinfo -h -N -n "$node" -o '%t' 2>/dev/null | head -1; }

logs() {
  local f
  for f in "$dir"/munged.log "$dir"/slurmctld.log "$dir"/slurmd.log; do
    [ -s "$f" ] && { echo "--- last lines of $f"; tail -n 25 "$f"; }
  done >&2
}

fail() {
  say "FAILED: $*"
  logs
  exit 1
}

# One start or stop at a time (test binaries may call this concurrently).
# The daemons are started with fd 9 closed, or they would hold the lock.
lock() {
  mkdir -p "$dir"
  exec 9>"$dir/lock"
  flock -w 120 9 || fail "another ci/slurm.sh held $dir/lock for 120 s"
}

case "${1:-start}" in
  stop)
    if [ -d "$dir" ]; then lock; stop; fi
    exit 0
    ;;
  env) echo "SLURM_CONF=$conf"; exit 0 ;;
  start) ;;
  *) say "usage: ci/slurm.sh [start|stop|env]"; exit 2 ;;
esac

# The daemons run as root (SlurmUser=root, munged's socket owned by root),
# as on a CI machine; a normal user cannot start slurmd.
[ "$(id -u)" -eq 0 ] || skip "not root (uid $(id -u)): slurmd and slurmctld need root here"

need=(munged slurmctld slurmd srun sinfo)
missing() { for c in "${need[@]}"; do command -v "$c" >/dev/null 2>&1 || echo "$c"; done; }
if [ -n "$(missing)" ]; then
  say "missing $(missing | tr '\n' ' '); installing through ci/setup.sh"
  bash "$(dirname "$0")/setup.sh" >&2 || true
  [ -z "$(missing)" ] || skip "$(missing | tr '\n' ' ')not installed and ci/setup.sh could not install them"
fi
# srun --mpi=pmix needs Slurm's PMIx plugin, mpi_pmix_v4.so (Debian ships
# it in slurm-wlm-basic-plugins, which slurmd depends on), and libpmix.so.2
# (libpmix2, which ci/setup.sh installs with libpmix-dev): the plugin opens
# it at run time. Where dpkg does not know the plugins, Slurm's built-in
# PluginDir is used.
plugin_dir="$(dpkg -L slurm-wlm-basic-plugins 2>/dev/null | grep -m1 '/mpi_pmix_v4.so$' || true)"
plugin_line="${plugin_dir:+PluginDir=$(dirname "$plugin_dir")}"

lock

# Slurm gives every task at least one of the node's CPUs, so on this
# 2-core machine `srun -n 4` would queue forever ("Requested partition
# configuration not available"). A partition's OverSubscribe lets jobs
# share CPUs, not one job's tasks; `srun --overcommit` does, but then the
# documented `srun --mpi=pmix -n 4 spmd` would not work as written. So the
# node declares more CPUs than it has (as mpirun --oversubscribe pretends),
# and SlurmdParameters=config_overrides keeps slurmctld from draining it
# for "Low CPUs" when slurmd reports the real count. TaskPlugin=task/none
# binds nothing, so the number only sets how many tasks fit at once.
cpus="$(nproc)"
declared="${FABRIC_MSG_SLURM_CPUS:-$((cpus > 16 ? cpus : 16))}"
cat >"$conf.new" <<EOF
# Written by fabric-msg's ci/slurm.sh: a one-node cluster for tests.
ClusterName=fabricmsg
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$socket
StateSaveLocation=$dir/ctld
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
$plugin_line
# No cgroups in containers or small VMs: track processes by parentage.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
# No default: srun needs --mpi=pmix, as the documented command gives it.
MpiDefault=none
ReturnToService=2
MailProg=/bin/true
SlurmdParameters=config_overrides
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
InactiveLimit=0
KillWait=5
MinJobAge=30
# The node: this host under its short name; $cpus CPUs really (nproc).
NodeName=$node NodeAddr=127.0.0.1 CPUs=$declared State=UNKNOWN
PartitionName=debug Nodes=$node Default=YES MaxTime=INFINITE State=UP
EOF
# A cluster already running on this very configuration is reused.
if pid_alive "$dir/munged.pid" && pid_alive "$dir/slurmctld.pid" && pid_alive "$dir/slurmd.pid"; then
  state="$(node_state)"
  if ! cmp -s "$conf.new" "$conf"; then
    say "running on an older $conf: restarting it"
  elif [[ "$state" =~ ^(idle|mix|alloc|comp)$ ]]; then
    say "already running: node $node is $state (SLURM_CONF=$conf)"
    rm -f "$conf.new"
    echo "SLURM_CONF=$conf"
    exit 0
  else
    say "daemons running but node $node is ${state:-unknown to sinfo}: restarting them"
  fi
fi
# Whatever is left of an earlier run is stopped and started afresh.
stop 2>/dev/null

for port in "$ctld_port" "$slurmd_port"; do
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
    fail "port $port is taken by another program; set FABRIC_MSG_SLURM_PORT to a free pair of ports"
  fi
done

mkdir -p "$dir/munge" "$dir/ctld" "$dir/spool"
# munged wants its socket's directory open to every user (it warns otherwise).
chmod 755 "$dir" "$dir/munge"
if [ ! -s "$dir/munge.key" ]; then
  (umask 077 && head -c 1024 /dev/urandom >"$dir/munge.key")
  say "created a MUNGE key at $dir/munge.key"
fi
mv "$conf.new" "$conf"

export SLURM_CONF="$conf"
# Each forks into the background and writes its pid file. slurmctld -c: a
# fresh start, no jobs recovered from an earlier run. Their own output goes
# to their logs, never to our stdout or stderr: a caller reading those to
# the end (a test's Command::output) would otherwise wait for the daemons.
munged --socket="$socket" --key-file="$dir/munge.key" --pid-file="$dir/munged.pid" \
  --log-file="$dir/munged.log" --seed-file="$dir/munged.seed" \
  9>&- </dev/null >>"$dir/munged.log" 2>&1 || fail "munged did not start"
slurmctld -c 9>&- </dev/null >>"$dir/slurmctld.log" 2>&1 || fail "slurmctld did not start"
slurmd 9>&- </dev/null >>"$dir/slurmd.log" 2>&1 || fail "slurmd did not start"

# Bounded wait for the node to register and become idle.
for _ in $(seq 60); do
  state="$(node_state)"
  if [ "$state" = idle ]; then
    say "started: node $node idle, $declared CPUs declared on $cpus (SLURM_CONF=$conf)"
    SLURM_CONF="$conf" srun --mpi=list 2>&1 | grep -qw pmix ||
      fail "srun --mpi=list does not offer pmix: is slurm-wlm-basic-plugins (mpi_pmix_v4.so) installed?"
    echo "SLURM_CONF=$conf"
    exit 0
  fi
  sleep 0.5
done
fail "node $node not idle after 30 s (sinfo says: ${state:-nothing})"
