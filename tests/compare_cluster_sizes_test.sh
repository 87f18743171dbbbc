#!/usr/bin/env bash
# scripts/compare_cluster_sizes.sh end to end on a small MLP run: local, sync and async with 1 and 2 workers on
# 127.0.0.1; the table's CSV and JSON have every configuration, scaling efficiency = examples/sec /
# (workers x local examples/sec), seconds to the target accuracy, and the picture beside the table is a valid PNG (matplotlib is part of
# install_deps.sh's default set; a picture that cannot be drawn fails the tool).
# dlrm on synthetic click-through-rate data (2 ps tasks, sync, 1 and 2 workers): AUC, log loss, rows held and
# bytes per step in every row, the data and shape flags passed to every worker. --ddp: PyTorch and DDP rows.
# The wall-clock's parts: the workers' phases lines (and, before the workers print them, the "local steps" line
# alone) parsed from made-up logs. As root with network namespaces: the same across namespaces with 1 Gbit/s links
# (--netns --bandwidth), leaving no namespace behind; and with --host_cpus --latency --ddp: local, PyTorch, a sync
# cluster and DDP each on emulated hosts of half a core, the settings in the title and JSON, DDP's parts adding
# up to its wall-clock. --schedule: an elastic job of 1, 2, 1 workers beside the fixed runs (the size table with the
# ratios, the join's latency, the plot). Bad flags (bad schedules among them) exit 2.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
export DTRAIN_BIN="${DTRAIN_BIN_DIR:-$ROOT/build/bin}"
CMP="$ROOT/scripts/compare_cluster_sizes.sh"
dir="$(mktemp -d /tmp/dtrain_compare_test.XXXXXX)"
trap 'rm -rf "$dir"' EXIT
export TMPDIR="$dir"  # the tool keeps its logs in a temp dir: inside ours
# Its emulated hosts' names: ours alone, so that other runs' namespaces are not taken for ours.
export DTRAIN_COMPARE_NETNS_PREFIX="dtcmpt$$"
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# check_table PREFIX ROWS: the CSV/JSON at PREFIX are consistent and complete.
check_table() {
  /usr/bin/python3 - "$1" "$2" <<'PY' || fail "table $1"
import csv, json, sys
prefix, want = sys.argv[1], int(sys.argv[2])
rows = json.load(open(prefix + ".json"))["rows"]
assert len(rows) == want, "%d rows, want %d" % (len(rows), want)
assert len(list(csv.DictReader(open(prefix + ".csv")))) == want, "CSV rows"
local = rows[0]
assert local["configuration"] == "local" and local["examples_per_sec"] > 0, local
for r in rows[1:]:
    assert r["exit_code"] == 0, r
    assert r["examples_per_sec"] > 0 and r["examples"] > 0, r
    eff = r["examples_per_sec"] / (r["workers"] * local["examples_per_sec"])
    assert abs(r["scaling_efficiency"] - eff) < 2e-3, (r["scaling_efficiency"], eff)
    assert r["secs_to_target_accuracy"] is not None and 0 < r["secs_to_target_accuracy"] <= r["wall_secs"], r
    assert 0.3 < r["final_accuracy"] <= 1, r  # far above chance (0.1) after a few dozen steps
print("table %s: %d rows consistent" % (prefix, want))
PY
}

# check_picture FILE: a PNG or SVG is there (scripts/plotting.py's check).
check_picture() {
  PYTHONPATH="$ROOT/scripts" /usr/bin/python3 -c 'import plotting, sys; sys.exit(0 if plotting.is_picture(sys.argv[1]) else 1)' \
    "$1" || fail "no valid picture at $1"
}

rc=0
"$CMP" --model=mlp --examples=4000 --sizes=1,2 --target_accuracy=0.4 --eval_every=10 --out="$dir/local" \
  >"$dir/local.out" 2>&1 || rc=$?
cat "$dir/local.out"
[ "$rc" = 0 ] || fail "compare exited $rc"
grep -q "^async, 1 ps, 2 workers .*%" "$dir/local.out" || fail "no async 2-worker row with a scaling column"
check_table "$dir/local" 5
# --predict: the planner's prediction beside every cluster row, from the profile of a local run of its own.
rc=0
"$CMP" --model=mlp --examples=4000 --sizes=2 --modes=sync --predict --profile_out="$dir/mlp.profile.json" \
  --out="$dir/predict" >"$dir/predict.out" 2>&1 || rc=$?
