#!/usr/bin/python3
"""dtrain's dense optimizers update as PyTorch's do, step by step, on real ps tasks.

1. Exact updates: random initial values (two variables, placed on two ps tasks) and random gradients per step and
   per worker go through dtrain_optimizer_replay (real ParameterServers and WorkerClients, in process or over
   gRPC on 127.0.0.1); PyTorch's optimizer and learning-rate scheduler take the same gradients. Every value after
   every step must agree within 1e-5 relative (to max(1, |value|)). Covered: SGD with L2 weight decay and StepLR,
   SGD momentum with ExponentialLR, Nesterov with weight decay and LinearLR warmup then CosineAnnealingLR
   (SequentialLR; PyTorch's cosine rises again after T_max where dtrain's stays at its floor, so the cases end
   by then), Adam (torch.optim.Adam: pytorch_adam) with weight decay, AdamW with warmup + cosine, Adagrad
   with TensorFlow's defaults (torch.optim.Adagrad with initial_accumulator_value=0.1, eps=0) and with PyTorch's,
   RMSprop (torch.optim.RMSprop, centered, momentum), and TensorFlow's forms PyTorch lacks (adam, rmsprop),
   written out below (TFAdam, TFRMSProp) from tf.train's formulas. Gradient clipping by global norm
   (torch.nn.utils.clip_grad_norm_) on two ps tasks: sync with two workers (each worker's gradient clipped, then
   averaged), async with two workers (each push a step of its own), over gRPC, and across a checkpoint restart
   (the tasks restored from step 12 go on as if never stopped: slots and the schedule's step come back).
2. As a user runs it: dtrain_worker --job_name=local trains an MLP exported from PyTorch (examples/export_mlp.py)
   with --optimizer=adamw --weight_decay --lr_schedule=cosine --warmup_steps --clip_norm, with
   --optimizer=pytorch_rmsprop --momentum --lr_schedule=step, and with --optimizer=momentum --nesterov
   --weight_decay --clip_norm; PyTorch trains the module with the same optimizer, scheduler and clipping on the
   same batches: every step's loss within 1e-4 relative (forward/backward rounding differs).
   Skipped part when Fashion-MNIST is missing.

Exit 77 (skipped) without PyTorch or numpy. Runs with /usr/bin/python3 (Debian's torch 1.13).

  /usr/bin/python3 tests/optimizers_pytorch_test.py [--bin build/bin] [--steps 30]
"""
import argparse
import gzip
import json
import math
import os
import struct
import subprocess
import sys
import tempfile
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = "/usr/share/datasets/fashion-mnist"

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
except ImportError as e:  # the CI machine installs them (scripts/install_deps.sh)
    print("SKIP: %s (apt-get install python3-torch python3-numpy)" % e)
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples"))
from loss_comparison import compare_losses, run  # noqa: E402

SIZES = (700, 600)  # two variables: one on each of two ps tasks


