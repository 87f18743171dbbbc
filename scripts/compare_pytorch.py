#!/usr/bin/python3
"""Compare dtrain's training throughput (or one-epoch accuracy) with PyTorch's, in the same run.

For each (model, batch, threads) the script alternates fresh launches of the two systems -- dtrain, PyTorch,
dtrain, PyTorch, ... (--repeats of each) -- so that both see the same machine state, and prints the median over
launches of each launch's median-of-windows figure, the ratio, and every launch's figure so the noise is
visible. Both sides train the same model with the same optimizer, batch and thread count, on data preloaded in
memory, warm-up steps excluded; examples/sec counts forward + backward + optimizer step.

  dtrain side:  build/bin/dtrain_bench (or --bin), one process per launch.
  PyTorch side: this script re-run as a child (--pytorch_child) by Debian's /usr/bin/python3 with
                LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu/openblas-openmp and OMP_NUM_THREADS=<threads>
                (see /work/shared/BENCHMARKS.md for why both matter). The models are defined below exactly as
                in worker/models/*.cc, in NCHW; Fashion-MNIST from /usr/share/datasets/fashion-mnist, random
                24x24x3 data for cifar10 (and random 28x28 data for throughput when Fashion-MNIST is absent).
                With --device=cuda the child runs under --python (default: the python3 on PATH, which on a GPU
                machine is the CUDA PyTorch one) without the OpenBLAS set-up, cudnn.benchmark on, data on the GPU.

Needs (Debian): python3-torch libopenblas0-openmp python3-numpy dataset-fashion-mnist.

Examples:
  scripts/compare_pytorch.py --model=cnn --batch_size=50 --threads=1
  scripts/compare_pytorch.py --issue_rows                 # (cnn,50) (cnn,128) (convnet,256) (mlp,100) x 1,2 threads
  scripts/compare_pytorch.py --models=cnn,mlp --batch_sizes=50,128 --threads=1,2 --repeats=5
  scripts/compare_pytorch.py --pytorch_only --model=mlp --threads=2
  scripts/compare_pytorch.py --accuracy --model=cnn --threads=2   # one epoch each, test accuracy
  scripts/compare_pytorch.py --device=cuda --model=cnn            # PyTorch on cuda vs dtrain --towers=gpu:0
  scripts/compare_pytorch.py --model=mlp --plot=mlp.png           # the table also as mlp.csv, mlp.json, mlp.png

--plot FILE.png (or .svg) writes the table beside the picture as FILE.csv and FILE.json and draws it: each row's
examples/sec (or accuracy) of both systems, every launch as a dot; a picture that cannot be drawn is an error
(exit 1, after the table is written).
"""
import argparse
import csv
import gzip
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import plotting  # noqa: E402
import torch_blas  # noqa: E402

DEBIAN_PYTHON = torch_blas.DEBIAN_PYTHON
OPENBLAS_OPENMP = torch_blas.OPENBLAS_OPENMP
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ISSUE_ROWS = "cnn:50,cnn:128,convnet:256,mlp:100"

# dtrain's training defaults (worker/models/*.cc) and this script's timing defaults per model (windows of
# roughly a second or more on one core).
MODELS = {
    #          optimizer, learning rate, batch, warm-up steps, steps per window
    "mlp": ("sgd", 0.1, 100, 20, 200),
    "cnn": ("adam", 1e-4, 50, 5, 20),
    "convnet": ("adam", 1e-3, 1024, 2, 4),
    "cifar10": ("sgd", 0.1, 128, 5, 20),
}

