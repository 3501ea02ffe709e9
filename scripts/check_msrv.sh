#!/usr/bin/env bash
# Checks that the workspace builds with the oldest compiler Cargo.toml's `rust-version`
# claims, so that the claim is tested rather than assumed. Type-checking is enough (no
# code generation), in a target folder of its own so the main build's stays warm.
set -euo pipefail
cd "$(dirname "$0")/.."

msrv=$(sed -n 's/^rust-version = "\(.*\)"/\1/p' Cargo.toml)
[ -n "$msrv" ] || { echo "check_msrv.sh: no rust-version in Cargo.toml" >&2; exit 1; }
if ! command -v rustup >/dev/null 2>&1; then
  echo "check_msrv.sh: SKIPPED rust-version $msrv check: rustup is not installed" >&2
  exit 0
fi
if ! rustup toolchain install "$msrv" --profile minimal >/dev/null 2>&1; then
  echo "check_msrv.sh: SKIPPED rust-version $msrv check: toolchain $msrv cannot be installed here" >&2
  exit 0
fi
echo "checking the workspace with Rust $msrv (rust-version)"
CARGO_TARGET_DIR=target/msrv cargo "+$msrv" check --workspace --all-targets --locked --quiet
