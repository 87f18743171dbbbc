#!/usr/bin/env python3
"""scripts/plan_cluster.py on a profile written here by hand: the step times of a few cases computed by hand (below,
beside each), the bound labels, the expected slowest worker, the ps recommendation, and the errors for bad
arguments and profiles (scripts/planner_accuracy.py's too)."""
import copy
import functools
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import plan_cluster as pc  # noqa: E402

failures = []


def check(what, got, want, tol=1e-6):
    ok = abs(got - want) <= tol * max(1.0, abs(want)) if isinstance(want, float) else got == want
    if not ok:
        failures.append("%s: got %r, want %r" % (what, got, want))


def profile():
    """Two layers: layer 0 holds floats [0, 1e6) (4 MB), forward 10 ms, backward 20 ms; layer 1 [1e6, 1.5e6)
    (2 MB), 5 ms and 5 ms. Compute 40 ms, always (every quantile). A local step of 50 ms, 100 examples. The update
    costs 1e-10 s per stored byte, summing one more gradient 5e-11. The median step is all compute (nothing else
    on the worker); the mean step 50 ms (the local rate). Two placements: one task holds both; with two,
    task 0 holds layer 0 and task 1 layer 1. Transports cost no CPU (grpc), or some (tcp)."""
    return {
        "format": "dtrain-profile", "version": 1,
        "host": {"cpu_model": "test", "cpus_available": 1.0},
        "run": {"model": "hand", "batch_size": 100, "towers": 1, "examples_per_step": 100, "threads": 1,
                "compute_cores": 1.0, "wire_dtype": "fp32", "wire_bytes_per_float": 4},
        "model_floats": 1500000,
        "layers": [{"name": "l0", "begin": 0, "end": 1000000, "forward_s": 0.010, "backward_s": 0.020},
                   {"name": "l1", "begin": 1000000, "end": 1500000, "forward_s": 0.005, "backward_s": 0.005}],
        "steps": {"compute_s": {"median": 0.040, "mean": 0.040, "quantiles": [0.040] * 101},
                  "step_s": {"median": 0.040, "mean": 0.050}, "input_s": {"median": 0.0}},
        "placement": {
            "1": {"task_bytes": [6000000], "slices": [{"key": 0, "task": 0, "begin": 0, "floats": 1000000},
                                                      {"key": 1, "task": 0, "begin": 1000000, "floats": 500000}]},
            "2": {"task_bytes": [4000000, 2000000],
                  "slices": [{"key": 0, "task": 0, "begin": 0, "floats": 1000000},
                             {"key": 1, "task": 1, "begin": 1000000, "floats": 500000}]}},
        "ps": {"apply_s_per_byte": 1e-10, "sum_s_per_byte": 5e-11},
        "transports": {
            "grpc": {"push_worker_cpu_s_per_byte": 0.0, "push_ps_cpu_s_per_byte": 0.0,
                     "pull_ps_cpu_s_per_byte": 0.0, "pull_worker_cpu_s_per_byte": 0.0},
            "tcp": {"push_worker_cpu_s_per_byte": 1e-9, "push_ps_cpu_s_per_byte": 2e-9,
                    "pull_ps_cpu_s_per_byte": 1.5e-9, "pull_worker_cpu_s_per_byte": 0.5e-9},
            "shm": {"skipped": "no shared memory here"}},
        "phases": {"startup_s": 1.0, "evaluate_s": 2.0, "end_s": 0.5},
    }


P = profile()
GBIT = 1e9  # 125e6 bytes/s
# The hand cases count a link's rate as all data; the planner's default takes TCP's and Ethernet's headers out
# (1448 data bytes in 1514), checked once below.
predict = functools.partial(pc.predict, link_payload=1.0)

