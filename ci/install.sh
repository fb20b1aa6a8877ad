#!/usr/bin/env bash
# Sourced by the scripts that install what they lack (ci/setup.sh and the
# benchmarks): `install_packages WHO PKG...` installs Debian packages with
# apt, through sudo when not root, saying so on stderr as WHO. Nothing to
# install, nothing done.
install_packages() {
  local who=$1
  shift
  (($#)) || return 0
  echo "$who: installing $*" >&2
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo=sudo
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

# Add to the caller's `need` array the Open MPI packages missing here:
# mpirun, and mpicc with its headers (trixie's openmpi-bin has an mpicc
# without them), for the benchmarks beside Open MPI.
need_openmpi() {
  dpkg-query -W -f='${Status}' libopenmpi-dev 2>/dev/null | grep -q 'install ok installed' || need+=(libopenmpi-dev)
  command -v mpirun >/dev/null || need+=(openmpi-bin)
}
