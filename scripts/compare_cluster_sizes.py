#!/usr/bin/python3
"""Trains the same model on the same number of examples in local mode and on clusters of --num_ps ps tasks with
1, 2, 4... workers, sync and async, and prints a table: configuration, wall-clock seconds, training seconds,
examples/sec, speed-up over local, scaling efficiency (examples/sec / (workers x local examples/sec)), seconds
to --target_accuracy, final test accuracy. Writes the table as CSV and JSON and its picture (a PNG drawn with
matplotlib: Debian's /usr/bin/python3) beside --plot FILE.png or at --out PREFIX (PREFIX.csv/.json/.png); a
picture that cannot be drawn is an error (exit 1, after the table is written).

Clusters run on 127.0.0.1 (scripts/run_local_cluster.sh) or, with --netns, across emulated hosts in network
namespaces (scripts/netns_hosts.sh; root): every ps task and every worker on its own host (with --colocate_ps
no ps hosts: each worker's host runs a ps task too, as many as workers), links optionally
capped with --bandwidth=RATE (tc tbf, e.g. 1gbit), so a slow link's effect on sync vs async shows; with
--latency=MS every link also delays each packet MS (a round trip 2 x MS), and with --host_cpus=F every host gets
F cores of its own (a cgroup CPU quota), so that more processes than the machine has cores still each compute
on their own share (docs/emulated_hosts.md). With --netns every configuration runs on such equal hosts: local mode
and plain PyTorch on one, DDP with one rank per host.

The wall-clock in parts: start (launch until every worker is training: the largest of the workers' process start
to first step), train (from then until the last worker's last step), evaluate (the chief's final evaluation;
DDP's rank 0 evaluates the same test set, ddp_baseline --evaluate) and end (the rest, until every process has
exited). They come from each worker's "worker K: phases: ..." line and ddp_baseline's; a worker that prints only
"worker K: N local steps, ..." gives train alone ("-" for the others). With --netns the wall-clock runs from the
first process's launch to the last one's exit (the hosts' set-up and removal are not in it).

Time to accuracy: the chief evaluates every --eval_every global steps and prints
"step N: test accuracy = X at T sec"; the first T with X >= --target_accuracy is the configuration's time to
accuracy (or the whole training time if only the final evaluation reaches it).

A model with sparse embedding tables (--model=dlrm, on click-through-rate data: --data_dir, --data_format and
its shape flags are passed to every worker) reports test AUC and log loss instead of accuracy (--target_accuracy
is then an AUC), and two more columns from the chief's "sparse tables:" line: the rows held at the end (summed
over the ps tasks and tables) and the bytes the ps tasks received and sent per global step.

  scripts/compare_cluster_sizes.sh --model=mlp --examples=200000 --sizes=1,2 --modes=sync,async \\
      --target_accuracy=0.8 --eval_every=100 --out=/tmp/sizes
  scripts/compare_cluster_sizes.sh --netns --bandwidth=1gbit --model=mlp --sizes=1,2
  scripts/compare_cluster_sizes.sh --model=lenet5.onnx --examples=100000 --sizes=1,2   # an ONNX file
  scripts/compare_cluster_sizes.sh --model=dlrm --data_dir=/tmp/ctr --table_rows=100000 --batch_size=512 \\
      --examples=200000 --sizes=1,2 --num_ps=2
--transport (auto | grpc | shm) goes to every ps task and worker (auto: shared memory between processes on one
host, gRPC across hosts; see docs/speed.md). --ddp adds PyTorch DistributedDataParallel (gloo,
scripts/ddp_baseline.py) on the same built-in model, batch per rank, threads per process (the workers' --threads)
and examples: one plain PyTorch process, the baseline of DDP's own scaling efficiency, and DDP with as many ranks
as each cluster size has workers; the dtrain sync rows then show their rate against DDP's. --repeats=N runs every
configuration N times, interleaved (A B C A B C ...), and reports each one's median launch.

--profile_out=FILE writes the profile of one more local run (dtrain_worker --profile_out: what it costs by layer,
the updates, the transports' CPU; not a row of the table), and --predict puts scripts/plan_cluster.py's prediction
from that profile alone beside every cluster row (examples/sec, its error against the measurement, the wall-clock,
what bounds it) and as dashed curves in the plot (docs/planner.md).

--schedule=0:1,20:2,40:4,60:2 (seconds since the job's launch : workers) runs, after the fixed-size runs of each
count in it, one elastic job on 127.0.0.1 whose workers join and leave at those times (scripts/elastic_schedule.py):
it prints its steady examples/sec at each count against the fixed run's (the ratio), each join's latency, and plots
its examples/sec over time (--window_secs windows) with the changes marked and the fixed runs as reference lines.

  scripts/compare_cluster_sizes.sh --model=cnn --examples=20000 --schedule=0:1,25:2,50:1 --out=/tmp/el -- --threads=1

Extra arguments after -- go to every worker (e.g. -- --threads=1).
"""
import argparse
import csv
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import elastic_schedule  # noqa: E402  (beside this script)
import plotting  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NETNS = os.path.join(ROOT, "scripts", "netns_hosts.sh")
EVAL_LINE = re.compile(r"^step (\d+): test accuracy = ([0-9.]+) at ([0-9.]+) sec$", re.M)
FINAL_LINE = re.compile(r"^step (\d+): test accuracy = ([0-9.]+) \(\d+ examples\)$", re.M)
# Models with one logit (dlrm): AUC takes the place of accuracy.
EVAL_LINE_AUC = re.compile(r"^step (\d+): test log loss = ([0-9.]+), AUC = ([0-9.]+) at ([0-9.]+) sec$", re.M)
FINAL_LINE_AUC = re.compile(
    r"^step (\d+): test log loss = ([0-9.]+), AUC = ([0-9.]+), accuracy = ([0-9.]+) \(\d+ examples\)$", re.M)
SPARSE_LINE = re.compile(r"^sparse tables: (\d+) rows held on \d+ ps tasks?; (\d+) bytes/step", re.M)
# dtrain_worker's data and dlrm shape flags, passed through to every worker.
DATA_FLAGS = ("data_dir", "data_format", "embedding_dim", "dlrm_bottom", "dlrm_top", "table_rows", "max_rows",
              "admit_after")
