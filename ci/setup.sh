#!/usr/bin/env bash
# Installs what fabric-msg needs to build and test on Debian or Ubuntu.
# Idempotent: when everything is present it only checks, in well under a second.
set -euo pipefail

packages=(
  libfabric-dev   # headers, libfabric.so, libfabric.pc (>= 1.17)
  libfabric-bin   # fi_info, fi_pingpong: the C tools we compare against
  libclang-dev    # bindgen parses the libfabric headers with libclang
  clang
  pkg-config
  gcc             # compiles bindgen's shims for libfabric's static inline functions
  openmpi-bin     # mpirun: the World's tests launch ranks through its PMIx server
  libopenmpi-dev  # mpicc: ci/bench/world_vs_mpi.sh and ab.sh build the Open MPI side of the comparisons
  ucx-utils       # ucx_perftest: ci/bench/ab.sh's peers section compares us with UCX
  libpmix-dev     # pmix.h and pmix.pc: the PMIx layout test checks our ABI against them
  slurmctld       # a one-node Slurm (ci/slurm.sh) runs the World under srun --mpi=pmix;
  slurmd          #   slurmd pulls slurm-wlm-basic-plugins, which ships mpi_pmix_v4.so
  slurm-client    # srun, sinfo, scontrol
  munge           # Slurm's authentication daemon
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

source "$(dirname "${BASH_SOURCE[0]}")/install.sh"
install_packages ci/setup.sh "${missing[@]}"

if ! command -v cargo >/dev/null 2>&1; then
  [ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"
fi
if ! command -v cargo >/dev/null 2>&1; then
  echo "ci/setup.sh: no Rust toolchain found; install one with rustup (https://rustup.rs) and re-run" >&2
  exit 1
fi
for component in rustfmt clippy; do
  if ! cargo "${component/rustfmt/fmt}" --version >/dev/null 2>&1; then
    command -v rustup >/dev/null && rustup component add "$component"
  fi
done