# Case A: sync, 1 worker, 1 ps, 1 Gbit, no latency, 1 core, transports free.
#   pull (125e6 B/s): layer 0 updated after 4e6 B x 1e-10 = 0.4 ms, sent 4e6 / 125e6 = 32 ms later: arrives 32.4 ms;
#   layer 1 updated at 0.6 ms, sent behind layer 0: 32.4 + 16 = 48.4 ms.
#   forward: layer 0 from 32.4 to 42.4 ms; layer 1 waits for 48.4, ends 53.4 ms.
#   backward: layer 1 ready at 58.4 ms, pushed by 74.4; layer 0 ready at 78.4, pushed by 78.4 + 32 = 110.4 ms.
#   step 110.4 ms: 100 / 0.1104 = 905.8 examples/sec; local 100 / 0.05 = 2000: efficiency 0.4529.
#   Without the links: 0.4 + 10, 0.6 -> 15.4 ms forward, + 25 backward = 40.4 ms: saves 70 ms (compute: 14 ms).
r = predict(P, 1, 1, GBIT, 0.0, 1.0, "sync", "grpc", apply_early="off")
check("A step", r["step_s"], 0.1104)
check("A examples/sec", r["examples_per_sec"], 100 / 0.1104)
check("A efficiency", r["efficiency"], (100 / 0.1104) / 2000)
check("A bound", r["bound"], "ps link")
check("A saving of the links", r["savings"]["ps link"], 0.1104 - 0.0404)
check("A saving of compute", r["savings"]["compute"], 0.1104 - 0.0964)

# Case A with the early apply (dtrain's default for one worker and one ps task: the faster of the two). The pull
#   goes out at the first gradients and streams each layer behind its push: a layer's last chunk (65536 floats)
#   is updated (65536 x 4 x 1e-10 = 0.0262 ms) and sent (262144 / 125e6 = 2.0972 ms) after its push arrived:
#   2.1234 ms. From case A's arrivals: layer 1 pushed by 74.4, layer 0 by 110.4 ms (the next step starts there);
#   the pull of layer 0 ends at 110.4 + 2.1234, layer 1 16 ms later: they arrive 2.1234 and 18.1234 ms into
#   the next step. That step: forward 2.1234 -> 12.1234 -> 23.1234 (waiting for layer 1), layer 1 pushed by
#   28.1234 + 16 = 44.1234, layer 0 by 48.1234 + 32 = 80.1234 ms; its pull arrives as before: the fixed point.
r = predict(P, 1, 1, GBIT, 0.0, 1.0, "sync", "grpc")
check("A early step", r["step_s"], 0.0801234)
check("A early chosen", r["early_apply"], True)
check("A early bound", r["bound"], "ps link")

# The same where the transport carries a slice in messages of 1 MiB (gRPC's, as the profile records it): the ps
#   updates a message once it has all of it, so a layer's pull ends 1048576 / 125e6 + 262144 x 4e-10 = 8.4935 ms
#   after its push: layers arrive 8.4935 and 24.4935 ms into the step; forward 18.4935, 29.4935; layer 1 pushed by
#   50.4935, layer 0 by 54.4935 + 32 = 86.4935 ms.
piece = copy.deepcopy(P)
piece["transports"]["grpc"]["stream_piece_bytes"] = 1048576
r = predict(piece, 1, 1, GBIT, 0.0, 1.0, "sync", "grpc")
check("A early, 1 MiB pieces", r["step_s"], 0.0864935, tol=1e-5)

# Case A through links emulated with token buckets of 10 ms (1.25e6 bytes each way), early apply off: the first
#   1.25e6 bytes of the pull and of the push cross at once. Pull: layer 0's other 2.75e6 bytes take 22 ms, from
#   0.4: 22.4; layer 1 16 ms more: 38.4. Forward 22.4 -> 32.4 -> 43.4. Push: layer 1 ready at 48.4, its other
#   0.75e6 bytes take 6 ms: 54.4; layer 0 ready at 68.4, 32 ms: 100.4 ms (above the links' long-run 48 ms).
r = predict(P, 1, 1, GBIT, 0.0, 1.0, "sync", "grpc", link_burst_s=0.01, apply_early="off")
check("A burst step", r["step_s"], 0.1004)

