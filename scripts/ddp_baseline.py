#!/usr/bin/python3
"""PyTorch DistributedDataParallel (gloo) on one of dtrain's built-in models: the all-reduce peer of a dtrain cluster.

Starts --ranks processes on 127.0.0.1, each training the same model as worker/models/<model>.cc (defined once, in
scripts/compare_pytorch.py: same layers, initialization and optimizer as dtrain's defaults) on its shard of
Fashion-MNIST held in memory, with --batch_size examples per rank per step and --threads threads per rank
(OMP_NUM_THREADS, torch.set_num_threads, the OpenMP OpenBLAS: see ../shared/BENCHMARKS.md). Every rank runs
--examples / (ranks x batch_size) steps, as a dtrain sync cluster of that many workers does; the first
--warmup_steps are not timed. --ranks=1 --no_ddp is plain PyTorch in one process (the baseline of a scaling
efficiency). --evaluate: rank 0 then evaluates the test set (10,000 examples), as dtrain's chief does at the end.

--rank=R runs only rank R of --ranks (alias --world_size), which meet at --master_addr:--master_port (rank 0's
address; its TCP store listens there): one process per emulated host (scripts/netns_hosts.sh, as
scripts/compare_cluster_sizes.py --netns --ddp does; set GLOO_SOCKET_IFNAME=eth0 there). The process re-executes
itself under Debian's python with the OpenMP OpenBLAS and dtrain's malloc settings where it was not started so.

Rank 0 prints (the phases, on one timeline: start = process start to the first training step, the slowest rank's;
train = from then until the last rank's last step; evaluate = the final evaluation, 0 without --evaluate):

  ddp_baseline: model=cnn ranks=2 threads=1 batch=50 ddp=1 steps=200 examples/sec=1190.3 blas=openblas-openmp
  ddp_baseline: test accuracy = 0.7712 (10000 examples)          (with --evaluate)
  ddp_baseline: phases: start 2.113 s, train 8.402 s, evaluate 0.951 s

  scripts/ddp_baseline.py --model=cnn --ranks=2 --batch_size=50 --examples=20000 --threads=1
  scripts/ddp_baseline.py --model=cnn --ranks=1 --no_ddp --batch_size=50 --examples=20000 --evaluate
  scripts/ddp_baseline.py --model=cnn --ranks=2 --rank=1 --master_addr=10.77.0.1 --master_port=29500   # one rank

Needs (Debian): python3-torch libopenblas0-openmp python3-numpy dataset-fashion-mnist (scripts/install_deps.sh
with DTRAIN_WITH_TORCH=1).
"""
import argparse
import datetime
import os
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare_pytorch as cp  # noqa: E402  (the models, data and environment, defined once)

LINE = "ddp_baseline: model={model} ranks={ranks} threads={threads} batch={batch} ddp={ddp} steps={steps} " \
       "examples/sec={eps:.1f} blas={blas}"
