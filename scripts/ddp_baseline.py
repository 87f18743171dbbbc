#!/usr/bin/python3
"""PyTorch DistributedDataParallel (gloo) on one of dtrain's built-in models: the all-reduce peer of a dtrain cluster.

Starts --ranks processes on 127.0.0.1, each training the same model as worker/models/<model>.cc (defined once, in
scripts/compare_pytorch.py: same layers, initialization and optimizer as dtrain's defaults) on its shard of
Fashion-MNIST held in memory, with --batch_size examples per rank per step and --threads threads per rank
(OMP_NUM_THREADS, torch.set_num_threads, the OpenMP OpenBLAS: see ../shared/BENCHMARKS.md). Every rank runs
--examples / (ranks x batch_size) steps, as a dtrain sync cluster of that many workers does; the first
--warmup_steps are not timed. --ranks=1 --no_ddp is plain PyTorch in one process (the baseline of a scaling
efficiency). Prints one line:

  ddp_baseline: model=cnn ranks=2 threads=1 batch=50 ddp=1 steps=200 examples/sec=1190.3 blas=openblas-openmp

  scripts/ddp_baseline.py --model=cnn --ranks=2 --batch_size=50 --examples=20000 --threads=1
  scripts/ddp_baseline.py --model=cnn --ranks=1 --no_ddp --batch_size=50 --examples=20000

Needs (Debian): python3-torch libopenblas0-openmp python3-numpy dataset-fashion-mnist (scripts/install_deps.sh
with DTRAIN_WITH_TORCH=1).
"""
import argparse
import os
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare_pytorch as cp  # noqa: E402  (the models, data and environment, defined once)

LINE = "ddp_baseline: model={model} ranks={ranks} threads={threads} batch={batch} ddp={ddp} steps={steps} " \
       "examples/sec={eps:.1f} blas={blas}"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_main(a):
    """One rank: trains its shard; rank 0 prints the aggregate rate (every rank's examples over the slowest)."""
    torch = cp.import_torch(a.threads)
    blas = cp.torch_blas.require_openblas_openmp("ddp_baseline.py", allow_other=True)  # labelled if another
    import torch.distributed as dist
    ddp = not a.no_ddp
    if ddp:
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % a.port, world_size=a.ranks,
                                rank=a.rank, timeout=__import__("datetime").timedelta(seconds=300))
    torch.manual_seed(1)  # every rank starts from the same weights (DDP also broadcasts rank 0's)
    model, decay_groups = cp.build_model(torch, a.model)
    opt = cp.make_optimizer(torch, a.model, decay_groups)
    if ddp:
        model = torch.nn.parallel.DistributedDataParallel(model)
    x, y = cp.load_fashion_mnist(torch, a.data_dir, "train")
    x, y = x[a.rank::a.ranks], y[a.rank::a.ranks]  # this rank's shard
    n = x.shape[0]
    steps = max(1, a.examples // (a.ranks * a.batch_size))
    warmup = min(a.warmup_steps, max(0, steps - 1))
    model.train()
    pos = 0
    start = None
    for s in range(steps):
        if s == warmup:
            if ddp:
                dist.barrier()
            start = time.perf_counter()
        if pos + a.batch_size > n:
            pos = 0
        cp.train_step(torch, model, opt, x[pos:pos + a.batch_size], y[pos:pos + a.batch_size])
        pos += a.batch_size
    if ddp:
        dist.barrier()
    secs = time.perf_counter() - start
    timed = (steps - warmup) * a.batch_size
    if ddp:
        # The cluster's rate: every rank's examples over the slowest rank's time.
        t = torch.tensor([secs], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        secs = float(t[0])
    if a.rank == 0:
        print(LINE.format(model=a.model, ranks=a.ranks, threads=a.threads, batch=a.batch_size, ddp=int(ddp),
                          steps=steps, eps=timed * a.ranks / secs, blas=blas), flush=True)
    if ddp:
        # As dlrm_pytorch.py leaves: every rank is past its last collective, then out without tearing DDP and gloo
        # down (PyTorch 1.13 at times hangs for good in a rank's teardown after training).
        dist.barrier()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="cnn", choices=sorted(cp.MODELS))
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--batch_size", type=int, default=50)
    ap.add_argument("--examples", type=int, default=20000, help="training examples over all ranks")
    ap.add_argument("--threads", type=int, default=1, help="threads per rank")
    ap.add_argument("--warmup_steps", type=int, default=10)
    ap.add_argument("--no_ddp", action="store_true", help="plain PyTorch (needs --ranks=1)")
    ap.add_argument("--data_dir", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--timeout_secs", type=int, default=1800)
    ap.add_argument("--rank", type=int, default=-1, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.ranks < 1 or a.batch_size < 1 or a.examples < 1 or a.threads < 1:
        ap.error("--ranks, --batch_size, --examples and --threads must be positive")
    if a.no_ddp and a.ranks != 1:
        ap.error("--no_ddp runs one process: --ranks=1")
    if a.rank >= 0:
        return rank_main(a)
    # The launcher: one process per rank, each under Debian's python with the OpenMP OpenBLAS.
    port = free_port()
    env = cp.torch_env(a.threads, "cpu", COMPARE_PYTORCH_REEXEC="1")
    base = [cp.DEBIAN_PYTHON, os.path.abspath(__file__)] + [x for x in sys.argv[1:] if not x.startswith(("--rank=", "--port="))]
    procs = [subprocess.Popen(base + ["--rank=%d" % r, "--port=%d" % port], env=env) for r in range(a.ranks)]
    deadline = time.time() + a.timeout_secs
    rc = 0
    for p in procs:
        try:
            rc = rc or p.wait(timeout=max(1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            rc = 124
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()
    if rc != 0:
        print("ddp_baseline: a rank failed (exit %d)" % rc, file=sys.stderr)
    return rc


if __name__ == "__main__":
    sys.exit(main())