class TFAdam(torch.optim.Optimizer):
    """tf.train.AdamOptimizer (dtrain's "adam"): var -= lr_t m / (sqrt(v) + eps), lr_t = lr sqrt(1-b2^t)/(1-b1^t)."""

    def __init__(self, params, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            b1, b2 = group["betas"]
            for p in group["params"]:
                state = self.state[p]
                if not state:
                    state["t"], state["m"], state["v"] = 0, torch.zeros_like(p), torch.zeros_like(p)
                state["t"] += 1
                t = state["t"]
                g = p.grad.add(p, alpha=group["weight_decay"]) if group["weight_decay"] else p.grad
                state["m"].mul_(b1).add_(g, alpha=1 - b1)
                state["v"].mul_(b2).addcmul_(g, g, value=1 - b2)
                lr_t = group["lr"] * math.sqrt(1 - b2 ** t) / (1 - b1 ** t)
                p.sub_(lr_t * state["m"] / (state["v"].sqrt() + group["eps"]))


class TFRMSProp(torch.optim.Optimizer):
    """tf.train.RMSPropOptimizer (dtrain's "rmsprop"): ms starts at 1, epsilon inside the sqrt, the learning rate
    inside the momentum: ms = rho ms + (1-rho) g^2 (centered: mg likewise, ms - mg^2), mom = momentum mom +
    lr g / sqrt(ms + eps), var -= mom."""

    def __init__(self, params, lr, rho=0.9, momentum=0.0, eps=1e-10, centered=False):
        super().__init__(params, dict(lr=lr, rho=rho, momentum=momentum, eps=eps, centered=centered))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            rho, mu = group["rho"], group["momentum"]
            for p in group["params"]:
                state = self.state[p]
                if not state:
                    state["ms"], state["mom"], state["mg"] = torch.ones_like(p), torch.zeros_like(p), torch.zeros_like(p)
                g = p.grad
                state["ms"].mul_(rho).addcmul_(g, g, value=1 - rho)
                denom = state["ms"]
                if group["centered"]:
                    state["mg"].mul_(rho).add_(g, alpha=1 - rho)
                    denom = state["ms"] - state["mg"] * state["mg"]
                update = g * group["lr"] / (denom + group["eps"]).sqrt()
                if mu > 0:
                    state["mom"].mul_(mu).add_(update)
                    p.sub_(state["mom"])
                else:
                    p.sub_(update)


def make_scheduler(opt, s):
    """The schedule dtrain's fields describe, as PyTorch's schedulers (None: constant)."""
    sched = s.get("lr_schedule", "exponential")
    decay = None
    if sched == "cosine":
        decay = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=s["decay_steps"],
                                                           eta_min=s.get("min_learning_rate", 0.0))
    elif s.get("decay_steps", 0) > 0 and s.get("staircase"):
        decay = torch.optim.lr_scheduler.StepLR(opt, step_size=s["decay_steps"], gamma=s["decay_rate"])
    elif s.get("decay_steps", 0) == 1:
        decay = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=s["decay_rate"])
    warm = s.get("warmup_steps", 0)
    if warm > 0:
        # LinearLR needs a start factor > 0.
        linear = torch.optim.lr_scheduler.LinearLR(opt, start_factor=s["warmup_start_factor"], total_iters=warm)
        if decay is None:
            return linear
        return torch.optim.lr_scheduler.SequentialLR(opt, [linear, decay], milestones=[warm])
    return decay


