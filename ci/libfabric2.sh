#!/usr/bin/env bash
# Build the whole workspace against libfabric 2.x, and run what reaches
# libfabric (below, "cargo test"): Debian trixie's
# libfabric 2.1, in a trixie root made with debootstrap, run with chroot.
#
#   ci/libfabric2.sh                 # build, clippy, test (tests and tools), fabric_info
#   ci/libfabric2.sh --build         # only clippy and the tests' build (ci/test.sh runs
#                                    # it ahead, in the background, while other tests run)
#   ci/libfabric2.sh -- CMD [ARG...] # any command in the trixie root, from the repository
#   ci/libfabric2.sh --shell         # an interactive shell there
#
# The root lives in ${FABRIC_MSG_TRIXIE_CACHE:-$HOME/.cache/fabric-msg-trixie}/root
# (about 1.4 GB), never in the repository. It is built once (about a minute
# here, downloads included) and rebuilt only when the package list or this
# script's set-up part changes; otherwise the check takes well under a second.
#
# Rust: the host's rustup toolchain (RUSTUP_HOME, CARGO_HOME) is bind-mounted
# into the root at the same paths, so the 2.1 run uses exactly the compiler,
# clippy and crate cache of the 1.17 run and any difference between the two
# is libfabric's. (trixie's own rustc 1.85 would meet the workspace's
# rust-version, but its clippy would judge the code by other lints.) Build output goes to target/libfabric-2/ (ignored).
# Mounts are made in a private mount namespace (unshare -m): they vanish
# with the run, whatever happens to it.
#
# Needs root (debootstrap, chroot, mounts) and the Debian mirror the host's
# apt uses (FABRIC_MSG_TRIXIE_MIRROR overrides it).
set -euo pipefail
# Braces: bash reads the whole script before running it, so an edit while
# it runs (a long test) cannot change what the running copy does.
{
cd "$(dirname "$0")/.."
repo=$(pwd)

cache=${FABRIC_MSG_TRIXIE_CACHE:-$HOME/.cache/fabric-msg-trixie}
root=$cache/root
suite=trixie
# What the root needs: ci/setup.sh's list, plus what a minbase root lacks.
packages=(libfabric-dev libfabric-bin libclang-dev clang pkg-config gcc libc6-dev
    openmpi-bin libopenmpi-dev libpmix-dev ca-certificates  # mpicc: examples/tests/twins.rs
    iperf3 jq python3 iproute2)  # ci/bench/ab.sh

log() { echo "libfabric2.sh: $*" >&2; }
die() { echo "libfabric2.sh: error: $*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "needs root (debootstrap, chroot and bind mounts); run it with sudo"

mode=test
cmd=()
case ${1:-} in
"") ;;
--shell) mode=shell ;;
--build) mode=build ;;
--) shift; mode=cmd; cmd=("$@"); [ ${#cmd[@]} -gt 0 ] || die "nothing after --" ;;
-h | --help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
*) die "unknown argument $1 (see --help)" ;;
esac

# --- the Rust toolchain to lend the root --------------------------------------
cargo_bin=$(command -v cargo || true)
[ -n "$cargo_bin" ] || { [ -x "$HOME/.cargo/bin/cargo" ] && cargo_bin=$HOME/.cargo/bin/cargo; }
[ -n "$cargo_bin" ] || die "no cargo on the host: install Rust with rustup (https://rustup.rs)"
cargo_home=${CARGO_HOME:-$HOME/.cargo}
rustup_home=${RUSTUP_HOME:-$HOME/.rustup}
[ -d "$rustup_home/toolchains" ] ||
    die "no rustup toolchain in $rustup_home: the trixie root borrows the host's rustup toolchain"

# --- the root -----------------------------------------------------------------
mirror=${FABRIC_MSG_TRIXIE_MIRROR:-}
if [ -z "$mirror" ]; then
    # The first Debian archive the host's apt uses (deb822 or one-line format).
    mirror=$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null |
        sed -n 's|^URIs: *\(https\{0,1\}://[^ ]*/debian\)/\{0,1\} *$|\1|p' | head -n1)
    [ -n "$mirror" ] || mirror=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null |
        sed -n 's|^deb  *\(\[[^]]*\] *\)\{0,1\}\(https\{0,1\}://[^ ]*/debian\)/\{0,1\} .*|\2|p' | head -n1)
    [ -n "$mirror" ] || mirror=http://deb.debian.org/debian
fi

# The stamp covers what the root is made of: the suite, the packages and the
# set-up code below (from here to the end of build_root).
stamp=$( { echo "$suite ${packages[*]}"; sed -n '/^# --- the root/,/^} # build_root/p' "$0"; } |
    sha256sum | cut -d' ' -f1)

