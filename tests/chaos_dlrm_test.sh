#!/usr/bin/env bash
# tests/chaos.sh with dlrm: writes a small synthetic click-through-rate data set (dtrain_convert --synthetic_ctr)
# and runs 2 chaos trials of 1 ps + 3 sync workers on it. Seed 1 (300 steps) draws worker 2 killed at step 106
# and restarted, then the ps killed at step 138 (drawn 148, moved inside its checkpoint interval: tests/chaos.sh)
# and restarted: it must restore its embedding rows from the checkpoint of step 125, and every other check of
# chaos.sh holds with sparse tables (the update checker included); the run fails unless a ps was killed after a
# checkpoint and restored sparse rows (--require). The data moves over TCP lanes (--transport=tcp, as between
# hosts): rows pushed and pulled on lanes broken by the kills. Extra arguments go to chaos.sh, after these (e.g.
# --trials=10 --seed=S --keep, or --require= to lift the requirement).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BIN="${DTRAIN_BIN_DIR:-$ROOT/build/bin}"
[ -x "$BIN/dtrain_convert" ] || { echo "FAIL: $BIN/dtrain_convert not built (set DTRAIN_BIN_DIR)"; exit 1; }
data="$(mktemp -d /tmp/dtrain_chaos_dlrm.XXXXXX)"
trap 'rm -rf "$data"' EXIT
"$BIN/dtrain_convert" --synthetic_ctr --examples=5000 --test_examples=500 --out="$data" >/dev/null
"$ROOT/tests/chaos.sh" --trials=2 --seed=1 --steps=300 --model=dlrm \
  --worker_flags="--data_dir=$data --data_format=criteo --table_rows=1000 --batch_size=64 --transport=tcp" \
  --ps_flags="--transport=tcp" \
  --require=ps_after_checkpoint,sparse_rows_restored,worker_restarted,undone "$@"
