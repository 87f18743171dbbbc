#!/usr/bin/python3
"""How good scripts/plan_cluster.py is: its predictions from a local profile against what
scripts/compare_cluster_sizes.sh measured. One row per measured cluster (and per local run, the check that the
machine ran as fast as when the profile was taken): predicted and measured examples/sec, the error, and the same
for the wall-clock; then the median and the worst error over the clusters.

  build/bin/dtrain_worker --job_name=local --model=mlp --batch_size=100 --train_steps=600 \\
      --profile_out=/tmp/mlp.profile.json
  scripts/compare_cluster_sizes.sh --netns --bandwidth=1gbit --model=mlp --batch_size=100 --sizes=1,2 \\
      --num_ps=1 --out=/tmp/mlp_1gbit
  scripts/planner_accuracy.py --profile=/tmp/mlp.profile.json /tmp/mlp_1gbit.json [more .json ...]

Each result file's settings say the model, batch, ps tasks, bandwidth, transport (and, where compare_cluster_sizes
records them, each emulated host's CPU quota `host_cpus` and one-way latency `latency_ms`); --host_cpus,
--latency and --shared_cores stand in for what a file does not say. Emulated hosts without CPU quotas share the
machine's cores: --shared_cores (default: the profile host's online CPUs) bounds them together. A profile is
picked per file by its model and batch; of several of one model, the newest written before the result file
(the machine as it was then: take a profile right before each measurement on a shared machine). Nothing is
fitted: the prediction comes from the profile alone.
"""
import argparse
import copy
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import plan_cluster as pc  # noqa: E402


def load_result(path):
    try:
        with open(path) as f:
            data = json.load(f)
    except OSError as e:
        raise pc.PlanError("%s: %s" % (path, e.strerror or e))
    except ValueError as e:
        raise pc.PlanError("%s: not JSON (%s)" % (path, e))
    if not isinstance(data, dict) or not isinstance(data.get("settings"), dict) or \
            not isinstance(data.get("rows"), list):
        raise pc.PlanError("%s: not a compare_cluster_sizes result (no settings and rows)" % path)
    for key in ("model", "batch_size", "num_ps"):
        if key not in data["settings"]:
            raise pc.PlanError("%s: settings without %s" % (path, key))
    return data


def pick_profile(profiles, settings, path):
    """The profile of the result's model and batch; of several, the newest written before the result (the machine
    as it was when the result was measured), else the first given. profiles: [(written, profile)]."""
    model = os.path.basename(str(settings["model"]))
    match = [(t, p) for t, p in profiles
             if os.path.basename(str(p["run"]["model"])) == model and p["run"]["batch_size"] == settings["batch_size"]]
    if not match:
        raise pc.PlanError("%s: no profile of model %s with batch %s (give one with --profile)"
                           % (path, model, settings["batch_size"]))
    written = os.path.getmtime(path) if os.path.exists(path) else float("inf")
    before = [m for m in match if m[0] <= written]
    return max(before, key=lambda m: m[0])[1] if before else match[0][1]


# scripts/netns_hosts.sh caps a link with tc tbf whose bucket holds 4 ms of the rate, at least 128 KB (10 ms before
# it could give hosts CPU quotas and latency: results without "emulated_hosts" in their settings): after an idle
# time a link sends that much at once.
NETNS_BURST_S, OLD_NETNS_BURST_S, NETNS_MIN_BURST_BYTES = 0.004, 0.010, 131072


def at_speed(profile, factor):
    """The profile of a machine `factor` times slower: every CPU time scaled (compute, input, updates, the
    transports' CPU, phases), the links' bytes not."""
    p = copy.deepcopy(profile)
    for layer in p["layers"]:
        layer["forward_s"] *= factor
        layer["backward_s"] *= factor
    for stats in p["steps"].values():
        if isinstance(stats, dict):
            for key, v in list(stats.items()):
                if key == "quantiles":
                    stats[key] = [q * factor for q in v]
                elif key != "n" and isinstance(v, (int, float)):
                    stats[key] = v * factor
    for key in ("apply_s_per_byte", "sum_s_per_byte"):
        p["ps"][key] *= factor
    for t in p["transports"].values():
        for key in list(t):
            if key.endswith("_cpu_s_per_byte") or key in ("cluster_start_s", "cluster_end_s"):
                t[key] *= factor
    if p.get("sparse"):
        p["sparse"]["update_s_per_row"] *= factor
    for key in ("startup_s", "evaluate_s", "end_s"):
        if key in p["phases"]:
            p["phases"][key] *= factor
    return p