# Case A with the links' payload as the planner counts it by default: 125e6 x 1448 / 1514 = 119.5509e6 data
#   bytes/s. Pull: layer 0 at 0.4 + 33.4586 = 33.8586 ms, layer 1 at 50.5878; forward to 43.8586, 55.5878; push:
#   layer 1 from 60.5878 to 77.3171, layer 0 from 80.5878 to 114.0464 ms.
r = pc.predict(P, 1, 1, GBIT, 0.0, 1.0, "sync", "grpc", apply_early="off")
check("A step, TCP payload", r["step_s"], 0.1140464, tol=1e-6)

# Case B: sync, 2 workers, 1 ps: each flow gets 125e6 / 2 B/s; the update sums 2 gradients: 1.5e-10 per byte.
#   pull: layer 0 updated at 0.6 ms, arrives 0.6 + 64 = 64.6 ms; layer 1 at 64.6 + 32 = 96.6 ms.
#   forward: 64.6 -> 74.6; 96.6 -> 101.6 ms. backward: layer 1 ready 106.6, pushed 138.6; layer 0 ready 126.6,
#   pushed 138.6 + 64 = 202.6 ms. 200 / 0.2026 = 987.2 examples/sec, efficiency 987.2 / 4000.
r = predict(P, 2, 1, GBIT, 0.0, 1.0, "sync", "grpc")
check("B step", r["step_s"], 0.2026)
check("B efficiency", r["efficiency"], (200 / 0.2026) / 4000)
check("B bound", r["bound"], "ps link")

# Case C: sync, 1 worker, 1 ps, unlimited links, CPU per byte (tcp): pull 1.5e-9 on the ps, 0.5e-9 on the worker;
#   push 1e-9 on the worker, 2e-9 on the ps; one core everywhere.
#   pull at 1 / 1.5e-9 B/s: layer 0 sent by 0.4 + 6 = 6.4 ms (the task's CPU: 1e6 x (4e-10 + 6e-9) = 6.4 ms);
#   layer 1 by 6.4 + 3 = 9.4, but the task's CPU for 1.5e6 floats is 9.6 ms: arrives 9.6.
#   forward: 6.4 -> 16.4 -> 21.4 ms (the worker's CPU: 15 ms compute + 6e6 x 0.5e-9 = 18 ms, less).
#   push at 1 / 2e-9 B/s: layer 1 ready 26.4, pushed 30.4; layer 0 ready 46.4, pushed 46.4 + 8 = 54.4 ms.
#   (the worker's CPU: 21.4 + 25 + 6e6 x 1e-9 = 52.4 ms; the task's: 21.4 + 12 = 33.4 ms.) Step 54.4 ms.
r = predict(P, 1, 1, None, 0.0, 1.0, "sync", "tcp", apply_early="off")
check("C step", r["step_s"], 0.0544)
check("C bound", r["bound"], "compute")

