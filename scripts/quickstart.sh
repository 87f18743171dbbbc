#!/usr/bin/env bash
# From a fresh Debian machine: installs what is missing, builds, and trains the default model (the MNIST MLP)
# on Fashion-MNIST with a local cluster of 1 ps and 2 workers in sync mode, then prints the test accuracy.
# Extra arguments go to the workers (e.g. --model=cnn --train_steps=500).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
DTRAIN_TARGETS="dtrain_ps dtrain_worker" scripts/build.sh
exec scripts/run_local_cluster.sh --ps 1 --workers 2 -- --mode=sync --model=mlp --train_steps=2000 --log_every=100 "$@"