def measured_rate(row, launch):
    """A run's examples/sec: compare_cluster_sizes' median launch, or the best of its launches (on a machine
    others share, the launch they disturbed least)."""
    launches = [v for v in row.get("examples_per_sec_launches") or [] if v]
    if launch == "best" and launches:
        return float(max(launches))
    return float(row["examples_per_sec"])


def settings_args(profile, s, host_cpus=None, latency_ms=None, shared_cores=None, transport=None, burst_ms=None):
    """plan_cluster.predict's arguments for a compare_cluster_sizes result's settings `s` (the flags stand in for
    what it does not say): (bandwidth bits/s or None, one-way latency s, host cores or None, shared cores or None,
    transport, examples, link burst s)."""
    bw = pc.parse_bandwidth(s["bandwidth"]) if s.get("bandwidth") else None
    # What the result says (compare_cluster_sizes writes null where it did not set one), else the flags.
    hc = s.get("host_cpus") if s.get("host_cpus") is not None else host_cpus
    lat_ms = s.get("latency_ms") if s.get("latency_ms") is not None else latency_ms
    lat = (lat_ms or 0.0) / 1e3
    # Without quotas every emulated host shares the machine's cores.
    shared = shared_cores
    if shared is None and s.get("host_cpus") is None:
        shared = float(profile["host"].get("online_cpus", profile["host"]["cpus_available"]))
    t = transport or s.get("transport") or "grpc"
    if t == "auto":  # shared memory on one host; across emulated hosts TCP lanes where the build has them
        lanes = "cluster_start_s" in profile["transports"].get("tcp", {}) and "emulated_hosts" in s
        t = ("tcp" if lanes else "grpc") if s.get("netns") else "shm"
    burst = 0.0
    if bw is not None and s.get("netns"):
        default = NETNS_BURST_S if "emulated_hosts" in s else OLD_NETNS_BURST_S
        burst = default if burst_ms is None else burst_ms / 1e3
        burst = max(burst, NETNS_MIN_BURST_BYTES * 8 / bw) if burst > 0 else 0.0
    return bw, lat, hc, shared, t, s.get("examples"), burst


def evaluate(profiles, results, host_cpus=None, latency_ms=None, shared_cores=None, transport=None, burst_ms=None,
             drift=False, launch="median", unpredictable=None):
    """Rows {file, configuration, mode, workers, ps, bandwidth, predicted, measured, error, wall_*, bound} for
    every measured run that exited 0, in file order (local runs have mode 'local'). profiles: [(written,
    profile)]. drift: a diagnostic, not the judged prediction: the profile slowed (or sped up) to the rate of the
    result's own local run, taking the machine's drift since the profile out of the clusters' errors.
    unpredictable(row, error): called for a run the planner cannot predict (PlanError), which is then left out;
    None: the PlanError is raised."""
    rows = []
    for path, data in results:
        s = data["settings"]
        profile = pick_profile(profiles, s, path)
        if drift:
            local = [r for r in data["rows"] if r.get("mode") == "local" and r.get("exit_code") == 0 and
                     r.get("examples_per_sec")]
            if local:
                predicted = profile["run"]["examples_per_step"] / pc.local_step(
                    profile, host_cpus if host_cpus is not None else profile["host"]["cpus_available"])
                profile = at_speed(profile, predicted / measured_rate(local[0], launch))
        bw, lat, hc, shared, t, examples, burst = settings_args(profile, s, host_cpus, latency_ms, shared_cores,
                                                               transport, burst_ms)
        for r in data["rows"]:
            if r.get("system", "dtrain") != "dtrain" or r.get("exit_code") != 0 or not r.get("examples_per_sec"):
                continue
            if r["mode"] == "local":
                predicted = profile["run"]["examples_per_step"] / pc.local_step(
                    profile, hc if hc is not None else profile["host"]["cpus_available"])
                out = {"bound": "-", "wall_s": None}
                workers, ps = 0, 0
            else:
                workers = int(r["workers"])
                # --colocate_ps: N workers and N ps tasks on N hosts, a worker and a task on each: as N ps tasks
                # whose every host's cores the worker and the task share (under symmetric placement, the
                # planner's bound of every process's CPU over all the hosts' cores, N x H), each link carrying the
                # worker's flows and the task's.
                colocated = bool(s.get("colocate_ps"))
                ps = workers if colocated else int(s["num_ps"])
                cores = (workers * hc if hc is not None else shared) if colocated else shared
                try:
                    out = pc.predict(profile, workers, ps, bw, lat, hc, r["mode"], t, shared_cores=cores,
                                     examples=examples, link_burst_s=burst)
                except pc.PlanError as e:
                    if unpredictable is None:
                        raise
                    unpredictable(r, e)
                    continue
                predicted = out["examples_per_sec"]
            measured = measured_rate(r, launch)
            wall = out.get("wall_s")
            rows.append({"file": path, "model": profile["run"]["model"], "configuration": r["configuration"],
                         "mode": r["mode"], "workers": workers, "ps": ps, "bandwidth": s.get("bandwidth") or "-",
                         "predicted": predicted, "measured": measured, "error": predicted / measured - 1,
                         "bound": out["bound"], "wall_predicted": wall, "wall_measured": r.get("wall_secs"),
                         "wall_error": (wall / r["wall_secs"] - 1) if wall and r.get("wall_secs") else None})
    return rows