build_root() {
    command -v debootstrap >/dev/null || {
        log "installing debootstrap"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
            -o DPkg::Lock::Timeout=900 debootstrap >/dev/null ||
            die "could not install debootstrap (apt-get install debootstrap)"
    }
    local new=$cache/root.new start=$SECONDS
    rm -rf "$new"
    mkdir -p "$new"
    log "debootstrap $suite from $mirror into $new (a few minutes)"
    # minbase only: debootstrap's own resolver does not follow virtual
    # packages (libltdl-dev needs automake-1.17, which automake provides);
    # apt inside the root installs the rest.
    if ! debootstrap --variant=minbase "$suite" "$new" "$mirror" >"$cache/debootstrap.log" 2>&1; then
        tail -n 20 "$cache/debootstrap.log" >&2
        [ -f "$new/debootstrap/debootstrap.log" ] && tail -n 20 "$new/debootstrap/debootstrap.log" >&2
        die "debootstrap failed (log: $cache/debootstrap.log)"
    fi
    cp /etc/resolv.conf "$new/etc/resolv.conf"
    log "installing ${packages[*]} in the root"
    if ! unshare --mount --propagation private bash -c '
        r=$1; shift
        mount -t proc proc "$r/proc" && chroot "$r" apt-get -qq update &&
        DEBIAN_FRONTEND=noninteractive chroot "$r" apt-get -qq -y --no-install-recommends install "$@"
        ' _ "$new" "${packages[@]}" >"$cache/apt.log" 2>&1; then
        tail -n 20 "$cache/apt.log" >&2
        die "apt-get install in the root failed (log: $cache/apt.log)"
    fi
    # The host name, for the tests.
    cp /etc/hosts "$new/etc/hosts"
    chroot "$new" apt-get clean
    {
        echo "suite: $suite from $mirror"
        chroot "$new" dpkg-query -W -f='${Package} ${Version}\n' "${packages[@]}"
    } >"$new/fabric-msg-root.txt"
    echo "$stamp" >"$new/fabric-msg-stamp"
    rm -rf "$root"
    mv "$new" "$root"
    log "root ready in $((SECONDS - start)) s: $root"
} # build_root

mkdir -p "$cache"
exec 9>"$cache/lock"
flock 9  # builds exclusively; runs share the root (below)
if [ ! -f "$root/fabric-msg-stamp" ] || [ "$(cat "$root/fabric-msg-stamp")" != "$stamp" ]; then
    build_root
fi
flock -s 9

# --- the run ------------------------------------------------------------------
target_dir=target/libfabric-2
mkdir -p "$target_dir"
toolchain_path=$(dirname "$cargo_bin")

# What runs inside the root, after the mounts.
inner=$(mktemp "$cache/inner.XXXXXX")
trap 'rm -f "$inner"' EXIT
{
    echo 'set -euo pipefail'
    printf 'export PATH=%q:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n' "$toolchain_path"
    printf 'export HOME=%q CARGO_HOME=%q RUSTUP_HOME=%q CARGO_TARGET_DIR=%q\n' \
        "$HOME" "$cargo_home" "$rustup_home" "$repo/$target_dir"
    # Nothing from the host's libfabric set-up leaks in.
    echo 'unset LIBFABRIC_DIR LIBFABRIC_INCLUDE_DIR LIBFABRIC_LIB_DIR PKG_CONFIG_PATH LD_LIBRARY_PATH'
    # Slurm is not libfabric's: its tests run in the host's run. The root
    # shares the host's network, where that run's cluster holds the ports.
    echo 'export FABRIC_MSG_SLURM=off FABRIC_MSG_SLURM_WHY="in ci/libfabric2.sh'"'"'s trixie root; srun is tested in the host'"'"'s libfabric 1.17 run (Slurm and PMIx do not depend on libfabric)"'
    # Warnings are errors, as in ci/test.sh; the same flags in every mode, so
    # a build for the VM reuses the test run's (cargo rebuilds on new flags).
    echo 'case " ${RUSTFLAGS:-} " in *" -D warnings "*) ;; *) export RUSTFLAGS="${RUSTFLAGS:-} -D warnings" ;; esac'
    echo 'case " ${RUSTDOCFLAGS:-} " in *" -D warnings "*) ;; *) export RUSTDOCFLAGS="${RUSTDOCFLAGS:-} -D warnings" ;; esac'
    printf 'cd %q\n' "$repo"
    case $mode in
    shell) echo 'exec bash -i' ;;
    cmd) printf 'exec'; printf ' %q' "${cmd[@]}"; echo ;;
    test | build)
        [ "$mode" = build ] && echo 'build_only=1' || echo 'build_only=0'
        cat <<'EOF'
