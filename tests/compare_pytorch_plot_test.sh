#!/usr/bin/env bash
# scripts/compare_pytorch.py --plot on a tiny mlp run (one launch of each system, one window of 20 steps): the
# table is written beside the picture as CSV and JSON with both systems' figures and their ratio, and the picture
# is a valid PNG (and an SVG for --plot=FILE.svg); with matplotlib hidden the tool exits 1 naming the picture it
# could not draw, the table still written; a --plot of another kind exits 2. About 25 s on 2 cores.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BIN="${DTRAIN_BIN_DIR:-$ROOT/build/bin}"
. "$ROOT/tests/skipping.sh"
/usr/bin/python3 -c "import torch, numpy" 2>/dev/null || skip "no python3-torch/python3-numpy for /usr/bin/python3"
[ -x "$BIN/dtrain_bench" ] || { echo "FAIL: no $BIN/dtrain_bench: build first"; exit 1; }
dir="$(mktemp -d /tmp/dtrain_compare_pytorch_plot.XXXXXX)"
trap 'rm -rf "$dir"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
CMP=(/usr/bin/python3 "$ROOT/scripts/compare_pytorch.py" --bin="$BIN/dtrain_bench" --model=mlp --threads=1
     --repeats=1 --windows=1 --window_steps=20 --warmup_steps=2)
is_picture() {
  PYTHONPATH="$ROOT/scripts" /usr/bin/python3 -c \
    'import plotting, sys; sys.exit(0 if plotting.is_picture(sys.argv[1]) else 1)' "$1"
}

rc=0; "${CMP[@]}" --plot="$dir/mlp.png" >"$dir/png.out" 2>&1 || rc=$?
tail -n 4 "$dir/png.out"
[ "$rc" = 0 ] || fail "compare_pytorch --plot exited $rc"
is_picture "$dir/mlp.png" || fail "mlp.png is not a valid PNG"
/usr/bin/python3 - "$dir/mlp" <<'PY' || fail "the table beside the picture"
import csv, json, sys
prefix = sys.argv[1]
doc = json.load(open(prefix + ".json"))
(r,) = doc["rows"]
assert (r["model"], r["batch"], r["threads"]) == ("mlp", 100, 1), r
assert r["dtrain"] > 0 and r["pytorch"] > 0 and abs(r["ratio"] - r["dtrain"] / r["pytorch"]) < 1e-9, r
(c,) = list(csv.DictReader(open(prefix + ".csv")))
assert abs(float(c["dtrain"]) - r["dtrain"]) < 1e-6, (c, r)
print("table: dtrain %.0f, PyTorch %.0f examples/sec, ratio %.2f" % (r["dtrain"], r["pytorch"], r["ratio"]))
PY

# --plot=FILE.svg: the same drawing as an SVG (write_plot on a table of two rows, no launch needed).
PYTHONPATH="$ROOT/scripts" /usr/bin/python3 - "$dir/two.svg" <<'PY' || fail "an SVG picture"
import sys, types
import compare_pytorch, plotting
a = types.SimpleNamespace(plot=sys.argv[1], device="cpu", repeats=2)
rows = [{"model": m, "batch": b, "threads": 1, "dtrain": d, "pytorch": p, "ratio": d / p,
         "dtrain_launches": [d, d * 1.1], "pytorch_launches": [p, p * 0.9]}
        for m, b, d, p in (("mlp", 100, 9000.0, 5000.0), ("cnn", 50, 1800.0, 1000.0))]
assert compare_pytorch.write_plot(a, rows, "examples/sec")
assert plotting.is_picture(sys.argv[1]) and b"<svg" in open(sys.argv[1], "rb").read(4096)
assert open(sys.argv[1][:-4] + ".csv").read().count("\n") == 3
print("two.svg: an SVG of 2 rows, the table beside it")
PY

# matplotlib hidden by a package of that name that refuses to import: a clear error, exit 1, the table written.
mkdir -p "$dir/hide/matplotlib"
echo "raise ImportError('hidden by compare_pytorch_plot_test')" >"$dir/hide/matplotlib/__init__.py"
rc=0; PYTHONPATH="$dir/hide" "${CMP[@]}" --pytorch_only --plot="$dir/nopic.png" >"$dir/nopic.out" 2>&1 || rc=$?
[ "$rc" = 1 ] || fail "without matplotlib: exit $rc, want 1"
grep -q "cannot draw $dir/nopic.png" "$dir/nopic.out" || { cat "$dir/nopic.out"; fail "no 'cannot draw' message"; }
[ -s "$dir/nopic.csv" ] || fail "without matplotlib the table was not written"
[ ! -e "$dir/nopic.png" ] || fail "a picture appeared without matplotlib"

rc=0; "${CMP[@]}" --plot="$dir/mlp.jpg" >"$dir/bad.out" 2>&1 || rc=$?
[ "$rc" = 2 ] && grep -q "must end in .png or .svg" "$dir/bad.out" || fail "--plot=.jpg: exit $rc, want 2 and why"

if [ "$failures" -gt 0 ]; then echo "compare_pytorch_plot_test: $failures failure(s)"; exit 1; fi
echo "compare_pytorch_plot_test: passed"
