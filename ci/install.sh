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