# Initialization and L2 weight decay of each conv/dense layer, in order, as in worker/models/*.cc:
# (weight stddev of a normal truncated at 2 stddev, bias constant, weight decay on the weights).
INIT = {
    "mlp": [(784 ** -0.5, 0.0, 1e-4), (500 ** -0.5, 0.0, 1e-4)],
    "cnn": [(0.1, 0.1, 0.0)] * 4,
    "convnet": [((2 / 25) ** 0.5, 0.0, 0.0), ((2 / 576) ** 0.5, 0.0, 0.0), ((2 / 2304) ** 0.5, 0.0, 0.0),
                ((2 / 8192) ** 0.5, 0.0, 0.0), ((2 / 2048) ** 0.5, 0.0, 0.0), (1 / 32, 0.0, 0.0)],
    "cifar10": [(5e-2, 0.0, 0.0), (5e-2, 0.1, 0.0), (0.04, 0.1, 0.004), (0.04, 0.1, 0.004), (1 / 192, 0.0, 0.0)],
}

DTRAIN_LINE = re.compile(r"^dtrain_bench: .*examples/sec median=([0-9.eE+-]+)", re.M)
TORCH_LINE = re.compile(r"^pytorch_bench: .*examples/sec median=([0-9.eE+-]+)", re.M)
DTRAIN_ACC = re.compile(r"^step (\d+): test accuracy = ([0-9.]+) \((\d+) examples\)", re.M)
TORCH_ACC = re.compile(r"^pytorch_accuracy: .*test accuracy = ([0-9.]+)", re.M)


# ----------------------------------------------------------------------------------------------------------
# PyTorch side (runs only in the --pytorch_child process; imports torch lazily).
# ----------------------------------------------------------------------------------------------------------

def import_torch(threads, device="cpu"):
    """Re-executes under Debian's python with the OpenMP OpenBLAS and OMP_NUM_THREADS unless already so (CPU);
    on cuda, imports the torch of the running interpreter (the driver chose it with --python)."""
    if device == "cuda":
        try:
            import torch
        except ImportError as e:
            sys.exit(f"compare_pytorch: cannot import torch in {sys.executable} ({e}); pass --python=PATH")
        torch.set_num_threads(threads)
        return torch
    env_ok = (os.path.realpath(sys.executable).startswith(os.path.realpath(DEBIAN_PYTHON)) and
              os.environ.get("LD_LIBRARY_PATH", "").split(":")[0] == OPENBLAS_OPENMP and
              os.environ.get("OMP_NUM_THREADS") == str(threads) and torch_blas.malloc_tuned())
    if not env_ok:
        if os.environ.get("COMPARE_PYTORCH_REEXEC"):
            sys.exit("compare_pytorch: could not set up PyTorch's environment (re-exec did not take)")
        os.execve(DEBIAN_PYTHON, [DEBIAN_PYTHON, os.path.abspath(__file__)] + sys.argv[1:],
                  torch_env(threads, "cpu", COMPARE_PYTORCH_REEXEC="1"))
    try:
        import torch
    except ImportError as e:
        sys.exit(f"compare_pytorch: cannot import torch in {DEBIAN_PYTHON} ({e}); as root: apt-get install -y "
                 "python3-torch libopenblas0-openmp python3-numpy")
    torch.set_num_threads(threads)
    return torch


def tf32_state(torch, device):
    """Whether PyTorch may use TF32 tensor cores (its default for cuDNN convolutions), for the result line."""
    if device != "cuda":
        return "tf32=n/a"
    return (f"tf32=conv:{int(torch.backends.cudnn.allow_tf32)},"
            f"matmul:{int(torch.backends.cuda.matmul.allow_tf32)}")