tail -n 5 "$dir/predict.out"
[ "$rc" = 0 ] || fail "compare --predict exited $rc"
grep -q "the planner's prediction (scripts/plan_cluster.py, from the local run's profile" "$dir/predict.out" ||
  fail "no prediction summary"
/usr/bin/python3 - "$dir/predict.json" "$dir/mlp.profile.json" <<'PY' || fail "predict table"
import json, sys
doc = json.load(open(sys.argv[1]))
assert doc["settings"]["profile"] == sys.argv[2], doc["settings"]
assert json.load(open(sys.argv[2]))["format"] == "dtrain-profile"
local, sync = doc["rows"]
assert local["predicted_examples_per_sec"] is None, local
assert sync["predicted_examples_per_sec"] > 0 and sync["predicted_bound"], sync
assert abs(sync["prediction_error"] - (sync["predicted_examples_per_sec"] / sync["examples_per_sec"] - 1)) < 1e-3, sync
print("predict table: %.1f predicted against %.1f measured" % (sync["predicted_examples_per_sec"],
                                                               sync["examples_per_sec"]))
PY
check_picture "$dir/local.png"
check_picture "$dir/predict.png"

# dlrm: the same table with AUC for accuracy, plus log loss, rows held and bytes per step.
"$DTRAIN_BIN/dtrain_convert" --synthetic_ctr --examples=4000 --test_examples=1000 --out="$dir/ctr" >/dev/null ||
  fail "dtrain_convert --synthetic_ctr"
rc=0
"$CMP" --model=dlrm --data_dir="$dir/ctr" --data_format=criteo --table_rows=2000 --embedding_dim=8 --batch_size=64 \
  --examples=8000 --sizes=1,2 --modes=sync --num_ps=2 --target_accuracy=0.55 --eval_every=10 --out="$dir/dlrm" \
  >"$dir/dlrm.out" 2>&1 || rc=$?
cat "$dir/dlrm.out"
[ "$rc" = 0 ] || fail "compare --model=dlrm exited $rc"
grep -q "t_auc>=0.55 *AUC log_loss *rows *bytes/step" "$dir/dlrm.out" || fail "no AUC, log_loss, rows, bytes/step columns"
/usr/bin/python3 - "$dir/dlrm" <<'PY' || fail "dlrm table"
import csv, json, sys
doc = json.load(open(sys.argv[1] + ".json"))
rows = doc["rows"]
assert [r["configuration"] for r in rows] == ["local", "sync, 2 ps, 1 worker", "sync, 2 ps, 2 workers"], rows
assert "--table_rows=2000" in doc["settings"]["worker_args"], doc["settings"]
assert len(list(csv.DictReader(open(sys.argv[1] + ".csv")))) == 3, "CSV rows"
for r in rows:
    assert r["exit_code"] == 0 and r["examples_per_sec"] > 0, r
    assert 0.55 < r["final_accuracy"] <= 1, r  # the AUC: above chance on the planted signal
    assert 0 < r["final_log_loss"] < 0.69, r
    # 26 tables of 2000 rows with --embedding_dim=8 (a fixed-size table holds the rows it was asked for).
    assert 26 <= r["rows_held"] <= 26 * 2000, r
    assert r["bytes_per_step"] > 0 and r["secs_to_target_accuracy"] is not None, r
local, one, two = rows
# One sync worker is local mode over the wire: the same batches, the same model, the same rows and bytes.
assert one["final_accuracy"] == local["final_accuracy"] and one["rows_held"] == local["rows_held"], (one, local)
assert one["bytes_per_step"] == local["bytes_per_step"], (one, local)
# Two workers push and pull twice the rows and parameters a step.
assert 1.6 < two["bytes_per_step"] / one["bytes_per_step"] < 2.2, (two, one)
print("dlrm table: 3 rows consistent")
PY

# --ddp: PyTorch in one process and DDP (gloo) over 2 ranks in the same run (scripts/ddp_baseline.py), with
# dtrain's malloc settings and on the OpenMP OpenBLAS; both rows measured, the "vs DDP" figures present.
if /usr/bin/python3 -c "import torch" 2>/dev/null; then
  rc=0
  "$CMP" --model=mlp --examples=4000 --sizes=2 --modes=sync --ddp --out="$dir/ddp" >"$dir/ddp.out" 2>&1 || rc=$?
  cat "$dir/ddp.out"
  [ "$rc" = 0 ] || fail "compare --ddp exited $rc"
  /usr/bin/python3 - "$dir/ddp" <<'PY' || fail "ddp table"