WORKER_LINE = re.compile(r"worker (\d+): (\d+) local steps, (\d+) examples in ([0-9.]+) sec")
# Each worker's (and ddp_baseline's rank 0's) wall-clock parts: process start to the first training step, first to
# last step, the final evaluation (0 without one).
PHASES = r"phases: start ([0-9.]+) s, train ([0-9.]+) s, evaluate ([0-9.]+) s$"
WORKER_PHASES_LINE = re.compile(r"^worker (\d+): " + PHASES, re.M)
DDP_PHASES_LINE = re.compile(r"^ddp_baseline: " + PHASES, re.M)
DDP_LINE = re.compile(r"^ddp_baseline: .* examples/sec=([0-9.]+) blas=(\S+)", re.M)
DDP_ACCURACY_LINE = re.compile(r"^ddp_baseline: test accuracy = ([0-9.]+) \(\d+ examples\)$", re.M)
DDP_MODELS = ("mlp", "cnn", "convnet", "cifar10")


def run_bounded(cmd, log, timeout, env=None):
    """Runs cmd in its own process group, output to log; kills the group after timeout. Returns (rc, secs)."""
    t0 = time.time()
    with open(log, "w") as f:
        p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            rc = p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            f.write("\ncompare_cluster_sizes: killed after %d s\n" % timeout)
            rc = 124
    return rc, time.time() - t0


def parse_logs(logdir, names, target):
    """What the workers' logs say: a dict with examples, secs (training seconds of the slowest worker, from
    "N local steps ... in T sec"), accuracy (final; AUC for models with one logit), t_acc (seconds to the target
    accuracy), sparse ({"log_loss", "rows_held", "bytes_per_step"} for sparse models, else empty) and phases
    ({"start", "train", "evaluate"} on one timeline: start = until every worker was training, the largest start;
    train = from then until the last worker's last step, the largest start + train less start; evaluate = the
    largest; None where no worker printed a phases line, train then from the "local steps" line)."""
    examples, train_secs, acc, t_acc, chief_secs, sparse = 0, 0.0, None, None, None, {}
    starts, ends, evaluates = [], [], []
    for name in names:
        path = os.path.join(logdir, name)
        if not os.path.exists(path):
            continue
        text = open(path, errors="replace").read()
        for m in WORKER_LINE.finditer(text):
            examples += int(m.group(3))
            train_secs = max(train_secs, float(m.group(4)))
            if m.group(1) == "0":
                chief_secs = float(m.group(4))
        for m in WORKER_PHASES_LINE.finditer(text):
            start, train, evaluate = (float(v) for v in m.groups()[1:])
            starts.append(start)
            ends.append(start + train)
            evaluates.append(evaluate)
        m = FINAL_LINE.search(text)
        if m:
            acc = float(m.group(2))
        m = FINAL_LINE_AUC.search(text)
        if m:
            acc, sparse["log_loss"] = float(m.group(3)), float(m.group(2))
        m = SPARSE_LINE.search(text)
        if m:
            sparse["rows_held"], sparse["bytes_per_step"] = int(m.group(1)), int(m.group(2))
        if target is not None and t_acc is None:
            evals = [(float(m.group(2)), float(m.group(3))) for m in EVAL_LINE.finditer(text)]
            evals += [(float(m.group(3)), float(m.group(4))) for m in EVAL_LINE_AUC.finditer(text)]
            t_acc = next((secs for value, secs in evals if value >= target), None)
    if target is not None and t_acc is None and acc is not None and acc >= target:
        t_acc = chief_secs
    phases = {"start": None, "train": None, "evaluate": None}
    if starts:
        phases = {"start": max(starts), "train": max(ends) - max(starts), "evaluate": max(evaluates)}
    elif examples > 0:
        phases["train"] = train_secs  # before the phases line: training time from the "local steps" line
    return {"examples": examples, "secs": train_secs, "accuracy": acc, "t_acc": t_acc, "sparse": sparse,
            "phases": phases}


def wall_parts(wall, phases):
    """The row's start_secs, train_secs, evaluate_secs, end_secs: end is what the parts leave of the wall-clock
    (None while start or evaluate is unknown)."""
    start, train, evaluate = phases["start"], phases["train"], phases["evaluate"]
    end = None
    if None not in (start, train, evaluate):
        end = wall - start - train - evaluate
    rnd = (lambda v: None if v is None else round(v, 3))
    return {"start_secs": rnd(start), "train_secs": rnd(train), "evaluate_secs": rnd(evaluate), "end_secs": rnd(end)}