def build_model(torch, name):
    """The model of worker/models/<name>.cc in NCHW, initialized as dtrain does."""
    nn = torch.nn
    if name == "mlp":
        layers = [nn.Flatten(), nn.Linear(784, 500), nn.ReLU(), nn.Linear(500, 10)]
    elif name == "cnn":  # 3,274,634 parameters
        layers = [nn.Conv2d(1, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
                  nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                  nn.Linear(7 * 7 * 64, 1024), nn.ReLU(), nn.Dropout(0.5), nn.Linear(1024, 10)]
    elif name == "convnet":  # 20,217,226 parameters; VALID convolutions and pools: 28->24->12->10->8->4
        layers = [nn.Conv2d(1, 64, 5), nn.ReLU(), nn.MaxPool2d(2),
                  nn.Conv2d(64, 256, 3), nn.ReLU(), nn.Conv2d(256, 512, 3), nn.ReLU(), nn.MaxPool2d(2),
                  nn.Flatten(), nn.Linear(4 * 4 * 512, 2048), nn.ReLU(), nn.Dropout(0.25),
                  nn.Linear(2048, 1024), nn.ReLU(), nn.Dropout(0.25), nn.Linear(1024, 10)]
    elif name == "cifar10":  # 1,068,298 parameters on 24x24x3
        # TF's LRN (depth_radius 4, bias 1, alpha 0.001/9, beta 0.75) is PyTorch's with size 9, alpha 0.001
        # (PyTorch divides alpha by size). TF's SAME 3x3/2 pool pads only at the end: ceil_mode does that.
        def lrn():
            return nn.LocalResponseNorm(9, alpha=0.001, beta=0.75, k=1.0)
        layers = [nn.Conv2d(3, 64, 5, padding=2), nn.ReLU(), nn.MaxPool2d(3, 2, ceil_mode=True), lrn(),
                  nn.Conv2d(64, 64, 5, padding=2), nn.ReLU(), lrn(), nn.MaxPool2d(3, 2, ceil_mode=True),
                  nn.Flatten(), nn.Linear(6 * 6 * 64, 384), nn.ReLU(), nn.Linear(384, 192), nn.ReLU(),
                  nn.Linear(192, 10)]
    else:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(MODELS)}")
    model = nn.Sequential(*layers)
    weighted = [m for m in model if isinstance(m, (nn.Conv2d, nn.Linear))]
    assert len(weighted) == len(INIT[name]), name
    decay_groups = {}
    with torch.no_grad():
        for m, (std, bias, wd) in zip(weighted, INIT[name]):
            nn.init.trunc_normal_(m.weight, 0.0, std, -2 * std, 2 * std)
            nn.init.constant_(m.bias, bias)
            decay_groups.setdefault(wd, []).append(m.weight)
            decay_groups.setdefault(0.0, []).append(m.bias)
    return model, decay_groups


def make_optimizer(torch, name, decay_groups):
    """dtrain's default optimizer; L2 weight decay as a gradient term (d(wd * |w|^2 / 2)/dw = wd * w)."""
    optimizer, lr = MODELS[name][:2]
    groups = [{"params": p, "weight_decay": wd} for wd, p in decay_groups.items()]
    if optimizer == "adam":
        return torch.optim.Adam(groups, lr=lr, eps=1e-8)
    return torch.optim.SGD(groups, lr=lr)


def load_idx(path):
    """A gzip IDX file (Fashion-MNIST) as a uint8 array: images (N, 1, H, W) or labels (N,)."""
    import numpy as np
    with gzip.open(path, "rb") as f:
        data = f.read()
    magic, n = int.from_bytes(data[0:4], "big"), int.from_bytes(data[4:8], "big")
    if magic == 2051:
        h, w = int.from_bytes(data[8:12], "big"), int.from_bytes(data[12:16], "big")
        return np.frombuffer(data, np.uint8, n * h * w, 16).reshape(n, 1, h, w)
    if magic == 2049:
        return np.frombuffer(data, np.uint8, n, 8)
    raise ValueError(f"{path}: not an IDX image (2051) or label (2049) file (magic {magic})")


def load_fashion_mnist(torch, data_dir, split):
    """(images float32 in [0, 1] NCHW, labels int64) of split 'train' or 't10k'."""
    try:
        x = load_idx(os.path.join(data_dir, f"{split}-images-idx3-ubyte.gz"))
        y = load_idx(os.path.join(data_dir, f"{split}-labels-idx1-ubyte.gz"))
    except (OSError, ValueError) as e:
        sys.exit(f"compare_pytorch: cannot read Fashion-MNIST from {data_dir}: {e} "
                 "(apt-get install dataset-fashion-mnist, or pass --data_dir)")
    return torch.from_numpy(x.astype("float32") / 255.0), torch.from_numpy(y.astype("int64"))


