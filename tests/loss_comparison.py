"""Shared by the PyTorch equivalence tests (onnx_pytorch_test.py, onnx_embedding_test.py): running dtrain's
binaries and comparing its per-step losses with PyTorch's."""
import math
import subprocess
import sys


def run(cmd, env=None):
    """Runs a command (in `env`, default this process's environment); exits the test with its output when it fails.
    Returns its output."""
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    if p.returncode != 0:
        sys.exit("FAIL: %s exited %d:\n%s" % (" ".join(cmd), p.returncode, p.stdout[-3000:]))
    return p.stdout


def worst_of(values):
    """The largest of `values`, or NaN when one is NaN (Python's max() keeps a NaN only when it comes first)."""
    values = list(values)
    if any(v != v for v in values):
        return float("nan")
    return max(values) if values else 0.0


def within(value, tolerance):
    """value <= tolerance, false for NaN: the form every check of these tests uses (value > tolerance lets NaN
    pass)."""
    return value <= tolerance


def compare_losses(tag, dtrain_losses, torch_losses, failures, verbose=False, width=20, tolerance=1e-4):
    """Every step's loss within `tolerance` relative: prints a line, appends what differs to `failures`, returns
    the largest relative difference (0 when the step counts differ or there are none, which is a failure too).
    A NaN or infinite loss on either side, or a relative difference that is NaN (0/0), is a failure: the
    comparison is `not (r <= tolerance)` step by step, never max() (which ignores a NaN unless it comes first)."""
    if len(dtrain_losses) != len(torch_losses) or not dtrain_losses:
        failures.append("%s: dtrain reported %d losses, expected %d (and at least one)" %
                        (tag, len(dtrain_losses), len(torch_losses)))
        return 0.0
    rel = []
    for d, t in zip(dtrain_losses, torch_losses):
        if not (math.isfinite(d) and math.isfinite(t)):
            rel.append(float("nan"))
        elif t == 0:
            rel.append(abs(d - t))
        else:
            rel.append(abs(d - t) / abs(t))
    bad = [k for k, r in enumerate(rel) if not (r <= tolerance)]
    worst = max((r for r in rel if r == r), default=0.0)
    if verbose:
        print(tag, "per step:", " ".join("%.1e" % r for r in rel))
    print("%-*s loss step 1 %.6f -> step %d %.6f (PyTorch %.6f); max relative difference %.2e%s" %
          (width, tag, dtrain_losses[0], len(rel), dtrain_losses[-1], torch_losses[-1], worst,
           "" if all(r == r for r in rel) else "; NaN/Inf at steps %s" % [k + 1 for k, r in enumerate(rel) if r != r]))
    if bad:
        k = next((k for k in bad if rel[k] != rel[k]), None)
        if k is None:
            k = max(bad, key=lambda i: rel[i])
        failures.append("%s: step %d loss %.8g (dtrain) vs %.8g (PyTorch): relative difference %.2e, not <= %g" %
                        (tag, k + 1, dtrain_losses[k], torch_losses[k], rel[k], tolerance))
        return float("nan") if rel[k] != rel[k] else rel[k]
    return worst