import json, sys
rows = {r["configuration"]: r for r in json.load(open(sys.argv[1] + ".json"))["rows"]}
for name in ("pytorch, 1 process", "ddp (gloo), 2 ranks"):
    assert name in rows, (name, sorted(rows))
    assert rows[name]["exit_code"] == 0 and rows[name]["examples_per_sec"] > 0, rows[name]
print("ddp table: PyTorch and DDP rows measured")
PY
elif [ "${DTRAIN_REQUIRE_DEPS:-0}" = 1 ]; then
  fail "/usr/bin/python3 cannot import torch (DTRAIN_REQUIRE_DEPS=1; scripts/install_deps.sh installs it)"
else
  echo "skipped: the --ddp part (/usr/bin/python3 cannot import torch)"
fi

# The phases lines: start = the largest start, train = until the last worker's last step, evaluate = the chief's;
# without them, train from "N local steps ... in T sec" and the rest unknown.
mkdir -p "$dir/phases/new" "$dir/phases/old"
cat >"$dir/phases/new/worker_0.log" <<'LOG'
worker 0: 10 local steps, 1000 examples in 2.00 sec (500.0 examples/sec)
worker 0: phases: start 1.500 s, train 2.000 s, evaluate 0.700 s
LOG
cat >"$dir/phases/new/worker_1.log" <<'LOG'
worker 1: 10 local steps, 1000 examples in 2.20 sec (454.5 examples/sec)
worker 1: phases: start 1.000 s, train 2.200 s, evaluate 0.000 s
LOG
head -n 1 "$dir/phases/new/worker_0.log" >"$dir/phases/old/worker_0.log"
/usr/bin/python3 - "$ROOT/scripts" "$dir/phases" <<'PY' || fail "phases parsing"
import sys
sys.path.insert(0, sys.argv[1])
import compare_cluster_sizes as c
new = c.parse_logs(sys.argv[2] + "/new", ["worker_0.log", "worker_1.log"], None)
assert new["phases"] == {"start": 1.5, "train": 2.0, "evaluate": 0.7}, new["phases"]
assert new["examples"] == 2000 and new["secs"] == 2.2, new
parts = c.wall_parts(5.0, new["phases"])
assert parts == {"start_secs": 1.5, "train_secs": 2.0, "evaluate_secs": 0.7, "end_secs": 0.8}, parts
old = c.parse_logs(sys.argv[2] + "/old", ["worker_0.log"], None)
assert old["phases"] == {"start": None, "train": 2.0, "evaluate": None}, old["phases"]
assert c.wall_parts(5.0, old["phases"])["end_secs"] is None
print("phases: parsed, and without them train alone")
PY

# --schedule: one elastic mlp job of 1, then 2, then 1 worker (worker 1 joins at 6 s and gets SIGTERM at 12 s, the
# chief at 18 s) beside fixed runs of 1 and 2 workers: the size table with both rates and their ratio, the join's
# latency, the leave, the membership the chief logged, the windows, the plot.
rc=0
"$CMP" --model=mlp --examples=4000 --schedule=0:1,6:2,12:1 --window_secs=1 --out="$dir/sched" \
  >"$dir/sched.out" 2>&1 || rc=$?
tail -n 12 "$dir/sched.out"
[ "$rc" = 0 ] || fail "compare --schedule exited $rc"
grep -q "^join: worker 1 launched at .*its first step done after [0-9.]* s" "$dir/sched.out" || fail "no join line"
/usr/bin/python3 - "$dir/sched" <<'PY' || fail "schedule table"
import csv, json, sys
doc = json.load(open(sys.argv[1] + ".json"))
assert doc["settings"]["schedule"] == "0:1,6:2,12:1", doc["settings"]
assert [r["configuration"] for r in doc["rows"]] == ["local", "sync, 1 ps, 1 worker", "sync, 1 ps, 2 workers"]
e = doc["elastic"]
assert e["exit_code"] == 0 and e["max_workers"] == 2, e["exit_codes"]
assert [c["workers"] for c in e["changes"]] == [1, 2, 1], e["changes"]
assert [s["workers"] for s in e["sizes"]] == [1, 2], e["sizes"]
for s in e["sizes"]:
    assert s["fixed_examples_per_sec"] > 0 and s["elastic_examples_per_sec"] > 0 and s["windows"] >= 1, s
    assert abs(s["ratio"] - s["elastic_examples_per_sec"] / s["fixed_examples_per_sec"]) < 2e-3, s