def train_step(torch, model, opt, x, y):
    opt.zero_grad(set_to_none=True)
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    return loss


def pytorch_child(a):
    """One PyTorch launch: a throughput measurement, or one epoch and the test accuracy (--accuracy)."""
    torch = import_torch(a.threads, a.device)
    blas = torch_blas.require_openblas_openmp("compare_pytorch", a.any_blas) if a.device == "cpu" else "n/a"
    torch.manual_seed(a.seed)
    if a.device == "cuda":
        if not torch.cuda.is_available():
            print(f"compare_pytorch: torch {torch.__version__} has no CUDA device", file=sys.stderr)
            sys.exit(2)
        torch.backends.cudnn.benchmark = True
        if a.strict_fp32:  # dtrain's CUDA backend computes in strict fp32 (no TF32 tensor cores)
            torch.backends.cudnn.allow_tf32 = False
            torch.backends.cuda.matmul.allow_tf32 = False
    dev = torch.device(a.device)
    model, groups = build_model(torch, a.model)
    model.to(dev).train()
    opt = make_optimizer(torch, a.model, groups)
    gen = torch.Generator().manual_seed(a.seed)
    if a.accuracy:
        x, y = load_fashion_mnist(torch, a.data_dir, "train")
        perm = torch.randperm(len(x), generator=gen)
        steps = len(x) // a.batch_size
        t0 = time.perf_counter()
        for i in range(steps):
            idx = perm[i * a.batch_size:(i + 1) * a.batch_size]
            train_step(torch, model, opt, x[idx].to(dev), y[idx].to(dev))
        secs = time.perf_counter() - t0
        tx, ty = load_fashion_mnist(torch, a.data_dir, "t10k")
        model.eval()
        correct = 0
        with torch.no_grad():
            for i in range(0, len(tx), 1000):
                logits = model(tx[i:i + 1000].to(dev))
                correct += int((logits.argmax(1).cpu() == ty[i:i + 1000]).sum())
        print(f"pytorch_accuracy: model={a.model} batch={a.batch_size} threads={a.threads} steps={steps} "
              f"train_secs={secs:.1f} test accuracy = {correct / len(tx):.4f} ({len(tx)} examples)")
        return 0
    # Sixteen batches prepared up front, as dtrain_bench does: compute and the update are timed, not input.
    data = "fashion-mnist"
    if a.model != "cifar10" and not os.path.exists(os.path.join(a.data_dir, "train-images-idx3-ubyte.gz")):
        data = "random"  # throughput does not depend on the pixel values; say so in the result line
    if a.model == "cifar10" or data == "random":
        data = "random"
        shape = (3, 24, 24) if a.model == "cifar10" else (1, 28, 28)
        batches = [(torch.rand(a.batch_size, *shape, generator=gen),
                    torch.randint(0, 10, (a.batch_size,), generator=gen)) for _ in range(16)]
    else:
        x, y = load_fashion_mnist(torch, a.data_dir, "train")
        batches = [(x[idx], y[idx]) for idx in
                   (torch.randint(0, len(x), (a.batch_size,), generator=gen) for _ in range(16))]
    batches = [(bx.to(dev).contiguous(), by.to(dev)) for bx, by in batches]
    sync = torch.cuda.synchronize if a.device == "cuda" else (lambda: None)
    step = 0

    def run(n):
        nonlocal step
        loss = None
        for _ in range(n):
            bx, by = batches[step % len(batches)]
            loss = train_step(torch, model, opt, bx, by)
            step += 1
        return loss

    first_loss = float(run(max(1, a.warmup_steps)))
    rates = []
    for w in range(a.windows):
        sync()
        t0 = time.perf_counter()
        loss = run(a.window_steps)
        sync()
        rates.append(a.window_steps * a.batch_size / (time.perf_counter() - t0))
        print(f"  window {w}: {rates[-1]:.1f} examples/sec", file=sys.stderr)
    last_loss = float(loss)
    if not (last_loss == last_loss and abs(last_loss) < float("inf")):  # benchmarks verify what they time
        sys.exit(f"compare_pytorch: training diverged (loss {last_loss})")
    print(f"pytorch_bench: model={a.model} batch={a.batch_size} threads={a.threads} device={a.device} "
          f"torch={torch.__version__} blas={blas} data={data} {tf32_state(torch, a.device)} loss first={first_loss:.4f} last={last_loss:.4f} "
          f"examples/sec median={statistics.median(rates):.1f} min={min(rates):.1f} max={max(rates):.1f}")
    return 0