# Case D: async, 2 workers, 1 ps, 1 Gbit. A lone worker's cycle (flows not shared): pull 32 + 16 ms, forward to
#   53 ms, pushes to 74 ms (layer 1) and 110 ms (layer 0); each slice is updated once it has arrived (1e-10 per
#   stored byte): layer 0's 0.4 ms after 110: 110.4 ms. What the workers share, per cycle of one: the ps task's link
#   in (6e6 / 125e6 = 48 ms) and out (48 ms), its CPU (1.5e6 x 4 x 1e-10 = 0.6 ms); the rest is 110.4 - 96.6 =
#   13.8 ms of the worker's own. Mean value analysis:
#   1 worker: 110.4 ms, queues 48 / 110.4 = 0.434783 at each link, 0.6 / 110.4 = 0.005435 at the CPU;
#   2 workers: each link 48 x 1.434783 = 68.870 ms, the CPU 0.6 x 1.005435 = 0.60326: a cycle of
#   13.8 + 2 x 68.870 + 0.6033 = 152.143 ms (200 / 0.152143 examples/sec); queues 2 x 68.870 / 152.143 = 0.905332
#   and 2 x 0.60326 / 152.143 = 0.0079302;
#   3 workers: links 48 x 1.905332 = 91.456 ms, CPU 0.60476: 13.8 + 182.912 + 0.6048 = 197.317 ms.
r = predict(P, 2, 1, GBIT, 0.0, 1.0, "async", "grpc")
check("D step", r["step_s"], 0.152143, tol=1e-5)
check("D examples/sec", r["examples_per_sec"], 200 / 0.152143, tol=1e-5)
r = predict(P, 3, 1, GBIT, 0.0, 1.0, "async", "grpc")
check("D3 step", r["step_s"], 0.197317, tol=1e-5)
check("D3 bound", r["bound"], "ps link")
# 20 workers: the links' long run, 20 x 48 ms a cycle, is what the queues tend to.
r = predict(P, 20, 1, GBIT, 0.0, 1.0, "async", "grpc")
check("D20 above the long run", r["step_s"] >= 20 * 0.048, True)
check("D20 near the long run", r["step_s"] < 20 * 0.048 + 0.110, True)

# The transport's own speed: the profile timed one push of the 6e6 bytes at 12 ms (500e6 bytes/s) and one pull at
#   6 ms (1e9) on loopback. Unlimited links, early apply off: pull layer 0 by 0.4 + 4 = 4.4 ms, layer 1 by 6.4;
#   forward 4.4 -> 14.4 -> 19.4; push layer 1 from 24.4 to 28.4, layer 0 from 44.4 to 52.4 ms.
fast = copy.deepcopy(P)
fast["transports"]["grpc"].update({"bytes": 6000000, "push_s": 0.012, "pull_s": 0.006})
r = predict(fast, 1, 1, None, 0.0, 1.0, "sync", "grpc", apply_early="off")
check("transport speed step", r["step_s"], 0.0524)
check("transport speed saving", r["savings"]["transport"], 0.0524 - 0.0404)  # without it: 40.4 ms, case A's

# The rest of a local step on the worker: a median step of 45 ms is 5 ms more than compute, in-process ps and
#   input: each step's compute starts 5 ms in. Unlimited links: forward 5 -> 15 -> 20, backward to 45 ms.
busy = copy.deepcopy(P)
busy["steps"]["step_s"]["median"] = 0.045
r = predict(busy, 1, 1, None, 0.0, 1.0, "sync", "grpc", apply_early="off")
check("worker's other work", r["step_s"], 0.045)

# A model with a table: 1000 rows a step of 16 floats (64 bytes + an 8-byte id); the in-process ps spent 0.5 ms
#   serving them (5e-7 s a row, looked up or made), and updates them at 1e-7 s a row. Unlimited links: the dense
#   slices as in case E without latency (layer 0 at 0.4, layer 1 at 0.6 ms); the rows follow, 1000 x 6e-7 = 0.6 ms
#   of the task's thread: at 1.2 ms; forward waits for them: 1.2 -> 11.2 -> 16.2, backward to 41.2 ms.
sparse = copy.deepcopy(P)
sparse["sparse"] = {"tables": [{"name": "t", "dim": 16, "rows": 0, "bytes_per_row": 64, "id_bytes": 8,
                                "rows_per_step": 1000}], "update_s_per_row": 1e-7}
sparse["steps"]["transport_s"] = {"median": 0.0005}
r = predict(sparse, 1, 1, None, 0.0, 1.0, "sync", "grpc")
check("sparse step", r["step_s"], 0.0412)
check("sparse: no early apply", r["early_apply"], False)

