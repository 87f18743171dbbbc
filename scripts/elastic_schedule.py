"""compare_cluster_sizes.py --schedule: one elastic job on 127.0.0.1 whose membership follows a schedule, and what
its examples/sec did over time.

  schedule = parse_schedule("0:1,20:2,40:4,60:2")   # seconds since the job's launch : workers
  job = run_job(JobOptions(...), schedule, logdir)   # launches, follows the schedule, stops the chief, waits
  report = analyse(job, schedule, window_secs=2, fixed={1: 780.0, 2: 1210.0})

The job: the ps tasks with --max_workers = the workers it launches (the schedule's largest count, unless it grows
again after shrinking), the first entry's workers from the launch (the cluster spec lists them), and at each later
entry workers started (dtrain_worker --task_index past the spec's, each joining at the next step boundary) or
stopped with SIGTERM, the newest first. Every launch takes a task index of its own: a worker that left and is
started again under its old index is not taken back into the step's workers (its pushes are dropped as a backup
worker's; seen on the build of 2026-12-06). Every worker runs --elastic_batch=per_worker
and prints a progress line every --log_every steps; each line is stamped as it arrives (a pipe per process, read by
a thread) and its examples spread over the time since the worker's line before. Once the schedule's last entry has
run for the tail, the chief gets SIGTERM: it finishes its step, evaluates and leaves, which ends the run (docs/faults_and_endings.md,
"How a run ends": the chief exits 143, the workers still in the job 4).

The analysis: the job's examples/sec (summed over the workers) in windows of window_secs from the launch; the
membership over time from the chief's lines ("step 1263: worker 1 joined (2 workers, ...)"); for each worker count
its steady rate (the windows wholly inside stretches of that count, less each stretch's first window), against the
fixed-size run of the same count; each join's latency (launch to the chief's "joined" line, and to the end of the
joiner's first step) and each leave's (SIGTERM to the chief's "left" line).

Threading: run_job's reader threads only append to their process's list and write its log; everything else runs on
the caller's thread.
"""
import os
import re
import signal
import subprocess
import sys
import threading
import time

PROGRESS = re.compile(r"^step (\d+), loss = \S+ \(([0-9.]+) examples/sec; ([0-9.]+) sec/batch")
# The chief's line for each change of the membership (worker/train/trainer_loop.cc, ps::DescribeMembershipChange).
CHANGE = re.compile(r"^step (\d+): (.*?) \((\d+) workers?, ")
WORKERS_IN = re.compile(r"workers? ([0-9, ]+) (joined|left)")
# After the chief's SIGTERM: how long the others get to leave by themselves before they are stopped.
END_GRACE_SECS = 60


class ScheduleError(ValueError):
    """A --schedule that cannot be run; the message names what is wrong."""


def parse_schedule(text):
    """"0:1,20:2,40:4" -> [(0.0, 1), (20.0, 2), (40.0, 4)]. The first entry is at 0 (the job's launch), the times
    increase, every count is at least 1. Raises ScheduleError."""
    entries = []
    for part in text.split(","):
        m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?)\s*:\s*([0-9]+)\s*", part)
        if not m:
            raise ScheduleError("--schedule takes SECONDS:WORKERS,... (e.g. 0:1,20:2,40:1), got %r in %r"
                                % (part, text))
        entries.append((float(m.group(1)), int(m.group(2))))
    if entries[0][0] != 0:
        raise ScheduleError("--schedule must start at 0 (the workers at the job's launch), got %r" % text)
    for (t0, _), (t1, _) in zip(entries, entries[1:]):
        if t1 <= t0:
            raise ScheduleError("--schedule times must increase, got %g after %g in %r" % (t1, t0, text))
    if any(n < 1 for _, n in entries):
        raise ScheduleError("--schedule worker counts must be at least 1, got %r" % text)
    return entries


def default_tail(schedule):
    """How long the last entry runs before the chief is stopped: as long as the entry before it ran (10 s for a
    schedule of one entry)."""
    return schedule[-1][0] - schedule[-2][0] if len(schedule) > 1 else 10.0


class JobOptions:
    """What run_job launches: bin (the binaries' folder), num_ps, transport, worker_args (every worker's flags:
    model, batch, mode, data, threads...; --elastic_batch, --train_steps and --log_every are added), batch_size
    (examples of one progress step, per worker), log_every, train_steps (more than the job can reach), tail_secs,
    timeout_secs (the whole job's limit) and free_ports (the script printing N free ports)."""

    def __init__(self, **kw):
        self.__dict__.update(kw)


