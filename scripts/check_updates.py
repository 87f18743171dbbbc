#!/usr/bin/env python3
"""Proves that no acknowledged push was lost or applied twice, from the journals a run kept:

  - each ps task's applied journal (dtrain_ps --journal_applied: <checkpoint_dir>/applied.ps<T>-of-<N>.*.journal,
    ps/checkpoint/applied_journal.h): what it accepted (K) and applied (A), where it copied a checkpoint (C) and
    what it restored (R: its checkpoint; X: a checkpoint of another number of ps tasks; I: fresh initial values);
  - each worker's push journal (dtrain_worker --push_journal_dir=DIR: pushes.w<W>.*.journal,
    ps/client/push_journal.h): every push ps task 0 acknowledged, with its outcome.

Each task's journal files (one per process) are replayed in order: A records extend the task's lineage of applied
pushes, C notes where checkpoint <label> was copied, and a restore cuts the lineage back to that point (the
pushes after it are undone). What is left is what the task's final state holds. Then, for every push a worker
saw acknowledged:

  - accepted (or a duplicate of an accepted one): on every ps task it is in the final lineage exactly once, or
    else a restore came after the task accepted it and undid it (the restored checkpoint was copied before the
    push was applied: label < the step its update made, sync: step + 1); anything else is LOST;
  - dropped (stale, backup, skipped for NaN/Inf): it is in no task's final lineage.

A push in a final lineage twice (the same request id, or two request ids of one worker for one step) is DOUBLED.
Pushes applied without a worker's record of the acknowledgement (a worker killed before it heard back) are
counted, not errors.

  scripts/check_updates.py --ps_dir=CKPT [--ps_dir=CKPT2 ...] --worker_dir=DIR [--json] [--quiet]

Prints one summary line ("check_updates: ...: lost 0, doubled 0"), and with --json one JSON object after it.
Exit 0 when nothing was lost or doubled, 1 when something was, 2 for bad input (no journals, a malformed line,
a restore of a checkpoint the journal never recorded).
"""
import argparse
import collections
import glob
import json
import os
import re
import sys

PS_NAME = re.compile(r"^applied\.ps(\d+)-of-(\d+)\.(\d+)-(\d+)\.journal$")
WORKER_NAME = re.compile(r"^pushes\.w(\d+)\.(\d+)-(\d+)\.journal$")
ACCEPTED = ("accepted", "duplicate")
DROPPED = ("dropped_stale", "dropped_backup", "skipped_nonfinite")


class BadInput(Exception):
    pass


def journal_lines(path):
    """The records of one journal file: (line number, fields); a last line without its newline is torn (the
    process was killed while writing it) and left out."""
    with open(path, "rb") as f:
        data = f.read().decode("ascii", errors="replace")
    lines = data.split("\n")
    if lines and lines[-1] != "":
        lines = lines[:-1]  # torn
    out = []
    for n, line in enumerate(lines, 1):
        if not line or line.startswith("#"):
            continue
        out.append((n, line.split()))
    return out


def files_in(dirs, pattern):
    found = []
    for d in dirs:
        for path in glob.glob(os.path.join(d, "*.journal")):
            m = pattern.match(os.path.basename(path))
            if m:
                found.append((path, m))
    return found


