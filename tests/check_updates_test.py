#!/usr/bin/env python3
"""scripts/check_updates.py on journals written here by hand: a clean run passes; a restore that undoes pushes
which the workers then push again passes; a lost update, an update applied twice (one request id, or two for one
worker's step), a dropped push that was applied, and a restore of a checkpoint the journal never saw are each
caught. A torn last line (a killed process) is ignored."""
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHECK = os.path.join(ROOT, "scripts", "check_updates.py")
failures = []


def write(d, name, lines, torn=""):
    with open(os.path.join(d, name), "w") as f:
        f.write("# header\n" + "".join(l + "\n" for l in lines) + torn)


def run(ps, workers, tag):
    """ps: {(task, start): [lines]}, workers: {(worker, start): [lines]}; returns (exit code, counts, output)."""
    with tempfile.TemporaryDirectory() as d:
        for (task, start), lines in ps.items():
            torn = "A 0 9 9" if tag == "torn" and task == 0 else ""
            write(d, "applied.ps%d-of-2.%020d-1.journal" % (task, start), lines, torn)
        for (w, start), lines in workers.items():
            write(d, "pushes.w%d.%020d-1.journal" % (w, start), lines)
        p = subprocess.run([sys.executable, CHECK, "--ps_dir", d, "--worker_dir", d, "--json"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    counts = {}
    for line in p.stdout.splitlines():
        if line.startswith("{"):
            counts = json.loads(line)
    return p.returncode, counts, p.stdout


def expect(tag, ps, workers, code, **want):
    rc, counts, out = run(ps, workers, tag)
    ok = rc == code and all(counts.get(k, 0) == v for k, v in want.items())
    print("%-28s exit %d %s" % (tag, rc, "ok" if ok else "WRONG"))
    if not ok:
        failures.append("%s: exit %d (want %d), counts %s (want %s)\n%s" % (tag, rc, code, counts, want, out))


def steps(worker, first, last, rid0, task_lines):
    """Accept and apply worker's pushes of steps [first, last) with request ids rid0 + step."""
    for s in range(first, last):
        task_lines += ["K %d %d %d" % (worker, s, rid0 + s), "A %d %d %d %d" % (worker, s, rid0 + s, s + 1)]


def acks(worker, first, last, rid0, outcome="accepted"):
    return ["P %d %d %d %s %d" % (worker, s, rid0 + s, outcome, s + 1) for s in range(first, last)]


def clean():
    ps = {(0, 1): [], (1, 1): []}
    for t in (0, 1):
        steps(0, 0, 4, 100, ps[(t, 1)])
        ps[(t, 1)].append("C 4")
        steps(0, 4, 6, 100, ps[(t, 1)])
    return ps, {(0, 1): acks(0, 0, 6, 100)}


ps, w = clean()
expect("clean", ps, w, 0, accepted=6, applied_once=6, lost=0, doubled=0, updates_checked=12)
expect("torn", ps, w, 0, accepted=6, applied_once=6, lost=0, doubled=0)

# ps task 1 killed after applying steps 4 and 5; its new process restores step 4 (and so does ps 0, at the
# chief's request); the worker pushes steps 4 and 5 again under new request ids.
ps, w = clean()
for t in (0, 1):
    ps[(t, 2 if t == 1 else 1)] = ps.get((t, 2 if t == 1 else 1), []) + ["R 4"]
    steps(0, 4, 6, 200, ps[(t, 2 if t == 1 else 1)])
w[(0, 2)] = acks(0, 4, 6, 200)
expect("restore", ps, w, 0, accepted=8, applied_once=6, undone=2, lost=0, doubled=0, restores=2)

ps, w = clean()
ps[(1, 1)].remove("A 0 5 105 6")
expect("lost", ps, w, 1, lost=1)

ps, w = clean()
ps[(1, 1)].append("A 0 5 105 6")
expect("doubled request", ps, w, 1, doubled=1)

ps, w = clean()
ps[(0, 1)] += ["K 0 5 999", "A 0 5 999 6"]
expect("doubled step", ps, w, 1, doubled=1)

ps, w = clean()
for t in (0, 1):
    ps[(t, 1)] += ["A 0 6 106 7"]
w[(0, 1)] += acks(0, 6, 7, 100, "dropped_stale")
expect("dropped but applied", ps, w, 1, doubled=1)

ps, w = clean()
ps[(1, 1)].append("R 3")
expect("unknown checkpoint", ps, w, 2)

# A restore that went back to a checkpoint copied after the push: the push must still be there.
ps, w = clean()
for t in (0, 1):
    ps[(t, 1)].append("C 6")
ps[(1, 1)].remove("A 0 5 105 6")
ps[(1, 1)].append("R 6")
expect("restore after the update", ps, w, 1, lost=1)

if failures:
    print("\n".join(failures))
    sys.exit(1)
print("PASS")