# The same where the profile measured the transport with the rows (one ps task, loopback): a step of 1000 rows
#   took 4 ms more than the parameters alone (2e-6 s a row each way), 2 ms more of the worker's CPU (1e-6 a row
#   each way), 3 ms of the ps's (1.5e-6), which stands for the in-process figure. Pull: the rows after the
#   slices, 0.6 + 1000 x 2e-6 + the update 1000 x 1e-7 = 2.7 ms; forward 2.7 -> 12.7 -> 17.7; backward to 42.7;
#   the rows' gradients 2 ms more: 44.7 ms (the worker's CPU: 17.7 + 25 + 1 = 43.7, less).
rows_measured = copy.deepcopy(sparse)
rows_measured["transports"]["grpc"]["sparse_rows"] = {"per_step": 1000, "extra_s": 0.004, "worker_cpu_s": 0.002,
                                                      "ps_cpu_s": 0.003}
r = predict(rows_measured, 1, 1, None, 0.0, 1.0, "sync", "grpc")
check("sparse step, rows measured", r["step_s"], 0.0447)

# The process's CPU per step: 60 ms of core time for 40 ms of compute (its input pipeline's threads: 20 ms more).
#   Locally on one core a step takes at least 60 ms (the mean step says 50), on half a core 120 ms (the scaled
#   mean step 100). In a cluster the 20 ms count against the worker's core with the forward: unlimited links,
#   forward at least 15 + 20 = 35 ms (the timeline: 15.4), backward 25 more: 60 ms.
cpu = copy.deepcopy(P)
cpu["steps"]["process_cpu_s"] = 0.060
check("local step, CPU-bound", pc.local_step(cpu, 1.0), 0.060)
check("local step, half a core", pc.local_step(cpu, 0.5), 0.120)
check("the worker's other CPU", pc.extra_worker_cpu(cpu), 0.020)
r = predict(cpu, 1, 1, None, 0.0, 1.0, "sync", "grpc", apply_early="off")
check("input threads' CPU", r["step_s"], 0.060)

# Case E: latency. Sync, 1 worker, 1 ps, unlimited links, free transports, 1 ms one way: the pull arrives 1 ms
#   after the update (layer 0 at 1.4 ms, layer 1 at 1.6), forward 1.4 -> 11.4 -> 16.4, backward to 41.4, the last
#   push at the task 1 ms later: 42.4 ms. With 2 ps tasks, task 1 learns the decision from the pull (2 ms more)
#   and the commit waits for task 1's acknowledgement (2 ms): layer 1 updated at 2 + 0.2 = 2.2 ms, arrives 3.2 ms;
#   forward 1.4 -> 11.4 -> 16.4; backward 41.4; + 1 ms + 2 ms = 44.4 ms.
r = predict(P, 1, 1, None, 0.001, 1.0, "sync", "grpc", apply_early="off")
check("E step", r["step_s"], 0.0424)
r = predict(P, 1, 2, None, 0.001, 1.0, "sync", "grpc")
check("E step, 2 ps", r["step_s"], 0.0444)

# Case F: a quarter core. Compute scales by 1 / 0.25 = 4; the local step too (200 ms); unlimited links, free
#   transports: pull 0.4 ms x 4 (the update on a quarter core) = 1.6 ms, layer 1 at 2.4 ms; forward 1.6 + 40 =
#   41.6, 61.6; backward 61.6 + 20 + 80 = 161.6 ms. Efficiency 200 / 161.6.
r = predict(P, 1, 1, None, 0.0, 0.25, "sync", "grpc", apply_early="off")
check("F step", r["step_s"], 0.1616)
check("F efficiency", r["efficiency"], 0.200 / 0.1616)
check("F bound", r["bound"], "compute")

# The update's costs: the run's own updates where they ran on one thread (here 1.2 ms for 6e6 stored bytes: twice
#   the measurement on its own, 1e-10 per byte), the summing cost in the same proportion.
inrun = copy.deepcopy(P)
inrun["ps"]["in_run_update_s"] = {"median": 0.0012}
inrun["ps"]["in_run_apply_threads"] = 1
a, sigma = pc.update_costs(inrun)
check("update cost from the run", a * 1e10, 2.0)
check("summing cost from the run", sigma * 1e10, 1.0)
inrun["ps"]["in_run_apply_threads"] = 2  # OpenMP threads in the run: the measurement on one thread stands
a, sigma = pc.update_costs(inrun)
check("update cost on its own", a * 1e10, 1.0)
check("summing cost on its own", sigma * 1e10, 0.5)

