#!/usr/bin/env python3
"""scripts/check_updates.py on journals written here by hand: a clean run passes; a restore that undoes pushes
which the workers then push again passes; a lost update, an update applied twice (one request id, or two for one
worker's step), a dropped push that was applied, and a restore of a checkpoint the journal never saw are each
caught. A torn last line (a killed process) is ignored. Changes of the ps set (X: a checkpoint restored on
another number of ps tasks): growing (1 -> 2, 2 -> 3), shrinking (2 -> 1) and both (1 -> 2 -> 1) pass, with the
newest layout judged and the old layout's checkpoint carried; a loss or a double on either side of a change, a
step the resharded checkpoint holds applied again, and a reshard of a checkpoint no journal recorded are caught.
A commit ps 0 set aside (V: its step planned again) must be applied nowhere; an async push ps 0 dropped after the
last step (E) may be applied once on the other tasks, never twice and never on ps 0. An empty journal (a process that
recorded nothing) is no layout.
tests/reshard_journal_test.sh does the same on the journals of real runs."""
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
    """ps: {(task, start[, num_ps (2)]): [lines]}, workers: {(worker, start): [lines]}; returns (exit code, counts,
    output)."""
    with tempfile.TemporaryDirectory() as d:
        for key, lines in ps.items():
            task, start, num_ps = key if len(key) == 3 else key + (2,)
            torn = "A 0 9 9" if tag == "torn" and task == 0 else ""
            write(d, "applied.ps%d-of-%d.%020d-1.journal" % (task, num_ps, start), lines, torn)
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

# An elastic job with a global batch planned step 6 again after worker 0's commit (V on ps 0): that push is
# applied nowhere, the one computed again is applied once. Without the V record it is lost; applied, doubled.
def set_aside():
    ps, w = clean()
    ps[(0, 1)] += ["K 0 6 999", "V 0 6 999"]
    ps[(1, 1)] += ["K 0 6 999"]
    for t in (0, 1):
        steps(0, 6, 7, 100, ps[(t, 1)])
    w[(0, 1)] += ["P 0 6 999 accepted 7"] + acks(0, 6, 7, 100)
    return ps, w


ps, w = set_aside()
expect("set aside", ps, w, 0, accepted=7, applied_once=7, set_aside=1, dropped=1, lost=0, doubled=0)
ps[(0, 1)].remove("V 0 6 999")
expect("... without its V record", ps, w, 1, lost=1)
ps, w = set_aside()
ps[(1, 1)] += ["A 0 6 999 7"]
expect("... and applied", ps, w, 1, doubled=2)

# An async upload cut off with some slices applied (P): counted, not an error (it was never acknowledged).
ps, w = clean()
ps[(0, 1)] += ["K 0 6 777", "P 0 6 777 1 2"]
expect("partly applied", ps, w, 0, partly_applied=1, lost=0, doubled=0)

# Async: ps 0 dropped a push that came after the run's last step (E) while ps 1 had applied its part on arrival:
# counted, not an error. Applied twice on ps 1, applied on ps 0 too, or without ps 0's E record: doubled.
def after_end():
    ps, w = clean()
    ps[(0, 1)] += ["E 0 6 106"]
    ps[(1, 1)] += ["A 0 6 106 7"]
    w[(0, 1)] += acks(0, 6, 7, 100, "dropped_stale")
    return ps, w


ps, w = after_end()
expect("dropped after the end", ps, w, 0, applied_after_end=1, dropped=1, lost=0, doubled=0)
ps[(1, 1)] += ["A 0 6 106 7"]
expect("... applied twice", ps, w, 1, applied_after_end=0, doubled=1)
ps, w = after_end()
ps[(0, 1)] += ["A 0 6 106 7"]
expect("... applied on ps 0", ps, w, 1, applied_after_end=0, doubled=1)
ps, w = after_end()
ps[(0, 1)].remove("E 0 6 106")
expect("... without its E record", ps, w, 1, applied_after_end=0, doubled=1)

# A restore that went back to a checkpoint copied after the push: the push must still be there.
ps, w = clean()
for t in (0, 1):
    ps[(t, 1)].append("C 6")
ps[(1, 1)].remove("A 0 5 105 6")
ps[(1, 1)].append("R 6")
expect("restore after the update", ps, w, 1, lost=1)

# Changes of the ps set (a checkpoint restored on another number of ps tasks: X <label> <old num_ps>). The old
# layout trains steps 0-5 and copies checkpoint 4; the new one restores it resharded (steps 4 and 5 are undone)
# and the workers push steps 4-7 again under new request ids. What the new tasks hold is what the old tasks' copy
# of checkpoint 4 held, plus what they applied since.
def change(before, after, first_end=6, label=4):
    ps = {}
    for t in range(before):
        lines = ps[(t, 1, before)] = ["I"]
        steps(0, 0, label, 100, lines)
        lines.append("C %d" % label)
        steps(0, label, first_end, 100, lines)
    for t in range(after):
        lines = ps[(t, 2, after)] = ["X %d %d" % (label, before)]
        steps(0, label, 8, 200, lines)
    return ps, {(0, 1): acks(0, 0, first_end, 100), (0, 2): acks(0, label, 8, 200)}


