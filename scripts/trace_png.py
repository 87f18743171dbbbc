#!/usr/bin/python3
"""Draws a timeline (a merged or single trace file of --trace_steps) as a PNG: one row per process and thread,
one bar per event, coloured by kind (docs/timelines.md).

    /usr/bin/python3 scripts/trace_png.py MERGED.json OUT.png [--steps A:B]

--steps draws only the events of those steps (default: the first three traced). Needs matplotlib
(python3-matplotlib; Debian's, hence /usr/bin/python3).
"""
import argparse
import json
import sys

COLOURS = {
    "step": "#dddddd", "input": "#8c564b", "forward": "#1f77b4", "backward": "#ff7f0e", "pull": "#2ca02c",
    "push": "#d62728", "transport": "#9467bd", "ps push": "#e377c2", "ps apply": "#17becf", "ps wait": "#bcbd22",
    "ps pull": "#7f7f7f", "ps checkpoint": "#000000",
}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace")
    ap.add_argument("out")
    ap.add_argument("--steps", help="A:B, the steps to draw")
    args = ap.parse_args()
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch
    except ImportError:
        sys.exit(f"trace_png: {sys.executable} has no matplotlib (apt-get install python3-matplotlib; run it with "
                 "/usr/bin/python3)")
    with open(args.trace) as f:
        trace = json.load(f)
    events = trace["traceEvents"]
    procs = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "process_name"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
               if e.get("ph") == "M" and e["name"] == "thread_name"}
    x = [e for e in events if e.get("ph") == "X"]
    if not x:
        sys.exit(f"trace_png: {args.trace} holds no events")
    steps = sorted({e["args"]["step"] for e in x})
    if args.steps:
        a, b = (int(v) for v in args.steps.split(":"))
    else:
        a, b = steps[0], steps[min(2, len(steps) - 1)]
    x = [e for e in x if a <= e["args"]["step"] <= b]
    if not x:
        sys.exit(f"trace_png: no events of steps {a}..{b} (the file has {steps[0]}..{steps[-1]})")
    t0 = min(e["ts"] for e in x)
    rows = sorted({(e["pid"], e["tid"]) for e in x},
                  key=lambda r: (procs.get(r[0], ""), threads.get(r, "~") != "training loop", threads.get(r, "~"), r[1]))
    row_of = {r: i for i, r in enumerate(rows)}
    fig, ax = plt.subplots(figsize=(14, 0.45 * len(rows) + 1.5))
    # Depth within a row: an event inside another is drawn thinner on top of it.
    for e in sorted(x, key=lambda e: (-e["dur"], e["ts"])):
        y = row_of[(e["pid"], e["tid"])]
        h = 0.8 if e["cat"] == "step" else 0.6 if e["cat"] in ("input", "forward", "backward", "pull", "push") else 0.4
        ax.broken_barh([((e["ts"] - t0) / 1e3, max(e["dur"] / 1e3, 0.01))], (y - h / 2, h),
                       facecolors=COLOURS.get(e["cat"], "#999999"), edgecolor="none")
    ax.set_yticks(range(len(rows)))
    names = [threads.get((p, t), f"thread {t}") for p, t in rows]
    # Threads of one name (a ps's handlers) are told apart by their ids.
    keys = [(p, n) for (p, _), n in zip(rows, names)]
    labels = [f"{procs.get(p, p)}: {n}" + (f" ({t})" if keys.count((p, n)) > 1 else "")
              for (p, t), n in zip(rows, names)]
    ax.set_yticklabels(labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("ms (ps 0's clock)" if trace.get("otherData", {}).get("format") == "dtrain-trace-merged" else "ms")
    ax.set_title(f"steps {a}..{b}")
    used = sorted({e["cat"] for e in x})
    ax.legend(handles=[Patch(color=COLOURS.get(c, "#999999"), label=c) for c in used], fontsize=7, ncol=6,
              loc="upper center", bbox_to_anchor=(0.5, -0.18))
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out} ({len(x)} events of steps {a}..{b})")


if __name__ == "__main__":
    main()
