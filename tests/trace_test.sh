#!/usr/bin/env bash
# Timelines (--trace_steps, --trace_dir; docs/timelines.md): 1 ps + 2 sync workers train the mlp for 30 steps
# with steps 10..19 traced, then scripts/merge_traces.py joins the three files. The workers play hosts whose
# clocks differ from the ps's (DTRAIN_TRACE_CLOCK_SKEW_NS: +5 s and -3 s), so only the clock offsets they
# measured at registration put them back. Checks, on the merged file (python's json):
#   - every process has its track (ps 0, worker 0, worker 1), with its threads named;
#   - the events a timeline promises are there: each traced step, its input wait, forward and backward by
#     layer, the waits for parameters, the pushes and pulls per slice; on the ps the pushes received, the sum and
#     apply per slice, the sync wait for the other workers, the pulls served; only steps 10..19;
#   - each traced step's parts (input wait, forward, backward, push and pull waits on the step's thread) sum to
#     within 5% of the step's traced duration (2 of 20 may miss by up to 15%: a preemption between two parts);
#   - after alignment every worker event lies within the ps's traced span, and each push the ps received for a
#     step lies within that worker's step (before alignment they do not: the skew is real);
# and that bad flags fail with a clear message. About 5 s on 2 cores. Needs Fashion-MNIST: exit 77 without.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BIN="${DTRAIN_BIN_DIR:-$ROOT/build/bin}"
source "$(dirname "$0")/skipping.sh"
for b in dtrain_ps dtrain_worker; do
  [ -x "$BIN/$b" ] || { echo "FAIL: $BIN/$b not built (set DTRAIN_BIN_DIR)"; exit 1; }
done
[ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] ||
  skip "dataset-fashion-mnist is not installed (scripts/install_deps.sh)"
source "$(dirname "$0")/checks.sh"
passed=0 failed=0
make_test_dir dtrain_trace_test

# Bad flags: refused before anything starts, naming the flag.
refused() {  # refused EXPECTED_TEXT ARGS...: dtrain_worker exits 2 and says EXPECTED_TEXT
  local want=$1 rc=0; shift
  "$BIN/dtrain_worker" --job_name=local --model=mlp --train_steps=1 "$@" >"$dir/refused.out" 2>&1 || rc=$?
  [ "$rc" = 2 ] && grep -q -- "$want" "$dir/refused.out" || { echo "rc=$rc"; cat "$dir/refused.out"; return 1; }
}
check "trace_steps A > B refused" refused "0 <= A <= B" --trace_steps=9:3 --trace_dir="$dir/t"
check "trace_steps not A:B refused" refused "as A:B" --trace_steps=7 --trace_dir="$dir/t"
check "trace_steps without trace_dir refused" refused "without --trace_dir" --trace_steps=1:2
: >"$dir/a_file"
check "trace_dir that is a file refused" refused "trace_dir=$dir/a_file" --trace_steps=1:2 --trace_dir="$dir/a_file"

IFS=, read -r -a ports < <(python3 "$ROOT/scripts/free_ports.py" 3)
cluster=(--ps_hosts="127.0.0.1:${ports[0]}" --worker_hosts="127.0.0.1:${ports[1]},127.0.0.1:${ports[2]}")
trace=(--trace_steps=10:19 --trace_dir="$dir/trace")
"$BIN/dtrain_ps" --job_name=ps --task_index=0 "${cluster[@]}" --max_run_secs=60 "${trace[@]}" >"$dir/ps.log" 2>&1 &
ps_pid=$!
bg+=("$ps_pid")
wait_for_line "$dir/ps.log" "listening on" 30 || { echo "FAIL: the ps did not start"; cat "$dir/ps.log"; exit 1; }
skews=(-3000000000 5000000000)
wpids=()
for w in 0 1; do
  DTRAIN_TRACE_CLOCK_SKEW_NS=${skews[$w]} "$BIN/dtrain_worker" --job_name=worker --task_index=$w "${cluster[@]}" \
    --model=mlp --train_steps=30 --log_every=10 --eval_every=0 "${trace[@]}" >"$dir/w$w.log" 2>&1 &
  wpids+=($!)
  bg+=($!)
