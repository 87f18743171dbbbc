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

PyTorch runs under Debian's /usr/bin/python3 with LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu/openblas-openmp and
OMP_NUM_THREADS set (/work/shared/BENCHMARKS.md says why), and each launch checks that PyTorch really loaded the
OpenMP OpenBLAS (scripts/torch_blas.py): another BLAS is an error (exit 2) unless --any_blas. Needs python3-torch,
libopenblas0-openmp (scripts/install_deps.sh installs both).
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

    def step(i):
        opt.zero_grad()
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
    print(json.dumps({"examples_per_sec": statistics.median(rates), "blas": blas}))


def run_pytorch(a):
    """One PyTorch launch: (examples/sec, the BLAS it ran on)."""
    r = subprocess.run([torch_blas.DEBIAN_PYTHON, os.path.abspath(__file__), "--pytorch_child"] + sys.argv[1:],
                       env=torch_blas.torch_env(a.threads), capture_output=True, text=True)
    if r.returncode != 0:
        sys.stderr.write(r.stderr[-2000:])
        sys.exit(r.returncode)
    out = json.loads(r.stdout.strip().splitlines()[-1])
    return out["examples_per_sec"], out["blas"]


def run_dtrain(a, model):
    cmd = [os.path.join(a.bin, "dtrain_bench"), "--model=" + model, "--batch_size=%d" % a.batch_size,
           "--threads=%d" % a.threads, "--optimizer=" + a.optimizer, "--learning_rate=%g" % a.learning_rate,
           "--windows=%d" % a.windows, "--window_steps=%d" % a.window_steps, "--steps_total=0",
           "--synthetic_examples=%d" % (16 * a.batch_size)]  # the 16 batches it times, as PyTorch's side holds
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    m = re.search(r"median=([0-9.]+)", out)
    if not m:
        sys.exit("dtrain_bench printed no rate:\n" + out)
    return float(m.group(1))


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


if __name__ == "__main__":
    main()