PHASES = "ddp_baseline: phases: start {start:.3f} s, train {train:.3f} s, evaluate {evaluate:.3f} s"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def process_age():
    """Seconds since this process started (the kernel's start time: it counts the interpreter's own start-up and
    a re-exec, which keeps the process), to the kernel clock tick (10 ms)."""
    with open("/proc/self/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22: start time in ticks since boot
    return time.clock_gettime(time.CLOCK_BOOTTIME) - started


def ensure_environment(a):
    """Re-executes this script under Debian's python with the OpenMP OpenBLAS, OMP_NUM_THREADS and dtrain's malloc
    settings unless it already runs so (a rank started directly, as compare_cluster_sizes --netns starts them)."""
    ok = (os.path.realpath(sys.executable) == os.path.realpath(cp.DEBIAN_PYTHON) and
          os.environ.get("LD_LIBRARY_PATH", "").split(":")[0] == cp.OPENBLAS_OPENMP and
          os.environ.get("OMP_NUM_THREADS") == str(a.threads) and cp.torch_blas.malloc_tuned())
    if ok:
        return
    if os.environ.get("COMPARE_PYTORCH_REEXEC"):
        sys.exit("ddp_baseline: could not set up PyTorch's environment (re-exec did not take)")
    os.execve(cp.DEBIAN_PYTHON, [cp.DEBIAN_PYTHON, os.path.abspath(__file__)] + sys.argv[1:],
              cp.torch_env(a.threads, "cpu", COMPARE_PYTORCH_REEXEC="1"))


def evaluate(torch, model, tx, ty):
    """Test accuracy on the test set (tx, ty), in batches of 1000."""
    model.eval()
    correct = 0
    with torch.no_grad():
        for i in range(0, len(tx), 1000):
            correct += int((model(tx[i:i + 1000]).argmax(1) == ty[i:i + 1000]).sum())
    return correct / len(tx), len(tx)


def rank_main(a):
    """One rank: trains its shard; rank 0 prints the aggregate rate (every rank's examples over the slowest), the
    test accuracy with --evaluate, and the phases."""
    ensure_environment(a)
    torch = cp.import_torch(a.threads)
    blas = cp.torch_blas.require_openblas_openmp("ddp_baseline.py", allow_other=True)  # labelled if another
    import torch.distributed as dist
    ddp = not a.no_ddp
    if ddp:
        dist.init_process_group("gloo", init_method="tcp://%s:%d" % (a.master_addr, a.master_port),
                                world_size=a.ranks, rank=a.rank, timeout=datetime.timedelta(seconds=300))
    torch.manual_seed(1)  # every rank starts from the same weights (DDP also broadcasts rank 0's)
    model, decay_groups = cp.build_model(torch, a.model)
    opt = cp.make_optimizer(torch, a.model, decay_groups)
    net = torch.nn.parallel.DistributedDataParallel(model) if ddp else model
    x, y = cp.load_fashion_mnist(torch, a.data_dir, "train")
    x, y = x[a.rank::a.ranks], y[a.rank::a.ranks]  # this rank's shard
    if a.evaluate and a.rank == 0:
        # Read before training, as dtrain's chief reads its test set at start: the evaluation phase only evaluates.
        tx, ty = cp.load_fashion_mnist(torch, a.data_dir, "t10k")
    n = x.shape[0]
    steps = max(1, a.examples // (a.ranks * a.batch_size))
    warmup = min(a.warmup_steps, max(0, steps - 1))
    net.train()
    pos = 0
    start = None
    start_secs = process_age()
    first = time.perf_counter()
    for s in range(steps):
        if s == warmup:
            if ddp:
                dist.barrier()
            start = time.perf_counter()
        if pos + a.batch_size > n:
            pos = 0
        cp.train_step(torch, net, opt, x[pos:pos + a.batch_size], y[pos:pos + a.batch_size])
        pos += a.batch_size
    if ddp:
        dist.barrier()
    end = time.perf_counter()
    secs, end_secs = end - start, start_secs + (end - first)
    timed = (steps - warmup) * a.batch_size
    if ddp:
        # The cluster's rate: every rank's examples over the slowest rank's time; its phases: until every rank was
        # training, then until the last one's last step.
        t = torch.tensor([secs, start_secs, end_secs], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        secs, start_secs, end_secs = (float(v) for v in t)
        # Every rank is past its last collective: rank 0 goes on alone, as dtrain's chief evaluates alone.
        dist.barrier()
    eval_secs = 0.0
    if a.rank == 0:
        print(LINE.format(model=a.model, ranks=a.ranks, threads=a.threads, batch=a.batch_size, ddp=int(ddp),
                          steps=steps, eps=timed * a.ranks / secs, blas=blas), flush=True)
        if a.evaluate:
            t0 = time.perf_counter()
            accuracy, count = evaluate(torch, model, tx, ty)
            eval_secs = time.perf_counter() - t0
            print("ddp_baseline: test accuracy = %.4f (%d examples)" % (accuracy, count), flush=True)
        print(PHASES.format(start=start_secs, train=end_secs - start_secs, evaluate=eval_secs), flush=True)
    if ddp:
        # As dlrm_pytorch.py leaves: out without tearing DDP and gloo down (PyTorch 1.13 at times hangs for good in
        # a rank's teardown after training).
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="cnn", choices=sorted(cp.MODELS))
    ap.add_argument("--ranks", "--world_size", dest="ranks", type=int, default=2, help="processes (world size)")
    ap.add_argument("--batch_size", type=int, default=50)
    ap.add_argument("--examples", type=int, default=20000, help="training examples over all ranks")
    ap.add_argument("--threads", type=int, default=1, help="threads per rank")
    ap.add_argument("--warmup_steps", type=int, default=10)
    ap.add_argument("--no_ddp", action="store_true", help="plain PyTorch (needs --ranks=1)")
    ap.add_argument("--evaluate", action="store_true", help="rank 0 evaluates the test set after training")
    ap.add_argument("--data_dir", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--timeout_secs", type=int, default=1800, help="the launcher's bound on its ranks")
    ap.add_argument("--rank", type=int, default=-1, help="run only this rank (0..ranks-1); without it, launch all")
    ap.add_argument("--master_addr", default="127.0.0.1", help="with --rank: rank 0's address")
    ap.add_argument("--master_port", "--port", dest="master_port", type=int, default=0,
                    help="with --rank and more than one rank: the port of rank 0's store")
    a = ap.parse_args()
    if a.ranks < 1 or a.batch_size < 1 or a.examples < 1 or a.threads < 1:
        ap.error("--ranks, --batch_size, --examples and --threads must be positive")
    if a.no_ddp and a.ranks != 1:
        ap.error("--no_ddp runs one process: --ranks=1")
    if a.rank >= 0:
        if a.rank >= a.ranks:
            ap.error("--rank=%d is not one of the %d ranks (0..%d)" % (a.rank, a.ranks, a.ranks - 1))
        if not a.no_ddp and not 0 < a.master_port < 65536:
            ap.error("--rank needs --master_port (1..65535): where rank 0's store listens")
        return rank_main(a)
    if a.rank < -1:
        ap.error("--rank must be 0..ranks-1, got %d" % a.rank)
    # The launcher: one process per rank, each under Debian's python with the OpenMP OpenBLAS.
    port = free_port()
    env = cp.torch_env(a.threads, "cpu", COMPARE_PYTORCH_REEXEC="1")
    own = ("--rank=", "--master_port=", "--port=", "--master_addr=")
    base = [cp.DEBIAN_PYTHON, os.path.abspath(__file__)] + [x for x in sys.argv[1:] if not x.startswith(own)]
    procs = [subprocess.Popen(base + ["--rank=%d" % r, "--master_port=%d" % port, "--master_addr=127.0.0.1"],
                              env=env) for r in range(a.ranks)]
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