done
rc=0
for p in "${wpids[@]}"; do wait "$p" || rc=$?; done
wait "$ps_pid" || rc=$?
check "the traced run completes" [ "$rc" = 0 ]
[ "$rc" = 0 ] || { tail -5 "$dir"/*.log; exit 1; }
check "three trace files" [ -f "$dir/trace/ps-0.trace.json" -a -f "$dir/trace/worker-0.trace.json" -a \
  -f "$dir/trace/worker-1.trace.json" ]
check "merge_traces.py runs" python3 "$ROOT/scripts/merge_traces.py" "$dir/trace" -o "$dir/merged.json"

check_merged() {
  python3 - "$dir/merged.json" "$dir/trace" <<'PY'
import json, os, sys
merged = json.load(open(sys.argv[1]))
ok = True
def fail(msg):
    global ok
    ok = False
    print("  " + msg)

events = merged["traceEvents"]
procs = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
pid_of = {name: pid for pid, name in procs.items()}
if sorted(procs.values()) != ["ps 0", "worker 0", "worker 1"]:
    fail(f"processes: {sorted(procs.values())}")
    sys.exit(1)
threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
x = [e for e in events if e["ph"] == "X"]
by_pid = {pid: [e for e in x if e["pid"] == pid] for pid in procs}
steps = sorted({e["args"]["step"] for e in x})
if steps != list(range(10, 20)):
    fail(f"traced steps {steps}, not 10..19")

def names(pid):
    return {e["name"] for e in by_pid[pid]}
for w in ("worker 0", "worker 1"):
    n = names(pid_of[w])
    for want in [f"step {s}" for s in range(10, 20)] + ["input wait", "loss", "finish push", "start pull",
                                                       "wait pull header", "wait previous push"]:
        if want not in n:
            fail(f"{w}: no event '{want}'")
    for prefix in ("forward ", "backward ", "wait params ", "push ", "send ", "receive "):
        if not any(s.startswith(prefix) for s in n):
            fail(f"{w}: no event '{prefix}...'")
    if not any(name.startswith(("push lane", "pull lane", "training loop")) for (pid, _), name in threads.items()
               if pid == pid_of[w]):
        fail(f"{w}: threads not named: {[v for (p, _), v in threads.items() if p == pid_of[w]]}")
n = names(pid_of["ps 0"])
for prefix in ("push from worker 0", "push from worker 1", "recv slice ", "sum+apply slice ", "commit",
               "wait for step (other workers)", "pull served to worker 0", "pull served to worker 1"):
    if not any(s.startswith(prefix) for s in n):
        fail(f"ps 0: no event '{prefix}...'")

# Each step's parts tile it. What lies between two parts is untraced code of microseconds; on a shared core a
# preemption there lands in no part, so 2 of the 20 steps may miss by up to 15% (a part left out misses by far
# more: without the pull waits the steps' parts cover a fifth of them).
PARTS = {"input", "forward", "backward", "pull", "push"}
worst = 0.0
misses = []
for w in ("worker 0", "worker 1"):
    ev = by_pid[pid_of[w]]
    for st in [e for e in ev if e["cat"] == "step"]:
        s, begin, end = st["args"]["step"], st["ts"], st["ts"] + st["dur"]
        parts = [e for e in ev if e["tid"] == st["tid"] and e["cat"] in PARTS and e["args"]["step"] == s and
                 e["ts"] >= begin - 1 and e["ts"] + e["dur"] <= end + 1]
        total = sum(e["dur"] for e in parts)
        ratio = total / st["dur"]
        worst = max(worst, abs(1 - ratio))
        if not 0.95 <= ratio <= 1.001:
            misses.append(f"{w} step {s}: parts sum to {total:.0f} us of {st['dur']:.0f} us ({ratio:.3f})")
            if not 0.85 <= ratio <= 1.001:
                fail(misses[-1])
if len(misses) > 2:
    fail("more than 2 steps whose parts are not within 5%: " + "; ".join(misses))
print(f"  steps' parts within {100 * worst:.2f}% of the steps' durations ({len(misses)} steps past 5%)")

# Alignment: the workers' events within the ps's span, and each received push within its worker's step.
ps = by_pid[pid_of["ps 0"]]
# The offset's error is at most half the round trip it was measured over (plus the ps's time in Register).
rtt_us = {n["process"]: (n["rtt_to_ps0_ns"] or 0) / 1e3 for n in merged["otherData"]["processes"]}
lo, hi = min(e["ts"] for e in ps), max(e["ts"] + e["dur"] for e in ps)
def aligned(events_of, label):
    good = True
    for w in ("worker 0", "worker 1"):
        ev = events_of(w)
        wlo, whi = min(e["ts"] for e in ev), max(e["ts"] + e["dur"] for e in ev)
        if wlo < lo - 200e3 or whi > hi + 200e3:
            if label: fail(f"{label}: {w}'s events [{wlo:.0f}, {whi:.0f}] us outside the ps's [{lo:.0f}, {hi:.0f}]")
            good = False
        step_of = {e["args"]["step"]: e for e in ev if e["cat"] == "step"}
        wid = w.split()[1]
        for p in [e for e in ps if e["name"] == f"push from worker {wid}"]:
            st = step_of.get(p["args"]["step"])
            if st is None:
                continue
            slack = rtt_us[w] / 2 + 500
            if p["ts"] < st["ts"] - slack or p["ts"] + p["dur"] > st["ts"] + st["dur"] + slack:
                if label:
                    fail(f"{label}: ps's push from {w} at step {p['args']['step']} [{p['ts']:.0f}, "
                         f"{p['ts'] + p['dur']:.0f}] not within the step [{st['ts']:.0f}, "
                         f"{st['ts'] + st['dur']:.0f}] (+-{slack:.0f} us)")
                good = False
    return good
aligned(lambda w: by_pid[pid_of[w]], "aligned")
# The same files unshifted: the skew must show, or the check above proves nothing.
raw = {}
for f in ("worker-0", "worker-1"):
    t = json.load(open(os.path.join(sys.argv[2], f + ".trace.json")))
    raw[t["otherData"]["process"]] = [e for e in t["traceEvents"] if e["ph"] == "X"]
if aligned(lambda w: raw[w], None):
    fail("the workers' raw (unaligned) events already lie within the ps's span: the clock skew did not apply")
print("  aligned: " + ", ".join(f"{n['process']} {n['shift_ns'] / 1e6:+.3f} ms"
                               for n in merged["otherData"]["processes"]))
sys.exit(0 if ok else 1)
PY
}
check "merged timeline: processes, events, steps' parts, alignment" check_merged

# ---- per-chunk events: gRPC sends a pushed slice longer than 1 MiB in chunks (a traced cnn run: its 3136x1024
# fc weights are 12.8 MB), and a pull's slices arrive in the pieces the ps streams them in (a piece at offset 0
# starts a slice again: a tentative pull's slice is sent anew). Each piece is an event (a pushed chunk within
# its slice's send event); in time order a slice's pieces run on from one another up to the slice's end ----
IFS=, read -r -a ports < <(python3 "$ROOT/scripts/free_ports.py" 2)
cluster=(--ps_hosts="127.0.0.1:${ports[0]}" --worker_hosts="127.0.0.1:${ports[1]}" --transport=grpc)
"$BIN/dtrain_ps" --job_name=ps --task_index=0 "${cluster[@]}" --max_run_secs=60 >"$dir/cps.log" 2>&1 &
ps_pid=$!
bg+=("$ps_pid")
wait_for_line "$dir/cps.log" "listening on" 30 || { echo "FAIL: the ps did not start"; cat "$dir/cps.log"; exit 1; }
rc=0
"$BIN/dtrain_worker" --job_name=worker --task_index=0 "${cluster[@]}" --model=cnn --train_steps=3 --log_every=1 \
  --eval_every=0 --trace_steps=1:2 --trace_dir="$dir/ctrace" >"$dir/cw.log" 2>&1 || rc=$?
wait "$ps_pid" || rc=$?
check "the traced cnn run over gRPC completes" [ "$rc" = 0 ]
check_chunks() {
  python3 - "$dir/ctrace/worker-0.trace.json" <<'PY'
import collections, json, re, sys
ev = [e for e in json.load(open(sys.argv[1]))["traceEvents"] if e["ph"] == "X"]
ok = True
for kind in ("send", "receive"):
    # A pull runs on into the next step (it is for that step), so pulled pieces are grouped by variable alone, in
    # time order; the window's edges may cut a slice's run of pieces.
    pieces = collections.defaultdict(list)  # variable -> [(ts, first, end, event)]
    for e in ev:
        if e["name"].startswith(kind + " chunk "):
            m = re.search(r"floats \[(\d+), (\d+)\)", e["args"].get("detail", ""))
            if not m:
                print(f"FAIL: {e['name']} without its floats: {e['args']}"); ok = False; continue
            pieces[e["name"][len(kind) + 7:]].append((e["ts"], int(m.group(1)), int(m.group(2)), e))
    if not pieces:
        print(f"FAIL: no '{kind} chunk' events"); ok = False; continue
    for var, p in sorted(pieces.items()):
        p.sort(key=lambda x: x[0])
        end = max(x[2] for x in p)
        runs_on = all(b[1] == 0 or b[1] == a[2] for a, b in zip(p, p[1:]))
        whole_runs = sum(1 for a, b in zip(p, p[1:]) if b[1] == 0 and a[2] == end) + (p[-1][2] == end)
        # A pushed chunk lies within its slice's send event of the same step.
        outside = [x for x in p if kind == "send" and not any(
            w["name"] == f"send {var}" and w["args"]["step"] == x[3]["args"]["step"] and
            w["ts"] - 1 <= x[3]["ts"] and x[3]["ts"] + x[3]["dur"] <= w["ts"] + w["dur"] + 1 for w in ev)]
        if not runs_on or whole_runs < 1 or len(p) < 2 or outside:
            print(f"FAIL: {kind} {var}: pieces {[x[1:3] for x in p[:4]]}... (run on from each other: {runs_on}, "
                  f"runs reaching the end {end}: {whole_runs}, outside their slice's event: {len(outside)})")
            ok = False
    print(f"  {kind}: {sum(len(p) for p in pieces.values())} chunk events over {len(pieces)} slices, e.g. "
          f"{next(iter(pieces))}: {len(next(iter(pieces.values())))} pieces")
sys.exit(0 if ok else 1)
PY
}
check "per-chunk push and pull events tile each long slice" check_chunks

echo "trace_test: $passed passed, $failed failed"
[ "$failed" = 0 ]
