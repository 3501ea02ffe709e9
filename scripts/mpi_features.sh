#!/usr/bin/env bash
# Prints the cargo arguments that build the MPI communicator (and the CLI's MPI tests), where Open MPI and libclang
# (the mpi crate's bindgen) are installed; nothing elsewhere, where the default build
# needs no MPI. `.ci/run` installs them, so CI builds and tests it.
if command -v mpicc >/dev/null 2>&1 && command -v mpirun >/dev/null 2>&1 \
  && ldconfig -p 2>/dev/null | grep -q 'libclang'; then
  echo "--features minivllm-cli/mpi"
fi
