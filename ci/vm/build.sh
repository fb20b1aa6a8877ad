#!/bin/bash
# Build (or check) the test VM used by ci/vm/run.sh: a Debian bookworm kernel
# with soft-RoCE (rdma_rxe, shipped) and soft-iWARP (siw, built here out of
# tree), and a small initramfs with libfabric, rdma-core and busybox from
# bookworm (libfabric 1.17) or, with FABRIC_MSG_VM_USERLAND=trixie, from
# trixie (libfabric 2.1) on the same kernel.
#
# Everything lands in the cache directory, never in the repository:
#   ${FABRIC_MSG_VM_CACHE:-$HOME/.cache/fabric-msg-vm}
#     debs/        downloaded .deb files (kernel pieces and guest packages)
#     apt/         private apt state (empty dpkg status, package cache)
#     apt-trixie/  private apt lists and sources for the trixie user space
#     work/        scratch trees of the last build
#     image/       vmlinuz, initrd.img, siw.ko, info.txt, stamp  <- run.sh
#     image-trixie/  the same with the trixie user space
#
# Idempotent: when image/stamp matches the inputs (kernel version, package
# list, this script, init.sh) it returns at once.
#
# Environment:
#   FABRIC_MSG_VM_CACHE           cache directory (see above)
#   FABRIC_MSG_VM_KERNEL_VERSION  Debian version of linux-image-amd64 to use
#                                 (default: the newest whose pieces are all
#                                 available, e.g. 6.1.192-2)
#   FABRIC_MSG_VM_USERLAND        bookworm (default) or trixie: where the
#                                 guest's packages come from
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cache=${FABRIC_MSG_VM_CACHE:-$HOME/.cache/fabric-msg-vm}
userland=${FABRIC_MSG_VM_USERLAND:-bookworm}
case $userland in
bookworm) image=$cache/image ;;
trixie) image=$cache/image-trixie ;;
*) echo "build.sh: error: FABRIC_MSG_VM_USERLAND is bookworm or trixie, not $userland" >&2; exit 1 ;;
esac

# Guest user space: the closure of these packages is unpacked into the
# initramfs. bash runs job scripts; libgcc-s1 is needed by Rust binaries.
guest_packages=(libfabric1 libfabric-bin ibverbs-providers ibverbs-utils
    librdmacm1 rdmacm-utils iproute2 kmod busybox-static bash libgcc-s1)

# Modules the guest's /init loads; their dependencies are added automatically.
guest_modules=(crc32_generic crc32_pclmul ib_uverbs rdma_ucm rdma_rxe siw
    dummy 9p 9pnet_virtio virtio_pci virtio_net)

log() { echo "build.sh: $*" >&2; }
die() { echo "build.sh: error: $*" >&2; exit 1; }

# --- host tools ------------------------------------------------------------

# command -> Debian package providing it
declare -A host_tools=(
    [qemu-system-x86_64]=qemu-system-x86 [zstd]=zstd [cpio]=cpio [xz]=xz-utils
    [gcc]=gcc [make]=make [strip]=binutils [depmod]=kmod [modprobe]=kmod
    [dpkg-deb]=dpkg [apt-get]=apt [flock]=util-linux
)

apt_update_tried=0
apt_update() {
    # Another apt may hold the lists lock for a while: wait, do not kill it.
    [ "$apt_update_tried" = 1 ] && return 0
    apt_update_tried=1
    local i
    for i in $(seq 1 60); do
        apt-get -qq update >&2 && return 0
        log "apt-get update failed (lock held?), retrying in 10 s ($i/60)"
        sleep 10
    done
    die "apt-get update kept failing"
}

install_host_tools() {
    local missing=() cmd
    for cmd in "${!host_tools[@]}"; do
        command -v "$cmd" >/dev/null 2>&1 || missing+=("${host_tools[$cmd]}")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)
    [ "$(id -u)" = 0 ] ||
        die "missing host packages: ${missing[*]} (install them as root: apt-get install ${missing[*]})"
    log "installing host packages: ${missing[*]}"
    # DPkg::Lock::Timeout: wait for another running apt/dpkg instead of failing.
    apt_get_install() {
        DEBIAN_FRONTEND=noninteractive apt-get -qq -y --no-install-recommends \
            -o DPkg::Lock::Timeout=900 install "${missing[@]}" >/dev/null
    }
    apt_get_install || { apt_update; apt_get_install; } ||
        die "could not install ${missing[*]}"
}

