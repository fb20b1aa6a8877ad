#!/usr/bin/env bash
# The whole test suite, as CI runs it: set-up, formatting, lints, tests, docs.
set -euo pipefail
cd "$(dirname "$0")/.."
source ci/setup.sh

export RUSTFLAGS="${RUSTFLAGS:-} -D warnings"
export RUSTDOCFLAGS="${RUSTDOCFLAGS:-} -D warnings"

step() { printf '\n==> %s\n' "$*" >&2; }

step "source layout (layers, import cycles, file sizes)"
python3 ci/check-layers.py

step "cargo fmt --check"
cargo fmt --all --check

step "cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "cargo test"
# Nothing may hang CI: the suite takes about a minute here.
timeout 1200 cargo test --workspace --locked

step "cargo doc"
cargo doc --workspace --no-deps --locked

step "fabric matrix (soft-RoCE and soft-iWARP in a QEMU guest)"
bash ci/fabric-matrix.sh