def summary(rows):
    """Median and worst |error| of examples/sec over the clusters (local runs left out)."""
    errs = [abs(r["error"]) for r in rows if r["mode"] != "local"]
    if not errs:
        return None
    return {"clusters": len(errs), "median_abs_error": statistics.median(errs), "worst_abs_error": max(errs)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", action="append", required=True, help="a --profile_out file (one per model)")
    ap.add_argument("--host_cpus", default=None, help="cores of each emulated host, where a result does not say")
    ap.add_argument("--latency", default=None, help="one-way latency in ms, where a result does not say (0)")
    ap.add_argument("--shared_cores", default=None,
                    help="cores every emulated host shares (default: the profile's host, for runs without quotas)")
    ap.add_argument("--transport", default=None, help="grpc | tcp | shm (default: each result's)")
    ap.add_argument("--link_burst", default=None,
                    help="ms of a capped link's rate its token bucket lends a burst (default: netns_hosts.sh's 4)")
    ap.add_argument("--launch", default="median", choices=("median", "best"),
                    help="each run's rate: the median of its launches (compare_cluster_sizes' figure) or the best")
    ap.add_argument("--json", default="", help="also write the rows and the summary here")
    ap.add_argument("results", nargs="+", help="compare_cluster_sizes JSON files (--out PREFIX's PREFIX.json)")
    a = ap.parse_args(argv)
    try:
        profiles = [(os.path.getmtime(p) if os.path.exists(p) else 0.0, pc.load_profile(p)) for p in a.profile]
        host_cpus = None if a.host_cpus is None else pc.parse_positive(a.host_cpus, "host_cpus")
        latency = None if a.latency is None else pc.parse_positive(a.latency, "latency", allow_zero=True)
        shared = None if a.shared_cores is None else pc.parse_positive(a.shared_cores, "shared_cores")
        if a.transport is not None and a.transport not in pc.TRANSPORTS:
            raise pc.PlanError("--transport=%s: grpc, tcp or shm" % a.transport)
        results = [(p, load_result(p)) for p in a.results]
        burst = None if a.link_burst is None else pc.parse_positive(a.link_burst, "link_burst", allow_zero=True)
        rows = evaluate(profiles, results, host_cpus, latency, shared, a.transport, burst, launch=a.launch)
    except pc.PlanError as e:
        print("planner_accuracy: %s" % e, file=sys.stderr)
        return 2
    hdr = "%-6s %-9s %-26s %12s %12s %8s %-12s %9s %9s %8s" % (
        "model", "bandwidth", "configuration", "predicted", "measured", "error", "bound", "wall_pred", "wall_meas",
        "error")
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        print("%-6s %-9s %-26s %12.1f %12.1f %+7.1f%% %-12s %9s %9s %8s" % (
            os.path.basename(str(r["model"]))[:6], r["bandwidth"], r["configuration"][:26], r["predicted"],
            r["measured"], 100 * r["error"], r["bound"],
            "-" if r["wall_predicted"] is None else "%.1f" % r["wall_predicted"],
            "-" if r["wall_measured"] is None else "%.1f" % r["wall_measured"],
            "-" if r["wall_error"] is None else "%+.1f%%" % (100 * r["wall_error"])))
    s = summary(rows)
    if s is None:
        print("no cluster measured (every run failed, or local runs only)")
    else:
        print("examples/sec over %d clusters: median |error| %.1f%%, worst %.1f%%"
              % (s["clusters"], 100 * s["median_abs_error"], 100 * s["worst_abs_error"]))
    # The same with the machine's drift since each profile taken out (each result's local run as the machine's
    # speed): what is left is the model's own error. A diagnostic; the line above is the prediction.
    drifted = summary(evaluate(profiles, results, host_cpus, latency, shared, a.transport, burst, drift=True,
                               launch=a.launch))
    if drifted is not None:
        print("  (with the machine's drift since the profile taken out, each result's local run as its speed: "
              "median %.1f%%, worst %.1f%%)" % (100 * drifted["median_abs_error"], 100 * drifted["worst_abs_error"]))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"rows": rows, "summary": s, "summary_without_drift": drifted}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
