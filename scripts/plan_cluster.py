#!/usr/bin/python3
"""Predicts what a dtrain cluster nobody has run would do, from one local run's profile alone
(dtrain_worker --job_name=local --profile_out=FILE): for every combination of workers, ps tasks, link bandwidth and
mode, the step time, examples/sec, scaling efficiency (against one worker on an equal host, local mode), what
bounds it, the ps count to use for each worker count, and the wall-clock of a run of --examples examples.

  build/bin/dtrain_worker --job_name=local --model=cnn --batch_size=100 --train_steps=200 --profile_out=/tmp/cnn.json
  scripts/plan_cluster.py --profile=/tmp/cnn.json --workers=1,2,4,8,16,32 --ps=1,2,4,8 \\
      --bandwidth=1gbit,10gbit --latency=0.1 --host_cpus=1 --modes=sync,async --out=/tmp/cnn_plan

prints a table and writes PREFIX.csv, PREFIX.json and the picture PREFIX.png (matplotlib, Debian's /usr/bin/python3;
a picture that cannot be drawn is an error: exit 1 after the table is written).
docs/planner.md says how to read it and how good it is.

THE MODEL OF A STEP (every figure comes from the profile; nothing is fitted to clusters)

Notation: W workers, P ps tasks, B bytes/s per link and direction (every host has one full-duplex link of
--bandwidth to a switch), L the one-way latency, H the cores of each host (--host_cpus), for every layer k (in
forward order) its forward f_k and backward g_k (the profile's medians, scaled so that they sum to the median
compute), n[k][j] the floats of layer k that ps task j holds (the profile's placement for P, made by dtrain's own
placement code), wb the wire bytes per float.

1. Compute is scaled by the host's CPU: the profile's compute ran on c_p cores (its threads, at most the cores its
   process had); a host of H cores runs it at s = c_p / min(H, threads) times the profile's time (a quarter core
   against one core at 1 thread: 4x). The input wait, the evaluation and the start-up scale the same way. What
   the process spent besides (its input pipeline's threads, the loop) counts against the host's cores too.
2. Each transfer is a flow of a worker and a ps task, moving the layers in order (pulls in forward order, pushes
   in backward order, each layer as soon as it is ready). A flow's rate is the least of: the ps task's link
   shared by its W workers (B / W), the worker's link shared by the P tasks it talks to (B / P), the ps task's CPU
   shared by W flows (H / (W * c)), with c the transport's CPU per byte on the ps's side (the profile's loopback
   measurement: receiving a push, sending a pull), and the transport's own speed (one push, one pull of the
   model's bytes end to end on loopback, as the profile timed them).
3. Sync step, from the moment ps task j can apply (ps 0 decided; the other tasks learn the decision from the
   worker's pull, 2L later):
   pull   task j applies its slices in order (the sum of W gradients and one update: (a + (W-1) s) per stored byte
          on one thread, a and s from the profile) and streams each slice to every worker once applied; layer k
          arrives at max_j(sent_j(k)) + L;
   forward layer k starts at max(end of layer k-1, arrival of layer k) (after the input wait); models with tables
          wait for every row first (rows travel after the slices);
   push   layer k's gradients are ready after the backward of the layers above it; each flow sends them in that
          order; the push is at task j when its last byte is, + L;
   barrier the step ends when the slowest of W workers' pushes has arrived: the compute's expected maximum of W
          draws from the profile's distribution (its quantiles), minus its median (R of W with --backup_workers:
          the R-th smallest); with P > 1, 2L more (the other tasks acknowledge their part before ps 0's commit).
   CPU    every phase lasts at least its CPU on a host of H cores: forward + receiving the pull, backward +
          sending the push on the worker; on the ps task the sum, the update and sending W pulls, and receiving W
          pushes. With --shared_cores=C (every emulated host on one machine of C cores, as with
          scripts/netns_hosts.sh without quotas) each phase also lasts at least the CPU of every process in it / C.
   Latency: one round trip a step with one ps task (the commit travels behind the push, the pull is already
   waiting), three with more (acknowledgements before the commit, the decision relayed by the pulls).
4. Async: each worker cycles on its own (pull after its push is acknowledged: two round trips, four with P > 1),
   with no barrier. A lone worker's cycle is the sync timeline of one worker (the update applied as each push
   arrives: receive + update per byte on the ps) and its own link and CPU, plus the compute noise's mean over its
   median. W workers meet at what they share: each ps task's link in and out and its CPU, and with
   --shared_cores the machine's cores. How much they queue there depends on how their phases fall: mean value
   analysis of the closed network (W workers, each cycle a delay then a visit to each shared station) gives the
   cycle, never below what each station carries per cycle in the long run.
5. Throughput = W * examples per step / step (sync) or / cycle (async); efficiency = that / (W * one worker on an
   equal host in local mode: the profile's mean step scaled by its CPU, at least its process's CPU per step / H).
6. What bounds it: the resource whose removal would shorten the step most, found by predicting again without it:
   compute, ps link, worker link, ps CPU (transport and updates), worker CPU (transport), transport (one stream's
   own speed), machine CPU (--shared_cores), stragglers (the sync barrier), latency.
7. The ps count to use: the smallest P within --within (3%) of the best examples/sec for that worker count.
8. Wall-clock of --examples examples: start-up (the profile's, scaled; a ps task's start as the profile's gRPC
   measurement saw it; the chief's initial values over one link) + examples / examples/sec + the final
   evaluation + the end (the profile's, and a ps task's end after the last worker is done).

Every argument is checked, with an error that names it; the profile must be "format": "dtrain-profile",
"version": 1.
"""
import argparse
import csv
import json
import math
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import plotting  # noqa: E402  (beside this script)