# (label, dtrain's optimizer fields, PyTorch's optimizer for a parameter list, mode, workers, transport, restart)
def cases():
    T = torch.optim
    return [
        ("sgd_l2_steplr", dict(name="sgd", learning_rate=0.05, weight_decay=0.01, decay_steps=7, decay_rate=0.5,
                               staircase=True),
         lambda p: T.SGD(p, lr=0.05, weight_decay=0.01)),
        ("momentum_exponentiallr", dict(name="momentum", learning_rate=0.02, momentum=0.9, decay_steps=1,
                                        decay_rate=0.95),
         lambda p: T.SGD(p, lr=0.02, momentum=0.9)),
        ("nesterov_l2_warmup_cosine", dict(name="momentum", learning_rate=0.02, momentum=0.8, nesterov=True,
                                           weight_decay=1e-3, warmup_steps=5, warmup_start_factor=0.2,
                                           lr_schedule="cosine", decay_steps=25, min_learning_rate=0.001),
         lambda p: T.SGD(p, lr=0.02, momentum=0.8, nesterov=True, weight_decay=1e-3)),
        ("pytorch_adam_l2", dict(name="pytorch_adam", learning_rate=0.01, weight_decay=0.01),
         lambda p: T.Adam(p, lr=0.01, weight_decay=0.01)),
        ("adam_tensorflow", dict(name="adam", learning_rate=0.01), lambda p: TFAdam(p, lr=0.01)),
        ("adamw_warmup_cosine", dict(name="adamw", learning_rate=0.01, warmup_steps=4, warmup_start_factor=0.25,
                                     lr_schedule="cosine", decay_steps=26),
         lambda p: T.AdamW(p, lr=0.01)),  # AdamW's default weight decay 0.01 is dtrain's default for adamw
        ("adagrad_tensorflow", dict(name="adagrad", learning_rate=0.1),
         lambda p: T.Adagrad(p, lr=0.1, initial_accumulator_value=0.1, eps=0.0)),
        ("pytorch_adagrad_l2", dict(name="pytorch_adagrad", learning_rate=0.1, weight_decay=0.01),
         lambda p: T.Adagrad(p, lr=0.1, weight_decay=0.01)),
        ("pytorch_rmsprop", dict(name="pytorch_rmsprop", learning_rate=0.01), lambda p: T.RMSprop(p, lr=0.01)),
        ("pytorch_rmsprop_centered_momentum_l2",
         dict(name="pytorch_rmsprop", learning_rate=0.01, centered=True, momentum=0.9, weight_decay=0.01),
         lambda p: T.RMSprop(p, lr=0.01, centered=True, momentum=0.9, weight_decay=0.01)),
        ("rmsprop_tensorflow_centered_momentum",
         dict(name="rmsprop", learning_rate=0.01, centered=True, momentum=0.9, epsilon=1e-6),
         lambda p: TFRMSProp(p, lr=0.01, centered=True, momentum=0.9, eps=1e-6)),
        # Clipping by the global norm over both ps tasks' variables, each worker's gradient.
        ("adamw_clip_sync_2workers", dict(name="adamw", learning_rate=0.01, clip_norm=1.0),
         lambda p: T.AdamW(p, lr=0.01), "sync", 2),
        ("momentum_clip_async_2workers", dict(name="momentum", learning_rate=0.02, clip_norm=2.0),
         lambda p: T.SGD(p, lr=0.02, momentum=0.9), "async", 2),
        ("pytorch_rmsprop_clip_grpc", dict(name="pytorch_rmsprop", learning_rate=0.01, momentum=0.5, clip_norm=1.5),
         lambda p: T.RMSprop(p, lr=0.01, momentum=0.5), "sync", 2, "grpc"),
        ("rmsprop_clip_warmup_cosine_restart",
         dict(name="pytorch_rmsprop", learning_rate=0.01, centered=True, momentum=0.9, clip_norm=1.0,
              warmup_steps=3, warmup_start_factor=0.5, lr_schedule="cosine", decay_steps=27),
         lambda p: T.RMSprop(p, lr=0.01, centered=True, momentum=0.9), "sync", 2, "inprocess", 12),
        ("adamw_cosine_restart", dict(name="adamw", learning_rate=0.01, weight_decay=0.05, lr_schedule="cosine",
                                      decay_steps=30, clip_norm=3.0),
         lambda p: T.AdamW(p, lr=0.01, weight_decay=0.05), "sync", 1, "inprocess", 12),
    ]


def reference(fields, make_opt, mode, workers, initial, grads):
    """PyTorch on the same gradients: the parameters after each update."""
    params = [torch.nn.Parameter(torch.from_numpy(x.copy())) for x in np.split(initial, [SIZES[0]])]
    opt = make_opt(params)
    sched = make_scheduler(opt, fields)
    clip = fields.get("clip_norm", 0.0)
    out = []

    def clipped(flat):
        parts = [torch.from_numpy(x.copy()) for x in np.split(flat, [SIZES[0]])]
        if clip > 0:
            holders = [torch.nn.Parameter(torch.zeros_like(x)) for x in parts]
            for h, x in zip(holders, parts):
                h.grad = x
            torch.nn.utils.clip_grad_norm_(holders, clip)
            parts = [h.grad for h in holders]
        return parts

    def update(parts):
        for p, g in zip(params, parts):
            p.grad = g.clone()
        opt.step()
        if sched is not None:
            sched.step()
        out.append(np.concatenate([p.detach().numpy().copy() for p in params]))

    for step in grads:
        if mode == "sync":
            each = [clipped(np.asarray(g, np.float32)) for g in step]
            update([sum(ws) / len(each) for ws in zip(*each)] if len(each) > 1 else each[0])
        else:
            for g in step:
                update(clipped(np.asarray(g, np.float32)))
    return out


