#!/usr/bin/env python3
"""What timelines cost end to end: dtrain_bench runs interleaved, A/B in the same session (docs/timelines.md).

    scripts/trace_overhead.py [--base OTHER_BUILD/bin/dtrain_bench] [--rounds 5] [--model cnn] [-- BENCH ARGS]

Each round runs, one after the other: the base binary (another build, say main's, when given), this build's
dtrain_bench without tracing (off), and with every step traced (on: --trace_steps over the whole run). Per run:
the bench's median examples/sec and the process's CPU seconds (user + sys, which other work on a shared core
disturbs less than the wall clock). Prints each run, then the medians and each variant's ratio to off.
Runs under the caller's CPU affinity (prefix `taskset -c N` to pin it).
"""
import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--bench", default=os.path.join(here, "..", "build", "bin", "dtrain_bench"))
    ap.add_argument("--base", help="another build's dtrain_bench (without timelines, say)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--model", default="cnn")
    ap.add_argument("bench_args", nargs="*", help="more dtrain_bench flags (after --)")
    args = ap.parse_args()
    common = [f"--model={args.model}", "--batch_size=50", "--threads=1", "--warmup_steps=5", "--window_steps=20",
              "--windows=5", "--steps_total=0"] + args.bench_args
    variants = (["base"] if args.base else []) + ["off", "on"]
    tmp = tempfile.mkdtemp(prefix="trace_overhead.")
    results = {v: [] for v in variants}
    try:
        for r in range(args.rounds):
            for v in variants:
                cmd = [args.base if v == "base" else args.bench] + common
                if v == "on":
                    shutil.rmtree(os.path.join(tmp, "t"), ignore_errors=True)
                    cmd += ["--trace_steps=0:1000000", f"--trace_dir={os.path.join(tmp, 't')}"]
                before = resource.getrusage(resource.RUSAGE_CHILDREN)
                out = subprocess.run(cmd, capture_output=True, text=True)
                after = resource.getrusage(resource.RUSAGE_CHILDREN)
                if out.returncode != 0 or "median=" not in out.stdout:
                    sys.exit(f"trace_overhead: {' '.join(cmd)} failed:\n{out.stderr[-2000:]}")
                cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
                rate = float(out.stdout.split("median=")[1].split()[0])
                results[v].append((rate, cpu))
                print(f"round {r}: {v:4} {rate:9.1f} examples/sec {cpu:7.3f} CPU s", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    off_rate = statistics.median(x[0] for x in results["off"])
    off_cpu = statistics.median(x[1] for x in results["off"])
    for v in variants:
        rate = statistics.median(x[0] for x in results[v])
        cpu = statistics.median(x[1] for x in results[v])
        print(f"{v:4}: median {rate:9.1f} examples/sec ({rate / off_rate:.3f} x off), "
              f"{cpu:7.3f} CPU s a run ({cpu / off_cpu:.3f} x off)")


if __name__ == "__main__":
    main()