class Task:
    """One ps task's replay: its final lineage of applied pushes and the history around it."""

    def __init__(self, task, num_ps):
        self.task, self.num_ps = task, num_ps
        self.events = []          # (seq, kind, fields) in order
        self.lineage = []         # (worker, step, rid, at) applied and not undone
        self.checkpoints = {}     # label -> lineage length when it was copied
        self.accepted = collections.defaultdict(list)  # (worker, rid) -> [seq of K]
        self.applied_at = {}      # (worker, rid) -> at of its (last) A, in any lineage
        self.restores = []        # (seq, label or None for I, kind)
        self.undone = 0           # applied pushes cut by restores
        self.baseline = None      # X: the label of a resharded checkpoint the lineage starts from

    def replay(self, path, records):
        for n, f in records:
            where = "%s:%d" % (path, n)
            seq = len(self.events)
            self.events.append((seq, f[0], f[1:]))
            try:
                if f[0] == "K" and len(f) == 4:
                    self.accepted[(int(f[1]), int(f[3]))].append(seq)
                elif f[0] == "A" and len(f) == 5:
                    w, s, rid, at = int(f[1]), int(f[2]), int(f[3]), int(f[4])
                    self.lineage.append((w, s, rid, at))
                    self.applied_at[(w, rid)] = at
                elif f[0] == "C" and len(f) == 2:
                    self.checkpoints[int(f[1])] = len(self.lineage)
                elif f[0] in ("R", "X") and len(f) == (2 if f[0] == "R" else 3):
                    label = int(f[1])
                    if f[0] == "R":
                        if label not in self.checkpoints:
                            raise BadInput("%s: ps task %d restored checkpoint %d, which its journal never "
                                           "recorded (journal files missing, or the checkpoint comes from a "
                                           "run without --journal_applied)" % (where, self.task, label))
                        keep = self.checkpoints[label]
                    else:
                        keep = 0
                        self.baseline = label
                    self.undone += len(self.lineage) - keep
                    del self.lineage[keep:]
                    self.checkpoints = {k: v for k, v in self.checkpoints.items() if k <= label and v <= keep}
                    self.restores.append((seq, label, f[0]))
                elif f[0] == "I" and len(f) == 1:
                    self.undone += len(self.lineage)
                    self.lineage = []
                    self.checkpoints = {}
                    self.baseline = None
                    self.restores.append((seq, None, "I"))
                else:
                    raise ValueError
            except ValueError:
                raise BadInput("%s: malformed record %r" % (where, " ".join(f)))

    def finish(self):
        self.count = collections.Counter((w, rid) for w, s, rid, at in self.lineage)
        by_step = collections.defaultdict(set)
        for w, s, rid, at in self.lineage:
            by_step[(w, s)].add(rid)
        self.doubled = sorted(k for k, c in self.count.items() if c > 1)
        self.doubled_steps = sorted(k for k, rids in by_step.items() if len(rids) > 1)

    def excused(self, worker, step, rid):
        """How an accepted push absent from the final lineage was undone: 'restore' when a restore after its
        acceptance went back to before its update; 'resharded' when a resharded checkpoint taken after its update
        carries it; None (lost)."""
        ks = self.accepted.get((worker, rid))
        if not ks:
            return None
        at = self.applied_at.get((worker, rid), step + 1)
        for seq, label, kind in self.restores:
            if seq < ks[0]:
                continue
            if kind == "I" or label < at:
                return "restore"
            if kind == "X":
                return "resharded"
        return None


