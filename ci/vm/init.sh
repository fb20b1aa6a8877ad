#!/bin/busybox sh
# /init of the fabric-msg test VM (runs under busybox sh as PID 1).
#
# Sets up soft-RoCE (rxe0 on dummy0) and soft-iWARP (siw0 on dummy1), or,
# when the kernel command line says fabric_msg.node=N (one guest of a pair,
# see ci/vm/pair.sh), rxe0 and siw0 on two virtio NICs linked to the other
# guest; mounts
# the host's 9p share (mount tag host0) at /host, runs /host/run.sh with its
# output in /host/log, writes its exit status to /host/rc and powers off.
# Messages printed here go to the serial console (ttyS0); ci/vm/run.sh keeps
# them in console.log next to the job's log.
#
# Nothing here may exit: if PID 1 exits the kernel panics.

export PATH=/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/root

say() { echo "init: $*"; }

# Debian's busybox sh prefers its own applets to programs in PATH, even for
# commands it only half implements: call kmod's modprobe and iproute2's ip
# (rdma has no applet) by path. Functions take precedence over applets.
modprobe() { /usr/sbin/modprobe "$@"; }
ip() { /usr/bin/ip "$@"; }

# Power off on every path out. `poweroff -f` skips init and calls
# reboot(2) directly; QEMU then exits.
finish() {
    sync
    poweroff -f
    sleep 5  # not reached; keeps PID 1 alive if poweroff failed
}

mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /dev/shm /tmp /run /root /host
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /dev/shm   # libfabric's shm provider needs /dev/shm
mount -t tmpfs tmpfs /tmp
mount -t tmpfs tmpfs /run
hostname fabric-msg-vm

# Modules. The crc32 crypto modules must be present before rdma_rxe is used,
# otherwise `rdma link add ... type rxe` fails with ENOENT. siw.ko is built
# out of tree by ci/vm/build.sh (Debian's kernel does not enable it).
for m in crc32_generic crc32_pclmul virtio_pci 9pnet_virtio 9p \
         ib_uverbs rdma_ucm rdma_rxe siw; do
    modprobe "$m" || say "WARNING: modprobe $m failed"
done
# numdummies=0: otherwise the module creates dummy0 by itself.
modprobe dummy numdummies=0 || say "WARNING: modprobe dummy failed"

# Networking. 198.18.0.0/15 is the benchmarking range (RFC 2544). Fixed,
# locally administered MAC addresses (02:00 + the IPv4 address) keep the
# node GUIDs and IPv6 link-local addresses the same from boot to boot.
ip link set lo up
node=
for arg in $(cat /proc/cmdline); do
    case $arg in fabric_msg.node=[12]) node=${arg#fabric_msg.node=} ;; esac
done
if [ -z "$node" ]; then
    # One guest: nothing leaves it (QEMU runs with -nic none).
    ip link add dummy0 address 02:00:c6:12:00:01 type dummy &&
        ip addr add 198.18.0.1/24 dev dummy0 && ip link set dummy0 up ||
        say "WARNING: dummy0 set-up failed"
    ip link add dummy1 address 02:00:c6:12:01:01 type dummy &&
        ip addr add 198.18.1.1/24 dev dummy1 && ip link set dummy1 up ||
        say "WARNING: dummy1 set-up failed"
    rdma link add rxe0 type rxe netdev dummy0 || say "WARNING: rxe0 not created"
    rdma link add siw0 type siw netdev dummy1 || say "WARNING: siw0 not created"
else
    # One guest of a pair: two virtio NICs, each a link to the other guest
    # (ci/vm/run.sh --node). rxe0 and siw0 get one each: on one interface
    # libfabric's verbs lists only rxe0. The NICs are found by the MAC
    # run.sh gave them: 02:00:c6:12:02:0N (198.18.2.N, RoCE) and
    # 02:00:c6:12:03:0N (198.18.3.N, iWARP).
    hostname "fabric-msg-vm$node"
    modprobe virtio_net || say "WARNING: modprobe virtio_net failed"
    {
        echo '127.0.0.1 localhost'
        echo '198.18.2.1 fabric-msg-vm1'
        echo '198.18.2.2 fabric-msg-vm2'
    } >/etc/hosts
    for net in 2 3; do
        mac=02:00:c6:12:0$net:0$node
        dev=
        for i in 1 2 3 4 5; do
            for d in /sys/class/net/*; do
                [ "$(cat "$d/address" 2>/dev/null)" = "$mac" ] && dev=${d##*/}
            done
            [ -n "$dev" ] && break
            sleep 1
        done
        if [ -z "$dev" ]; then
            say "WARNING: no NIC with MAC $mac"
            continue
        fi
        ip addr add "198.18.$net.$node/24" dev "$dev" && ip link set "$dev" up ||
            say "WARNING: $dev set-up failed"
        if [ "$net" = 2 ]; then
            rdma link add rxe0 type rxe netdev "$dev" || say "WARNING: rxe0 not created on $dev"
        else
            rdma link add siw0 type siw netdev "$dev" || say "WARNING: siw0 not created on $dev"
        fi
    done
fi

# The job share. When run.sh also offers host1 (the repository, or the
# directory given to run.sh --share) it creates /host/repo as its mount point.
p9opts=trans=virtio,version=9p2000.L,msize=262144
if ! mount -t 9p -o "$p9opts" host0 /host; then
    say "FATAL: cannot mount the 9p share host0 at /host"
    finish
fi
if [ -d /host/repo ]; then
    mount -t 9p -o "$p9opts" host1 /host/repo ||
        say "WARNING: cannot mount the 9p share host1 at /host/repo"
fi

# The kernel's symbol list, cut to the lines libfabric looks for. The
# verbs provider's init reads /proc/kallsyms to its end in every process,
# looking for two symbols (twice in 1.17, once in 2.1: ci/kallsyms.sh;
# docs/world.md, "Start-up cost"). Under TCG that is about 0.8 s of each
# process's 1.3 s start (fi_info -l here: 1.25-1.43 s, 0.48-0.56 s with
# this). The lines kept are the kernel's own, taken once every module is
# loaded, so libfabric finds what it would have found (dmabuf support
# yes, peer memory no). Nothing else in the guest reads the file.
grep -E 'ib_register_peer_memory_client|ib_umem_dmabuf_get' /proc/kallsyms >/run/kallsyms || true
mount --bind /run/kallsyms /proc/kallsyms || say "WARNING: /proc/kallsyms left whole (slower start-up)"

if [ -f /host/run.sh ]; then
    # RDMA hosts lift the locked-memory limit: registrations pin pages
    # against it (siw counts them; the default 8 MiB stops 2 MiB buffers).
    ulimit -l unlimited
    say "running /host/run.sh"
    cd /host
    sh -c 'exec /host/run.sh' </dev/null >/host/log 2>&1
    rc=$?
    cd /
else
    say "FATAL: /host/run.sh not found"
    rc=127
fi
echo "$rc" >/host/rc
say "job exited with status $rc"
umount /host/repo 2>/dev/null
umount /host 2>/dev/null
finish
