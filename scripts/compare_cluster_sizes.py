#!/usr/bin/env python3
"""Trains the same model on the same number of examples in local mode and on local clusters of 1 ps with
1, 2, 4... workers, sync and async, and prints a table: configuration, wall-clock seconds, training seconds,
examples/sec, speed-up over local, final test accuracy. With --plot FILE.png draws the figures (needs
matplotlib: run with /usr/bin/python3 on Debian).

  scripts/compare_cluster_sizes.sh --model=mlp --examples=200000 --sizes=1,2 --modes=sync,async
Extra arguments after -- go to every worker (e.g. -- --threads=1).
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(cmd, log):
    t0 = time.time()
    with open(log, "w") as f:
        rc = subprocess.call(cmd, stdout=f, stderr=subprocess.STDOUT)
    return rc, time.time() - t0


def parse_logs(logdir, pattern_files):
    examples, train_secs, acc = 0, 0.0, None
    for name in pattern_files:
        path = os.path.join(logdir, name)
        if not os.path.exists(path):
            continue
        text = open(path).read()
        for m in re.finditer(r"worker \d+: (\d+) local steps, (\d+) examples in ([0-9.]+) sec", text):
            examples += int(m.group(2))
            train_secs = max(train_secs, float(m.group(3)))
        m = re.search(r"test accuracy = ([0-9.]+) \(", text)
        if m:
            acc = float(m.group(1))
    return examples, train_secs, acc


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="mlp")
    ap.add_argument("--batch_size", type=int, default=100)
    ap.add_argument("--examples", type=int, default=200000, help="training examples in every configuration")
    ap.add_argument("--sizes", default="1,2", help="worker counts, e.g. 1,2,4")
    ap.add_argument("--modes", default="sync,async")
    ap.add_argument("--num_ps", type=int, default=1)
    ap.add_argument("--plot", default="", help="write a PNG plot here")
    ap.add_argument("--bin", default=os.environ.get("DTRAIN_BIN", os.path.join(ROOT, "build", "bin")))
    ap.add_argument("worker_args", nargs="*")
    a = ap.parse_args()
    sizes = [int(s) for s in a.sizes.split(",") if s]
    modes = [m for m in a.modes.split(",") if m]
    common = ["--model=%s" % a.model, "--batch_size=%d" % a.batch_size, "--log_every=1000000"] + a.worker_args
    env = dict(os.environ, DTRAIN_BIN=a.bin)
    rows = []
    work = tempfile.mkdtemp(prefix="dtrain_compare.")

    steps_local = max(1, a.examples // a.batch_size)
    logdir = os.path.join(work, "local")
    os.makedirs(logdir)
    rc, wall = run([os.path.join(a.bin, "dtrain_worker"), "--job_name=local",
                    "--train_steps=%d" % steps_local] + common, os.path.join(logdir, "worker_0.log"))
    ex, secs, acc = parse_logs(logdir, ["worker_0.log"])
    rows.append(("local", 0, rc, wall, secs, ex, acc))
    print("done: local (%.1f s)" % wall, file=sys.stderr)

    for mode in modes:
        for n in sizes:
            # Sync: one global step consumes n batches; async: one batch per step.
            steps = max(1, a.examples // (a.batch_size * (n if mode == "sync" else 1)))
            logdir = os.path.join(work, "%s_%d" % (mode, n))
            cmd = [os.path.join(ROOT, "scripts", "run_local_cluster.sh"), "--ps", str(a.num_ps), "--workers", str(n),
                   "--logdir", logdir, "--", "--mode=%s" % mode, "--train_steps=%d" % steps] + common
            t0 = time.time()
            with open(os.path.join(work, "%s_%d.out" % (mode, n)), "w") as f:
                rc = subprocess.call(cmd, stdout=f, stderr=subprocess.STDOUT, env=env)
            wall = time.time() - t0
            ex, secs, acc = parse_logs(logdir, ["worker_%d.log" % i for i in range(n)] +
                                       ["worker_%d.err" % i for i in range(n)])
            rows.append(("%s, %d ps, %d worker%s" % (mode, a.num_ps, n, "s" if n > 1 else ""), n, rc, wall, secs,
                         ex, acc))
            print("done: %s %d workers (%.1f s)" % (mode, n, wall), file=sys.stderr)

    base_eps = rows[0][5] / rows[0][4] if rows[0][4] > 0 else 0
    print("\nmodel %s, batch %d per worker, %d examples per configuration (logs: %s)" %
          (a.model, a.batch_size, a.examples, work))
    hdr = "%-26s %9s %9s %13s %9s %9s" % ("configuration", "wall_s", "train_s", "examples/sec", "vs local",
                                          "accuracy")
    print(hdr)
    print("-" * len(hdr))
    ok = True
    for name, n, rc, wall, secs, ex, acc in rows:
        eps = ex / secs if secs > 0 else 0
        print("%-26s %9.1f %9.1f %13.1f %8.2fx %9s%s" % (name, wall, secs, eps, eps / base_eps if base_eps else 0,
                                                         "%.4f" % acc if acc is not None else "-",
                                                         "" if rc == 0 else "  (FAILED rc=%d)" % rc))
        ok = ok and rc == 0
    if a.plot:
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            print("no matplotlib: run with /usr/bin/python3 (apt-get install python3-matplotlib)", file=sys.stderr)
            return 0 if ok else 1
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
        ax1.axhline(rows[0][3], color="gray", linestyle="--", label="local")
        ax2.axhline(rows[0][5] / max(rows[0][4], 1e-9), color="gray", linestyle="--", label="local")
        for mode in modes:
            pts = [(r[1], r[3], r[5] / max(r[4], 1e-9)) for r in rows[1:] if r[0].startswith(mode)]
            ax1.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=mode)
            ax2.plot([p[0] for p in pts], [p[2] for p in pts], "o-", label=mode)
        ax1.set_xlabel("workers"); ax1.set_ylabel("wall-clock seconds"); ax1.legend(); ax1.set_xticks(sizes)
        ax2.set_xlabel("workers"); ax2.set_ylabel("examples/sec"); ax2.legend(); ax2.set_xticks(sizes)
        fig.suptitle("dtrain %s: %d examples, batch %d" % (a.model, a.examples, a.batch_size))
        fig.tight_layout()
        fig.savefig(a.plot, dpi=100)
        print("plot written to %s" % a.plot)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