# --- apt helpers for downloads ---------------------------------------------

# apt against an empty dpkg status: resolves the full dependency closure as
# if for an empty system and downloads it to $cache/debs, never touching the
# host's package state.
apt_private() {
    apt-get -q \
        -o Dir::State::status="$cache/apt/status" \
        -o Dir::Cache="$cache/apt/cache" \
        -o Dir::Cache::archives="$cache/debs" \
        -o APT::Install-Recommends=false \
        -o APT::Sandbox::User=root \
        "$@"
}

candidate_version() {  # package -> apt's candidate version (or empty)
    apt-cache policy "$1" 2>/dev/null | sed -n 's/^ *Candidate: *//p' | grep -v '(none)' || true
}

# Filename of a package version in $cache/debs, as apt names its archives.
deb_file() {  # name version arch
    echo "$cache/debs/$1_${2//:/%3a}_$3.deb"
}

# apt options for the guest's packages: the host's own lists for bookworm;
# for trixie, private lists from the Debian archive the host uses (the
# host's keyring has trixie's keys), refreshed once a day.
guest_apt=()
guest_sources() {
    [ "$userland" = trixie ] || return 0
    local d=$cache/apt-trixie mirror
    mirror=$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null |
        sed -n 's|^URIs: *\(https\{0,1\}://[^ ]*/debian\)/\{0,1\} *$|\1|p' | head -n1)
    mirror=${mirror:-http://deb.debian.org/debian}
    mkdir -p "$d/lists/partial" "$d/cache" "$d/parts"
    echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror trixie main" >"$d/sources.list"
    guest_apt=(-o Dir::Etc::SourceList="$d/sources.list" -o Dir::Etc::SourceParts="$d/parts"
        -o Dir::State::Lists="$d/lists" -o Dir::Cache="$d/cache")
    if [ -z "$(find "$d/lists" -maxdepth 1 -name '*_Packages*' -mmin -1440 2>/dev/null)" ]; then
        log "apt-get update for the trixie user space ($mirror)"
        apt_private "${guest_apt[@]}" update >"$d/update.log" 2>&1 ||
            { cat "$d/update.log" >&2; die "apt-get update for trixie failed"; }
    fi
}

# --- main --------------------------------------------------------------------

install_host_tools
mkdir -p "$cache/debs/partial" "$cache/apt/cache"
[ -f "$cache/apt/status" ] || : >"$cache/apt/status"

# One build at a time per cache.
exec 9>"$cache/build.lock"
flock 9