def check_updates(args, work, failures):
    rng = np.random.default_rng(5)
    n = sum(SIZES)
    worst = 0.0
    for case in cases():
        label, fields, make_opt = case[:3]
        mode, workers, transport, restart = (list(case[3:]) + ["sync", 1, "inprocess", 0][len(case) - 3:])[:4]
        initial = rng.uniform(-1, 1, n).astype(np.float32)
        # Gradients of every size (1e-3 .. 1 per element, norms ~ 10 so that clipping bites), signs flipping.
        scale = (10.0 ** (np.arange(n) % 4 - 3)).astype(np.float32)
        grads = [[(rng.uniform(-1, 1, n).astype(np.float32) * scale * np.float32(rng.uniform(0.5, 3)))
                  for _ in range(workers)] for _ in range(args.steps)]
        spec = dict(optimizer=fields, mode=mode, num_ps=2, num_workers=workers, transport=transport,
                    variables=[["a", SIZES[0]], ["b", SIZES[1]]], initial=initial.tolist(),
                    gradients=[[g.tolist() for g in step] for step in grads], restart_after=restart)
        path = os.path.join(work, label + ".json")
        with open(path, "w") as f:
            json.dump(spec, f)
        got_path = os.path.join(work, label + ".out.json")
        run([os.path.join(args.bin, "dtrain_optimizer_replay"), "--input=" + path, "--output=" + got_path])
        with open(got_path) as f:
            got = [np.asarray(x, np.float64) for x in json.load(f)["params"]]
        want = reference(fields, make_opt, mode, workers, initial, grads)
        if len(got) != len(want):
            failures.append("%s: %d updates recorded, PyTorch made %d" % (label, len(got), len(want)))
            continue
        rel = max(float(np.max(np.abs(g - w) / np.maximum(1.0, np.abs(w)))) for g, w in zip(got, want))
        moved = float(np.max(np.abs(want[-1] - initial)))
        worst = max(worst, rel)
        print("%-40s %s %d worker(s) %-9s %2d updates: max difference %.1e (values moved by up to %.2f)" %
              (label, mode, workers, transport, len(got), rel, moved))
        if rel > 1e-5:
            k = next(i for i, (g, w) in enumerate(zip(got, want))
                     if float(np.max(np.abs(g - w) / np.maximum(1.0, np.abs(w)))) == rel)
            failures.append("%s: update %d differs from PyTorch's by %.2e relative (> 1e-5)" % (label, k + 1, rel))
        if moved < 1e-3:
            failures.append("%s: the values hardly moved (%.1e): the comparison would prove nothing" % (label, moved))
    print("exact updates: largest difference from PyTorch %.1e (bound 1e-5)" % worst)


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    magic, count = struct.unpack(">II", data[:8])
    if magic == 2051:
        rows, cols = struct.unpack(">II", data[8:16])
        return np.frombuffer(data, np.uint8, offset=16).reshape(count, rows * cols)
    return np.frombuffer(data, np.uint8, offset=8).astype(np.int64)