PROFILE_FORMAT = "dtrain-profile"
PROFILE_VERSION = 1
TRANSPORTS = ("grpc", "tcp", "shm")
MODES = ("sync", "async")
LINK_PAYLOAD = 1448.0 / 1514.0  # data bytes per wire byte of a TCP stream at MTU 1500 (timestamps on)
BOUNDS = ("compute", "ps link", "worker link", "ps CPU", "worker CPU", "transport", "machine CPU", "stragglers",
          "latency")
_RATE = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(bit|kbit|mbit|gbit)$")
_UNIT = {"bit": 1.0, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9}


class PlanError(ValueError):
    """A bad argument or profile: the message names it."""


def parse_bandwidth(text):
    """'1gbit', '100mbit', '2.5gbit', '500kbit' (tc's units, as scripts/netns_hosts.sh takes them) -> bits/s."""
    m = _RATE.match(text.strip().lower()) if isinstance(text, str) else None
    if not m or float(m.group(1)) <= 0:
        raise PlanError("bandwidth %r: expected a positive number with bit, kbit, mbit or gbit (e.g. 1gbit, "
                        "100mbit, 2.5gbit); 'gbps'/'G' are not accepted, to keep bits and bytes apart" % (text,))
    return float(m.group(1)) * _UNIT[m.group(2)]


def parse_int_list(text, what, low=1, high=100000):
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise PlanError("--%s=%s: expected comma-separated whole numbers, e.g. 1,2,4" % (what, text))
    if not values or any(v < low or v > high for v in values):
        raise PlanError("--%s=%s: every value must be in [%d, %d]" % (what, text, low, high))
    return sorted(set(values))


def parse_positive(text, what, allow_zero=False):
    try:
        v = float(text)
    except (TypeError, ValueError):
        raise PlanError("--%s=%s: expected a number" % (what, text))
    if not math.isfinite(v) or v < 0 or (v == 0 and not allow_zero):
        raise PlanError("--%s=%s: must be %s" % (what, text, ">= 0" if allow_zero else "> 0"))
    return v


def _need(d, path, kind=(int, float)):
    cur = d
    for key in path.split("."):
        if not isinstance(cur, dict) or key not in cur:
            raise PlanError("profile: missing %s (written by an older or other program? make it again with "
                            "dtrain_worker --profile_out)" % path)
        cur = cur[key]
    if kind is not None and not isinstance(cur, kind):
        raise PlanError("profile: %s has the wrong type (%s)" % (path, type(cur).__name__))
    return cur


def check_profile(profile):
    """Raises PlanError unless `profile` (a dict) is a usable dtrain profile of this version."""
    if not isinstance(profile, dict):
        raise PlanError("profile: not a JSON object")
    if profile.get("format") != PROFILE_FORMAT:
        raise PlanError("profile: format is %r, not %r: not a file of dtrain_worker --profile_out"
                        % (profile.get("format"), PROFILE_FORMAT))
    if profile.get("version") != PROFILE_VERSION:
        raise PlanError("profile: version %r; this planner reads version %d (make the profile again with this "
                        "build's dtrain_worker --profile_out)" % (profile.get("version"), PROFILE_VERSION))
    for path in ("run.examples_per_step", "run.compute_cores", "run.threads", "run.wire_bytes_per_float",
                 "steps.compute_s.median", "steps.step_s.mean", "ps.apply_s_per_byte", "ps.sum_s_per_byte",
                 "model_floats", "phases.startup_s"):
        _need(profile, path)
    _need(profile, "steps.compute_s.quantiles", list)
    layers = _need(profile, "layers", list)
    if not layers:
        raise PlanError("profile: no layers")
    for k, layer in enumerate(layers):
        for key in ("begin", "end", "forward_s", "backward_s"):
            if not isinstance(layer.get(key), (int, float)):
                raise PlanError("profile: layers[%d].%s missing" % (k, key))
    _need(profile, "placement", dict)
    _need(profile, "transports", dict)


def load_profile(path):
    try:
        with open(path) as f:
            profile = json.load(f)
    except OSError as e:
        raise PlanError("--profile=%s: %s" % (path, e.strerror or e))
    except ValueError as e:
        raise PlanError("--profile=%s: not JSON (%s)" % (path, e))
    check_profile(profile)
    return profile


# ---- the pieces of the model ----

def expected_order_statistic(quantiles, rank, n):
    """E[X_(rank:n)]: the rank-th smallest of n draws from the distribution given by its quantiles at 0, 1/m, ...,
    1 (linear between them)."""
    m = len(quantiles) - 1
    if m < 1:
        return float(quantiles[0])
    steps = 2000
    log_c = math.lgamma(n + 1) - math.lgamma(rank) - math.lgamma(n - rank + 1)
    total, weight = 0.0, 0.0
    for i in range(steps):
        u = (i + 0.5) / steps
        w = math.exp(log_c + (rank - 1) * math.log(u) + (n - rank) * math.log(1 - u)) / steps
        at = u * m
        lo = min(int(at), m - 1)
        q = quantiles[lo] + (quantiles[lo + 1] - quantiles[lo]) * (at - lo)
        total += w * q
        weight += w
    return total / weight


def layer_floats(profile, num_ps):
    """n[k][j]: floats of layer k on ps task j for num_ps tasks (the profile's placement), and each task's total."""
    placement = profile["placement"].get(str(num_ps))
    if placement is None:
        raise PlanError("--ps=%d: the profile has placements for %s ps tasks only"
                        % (num_ps, ", ".join(sorted(profile["placement"], key=int))))
    layers = profile["layers"]
    n = [[0.0] * num_ps for _ in layers]
    for s in placement["slices"]:
        b, e, task = s["begin"], s["begin"] + s["floats"], s["task"]
        if not 0 <= task < num_ps:
            raise PlanError("profile: placement %d has a slice on task %d" % (num_ps, task))
        for k, layer in enumerate(layers):
            lo, hi = max(b, layer["begin"]), min(e, layer["end"])
            if hi > lo:
                n[k][task] += hi - lo
    return n


