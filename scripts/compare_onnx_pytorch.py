#!/usr/bin/python3
"""Training throughput of a PyTorch module and of dtrain on its ONNX export, in the same run.

The module comes from one of the examples (examples/export_*.py): it is exported as dtrain trains it (training
mode, nothing folded), dtrain_bench trains the file and PyTorch trains the module itself, with the same batch,
thread count and optimizer, on random data of the model's input shape held in memory; launches alternate
(dtrain, PyTorch, dtrain, ...) so both see the same machine, and the medians over launches of each launch's
median-of-windows examples/sec are printed with their ratio. Optionally the built-in model that the example
re-creates (--builtin=cnn) is timed too: the import's cost is the ratio of the two dtrain figures.

  scripts/compare_onnx_pytorch.py --example=resnet20 --batch_size=128 --threads=2 --optimizer=momentum
  scripts/compare_onnx_pytorch.py --example=resnet50 --batch_size=32 --threads=2 --optimizer=momentum \\
      --learning_rate=0.01 --warmup=1 --windows=3 --window_steps=2
  scripts/compare_onnx_pytorch.py --example=vit_tiny --batch_size=64 --threads=2 --optimizer=adam \\
      --learning_rate=1e-3
  scripts/compare_onnx_pytorch.py --example=cnn --builtin=cnn --batch_size=50 --threads=1 --optimizer=adam \\
      --learning_rate=1e-4
  scripts/compare_onnx_pytorch.py --example=resnet20 --batch_size=128 --threads=2 --optimizer=momentum \\
      --compute_dtype=bf16                              # dtrain bf16 vs PyTorch autocast, dtrain fp32 beside

PyTorch runs under Debian's /usr/bin/python3 with LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu/openblas-openmp and
OMP_NUM_THREADS set (/work/shared/BENCHMARKS.md says why), and each launch checks that PyTorch really loaded the
OpenMP OpenBLAS (scripts/torch_blas.py): another BLAS is an error (exit 2) unless --any_blas. Needs python3-torch,
libopenblas0-openmp (scripts/install_deps.sh installs both).

--compute_dtype=bf16 (default fp32) compares mixed precision, as scripts/compare_pytorch.py does: dtrain_bench runs
with --compute_dtype=bf16 (the imported graph's convolutions and matrix products in bf16 on oneDNN with fp32
accumulation, everything else -- parameters, optimizer, loss, normalization, softmax -- in fp32), PyTorch runs the
module's forward pass and the loss under torch.autocast("cpu", dtype=torch.bfloat16), backward and optimizer step
outside it as PyTorch's AMP recipe does (Debian's torch 1.13 is built with oneDNN, so its Conv2d and Linear then
compute in bf16). Each repeat launches dtrain bf16, PyTorch bf16 and dtrain fp32 -- the baseline of the bf16
speed-up, measured in the same run -- and the table shows dtrain bf16, PyTorch bf16, their ratio, dtrain fp32 and
bf16/fp32, every launch's figure, and in its title the instruction set oneDNN ran dtrain's bf16 on (from dtrain's
`compute bf16 ... on oneDNN's ISA` line, printed once on stderr) beside /proc/cpuinfo's avx512_bf16 and amx_bf16
flags. --builtin is then timed in bf16 too, so imported / built-in is the import's cost in bf16.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare_pytorch  # noqa: E402  (its --compute_dtype=bf16 helpers; standard library only at import)
import torch_blas  # noqa: E402
EXAMPLES = {  # example -> (module, class or factory, constructor kwargs, input shape, the export script's arguments)
    "mlp": ("export_mlp", "MLP", {}, (784,), []),
    "lenet5": ("export_lenet5", "LeNet5", {}, (1, 28, 28), []),
    "cnn": ("export_cnn", "Cnn", {}, (1, 28, 28), []),
    "resnet20": ("export_resnet20", "ResNet", {"blocks": 3, "in_channels": 3}, (3, 32, 32), []),
    # ViT-Tiny's width and depth on CIFAR-10-size images (examples/export_vit.py).
    "vit_tiny": ("export_vit", "vit_tiny", {}, (3, 32, 32), []),
    # torchvision's ResNet-50 (10 classes) on 224x224x3 images.
    "resnet50": ("export_vit", "torchvision_model", {"name": "resnet50", "classes": 10}, (3, 224, 224),
                 ["--torchvision=resnet50", "--classes=10"]),
}


def make_module(example):
    sys.path.insert(0, os.path.join(REPO, "examples"))
    module_name, cls, kwargs, shape, _ = EXAMPLES[example]
    module = __import__(module_name)
    return getattr(module, cls)(**kwargs), shape


def pytorch_child(a):
    """Times the module's training steps (forward, cross-entropy, backward, optimizer step)."""
    import time
    import torch
    blas = torch_blas.require_openblas_openmp("compare_onnx_pytorch.py", a.any_blas)
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model, shape = make_module(a.example)
    model.train()
    if a.optimizer == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=a.learning_rate)
    elif a.optimizer == "momentum":
        opt = torch.optim.SGD(model.parameters(), lr=a.learning_rate, momentum=0.9)
    else:
        opt = torch.optim.Adam(model.parameters(), lr=a.learning_rate)
    x = torch.rand(16, a.batch_size, *shape)
    y = torch.randint(0, 10, (16, a.batch_size))
    loss_fn = torch.nn.CrossEntropyLoss()
    a.device = "cpu"  # forward_context's autocast device

    def step(i):
        opt.zero_grad()
        with compare_pytorch.forward_context(torch, a):  # bf16: autocast; backward and step outside
            loss = loss_fn(model(x[i % 16]), y[i % 16])
        loss.backward()
        opt.step()

    for i in range(a.warmup):
        step(i)
    rates = []
    for w in range(a.windows):
        start = time.perf_counter()
        for i in range(a.window_steps):
            step(i)
        rates.append(a.window_steps * a.batch_size / (time.perf_counter() - start))
    print(json.dumps({"examples_per_sec": statistics.median(rates), "blas": blas, "compute_dtype": a.compute_dtype}))


