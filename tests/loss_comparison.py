"""Shared by the PyTorch equivalence tests (onnx_pytorch_test.py, onnx_embedding_test.py): running dtrain's
binaries and comparing its per-step losses with PyTorch's."""
import subprocess
import sys


def run(cmd):
    """Runs a command; exits the test with its output when it fails. Returns its output."""
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.returncode != 0:
        sys.exit("FAIL: %s exited %d:\n%s" % (" ".join(cmd), p.returncode, p.stdout[-3000:]))
    return p.stdout


def compare_losses(tag, dtrain_losses, torch_losses, failures, verbose=False, width=20, tolerance=1e-4):
    """Every step's loss within `tolerance` relative: prints a line, appends what differs to `failures`, returns
    the largest relative difference (0 when the step counts differ, which is a failure too)."""
    if len(dtrain_losses) != len(torch_losses):
        failures.append("%s: dtrain reported %d losses, expected %d" % (tag, len(dtrain_losses), len(torch_losses)))
        return 0.0
    rel = [abs(d - t) / abs(t) for d, t in zip(dtrain_losses, torch_losses)]
    if verbose:
        print(tag, "per step:", " ".join("%.1e" % r for r in rel))
    print("%-*s loss step 1 %.6f -> step %d %.6f (PyTorch %.6f); max relative difference %.2e" %
          (width, tag, dtrain_losses[0], len(rel), dtrain_losses[-1], torch_losses[-1], max(rel)))
    if max(rel) > tolerance:
        k = rel.index(max(rel))
        failures.append("%s: step %d loss %.8g (dtrain) vs %.8g (PyTorch): relative difference %.2e > %g" %
                        (tag, k + 1, dtrain_losses[k], torch_losses[k], max(rel), tolerance))
    return max(rel)