# ----------------------------------------------------------------------------------------------------------
# Driver: launches both systems, interleaved, and prints the table (standard library only).
# ----------------------------------------------------------------------------------------------------------

def torch_env(threads, device="cpu", **extra):
    if device == "cpu":
        return torch_blas.torch_env(threads, **extra)
    # cuda: no OpenBLAS set-up, the allocator as dtrain's binaries tune theirs (scripts/torch_blas.py).
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), **extra)
    env["GLIBC_TUNABLES"] = torch_blas.with_malloc_tunables(env.get("GLIBC_TUNABLES"))
    return env


def launch(cmd, env, pattern, timeout, verbose):
    """Runs one launch; returns the pattern's match, or None (and prints why) when it failed."""
    try:
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        print(f"    timed out after {timeout}s: {' '.join(cmd)}", file=sys.stderr)
        return None
    if verbose:
        sys.stderr.write(r.stderr)
    m = pattern.search(r.stdout)
    if r.returncode != 0 or not m:
        tail = "\n      ".join((r.stdout + r.stderr).strip().splitlines()[-8:])
        print(f"    failed (exit {r.returncode}): {' '.join(cmd)}\n      {tail}", file=sys.stderr)
        return None
    return m


def child_cmd(a, model, batch, threads, accuracy=False):
    cmd = [a.python, os.path.abspath(__file__), "--pytorch_child", f"--model={model}",
           f"--batch_size={batch}", f"--threads={threads}", f"--device={a.device}", f"--data_dir={a.data_dir}",
           f"--seed={a.seed}"]
    if a.strict_fp32:
        cmd.append("--strict_fp32")
    if a.any_blas:
        cmd.append("--any_blas")
    if accuracy:
        return cmd + ["--accuracy"]
    return cmd + [f"--warmup_steps={a.warmup(model)}", f"--window_steps={a.steps(model)}", f"--windows={a.windows}"]


def dtrain_towers(a):
    return ["--towers=gpu:0"] if a.device == "cuda" else ([f"--towers={a.towers}"] if a.towers else [])


