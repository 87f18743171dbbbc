#!/usr/bin/env python3
"""Proves that no acknowledged push was lost or applied twice, from the journals a run kept:

  - each ps task's applied journal (dtrain_ps --journal_applied: <checkpoint_dir>/applied.ps<T>-of-<N>.*.journal,
    ps/checkpoint/applied_journal.h): what it accepted (K) and applied (A), where it copied a checkpoint (C) and
    what it restored (R: its checkpoint; X: a checkpoint of another number of ps tasks; I: fresh initial values)
    which accepted commits ps 0 set aside (V), which async pushes ps 0 dropped after the run's last step (E: the
    other tasks apply their parts on arrival, so such a push may be applied once on them; counted, never an error),
    and which async uploads were cut off partly applied (P: under
    --nonfinite=apply each slice is applied as it arrives whole; counted, never acknowledged);
  - each worker's push journal (dtrain_worker --push_journal_dir=DIR: pushes.w<W>.*.journal,
    ps/client/push_journal.h): every push ps task 0 acknowledged, with its outcome.

The journal files (one per process) are replayed in the order the processes started; a run of files of one
number of ps tasks is a layout, and the newest layout is the one judged. Each task's A records extend its lineage
of applied pushes, C notes what checkpoint <label> holds (the lineage so far), and a restore replaces the lineage
by what the restored checkpoint holds (the pushes after it are undone): R by the task's own copy; X by the copies of
the tasks of the newest earlier layout of <num_ps> tasks (a resharded checkpoint: each new task's slices come from
the old tasks' files, so its state holds one history, a strand, per old task, each checked); I by nothing. What is
left is what the task's final state holds. Then, for every push a worker saw acknowledged:

  - accepted (or a duplicate of an accepted one): on every ps task of the newest layout, in every strand, it is in
    the final lineage exactly once, or else a restore (in that strand's history: on the task, or on the old task
    before the copy it was resharded from, or the reshard itself) came after a task accepted it and undid it (the
    restored checkpoint was copied before the push was applied: label < the step its update made, sync:
    step + 1); anything else is LOST;
  - dropped (stale, backup, skipped for NaN/Inf), or accepted and then set aside by ps 0 (a V record: an elastic
    job with a global batch planned its step again, and the worker computed it again): it is in no task's final
    lineage.

A push in a final lineage twice (the same request id, or two request ids of one worker for one step: also one that
a resharded checkpoint holds and a new task applied again) is DOUBLED. Pushes applied without a worker's record of
the acknowledgement (a worker killed before it heard back) are counted, not errors. A run whose ps set changed
needs the journals of every layout: pass each run's --ps_dir.

  scripts/check_updates.py --ps_dir=CKPT [--ps_dir=CKPT2 ...] --worker_dir=DIR [--json] [--quiet]

Prints one summary line ("check_updates: ...: lost 0, doubled 0"), and with --json one JSON object after it.
Exit 0 when nothing was lost or doubled, 1 when something was, 2 for bad input (no journals, a malformed line,
a restore of a checkpoint the journals never recorded, journals of only some tasks of the newest layout).
"""
import argparse
import bisect
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


class Snapshot:
    """What a task's state held at one point of its journal (a C record): the base its lineage started from and
    the first n pushes of `applied` (a list only ever appended to: a restore starts a new one)."""

    def __init__(self, task, seq, base, applied):
        self.task, self.seq, self.base, self.applied, self.n = task, seq, base, applied, len(applied)


class Carried:
    """A lineage's start that another task's checkpoint brought: one Snapshot per task whose file the restore read
    (R of an earlier process's copy: one; X: every task of the old layout). The journals say not which slices moved
    where, so every old task counts as a source of every new one: a push missing from one old task's copy is lost
    on each new task, and one an old task holds twice is doubled on each."""

    def __init__(self, sources):
        self.sources = sources