def transport_costs(profile, transport):
    t = profile["transports"].get(transport)
    if t is None:
        raise PlanError("--transport=%s: the profile did not measure it (it has %s)"
                        % (transport, ", ".join(sorted(profile["transports"])) or "none"))
    if "skipped" in t:
        raise PlanError("--transport=%s: the profile could not measure it: %s" % (transport, t["skipped"]))
    costs = {k: float(t[k]) for k in ("push_worker_cpu_s_per_byte", "push_ps_cpu_s_per_byte",
                                      "pull_ps_cpu_s_per_byte", "pull_worker_cpu_s_per_byte")}
    costs["stream_piece_bytes"] = float(t.get("stream_piece_bytes", 0))
    costs["sparse_rows"] = t.get("sparse_rows")
    # One stream's own speed: a push (a pull) of the model's bytes end to end on loopback.
    for what in ("push", "pull"):
        secs = float(t.get(what + "_s", 0.0))
        costs[what + "_speed"] = float(t["bytes"]) / secs if secs > 0 and t.get("bytes") else float("inf")
    return costs


def compute_scale(profile, host_cpus):
    """How many times the profile's compute time a host of host_cpus cores takes."""
    cores = float(profile["run"]["compute_cores"])
    return cores / min(float(host_cpus), float(profile["run"]["threads"]))


def local_step(profile, host_cpus):
    """One worker in local mode on a host of host_cpus cores: the profile's mean step, scaled, and at least the
    process's CPU per step (every thread's: the input pipeline's too) on those cores."""
    cpu = profile["steps"].get("process_cpu_s", 0.0)
    return max(profile["steps"]["step_s"]["mean"] * compute_scale(profile, host_cpus), cpu / float(host_cpus))


def extra_worker_cpu(profile):
    """Core-seconds a local step's process spent besides its compute and its in-process ps (the input pipeline's
    threads, the loop), which a cluster worker spends too."""
    st = profile["steps"]
    cpu = st.get("process_cpu_s", 0.0)
    med = lambda key: st.get(key, {}).get("median", 0.0)  # noqa: E731
    return max(0.0, cpu - med("compute_s") * profile["run"]["compute_cores"] - med("update_s") - med("transport_s"))


def _sparse(profile, num_ps, wb):
    """Per ps task: wire bytes of a step's rows each way, and their update rows (tables spread by id)."""
    sp = profile.get("sparse")
    if not sp:
        return 0.0, 0.0
    bytes_per_step, rows = 0.0, 0.0
    for t in sp["tables"]:
        rows += t["rows_per_step"]
        bytes_per_step += t["rows_per_step"] * (t["id_bytes"] + t["bytes_per_row"] * wb / 4.0)
    return bytes_per_step / num_ps, rows / num_ps


CHUNK_FLOATS = 1 << 16  # SliceStore::kChunkFloats: an update is published (and streamed) chunk by chunk


def update_costs(profile):
    """(a, s): seconds per stored byte of an update on one thread, and of summing one more gradient into it. The
    run's own updates (memory as training leaves it) where they ran on one thread; else the profile's update
    measured on its own; the summing cost in the same proportion."""
    ps = profile["ps"]
    a, s = ps["apply_s_per_byte"], ps["sum_s_per_byte"]
    in_run = ps.get("in_run_update_s", {}).get("median", 0.0)
    if ps.get("in_run_apply_threads") == 1 and in_run > 0 and a > 0 and not profile.get("sparse"):
        ratio = in_run / (4.0 * profile["model_floats"]) / a
        return a * ratio, s * ratio
    return a, s


