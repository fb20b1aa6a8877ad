#!/usr/bin/env bash
# The quick-start demo: installs what is missing, then shows what fabric-msg
# finds on this host.
set -euo pipefail
cd "$(dirname "$0")/.."
source ci/setup.sh
cargo run --quiet --release --locked -p fabric-msg-examples --bin fabric_info -- "$@"