# Stragglers: compute uniform on [30, 50] ms (quantiles 30 + 0.2 i ms): the slowest of W has the mean
#   30 + 20 W / (W + 1) ms; the second of 3 the median, 40 ms.
q = [0.030 + 0.0002 * i for i in range(101)]
for w in (1, 2, 4, 8):
    check("E[max of %d]" % w, pc.expected_order_statistic(q, w, w), 0.030 + 0.020 * w / (w + 1), tol=1e-4)
check("E[2nd of 3]", pc.expected_order_statistic(q, 2, 3), 0.040, tol=1e-4)
noisy = copy.deepcopy(P)
noisy["steps"]["compute_s"]["quantiles"] = q
# Sync, 4 workers, links unlimited, free transports: the barrier adds E[max of 4] - median = 46 - 40 = 6 ms to the
#   40.6 ms of a step (pull 0.7 ms for layer 0 with 4 gradients: 4e6 x (1e-10 + 3 x 5e-11) = 1 ms; layer 1 at
#   1.5 ms; forward 1 -> 11 -> 16, backward 41): 47 ms, bounded by the stragglers when the links are free.
r = predict(noisy, 4, 1, None, 0.0, 1.0, "sync", "grpc")
check("stragglers step", r["step_s"], 0.041 + 0.006, tol=1e-4)
check("stragglers bound", r["bound"], "compute")
check("stragglers saving", r["savings"]["stragglers"], 0.006, tol=1e-3)
# One backup worker: the 3rd of 4, 30 + 20 x 3/5 = 42 ms: 2 ms over the median.
r = predict(noisy, 4, 1, None, 0.0, 1.0, "sync", "grpc", backup_workers=1)
check("backup step", r["step_s"], 0.041 + 0.002, tol=1e-4)

# The recommendation: the fewest ps tasks within 3% of the best.
rows = [{"mode": "sync", "bandwidth_bps": 1e9, "workers": 4, "ps": p, "examples_per_sec": e}
        for p, e in ((1, 1000.0), (2, 1980.0), (4, 2000.0))]
check("recommend within 3%", pc.recommend(rows, 0.03)[("sync", 1e9, 4)], 2)
check("recommend within 0.5%", pc.recommend(rows, 0.005)[("sync", 1e9, 4)], 4)

# Bandwidths.
check("1gbit", pc.parse_bandwidth("1gbit"), 1e9)
check("2.5gbit", pc.parse_bandwidth("2.5gbit"), 2.5e9)
check("100mbit", pc.parse_bandwidth("100mbit"), 1e8)
for bad in ("10gbps", "10G", "1 gbit", "0gbit", "fast", "-1gbit"):
    try:
        pc.parse_bandwidth(bad)
        failures.append("bandwidth %r accepted" % bad)
    except pc.PlanError as e:
        if "bandwidth" not in str(e):
            failures.append("bandwidth %r: message %r does not name it" % (bad, str(e)))

