#!/usr/bin/env python3
"""Puts the timelines of a cluster's processes on one timeline (docs/timelines.md).

    scripts/merge_traces.py DIR [-o OUT]

reads every DIR/*.trace.json that dtrain_worker, dtrain_ps or dtrain_bench wrote with --trace_steps/--trace_dir
(Chrome trace-event JSON, one file per process) and writes one file (DIR/merged.trace.json by default) that
Perfetto (ui.perfetto.dev) and chrome://tracing open: one track per process (ps tasks first, then the workers)
and per thread.

Clocks: each process stamps its events with its host's steady clock. A worker measured, when it registered, its
clock's offset to each ps task's (the task's clock in its answer against the middle of the round trip: the
file's otherData.clock_offsets). Every event is moved onto ps task 0's clock: a worker's by its offset to task 0,
another ps task k's by (offset to 0) - (offset to k) of the worker whose two round trips were shortest. Without a
ps 0 (local mode, or a worker alone) nothing moves. The merged file's otherData says what moved by how much.
"""
import argparse
import glob
import json
import os
import sys


def load(path):
    try:
        with open(path) as f:
            trace = json.load(f)
    except (OSError, ValueError) as e:
        sys.exit(f"merge_traces: cannot read {path}: {e}")
    other = trace.get("otherData", {})
    if other.get("format") != "dtrain-trace" or "traceEvents" not in trace:
        sys.exit(f"merge_traces: {path} is not a dtrain trace file (no otherData.format 'dtrain-trace')")
    if other.get("version") != 1:
        sys.exit(f"merge_traces: {path} has version {other.get('version')}; this script reads version 1")
    return trace


def role(process):
    """("ps", 0), ("worker", 3), or ("other", name) for sorting and alignment."""
    parts = process.split()
    if len(parts) == 2 and parts[0] in ("ps", "worker") and parts[1].isdigit():
        return parts[0], int(parts[1])
    return "other", process


def offsets_of(trace):
    """ps task -> (offset_ns, rtt_ns) that this worker measured."""
    return {o["ps_task"]: (o["offset_ns"], o["rtt_ns"]) for o in trace["otherData"].get("clock_offsets", [])}


def shifts(traces):
    """Per file: nanoseconds to add to its timestamps to put them on ps 0's clock (None: unknown, left as is)."""
    kinds = {path: role(t["otherData"]["process"]) for path, t in traces.items()}
    has_ps0 = any(k == ("ps", 0) for k in kinds.values())
    out = {}
    for path, t in traces.items():
        kind, index = kinds[path]
        if kind == "ps" and index == 0:
            out[path] = 0
        elif kind in ("worker", "other") and has_ps0:
            off = offsets_of(t).get(0)
            out[path] = off[0] if off is not None else None
        elif kind == "ps" and has_ps0:
            # Through the worker that measured both tasks with the shortest round trips.
            best = None
            for other in traces.values():
                o = offsets_of(other)
                if 0 in o and index in o:
                    rtt = o[0][1] + o[index][1]
                    if best is None or rtt < best[0]:
                        best = (rtt, o[0][0] - o[index][0])
            out[path] = best[1] if best is not None else None
        else:
            out[path] = 0
    return out


def merge(directory, out_path):
    paths = sorted(p for p in glob.glob(os.path.join(directory, "*.trace.json"))
                   if os.path.abspath(p) != os.path.abspath(out_path))
    if not paths:
        sys.exit(f"merge_traces: no *.trace.json files in {directory} "
                 f"(run with --trace_steps=A:B --trace_dir={directory})")
    traces = {p: load(p) for p in paths}
    moved = shifts(traces)
    has_ps0 = any(role(t["otherData"]["process"]) == ("ps", 0) for t in traces.values())
    order = sorted(paths, key=lambda p: (["ps", "worker", "other"].index(role(traces[p]["otherData"]["process"])[0]),
                                         str(role(traces[p]["otherData"]["process"])[1])))
    events, notes = [], []
    for n, path in enumerate(order):
        t = traces[path]
        pid = n + 1  # processes of different hosts may share a pid: one of our own per file
        shift_ns = moved[path]
        shift_us = (shift_ns or 0) / 1e3
        for e in t["traceEvents"]:
            e = dict(e)
            e["pid"] = pid
            if "ts" in e:
                e["ts"] = e["ts"] + shift_us
            events.append(e)
        events.append({"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0, "args": {"sort_index": n}})
        rtt = offsets_of(t).get(0, (None, None))[1]
        notes.append({"file": os.path.basename(path), "process": t["otherData"]["process"], "pid": pid,
                      "shift_ns": shift_ns, "aligned": shift_ns is not None,
                      "rtt_to_ps0_ns": rtt if has_ps0 and role(t["otherData"]["process"]) != ("ps", 0) else None,
                      "dropped_events": t["otherData"].get("dropped_events", 0)})
    clock = "ps 0's steady clock, microseconds" if has_ps0 else "each process's own steady clock, microseconds"
    merged = {"traceEvents": events, "displayTimeUnit": "ms",
              "otherData": {"format": "dtrain-trace-merged", "version": 1, "clock": clock,
                            "processes": notes}}
    tmp = out_path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(merged, f)
    os.replace(tmp, out_path)
    return notes


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir", help="the --trace_dir of the cluster's processes")
    ap.add_argument("-o", "--out", help="the merged file (default DIR/merged.trace.json)")
    args = ap.parse_args()
    if not os.path.isdir(args.dir):
        sys.exit(f"merge_traces: {args.dir} is not a directory")
    out = args.out or os.path.join(args.dir, "merged.trace.json")
    for n in merge(args.dir, out):
        how = "unaligned (no clock offset to ps 0 in its file)" if not n["aligned"] else \
            f"shifted {n['shift_ns'] / 1e6:+.3f} ms"
        if n["aligned"] and n["rtt_to_ps0_ns"]:
            how += f" (within {n['rtt_to_ps0_ns'] / 2e6:.3f} ms: half its round trip to ps 0)"
        print(f"{n['process']:>12}: {n['file']}, {how}" +
              (f", {n['dropped_events']} events dropped (over the cap)" if n["dropped_events"] else ""))
    print(f"wrote {out} (open it in https://ui.perfetto.dev or chrome://tracing)")


if __name__ == "__main__":
    main()
