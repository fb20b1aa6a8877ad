#!/usr/bin/env bash
# The quick-start demo: installs what is missing, then shows what fabric-msg
# finds on this host.
set -euo pipefail
cd "$(dirname "$0")/.."
source ci/setup.sh
cargo build --quiet --release --locked -p fabric-msg-examples
# Which fabric this host offers, and why ...
target/release/fabric_info "$@"
# ... and messages over it: a ping-pong between two endpoints of this process.
echo
target/release/pingpong --loopback --verify -I 1000 -S 1
target/release/pingpong --loopback --verify -I 100 -S 65536 | tail -n 1