class Process:
    """One launched task: its output to `log`, each progress and membership line stamped (seconds since the job's
    launch) in `lines` by a reader thread."""

    def __init__(self, name, cmd, log, t0):
        self.name, self.t0 = name, t0
        self.launched = time.monotonic() - t0
        self.stopped = None  # when it was sent SIGTERM
        self.lines = []  # (secs, text) of progress and membership lines
        self.log = open(log, "w")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for raw in self.proc.stdout:
            now = time.monotonic() - self.t0
            text = raw.decode(errors="replace").rstrip("\n")
            self.log.write(text + "\n")
            if text.startswith("step "):
                self.lines.append((now, text))
        self.log.flush()

    def terminate(self):
        if self.proc.poll() is None:
            self.stopped = time.monotonic() - self.t0
            os.kill(self.proc.pid, signal.SIGTERM)

    def kill(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)

    def close(self):
        self.proc.wait()
        self.reader.join(timeout=10)
        self.log.close()


def run_job(o, schedule, logdir):
    """Runs the elastic job (see the module's comment); output to logdir/ps_K.log and worker_K.log. Returns a dict:
    workers (per launch: task, launched, stopped, exit_code, lines, log), ps (exit codes), t_stop (when the chief
    was sent SIGTERM), exit_code (0 when the job ran and ended as a stopped chief ends it, else the first unexpected
    code; 124 past the timeout), max_workers (the workers launched), log_every."""
    first = schedule[0][1]
    largest = first + sum(max(0, b[1] - a[1]) for a, b in zip(schedule, schedule[1:]))  # every launch
    ports = subprocess.run([sys.executable, o.free_ports, str(o.num_ps + first)], stdout=subprocess.PIPE,
                           text=True, check=True).stdout.strip().split(",")
    cluster = ["--ps_hosts=" + ",".join("127.0.0.1:" + p for p in ports[:o.num_ps]),
               "--worker_hosts=" + ",".join("127.0.0.1:" + p for p in ports[o.num_ps:])]
    worker_flags = o.worker_args + ["--train_steps=%d" % o.train_steps, "--elastic_batch=per_worker",
                                    "--eval_every=0", "--log_every=%d" % o.log_every]
    t0 = time.monotonic()
    ps, workers, live = [], [], {}  # live: task index -> Process

    def launch(k):
        log = os.path.join(logdir, "worker_%d.log" % k)
        w = Process("worker %d" % k, [os.path.join(o.bin, "dtrain_worker"), "--job_name=worker",
                                      "--task_index=%d" % k] + cluster + worker_flags, log, t0)
        w.task, w.path = k, log
        workers.append(w)
        live[k] = w

    def failed():  # a ps task or the chief ended before we stopped it: nothing more to follow
        return any(p.proc.poll() is not None for p in ps) or live[0].proc.poll() is not None

    rc, early, timed_out = 0, False, False
    try:
        for k in range(o.num_ps):
            ps.append(Process("ps %d" % k, [os.path.join(o.bin, "dtrain_ps"), "--job_name=ps", "--task_index=%d" % k,
                                            "--max_workers=%d" % largest, "--transport=%s" % o.transport] + cluster,
                              os.path.join(logdir, "ps_%d.log" % k), t0))
        for k in range(first):
            launch(k)
        ends = [t for t, _ in schedule[1:]] + [schedule[-1][0] + o.tail_secs]
        for (_, n), until in zip(schedule, ends):
            while len(live) < n:  # a task index never used (see the module's comment)
                launch(len(workers))
            while len(live) > n:  # the newest first
                live.pop(max(live, key=lambda k: live[k].launched)).terminate()
            while time.monotonic() - t0 < until and not early:
                timed_out = time.monotonic() - t0 > o.timeout_secs
                early = failed() or timed_out
                time.sleep(0.05)
            if early:
                break
        t_stop = time.monotonic() - t0
        live[0].terminate()
        deadline = time.monotonic() + END_GRACE_SECS
        while any(p.proc.poll() is None for p in ps + workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        for p in ps + workers:
            if p.proc.poll() is None:
                rc = 124
                p.kill()
    finally:
        for p in ps + workers:
            p.kill()
            p.close()
    # Expected: the chief stopped (143), the workers stopped by the schedule 143, the others told the run ended (4),
    # the ps tasks ending the run as the chief leaves (0 or 4). A job that ended before the schedule did failed.
    chief = workers[0]
    if timed_out:
        rc = 124
    elif early:
        rc = rc or next((p.proc.returncode for p in [chief] + ps if p.proc.returncode not in (None, 0)), 1)
    for p in [chief] + workers[1:] + ps:
        code = p.proc.returncode
        expected = {143} if p is chief or p.stopped is not None else {0, 4}
        if rc == 0 and code not in expected:
            rc = code if code > 0 else 128 - code
    return {"workers": [{"task": w.task, "launched": w.launched, "stopped": w.stopped, "exit_code": w.proc.returncode,
                         "lines": w.lines, "log": w.path} for w in workers],
            "ps": [p.proc.returncode for p in ps], "t_stop": t_stop, "exit_code": rc, "ended_early": early,
            "max_workers": largest, "log_every": o.log_every, "batch_size": o.batch_size}


def progress_spans(w, examples_per_line, log_every):
    """A worker's progress lines as (start, end, examples): each line's examples done since the line before (the
    first since log_every steps at the line's sec/batch before it)."""
    spans, prev = [], None
    for t, text in w["lines"]:
        m = PROGRESS.match(text)
        if not m:
            continue
        start = prev if prev is not None else t - log_every * float(m.group(3))
        spans.append((start, t, examples_per_line))
        prev = t
    return spans


def membership(job, initial):
    """[(secs, workers, step, text)] of the chief's change lines, after (0, initial, 0, "launch")."""
    out = [(0.0, initial, 0, "launch")]
    for t, text in job["workers"][0]["lines"]:
        m = CHANGE.match(text)
        if m:
            out.append((t, int(m.group(3)), int(m.group(1)), text))
    return out


def analyse(job, schedule, window_secs, fixed):
    """The job's timeline and its figures against the fixed-size runs (`fixed`: workers -> examples/sec). Returns
    a dict: windows [{start, examples_per_sec, workers}], changes [{secs, workers, step, line}], sizes [{workers,
    fixed_examples_per_sec, elastic_examples_per_sec, ratio, steady_secs, windows}], joins [{task, launched,
    joined_secs, first_step_secs}], leaves [{task, stopped, left_secs}], t_stop, first_step (the chief's)."""
    per_line = job["batch_size"] * job["log_every"]
    spans = [s for w in job["workers"] for s in progress_spans(w, per_line, job["log_every"])]
    chief_spans = progress_spans(job["workers"][0], per_line, job["log_every"])
    first_step = chief_spans[0][0] if chief_spans else None
    t_stop = job["t_stop"]
    nwin = int(t_stop // window_secs)
    sums = [0.0] * nwin
    for start, end, examples in spans:  # spread evenly over the span
        length = max(end - start, 1e-9)
        for i in range(max(0, int(start // window_secs)), min(nwin, int(end // window_secs) + 1)):
            lo, hi = max(start, i * window_secs), min(end, (i + 1) * window_secs)
            if hi > lo:
                sums[i] += examples * (hi - lo) / length
    changes = membership(job, schedule[0][1])

    def count_at(t):
        return [n for secs, n, _, _ in changes if secs <= t][-1]

    windows = [{"start": round(i * window_secs, 3), "examples_per_sec": round(s / window_secs, 1),
                "workers": count_at((i + 0.5) * window_secs)} for i, s in enumerate(sums)]
    # Stretches of one count: from the chief's first step (the launch's count) or a change to the next change.
    bounds = [(first_step if first_step is not None else t_stop, changes[0][1])]
    bounds += [(secs, n) for secs, n, _, _ in changes[1:]]
    steady = {}
    for (start, n), end in zip(bounds, [b[0] for b in bounds[1:]] + [t_stop]):
        inside = [i for i in range(nwin) if i * window_secs >= start and (i + 1) * window_secs <= end]
        steady.setdefault(n, []).extend(inside[1:])  # less the first window after the change
    sizes = []
    for n in sorted({n for _, n in schedule}):
        wins = steady.get(n, [])
        eps = sum(sums[i] for i in wins) / (len(wins) * window_secs) if wins else None
        base = fixed.get(n)
        sizes.append({"workers": n, "fixed_examples_per_sec": base,
                      "elastic_examples_per_sec": None if eps is None else round(eps, 1),
                      "ratio": round(eps / base, 3) if eps is not None and base else None,
                      "steady_secs": round(len(wins) * window_secs, 1), "windows": len(wins)})
    joins, leaves = [], []
    for w in job["workers"][schedule[0][1]:]:  # the launches after the first entry's
        joined = next((secs for secs, _, _, text in changes[1:] if secs >= w["launched"]
                       and _names(text, w["task"], "joined")), None)
        mine = progress_spans(w, per_line, job["log_every"])
        # The first line comes log_every steps after the first: the first step ended (log_every - 1) steps before.
        first = None
        for t, text in w["lines"]:
            m = PROGRESS.match(text)
            if m:
                first = t - (job["log_every"] - 1) * float(m.group(3)) - w["launched"]
                break
        joins.append({"task": w["task"], "launched": round(w["launched"], 2),
                      "joined_secs": None if joined is None else round(joined - w["launched"], 2),
                      "first_step_secs": None if first is None else round(first, 2),
                      "examples": sum(s[2] for s in mine)})
    for w in job["workers"]:
        if w["stopped"] is None or w["task"] == 0:
            continue
        left = next((secs for secs, _, _, text in changes[1:] if secs >= w["stopped"]
                     and _names(text, w["task"], "left")), None)
        leaves.append({"task": w["task"], "stopped": round(w["stopped"], 2),
                       "left_secs": None if left is None else round(left - w["stopped"], 2)})
    return {"window_secs": window_secs, "windows": windows,
            "changes": [{"secs": round(s, 2), "workers": n, "step": st, "line": text} for s, n, st, text in changes],
            "sizes": sizes, "joins": joins, "leaves": leaves, "t_stop": round(t_stop, 2),
            "first_step": None if first_step is None else round(first_step, 2)}


def _names(text, task, what):
    """Whether a change line says `task` `what` (joined/left): "workers 2, 3 joined", "worker 1 left"."""
    return any(m.group(2) == what and str(task) in [s.strip() for s in m.group(1).split(",")]
               for m in WORKERS_IN.finditer(text))


def print_report(r, schedule):
    """The size table and the joins, as compare_cluster_sizes prints its table."""
    hdr = "%-8s %14s %14s %8s %9s" % ("workers", "fixed ex/s", "elastic ex/s", "ratio", "steady_s")
    print("\nelastic job, --schedule=%s (windows of %g s; the first window after each change left out; the chief "
          "stopped at %.1f s):" % (",".join("%g:%d" % e for e in schedule), r["window_secs"], r["t_stop"]))
    print(hdr)
    print("-" * len(hdr))
    dash = (lambda v, fmt: "-" if v is None else fmt % v)
    for s in r["sizes"]:
        print("%-8d %14s %14s %8s %9.1f" % (s["workers"], dash(s["fixed_examples_per_sec"], "%.1f"),
                                            dash(s["elastic_examples_per_sec"], "%.1f"),
                                            dash(s["ratio"], "%.2fx"), s["steady_secs"]))
    for j in r["joins"]:
        print("join: worker %d launched at %.1f s: in the job (the chief's line) after %s, its first step done after "
              "%s" % (j["task"], j["launched"], dash(j["joined_secs"], "%.2f s"), dash(j["first_step_secs"], "%.2f s")))
    for lv in r["leaves"]:
        print("leave: worker %d sent SIGTERM at %.1f s: out of the job (the chief's line) after %s"
              % (lv["task"], lv["stopped"], dash(lv["left_secs"], "%.2f s")))


def plot(r, schedule, fixed, path, title):
    """The job's examples/sec over time, the changes as vertical lines labelled with the worker count, and each
    size's fixed-run examples/sec as a horizontal line. Raises plotting.PlotError when it cannot draw."""
    import plotting
    plt = plotting.pyplot(path)
    fig, ax = plt.subplots(figsize=(11, 4.5))
    ws = r["window_secs"]
    x = [w["start"] + ws / 2 for w in r["windows"]]
    ax.step([w["start"] for w in r["windows"]] + [len(r["windows"]) * ws],
            [w["examples_per_sec"] for w in r["windows"]] + [r["windows"][-1]["examples_per_sec"] if r["windows"]
                                                              else 0], where="post", color="C0",
            label="elastic job (sum over workers, %g s windows)" % ws)
    ax.plot(x, [w["examples_per_sec"] for w in r["windows"]], ".", color="C0")
    colors = {}
    for i, n in enumerate(sorted(fixed)):
        colors[n] = "C%d" % (i + 1)
        ax.axhline(fixed[n], color=colors[n], linestyle="--", linewidth=1,
                   label="fixed %d worker%s: %.0f ex/s" % (n, "s" if n > 1 else "", fixed[n]))
    top = max([w["examples_per_sec"] for w in r["windows"]] + list(fixed.values()) + [1])
    for c in r["changes"]:
        secs = c["secs"] if c["line"] != "launch" else (r["first_step"] or 0)
        ax.axvline(secs, color=colors.get(c["workers"], "gray"), linestyle=":", linewidth=1.2)
        ax.text(secs, top * 1.02, " %d" % c["workers"], color=colors.get(c["workers"], "gray"), va="bottom")
    for t, n in schedule[1:]:
        ax.plot([t], [0], "v", color="gray")
    ax.axvline(r["t_stop"], color="black", linestyle="-", linewidth=0.8)
    ax.text(r["t_stop"], top * 1.02, " stop", va="bottom")
    ax.set_ylim(0, top * 1.12)
    ax.set_xlabel("seconds since the job's launch (triangles: the schedule; dotted: the chief's membership lines, "
                  "labelled with the workers)")
    ax.set_ylabel("examples/sec")
    ax.legend(loc="lower right", fontsize="small")
    ax.set_title(title)
    fig.tight_layout()
    plotting.save(fig, path, dpi=100)