# The command line: a table and files; then each bad argument exits 2 with a message naming it.
with tempfile.TemporaryDirectory() as d:
    path = os.path.join(d, "p.json")
    with open(path, "w") as f:
        json.dump(P, f)

    def run(*args):
        p = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "plan_cluster.py"), "--profile=" + path]
                           + list(args), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        return p.returncode, p.stdout

    rc, out = run("--workers=1,2,4", "--ps=1,2", "--bandwidth=1gbit", "--latency=0", "--host_cpus=1",
                  "--modes=sync,async", "--apply_early=off", "--transport=grpc", "--out=" + os.path.join(d, "plan"))
    check("cli rc", rc, 0)
    if "<- use" not in out or not os.path.exists(os.path.join(d, "plan.csv")):
        failures.append("cli: no recommendation or no CSV:\n" + out)
    else:
        with open(os.path.join(d, "plan.json")) as f:
            rows = json.load(f)["rows"]
        check("cli rows", len(rows), 2 * 3 * 2)
        first = [x for x in rows if x["mode"] == "sync" and x["workers"] == 1 and x["ps"] == 1][0]
        check("cli case A (TCP payload)", first["step_s"], 0.1140464)
        # Wall-clock of 60000 examples: start 1 s + the initial values, 1.5e6 x 4 bytes at 119.5509e6 bytes/s =
        # 0.050188 s, train 60000 x 0.1140464 / 100, evaluate 2 s, end 0.5 s.
        check("cli wall", first["wall_s"], 1.0 + 0.0501878 + 60000 * 0.1140464 / 100 + 2.0 + 0.5, tol=1e-6)
    # The picture beside the table, always: a valid PNG; and a clear error (exit 1, the table still written) when
    # matplotlib cannot be imported (a package on PYTHONPATH that hides Debian's).
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    import plotting  # noqa: E402
    if not plotting.is_picture(os.path.join(d, "plan.png")):
        failures.append("cli: no valid picture plan.png beside the table:\n" + out)
    hide = os.path.join(d, "hide")
    os.makedirs(os.path.join(hide, "matplotlib"))
    with open(os.path.join(hide, "matplotlib", "__init__.py"), "w") as f:
        f.write("raise ImportError('hidden by plan_cluster_test')\n")
    p = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "plan_cluster.py"), "--profile=" + path,
                        "--workers=1,2", "--ps=1", "--bandwidth=1gbit", "--out=" + os.path.join(d, "nopic")],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       env=dict(os.environ, PYTHONPATH=hide))
    if p.returncode != 1 or "cannot draw" not in p.stdout or "nopic.png" not in p.stdout or \
            not os.path.exists(os.path.join(d, "nopic.csv")):
        failures.append("no matplotlib: rc %d, want 1, the table written and 'cannot draw ...nopic.png':\n%s"
                        % (p.returncode, p.stdout))
    for args, words in ((["--bandwidth=10gbps"], "10gbps"), (["--ps=3"], "--ps=3"), (["--workers=0"], "--workers"),
                        (["--modes=fast"], "--modes"), (["--latency=-1"], "--latency"),
                        (["--host_cpus=0"], "--host_cpus"), (["--transport=shm"], "no shared memory"),
                        (["--transport=udp"], "--transport"), (["--out=/nonexistent/dir/p"], "--out")):
        base = [] if args[0].startswith("--ps=") else ["--ps=1,2"]  # the profile has placements for 1 and 2
        rc, out = run(*(base + args))
        if rc != 2 or words not in out:
            failures.append("%s: rc %d, want 2 and a message with %r:\n%s" % (args, rc, words, out))
    for change, words in (({"format": "something-else"}, "format"), ({"version": 2}, "version 2"),
                          ({"layers": []}, "no layers")):
        bad = dict(P, **change)
        with open(path, "w") as f:
            json.dump(bad, f)
        rc, out = run()
        if rc != 2 or words not in out:
            failures.append("profile %s: rc %d, want 2 and %r:\n%s" % (change, rc, words, out))
    with open(path, "w") as f:
        f.write("{not json")
    rc, out = run()
    if rc != 2 or "not JSON" not in out:
        failures.append("a file that is not JSON: rc %d\n%s" % (rc, out))