def check(ps_dirs, worker_dirs):
    ps_files = files_in(ps_dirs, PS_NAME)
    if not ps_files:
        raise BadInput("no applied journals (applied.ps*.journal) in %s: run the ps tasks with --journal_applied"
                       % ", ".join(ps_dirs))
    worker_files = files_in(worker_dirs, WORKER_NAME)
    if not worker_files:
        raise BadInput("no push journals (pushes.w*.journal) in %s: run the workers with --push_journal_dir"
                       % ", ".join(worker_dirs))
    tasks = {}
    for path, m in sorted(ps_files, key=lambda pm: (int(pm[1].group(3)), pm[0])):
        key = (int(m.group(1)), int(m.group(2)))
        tasks.setdefault(key, Task(*key)).replay(path, journal_lines(path))
    layouts = sorted({n for _, n in tasks})
    num_ps = layouts[-1]
    final = [tasks[(t, num_ps)] for t in range(num_ps) if (t, num_ps) in tasks]
    if len(final) != num_ps:
        raise BadInput("journals of %d of the %d ps tasks found" % (len(final), num_ps))
    for t in tasks.values():
        t.finish()

    acks = {}
    for path, m in sorted(worker_files, key=lambda pm: (int(pm[1].group(2)), pm[0])):
        for n, f in journal_lines(path):
            if f[0] != "P" or len(f) != 6:
                raise BadInput("%s:%d: malformed record %r" % (path, n, " ".join(f)))
            w, s, rid, outcome = int(f[1]), int(f[2]), int(f[3]), f[4]
            if outcome not in ACCEPTED + DROPPED:
                raise BadInput("%s:%d: unknown outcome %r" % (path, n, outcome))
            acks.setdefault((w, rid), (w, s, rid, outcome))

    r = collections.Counter()
    problems = []
    for (w, rid), (_, s, _, outcome) in sorted(acks.items()):
        r["acknowledged"] += 1
        if outcome in DROPPED:
            r["dropped"] += 1
            on = [t.task for t in final if t.count[(w, rid)] > 0]
            if on:
                r["doubled"] += 1
                problems.append("worker %d's push of step %d (request %d) was acknowledged as %s but is applied "
                                "on ps task(s) %s" % (w, s, rid, outcome, on))
            continue
        r["accepted"] += 1
        verdicts = []
        for t in final:
            n = t.count[(w, rid)]
            if n == 1:
                verdicts.append("once")
            elif n > 1:
                verdicts.append("doubled")
            else:
                verdicts.append(t.excused(w, s, rid) or "lost")
        r["updates_checked"] += len(final)
        if "doubled" in verdicts:
            r["doubled"] += 1
            problems.append("worker %d's push of step %d (request %d) is applied more than once: %s"
                            % (w, s, rid, verdicts))
        elif "lost" in verdicts:
            r["lost"] += 1
            problems.append("worker %d's push of step %d (request %d) was acknowledged (%s) but is lost: %s"
                            % (w, s, rid, outcome, verdicts))
        elif "restore" in verdicts:
            r["undone"] += 1
        elif "resharded" in verdicts:
            r["resharded"] += 1
        else:
            r["applied_once"] += 1
    for t in final:
        for w, rid in t.doubled:
            if (w, rid) not in acks:
                r["doubled"] += 1
                problems.append("ps task %d applied worker %d's push (request %d) %d times"
                                % (t.task, w, rid, t.count[(w, rid)]))
        for w, s in t.doubled_steps:
            r["doubled"] += 1
            problems.append("ps task %d applied two different pushes of worker %d for step %d" % (t.task, w, s))
        r["unacknowledged_applied"] += sum(1 for k in t.count if k not in acks)
        r["restores"] += sum(1 for _, _, kind in t.restores if kind != "I")
        r["undone_applies"] += t.undone
    r["workers"] = len({w for w, _ in acks})
    r["ps_tasks"] = len(final)
    return r, problems


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ps_dir", action="append", required=True, help="a directory with applied journals")
    ap.add_argument("--worker_dir", action="append", required=True, help="a directory with push journals")
    ap.add_argument("--json", action="store_true", help="also print the counts as one JSON object")
    ap.add_argument("--quiet", action="store_true", help="no line per problem")
    a = ap.parse_args()
    try:
        r, problems = check(a.ps_dir, a.worker_dir)
    except (BadInput, OSError) as e:
        print("check_updates: %s" % e, file=sys.stderr)
        return 2
    if not a.quiet:
        for p in problems[:20]:
            print("check_updates: " + p)
        if len(problems) > 20:
            print("check_updates: ... and %d more" % (len(problems) - 20))
    print("check_updates: %d pushes acknowledged to %d workers, checked on %d ps tasks (%d updates): accepted %d "
          "(applied exactly once %d, undone by a restore %d%s), dropped %d (applied nowhere); lost %d, doubled %d; "
          "%d applied without a recorded acknowledgement; %d restores to a checkpoint undid %d applies"
          % (r["acknowledged"], r["workers"], r["ps_tasks"], r["updates_checked"], r["accepted"], r["applied_once"],
             r["undone"], ", carried by a resharded checkpoint %d" % r["resharded"] if r["resharded"] else "",
             r["dropped"], r["lost"], r["doubled"], r["unacknowledged_applied"], r["restores"], r["undone_applies"]))
    if a.json:
        print(json.dumps(dict(r), sort_keys=True))
    return 1 if r["lost"] or r["doubled"] else 0


if __name__ == "__main__":
    sys.exit(main())