class _Setup:
    """What one prediction's timeline reads, with the resources named in `no` removed."""

    def __init__(self, profile, W, P, B, L, H, C, mode, costs, no, burst_s):
        self.W, self.P, self.H, self.sync = W, P, H, mode == "sync"
        self.no_compute = "compute" in no
        s = compute_scale(profile, H)
        self.s = s
        layers = profile["layers"]
        self.K = len(layers)
        self.compute_med = profile["steps"]["compute_s"]["median"]
        raw = sum(l["forward_s"] + l["backward_s"] for l in layers)
        norm = self.compute_med / raw if raw > 0 else 1.0
        self.f = [0.0 if self.no_compute else l["forward_s"] * norm * s for l in layers]
        self.g = [0.0 if self.no_compute else l["backward_s"] * norm * s for l in layers]
        cores = float(profile["run"]["compute_cores"])
        self.f_cpu, self.g_cpu = sum(self.f) / s * cores, sum(self.g) / s * cores  # core-seconds
        st = profile["steps"]
        med = lambda key: st.get(key, {}).get("median", 0.0)  # noqa: E731
        # The rest of a local step on the worker besides compute, the in-process ps (its update and calls) and the
        # input wait: the loop's own work (a model with tables: its ids and rows), before each step's compute.
        other = max(0.0, med("step_s") - self.compute_med - med("update_s") - med("transport_s") - med("input_s"))
        self.input_s = 0.0 if self.no_compute else (med("input_s") + other) * s
        self.wb = float(profile["run"]["wire_bytes_per_float"])
        # The early apply updates what has arrived message by message: a pull trails its push by one message
        # (the transport's piece; else the store's chunk).
        self.piece_bytes = costs.get("stream_piece_bytes") or CHUNK_FLOATS * self.wb
        self.n = layer_floats(profile, P)
        self.task_floats = [sum(self.n[k][j] for k in range(self.K)) for j in range(P)]
        self.rows_bytes, self.rows_count = _sparse(profile, P, self.wb)
        ps_cpu = "ps CPU" not in no
        self.a, self.sigma = update_costs(profile) if ps_cpu else (0.0, 0.0)
        self.row_update = (profile.get("sparse") or {}).get("update_s_per_row", 0.0) if ps_cpu else 0.0
        # A model with tables: what the in-process ps spent serving a step's pull (its rows looked up or made) is
        # the ps task's work per row of a pull.
        rows = sum(t["rows_per_step"] for t in (profile.get("sparse") or {}).get("tables", []))
        self.row_lookup = med("transport_s") / rows if rows > 0 and ps_cpu else 0.0
        # Where the profile measured the transport with rows: what a row adds to a step on loopback, each way (half
        # of both ways), on each side (the ps's lookups and updates included there, in place of the above).
        self.row_wall = self.row_worker_cpu = self.row_ps_cpu = 0.0
        measured = costs.get("sparse_rows") or {}
        if measured.get("per_step", 0) > 0:
            per = 2.0 * measured["per_step"]
            self.row_wall = measured["extra_s"] / per if "transport" not in no else 0.0
            self.row_worker_cpu = measured["worker_cpu_s"] / per if "worker CPU" not in no else 0.0
            self.row_ps_cpu = measured["ps_cpu_s"] / per if ps_cpu else 0.0
            self.row_lookup = 0.0
        self.cpr = costs["push_ps_cpu_s_per_byte"] if ps_cpu else 0.0
        self.cps = costs["pull_ps_cpu_s_per_byte"] if ps_cpu else 0.0
        self.cws = costs["push_worker_cpu_s_per_byte"] if "worker CPU" not in no else 0.0
        self.cwr = costs["pull_worker_cpu_s_per_byte"] if "worker CPU" not in no else 0.0
        self.L = 0.0 if "latency" in no else L
        inf = float("inf")
        self.push_speed = costs["push_speed"] if "transport" not in no else inf
        self.pull_speed = costs["pull_speed"] if "transport" not in no else inf
        self.C = None if "machine CPU" in no else C
        self.ps_link = B if B is not None and "ps link" not in no else None
        self.worker_link = B if B is not None and "worker link" not in no else None
        self.used = max(1, sum(1 for j in range(P) if self.task_floats[j] > 0 or self.rows_bytes > 0))
        self.flows = W if self.sync else 1  # flows at once on a ps task (async: shared resources bounded apart)
        self.apply_cpu = min(1.0, H)  # an update runs on one thread
        # A link emulated with a token bucket (tc tbf) sends its bucket's bytes at once after an idle time; each
        # flow's share of the buckets it crosses.
        share = []
        if self.ps_link is not None:
            share.append(burst_s * self.ps_link / self.flows)
        if self.worker_link is not None:
            share.append(burst_s * self.worker_link / self.used)
        self.burst = min(share) if share and burst_s > 0 else 0.0

    def rate(self, cpu_per_byte, speed=float("inf"), links=True):
        """A flow's bytes/s: its share of both links (unless not `links`) and of the ps task's CPU, at most the
        transport's own speed (one stream on loopback)."""
        r = speed
        if self.ps_link is not None and links:
            r = min(r, self.ps_link / self.flows)
        if self.worker_link is not None and links:
            r = min(r, self.worker_link / self.used)
        if cpu_per_byte > 0:
            r = min(r, self.H / (self.flows * cpu_per_byte))
        return r


class _Flow:
    """One direction of a flow: its rate, the rate without the links (the bytes a link's bucket lends cross at
    that), and what is left of its bucket this step."""

    def __init__(self, x, cpu_per_byte, speed):
        self.rate = x.rate(cpu_per_byte, speed)
        self.unlinked = x.rate(cpu_per_byte, speed, links=False)
        self.free = x.burst

    def secs(self, nbytes):
        if nbytes <= 0 or self.rate == float("inf"):
            return 0.0
        free = min(self.free, nbytes)
        self.free -= free
        lent = free / self.unlinked if self.unlinked < float("inf") else 0.0
        return lent + (nbytes - free) / self.rate


def _forward(x, arrive, start):
    end = start
    for k in range(x.K):
        end = max(end, arrive[k]) + x.f[k]
    return end


def _push(x, f_end):
    """Backward from f_end, each layer's gradients pushed once ready: (last gradient ready, per task the time its
    push is done there (async: its last slice updated too), per layer per task the time that layer's last byte is
    sent, the ps tasks' CPU)."""
    flows = [_Flow(x, x.cpr, x.push_speed) for _ in range(x.P)]
    ready, done = f_end, [f_end] * x.P
    updated = [f_end] * x.P  # async: a slice is updated once it has all arrived, one after another
    layer_done = [[f_end] * x.P for _ in range(x.K)]
    for k in reversed(range(x.K)):
        ready += x.g[k]
        for j in range(x.P):
            if x.n[k][j] > 0:
                done[j] = max(done[j], ready) + flows[j].secs(x.n[k][j] * x.wb)
                if not x.sync:
                    updated[j] = max(updated[j], done[j]) + x.n[k][j] * 4 * x.a / x.apply_cpu
            layer_done[k][j] = done[j]
    if not x.sync:
        done = [max(d, u) for d, u in zip(done, updated)]
    push_ps = x.cpr + (0.0 if x.sync else x.a * 4 / x.wb)  # CPU per wire byte (async: with the update)
    cpu = [x.W * x.task_floats[j] * x.wb * push_ps for j in range(x.P)]
    if x.rows_bytes > 0:  # the rows' gradients go once backward is over
        for j in range(x.P):
            done[j] = max(done[j], ready) + max(flows[j].secs(x.rows_bytes), x.rows_count * x.row_wall)
            cpu[j] += x.W * x.rows_bytes * x.cpr + x.W * x.rows_count * x.row_ps_cpu + \
                (0.0 if x.sync else x.W * x.rows_count * x.row_update)
    return ready, done, layer_done, cpu