# The kernel: the newest linux-image-amd64 whose pieces apt can all give:
# image, headers and headers-common at exactly its version (they carry the
# module ABI), kbuild and source at the same upstream version (6.1.192-*).
# A mirror is sometimes caught mid-update: on 2026-11-28 the security
# archive had linux-image-amd64 6.1.192-2 but linux-kbuild-6.1 only at
# 6.1.192-3 (kbuild's tools and the source do not change with the Debian
# revision of one upstream release); a version whose ABI pieces are
# missing is passed over for the next older one, saying so.
versions_of() {  # package -> every version apt knows, newest first
    apt-cache madison "$1" 2>/dev/null | awk -F'|' '{gsub(/ /, "", $2); print $2}' |
        awk '!seen[$0]++'
}
arch_of() {  # package version -> its architecture, empty when apt cannot give it
    apt-cache show "$1=$2" 2>/dev/null | sed -n 's/^Architecture: //p' | head -n1
}
available() {  # package version -> 0 when apt can give it
    [ -n "$(arch_of "$1" "$2")" ]
}
kernel_set() {  # linux-image-amd64 version -> "package=version ..." or failure
    local meta=$1 img k ser up p v pieces=()
    img=$(apt-cache show "linux-image-amd64=$meta" 2>/dev/null |
        sed -n 's/^Depends:.*\(linux-image-[0-9][^ ,]*-amd64\).*/\1/p' | head -n1)
    [ -n "$img" ] || return 1
    k=${img#linux-image-}; ser=${k%%.0-*}; up=${meta%-*}
    for p in "$img" "linux-headers-$k" "linux-headers-${k%-amd64}-common"; do
        available "$p" "$meta" || { log "kernel $meta: $p=$meta is not available"; return 1; }
        pieces+=("$p=$meta")
    done
    for p in "linux-kbuild-$ser" "linux-source-$ser"; do
        if available "$p" "$meta"; then
            v=$meta
        else
            v=$(versions_of "$p" | grep -m1 -F "$up-" || true)
            [ -n "$v" ] || { log "kernel $meta: no $p of upstream $up"; return 1; }
            log "kernel $meta: $p=$meta is not available; using $v (same upstream $up)"
        fi
        pieces+=("$p=$v")
    done
    echo "${pieces[*]}"
}
if [ -n "${FABRIC_MSG_VM_KERNEL_VERSION:-}" ]; then
    metas=("$FABRIC_MSG_VM_KERNEL_VERSION")
else
    mapfile -t metas < <(versions_of linux-image-amd64)
    if [ ${#metas[@]} -eq 0 ]; then
        apt_update
        mapfile -t metas < <(versions_of linux-image-amd64)
    fi
fi
[ ${#metas[@]} -gt 0 ] || die "apt knows no linux-image-amd64 (is the Debian mirror configured?)"
kver_deb= kernel_pkgs=()
for m in "${metas[@]}"; do
    if set_line=$(kernel_set "$m"); then
        kver_deb=$m
        read -ra kernel_pkgs <<<"$set_line"
        break
    fi
done
[ -n "$kver_deb" ] ||
    die "no linux-image-amd64 version (${metas[*]}) has its image, headers, kbuild and source all available from apt"
image_pkg=${kernel_pkgs[0]%%=*}
kver=${image_pkg#linux-image-}          # e.g. 6.1.0-56-amd64
kabi=${kver%-amd64}                     # e.g. 6.1.0-56
kseries=${kver%%.0-*}                   # e.g. 6.1

guest_sources
stamp=$(
    {
        echo "userland $userland ${guest_apt[*]}"
        echo "kernel $kver ${kernel_pkgs[*]}"
        echo "packages ${guest_packages[*]}"
        echo "modules ${guest_modules[*]}"
        cat "$here/build.sh" "$here/init.sh"
    } | sha256sum | cut -d' ' -f1
)
if [ -f "$image/stamp" ] && [ "$(cat "$image/stamp")" = "$stamp" ]; then
    log "up to date: $image ($kver, $userland user space)"
    exit 0
fi

start=$SECONDS
log "building the VM image for kernel $kver ($kver_deb), $userland user space, in $image"
work=$cache/work
rm -rf "$work" "$image.new"
mkdir -p "$work" "$image.new"

# 1. Kernel pieces: image, headers, kbuild and source (above).
need=()
declare -A kernel_version=()
for pv in "${kernel_pkgs[@]}"; do
    p=${pv%%=*} v=${pv#*=}
    kernel_version[$p]=$v
    [ -f "$(deb_file "$p" "$v" "$(arch_of "$p" "$v")")" ] || need+=("$p=$v")
done
if [ ${#need[@]} -gt 0 ]; then
    log "downloading ${need[*]}"
    (cd "$cache/debs" && apt_private download "${need[@]}") >"$work/apt-download.log" 2>&1 ||
        { cat "$work/apt-download.log" >&2; die "download failed"; }
fi
kdeb() { local v=${kernel_version[$1]}; ls "$cache/debs/$1_${v//:/%3a}_"*.deb; }

# 2. Guest packages: resolve the closure (simulate), then download it.
apt_private "${guest_apt[@]}" -s install "${guest_packages[@]}" >"$work/closure.txt" ||
    die "apt cannot resolve the guest packages: ${guest_packages[*]}"
# "Inst libc6 (2.36-9+deb12u14 Debian:12.15/oldstable [amd64]) []"
sed -n 's/^Inst \([^ ]*\) (\([^ ]*\) [^[]*\[\([a-z0-9]*\)\].*/\1 \2 \3/p' \
    "$work/closure.txt" >"$work/closure.list"
[ -s "$work/closure.list" ] || die "empty package closure (see $work/closure.txt)"
guest_debs=()
download=0
while read -r name ver arch; do
    f=$(deb_file "$name" "$ver" "$arch")
    guest_debs+=("$f")
    [ -f "$f" ] || download=1
done <"$work/closure.list"
if [ "$download" = 1 ]; then
    log "downloading ${#guest_debs[@]} guest packages"
    apt_private "${guest_apt[@]}" -y --download-only install "${guest_packages[@]}" >"$work/apt-guest.log" 2>&1 ||
        { cat "$work/apt-guest.log" >&2; die "download of the guest packages failed"; }
fi
for f in "${guest_debs[@]}"; do [ -f "$f" ] || die "download failed: $f"; done

# 3. Unpack kernel image (for vmlinuz and modules) and headers + kbuild.
log "unpacking kernel $kver"
ktree=$work/kernel
mkdir -p "$ktree"
dpkg-deb -x "$(kdeb "$image_pkg")" "$ktree"
for p in "linux-headers-$kver" "linux-headers-$kabi-common" "linux-kbuild-$kseries"; do
    dpkg-deb -x "$(kdeb "$p")" "$ktree"
done
# The arch headers' Makefile includes the common one by absolute path
# (/usr/src/...): point it at the unpacked copy instead.
kbuild_dir=$ktree/usr/src/linux-headers-$kver
sed -i "s|^include /usr/src/|include $ktree/usr/src/|" "$kbuild_dir/Makefile"

# 4. siw.ko, out of tree, from the matching linux-source.
log "building siw.ko"
siw_src=linux-source-$kseries/drivers/infiniband/sw/siw
dpkg-deb --fsys-tarfile "$(kdeb "linux-source-$kseries")" |
    tar -xO "./usr/src/linux-source-$kseries.tar.xz" |
    tar -xJ -C "$work" "$siw_src"
mv "$work/$siw_src" "$work/siw"
cat >"$work/siw/Kbuild" <<'EOF'
obj-m := siw.o
siw-y := siw_cm.o siw_cq.o siw_main.o siw_mem.o siw_qp.o siw_qp_tx.o siw_qp_rx.o siw_verbs.o
EOF
make -s -C "$kbuild_dir" M="$work/siw" -j"$(nproc)" modules >"$work/siw-build.log" 2>&1 ||
    { tail -n 30 "$work/siw-build.log" >&2; die "siw build failed (log: $work/siw-build.log)"; }
strip --strip-debug "$work/siw/siw.ko"
mkdir -p "$ktree/lib/modules/$kver/extra"
cp "$work/siw/siw.ko" "$ktree/lib/modules/$kver/extra/siw.ko"
cp "$work/siw/siw.ko" "$image.new/siw.ko"

# 5. Module closure: depmod the unpacked tree, then ask modprobe which files
#    each wanted module needs ("insmod /path/to/x.ko" lines).
depmod -b "$ktree" "$kver"
root=$work/root
mkdir -p "$root"
for m in "${guest_modules[@]}"; do
    modprobe -d "$ktree" -S "$kver" --show-depends "$m" ||
        die "module $m not found in $kver"
done | awk '$1 == "insmod" { print $2 }' | sort -u >"$work/modules.list"
while read -r ko; do
    rel=${ko#"$ktree"/}
    mkdir -p "$root/usr/$(dirname "$rel")"
    cp "$ko" "$root/usr/$rel"
done <"$work/modules.list"
cp "$ktree/lib/modules/$kver"/modules.{order,builtin,builtin.modinfo} \
    "$root/usr/lib/modules/$kver/"

# 6. Guest user space: unpack the packages (maintainer scripts do not run),
#    then merge /bin, /sbin, /lib, /lib64 into /usr as bookworm systems have.
log "assembling the initramfs"
for f in "${guest_debs[@]}"; do dpkg-deb -x "$f" "$root"; done
for d in bin sbin lib lib64; do
    if [ -d "$root/$d" ] && [ ! -L "$root/$d" ]; then
        mkdir -p "$root/usr/$d"
        cp -a "$root/$d/." "$root/usr/$d/"
        rm -rf "${root:?}/$d"
    fi
    mkdir -p "$root/usr/$d"
    [ -L "$root/$d" ] || ln -s "usr/$d" "$root/$d"
done
# /bin/sh is bash, as a job's `sh -c` would otherwise run busybox sh, which
# prefers its applets (busybox ip, modprobe, ...) to the real programs.
ln -s bash "$root/usr/bin/sh"
# Busybox applets for whatever the packages do not provide (mount, ...).
# A real binary (kmod's modprobe, iproute2's ip) always wins.
"$root/usr/bin/busybox" --list-full | while read -r applet; do
    name=${applet##*/}
    case $applet in
    usr/*) dir=$root/$applet ;;
    *) dir=$root/usr/$applet ;;
    esac
    dir=${dir%/*}
    # -L as well as -e: links such as usr/sbin/modprobe -> /bin/kmod are
    # absolute and do not resolve on the host.
    for f in "$root/usr/bin/$name" "$root/usr/sbin/$name"; do
        [ -e "$f" ] || [ -L "$f" ] && continue 2
    done
    mkdir -p "$dir" && ln -s /usr/bin/busybox "$dir/$name"
done
# What maintainer scripts would have done (bookworm's libfabric1 needs
# libpsm1, whose library update-alternatives links).
if [ -e "$root/usr/lib/libpsm1/libpsm_infinipath.so.1.16" ]; then
    ln -sf /usr/lib/libpsm1/libpsm_infinipath.so.1.16 \
        "$root/usr/lib/x86_64-linux-gnu/libpsm_infinipath.so.1"
fi
mkdir -p "$root/etc" "$root/root" "$root/tmp" "$root/proc" "$root/sys" "$root/dev" "$root/host"
echo 'include /etc/ld.so.conf.d/*.conf' >"$root/etc/ld.so.conf"
echo 'root:x:0:0:root:/root:/bin/bash' >"$root/etc/passwd"
echo 'root:x:0:' >"$root/etc/group"
printf '127.0.0.1\tlocalhost\n198.18.0.1\tfabric-msg-vm\n' >"$root/etc/hosts"
rm -rf "$root/usr/share/doc" "$root/usr/share/man" "$root/usr/share/info" \
    "$root/usr/share/locale" "$root/usr/share/lintian"
ldconfig -r "$root"
depmod -b "$root" "$kver"
install -m 0755 "$here/init.sh" "$root/init"

# 7. Pack: newc cpio, zstd (the Debian kernel has CONFIG_RD_ZSTD=y).
(cd "$root" && find . -print0 | LC_ALL=C sort -z |
    cpio --null -o -H newc --quiet) | zstd -q -T0 -9 >"$image.new/initrd.img"
cp "$ktree/boot/vmlinuz-$kver" "$image.new/vmlinuz"
{
    echo "kernel: $kver (Debian linux-image-amd64 $kver_deb)"
    echo "siw.ko: built out of tree from linux-source-$kseries ${kernel_version[linux-source-$kseries]}"
    echo "guest packages ($userland):"
    sed 's/^/  /' "$work/closure.list"
} >"$image.new/info.txt"
echo "$stamp" >"$image.new/stamp"

rm -rf "$image"
mv "$image.new" "$image"
rm -rf "$work"
log "done in $((SECONDS - start)) s: $image" \
    "(initrd $(du -h "$image/initrd.img" | cut -f1), $(wc -l <"$image/info.txt") lines in info.txt)"