def check_training(args, work, failures):
    import onnx
    from onnx import numpy_helper
    from export_mlp import MLP, export
    batch = 50
    x = torch.from_numpy(read_idx(os.path.join(DATA, "train-images-idx3-ubyte.gz"))[: args.steps * batch]
                         .astype(np.float32) * np.float32(1.0 / 255.0))
    y = torch.from_numpy(read_idx(os.path.join(DATA, "train-labels-idx1-ubyte.gz"))[: args.steps * batch])
    torch.manual_seed(1)
    path = os.path.join(work, "mlp.onnx")
    export(MLP(), torch.zeros(1, 784), path)
    T = torch.optim
    runs = [
        ("mlp/adamw_cosine_warmup_clip",
         ["--optimizer=adamw", "--learning_rate=0.002", "--weight_decay=0.05", "--lr_schedule=cosine",
          "--warmup_steps=5", "--warmup_start_factor=0.1", "--clip_norm=0.5"],
         lambda p: T.AdamW(p, lr=0.002, weight_decay=0.05),
         dict(lr_schedule="cosine", decay_steps=args.steps - 5, warmup_steps=5, warmup_start_factor=0.1), 0.5),
        # Not centered here: centered RMSprop divides by sqrt(E[g^2] - E[g]^2), which cancels where a gradient
        # hardly varies, and amplifies rounding (PyTorch's own fp32 and fp64 runs of this MLP differ by 2.6e-4 in
        # 30 steps); part 1 checks it exactly, on the same gradients.
        ("mlp/pytorch_rmsprop_momentum_steplr",
         ["--optimizer=pytorch_rmsprop", "--learning_rate=0.001", "--momentum=0.9",
          "--lr_schedule=step", "--decay_steps=10", "--decay_rate=0.5"],
         lambda p: T.RMSprop(p, lr=0.001, momentum=0.9),
         dict(decay_steps=10, decay_rate=0.5, staircase=True), 0.0),
        ("mlp/nesterov_l2",
         ["--optimizer=momentum", "--learning_rate=0.05", "--nesterov", "--weight_decay=1e-3", "--clip_norm=1"],
         lambda p: T.SGD(p, lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-3), {}, 1.0),
    ]
    for tag, flags, make_opt, schedule, clip in runs:
        metrics = os.path.join(work, tag.replace("/", "_") + ".csv")
        run([os.path.join(args.bin, "dtrain_worker"), "--job_name=local", "--model=" + path,
             "--train_steps=%d" % args.steps, "--batch_size=%d" % batch, "--shuffle=false", "--threads=1",
             "--log_every=1000000", "--metrics_file=" + metrics, "--data_dir=" + DATA] + flags)
        with open(metrics) as f:
            dtrain_losses = [float(line.split(",")[1]) for line in f.read().splitlines()[1:]]
        module = MLP()
        inits = {t.name: torch.from_numpy(numpy_helper.to_array(t).copy()) for t in onnx.load(path).graph.initializer}
        module.load_state_dict({k: inits[k] for k in module.state_dict()}, strict=True)
        module.train()
        opt = make_opt(module.parameters())
        sched = make_scheduler(opt, schedule)
        torch_losses = []
        for k in range(args.steps):
            opt.zero_grad()
            loss = F.cross_entropy(module(x[k * batch:(k + 1) * batch]), y[k * batch:(k + 1) * batch])
            loss.backward()
            if clip > 0:
                torch.nn.utils.clip_grad_norm_(module.parameters(), clip)
            opt.step()
            if sched is not None:
                sched.step()
            torch_losses.append(loss.item())
        compare_losses(tag, dtrain_losses, torch_losses, failures, width=32)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "bin"))
    ap.add_argument("--steps", type=int, default=30)
    args = ap.parse_args()
    torch.set_num_threads(1)
    # SequentialLR steps the next scheduler with an epoch at its milestone, which PyTorch 1.13 warns about.
    warnings.filterwarnings("ignore", message="The epoch parameter")
    work = tempfile.mkdtemp(prefix="dtrain_optimizers_pytorch.")
    failures = []
    check_updates(args, work, failures)
    if os.path.exists(os.path.join(DATA, "train-images-idx3-ubyte.gz")):
        check_training(args, work, failures)
    else:
        print("part 2 skipped: %s is missing (apt-get install dataset-fashion-mnist)" % DATA)
    if failures:
        print("FAIL:\n  " + "\n  ".join(failures))
        sys.exit(1)
    print("PASS")


if __name__ == "__main__":
    main()