def _pull(x, start, upd):
    """The pull from start[j] on each task, each slice once updated (upd per stored byte, one thread): per layer
    its arrival at the worker, the arrival of the rows, the ps tasks' CPU."""
    flows = [_Flow(x, x.cps, x.pull_speed) for _ in range(x.P)]
    arrive = [0.0] * x.K
    sent, applied, cum = list(start), list(start), [0.0] * x.P
    for k in range(x.K):
        for j in range(x.P):
            if x.n[k][j] <= 0:
                continue
            cum[j] += x.n[k][j]
            applied[j] += x.n[k][j] * 4 * upd / x.apply_cpu
            sent[j] = max(sent[j], applied[j]) + flows[j].secs(x.n[k][j] * x.wb)
            # The task's CPU: the update and W workers' pulls of everything so far, on H cores.
            sent[j] = max(sent[j], start[j] + cum[j] * (4 * upd + x.W * x.wb * x.cps) / x.H)
            arrive[k] = max(arrive[k], sent[j] + x.L)
    cpu = [x.task_floats[j] * (4 * upd + x.W * x.wb * x.cps) for j in range(x.P)]
    rows_arrive = 0.0
    if x.rows_bytes > 0:  # the rows travel after each task's slices; a step binds them before its forward
        for j in range(x.P):
            rows_update = x.W * x.rows_count * (x.row_update if x.sync else 0.0) + x.W * x.rows_count * x.row_lookup
            sent[j] = max(sent[j], start[j]) + max(flows[j].secs(x.rows_bytes), x.rows_count * x.row_wall) + \
                rows_update / x.apply_cpu
            cpu[j] += x.W * x.rows_bytes * x.cps + rows_update + x.W * x.rows_count * x.row_ps_cpu
            rows_arrive = max(rows_arrive, sent[j] + x.L)
    return arrive, rows_arrive, cpu


def _timeline(profile, W, P, B, L, H, C, mode, costs, backup_workers, no, burst_s=0.0, early=False):
    """The step (sync) or cycle (async) time of one prediction with the resources named in `no` removed.
    B: bytes/s per link and direction (None: unlimited); L: one-way seconds; H: cores per host; C: the machine's
    cores when every host shares one (None: hosts apart); burst_s: the links' token buckets, in seconds of their
    rate (0: none); early: the early apply (sync, one worker, one ps task)."""
    x = _Setup(profile, W, P, B, L, H, C, mode, costs, no, burst_s)
    wire = sum(x.task_floats) * x.wb + x.rows_bytes * P  # a worker's bytes each way
    rows_cpu = x.rows_count * P * x.row_worker_cpu  # the worker's CPU for its rows, each way
    # The worker's other threads (its input pipeline) and its loop, counted against its cores with the forward.
    other_cpu = 0.0 if x.no_compute else extra_worker_cpu(profile)
    upd = (x.a + (W - 1) * x.sigma) if x.sync else 0.0  # per stored byte (async: applied as the push arrives)
    # Sync: the other tasks learn ps 0's decision from the pull (2L); async: their pulls follow ps 0's answer.
    start = [0.0 if j == 0 else 2 * x.L for j in range(P)]
    arrive, rows_arrive, pull_cpu = _pull(x, start, upd)

    def one_step(arrive, rows_arrive):
        """Forward on those arrivals, backward and the push: (f_end, end of the push at the tasks, push detail)."""
        f_end = _forward(x, arrive, max(x.input_s, rows_arrive))
        # The worker's CPU: compute, receiving the pull; backward, sending the push.
        f_end = max(f_end, x.input_s + (x.f_cpu + wire * x.cwr + rows_cpu + other_cpu) / x.H)
        ready, done, layer_done, push_cpu = _push(x, f_end)
        worker_floor = f_end + (x.g_cpu + wire * x.cws + rows_cpu) / x.H
        end = ready
        for j in range(P):
            if x.task_floats[j] > 0 or x.rows_bytes > 0:
                end = max(end, max(done[j], worker_floor, f_end + push_cpu[j] / x.H) + x.L)
        return f_end, end, (ready, layer_done, push_cpu)

    f_end, step, (ready, layer_done, push_cpu) = one_step(arrive, rows_arrive)
    if early:
        # The pull goes out beside the push at the first gradients; ps 0 applies each chunk as it arrives and
        # streams it back behind the push; the next step starts once the push is acknowledged (2L after its last
        # byte left) and its forward waits for each layer: a fixed point over the arrivals.
        r = x.rate(x.cps, x.pull_speed)
        piece = x.piece_bytes
        for _ in range(20):
            first = f_end + x.g[-1] if x.K else f_end
            flow = _Flow(x, x.cps, x.pull_speed)
            sent, new = first + x.L, []
            for k in range(x.K):
                nb = x.n[k][0] * x.wb
                tail = min(nb, piece) / x.wb * 4 * x.a / x.apply_cpu + (min(nb, piece) / r if r < float("inf") else 0)
                sent = max(sent + flow.secs(nb), layer_done[k][0] + x.L + tail)
                new.append(sent + x.L)
            period = step + x.L  # the push's acknowledgement
            arrive = [max(0.0, t - period) for t in new]
            f_end, step2, (ready, layer_done, push_cpu) = one_step(arrive, 0.0)
            converged = abs(step2 + x.L - period) < 1e-9
            step = step2
            if converged:
                break
        step += x.L
    if x.C is not None and x.sync:
        # One machine for every host: each phase lasts at least the CPU every process spends in it / C.
        fwd_cpu = W * (x.f_cpu + wire * x.cwr + rows_cpu + other_cpu) + sum(pull_cpu)
        bwd_cpu = W * (x.g_cpu + wire * x.cws + rows_cpu) + sum(push_cpu)
        step = max(step, max(f_end, fwd_cpu / x.C) + bwd_cpu / x.C)
    if "stragglers" not in no and not x.no_compute:
        if x.sync:  # the barrier waits for the slowest of W (the R-th of W with backup workers)
            q = profile["steps"]["compute_s"]["quantiles"]
            step += max(0.0, expected_order_statistic(q, W - backup_workers, W) - x.compute_med) * x.s
        else:
            step += max(0.0, profile["steps"]["compute_s"].get("mean", x.compute_med) - x.compute_med) * x.s
    # In the long run no link carries more than its rate (a token bucket only lends bytes to a burst).
    floor = 0.0
    for j in range(P):
        if x.ps_link is not None:
            floor = max(floor, W * (x.task_floats[j] * x.wb + x.rows_bytes) / x.ps_link)
    if x.worker_link is not None:
        floor = max(floor, wire / x.worker_link)
    if x.sync:
        return max(step + (2 * x.L if P > 1 else 0.0), floor)  # other tasks acknowledge before the commit
    # Async: the pull goes out once the push is acknowledged (with P > 1, after the other tasks' parts). A lone
    # worker's cycle, bounded by its own link and CPU:
    worker_cpu = x.f_cpu + x.g_cpu + wire * (x.cwr + x.cws) + 2 * rows_cpu + other_cpu
    alone = max(step + 2 * x.L * (1 if P == 1 else 2), x.input_s + worker_cpu / x.H)
    if x.worker_link is not None:
        alone = max(alone, wire / x.worker_link)
    # W workers cycle on their own and meet at what they share: each ps task's links (in and out) and CPU, and
    # the machine's cores. Those are queues whose load depends on how the workers' phases fall; mean value
    # analysis of the closed network (W workers; each cycle a delay, then each shared station's demand) gives the
    # cycle. The stations' demands are scaled down where a lone worker's timeline beats their sum (bursts,
    # overlap) so that one worker's cycle is its timeline; the long-run bounds stay.
    demands = []
    for j in range(P):
        nbytes = x.task_floats[j] * x.wb + x.rows_bytes
        if nbytes <= 0:
            continue
        if x.ps_link is not None:
            demands += [nbytes / x.ps_link, nbytes / x.ps_link]  # its push in, its pull out
        demands.append((push_cpu[j] / W + pull_cpu[j] / W) / x.H)
    if x.C is not None:
        demands.append((worker_cpu + (sum(push_cpu) + sum(pull_cpu)) / W) / x.C)
    total = sum(demands)
    shrink = min(1.0, alone / total) if total > 0 else 1.0
    think = alone - shrink * total
    queue = [0.0] * len(demands)
    cycle = alone
    for n in range(1, W + 1):
        resid = [d * shrink * (1 + q) for d, q in zip(demands, queue)]
        cycle = think + sum(resid)  # one worker's cycle with n workers
        queue = [n * r / cycle for r in resid]
    return max(cycle, floor, max([W * d for d in demands] + [0.0]))