class EmulatedHosts:
    """`count` emulated hosts with the run's settings (scripts/netns_hosts.sh up; down when the block ends), and the
    launch of one command on each. Used as a context manager:

      with EmulatedHosts(a, 3, "sync_2") as hosts:
          rc, wall = hosts.run([cmd0, cmd1, cmd2], [log0, log1, log2], timeout)
    """

    warned = set()  # netns_hosts.sh's warnings, each shown once

    def __init__(self, a, count, tag):
        # Unique per run (DTRAIN_COMPARE_NETNS_PREFIX lets a test name them and find what is left of them).
        self.name = "%s-%s" % (os.environ.get("DTRAIN_COMPARE_NETNS_PREFIX") or "dtcmp%d" % os.getpid(), tag)
        self.count = count
        self.up = [NETNS, "up", self.name, str(count)] + netns_options(a)
        self.addrs = []
        self.settings = ""

    def __enter__(self):
        out = subprocess.run(self.up, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)
        if out.returncode != 0:
            subprocess.run([NETNS, "down", self.name], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                           timeout=120)
            sys.exit("compare_cluster_sizes: cannot create the emulated hosts (%s): %s"
                     % (" ".join(self.up[3:]), (out.stderr + out.stdout).strip()))
        for warning in out.stderr.strip().split("\n"):
            if warning and warning not in EmulatedHosts.warned:  # e.g. more hosts x cores than the machine has
                EmulatedHosts.warned.add(warning)
                print("compare_cluster_sizes: " + warning, file=sys.stderr)
        self.addrs = [line.split()[1] for line in out.stdout.split("\n") if line.strip()]
        info = subprocess.run([NETNS, "info", self.name], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.settings = info.stdout.strip()
        return self

    def __exit__(self, *exc):
        subprocess.run([NETNS, "down", self.name], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, timeout=120)
        return False

    def run(self, cmds, logs, timeout, env=None, on=None):
        """Runs cmds[k] on host k (or on host on[k]: its namespace and CPU group), output to logs[k]. Returns (the
        worst exit code, seconds from the first launch to the last exit). Stops the others when one fails (they
        could wait for it forever) and all at the deadline (124)."""
        procs = []
        t0 = time.time()
        try:
            for k, (cmd, log) in enumerate(zip(cmds, logs)):
                host = k if on is None else on[k]
                with open(log, "w") as f:
                    procs.append(subprocess.Popen([NETNS, "exec", self.name, str(host)] + cmd, stdout=f,
                                                  stderr=subprocess.STDOUT, env=env))
            deadline = t0 + timeout
            while any(p.poll() is None for p in procs):
                if time.time() > deadline:
                    return 124, time.time() - t0
                if any(p.poll() not in (None, 0) for p in procs):
                    break
                time.sleep(0.05)
            wall = time.time() - t0
            failed = [p.returncode for p in procs if p.poll() not in (None, 0)]  # before we stop the rest
            for p in procs:
                if p.poll() is None:
                    p.terminate()
            for p in procs:
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
            return (failed[0] if failed else next((p.returncode for p in procs if p.returncode != 0), 0)), wall
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()


def netns_options(a):
    """The options of scripts/netns_hosts.sh up for this run's hosts."""
    opts = []
    if a.bandwidth:
        opts.append("--bandwidth=" + a.bandwidth)
    if a.host_cpus is not None:
        opts.append("--host_cpus=%g" % a.host_cpus)
    if a.latency is not None:
        opts.append("--latency=%g" % a.latency)
    return opts


def run_netns_cluster(a, n, mode_args, logdir, timeout, tag):
    """One ps per ps host and one worker per worker host, in network namespaces; with --colocate_ps, n hosts each
    running worker k and ps task k. Returns (the worst exit code, seconds from the first launch to the last exit,
    the hosts' settings)."""
    if a.colocate_ps:
        with EmulatedHosts(a, n, tag) as h:
            # The ps tasks on port 2223 of the workers' hosts: a worker reaches its own host's task through shared
            # memory, the others over TCP lanes (--transport=auto).
            cluster = ["--ps_hosts=" + ",".join("%s:2223" % addr for addr in h.addrs),
                       "--worker_hosts=" + ",".join("%s:2222" % addr for addr in h.addrs)]
            cmds, logs, on = [], [], []
            for k in range(n):
                cmds.append([os.path.join(a.bin, "dtrain_ps"), "--job_name=ps", "--task_index=%d" % k,
                             "--transport=%s" % a.transport] + cluster)
                logs.append(os.path.join(logdir, "ps_%d.log" % k))
                on.append(k)
            for k in range(n):
                cmds.append([os.path.join(a.bin, "dtrain_worker"), "--job_name=worker", "--task_index=%d" % k]
                            + cluster + mode_args)
                logs.append(os.path.join(logdir, "worker_%d.log" % k))
                on.append(k)
            rc, wall = h.run(cmds, logs, timeout, on=on)
            return rc, wall, h.settings
    hosts = a.num_ps + n
    with EmulatedHosts(a, hosts, tag) as h:
        ps_hosts = ",".join("%s:2222" % addr for addr in h.addrs[:a.num_ps])
        worker_hosts = ",".join("%s:2222" % addr for addr in h.addrs[a.num_ps:])
        cluster = ["--ps_hosts=" + ps_hosts, "--worker_hosts=" + worker_hosts]
        cmds, logs = [], []
        for k in range(hosts):
            if k < a.num_ps:
                cmds.append([os.path.join(a.bin, "dtrain_ps"), "--job_name=ps", "--task_index=%d" % k,
                             "--transport=%s" % a.transport] + cluster)
                logs.append(os.path.join(logdir, "ps_%d.log" % k))
            else:
                cmds.append([os.path.join(a.bin, "dtrain_worker"), "--job_name=worker",
                             "--task_index=%d" % (k - a.num_ps)] + cluster + mode_args)
                logs.append(os.path.join(logdir, "worker_%d.log" % (k - a.num_ps)))
        rc, wall = h.run(cmds, logs, timeout)
        return rc, wall, h.settings


def predict_rows(rows, meta, profile_path):
    """Puts scripts/plan_cluster.py's prediction beside every dtrain cluster row (the planner_accuracy mapping of a
    result's settings to the planner's arguments), from the local run's profile alone."""
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    import plan_cluster  # noqa: E402  (beside this script)
    import planner_accuracy  # noqa: E402

    def unpredictable(row, e):  # the row keeps '-' (e.g. more ps tasks than the profile placed)
        print("compare_cluster_sizes: --predict: %s: %s" % (row["configuration"], e), file=sys.stderr)

    try:
        profile = plan_cluster.load_profile(profile_path)
        predicted = planner_accuracy.evaluate([(0.0, profile)], [("this run", {"settings": meta, "rows": rows})],
                                              unpredictable=unpredictable)
    except plan_cluster.PlanError as e:
        print("compare_cluster_sizes: --predict: %s" % e, file=sys.stderr)
        return
    by_name = {p["configuration"]: p for p in predicted if p["mode"] != "local"}
    for r in rows:
        p = by_name.get(r["configuration"])
        if r["system"] != "dtrain" or p is None:
            continue
        r["predicted_examples_per_sec"] = round(p["predicted"], 1)
        r["prediction_error"] = round(p["error"], 4)
        r["predicted_wall_secs"] = None if p["wall_predicted"] is None else round(p["wall_predicted"], 2)
        r["predicted_bound"] = p["bound"]


def run_schedule(a, schedule, common, mode, fixed_rows, work):
    """--schedule: the elastic job after the fixed-size runs (scripts/elastic_schedule.py), its progress lines often
    enough for the windows (about 10 a second at the fixed one-worker rate) and its steps more than it can reach.
    Returns the analysis with the job's exit_code, max_workers, log_every and logdir."""
    fixed = {n: r["examples_per_sec"] for n, r in fixed_rows.items() if r["examples_per_sec"] > 0}
    fastest = max(list(fixed.values()) + [1.0])
    tail = a.schedule_tail_secs if a.schedule_tail_secs is not None else elastic_schedule.default_tail(schedule)
    total = schedule[-1][0] + tail
    logdir = os.path.join(work, "elastic")
    os.makedirs(logdir)
    o = elastic_schedule.JobOptions(
        bin=a.bin, num_ps=a.num_ps, transport=a.transport, worker_args=["--mode=%s" % mode] + common,
        batch_size=a.batch_size, log_every=max(1, int(0.1 * fixed.get(min(fixed), fastest) / a.batch_size)
                                               if fixed else 1),
        train_steps=int(10 * (total + 60) * fastest / a.batch_size) + 10000, tail_secs=tail,
        timeout_secs=min(a.timeout_secs, total + 300), free_ports=os.path.join(ROOT, "scripts", "free_ports.py"))
    job = elastic_schedule.run_job(o, schedule, logdir)
    r = elastic_schedule.analyse(job, schedule, a.window_secs, fixed)
    r.update({"exit_code": job["exit_code"], "max_workers": job["max_workers"], "log_every": job["log_every"],
              "logdir": logdir, "exit_codes": {"ps": job["ps"], "workers": [
                  {"task": w["task"], "exit_code": w["exit_code"]} for w in job["workers"]]}})
    print("done: the elastic job, --schedule=%s (%.1f s, rc %d)" % (a.schedule, job["t_stop"], job["exit_code"]),
          file=sys.stderr)
    return r


def write_table(rows, prefix, meta, sparse, elastic=None):
    keys = ["configuration", "system", "mode", "workers", "exit_code", "wall_secs", "train_secs", "examples",
            "examples_per_sec", "speedup_vs_local", "scaling_efficiency", "vs_ddp", "secs_to_target_accuracy",
            "final_accuracy", "start_secs", "evaluate_secs", "end_secs", "predicted_examples_per_sec",
            "prediction_error", "predicted_wall_secs", "predicted_bound"]
    if sparse:  # final_accuracy holds the AUC
        keys += ["final_log_loss", "rows_held", "bytes_per_step"]
    with open(prefix + ".csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        for r in rows:
            w.writerow({k: ("" if r[k] is None else r[k]) for k in keys})
    with open(prefix + ".json", "w") as f:
        doc = {"settings": meta, "rows": rows}
        if elastic:  # --schedule: the elastic job's windows, changes, sizes against the fixed runs, joins
            doc["elastic"] = elastic
        json.dump(doc, f, indent=2)
    if elastic:  # its table: PREFIX.elastic.csv
        keys = ["workers", "fixed_examples_per_sec", "elastic_examples_per_sec", "ratio", "steady_secs", "windows"]
        with open(prefix + ".elastic.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=keys, extrasaction="ignore")
            w.writeheader()
            for r in elastic["sizes"]:
                w.writerow({k: ("" if r[k] is None else r[k]) for k in keys})
    print("table written to %s.csv%s and %s.json" % (prefix, " (the elastic job's: %s.elastic.csv)" % prefix
                                                     if elastic else "", prefix))


def plot(rows, sizes, modes, path, title, target):
    """Draws the table's picture at `path`; plotting.PlotError when it cannot."""
    plt = plotting.pyplot(path)
    local = rows[0]
    panels = 4 if target is not None else 3
    fig, axes = plt.subplots(1, panels, figsize=(4.2 * panels, 4))
    ax_wall, ax_eps, ax_eff = axes[0], axes[1], axes[2]
    ax_wall.axhline(local["wall_secs"], color="gray", linestyle="--", label="local")
    ax_eps.axhline(local["examples_per_sec"], color="gray", linestyle="--", label="local")
    ax_eps.plot(sizes, [n * local["examples_per_sec"] for n in sizes], color="black", linestyle=":",
                label="ideal (linear)")
    ax_eff.axhline(1.0, color="black", linestyle=":", label="ideal")
    for mode in modes:
        pts = [r for r in rows[1:] if r["mode"] == mode and r["workers"] > 0]
        x = [r["workers"] for r in pts]
        ax_wall.plot(x, [r["wall_secs"] for r in pts], "o-", label=mode if mode != "ddp" else "PyTorch DDP")
        line = ax_eps.plot(x, [r["examples_per_sec"] for r in pts], "o-",
                           label=mode if mode != "ddp" else "PyTorch DDP")[0]
        guess = [(r["workers"], r["predicted_examples_per_sec"]) for r in pts if r.get("predicted_examples_per_sec")]
        if guess:  # --predict: the planner's curve beside the measured one
            ax_eps.plot([g[0] for g in guess], [g[1] for g in guess], "x--", color=line.get_color(),
                        label="%s, predicted" % mode)
        ax_eff.plot(x, [r["scaling_efficiency"] or 0 for r in pts], "o-", label=mode if mode != "ddp" else "PyTorch DDP")
        if target is not None:
            t = [(r["workers"], r["secs_to_target_accuracy"]) for r in pts if r["secs_to_target_accuracy"]]
            axes[3].plot([p[0] for p in t], [p[1] for p in t], "o-", label=mode)
    if target is not None:
        if local["secs_to_target_accuracy"]:
            axes[3].axhline(local["secs_to_target_accuracy"], color="gray", linestyle="--", label="local")
        axes[3].set_ylabel("seconds to test accuracy %.3g" % target)
    ax_wall.set_ylabel("wall-clock seconds")
    ax_eps.set_ylabel("examples/sec")
    ax_eff.set_ylabel("scaling efficiency")
    ax_eff.set_ylim(bottom=0)
    for ax in axes:
        ax.set_xlabel("workers")
        ax.set_xticks(sizes)
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    plotting.save(fig, path, dpi=100)
    print("plot written to %s" % path)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="mlp", help="a built-in model or PATH.onnx (an ONNX file)")
    ap.add_argument("--batch_size", type=int, default=100)
    ap.add_argument("--examples", type=int, default=200000, help="training examples in every configuration")
    ap.add_argument("--sizes", default=None, help="worker counts, e.g. 1,2,4 (default 1,2)")
    ap.add_argument("--modes", default=None, help="sync and/or async (default both; with --schedule, sync)")
    ap.add_argument("--schedule", default="",
                    help="SECS:WORKERS,... e.g. 0:1,20:2,40:4,60:2: after the fixed-size runs of each count, one "
                         "elastic job (dtrain_ps --max_workers) whose workers join and leave (SIGTERM, the newest "
                         "first) at those seconds since its launch; prints and plots its examples/sec over time "
                         "against the fixed runs, and each join's latency (scripts/elastic_schedule.py)")
    ap.add_argument("--window_secs", type=float, default=2.0, help="with --schedule: the rate's windows")
    ap.add_argument("--schedule_tail_secs", type=float, default=None,
                    help="with --schedule: how long the last entry runs before the chief is stopped (SIGTERM; "
                         "default: as long as the entry before it)")
    ap.add_argument("--num_ps", type=int, default=1)
    ap.add_argument("--colocate_ps", action="store_true",
                    help="with --netns: no ps hosts; every worker's host also runs a ps task (as many ps tasks as "
                         "workers, BytePS's colocated servers), so that a cluster of N workers uses exactly the "
                         "hosts, cores and links of N DDP ranks")
    ap.add_argument("--target_accuracy", type=float, default=None, help="report seconds until this test accuracy")
    ap.add_argument("--eval_every", type=int, default=0,
                    help="chief evaluates every N global steps (default with --target_accuracy: ~10 per run)")
    ap.add_argument("--netns", action="store_true", help="run clusters across network namespaces (root)")
    ap.add_argument("--bandwidth", default="", help="with --netns: cap every link, e.g. 1gbit or 100mbit")
    ap.add_argument("--host_cpus", type=float, default=None,
                    help="with --netns: every emulated host gets this many cores (a cgroup CPU quota), e.g. 0.25")
    ap.add_argument("--latency", type=float, default=None,
                    help="with --netns: every link delays each packet this many ms (a round trip: twice that)")
    ap.add_argument("--timeout_secs", type=int, default=3600, help="give up on one configuration after this")
    ap.add_argument("--plot", default="", help="write a PNG plot here (and the table beside it as .csv/.json)")
    ap.add_argument("--out", default="", help="write PREFIX.csv, PREFIX.json and PREFIX.png")
    ap.add_argument("--bin", default=os.environ.get("DTRAIN_BIN", os.path.join(ROOT, "build", "bin")))
    ap.add_argument("--transport", default="auto", choices=("auto", "grpc", "shm", "tcp"),
                    help="every ps task's and worker's --transport")
    ap.add_argument("--ddp", action="store_true",
                    help="add PyTorch DDP (gloo) at each size, and plain PyTorch as its baseline (built-in models)")
    ap.add_argument("--repeats", type=int, default=1, help="launches of each configuration, interleaved; medians")
    ap.add_argument("--profile_out", default="",
                    help="the (first) local run also writes its profile here (dtrain_worker --profile_out), what "
                         "scripts/plan_cluster.py predicts clusters from")
    ap.add_argument("--predict", action="store_true",
                    help="put scripts/plan_cluster.py's prediction beside every cluster row: examples/sec, its error "
                         "against the measurement, the wall-clock and what bounds it, from the local run's profile "
                         "alone (nothing fitted to the rows it is judged on)")
    for flag in DATA_FLAGS:
        ap.add_argument("--" + flag, default=None, help="passed to every worker (dtrain_worker's flag)")
    ap.add_argument("worker_args", nargs="*")
    a = ap.parse_args()
    # SIGTERM unwinds like Ctrl-C, so that the network namespaces and processes of a running cluster go away.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    schedule = None
    if a.schedule:
        try:
            schedule = elastic_schedule.parse_schedule(a.schedule)
        except elastic_schedule.ScheduleError as e:
            ap.error(str(e))
        if a.sizes is not None:
            ap.error("--schedule runs the fixed sizes of its own counts: leave --sizes out")
        if a.netns:
            ap.error("--schedule runs its elastic job on 127.0.0.1: not with --netns")
        if a.window_secs <= 0 or (a.schedule_tail_secs is not None and a.schedule_tail_secs <= 0):
            ap.error("--window_secs and --schedule_tail_secs must be positive")
        a.sizes = ",".join(str(n) for n in sorted({n for _, n in schedule}))
        if a.modes is None:
            a.modes = "sync"
    elif a.schedule_tail_secs is not None:
        ap.error("--schedule_tail_secs needs --schedule")
    try:
        sizes = [int(s) for s in (a.sizes or "1,2").split(",") if s]
    except ValueError:
        ap.error("--sizes must be comma-separated worker counts, got %r" % a.sizes)
    modes = [m for m in (a.modes or "sync,async").split(",") if m]
    if not sizes or min(sizes) < 1:
        ap.error("--sizes needs positive worker counts, got %r" % a.sizes)
    if any(m not in ("sync", "async") for m in modes):
        ap.error("--modes takes sync and/or async, got %r" % a.modes)
    if schedule and len(modes) != 1:
        ap.error("--schedule runs one job: give one --modes (sync or async), got %r" % a.modes)
    if a.num_ps < 1 or a.batch_size < 1 or a.examples < 1 or a.repeats < 1:
        ap.error("--num_ps, --batch_size, --examples and --repeats must be positive")
    if a.ddp and a.model not in DDP_MODELS:
        ap.error("--ddp compares built-in models (%s), not %r" % (", ".join(DDP_MODELS), a.model))
    if a.target_accuracy is not None and not 0 < a.target_accuracy <= 1:
        ap.error("--target_accuracy must be in (0, 1], got %g" % a.target_accuracy)
    if a.bandwidth and not a.netns:
        ap.error("--bandwidth needs --netns (links on 127.0.0.1 cannot be capped)")
    if a.colocate_ps and not a.netns:
        ap.error("--colocate_ps needs --netns (on 127.0.0.1 every process shares one host anyway)")
    if a.colocate_ps and a.num_ps != 1:
        ap.error("--colocate_ps runs as many ps tasks as workers: leave --num_ps out")
    for flag, value in (("host_cpus", a.host_cpus), ("latency", a.latency)):
        if value is not None and not a.netns:
            ap.error("--%s needs --netns (it is a setting of the emulated hosts)" % flag)
    cores = len(os.sched_getaffinity(0))
    if a.host_cpus is not None and not 0.01 <= a.host_cpus <= cores:
        ap.error("--host_cpus must be at least 0.01 and at most the %d cores here, got %g" % (cores, a.host_cpus))
    if a.latency is not None and not 0 <= a.latency <= 10000:
        ap.error("--latency must be 0..10000 ms, got %g" % a.latency)
    if a.netns:
        need = (["--host_cpus"] if a.host_cpus is not None else []) + (["--latency"] if a.latency else [])
        chk = subprocess.run([NETNS, "check"] + need, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             env=dict(os.environ, DTRAIN_BIN=a.bin))
        if chk.returncode != 0:
            sys.exit("compare_cluster_sizes: --netns %sunavailable here: %s"
                     % ("with " + " and ".join(need) + " " if need else "", chk.stdout.strip()))
        if a.bandwidth and not re.fullmatch(r"[0-9]+(\.[0-9]+)?(bit|kbit|mbit|gbit)", a.bandwidth):
            ap.error("--bandwidth must look like 1gbit, 100mbit or 500kbit, got %r" % a.bandwidth)
    if a.model.lower().endswith(".onnx"):
        # Every worker (in any namespace or directory) reads the file at one absolute path.
        if not os.path.isfile(a.model) or not os.access(a.model, os.R_OK):
            ap.error("--model=%s: no such readable file" % a.model)
        a.model = os.path.abspath(a.model)
    for b in ("dtrain_ps", "dtrain_worker"):
        if not os.access(os.path.join(a.bin, b), os.X_OK):
            sys.exit("compare_cluster_sizes: %s not found in %s: build first (scripts/build.sh)" % (b, a.bin))
    eval_every = a.eval_every
    if a.target_accuracy is not None and eval_every <= 0:
        eval_every = max(1, a.examples // a.batch_size // 10)
    if a.data_dir is not None:
        a.data_dir = os.path.abspath(a.data_dir)  # every worker (any namespace or directory) reads one path
    data_args = ["--%s=%s" % (f, getattr(a, f)) for f in DATA_FLAGS if getattr(a, f) is not None]
    common = ["--model=%s" % a.model, "--batch_size=%d" % a.batch_size, "--log_every=1000000",
              "--transport=%s" % a.transport] + data_args + a.worker_args
    threads = 1
    for w in a.worker_args:
        m = re.fullmatch(r"--threads=(\d+)", w)
        if m:
            threads = int(m.group(1))
    if not any(w.startswith("--threads=") for w in a.worker_args):
        common.append("--threads=%d" % threads)  # as many as a DDP rank (dtrain's own default is auto)
    target = a.target_accuracy
    env = dict(os.environ, DTRAIN_BIN=a.bin)
    os.environ["DTRAIN_BIN"] = a.bin  # netns_hosts.sh finds dtrain_netdelay beside the binaries
    work = tempfile.mkdtemp(prefix="dtrain_compare.")
    emulation = {}  # the emulated hosts' settings, as netns_hosts.sh info printed them
    # The local run's profile (--profile_out, or beside the logs for --predict), what the planner predicts from.
    profile_path = os.path.abspath(a.profile_out) if a.profile_out else (
        os.path.join(work, "local.profile.json") if a.predict else "")

    def netns_tag(key, rep):
        return "%s.%d" % (key, rep)

    def row(name, mode, n, rc, wall, logdir, names, steps, system="dtrain"):
        p = parse_logs(logdir, names, target)
        sparse, t_acc = p["sparse"], p["t_acc"]
        eps = p["examples"] / p["secs"] if p["secs"] > 0 else 0.0
        r = {"configuration": name, "system": system, "mode": mode, "workers": n, "exit_code": rc,
             "wall_secs": round(wall, 2), "train_secs": None, "examples": p["examples"],
             "examples_per_sec": round(eps, 1), "speedup_vs_local": None, "scaling_efficiency": None,
             "vs_ddp": None, "secs_to_target_accuracy": None if t_acc is None else round(t_acc, 2),
             "final_accuracy": p["accuracy"], "global_steps": steps, "final_log_loss": sparse.get("log_loss"),
             "rows_held": sparse.get("rows_held"), "bytes_per_step": sparse.get("bytes_per_step")}
        r.update(wall_parts(wall, p["phases"]))
        return r

    def on_hosts(count, key, rep, cmds, logs, run_env=None):
        """cmds[k] on emulated host k (each with the run's quota, caps and latency): (rc, wall). cmds may be a
        function of the hosts' addresses."""
        with EmulatedHosts(a, count, netns_tag(key, rep)) as h:
            emulation.setdefault("hosts", h.settings)
            return h.run(cmds(h.addrs) if callable(cmds) else cmds, logs, a.timeout_secs, run_env)

    def eval_args(steps):
        # Evaluate on the same fraction of the run in every configuration.
        if eval_every <= 0:
            return []
        return ["--eval_every=%d" % max(1, round(eval_every * steps / max(1, a.examples // a.batch_size)))]

    def run_local(rep, profile=False):
        steps = max(1, a.examples // a.batch_size)
        logdir = os.path.join(work, "local.profile" if profile else "local.%d" % rep)
        os.makedirs(logdir)
        cmd = [os.path.join(a.bin, "dtrain_worker"), "--job_name=local", "--train_steps=%d" % steps] + \
            eval_args(steps) + common
        if profile:  # a launch of its own: the profile's measurements (its transports) add to its wall-clock
            cmd.append("--profile_out=" + profile_path)
        log = os.path.join(logdir, "worker_0.log")
        if a.netns:  # on one host like each of the cluster's: the same quota
            rc, wall = on_hosts(1, "local", rep, [cmd], [log])
        else:
            rc, wall = run_bounded(cmd, log, a.timeout_secs)
        return row("local", "local", 0, rc, wall, logdir, ["worker_0.log"], steps)

    def run_cluster(mode, n, rep):
        # Sync: one global step consumes n batches; async: one batch per step.
        steps = max(1, a.examples // (a.batch_size * (n if mode == "sync" else 1)))
        logdir = os.path.join(work, "%s_%d.%d" % (mode, n, rep))
        os.makedirs(logdir)
        mode_args = ["--mode=%s" % mode, "--train_steps=%d" % steps] + eval_args(steps) + common
        if a.netns:
            rc, wall, settings = run_netns_cluster(a, n, mode_args, logdir, a.timeout_secs,
                                                   netns_tag("%s_%d" % (mode, n), rep))
            emulation.setdefault("hosts", settings)
        else:
            cmd = [os.path.join(ROOT, "scripts", "run_local_cluster.sh"), "--ps", str(a.num_ps), "--workers",
                   str(n), "--logdir", logdir, "--ps_flag", "--transport=%s" % a.transport, "--"] + mode_args
            rc, wall = run_bounded(cmd, os.path.join(work, "%s_%d.%d.out" % (mode, n, rep)), a.timeout_secs, env)
        ps = "%d ps%s" % ((n, " colocated") if a.colocate_ps else (a.num_ps, ""))
        name = "%s, %s, %d worker%s" % (mode, ps, n, "s" if n > 1 else "")
        return row(name, mode, n, rc, wall, logdir,
                   ["worker_%d.log" % i for i in range(n)] + ["worker_%d.err" % i for i in range(n)], steps)

    def run_ddp(n, rep):
        """PyTorch: plain in one process (n == 0), or DDP over gloo with n ranks; with --netns one rank per emulated
        host (gloo over eth0, rank 0's address as the master's), else all on 127.0.0.1 (ddp_baseline's launcher).
        Rank 0 evaluates the test set at the end, as dtrain's chief always does."""
        ranks = max(1, n)
        args = ["--model=%s" % a.model, "--batch_size=%d" % a.batch_size, "--examples=%d" % a.examples,
                "--threads=%d" % threads, "--ranks=%d" % ranks, "--evaluate"] + (["--no_ddp"] if n == 0 else [])
        if a.data_dir is not None:
            args.append("--data_dir=%s" % a.data_dir)
        script = os.path.join(ROOT, "scripts", "ddp_baseline.py")
        log = os.path.join(work, "ddp_%d.%d.log" % (n, rep))
        if a.netns:
            def cmds(addrs):  # rank r on host r; rank 0's store on host 0
                return [["/usr/bin/python3", script, "--rank=%d" % r, "--master_addr=%s" % addrs[0],
                         "--master_port=29500"] + args for r in range(ranks)]
            logs = [log] + [os.path.join(work, "ddp_%d.%d.rank%d.log" % (n, rep, r)) for r in range(1, ranks)]
            rc, wall = on_hosts(ranks, "ddp_%d" % n, rep, cmds, logs, dict(os.environ, GLOO_SOCKET_IFNAME="eth0"))
        else:
            rc, wall = run_bounded([sys.executable, script] + args, log, a.timeout_secs)
        text = open(log, errors="replace").read()
        m = DDP_LINE.search(text)
        if m and m.group(2) != "openblas-openmp":
            print("compare_cluster_sizes: WARNING: PyTorch ran with %s, not the OpenMP OpenBLAS: its figures are "
                  "not comparable (see ../shared/BENCHMARKS.md)" % m.group(2), file=sys.stderr)
        acc = DDP_ACCURACY_LINE.search(text)
        ph = DDP_PHASES_LINE.search(text)
        phases = dict(zip(("start", "train", "evaluate"), (float(v) for v in ph.groups()))) if ph else \
            {"start": None, "train": None, "evaluate": None}
        name = "pytorch, 1 process" if n == 0 else "ddp (gloo), %d rank%s" % (n, "s" if n > 1 else "")
        r = {"configuration": name, "system": "pytorch", "mode": "ddp" if n else "pytorch", "workers": n,
             "exit_code": rc if m else (rc or 1), "wall_secs": round(wall, 2), "train_secs": None,
             "examples": a.examples, "examples_per_sec": float(m.group(1)) if m else 0.0,
             "speedup_vs_local": None, "scaling_efficiency": None, "vs_ddp": None,
             "secs_to_target_accuracy": None, "final_accuracy": float(acc.group(1)) if acc else None,
             "global_steps": None, "final_log_loss": None, "rows_held": None, "bytes_per_step": None}
        r.update(wall_parts(wall, phases))
        return r

    # Every configuration, in the order they run in each repeat: those of one size side by side.
    configs = [("local", run_local)]
    if a.ddp:
        configs.append(("pytorch", lambda rep: run_ddp(0, rep)))
    for n in sizes:
        for mode in modes:
            configs.append(("%s_%d" % (mode, n), lambda rep, mode=mode, n=n: run_cluster(mode, n, rep)))
        if a.ddp:
            configs.append(("ddp_%d" % n, lambda rep, n=n: run_ddp(n, rep)))
    launches = {key: [] for key, _ in configs}
    if profile_path:
        r = run_local(0, profile=True)
        if r["exit_code"] != 0:
            sys.exit("compare_cluster_sizes: the local run that writes the profile %s failed (exit %d; its log: %s)"
                     % (profile_path, r["exit_code"], os.path.join(work, "local.profile", "worker_0.log")))
        print("done: the profile's local run (%.1f s), %s" % (r["wall_secs"], profile_path), file=sys.stderr)
    for rep in range(a.repeats):
        for key, run in configs:
            r = run(rep)
            launches[key].append(r)
            print("done: %s%s (%.1f s, %.1f examples/sec)" % (r["configuration"], " #%d" % (rep + 1) if a.repeats > 1
                                                             else "", r["wall_secs"], r["examples_per_sec"]),
                  file=sys.stderr)
    # Each configuration's median launch (by examples/sec); every launch's rate is kept in the JSON.
    rows = []
    for key, _ in configs:
        runs = sorted(launches[key], key=lambda r: r["examples_per_sec"])
        r = dict(runs[(len(runs) - 1) // 2])
        r["examples_per_sec_launches"] = [x["examples_per_sec"] for x in launches[key]]
        if any(x["exit_code"] != 0 for x in launches[key]):
            r["exit_code"] = next(x["exit_code"] for x in launches[key] if x["exit_code"] != 0)
        rows.append(r)
    by_key = dict(zip([k for k, _ in configs], rows))
    elastic = None
    if schedule:
        elastic = run_schedule(a, schedule, common, modes[0], {n: by_key["%s_%d" % (modes[0], n)] for n in sizes},
                               work)
    base_eps = by_key["local"]["examples_per_sec"]
    torch_eps = by_key["pytorch"]["examples_per_sec"] if a.ddp else 0
    for key, r in by_key.items():
        base = torch_eps if r["system"] == "pytorch" else base_eps
        if key in ("local", "pytorch") or base <= 0:
            continue
        r["speedup_vs_local"] = round(r["examples_per_sec"] / base, 3)
        r["scaling_efficiency"] = round(r["examples_per_sec"] / (r["workers"] * base), 3)
        ddp = by_key.get("ddp_%d" % r["workers"])
        if r["system"] == "dtrain" and ddp and ddp["examples_per_sec"] > 0:
            r["vs_ddp"] = round(r["examples_per_sec"] / ddp["examples_per_sec"], 3)
    meta = {"model": a.model, "batch_size": a.batch_size, "examples": a.examples, "num_ps": a.num_ps,
            "sizes": sizes, "modes": modes, "target_accuracy": target, "eval_every": eval_every,
            "transport": a.transport, "repeats": a.repeats, "ddp": a.ddp, "colocate_ps": a.colocate_ps,
            "netns": a.netns, "bandwidth": a.bandwidth or None, "host_cpus": a.host_cpus,
            "latency_ms": a.latency, "emulated_hosts": emulation.get("hosts"),
            "worker_args": data_args + a.worker_args, "profile": profile_path or None,
            "schedule": a.schedule or None}
    for r in rows:
        r.update({"predicted_examples_per_sec": None, "prediction_error": None, "predicted_wall_secs": None,
                  "predicted_bound": None})
    if a.predict:
        predict_rows(rows, meta, profile_path)
    where = "127.0.0.1"
    if a.netns:
        where = "network namespaces%s" % (", links capped at " + a.bandwidth if a.bandwidth else ", uncapped links")
        if a.latency:
            where += ", %g ms latency each way" % a.latency
        if a.host_cpus is not None:
            most = max((0 if a.colocate_ps else a.num_ps) + max(sizes), max(sizes) if a.ddp else 0)
            where += ", hosts of %g cores each (cgroup quota; the largest configuration: %d hosts, %g of %d cores)" % (
                a.host_cpus, most, most * a.host_cpus, len(os.sched_getaffinity(0)))
    print("\nmodel %s, batch %d per worker, %d examples per configuration, clusters on %s, --transport=%s%s "
          "(logs: %s)" % (a.model, a.batch_size, a.examples, where, a.transport,
                          ", median of %d interleaved launches" % a.repeats if a.repeats > 1 else "", work))
    # A model with tables (its chief prints "sparse tables:" and AUC lines) shows AUC, log loss, rows, bytes.
    sparse = any(r["rows_held"] is not None or r["final_log_loss"] is not None for r in rows)
    metric = "AUC" if sparse else "accuracy"
    tcol = "t_%s>=%.3g" % ("auc" if sparse else "acc", target) if target is not None else "t_acc"
    hdr = "%-32s %8s %7s %8s %7s %7s %12s %9s %10s %11s %9s" % (
        "configuration", "wall_s", "start", "train_s", "eval", "end", "examples/sec", "vs local", "scaling", tcol,
        metric)
    if a.predict:
        hdr += " %10s %8s %-12s" % ("predicted", "error", "bound")
    if a.ddp:
        hdr += " %8s" % "vs DDP"
    if sparse:
        hdr += " %8s %10s %12s" % ("log_loss", "rows", "bytes/step")
    print(hdr)
    print("-" * len(hdr))
    ok = True

    def dash(v, fmt):
        return "-" if v is None else fmt % v

    for r in rows:
        line = "%-32s %8.1f %7s %8s %7s %7s %12.1f %9s %10s %11s %9s" % (
            r["configuration"], r["wall_secs"], dash(r["start_secs"], "%.1f"), dash(r["train_secs"], "%.1f"),
            dash(r["evaluate_secs"], "%.1f"), dash(r["end_secs"], "%.1f"), r["examples_per_sec"],
            "-" if r["speedup_vs_local"] is None else "%.2fx" % r["speedup_vs_local"],
            "-" if r["scaling_efficiency"] is None else "%.0f%%" % (100 * r["scaling_efficiency"]),
            "-" if r["secs_to_target_accuracy"] is None else "%.1f s" % r["secs_to_target_accuracy"],
            dash(r["final_accuracy"], "%.4f"))
        if sparse:
            line += " %8s %10s %12s" % (dash(r["final_log_loss"], "%.4f"), dash(r["rows_held"], "%d"),
                                        dash(r["bytes_per_step"], "%d"))
        if a.predict:
            line += " %10s %8s %-12s" % (dash(r["predicted_examples_per_sec"], "%.1f"),
                                         dash(None if r["prediction_error"] is None else 100 * r["prediction_error"],
                                              "%+.1f%%"), r["predicted_bound"] or "-")
        if a.ddp:
            line += " %8s" % dash(r["vs_ddp"], "%.2fx")
        print(line + ("" if r["exit_code"] == 0 else "  (FAILED rc=%d)" % r["exit_code"]))
        ok = ok and r["exit_code"] == 0
    print("wall_s = start + train_s + eval + end: start = launch until every worker (rank) was training, train = "
          "from then to the last one's last step, eval = the final test-set evaluation (dtrain's chief, DDP's rank "
          "0), end = the rest until every process exited; '-': the workers did not say")
    if a.predict:
        errs = [abs(r["prediction_error"]) for r in rows if r["prediction_error"] is not None]
        if errs:
            print("the planner's prediction (scripts/plan_cluster.py, from the local run's profile %s): median |error| "
                  "%.1f%%, worst %.1f%% over %d clusters" % (profile_path, 100 * statistics.median(errs),
                                                             100 * max(errs), len(errs)))
    if elastic:
        elastic_schedule.print_report(elastic, schedule)
        ok = ok and elastic["exit_code"] == 0
        if elastic["exit_code"] != 0:
            print("elastic job FAILED (rc=%d; logs: %s)" % (elastic["exit_code"], elastic["logdir"]))
    prefix = a.out or (os.path.splitext(a.plot)[0] if a.plot else "")
    if prefix:
        write_table(rows, prefix, meta, sparse, elastic)
        path = a.plot or prefix + ".png"
        if elastic:
            title = "dtrain %s %s, batch %d per worker, --schedule=%s" % (a.model, modes[0], a.batch_size,
                                                                          a.schedule)
        try:
            if elastic:
                elastic_schedule.plot(elastic, schedule, {s["workers"]: s["fixed_examples_per_sec"]
                                                          for s in elastic["sizes"]}, path, title)
                print("plot written to %s" % path)
            else:
                title = "dtrain %s: %d examples, batch %d, %s" % (a.model, a.examples, a.batch_size, where)
                plot(rows, sizes, modes + (["ddp"] if a.ddp else []), path, title, target)
        except plotting.PlotError as e:
            print("compare_cluster_sizes: %s (the table is written)" % e, file=sys.stderr)
            ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