def run_pytorch(a):
    """One PyTorch launch: (examples/sec, the BLAS it ran on)."""
    r = subprocess.run([torch_blas.DEBIAN_PYTHON, os.path.abspath(__file__), "--pytorch_child"] + sys.argv[1:],
                       env=torch_blas.torch_env(a.threads), capture_output=True, text=True)
    if r.returncode != 0:
        sys.stderr.write(r.stderr[-2000:])
        sys.exit(r.returncode)
    out = json.loads(r.stdout.strip().splitlines()[-1])
    if out.get("compute_dtype") != a.compute_dtype:
        sys.exit("the PyTorch launch ran compute %s, not %s" % (out.get("compute_dtype"), a.compute_dtype))
    return out["examples_per_sec"], out["blas"]


def run_dtrain(a, model, dtype=None):
    """One dtrain_bench launch: examples/sec, or (examples/sec, its stderr) when `dtype` is given: then it runs
    with --compute_dtype=dtype (an fp32 comparison passes none) and a result line without compute=dtype is an
    error."""
    cmd = [os.path.join(a.bin, "dtrain_bench"), "--model=" + model, "--batch_size=%d" % a.batch_size,
           "--threads=%d" % a.threads, "--optimizer=" + a.optimizer, "--learning_rate=%g" % a.learning_rate,
           "--windows=%d" % a.windows, "--window_steps=%d" % a.window_steps, "--steps_total=0",
           "--synthetic_examples=%d" % (16 * a.batch_size)]  # the 16 batches it times, as PyTorch's side holds
    if dtype:
        cmd.append("--compute_dtype=" + dtype)
    r = subprocess.run(cmd, capture_output=True, text=True, check=True)
    m = re.search(r"median=([0-9.]+)", r.stdout)
    if not m:
        sys.exit("dtrain_bench printed no rate:\n" + r.stdout)
    if not dtype:
        return float(m.group(1))
    if " compute=%s " % dtype not in r.stdout:
        sys.exit("dtrain_bench did not run compute=%s: %s\n%s" % (dtype, " ".join(cmd), r.stdout))
    return float(m.group(1)), r.stderr


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--example", choices=sorted(EXAMPLES), required=True)
    ap.add_argument("--builtin", default="", help="also time this built-in model (e.g. cnn)")
    ap.add_argument("--batch_size", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--optimizer", choices=["sgd", "momentum", "adam"], default="momentum",
                    help="adam: dtrain's pytorch_adam against torch.optim.Adam")
    ap.add_argument("--learning_rate", type=float, default=0.1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--windows", type=int, default=5)
    ap.add_argument("--window_steps", type=int, default=5)
    ap.add_argument("--bin", default=os.path.join(REPO, "build", "bin"))
    ap.add_argument("--any_blas", action="store_true",
                    help="time PyTorch even on another BLAS than the OpenMP OpenBLAS (named in the output)")
    ap.add_argument("--compute_dtype", choices=["fp32", "bf16"], default="fp32",
                    help="bf16: dtrain --compute_dtype=bf16 against PyTorch under torch.autocast(bfloat16), with "
                         "dtrain fp32 launched beside as the baseline (default fp32)")
    ap.add_argument("--pytorch_child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.pytorch_child:
        pytorch_child(a)
        return
    dtrain_optimizer = "pytorch_adam" if a.optimizer == "adam" else a.optimizer
    work = tempfile.mkdtemp(prefix="dtrain_onnx_bench.")
    path = os.path.join(work, a.example + ".onnx")
    subprocess.run(["/usr/bin/python3", os.path.join(REPO, "examples", EXAMPLES[a.example][0] + ".py"), path] +
                   EXAMPLES[a.example][4], check=True, capture_output=True)
    a_dtrain = argparse.Namespace(**vars(a))
    a_dtrain.optimizer = dtrain_optimizer
    if a.compute_dtype == "bf16":
        compare_bf16(a, a_dtrain, path)
        subprocess.run(["rm", "-rf", work])
        return
    dtrain, torch_rates, builtin, blas = [], [], [], set()
    for _ in range(a.repeats):
        dtrain.append(run_dtrain(a_dtrain, path))
        rate, used = run_pytorch(a)
        torch_rates.append(rate)
        blas.add(used)
        if a.builtin:
            builtin.append(run_dtrain(a_dtrain, a.builtin))
    d, t = statistics.median(dtrain), statistics.median(torch_rates)
    print("%s batch %d, %d thread(s), %s: dtrain (imported) %.1f examples/sec, PyTorch %.1f: ratio %.2f" %
          (a.example, a.batch_size, a.threads, a.optimizer, d, t, d / t))
    print("  launches: dtrain %s; PyTorch %s; PyTorch's BLAS: %s" %
          (["%.1f" % x for x in dtrain], ["%.1f" % x for x in torch_rates], ", ".join(sorted(blas))))
    if a.builtin:
        b = statistics.median(builtin)
        print("  built-in %s: %.1f examples/sec; imported / built-in = %.3f (launches %s)" %
              (a.builtin, b, d / b, ["%.1f" % x for x in builtin]))
    subprocess.run(["rm", "-rf", work])


def compare_bf16(a, a_dtrain, path):
    """--compute_dtype=bf16: per repeat dtrain bf16, PyTorch bf16 (autocast), dtrain fp32 (and the built-in in
    bf16); the table as scripts/compare_pytorch.py prints it."""
    fmt, med = compare_pytorch.fmt, compare_pytorch.med
    dtrain, torch_rates, fp32, builtin, blas, report = [], [], [], [], set(), ""
    for _ in range(a.repeats):
        rate, err = run_dtrain(a_dtrain, path, "bf16")
        dtrain.append(rate)
        report = report or (err if compare_pytorch.BF16_REPORT.search(err) else "")
        rate, used = run_pytorch(a)
        torch_rates.append(rate)
        blas.add(used)
        fp32.append(run_dtrain(a_dtrain, path, "fp32")[0])
        if a.builtin:
            builtin.append(run_dtrain(a_dtrain, a.builtin, "bf16")[0])
    label = "%s batch=%d threads=%d" % (a.example, a.batch_size, a.threads)
    isa = compare_pytorch.bf16_report(report, label)[1]
    d, t, f = med(dtrain), med(torch_rates), med(fp32)
    print("Training examples/sec of %s (imported), %s, compute bf16 (%s; PyTorch under torch.autocast; "
          "/proc/cpuinfo: %s; median of %d windows per launch; median over %d interleaved launches)" %
          (a.example, a.optimizer, compare_pytorch.isa_text([isa] if isa else []), compare_pytorch.cpu_bf16_flags(),
           a.windows, a.repeats))
    print("%-8s %5s %7s %11s %12s %6s %11s %9s   per launch: dtrain bf16 | PyTorch bf16 | dtrain fp32" %
          ("example", "batch", "threads", "dtrain bf16", "PyTorch bf16", "ratio", "dtrain fp32", "bf16/fp32"))
    print("%-8s %5d %7d %11s %12s %6.2f %11s %9.2f   %s | %s | %s" %
          (a.example, a.batch_size, a.threads, fmt([d]), fmt([t]), d / t, fmt([f]), d / f, fmt(dtrain),
           fmt(torch_rates), fmt(fp32)))
    print("  PyTorch's BLAS: %s" % ", ".join(sorted(blas)))
    if a.builtin:
        b = med(builtin)
        print("  built-in %s (bf16): %.1f examples/sec; imported / built-in = %.3f (launches %s)" %
              (a.builtin, b, d / b, ["%.1f" % x for x in builtin]))


if __name__ == "__main__":
    main()