def _tighter_link(profile, W, P, mode):
    """'ps link' when a ps task's link carries more of a step than a worker's, else 'worker link'."""
    n = layer_floats(profile, P)
    per_task = [sum(row[j] for row in n) for j in range(P)]
    used = sum(1 for t in per_task if t > 0) or 1
    if mode == "sync":  # every flow at once: B / W on the task's link, B / used on the worker's
        return "ps link" if W >= used else "worker link"
    return "ps link" if W * max(per_task) >= sum(per_task) else "worker link"


def predict(profile, workers, ps, bandwidth_bps, latency_s, host_cpus, mode, transport, backup_workers=0,
            shared_cores=None, examples=None, link_burst_s=0.0, apply_early="auto", link_payload=LINK_PAYLOAD):
    """One prediction. bandwidth_bps: bits/s per link and direction (None: unlimited); latency_s: one-way
    seconds; host_cpus: cores per emulated host (None: the profile's); shared_cores: every host on one machine
    of that many cores (None: hosts apart); link_burst_s: links emulated with a token bucket of this many seconds
    of their rate (scripts/netns_hosts.sh: 0.01; a physical link: 0); apply_early: auto (dtrain's default: the
    faster of the two where it applies: sync, one worker, one ps task, not shared memory, no tables), on, off;
    link_payload: the data a link carries per byte of its rate (TCP over Ethernet at MTU 1500: 1448/1514).
    Returns a dict: step_s, examples_per_sec, efficiency, bound, savings (seconds each resource's removal would
    save), local_step_s, early_apply, wall_s (with examples)."""
    check_profile(profile)
    if not isinstance(workers, int) or workers < 1:
        raise PlanError("workers must be a whole number >= 1, got %r" % (workers,))
    if not isinstance(ps, int) or ps < 1:
        raise PlanError("ps must be a whole number >= 1, got %r" % (ps,))
    if mode not in MODES:
        raise PlanError("mode must be sync or async, got %r" % (mode,))
    if transport not in TRANSPORTS:
        raise PlanError("transport must be grpc, tcp or shm, got %r" % (transport,))
    if bandwidth_bps is not None and not bandwidth_bps > 0:
        raise PlanError("bandwidth must be > 0 bits/s, got %r" % (bandwidth_bps,))
    if not latency_s >= 0:
        raise PlanError("latency must be >= 0, got %r" % (latency_s,))
    if host_cpus is None:
        host_cpus = float(profile["host"]["cpus_available"])
    if not host_cpus > 0:
        raise PlanError("host_cpus must be > 0, got %r" % (host_cpus,))
    if shared_cores is not None and not shared_cores > 0:
        raise PlanError("shared_cores must be > 0, got %r" % (shared_cores,))
    if not link_burst_s >= 0:
        raise PlanError("link_burst_s must be >= 0, got %r" % (link_burst_s,))
    if apply_early not in ("auto", "on", "off"):
        raise PlanError("apply_early must be auto, on or off, got %r" % (apply_early,))
    if not 0 <= backup_workers < workers:
        backup_workers = min(max(0, backup_workers), workers - 1)
    H = float(host_cpus) if shared_cores is None else min(float(host_cpus), float(shared_cores))
    costs = transport_costs(profile, transport)
    # A link's payload: its bits/s less the frames' headers (Ethernet + IP + TCP with timestamps: 1448 bytes of
    # data in 1514 on the wire at MTU 1500).
    B = None if bandwidth_bps is None or transport == "shm" else bandwidth_bps / 8.0 * link_payload
    args = (profile, workers, ps, B, latency_s, H, shared_cores, mode, costs, backup_workers)
    can_early = (mode == "sync" and workers == 1 and ps == 1 and transport != "shm" and
                 not (profile.get("sparse") or {}).get("tables"))
    early = can_early and apply_early != "off"
    step = _timeline(*args, no=set(), burst_s=link_burst_s, early=early)
    if early and apply_early == "auto":  # dtrain measures both and keeps the faster
        off = _timeline(*args, no=set(), burst_s=link_burst_s, early=False)
        early, step = (False, off) if off < step else (True, step)
    # What bounds it: the resource whose removal saves the most. Both links are removed together (at W = P they
    # bind at once) and the saving goes to the tighter one.
    savings = {}
    for what in BOUNDS:
        if (what == "stragglers" and mode != "sync") or (what == "machine CPU" and shared_cores is None):
            continue
        if what == "worker link" or (what == "ps link" and B is None):
            continue
        no = {"ps link", "worker link"} if what == "ps link" else {what}
        saved = max(0.0, step - _timeline(*args, no=no, burst_s=link_burst_s, early=early))
        savings[what if what != "ps link" else _tighter_link(profile, workers, ps, mode)] = saved
    bound = max(savings, key=lambda k: (savings[k], -BOUNDS.index(k)))
    eps = workers * profile["run"]["examples_per_step"] / step
    local = local_step(profile, H)
    local_eps = profile["run"]["examples_per_step"] / local
    out = {"mode": mode, "workers": workers, "ps": ps,
           "bandwidth_bps": bandwidth_bps, "latency_s": latency_s, "host_cpus": host_cpus,
           "shared_cores": shared_cores, "transport": transport, "backup_workers": backup_workers,
           "step_s": step, "examples_per_sec": eps, "local_step_s": local,
           "efficiency": eps / (workers * local_eps), "bound": bound, "savings": savings, "early_apply": early,
           "link_burst_s": link_burst_s}
    if examples is not None:
        out["wall_s"] = wall_clock(profile, examples, eps, bandwidth_bps, latency_s, H, link_payload)
    return out


