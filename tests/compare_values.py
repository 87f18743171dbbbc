#!/usr/bin/env python3
"""Compares two sets of saved values (dtrain_eval --export's .npz): every array of A within TOL of B's.

  compare_values.py WHAT A.npz B.npz [--tol 1e-6] [--extra_rows]

Exit 0 and one line (arrays, floats, the largest difference) when they agree; exit 1 and one line naming the
first array that differs (shape, ids, or a value past TOL) otherwise. Used by tests/reshard_test.sh and
tests/ps_set_change_test.sh (a run whose ps set changed against an unchanged run)."""
import argparse
import sys

import numpy as np


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what")
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--tol", type=float, default=1e-6)
    ap.add_argument("--extra_rows", action="store_true",
                    help="A's sparse tables may hold rows B's do not (an elastic run pulled rows for batches it "
                         "then drew again): B's rows must all be in A, with their values; A's others are counted")
    args = ap.parse_args()
    a, b = dict(np.load(args.a)), dict(np.load(args.b))
    what = args.what
    if sorted(a) != sorted(b):
        sys.exit("%s: arrays %s vs %s" % (what, sorted(a), sorted(b)))
    extra = 0
    if args.extra_rows:
        for k in [k for k in a if k.endswith("_ids") and k[:-4] + "_values" in a]:
            v = k[:-4] + "_values"
            where = {int(i): n for n, i in enumerate(a[k])}
            missing = [int(i) for i in b[k] if int(i) not in where]
            if missing:
                sys.exit("%s: %s: %d of the reference's rows are missing (id %d first)" % (what, k, len(missing),
                                                                                         missing[0]))
            rows = [where[int(i)] for i in b[k]]
            extra += len(a[k]) - len(rows)
            a[k], a[v] = a[k][rows], a[v][rows]
    worst, floats = 0.0, 0
    for k in sorted(a):
        x, y = a[k], b[k]
        if x.shape != y.shape:
            sys.exit("%s: %s has shape %s, the unchanged run's %s" % (what, k, x.shape, y.shape))
        if x.dtype.kind != "f":
            if not np.array_equal(x, y):
                sys.exit("%s: %s (the ids) differ" % (what, k))
            continue
        d = float(np.abs(x.astype(np.float64) - y.astype(np.float64)).max()) if x.size else 0.0
        if not d <= args.tol:
            sys.exit("%s: %s differs by %g" % (what, k, d))
        worst, floats = max(worst, d), floats + x.size
    print("%s: %d arrays, %d floats, largest difference from the unchanged run %g%s" % (
        what, len(a), floats, worst, "; %d rows only in the first (not compared)" % extra if args.extra_rows else ""))


if __name__ == "__main__":
    main()