(join,) = e["joins"]
assert join["task"] == 1 and 5.5 < join["launched"] < 8, join
assert 0 < join["joined_secs"] < 6 and 0 < join["first_step_secs"] < 6, join  # in before its SIGTERM at 12 s
(leave,) = e["leaves"]
assert leave["task"] == 1 and leave["left_secs"] is not None and 0 <= leave["left_secs"] < 5, leave
assert 17 < e["t_stop"] < 25 and len(e["windows"]) == int(e["t_stop"]), e["t_stop"]
assert sum(w["examples_per_sec"] > 0 for w in e["windows"]) >= len(e["windows"]) - 3, e["windows"]
assert len(list(csv.DictReader(open(sys.argv[1] + ".elastic.csv")))) == 2, "elastic CSV rows"
print("schedule table: sizes 1 and 2 at %s of their fixed runs, join %.2f s" %
      (" and ".join("%.2fx" % s["ratio"] for s in e["sizes"]), join["first_step_secs"]))
PY
check_picture "$dir/sched.png"
for bad in "0:1,6:2,6:1" "0:1,6:0" "0:1,6" "3:1,6:2"; do
  rc=0; "$CMP" --schedule="$bad" >"$dir/bad_sched.out" 2>&1 || rc=$?
  [ "$rc" = 2 ] && grep -q -- "--schedule" "$dir/bad_sched.out" || fail "--schedule=$bad not refused naming the flag"
done
rc=0; "$CMP" --schedule=0:1,6:2 --sizes=1,2 >"$dir/bad_sched.out" 2>&1 || rc=$?
[ "$rc" = 2 ] && grep -q "leave --sizes out" "$dir/bad_sched.out" || fail "--schedule with --sizes not refused"

rc=0; "$CMP" --bandwidth=1gbit >"$dir/bad.out" 2>&1 || rc=$?
[ "$rc" = 2 ] && grep -q "bandwidth needs --netns" "$dir/bad.out" || fail "--bandwidth without --netns not refused"
rc=0; "$CMP" --sizes=0 >"$dir/bad2.out" 2>&1 || rc=$?
[ "$rc" = 2 ] && grep -q "positive worker counts" "$dir/bad2.out" || fail "--sizes=0 not refused"
rc=0; "$CMP" --host_cpus=0.5 >"$dir/bad3.out" 2>&1 || rc=$?
[ "$rc" = 2 ] && grep -q "host_cpus needs --netns" "$dir/bad3.out" || fail "--host_cpus without --netns not refused"
rc=0; "$CMP" --netns --latency=-1 >"$dir/bad4.out" 2>&1 || rc=$?
[ "$rc" = 2 ] && grep -q "latency must be 0..10000 ms" "$dir/bad4.out" || fail "--latency=-1 not refused"
rc=0; "$CMP" --colocate_ps >"$dir/bad6.out" 2>&1 || rc=$?
[ "$rc" = 2 ] && grep -q "colocate_ps needs --netns" "$dir/bad6.out" || fail "--colocate_ps without --netns not refused"
rc=0; "$CMP" --netns --host_cpus=0 >"$dir/bad5.out" 2>&1 || rc=$?
[ "$rc" = 2 ] && grep -q "host_cpus must be at least 0.01" "$dir/bad5.out" || fail "--host_cpus=0 not refused"

