#!/usr/bin/env python3
"""dlrm in dtrain against the same model in PyTorch 1.13, with equal resources on both sides, in the same run:

  one process, --threads threads each
    dtrain local (dtrain_worker --job_name=local)            PyTorch, sparse=True embeddings + sparse Adagrad
  the same cores for a cluster: --workers workers (PyTorch: ranks), --threads threads a process, batch --batch_size
  a worker, so the global batch is workers x batch on both sides
    dtrain --num_ps ps + --workers sync workers              PyTorch DDP over gloo, sparse=True (sparse all-reduce)
                                                              PyTorch: dense layers in DDP, tables by all_gather
                                                              [--with_ddp_dense] PyTorch DDP, dense embedding
                                                              gradients (every table whole: a reference, not a peer)

Both sides are timed the same way: examples/sec of the training steps only (every process already started, its data
in memory), in windows of --window steps after --warmup_windows untimed ones, the median window (a cluster's window:
every worker's examples, summed). Each configuration is launched --repeats times, interleaved (dtrain local, PyTorch
sparse, dtrain cluster, PyTorch DDP, ...; then again), and the median launch is reported with every launch and the
ratio dtrain / PyTorch of the medians. The dtrain cluster runs 4 processes on the cores that PyTorch's 2 ranks use:
the same machine for both, so its ps tasks' work counts against it.

  scripts/compare_dlrm.py --data_dir=/tmp/ctr --table_rows=1000000 --batch_size=512 --examples=200000

Data: Criteo text (train.txt, test.txt), e.g. `build/bin/dtrain_convert --synthetic_ctr --examples=1000000
--out=/tmp/ctr`. PyTorch runs under /usr/bin/python3 on the OpenMP OpenBLAS (scripts/torch_blas.py checks it in
every launch: another BLAS is an error unless --any_blas); scripts/install_deps.sh installs python3-torch and
libopenblas0-openmp. Memory: PyTorch holds every table whole with its Adagrad state (26 x rows x dim x 8 bytes) in
every rank; dtrain's ps tasks only the rows touched. --json FILE writes every launch's figures. Exit 2 on a bad flag.
"""
import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_blas  # noqa: E402

RATE = re.compile(r"^step (\d+), loss = [0-9.naif-]+ \(([0-9.]+) examples/sec", re.M)
DESIGNS = {  # name -> (label, group, side)
    "local": ("dtrain local", "one", "dtrain"),
    "sparse": ("PyTorch sparse=True + Adagrad", "one", "torch"),
    "cluster": (None, "cluster", "dtrain"),
    "ddp": (None, "cluster", "torch"),
    "allgather": (None, "cluster", "torch"),
    "ddp_dense": (None, "cluster", "torch"),
}


def free_ports(n):
    out = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "free_ports.py"), str(n)],
                         capture_output=True, text=True, check=True).stdout
    return [int(p) for p in out.strip().split(",")]


def window_rates(log_text, warmup_windows):
    """The rate of each window a worker printed, after the warm-up ones."""
    return [float(m.group(2)) for m in RATE.finditer(log_text)][warmup_windows:]