def fmt(xs):
    return " ".join("-" if x is None else f"{x:.0f}" for x in xs)


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def throughput(a, configs):
    rows = []
    for model, batch, threads in configs:
        label = f"{model} batch={batch} threads={threads}"
        dt, pt = [], []
        for r in range(a.repeats):
            if not a.pytorch_only:
                cmd = [a.bin, f"--model={model}", f"--batch_size={batch}", f"--threads={threads}",
                       f"--warmup_steps={a.warmup(model)}", f"--window_steps={a.steps(model)}",
                       f"--windows={a.windows}", f"--data_dir={a.data_dir}"] + dtrain_towers(a)
                m = launch(cmd, dict(os.environ, OMP_NUM_THREADS=str(threads)), DTRAIN_LINE, a.timeout, a.verbose)
                dt.append(float(m.group(1)) if m else None)
            m = launch(child_cmd(a, model, batch, threads), torch_env(threads, a.device), TORCH_LINE, a.timeout,
                       a.verbose)
            pt.append(float(m.group(1)) if m else None)
            d = "" if a.pytorch_only else f"dtrain {fmt(dt[-1:])}  "
            print(f"  {label} launch {r + 1}/{a.repeats}: {d}PyTorch {fmt(pt[-1:])} ex/s", file=sys.stderr)
        rows.append((model, batch, threads, dt, pt))
    print(f"\nTraining examples/sec on {a.device} (median of {a.windows} windows per launch; median over "
          f"{a.repeats} interleaved launches); load average {load()} at the end")
    print(f"{'model':8} {'batch':>5} {'threads':>7} {'dtrain':>9} {'PyTorch':>9} {'ratio':>6}   "
          "per launch: dtrain | PyTorch")
    for model, batch, threads, dt, pt in rows:
        d, p = med(dt), med(pt)
        ratio = f"{d / p:6.2f}" if d and p else f"{'-':>6}"
        print(f"{model:8} {batch:5d} {threads:7d} {fmt([d]):>9} {fmt([p]):>9} {ratio}   {fmt(dt)} | {fmt(pt)}")
    failed = any(med(pt) is None or (not a.pytorch_only and med(dt) is None) for *_, dt, pt in rows)
    table = [{"model": m, "batch": b, "threads": t, "dtrain": med(dt), "pytorch": med(pt),
              "ratio": med(dt) / med(pt) if med(dt) and med(pt) else None, "dtrain_launches": dt,
              "pytorch_launches": pt} for m, b, t, dt, pt in rows]
    if a.plot and not write_plot(a, table, "examples/sec"):
        return 1
    return 1 if failed else 0


def write_plot(a, table, unit):
    """The table as CSV and JSON beside --plot, and its picture; False (said on stderr) when it cannot be drawn."""
    prefix = os.path.splitext(a.plot)[0]
    with open(prefix + ".csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["model", "batch", "threads", "dtrain", "pytorch", "ratio"],
                           extrasaction="ignore")
        w.writeheader()
        for r in table:
            w.writerow({k: ("" if v is None else v) for k, v in r.items()})
    with open(prefix + ".json", "w") as f:
        json.dump({"device": a.device, "unit": unit, "repeats": a.repeats, "rows": table}, f, indent=1)
    print(f"table written to {prefix}.csv and {prefix}.json", file=sys.stderr)
    try:
        plt = plotting.pyplot(a.plot)
        fig, ax = plt.subplots(figsize=(max(4.5, 1.6 * len(table) + 2), 4))
        labels = [f"{r['model']}\nb{r['batch']} t{r['threads']}" for r in table]
        for side, (key, name) in enumerate((("dtrain", "dtrain"), ("pytorch", "PyTorch"))):
            xs = [i + (side - 0.5) * 0.38 for i in range(len(table))]
            ax.bar(xs, [r[key] or 0 for r in table], width=0.36, label=name, color=f"C{side}")
            for x, r in zip(xs, table):
                launches = [v for v in r.get(key + "_launches", []) if v is not None]
                ax.plot([x] * len(launches), launches, ".", color="black", markersize=4)
        for i, r in enumerate(table):
            if r["ratio"]:
                top = max(r["dtrain"] or 0, r["pytorch"] or 0)
                ax.text(i, top * 1.02, f"{r['ratio']:.2f}x", ha="center", va="bottom", fontsize=8)
        ax.set_xticks(range(len(table)))
        ax.set_xticklabels(labels, fontsize=8)
        ax.set_ylabel(unit)
        ax.set_title(f"dtrain against PyTorch on {a.device}\n(median of {a.repeats} launches; dots: each launch)",
                     fontsize=9)
        ax.legend(fontsize=8)
        fig.tight_layout()
        plotting.save(fig, a.plot, dpi=100)
    except plotting.PlotError as e:
        print(f"compare_pytorch: {e} (the table is written)", file=sys.stderr)
        return False
    print(f"plot written to {a.plot}", file=sys.stderr)
    return True