if why="$("$ROOT/scripts/netns_hosts.sh" check)"; then
  rc=0
  # The ps tasks colocated with the workers (--colocate_ps): a worker reaches its own host's task through shared
  # memory and the other's over TCP lanes.
  "$CMP" --netns --colocate_ps --bandwidth=1gbit --model=mlp --examples=4000 --sizes=2 --modes=async \
    --target_accuracy=0.4 --eval_every=10 --out="$dir/netns" >"$dir/netns.out" 2>&1 || rc=$?
  cat "$dir/netns.out"
  [ "$rc" = 0 ] || fail "compare --netns exited $rc"
  grep -q "clusters on network namespaces, links capped at 1gbit" "$dir/netns.out" || fail "netns run not announced"
  grep -q "^async, 2 ps colocated, 2 workers " "$dir/netns.out" || fail "no colocated row"
  check_table "$dir/netns" 2
  logs="$(sed -n 's/.*(logs: \(.*\))$/\1/p' "$dir/netns.out")"
  for k in 0 1; do
    grep -q "data through shared memory" "$logs/async_2.0/worker_$k.log" &&
      grep -q "data over TCP lanes" "$logs/async_2.0/worker_$k.log" ||
      fail "colocated worker $k did not reach its own ps task by shared memory and the other's over TCP"
  done
  # A failing worker must not leave the tool waiting for the ps (which would wait for the worker forever).
  start=$SECONDS; rc=0
  "$CMP" --netns --model=mlp --examples=1000 --sizes=1 --modes=sync --timeout_secs=300 -- --optimizer=bogus \
    >"$dir/netns_fail.out" 2>&1 || rc=$?
  tail -n 4 "$dir/netns_fail.out"
  [ "$rc" = 1 ] && grep -q "^sync, 1 ps, 1 worker .*FAILED" "$dir/netns_fail.out" || fail "failing netns run: exit $rc"
  [ $((SECONDS - start)) -lt 120 ] || fail "failing netns run took $((SECONDS - start)) s"
  if ip netns list | grep -q "^$DTRAIN_COMPARE_NETNS_PREFIX-"; then
    fail "namespaces left behind: $(ip netns list | grep "^$DTRAIN_COMPARE_NETNS_PREFIX-" | xargs)"
  fi
  # Equal hosts of half a core with 1 ms each way: local mode, a sync cluster of 2 workers (3 hosts) and, with
  # PyTorch, plain PyTorch and DDP with one rank per host.
  ddp=()
  if /usr/bin/python3 -c "import torch" 2>/dev/null; then ddp=(--ddp); fi
  rc=0
  "$CMP" --netns --host_cpus=0.5 --latency=1 --bandwidth=1gbit "${ddp[@]}" --model=mlp --examples=4000 --sizes=2 \
    --modes=sync --out="$dir/hosts" >"$dir/hosts.out" 2>&1 || rc=$?
  cat "$dir/hosts.out"
  [ "$rc" = 0 ] || fail "compare --netns --host_cpus --latency exited $rc"
  grep -q "1 ms latency each way, hosts of 0.5 cores each" "$dir/hosts.out" ||
    fail "the hosts' settings are not in the title"
  /usr/bin/python3 - "$dir/hosts" "${#ddp[@]}" <<'PY' || fail "hosts table"
import json, sys
doc = json.load(open(sys.argv[1] + ".json"))
st = doc["settings"]
assert st["host_cpus"] == 0.5 and st["latency_ms"] == 1, st
assert "host_cpus=0.5" in st["emulated_hosts"] and "latency_ms=1" in st["emulated_hosts"], st
rows = {r["configuration"]: r for r in doc["rows"]}
want = ["local", "sync, 1 ps, 2 workers"]
if sys.argv[2] == "1":
    want += ["pytorch, 1 process", "ddp (gloo), 2 ranks"]
for name in want:
    r = rows[name]
    assert r["exit_code"] == 0 and r["examples_per_sec"] > 0 and r["train_secs"] > 0, r
    if r["start_secs"] is not None:  # the parts add up to the wall-clock
        total = r["start_secs"] + r["train_secs"] + r["evaluate_secs"] + r["end_secs"]
        assert abs(total - r["wall_secs"]) < 0.02 and r["start_secs"] > 0, r
    if r["system"] == "pytorch":
        assert r["start_secs"] is not None and r["evaluate_secs"] > 0, r  # ddp_baseline --evaluate's phases
        assert 0.3 < r["final_accuracy"] <= 1, r
print("hosts table: %d rows on emulated hosts of half a core" % len(want))
PY
  if ip netns list | grep -q "^$DTRAIN_COMPARE_NETNS_PREFIX-"; then
    fail "namespaces left behind: $(ip netns list | grep "^$DTRAIN_COMPARE_NETNS_PREFIX-" | xargs)"
  fi
else
  echo "skipped: the --netns part ($why)"
fi
if [ "$failures" = 0 ]; then echo "1 passed, 0 failed"; exit 0; fi
echo "0 passed, 1 failed"; exit 1