def wall_clock(profile, examples, examples_per_sec, bandwidth_bps, latency_s, host_cpus, link_payload=LINK_PAYLOAD):
    """Start (the profile's start-up, scaled, + the chief's initial values over one link), training, the final
    evaluation and the end."""
    s = compute_scale(profile, host_cpus)
    ph = profile["phases"]
    init = 0.0
    if bandwidth_bps:
        init = profile["model_floats"] * profile["run"]["wire_bytes_per_float"] * 8.0 / (bandwidth_bps * link_payload)
    # A ps task's own start and end, as the profile's transport measurement saw them (grpc; 0 if not measured).
    grpc = profile.get("transports", {}).get("grpc", {})
    start = ph["startup_s"] * s + grpc.get("cluster_start_s", 0.0) + init + 4 * latency_s
    end = ph.get("evaluate_s", 0.0) * s + ph.get("end_s", 0.0) * s + grpc.get("cluster_end_s", 0.0)
    return start + examples / examples_per_sec + end


def recommend(rows, within):
    """For each (mode, bandwidth, workers): the smallest ps count within `within` of the best examples/sec."""
    best = {}
    for r in rows:
        key = (r["mode"], r["bandwidth_bps"], r["workers"])
        best.setdefault(key, []).append(r)
    out = {}
    for key, group in best.items():
        top = max(r["examples_per_sec"] for r in group)
        ok = [r["ps"] for r in group if r["examples_per_sec"] >= (1 - within) * top]
        out[key] = min(ok)
    return out