# scripts/planner_accuracy.py on a compare_cluster_sizes result written by hand: each run that exited 0 is
# predicted from the profile (every emulated host sharing the profile host's 1 core), its error is predicted /
# measured - 1; the summary is the median and the worst |error| over the clusters (the local run is the machine's
# check, left out); a failed run is left out; bad files exit 2.
ACC = os.path.join(ROOT, "scripts", "planner_accuracy.py")
with tempfile.TemporaryDirectory() as d:
    prof, res, out_json = os.path.join(d, "p.json"), os.path.join(d, "r.json"), os.path.join(d, "acc.json")
    with open(prof, "w") as f:
        json.dump(P, f)
    result = {"settings": {"model": "hand", "batch_size": 100, "num_ps": 1, "bandwidth": "1gbit", "netns": False,
                           "transport": "grpc", "examples": 60000},
              "rows": [{"configuration": "local", "system": "dtrain", "mode": "local", "workers": 0, "exit_code": 0,
                        "examples_per_sec": 2000.0, "wall_secs": 35.0},
                       {"configuration": "sync, 1 ps, 1 worker", "system": "dtrain", "mode": "sync", "workers": 1,
                        "exit_code": 0, "examples_per_sec": 1000.0, "wall_secs": 70.0,
                        "examples_per_sec_launches": [1100.0, 900.0, 1000.0]},
                       {"configuration": "async, 1 ps, 2 workers", "system": "dtrain", "mode": "async",
                        "workers": 2, "exit_code": 0, "examples_per_sec": 1500.0, "wall_secs": 45.0},
                       {"configuration": "sync, 1 ps, 2 workers", "system": "dtrain", "mode": "sync", "workers": 2,
                        "exit_code": 1, "examples_per_sec": 10.0, "wall_secs": 1.0}]}
    with open(res, "w") as f:
        json.dump(result, f)
    p = subprocess.run([sys.executable, ACC, "--profile=" + prof, "--json=" + out_json, res],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    check("accuracy rc", p.returncode, 0)
    if p.returncode == 0:
        with open(out_json) as f:
            acc = json.load(f)
        want = [("local", 100 / 0.05), ("sync", pc.predict(P, 1, 1, GBIT, 0.0, None, "sync", "grpc",
                                                           shared_cores=1.0)["examples_per_sec"]),
                ("async", pc.predict(P, 2, 1, GBIT, 0.0, None, "async", "grpc",
                                     shared_cores=1.0)["examples_per_sec"])]
        check("accuracy rows", [r["mode"] for r in acc["rows"]], [m for m, _ in want])
        errors = []
        for r, (mode, predicted) in zip(acc["rows"], want):
            check("accuracy %s predicted" % mode, r["predicted"], predicted)
            check("accuracy %s error" % mode, r["error"], predicted / r["measured"] - 1)
            if mode != "local":
                errors.append(abs(predicted / r["measured"] - 1))
        check("accuracy median", acc["summary"]["median_abs_error"], sum(errors) / 2)
        check("accuracy worst", acc["summary"]["worst_abs_error"], max(errors))
        if "median |error|" not in p.stdout:
            failures.append("accuracy: no summary line:\n" + p.stdout)
    # --launch=best: the best of a run's launches.
    p = subprocess.run([sys.executable, ACC, "--profile=" + prof, "--launch=best", "--json=" + out_json, res],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    with open(out_json) as f:
        check("accuracy best launch", json.load(f)["rows"][1]["measured"], 1100.0)
    for args, words in (([res], "--profile"), (["--profile=" + prof, prof], "not a compare_cluster_sizes result"),
                        (["--profile=" + res, res], "format"), (["--profile=" + prof, "--latency=x", res],
                                                                 "--latency")):
        p = subprocess.run([sys.executable, ACC] + args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if p.returncode != 2 or words not in p.stdout:
            failures.append("accuracy %s: rc %d, want 2 and %r:\n%s" % (args, p.returncode, words, p.stdout))
    result["settings"]["model"] = "cnn"
    with open(res, "w") as f:
        json.dump(result, f)
    p = subprocess.run([sys.executable, ACC, "--profile=" + prof, res], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
    if p.returncode != 2 or "no profile of model cnn" not in p.stdout:
        failures.append("accuracy without a matching profile: rc %d\n%s" % (p.returncode, p.stdout))

if failures:
    print("FAILED:\n  " + "\n  ".join(failures))
    sys.exit(1)
print("plan_cluster_test: all checks passed")