def run_dtrain(a, cluster, work, tag):
    """One dtrain launch: the median window's examples/sec (every worker's, summed per window)."""
    model = ["--model=dlrm", "--data_dir=" + a.data_dir, "--data_format=criteo", "--table_rows=%d" % a.table_rows,
             "--embedding_dim=%d" % a.embedding_dim, "--batch_size=%d" % a.batch_size, "--threads=%d" % a.threads,
             "--log_every=%d" % a.window, "--seed=1"]
    env = torch_blas.torch_env(a.threads)  # OMP_NUM_THREADS as PyTorch gets it
    procs, logs = [], []
    if not cluster:
        steps = a.examples // a.batch_size
        logs.append(os.path.join(work, tag + ".local.log"))
        cmd = [os.path.join(a.bin, "dtrain_worker"), "--job_name=local", "--train_steps=%d" % steps] + model
        procs.append(subprocess.Popen(cmd, stdout=open(logs[-1], "w"), stderr=subprocess.STDOUT, env=env))
    else:
        steps = a.examples // (a.batch_size * a.workers)
        ports = free_ports(a.num_ps + a.workers)
        hosts = ["--ps_hosts=" + ",".join("127.0.0.1:%d" % p for p in ports[:a.num_ps]),
                 "--worker_hosts=" + ",".join("127.0.0.1:%d" % p for p in ports[a.num_ps:])]
        for i in range(a.num_ps):
            log = os.path.join(work, "%s.ps%d.log" % (tag, i))
            procs.append(subprocess.Popen([os.path.join(a.bin, "dtrain_ps"), "--job_name=ps", "--task_index=%d" % i]
                                          + hosts, stdout=open(log, "w"), stderr=subprocess.STDOUT, env=env))
        for i in range(a.workers):
            logs.append(os.path.join(work, "%s.w%d.log" % (tag, i)))
            cmd = [os.path.join(a.bin, "dtrain_worker"), "--job_name=worker", "--task_index=%d" % i, "--mode=sync",
                   "--train_steps=%d" % steps] + hosts + model
            procs.append(subprocess.Popen(cmd, stdout=open(logs[-1], "w"), stderr=subprocess.STDOUT, env=env))
    deadline = time.time() + a.timeout
    failed = []
    for p in procs:
        try:
            code = p.wait(timeout=max(1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            p.kill()
            code = "timeout"
        if code != 0:
            failed.append(str(code))
    if failed:
        tails = "".join("--- %s\n%s" % (l, "".join(open(l).readlines()[-5:])) for l in logs)
        sys.exit("compare_dlrm: dtrain %s failed (exit %s)\n%s" % (tag, ", ".join(failed), tails))
    per_worker = [window_rates(open(l).read(), a.warmup_windows) for l in logs]
    n = min(len(r) for r in per_worker)
    if n == 0:
        sys.exit("compare_dlrm: dtrain %s printed no timed window (more --examples, or fewer --warmup_windows)" % tag)
    windows = [sum(r[k] for r in per_worker) for k in range(n)]
    return {"examples_per_sec": statistics.median(windows), "windows": windows}


def run_torch(a, mode, work, tag):
    ranks = 1 if mode == "sparse" else a.workers
    steps = a.examples // (a.batch_size * ranks)
    if mode == "ddp_dense":
        steps = min(steps, a.ddp_dense_steps)
    cmd = [torch_blas.DEBIAN_PYTHON, os.path.join(REPO, "scripts", "dlrm_pytorch.py"), "--mode=" + mode,
           "--ranks=%d" % ranks, "--data_dir=" + a.data_dir, "--table_rows=%d" % a.table_rows,
           "--dim=%d" % a.embedding_dim, "--batch_size=%d" % a.batch_size, "--threads=%d" % a.threads,
           "--train_examples=%d" % a.examples, "--steps=%d" % steps, "--window=%d" % a.window,
           "--warmup=%d" % (a.window * a.warmup_windows), "--timeout=%d" % a.timeout]
    if mode == "ddp_dense":
        cmd[-3:-1] = ["--window=2", "--warmup=2"]
    if a.any_blas:
        cmd.append("--any_blas")
    # Its own session, so that a launch past --timeout is ended whole (mp.spawn's ranks too): SIGTERM first, which
    # makes every rank print its stack (dlrm_pytorch.py), then SIGKILL.
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=torch_blas.torch_env(a.threads), start_new_session=True)
    try:
        stdout, stderr = p.communicate(timeout=a.timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGTERM)
        try:
            stdout, stderr = p.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            stdout, stderr = p.communicate()
        sys.stderr.write(stderr[-6000:])
        sys.exit("compare_dlrm: PyTorch %s did not finish within --timeout=%d s (its stacks above)" % (tag, a.timeout))
    if p.returncode != 0:
        sys.stderr.write(stderr[-3000:])
        sys.exit("compare_dlrm: PyTorch %s failed (exit %d)" % (tag, p.returncode))
    out = json.loads([l for l in stdout.splitlines() if l.strip().startswith("{")][-1])
    return {"examples_per_sec": out["examples_per_sec"], "windows": out["window_rates"], "blas": out["blas"],
            "torch": out["torch"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data_dir", required=True, help="Criteo train.txt and test.txt")
    ap.add_argument("--table_rows", type=int, default=1000000)
    ap.add_argument("--embedding_dim", type=int, default=16)
    ap.add_argument("--batch_size", type=int, default=512, help="a process's (a worker's, a rank's) batch")
    ap.add_argument("--examples", type=int, default=200000, help="trained by each launch (all workers together)")
    ap.add_argument("--threads", type=int, default=1, help="threads of every process, both sides")
    ap.add_argument("--workers", type=int, default=2, help="dtrain workers = PyTorch ranks")
    ap.add_argument("--num_ps", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3, help="launches of each configuration, interleaved")
    ap.add_argument("--window", type=int, default=10, help="steps per timing window")
    ap.add_argument("--warmup_windows", type=int, default=2, help="untimed windows at the start of every launch")
    ap.add_argument("--designs", default="local,sparse,cluster,ddp,allgather",
                    help="comma list of local, sparse, cluster, ddp, allgather, ddp_dense")
    ap.add_argument("--with_ddp_dense", action="store_true", help="add ddp_dense (short: --ddp_dense_steps)")
    ap.add_argument("--ddp_dense_steps", type=int, default=12)
    ap.add_argument("--any_blas", action="store_true", help="let PyTorch run on another BLAS (labelled)")
    ap.add_argument("--timeout", type=int, default=3600, help="seconds a launch may take")
    ap.add_argument("--json", default="", help="write every launch's figures here")
    ap.add_argument("--bin", default=os.environ.get("DTRAIN_BIN", os.environ.get("DTRAIN_BIN_DIR",
                                                                                    os.path.join(REPO, "build/bin"))))
    a = ap.parse_args()
    for name in ("table_rows", "embedding_dim", "batch_size", "examples", "threads", "workers", "num_ps", "repeats",
                 "window", "ddp_dense_steps"):
        if getattr(a, name) < 1:
            ap.error("--%s must be a positive integer, got %d" % (name, getattr(a, name)))
    if a.warmup_windows < 0:
        ap.error("--warmup_windows must be >= 0")
    designs = [d for d in a.designs.split(",") if d]
    if a.with_ddp_dense and "ddp_dense" not in designs:
        designs.append("ddp_dense")
    for d in designs:
        if d not in DESIGNS:
            ap.error("--designs: unknown '%s' (%s)" % (d, ", ".join(DESIGNS)))
    if not any(os.path.exists(os.path.join(a.data_dir, f)) for f in ("train.txt", "train.txt.gz")):
        ap.error("no train.txt in %s (dtrain_convert --synthetic_ctr writes one)" % a.data_dir)
    for b in ("dtrain_ps", "dtrain_worker"):
        if not os.access(os.path.join(a.bin, b), os.X_OK):
            ap.error("%s is not built (--bin=DIR)" % os.path.join(a.bin, b))
    if subprocess.run([torch_blas.DEBIAN_PYTHON, "-c", "import torch"], capture_output=True).returncode != 0:
        ap.error("%s cannot import torch (scripts/install_deps.sh installs python3-torch)" % torch_blas.DEBIAN_PYTHON)
    for d in designs:
        ranks = 1 if DESIGNS[d][1] == "one" else a.workers
        if d != "ddp_dense" and a.examples // (a.batch_size * ranks) < a.window * (a.warmup_windows + 1):
            ap.error("--examples=%d gives %s only %d steps: fewer than --window x (--warmup_windows + 1) = %d"
                     % (a.examples, d, a.examples // (a.batch_size * ranks), a.window * (a.warmup_windows + 1)))

    labels = {
        "local": "dtrain local",
        "sparse": "PyTorch sparse=True + Adagrad",
        "cluster": "dtrain %d ps + %d sync workers" % (a.num_ps, a.workers),
        "ddp": "PyTorch DDP %d ranks, sparse=True, gloo" % a.workers,
        "allgather": "PyTorch %d ranks, tables by all_gather" % a.workers,
        "ddp_dense": "PyTorch DDP %d ranks, dense tables (reference)" % a.workers,
    }
    work = tempfile.mkdtemp(prefix="dtrain_compare_dlrm.")
    launches = {d: [] for d in designs}
    for r in range(a.repeats):
        for d in designs:
            tag = "%s_%d" % (d, r)
            print("== launch %d/%d: %s" % (r + 1, a.repeats, labels[d]), file=sys.stderr, flush=True)
            if DESIGNS[d][2] == "dtrain":
                launches[d].append(run_dtrain(a, d == "cluster", work, tag))
            else:
                launches[d].append(run_torch(a, d, work, tag))
    subprocess.run(["rm", "-rf", work])

    med = {d: statistics.median(x["examples_per_sec"] for x in launches[d]) for d in designs}
    blas = sorted({x["blas"] for d in designs for x in launches[d] if "blas" in x})
    torch_version = sorted({x["torch"] for d in designs for x in launches[d] if "torch" in x})
    tables = 26
    layout = os.path.join(a.data_dir, "criteo_layout.txt")
    if os.path.exists(layout):
        tables = int(dict(t.split("=") for t in open(layout).read().split()).get("num_sparse", 26))
    print("dlrm: %d tables x %d rows x %d, batch %d a process, %d examples a launch; %d launches of each, "
          "interleaved; examples/sec: the median window of %d steps after %d warm-up windows (a cluster: every "
          "worker's), the median launch" % (tables, a.table_rows, a.embedding_dim, a.batch_size, a.examples, a.repeats,
                                             a.window, a.warmup_windows))

    def row(d, peer=None):
        ratio = "dtrain x %.2f" % (med[peer] / med[d]) if peer in med and d != peer else ""
        print("  %-46s %12.1f  %-12s  launches %s" % (labels[d], med[d], ratio,
                                                       ", ".join("%.1f" % x["examples_per_sec"] for x in launches[d])))
    one = [d for d in designs if DESIGNS[d][1] == "one"]
    if one:
        print("one process, %d thread%s each (equal resources):" % (a.threads, "s" if a.threads > 1 else ""))
        for d in one:
            row(d, "local")
    many = [d for d in designs if DESIGNS[d][1] == "cluster"]
    if many:
        print("a cluster on the same cores: %d workers / ranks, %d thread%s a process, global batch %d "
              "(dtrain's %d ps tasks run on those cores too):" % (a.workers, a.threads, "s" if a.threads > 1 else "",
                                                                  a.workers * a.batch_size, a.num_ps))
        for d in many:
            row(d, "cluster")
    print("PyTorch %s on %s" % (", ".join(torch_version) or "-", ", ".join(blas) or "-"))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"medians": med, "launches": launches, "labels": {d: labels[d] for d in designs},
                       "blas": blas, "args": vars(a)}, f, indent=1)


if __name__ == "__main__":
    main()