def accuracy(a, configs):
    print(f"{'model':8} {'batch':>5} {'threads':>7} {'dtrain':>8} {'PyTorch':>8} {'diff (points)':>14}")
    ok = True
    table = []
    for model, batch, threads in configs:
        d = None
        if not a.pytorch_only:
            cmd = [a.worker_bin, "--job_name=local", f"--model={model}", f"--batch_size={batch}",
                   f"--train_steps={60000 // batch}", f"--threads={threads}", f"--data_dir={a.data_dir}",
                   f"--seed={a.seed}"] + dtrain_towers(a)
            m = launch(cmd, dict(os.environ, OMP_NUM_THREADS=str(threads)), DTRAIN_ACC, a.timeout, a.verbose)
            d = float(m.group(2)) if m else None
        m = launch(child_cmd(a, model, batch, threads, accuracy=True), torch_env(threads, a.device), TORCH_ACC,
                   a.timeout, a.verbose)
        p = float(m.group(1)) if m else None
        ok = ok and p is not None and (a.pytorch_only or d is not None)
        diff = f"{100 * (d - p):+14.1f}" if d is not None and p is not None else f"{'-':>14}"
        show = lambda v: f"{100 * v:7.1f}%" if v is not None else f"{'-':>8}"
        print(f"{model:8} {batch:5d} {threads:7d} {show(d)} {show(p)} {diff}", flush=True)
        table.append({"model": model, "batch": batch, "threads": threads, "dtrain": d, "pytorch": p,
                      "ratio": d / p if d and p else None})
    if a.plot and not write_plot(a, table, "test accuracy after one epoch"):
        return 1
    return 0 if ok else 1


