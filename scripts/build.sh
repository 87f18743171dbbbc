#!/usr/bin/env bash
# Configures and builds dtrain into build/ (binaries in build/bin/). Extra args go to cmake's configure step,
# e.g. scripts/build.sh -DDTRAIN_CUDA=OFF.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build build -j"$(nproc)"
