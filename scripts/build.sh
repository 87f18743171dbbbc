#!/usr/bin/env bash
# Configures and builds dtrain into build/ (binaries in build/bin/). Extra args go to cmake's configure step,
# e.g. scripts/build.sh -DDTRAIN_CUDA=OFF. DTRAIN_TARGETS="dtrain_ps dtrain_worker" builds only those.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
targets=()
for t in ${DTRAIN_TARGETS:-}; do targets+=(--target "$t"); done
cmake --build build -j"$(nproc)" "${targets[@]}"
