#!/usr/bin/python3
"""Which torchvision classification models train in dtrain from their ONNX files, and how fast.

For each model (default: every classification model in torchvision.models), exports it as dtrain trains it
(examples/export_vit.py: training mode, nothing folded, a free batch axis, 10 classes, no auxiliary heads,
stochastic depth at rate 0) into DIR/<name>/<name>.onnx unless it exists (a folder per model: the largest
models' external data files are named after their tensors, and two models' names could collide), then runs
dtrain_bench on it at 224x224x3 (synthetic images: the figure is compute and the update, not input) and records
examples/sec, or the export's error, or dtrain's refusal (its one line), or the time-out. Prints a Markdown table
and writes it (and JSON) into DIR.

  /usr/bin/python3 scripts/torchvision_coverage.py --dir /tmp/tv [--bin build/bin] [--batch 2] [--threads 2]
      [--timeout 300] [--opset 14] [resnet18 vit_b_16 ...]

Slow: exporting the whole zoo takes an hour on 2 cores and the largest models (regnet_y_128gf: 637 M
parameters, over ONNX's 2 GB limit, so written with external data: one file per tensor beside the .onnx, which
dtrain reads) minutes each.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples"))


def classification_models():
    from torchvision import models
    return sorted(models.list_models(module=models))


def export_one(name, path, opset):
    """Exports in a child process (a failed export can leave PyTorch's state odd); returns an error or None."""
    code = ("import sys, torch; sys.path.insert(0, %r); from export_vit import torchvision_model, export; "
            "torch.manual_seed(0); torch.set_num_threads(1); "
            "export(torchvision_model(%r, 10), torch.zeros(2, 3, 224, 224), %r, %d)" %
            (os.path.join(ROOT, "examples"), name, path, opset))
    p = subprocess.run([sys.executable, "-W", "ignore", "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True)
    if p.returncode != 0:
        if os.path.exists(path):
            os.remove(path)
        lines = [l for l in p.stdout.splitlines() if l.strip()]
        err = next((l for l in reversed(lines) if "Error" in l), lines[-1] if lines else "failed")
        return err.strip()[:300]
    return None


def bench(binary, path, batch, threads, timeout):
    cmd = [binary, "--model=" + path, "--batch_size=%d" % batch, "--threads=%d" % threads, "--warmup_steps=1",
           "--window_steps=1", "--windows=1", "--steps_total=0", "--optimizer=sgd", "--learning_rate=0.01",
           "--data_dir=/nonexistent", "--synthetic_examples=%d" % (16 * batch)]
    t0 = time.time()
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"status": "timeout", "detail": "no figure within %d s" % timeout, "secs": time.time() - t0}
    m = re.search(r"examples/sec median=([0-9.]+)", p.stdout)
    if p.returncode == 0 and m:
        return {"status": "trains", "examples_per_sec": float(m.group(1)), "secs": time.time() - t0}
    err = [l for l in p.stderr.splitlines() if l.startswith("dtrain_bench:")]
    return {"status": "refused" if p.returncode == 2 else "failed",
            "detail": (err[-1] if err else p.stderr.strip()[-300:]), "secs": time.time() - t0}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="*")
    ap.add_argument("--dir", required=True, help="where the ONNX files are (or are written)")
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "bin"))
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--timeout", type=int, default=300, help="seconds per model's benchmark")
    ap.add_argument("--opset", type=int, default=14)
    ap.add_argument("--no_export", action="store_true", help="only the files already in --dir")
    a = ap.parse_args()
    os.makedirs(a.dir, exist_ok=True)
    names = a.models or classification_models()
    results_path = os.path.join(a.dir, "coverage.json")
    results = json.load(open(results_path)) if os.path.exists(results_path) else {}
    for name in names:
        path = os.path.join(a.dir, name, name + ".onnx")
        r = {}
        if not os.path.exists(path):
            if a.no_export:
                continue
            os.makedirs(os.path.dirname(path), exist_ok=True)
            err = export_one(name, path, a.opset)
            if err:
                r = {"status": "no export", "detail": err}
        if not r:
            r = bench(os.path.join(a.bin, "dtrain_bench"), path, a.batch, a.threads, a.timeout)
        results[name] = r
        print("%-22s %-9s %s" % (name, r["status"], r.get("examples_per_sec", r.get("detail", ""))), flush=True)
        with open(results_path, "w") as f:
            json.dump(results, f, indent=1, sort_keys=True)
    rows = ["| model | result at 224x224x3, batch %d, %d threads |" % (a.batch, a.threads), "|---|---|"]
    for name in sorted(results):
        r = results[name]
        rows.append("| %s | %s |" % (name, "%.2f examples/sec" % r["examples_per_sec"] if r["status"] == "trains"
                                       else "%s: %s" % (r["status"], r.get("detail", ""))))
    table = "\n".join(rows) + "\n"
    with open(os.path.join(a.dir, "coverage.md"), "w") as f:
        f.write(table)
    print(table)


if __name__ == "__main__":
    main()