step() { printf '\n==> [trixie] %s\n' "$*" >&2; }
step "libfabric in the root: $(fi_info --version | tr '\n' ' ')"
fi_info --version | grep -q '^libfabric: 2\.' || { echo "not libfabric 2.x" >&2; exit 1; }
# Clippy on the two crates whose code changes with the headers
# (cfg(libfabric_v2): a few items in libfabric-sys and fabric-msg's
# discovery); the tests and tools are the same source as on 1.17, linted
# in the host's run, and compiled here by cargo test with -D warnings.
step "cargo clippy (libfabric 2.x): libfabric-sys and fabric-msg"
cargo clippy -p libfabric-sys -p fabric-msg --features fabric-msg/tokio --lib --locked -- -D warnings
step "cargo test (libfabric 2.x): everything that reaches libfabric"
# libfabric-sys and fabric-msg whole (every provider, the async adapter
# included), and the tools' tests that drive providers or the World's data
# path over them. The rest of examples/tests runs in the host's 1.17 run
# only: it tests fabric-msg's own layers above the providers (the node
# transport, the collectives' algorithms, the programming model, launchers
# and C twins) through the same provider calls the tests here make, and
# took 4 of this step's 9 minutes. Every file in examples/tests is in one
# list or the other, so a new one cannot fall out unseen. The files are
# modules of one test binary (examples/tests/examples.rs, `--test
# examples`): on_2x's tests are picked by their module's name (`world::`),
# and host_only's skipped by theirs, for a filter is a substring (`world::`
# also matches `async_world::`).
on_2x=(async_tools atomics fabric_info forgery rma_pingpong shm_stale_region
    short_recv symmetric tools waits world world_soak)
host_only=(async_world collectives departures loss_bench model node_pingpong
    percentiles slurm twins world_local)
for f in examples/tests/*.rs; do
    t=$(basename "$f" .rs)
    [ "$t" = examples ] && continue  # the binary's root
    [[ " ${on_2x[*]} ${host_only[*]} " == *" $t "* ]] ||
        { echo "ci/libfabric2.sh: examples/tests/$t.rs is in neither list (on_2x, host_only)" >&2; exit 1; }
done
tool_tests=()
for t in "${on_2x[@]}"; do
    for h in "${host_only[@]}"; do
        [[ $t != *"$h" ]] ||
            { echo "ci/libfabric2.sh: $t (on_2x) ends with $h (host_only): the skip of $h:: would leave out $t::" >&2; exit 1; }
    done
    tool_tests+=("$t::")
done
for t in "${host_only[@]}"; do tool_tests+=(--skip "$t::"); done
# Workspace commands only, so fabric-msg is built with the features the
# host's run and the VM's binaries use, once: the build takes every test
# below, the first run all but the tools' binary, the second that binary,
# with the filters above. No `--bins`: the tools have no tests of their own
# (`test = false` in examples/Cargo.toml), and `--test examples` builds
# them as the programs its tests run.
tests=(--lib)
for f in libfabric-sys/tests/*.rs; do tests+=(--test "$(basename "$f" .rs)"); done
# fabric-msg's are the [[test]] targets its Cargo.toml lists (most of its
# files are modules of one binary, tests/integration.rs).
for t in $(awk '/^\[\[test\]\]/ { t = 1; next } t && /^name = / { gsub(/"/, "", $3); print $3; t = 0 }' fabric-msg/Cargo.toml); do
    tests+=(--test "$t")
done
if [ "$build_only" = 1 ]; then
    cargo test --workspace --locked --no-run "${tests[@]}" --test examples
    exit 0
fi
timeout 1200 cargo test --workspace --locked "${tests[@]}"
timeout 900 cargo test --workspace --locked --test examples -- "${tool_tests[@]}"
timeout 600 cargo test --workspace --locked --doc
step "cargo doc (libfabric 2.x)"
cargo doc --workspace --no-deps --locked
step "fabric_info (libfabric 2.x)"
"$CARGO_TARGET_DIR/debug/fabric_info"
EOF
        ;;
    esac
} >"$inner"

# The mounts and the chroot, run by unshare -m in a private mount namespace:
# every mount disappears with it.
outer=$(mktemp "$cache/outer.XXXXXX")
trap 'rm -f "$inner" "$outer"' EXIT
cat >"$outer" <<'OUTER'
set -euo pipefail
root=$1 repo=$2 cargo_home=$3 rustup_home=$4 inner=$5 mode=$6
bind() { # SRC [ro]: mount SRC at the same path inside the root
    mkdir -p "$root$1"
    mount --rbind "$1" "$root$1"
    [ "${2:-}" = ro ] && mount -o remount,bind,ro "$root$1"
    return 0
}
mount -t proc proc "$root/proc"
# ci/test.sh's short /proc/kallsyms (ci/kallsyms.sh), in the root's /proc
# too: this namespace's /proc/kallsyms is that file.
if [ -n "${FABRIC_MSG_KALLSYMS_CUT:-}" ]; then
    mount --bind /proc/kallsyms "$root/proc/kallsyms"
fi
mount --rbind /sys "$root/sys"
mount --rbind /dev "$root/dev"
# shm's segments go to /dev/shm: give the root its own, empty one.
mount -t tmpfs -o mode=1777 tmpfs "$root/dev/shm"
mount -t tmpfs tmpfs "$root/tmp"
bind "$repo"
bind "$cargo_home"
bind "$rustup_home" ro
cp "$inner" "$root/tmp/fabric-msg-run.sh"
if [ "$mode" = shell ]; then
    exec chroot "$root" bash /tmp/fabric-msg-run.sh
fi
exec chroot "$root" bash /tmp/fabric-msg-run.sh </dev/null
OUTER
unshare --mount --propagation private bash "$outer" "$root" "$repo" "$cargo_home" \
    "$rustup_home" "$inner" "$mode"
exit
}
