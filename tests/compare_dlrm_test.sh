#!/usr/bin/env bash
# scripts/compare_dlrm.sh end to end on tiny synthetic click-through-rate data the test writes: dtrain local and
# 2 ps + 2 sync workers, PyTorch sparse and DDP (2 ranks, gloo) run, and the table has all four rows with positive
# rates and ratios that are those rates' quotients; a bad flag exits 2 naming it. Skipped (77) without
# python3-torch. About 15 s on 2 cores.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BIN="${DTRAIN_BIN_DIR:-$ROOT/build/bin}"
source "$ROOT/tests/skipping.sh"
/usr/bin/python3 -c "import torch" 2>/dev/null || skip "/usr/bin/python3 cannot import torch (apt-get install python3-torch)"
for b in dtrain_ps dtrain_worker dtrain_convert; do
  [ -x "$BIN/$b" ] || { echo "FAIL: $BIN/$b not built (set DTRAIN_BIN_DIR)"; exit 1; }
done
dir="$(mktemp -d /tmp/dtrain_compare_dlrm_test.XXXXXX)"
trap 'rm -rf "$dir"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

"$BIN/dtrain_convert" --synthetic_ctr --examples=12000 --test_examples=2000 --out="$dir/ctr" | tail -1
rc=0
DTRAIN_BIN_DIR="$BIN" timeout 240 "$ROOT/scripts/compare_dlrm.sh" --data_dir="$dir/ctr" --table_rows=2000 \
  --embedding_dim=8 --batch_size=128 --examples=10240 --ddp_steps=8 >"$dir/out" 2>"$dir/err" || rc=$?
cat "$dir/out"
if [ "$rc" != 0 ]; then
  fail "compare_dlrm.sh exited $rc"
  tail -20 "$dir/err"
else
  /usr/bin/python3 - "$dir/out" <<'PY' || failures=$((failures + 1))
import re, sys
lines = open(sys.argv[1]).read().splitlines()
def row(prefix):
    m = [l for l in lines if l.startswith(prefix)]
    if not m:
        sys.exit("FAIL: no row %r in the table" % prefix)
    return [float(x) for x in re.findall(r"[0-9]+\.[0-9]+", m[0][44:])]
local, cluster = row("dtrain local"), row("dtrain 2 ps + 2 workers sync")
sparse, ddp = row("PyTorch sparse=True"), row("PyTorch DDP 2 ranks")
c = cluster[0]
for name, r in (("local", local), ("cluster", cluster), ("sparse", sparse), ("ddp", ddp)):
    if not r[0] > 0:
        sys.exit("FAIL: %s rate %r" % (name, r))
for name, r in (("local", local), ("sparse", sparse), ("ddp", ddp)):
    if abs(r[1] - c / r[0]) > 0.006 * max(1.0, c / r[0]):
        sys.exit("FAIL: %s ratio %g is not %g / %g" % (name, r[1], c, r[0]))
if not any(l.startswith("dtrain cluster:") and "bytes/step" in l for l in lines):
    sys.exit("FAIL: no bytes/step line")
print("table checks passed")
PY
fi
rc=0
"$ROOT/scripts/compare_dlrm.sh" --data_dir="$dir/ctr" --batch_size=0 >"$dir/bad" 2>&1 || rc=$?
[ "$rc" = 2 ] && grep -q -- "--batch_size must be a positive integer" "$dir/bad" || fail "--batch_size=0: exit $rc, $(head -1 "$dir/bad")"
rc=0
"$ROOT/scripts/compare_dlrm.sh" --data_dir="$dir/nothing" >"$dir/bad" 2>&1 || rc=$?
[ "$rc" = 2 ] && grep -q "no train.txt" "$dir/bad" || fail "missing data: exit $rc, $(head -1 "$dir/bad")"
[ "$failures" = 0 ] && echo "PASS" || { echo "$failures failure(s)"; exit 1; }