class Task:
    """One ps task of one layout: its replay (its lineage of applied pushes and the history around it)."""

    def __init__(self, task, num_ps, era):
        self.task, self.num_ps, self.era = task, num_ps, era
        self.events = []          # (kind, fields) in order; an event's index is its seq
        self.base = None          # None (initial values) or Carried
        self.applied = []         # (worker, step, rid, at) applied since base, not undone
        self.checkpoints = {}     # label -> Snapshot, the newest copy of each
        self.restores = []        # (seq, label or None for I, kind)
        self.undone = 0           # applied pushes cut by restores
        self.voided = set()       # (worker, rid) of V records: commits ps 0 set aside (their step computed again)
        self.partly = 0           # P records: async uploads cut off with some slices applied (never acknowledged)
        self.after_end = set()    # (worker, rid) of E records: async pushes ps 0 dropped after the run's last step

    def replay(self, path, records, find):
        """find(task, kind, label, from_num_ps, where): the Snapshots an R or X record restored."""
        for n, f in records:
            where = "%s:%d" % (path, n)
            seq = len(self.events)
            self.events.append((f[0], f[1:]))
            try:
                if f[0] == "K" and len(f) == 4:
                    int(f[1]), int(f[2]), int(f[3])
                elif f[0] == "V" and len(f) == 4:
                    int(f[2])
                    self.voided.add((int(f[1]), int(f[3])))
                elif f[0] == "E" and len(f) == 4:
                    int(f[2])
                    self.after_end.add((int(f[1]), int(f[3])))
                elif f[0] == "P" and len(f) == 6:
                    int(f[1]), int(f[2]), int(f[3]), int(f[4]), int(f[5])
                    self.partly += 1
                elif f[0] == "A" and len(f) == 5:
                    self.applied.append((int(f[1]), int(f[2]), int(f[3]), int(f[4])))
                elif f[0] == "C" and len(f) == 2:
                    self.checkpoints[int(f[1])] = Snapshot(self, seq, self.base, self.applied)
                elif (f[0] == "R" and len(f) == 2) or (f[0] == "X" and len(f) == 3):
                    label = int(f[1])
                    sources = find(self, f[0], label, int(f[2]) if f[0] == "X" else self.num_ps, where)
                    snap = sources[0]
                    if snap.task is self and snap.applied is self.applied and snap.base is self.base:
                        self.undone += len(self.applied) - snap.n
                    else:
                        self.undone += len(self.applied)
                    if f[0] == "R" and snap.task is self:
                        self.base, self.applied = snap.base, snap.applied[:snap.n]
                    else:
                        self.base, self.applied = Carried(sources), []
                    self.restores.append((seq, label, f[0]))
                elif f[0] == "I" and len(f) == 1:
                    self.undone += len(self.applied)
                    self.base, self.applied = None, []
                    self.restores.append((seq, None, "I"))
                else:
                    raise ValueError
            except ValueError:
                raise BadInput("%s: malformed record %r" % (where, " ".join(f)))


def strands(base):
    """The histories a state carried from `base` holds: (chain, pushes) each, where chain lists the (task, seq of
    the C record) whose checkpoints it passed through, oldest first, and pushes the applies it holds."""
    if base is None:
        return [([], [])]
    out = []
    for snap in base.sources:
        for chain, pushes in strands(snap.base):
            out.append((chain + [(snap.task, snap.seq)], pushes + snap.applied[:snap.n]))
    return out


class Strand:
    """One history of a final task's state: the pushes it holds, and the timeline that led to it (each task's
    records through the checkpoint the next one restored, then the final task's), to excuse what a restore undid."""

    def __init__(self, chain, pushes):
        self.count = collections.Counter((w, rid) for w, s, rid, at in pushes)
        by_step = collections.defaultdict(set)
        for w, s, rid, at in pushes:
            by_step[(w, s)].add(rid)
        self.doubled = sorted(k for k, c in self.count.items() if c > 1)
        self.doubled_steps = sorted(k for k, rids in by_step.items() if len(rids) > 1)
        self.first_k = {}   # (worker, rid) -> position of its first K in the timeline
        self.at = {}        # (worker, rid) -> at of its last A in any of the chain's tasks
        restores = []       # (position, label or None)
        pos = 0
        for task, cut in chain:
            for seq, (kind, f) in enumerate(task.events):
                if kind == "A":
                    self.at[(int(f[0]), int(f[2]))] = int(f[3])
                after_cut = cut is not None and seq > cut
                if kind == "K":
                    # Accepted after the copy the next task restored: before that restore, all the same.
                    self.first_k.setdefault((int(f[0]), int(f[2])), pos + (cut if after_cut else seq))
                elif kind in ("R", "X", "I") and not after_cut:
                    restores.append((pos + seq, int(f[0]) if f else None))
            pos += len(task.events)
        # For each restore, the lowest label it or a later one went back to (None: fresh initial values).
        self.restore_pos = [p for p, _ in restores]
        self.lowest_after = [None] * len(restores)
        low = float("inf")
        for i in range(len(restores) - 1, -1, -1):
            label = restores[i][1]
            low = -1 if label is None else min(low, label)
            self.lowest_after[i] = low

    def excused(self, worker, step, rid):
        """'restore' when the push, accepted somewhere in this history, was undone by a later restore to before
        its update (a checkpoint copied before the step it made: label < at); None (lost)."""
        k = self.first_k.get((worker, rid))
        if k is None:
            return None
        i = bisect.bisect_right(self.restore_pos, k)
        if i < len(self.restore_pos) and self.lowest_after[i] < self.at.get((worker, rid), step + 1):
            return "restore"
        return None