ps, w = change(1, 2)
expect("grow 1 -> 2", ps, w, 0, accepted=10, applied_once=8, undone=2, lost=0, doubled=0, ps_tasks=2,
       updates_checked=20, reshards=2)
ps, w = change(2, 1)
expect("shrink 2 -> 1", ps, w, 0, accepted=10, applied_once=8, undone=2, lost=0, doubled=0, ps_tasks=1,
       updates_checked=10, reshards=1)
ps, w = change(2, 3)
expect("grow 2 -> 3", ps, w, 0, accepted=10, applied_once=8, undone=2, lost=0, doubled=0, ps_tasks=3)

# 1 -> 2 -> 1: the newest layout is judged, though an older one had as many tasks.
ps, w = change(1, 2)
ps[(0, 2, 2)].append("C 8")
ps[(1, 2, 2)].append("C 8")
ps[(0, 3, 1)] = ["X 8 2"]
steps(0, 8, 10, 300, ps[(0, 3, 1)])
w[(0, 3)] = acks(0, 8, 10, 300)
expect("grow 1 -> 2, shrink 2 -> 1", ps, w, 0, accepted=12, applied_once=10, undone=2, lost=0, doubled=0,
       ps_tasks=1, reshards=3)
ps[(1, 2, 2)].remove("A 0 5 205 6")
expect("... lost in the middle", ps, w, 1, lost=1)

# Losses and doubles on either side of the change.
for before, after in ((1, 2), (2, 1)):
    name = "%d -> %d" % (before, after)
    ps, w = change(before, after)
    ps[(before - 1, 1, before)].remove("A 0 2 102 3")
    expect(name + ": lost before", ps, w, 1, lost=1)
    ps, w = change(before, after)
    ps[(after - 1, 2, after)].remove("A 0 6 206 7")
    expect(name + ": lost after", ps, w, 1, lost=1)
    ps, w = change(before, after)
    ps[(0, 1, before)].insert(4, "A 0 1 101 2")
    expect(name + ": doubled before", ps, w, 1, doubled=1)
    ps, w = change(before, after)
    ps[(after - 1, 2, after)].append("A 0 6 206 7")
    expect(name + ": doubled after", ps, w, 1, doubled=1)
    # A step the checkpoint holds, applied again after the reshard: under its old request id, or a new one.
    ps, w = change(before, after)
    ps[(0, 2, after)] += ["K 0 3 103", "A 0 3 103 4"]
    expect(name + ": reapplied request", ps, w, 1, doubled=1)
    ps, w = change(before, after)
    ps[(0, 2, after)] += ["K 0 3 203", "A 0 3 203 4"]
    expect(name + ": reapplied step", ps, w, 1, doubled=1)

# Checkpoint 6 holds steps 4 and 5: a reshard of it must carry them (nothing excuses their absence).
ps, w = change(1, 2, label=6)
expect("reshard after the update", ps, w, 0, accepted=8, applied_once=8, lost=0, doubled=0)
ps[(0, 1, 1)].remove("A 0 5 105 6")
expect("... one missing from it", ps, w, 1, lost=1)

# A restart within the new layout that restores the old layout's checkpoint again (X in the middle of its journal).
ps, w = change(1, 2)
for t in range(2):
    ps[(t, 3, 2)] = ["X 4 1"]
    steps(0, 4, 8, 300, ps[(t, 3, 2)])
w[(0, 3)] = acks(0, 4, 8, 300)
expect("reshard again", ps, w, 0, accepted=14, applied_once=8, undone=6, lost=0, doubled=0)

# ps 0 killed in a grow 1 -> 2 and started again with the spec: its new process opens a journal of 1 ps task that
# records nothing (the chief restores it into the 2-task layout at once), between the joiner's journal and its own of
# 2 tasks. An empty journal is no layout: the 2 tasks are judged together.
ps, w = change(1, 2)
ps[(0, 4, 2)] = ps.pop((0, 2, 2))
ps[(0, 3, 1)] = []
expect("grow with ps 0 restarted", ps, w, 0, accepted=10, applied_once=8, undone=2, lost=0, doubled=0, ps_tasks=2)

# A reshard of a checkpoint the journals never recorded: of a layout without journals, or a label not copied.
ps, w = change(1, 2)
del ps[(0, 1, 1)]
expect("reshard of no journal", ps, w, 2)
ps, w = change(1, 2)
ps[(1, 2, 2)][0] = "X 3 1"
expect("reshard of unknown label", ps, w, 2)

if failures:
    print("\n".join(failures))
    sys.exit(1)
print("PASS")
