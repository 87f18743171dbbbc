#!/usr/bin/env bash
# scripts/compare_dlrm.sh end to end on tiny synthetic click-through-rate data the test writes, one launch of each
# configuration: dtrain local against PyTorch sparse (one process each), dtrain 2 ps + 2 sync workers against
# PyTorch DDP (sparse=True, gloo) and all_gather (2 ranks); the table has every row with a positive rate, ratios that
# are the medians' quotients, PyTorch on the OpenMP OpenBLAS; --json holds every launch. Bad flags exit 2 naming
# what is wrong. Skipped (77) without python3-torch (exit 1 with DTRAIN_REQUIRE_DEPS=1). About 40 s on 2 cores.
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

"$BIN/dtrain_convert" --synthetic_ctr --examples=6000 --test_examples=500 --out="$dir/ctr" | tail -1
rc=0
DTRAIN_BIN_DIR="$BIN" timeout 280 "$ROOT/scripts/compare_dlrm.sh" --data_dir="$dir/ctr" --table_rows=2000 \
  --embedding_dim=8 --batch_size=128 --examples=5120 --window=5 --warmup_windows=1 --repeats=1 --timeout=100 \
  --json="$dir/out.json" >"$dir/out" 2>"$dir/err" || rc=$?
cat "$dir/out"
if [ "$rc" != 0 ]; then
  fail "compare_dlrm.sh exited $rc"
  tail -20 "$dir/err"
else
  /usr/bin/python3 - "$dir/out" "$dir/out.json" <<'PY' || failures=$((failures + 1))
import json, re, sys
lines = open(sys.argv[1]).read().splitlines()
j = json.load(open(sys.argv[2]))
def row(prefix):
    m = [l for l in lines if l.strip().startswith(prefix)]
    if not m:
        sys.exit("FAIL: no row %r in the table" % prefix)
    rate = float(m[0].strip()[len(prefix):].split()[0])
    ratio = re.search(r"dtrain x ([0-9.]+)", m[0])
    return rate, float(ratio.group(1)) if ratio else None
local, sparse = row("dtrain local"), row("PyTorch sparse=True + Adagrad")
cluster, ddp = row("dtrain 2 ps + 2 sync workers"), row("PyTorch DDP 2 ranks, sparse=True, gloo")
allgather = row("PyTorch 2 ranks, tables by all_gather")
for name, r in (("local", local), ("sparse", sparse), ("cluster", cluster), ("ddp", ddp), ("allgather", allgather)):
    if not r[0] > 0:
        sys.exit("FAIL: %s rate %r" % (name, r))
for name, r, peer in (("sparse", sparse, local), ("ddp", ddp, cluster), ("allgather", allgather, cluster)):
    want = peer[0] / r[0]
    if r[1] is None or not abs(r[1] - want) <= 0.006 * max(1.0, want):
        sys.exit("FAIL: %s's ratio %r is not %g / %g" % (name, r[1], peer[0], r[0]))
if not any("on openblas-openmp" in l for l in lines):
    sys.exit("FAIL: PyTorch's BLAS is not reported as openblas-openmp")
if j["blas"] != ["openblas-openmp"] or sorted(j["launches"]) != ["allgather", "cluster", "ddp", "local", "sparse"]:
    sys.exit("FAIL: --json holds %s, BLAS %s" % (sorted(j["launches"]), j["blas"]))
for d, runs in j["launches"].items():
    if len(runs) != 1 or not runs[0]["windows"] or abs(j["medians"][d] - runs[0]["examples_per_sec"]) > 1e-6:
        sys.exit("FAIL: --json's %s launches %r" % (d, runs))
print("table checks passed")
PY
fi
rc=0
"$ROOT/scripts/compare_dlrm.sh" --data_dir="$dir/ctr" --batch_size=0 >"$dir/bad" 2>&1 || rc=$?
[ "$rc" = 2 ] && grep -q -- "--batch_size must be a positive integer" "$dir/bad" || fail "--batch_size=0: exit $rc, $(tail -1 "$dir/bad")"
rc=0
"$ROOT/scripts/compare_dlrm.sh" --data_dir="$dir/nothing" >"$dir/bad" 2>&1 || rc=$?
[ "$rc" = 2 ] && grep -q "no train.txt" "$dir/bad" || fail "missing data: exit $rc, $(tail -1 "$dir/bad")"
rc=0
"$ROOT/scripts/compare_dlrm.sh" --data_dir="$dir/ctr" --designs=local,bogus >"$dir/bad" 2>&1 || rc=$?
[ "$rc" = 2 ] && grep -q "unknown 'bogus'" "$dir/bad" || fail "--designs=bogus: exit $rc, $(tail -1 "$dir/bad")"
[ "$failures" = 0 ] && echo "PASS" || { echo "$failures failure(s)"; exit 1; }