def load():
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", "--models", dest="models", default="cnn", help="comma list of " + ", ".join(MODELS))
    p.add_argument("--batch_size", "--batch_sizes", dest="batch_sizes", default="",
                   help="comma list (default: each model's dtrain default); every model runs every batch")
    p.add_argument("--configs", default="", help="explicit model:batch pairs, e.g. cnn:50,mlp:100")
    p.add_argument("--issue_rows", action="store_true", help=f"--configs={ISSUE_ROWS} --threads=1,2")
    p.add_argument("--threads", default="1", help="comma list of thread counts (default 1)")
    p.add_argument("--repeats", type=int, default=3, help="fresh launches of each system per row (default 3)")
    p.add_argument("--warmup_steps", type=int, help="untimed steps (default per model: mlp 20, convnet 2, else 5)")
    p.add_argument("--window_steps", type=int, help="steps per window (default: mlp 200, convnet 4, else 20)")
    p.add_argument("--windows", type=int, default=5, help="timing windows per launch; the median counts")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="cuda: PyTorch on cuda, dtrain with --towers=gpu:0 (exit 2 when PyTorch has no CUDA)")
    p.add_argument("--python", default="",
                   help="interpreter of the PyTorch side (default: /usr/bin/python3 on cpu, the python3 on PATH "
                        "on cuda)")
    p.add_argument("--strict_fp32", action="store_true",
                   help="cuda: forbid TF32 in PyTorch (cuDNN convolutions use it by default; dtrain never does)")
    p.add_argument("--towers", default="", help="dtrain's --towers on cpu (default: dtrain's own)")
    p.add_argument("--accuracy", action="store_true",
                   help="train one epoch (60,000 examples) in each and compare test accuracy")
    p.add_argument("--bin", default=os.path.join(REPO, "build/bin/dtrain_bench"), help="dtrain_bench binary")
    p.add_argument("--worker_bin", default=os.path.join(REPO, "build/bin/dtrain_worker"),
                   help="dtrain_worker binary (--accuracy)")
    p.add_argument("--data_dir", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--timeout", type=int, default=3600, help="seconds allowed per launch")
    p.add_argument("--pytorch_only", action="store_true", help="measure PyTorch alone (no dtrain binary needed)")
    p.add_argument("--verbose", action="store_true", help="show each launch's window figures")
    p.add_argument("--any_blas", action="store_true",
                   help="time PyTorch even when it did not load the OpenMP OpenBLAS (labelled blas=other:...); "
                        "by default that is an error (exit 2)")
    p.add_argument("--plot", default="",
                   help="draw the table here (FILE.png or FILE.svg) and write it beside as FILE.csv and FILE.json")
    p.add_argument("--pytorch_child", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.plot and not a.pytorch_child:
        ext = os.path.splitext(a.plot)[1].lower()
        if ext not in (".png", ".svg"):
            p.error(f"--plot={a.plot}: the picture's name must end in .png or .svg")
        if not os.path.isdir(os.path.dirname(os.path.abspath(a.plot))):
            p.error(f"--plot={a.plot}: no directory {os.path.dirname(os.path.abspath(a.plot))}")
    if not a.python:
        a.python = DEBIAN_PYTHON if a.device == "cpu" else (shutil.which("python3") or DEBIAN_PYTHON)
    a.warmup = lambda m: a.warmup_steps if a.warmup_steps is not None else MODELS[m][3]
    a.steps = lambda m: a.window_steps if a.window_steps is not None else MODELS[m][4]
    return p, a


def configs_of(p, a):
    try:
        threads = [int(t) for t in a.threads.split(",") if t]
        if a.issue_rows:
            a.configs, threads = ISSUE_ROWS, [1, 2]
        if a.configs:
            if any(c.count(":") != 1 for c in a.configs.split(",")):
                p.error(f"--configs={a.configs}: expected model:batch pairs, e.g. {ISSUE_ROWS}")
            pairs = [(m, int(b)) for m, b in (c.split(":") for c in a.configs.split(","))]
        else:
            models = [m for m in a.models.split(",") if m]
            batches = [int(b) for b in a.batch_sizes.split(",") if b]
            pairs = [(m, b) for m in models for b in (batches or [MODELS.get(m, (0, 0, 0))[2]])]
    except ValueError as e:
        p.error(f"bad --configs/--batch_size/--threads: {e}")
    for m, b in pairs:
        if m not in MODELS:
            p.error(f"unknown model {m!r}; known: {', '.join(MODELS)}")
        if a.accuracy and m == "cifar10":
            p.error("--accuracy needs a real data set; cifar10 is benchmarked on random data only")
        if b <= 0:
            p.error(f"batch size must be positive, got {b} for {m}")
    if not threads or min(threads) <= 0 or a.repeats <= 0 or a.windows <= 0:
        p.error("--threads, --repeats and --windows must be positive")
    return [(m, b, t) for m, b in pairs for t in threads]


def main(argv):
    p, a = parse_args(argv)
    configs = configs_of(p, a)
    if a.pytorch_child:
        if len(configs) != 1:
            p.error("--pytorch_child takes one model, batch and thread count")
        a.model, a.batch_size, a.threads = configs[0]
        a.warmup_steps, a.window_steps = a.warmup(a.model), a.steps(a.model)
        return pytorch_child(a)
    if a.device == "cuda":
        probe = subprocess.run([a.python, "-c", "import torch, sys; sys.exit(not torch.cuda.is_available())"],
                               env=torch_env(1, "cuda"), capture_output=True)
        if probe.returncode != 0:
            print(f"compare_pytorch: CUDA is not available to PyTorch in {a.python} (no GPU, no torch, or a "
                  "CPU-only torch; pass --python=PATH); cannot compare on cuda", file=sys.stderr)
            return 2
    binary = a.worker_bin if a.accuracy else a.bin
    if not a.pytorch_only and not os.access(binary, os.X_OK):
        print(f"compare_pytorch: {binary} not found or not executable: build it (scripts/build.sh), pass "
              f"--{'worker_bin' if a.accuracy else 'bin'}=PATH, or use --pytorch_only", file=sys.stderr)
        return 2
    print(f"compare_pytorch: {len(configs)} row(s), {os.cpu_count()} CPUs, load average {load()} at the start",
          file=sys.stderr)
    return accuracy(a, configs) if a.accuracy else throughput(a, configs)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
