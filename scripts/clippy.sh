#!/usr/bin/env bash
# clippy over the workspace, warnings denied, with the compiler that Cargo.toml's
# `rust-version` names: one pass lints and proves that claim (a newer toolchain's clippy
# may lint more; run `cargo clippy` too while working). Where that toolchain cannot be
# installed, lints with the default one and says the claim went unchecked.
set -euo pipefail
cd "$(dirname "$0")/.."

msrv=$(sed -n 's/^rust-version = "\(.*\)"/\1/p' Cargo.toml)
[ -n "$msrv" ] || { echo "clippy.sh: no rust-version in Cargo.toml" >&2; exit 1; }
toolchain=()
if command -v rustup >/dev/null 2>&1 \
  && rustup toolchain install "$msrv" --profile minimal --component clippy >/dev/null 2>&1; then
  toolchain=("+$msrv")
  echo "clippy with Rust $msrv (rust-version)"
else
  echo "clippy.sh: SKIPPED the rust-version $msrv check: toolchain $msrv cannot be installed" \
    "here; linting with $(rustc --version)" >&2
fi
# shellcheck disable=SC2046 # the features are separate words
cargo "${toolchain[@]}" clippy --workspace --all-targets $(scripts/mpi_features.sh) -- -D warnings