def replay_all(ps_files):
    """Replays every ps journal in the order the processes started. A run of files of one number of ps tasks is a
    layout (an era); a layout's tasks restore (X) the newest earlier layout of the number of tasks named."""
    tasks = {}       # (era, task) -> Task
    eras = []        # num_ps of each era
    for path, m in sorted(ps_files, key=lambda pm: (int(pm[1].group(3)), pm[0])):
        task, num_ps = int(m.group(1)), int(m.group(2))
        records = journal_lines(path)
        if not records:
            # A process that recorded nothing under this layout held no state of it (a ps 0 started again with the
            # spec's set while the chief moved the job onto another, then restored into that one): no era.
            continue
        if not eras or eras[-1] != num_ps:
            eras.append(num_ps)
        era = len(eras) - 1
        tasks.setdefault((era, task), Task(task, num_ps, era)).replay(path, records, find_in(tasks, eras))
    return tasks, eras


def find_in(tasks, eras):
    def find(task, kind, label, from_num_ps, where):
        if kind == "R":
            for era in [task.era] + [e for e in range(task.era - 1, -1, -1) if eras[e] == task.num_ps]:
                t = tasks.get((era, task.task))
                if t is not None and label in t.checkpoints:
                    return [t.checkpoints[label]]
            raise BadInput("%s: ps task %d restored checkpoint %d, which its journal never recorded (journal files "
                           "missing, or the checkpoint comes from a run without --journal_applied)"
                           % (where, task.task, label))
        older = [e for e in range(task.era - 1, -1, -1) if eras[e] == from_num_ps]
        if not older:
            raise BadInput("%s: ps task %d of %d restored checkpoint %d of %d ps tasks, and no journals of %d ps "
                           "tasks were found (pass the --ps_dir of the run that wrote it, with --journal_applied)"
                           % (where, task.task, task.num_ps, label, from_num_ps, from_num_ps))
        for era in older:
            if (era, 0) in tasks and label in tasks[(era, 0)].checkpoints:
                sources = []
                for t in range(from_num_ps):
                    old = tasks.get((era, t))
                    if old is None or label not in old.checkpoints:
                        raise BadInput("%s: ps task %d of %d restored checkpoint %d of %d ps tasks, which the journal "
                                       "of ps task %d of %d never recorded (journal files missing?)"
                                       % (where, task.task, task.num_ps, label, from_num_ps, t, from_num_ps))
                    sources.append(old.checkpoints[label])
                return sources
        raise BadInput("%s: ps task %d of %d restored checkpoint %d of %d ps tasks, which their journals never "
                       "recorded (journal files missing, or the checkpoint comes from a run without "
                       "--journal_applied)" % (where, task.task, task.num_ps, label, from_num_ps))
    return find


