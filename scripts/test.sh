#!/usr/bin/env bash
# Installs what is missing, builds everything (the CUDA backend too where nvcc exists), and runs the whole test
# suite with ctest. This is what .ci/run calls.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
scripts/build.sh "$@"
cd build
ctest --output-on-failure --timeout 600 -j"$(nproc)"
