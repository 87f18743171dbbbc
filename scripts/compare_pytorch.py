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
  scripts/compare_pytorch.py --model=cnn --compute_dtype=bf16     # dtrain bf16 vs PyTorch autocast, dtrain fp32 beside

--plot FILE.png (or .svg) writes the table beside the picture as FILE.csv and FILE.json and draws it: each row's
examples/sec (or accuracy) of both systems, every launch as a dot; a picture that cannot be drawn is an error
(exit 1, after the table is written).

--compute_dtype=bf16 (default fp32) compares mixed precision: dtrain runs with --compute_dtype=bf16 (convolutions
and matrix products in bf16 on oneDNN with fp32 accumulation, everything else in fp32), PyTorch runs its forward
pass and loss under torch.autocast(dtype=torch.bfloat16) (CPU autocast; "cuda" on --device=cuda), backward and
optimizer step outside it as PyTorch's AMP recipe does (--accuracy: the test forward under autocast too). Each
repeat launches dtrain bf16, PyTorch bf16 and dtrain fp32 -- the baseline of the bf16 speed-up, measured in the
same run -- and the table shows dtrain bf16, PyTorch bf16, their ratio, dtrain fp32 and bf16/fp32 (--accuracy:
the two bf16 accuracies, their difference, dtrain fp32 and bf16 - fp32 in points). Its title names the instruction
set oneDNN ran dtrain's bf16 on: dtrain's `compute bf16 ... on oneDNN's ISA` line is printed on stderr once per
row, beside /proc/cpuinfo's avx512_bf16 and amx_bf16 flags (without either, dtrain's line says bf16 runs emulated).
Debian's torch 1.13 is built with oneDNN (MKL-DNN 2.6.3; torch.backends.mkldnn.is_available() is True), and under
CPU autocast its Conv2d and Linear really compute in bf16 -- bfloat16 outputs, from oneDNN's jit_bf16 convolution
and brg matmul kernels on avx512_core_bf16 (ONEDNN_VERBOSE on an avx512_bf16 Xeon) -- ReLU and max-pooling follow
in bf16 while the loss and the gradients of the fp32 weights are fp32 (in fp32, its Linear runs on OpenBLAS).
"""
import argparse
import contextlib
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
# dtrain's --compute_dtype=bf16 report on stderr (dtrain_bench's own line; the worker's in its log).
BF16_REPORT = re.compile(r"^.*compute bf16 \(fp32 accumulation\) on oneDNN's (\w+).*$", re.M)
CPU_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


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


def forward_context(torch, a):
    """The context of the forward pass and the loss: torch.autocast to bfloat16 with --compute_dtype=bf16 (the
    CPU autocast on cpu, CUDA's on cuda), else none."""
    if a.compute_dtype == "bf16":
        return torch.autocast(a.device, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def train_step(torch, model, opt, x, y, cast=contextlib.nullcontext):
    """One step; `cast()` is the forward's context (forward_context): backward and the update run outside it."""
    opt.zero_grad(set_to_none=True)
    with cast():
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
    cast = lambda: forward_context(torch, a)  # noqa: E731
    if a.accuracy:
        x, y = load_fashion_mnist(torch, a.data_dir, "train")
        perm = torch.randperm(len(x), generator=gen)
        steps = len(x) // a.batch_size
        t0 = time.perf_counter()
        for i in range(steps):
            idx = perm[i * a.batch_size:(i + 1) * a.batch_size]
            train_step(torch, model, opt, x[idx].to(dev), y[idx].to(dev), cast)
        secs = time.perf_counter() - t0
        tx, ty = load_fashion_mnist(torch, a.data_dir, "t10k")
        model.eval()
        correct = 0
        with torch.no_grad(), cast():
            for i in range(0, len(tx), 1000):
                logits = model(tx[i:i + 1000].to(dev))
                correct += int((logits.argmax(1).cpu() == ty[i:i + 1000]).sum())
        print(f"pytorch_accuracy: model={a.model} batch={a.batch_size} threads={a.threads} "
              f"compute={a.compute_dtype} steps={steps} "
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
            loss = train_step(torch, model, opt, bx, by, cast)
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
          f"compute={a.compute_dtype} torch={torch.__version__} blas={blas} data={data} {tf32_state(torch, a.device)} "
          f"loss first={first_loss:.4f} last={last_loss:.4f} "
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


def launch(cmd, env, pattern, timeout, verbose, stderr=None):
    """Runs one launch; returns the pattern's match, or None (and prints why) when it failed. A list `stderr`
    receives the launch's stderr."""
    try:
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        print(f"    timed out after {timeout}s: {' '.join(cmd)}", file=sys.stderr)
        return None
    if verbose:
        sys.stderr.write(r.stderr)
    if stderr is not None:
        stderr.append(r.stderr)
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
    if a.compute_dtype != "fp32":
        cmd.append(f"--compute_dtype={a.compute_dtype}")
    if accuracy:
        return cmd + ["--accuracy"]
    return cmd + [f"--warmup_steps={a.warmup(model)}", f"--window_steps={a.steps(model)}", f"--windows={a.windows}"]


def dtrain_towers(a):
    return ["--towers=gpu:0"] if a.device == "cuda" else ([f"--towers={a.towers}"] if a.towers else [])


def dtrain_compute(a, dtype):
    """dtrain's --compute_dtype flag: none in an fp32 comparison (binaries without the flag still run it), else
    explicit on both the bf16 launches and their fp32 baseline."""
    return [] if a.compute_dtype == "fp32" else [f"--compute_dtype={dtype}"]


def bf16_report(stderr, label):
    """(dtrain's `compute bf16 ... on oneDNN's ISA` line from a launch's stderr, the ISA), printed on stderr for
    the row `label`; (None, None) when the launch printed none."""
    m = BF16_REPORT.search(stderr)
    if not m:
        print(f"  {label}: dtrain printed no 'compute bf16 (fp32 accumulation) on oneDNN's ISA' line",
              file=sys.stderr)
        return None, None
    print(f"  {label}: {m.group(0).strip()}", file=sys.stderr)
    return m.group(0).strip(), m.group(1)


def dtrain_bench(a, model, batch, threads, dtype):
    """One dtrain_bench launch: (examples/sec or None, its stderr). A result line that names another compute
    dtype than asked for is a failed launch."""
    cmd = [a.bin, f"--model={model}", f"--batch_size={batch}", f"--threads={threads}",
           f"--warmup_steps={a.warmup(model)}", f"--window_steps={a.steps(model)}",
           f"--windows={a.windows}", f"--data_dir={a.data_dir}"] + dtrain_towers(a) + dtrain_compute(a, dtype)
    err = []
    m = launch(cmd, dict(os.environ, OMP_NUM_THREADS=str(threads)), DTRAIN_LINE, a.timeout, a.verbose, err)
    if m and dtrain_compute(a, dtype) and f" compute={dtype} " not in m.group(0):
        line = m.string[m.start():].split("\n", 1)[0]
        print(f"    not compute={dtype}: {' '.join(cmd)}\n      {line}", file=sys.stderr)
        m = None
    return (float(m.group(1)) if m else None), "".join(err)


def isa_text(isas):
    """What the table's title says of the instruction sets oneDNN ran dtrain's bf16 on."""
    return f"dtrain on oneDNN's {','.join(isas)}" if isas else "dtrain's oneDNN ISA unknown"


def cpu_bf16_flags():
    """/proc/cpuinfo's bf16 flags, e.g. "avx512_bf16 yes, amx_bf16 no" ("unknown" without /proc/cpuinfo)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = set(next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), []))
    except OSError:
        return "unknown (no /proc/cpuinfo)"
    return ", ".join(f"{flag} {'yes' if flag in flags else 'no'}" for flag in CPU_BF16_FLAGS)


def fmt(xs):
    """Figures as printed: whole numbers, with a decimal below 100 (ResNet-50 on one core runs ~5 examples/sec)."""
    return " ".join("-" if x is None else f"{x:.0f}" if x >= 100 else f"{x:.1f}" for x in xs)


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def throughput(a, configs):
    bf16 = a.compute_dtype == "bf16"
    rows, isas = [], []
    for model, batch, threads in configs:
        label = f"{model} batch={batch} threads={threads}"
        dt, pt, ft = [], [], []  # dtrain and PyTorch in --compute_dtype; dtrain fp32, the baseline of bf16
        report = None
        for r in range(a.repeats):
            if not a.pytorch_only:
                rate, err = dtrain_bench(a, model, batch, threads, a.compute_dtype)
                dt.append(rate)
                report = report or (err if BF16_REPORT.search(err) else None)
            m = launch(child_cmd(a, model, batch, threads), torch_env(threads, a.device), TORCH_LINE, a.timeout,
                       a.verbose)
            pt.append(float(m.group(1)) if m else None)
            if bf16 and not a.pytorch_only:
                ft.append(dtrain_bench(a, model, batch, threads, "fp32")[0])
            if bf16:
                d = "" if a.pytorch_only else f"dtrain bf16 {fmt(dt[-1:])}  "
                f32 = "" if a.pytorch_only else f"  dtrain fp32 {fmt(ft[-1:])}"
                print(f"  {label} launch {r + 1}/{a.repeats}: {d}PyTorch bf16 {fmt(pt[-1:])}{f32} ex/s",
                      file=sys.stderr)
            else:
                d = "" if a.pytorch_only else f"dtrain {fmt(dt[-1:])}  "
                print(f"  {label} launch {r + 1}/{a.repeats}: {d}PyTorch {fmt(pt[-1:])} ex/s", file=sys.stderr)
        if bf16 and not a.pytorch_only:
            isa = bf16_report(report or "", label)[1]
            if isa and isa not in isas:
                isas.append(isa)
        rows.append((model, batch, threads, dt, pt, ft))
    if bf16:
        on = "" if a.pytorch_only else f"{isa_text(isas)}; "
        print(f"\nTraining examples/sec on {a.device}, compute bf16 ({on}PyTorch under "
              f"torch.autocast; /proc/cpuinfo: {cpu_bf16_flags()}; median of {a.windows} windows per launch; "
              f"median over {a.repeats} interleaved launches); load average {load()} at the end")
        print(f"{'model':8} {'batch':>5} {'threads':>7} {'dtrain bf16':>11} {'PyTorch bf16':>12} {'ratio':>6} "
              f"{'dtrain fp32':>11} {'bf16/fp32':>9}   per launch: dtrain bf16 | PyTorch bf16 | dtrain fp32")
        for model, batch, threads, dt, pt, ft in rows:
            d, p, f = med(dt), med(pt), med(ft)
            ratio = f"{d / p:6.2f}" if d and p else f"{'-':>6}"
            speedup = f"{d / f:9.2f}" if d and f else f"{'-':>9}"
            print(f"{model:8} {batch:5d} {threads:7d} {fmt([d]):>11} {fmt([p]):>12} {ratio} {fmt([f]):>11} "
                  f"{speedup}   {fmt(dt)} | {fmt(pt)} | {fmt(ft)}".rstrip())
    else:
        print(f"\nTraining examples/sec on {a.device} (median of {a.windows} windows per launch; median over "
              f"{a.repeats} interleaved launches); load average {load()} at the end")
        print(f"{'model':8} {'batch':>5} {'threads':>7} {'dtrain':>9} {'PyTorch':>9} {'ratio':>6}   "
              "per launch: dtrain | PyTorch")
        for model, batch, threads, dt, pt, _ in rows:
            d, p = med(dt), med(pt)
            ratio = f"{d / p:6.2f}" if d and p else f"{'-':>6}"
            print(f"{model:8} {batch:5d} {threads:7d} {fmt([d]):>9} {fmt([p]):>9} {ratio}   {fmt(dt)} | {fmt(pt)}")
    failed = any(med(pt) is None or (not a.pytorch_only and (med(dt) is None or (bf16 and med(ft) is None)))
                 for *_, dt, pt, ft in rows)
    table = [{"model": m, "batch": b, "threads": t, "dtrain": med(dt), "pytorch": med(pt),
              "ratio": med(dt) / med(pt) if med(dt) and med(pt) else None, "dtrain_launches": dt,
              "pytorch_launches": pt} for m, b, t, dt, pt, _ in rows]
    if bf16:  # "dtrain" and "pytorch" are the bf16 figures; dtrain fp32 beside them
        for r, (*_, dt, pt, ft) in zip(table, rows):
            r.update({"dtrain_fp32": med(ft), "speedup_over_fp32": med(dt) / med(ft) if med(dt) and med(ft) else None,
                      "dtrain_fp32_launches": ft})
    if a.plot and not write_plot(a, table, "examples/sec", ",".join(isas)):
        return 1
    return 1 if failed else 0


def write_plot(a, table, unit, isa=""):
    """The table as CSV and JSON beside --plot, and its picture; False (said on stderr) when it cannot be drawn.
    With --compute_dtype=bf16 the rows' "dtrain" and "pytorch" are the bf16 figures and "dtrain_fp32" is drawn
    beside them; `isa` is the instruction set oneDNN ran dtrain's bf16 on."""
    bf16 = getattr(a, "compute_dtype", "fp32") == "bf16"
    extra = [k for k in ("dtrain_fp32", "speedup_over_fp32", "bf16_minus_fp32") if any(k in r for r in table)]
    prefix = os.path.splitext(a.plot)[0]
    with open(prefix + ".csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["model", "batch", "threads", "dtrain", "pytorch", "ratio"] + extra,
                           extrasaction="ignore")
        w.writeheader()
        for r in table:
            w.writerow({k: ("" if v is None else v) for k, v in r.items()})
    with open(prefix + ".json", "w") as f:
        doc = {"device": a.device, "unit": unit, "repeats": a.repeats}
        if bf16:
            doc.update({"compute_dtype": "bf16", "isa": isa or None, "cpu_bf16_flags": cpu_bf16_flags()})
        json.dump(dict(doc, rows=table), f, indent=1)
    print(f"table written to {prefix}.csv and {prefix}.json", file=sys.stderr)
    try:
        plt = plotting.pyplot(a.plot)
        fig, ax = plt.subplots(figsize=(max(6.5, 2.2 * len(table) + 2) if bf16 else max(4.5, 1.6 * len(table) + 2),
                                        4))
        labels = [f"{r['model']}\nb{r['batch']} t{r['threads']}" for r in table]
        sides = ((("dtrain", "dtrain bf16"), ("pytorch", "PyTorch bf16 (autocast)"), ("dtrain_fp32", "dtrain fp32"))
                 if bf16 else (("dtrain", "dtrain"), ("pytorch", "PyTorch")))
        step = 0.76 / len(sides)
        for side, (key, name) in enumerate(sides):
            xs = [i + (side - (len(sides) - 1) / 2) * step for i in range(len(table))]
            ax.bar(xs, [r.get(key) or 0 for r in table], width=step - 0.02, label=name, color=f"C{side}")
            for x, r in zip(xs, table):
                launches = [v for v in r.get(key + "_launches", []) if v is not None]
                ax.plot([x] * len(launches), launches, ".", color="black", markersize=4)
        for i, r in enumerate(table):
            notes = [f"{r['ratio']:.2f}x" + (" PyTorch" if bf16 else "")] if r["ratio"] else []
            if r.get("speedup_over_fp32"):
                notes.append(f"{r['speedup_over_fp32']:.2f}x fp32")
            if notes:
                top = max(r.get(key) or 0 for key, _ in sides)
                ax.text(i, top * 1.02, "\n".join(notes), ha="center", va="bottom", fontsize=8)
        if bf16:  # room for the two lines of notes under the title
            heights = [v or 0 for r in table for key, _ in sides for v in [r.get(key)] + r.get(key + "_launches", [])]
            ax.set_ylim(0, 1.2 * max(heights + [1e-9]))
        ax.set_xticks(range(len(table)))
        ax.set_xticklabels(labels, fontsize=8)
        ax.set_ylabel(unit)
        compute = f", compute bf16\n({isa_text([isa] if isa else [])}; " if bf16 else "\n("
        ax.set_title(f"dtrain against PyTorch on {a.device}{compute}median of {a.repeats} launches; dots: each "
                     "launch)", fontsize=9)
        ax.legend(fontsize=8)
        fig.tight_layout()
        plotting.save(fig, a.plot, dpi=100)
    except plotting.PlotError as e:
        print(f"compare_pytorch: {e} (the table is written)", file=sys.stderr)
        return False
    print(f"plot written to {a.plot}", file=sys.stderr)
    return True


def accuracy(a, configs):
    bf16 = a.compute_dtype == "bf16"
    if not bf16:
        print(f"{'model':8} {'batch':>5} {'threads':>7} {'dtrain':>8} {'PyTorch':>8} {'diff (points)':>14}")
    ok = True
    table, isas = [], []
    show = lambda v, width=8: f"{100 * v:{width - 1}.1f}%" if v is not None else f"{'-':>{width}}"  # noqa: E731
    for model, batch, threads in configs:
        label = f"{model} batch={batch} threads={threads}"

        def worker(dtype):
            cmd = [a.worker_bin, "--job_name=local", f"--model={model}", f"--batch_size={batch}",
                   f"--train_steps={60000 // batch}", f"--threads={threads}", f"--data_dir={a.data_dir}",
                   f"--seed={a.seed}"] + dtrain_towers(a) + dtrain_compute(a, dtype)
            err = []
            m = launch(cmd, dict(os.environ, OMP_NUM_THREADS=str(threads)), DTRAIN_ACC, a.timeout, a.verbose, err)
            return (float(m.group(2)) if m else None), "".join(err)

        d = f = None
        if not a.pytorch_only:
            d, err = worker(a.compute_dtype)
            if bf16:
                isa = bf16_report(err, label)[1]
                if isa and isa not in isas:
                    isas.append(isa)
        m = launch(child_cmd(a, model, batch, threads, accuracy=True), torch_env(threads, a.device), TORCH_ACC,
                   a.timeout, a.verbose)
        p = float(m.group(1)) if m else None
        if bf16 and not a.pytorch_only:
            f = worker("fp32")[0]
        ok = ok and p is not None and (a.pytorch_only or (d is not None and (not bf16 or f is not None)))
        diff = f"{100 * (d - p):+14.1f}" if d is not None and p is not None else f"{'-':>14}"
        row = {"model": model, "batch": batch, "threads": threads, "dtrain": d, "pytorch": p,
               "ratio": d / p if d and p else None}
        if bf16:
            if not table:  # the header, once the first row has named oneDNN's ISA
                on = "" if a.pytorch_only else f"{isa_text(isas)}; "
                print(f"Test accuracy after one epoch, compute bf16 ({on}PyTorch under torch.autocast; "
                      f"/proc/cpuinfo: {cpu_bf16_flags()})")
                print(f"{'model':8} {'batch':>5} {'threads':>7} {'dtrain bf16':>11} {'PyTorch bf16':>12} "
                      f"{'diff (points)':>14} {'dtrain fp32':>11} {'bf16 - fp32 (points)':>20}")
            gain = f"{100 * (d - f):+20.1f}" if d is not None and f is not None else f"{'-':>20}"
            print(f"{model:8} {batch:5d} {threads:7d} {show(d, 11)} {show(p, 12)} {diff} {show(f, 11)} {gain}",
                  flush=True)
            row.update({"dtrain_fp32": f, "bf16_minus_fp32": 100 * (d - f) if d is not None and f is not None
                        else None})
        else:
            print(f"{model:8} {batch:5d} {threads:7d} {show(d)} {show(p)} {diff}", flush=True)
        table.append(row)
    if a.plot and not write_plot(a, table, "test accuracy after one epoch", ",".join(isas)):
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
    p.add_argument("--compute_dtype", choices=["fp32", "bf16"], default="fp32",
                   help="bf16: dtrain --compute_dtype=bf16 against PyTorch under torch.autocast(bfloat16), with "
                        "dtrain fp32 launched beside as the baseline (default fp32)")
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
    if a.compute_dtype == "bf16":
        print(f"compare_pytorch: compute bf16; /proc/cpuinfo: {cpu_bf16_flags()}", file=sys.stderr)
    return accuracy(a, configs) if a.accuracy else throughput(a, configs)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