def check(ps_dirs, worker_dirs):
    ps_files = files_in(ps_dirs, PS_NAME)
    if not ps_files:
        raise BadInput("no applied journals (applied.ps*.journal) in %s: run the ps tasks with --journal_applied"
                       % ", ".join(ps_dirs))
    worker_files = files_in(worker_dirs, WORKER_NAME)
    if not worker_files:
        raise BadInput("no push journals (pushes.w*.journal) in %s: run the workers with --push_journal_dir"
                       % ", ".join(worker_dirs))
    tasks, eras = replay_all(ps_files)
    last, num_ps = len(eras) - 1, eras[-1]
    final = [tasks[(last, t)] for t in range(num_ps) if (last, t) in tasks]
    if len(final) != num_ps:
        raise BadInput("journals of %d of the %d ps tasks of the newest layout found" % (len(final), num_ps))
    for t in final:
        t.strands = [Strand(chain + [(t, None)], pushes + t.applied) for chain, pushes in strands(t.base)]

    acks = {}
    for path, m in sorted(worker_files, key=lambda pm: (int(pm[1].group(2)), pm[0])):
        for n, f in journal_lines(path):
            if f[0] != "P" or len(f) != 6:
                raise BadInput("%s:%d: malformed record %r" % (path, n, " ".join(f)))
            w, s, rid, outcome = int(f[1]), int(f[2]), int(f[3]), f[4]
            if outcome not in ACCEPTED + DROPPED:
                raise BadInput("%s:%d: unknown outcome %r" % (path, n, outcome))
            acks.setdefault((w, rid), (w, s, rid, outcome))

    voided = set().union(*(t.voided for t in tasks.values()))
    after_end = set().union(*(t.after_end for t in tasks.values()))
    partly = sum(t.partly for t in tasks.values())
    r = collections.Counter()
    problems = []
    for (w, rid), (_, s, _, outcome) in sorted(acks.items()):
        r["acknowledged"] += 1
        if outcome in ACCEPTED and (w, rid) in voided:
            outcome = "set aside"  # accepted, then its step was planned again: it must be applied nowhere
            r["set_aside"] += 1
        if outcome in DROPPED or outcome == "set aside":
            r["dropped"] += 1
            on = [t.task for t in final if any(st.count[(w, rid)] > 0 for st in t.strands)]
            if (on and (w, rid) in after_end and 0 not in on and
                    all(st.count[(w, rid)] <= 1 for t in final for st in t.strands)):
                # Async: ps 0 dropped it as it came after the run's last step (its E record); another task had
                # applied its part on arrival, once. An update past the end on that task, not a lost or double one.
                r["applied_after_end"] += 1
                continue
            if on:
                r["doubled"] += 1
                problems.append("worker %d's push of step %d (request %d) was acknowledged as %s but is applied "
                                "on ps task(s) %s" % (w, s, rid, outcome, on))
            continue
        r["accepted"] += 1
        verdicts = []
        for t in final:
            per_strand = []
            for st in t.strands:
                n = st.count[(w, rid)]
                per_strand.append("once" if n == 1 else "doubled" if n > 1 else st.excused(w, s, rid) or "lost")
            # The worst of the task's histories (one per old task whose checkpoint it restored resharded).
            verdicts.append(next(v for v in ("doubled", "lost", "restore", "once") if v in per_strand))
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
        else:
            r["applied_once"] += 1
    for t in final:
        doubled = sorted({k for st in t.strands for k in st.doubled if k not in acks})
        for w, rid in doubled:
            r["doubled"] += 1
            problems.append("ps task %d applied worker %d's push (request %d) %d times"
                            % (t.task, w, rid, max(st.count[(w, rid)] for st in t.strands)))
        for w, s in sorted({k for st in t.strands for k in st.doubled_steps}):
            r["doubled"] += 1
            problems.append("ps task %d applied two different pushes of worker %d for step %d" % (t.task, w, s))
        r["unacknowledged_applied"] += len({k for st in t.strands for k in st.count if k not in acks})
    r["partly_applied"] = partly
    for t in tasks.values():
        r["restores"] += sum(1 for _, _, kind in t.restores if kind == "R")
        r["reshards"] += sum(1 for _, _, kind in t.restores if kind == "X")
        r["undone_applies"] += t.undone
    r["workers"] = len({w for w, _ in acks})
    r["ps_tasks"] = len(final)
    return r, problems, eras


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ps_dir", action="append", required=True, help="a directory with applied journals")
    ap.add_argument("--worker_dir", action="append", required=True, help="a directory with push journals")
    ap.add_argument("--json", action="store_true", help="also print the counts as one JSON object")
    ap.add_argument("--quiet", action="store_true", help="no line per problem")
    a = ap.parse_args()
    try:
        r, problems, eras = check(a.ps_dir, a.worker_dir)
    except (BadInput, OSError) as e:
        print("check_updates: %s" % e, file=sys.stderr)
        return 2
    if not a.quiet:
        for p in problems[:20]:
            print("check_updates: " + p)
        if len(problems) > 20:
            print("check_updates: ... and %d more" % (len(problems) - 20))
    print("check_updates: %d pushes acknowledged to %d workers, checked on %d ps tasks%s (%d updates): accepted %d "
          "(applied exactly once %d, undone by a restore %d), dropped %d (applied nowhere%s); lost %d, doubled %d; "
          "%d applied without a recorded acknowledgement; %d restores to a checkpoint undid %d applies%s"
          % (r["acknowledged"], r["workers"], r["ps_tasks"],
             " (ps tasks over time: %s)" % " -> ".join(map(str, eras)) if len(eras) > 1 else "",
             r["updates_checked"], r["accepted"], r["applied_once"], r["undone"], r["dropped"],
             "; %d accepted, then set aside as their step was computed again" % r["set_aside"] if r["set_aside"] else "",
             r["lost"],
             r["doubled"], r["unacknowledged_applied"], r["restores"], r["undone_applies"],
             ("; %d restores of a checkpoint of another number of ps tasks" % r["reshards"] if r["reshards"] else "") +
             ("; %d async uploads cut off with some slices applied (--nonfinite=apply; never acknowledged)"
              % r["partly_applied"] if r["partly_applied"] else "") +
             ("; %d async pushes dropped by ps 0 after the last step but applied once on other ps tasks"
              % r["applied_after_end"] if r["applied_after_end"] else "")))
    if a.json:
        print(json.dumps(dict(r), sort_keys=True))
    return 1 if r["lost"] or r["doubled"] else 0


if __name__ == "__main__":
    sys.exit(main())