def format_rate(bps):
    if bps is None:
        return "unlimited"
    for unit, mult in (("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3)):
        if bps >= mult:
            return "%g%s" % (bps / mult, unit)
    return "%gbit" % bps


def plot(rows, path, title, modes, bandwidths, ps_counts):
    """Draws the plan's picture at `path`; plotting.PlotError when it cannot."""
    plt = plotting.pyplot(path)
    cols = 2 * len(modes)
    fig, axes = plt.subplots(len(bandwidths), cols, figsize=(4.2 * cols, 3.4 * len(bandwidths)), squeeze=False)
    for bi, bw in enumerate(bandwidths):
        for mi, mode in enumerate(modes):
            ax_eps, ax_eff = axes[bi][2 * mi], axes[bi][2 * mi + 1]
            for p in ps_counts:
                pts = sorted((r for r in rows if r["mode"] == mode and r["bandwidth_bps"] == bw and r["ps"] == p),
                             key=lambda r: r["workers"])
                x = [r["workers"] for r in pts]
                ax_eps.plot(x, [r["examples_per_sec"] for r in pts], "o-", label="%d ps" % p)
                ax_eff.plot(x, [r["efficiency"] for r in pts], "o-", label="%d ps" % p)
            ax_eps.set_title("%s, %s: examples/sec" % (mode, format_rate(bw)))
            ax_eff.set_title("%s, %s: scaling efficiency" % (mode, format_rate(bw)))
            ax_eff.set_ylim(0, 1.05)
            for ax in (ax_eps, ax_eff):
                ax.set_xscale("log", base=2)
                ax.set_xlabel("workers")
                ax.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    plotting.save(fig, path, dpi=90)
    print("plot written to %s" % path)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", required=True, help="dtrain_worker --profile_out's file")
    ap.add_argument("--workers", default="1,2,4,8,16,32,64,128", help="worker counts, e.g. 1,2,4")
    ap.add_argument("--ps", default="1,2,4,8", help="ps task counts (the profile has placements for 1 to 16)")
    ap.add_argument("--bandwidth", default="1gbit,10gbit,25gbit",
                    help="each host's link, each direction: e.g. 100mbit,1gbit,10gbit")
    ap.add_argument("--latency", default="0.1", help="one-way latency of a link crossing, milliseconds")
    ap.add_argument("--host_cpus", default=None,
                    help="cores of each host (0.25: a quarter core; default: what the profile's run had)")
    ap.add_argument("--shared_cores", default=None,
                    help="every emulated host on one machine of this many cores (netns hosts without quotas)")
    ap.add_argument("--modes", default="sync,async")
    ap.add_argument("--transport", default="tcp",
                    help="grpc | tcp (TCP lanes: dtrain's choice across hosts) | shm (one host: no links)")
    ap.add_argument("--backup_workers", default="0", help="sync: steps aggregate W - this many workers")
    ap.add_argument("--apply_early", default="auto", help="auto | on | off (dtrain_worker's flag)")
    ap.add_argument("--link_burst", default="0",
                    help="links emulated with token buckets of this many ms of their rate (netns_hosts.sh: 4)")
    ap.add_argument("--within", default="0.03", help="recommend the fewest ps tasks within this of the best")
    ap.add_argument("--examples", default="60000", help="predict the wall-clock of a run of this many examples")
    ap.add_argument("--out", default="", help="write PREFIX.csv, PREFIX.json and PREFIX.png")
    a = ap.parse_args(argv)
    try:
        profile = load_profile(a.profile)
        workers = parse_int_list(a.workers, "workers", 1, 100000)
        ps_counts = parse_int_list(a.ps, "ps", 1, 16)
        missing = [p for p in ps_counts if str(p) not in profile["placement"]]
        if missing:
            raise PlanError("--ps=%s: the profile has placements for %s ps tasks only"
                            % (a.ps, ",".join(sorted(profile["placement"], key=int))))
        bandwidths = []
        for b in a.bandwidth.split(","):
            if b.strip():
                bandwidths.append(parse_bandwidth(b))
        if not bandwidths:
            raise PlanError("--bandwidth: give at least one, e.g. 1gbit")
        bandwidths = sorted(set(bandwidths))
        latency = parse_positive(a.latency, "latency", allow_zero=True) / 1e3
        host_cpus = None if a.host_cpus is None else parse_positive(a.host_cpus, "host_cpus")
        shared = None if a.shared_cores is None else parse_positive(a.shared_cores, "shared_cores")
        modes = [m for m in a.modes.split(",") if m.strip()]
        if not modes or any(m not in MODES for m in modes):
            raise PlanError("--modes=%s: sync and/or async" % a.modes)
        if a.transport not in TRANSPORTS:
            raise PlanError("--transport=%s: grpc, tcp or shm" % a.transport)
        transport_costs(profile, a.transport)
        try:
            backup = int(a.backup_workers)
        except ValueError:
            raise PlanError("--backup_workers=%s: a whole number >= 0" % a.backup_workers)
        if backup < 0:
            raise PlanError("--backup_workers=%s: a whole number >= 0" % a.backup_workers)
        within = parse_positive(a.within, "within", allow_zero=True)
        if within >= 1:
            raise PlanError("--within=%s: a fraction below 1 (0.03: 3%%)" % a.within)
        examples = parse_positive(a.examples, "examples")
        if a.apply_early not in ("auto", "on", "off"):
            raise PlanError("--apply_early=%s: auto, on or off" % a.apply_early)
        burst = parse_positive(a.link_burst, "link_burst", allow_zero=True) / 1e3
        if a.out and not os.path.isdir(os.path.dirname(os.path.abspath(a.out))):
            raise PlanError("--out=%s: its directory does not exist" % a.out)
        rows = []
        for mode in modes:
            for bw in bandwidths:
                for w in workers:
                    for p in ps_counts:
                        rows.append(predict(profile, w, p, bw, latency, host_cpus, mode, a.transport,
                                            backup_workers=min(backup, w - 1), shared_cores=shared,
                                            examples=examples, link_burst_s=burst, apply_early=a.apply_early))
    except PlanError as e:
        print("plan_cluster: %s" % e, file=sys.stderr)
        return 2
    rec = recommend(rows, within)
    for r in rows:
        r["recommended"] = rec[(r["mode"], r["bandwidth_bps"], r["workers"])] == r["ps"]
    run = profile["run"]
    hosts = "%g cores" % (host_cpus if host_cpus is not None else profile["host"]["cpus_available"])
    print("model %s, batch %d, %s threads; profile on %s (%s cores); hosts of %s%s, latency %g ms, --transport=%s"
          % (run["model"], run["examples_per_step"], run["threads"], profile["host"]["cpu_model"],
             profile["host"]["cpus_available"], hosts,
             "" if shared is None else " sharing %g cores" % shared, latency * 1e3, a.transport))
    hdr = "%-6s %-10s %7s %3s %10s %13s %10s %-12s %10s" % ("mode", "bandwidth", "workers", "ps", "step_ms",
                                                            "examples/sec", "efficiency", "bound", "wall_s")
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        print("%-6s %-10s %7d %3d %10.2f %13.1f %9.0f%% %-12s %10.1f%s" % (
            r["mode"], format_rate(r["bandwidth_bps"]), r["workers"], r["ps"], r["step_s"] * 1e3,
            r["examples_per_sec"], 100 * r["efficiency"], r["bound"], r["wall_s"],
            "  <- use" if r["recommended"] and len(ps_counts) > 1 else ""))
    if a.out:
        keys = ["mode", "bandwidth_bps", "workers", "ps", "step_s", "examples_per_sec", "efficiency", "bound",
                "recommended", "wall_s", "local_step_s", "latency_s", "host_cpus", "shared_cores", "transport",
                "backup_workers"]
        with open(a.out + ".csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=keys, extrasaction="ignore")
            w.writeheader()
            for r in rows:
                w.writerow(r)
        with open(a.out + ".json", "w") as f:
            json.dump({"profile": os.path.abspath(a.profile), "model": run["model"], "examples": examples,
                       "rows": rows}, f, indent=1)
        print("table written to %s.csv and %s.json" % (a.out, a.out))
        try:
            plot(rows, a.out + ".png", "dtrain %s (planned from a local profile)" % run["model"], modes,
                 bandwidths, ps_counts)
        except plotting.PlotError as e:
            print("plan_cluster: %s (the table is written)" % e, file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
