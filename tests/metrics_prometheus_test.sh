#!/usr/bin/env bash
# Live metrics (--metrics_port; docs/metrics.md) scraped by a real Prometheus server (Debian's prometheus): 1 ps + 2
# sync workers train the mlp on 127.0.0.1, each serving /metrics on a port of its own, and /usr/bin/prometheus
# (its own TSDB in a temporary directory, its own port) scrapes the three every second. Through Prometheus' query
# API (/api/v1/query) the test checks:
#   - every target is up, and each process's RSS is > 0;
#   - the ps counts 2 live workers, and its pushes counter increases from scrape to scrape;
#   - each worker's examples/sec, rate(dtrain_worker_examples_total[W]) evaluated at the time of one of its
#     progress lines, is within 5% of the rate its progress lines report over the same W seconds (the lines are
#     time-stamped as they arrive);
#   - the step-time histogram's parts are there and add up to no more than the steps' time;
#   - Prometheus accepts every query of the Grafana dashboard (deploy/grafana/dtrain.json);
# then stops the cluster (SIGTERM: the ps ends the run, the workers leave) and Prometheus. Bad flags and a port in
# use fail first, naming the flag. About 25 s on 2 cores. Needs Fashion-MNIST and prometheus (exit 77 without;
# a failure under DTRAIN_REQUIRE_DEPS=1).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BIN="${DTRAIN_BIN_DIR:-$ROOT/build/bin}"
source "$(dirname "$0")/skipping.sh"
for b in dtrain_ps dtrain_worker; do
  [ -x "$BIN/$b" ] || { echo "FAIL: $BIN/$b not built (set DTRAIN_BIN_DIR)"; exit 1; }
done
PROMETHEUS="${PROMETHEUS:-/usr/bin/prometheus}"
[ -x "$PROMETHEUS" ] || skip "$PROMETHEUS is missing (Debian's prometheus package: scripts/install_deps.sh)"
[ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] ||
  skip "dataset-fashion-mnist is not installed (scripts/install_deps.sh)"
source "$(dirname "$0")/checks.sh"
passed=0 failed=0
make_test_dir dtrain_metrics_test

# ---- bad flags and a port in use: one clear error naming the flag ----
refused() {  # refused RC EXPECTED_TEXT BINARY ARGS...: BINARY exits RC and says EXPECTED_TEXT
  local want_rc=$1 want=$2 bin=$3 rc=0; shift 3
  timeout 30 "$BIN/$bin" "$@" >"$dir/refused.out" 2>&1 || rc=$?
  [ "$rc" = "$want_rc" ] && grep -q -- "$want" "$dir/refused.out" || { echo "rc=$rc"; cat "$dir/refused.out"; return 1; }
}
check "worker: --metrics_port out of range refused" refused 2 "metrics_port=70000" dtrain_worker --job_name=local \
  --model=mlp --train_steps=1 --metrics_port=70000
check "ps: --metrics_bind_address not an IP refused" refused 2 "metrics_bind_address=localhost" dtrain_ps \
  --job_name=ps --task_index=0 --ps_hosts=127.0.0.1:1 --worker_hosts=127.0.0.1:2 --metrics_port=9 \
  --metrics_bind_address=localhost
IFS=, read -r -a ports < <(python3 "$ROOT/scripts/free_ports.py" 8)
# A port another process holds (a listening socket, held for at most 30 s).
python3 -c '
import socket, sys, time
s = socket.socket(); s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen(1); print("bound", flush=True); time.sleep(30)
' "${ports[7]}" >"$dir/holder.out" &
holder=$!
bg+=("$holder")
wait_for_line "$dir/holder.out" bound 10 || { echo "FAIL: could not hold a port"; exit 1; }
check "worker: a --metrics_port in use is one clear error" refused 1 \
  "metrics_port=${ports[7]}: cannot serve /metrics on 127.0.0.1:${ports[7]}" dtrain_worker --job_name=local \
  --model=mlp --train_steps=1 --metrics_port="${ports[7]}"
check "ps: a --metrics_port in use is one clear error" refused 1 \
  "metrics_port=${ports[7]}: cannot serve /metrics" dtrain_ps --job_name=ps --task_index=0 \
  --ps_hosts="127.0.0.1:${ports[0]}" --worker_hosts=127.0.0.1:2 --metrics_port="${ports[7]}"
kill "$holder" 2>/dev/null || true
wait "$holder" 2>/dev/null || true

# ---- the cluster, each process serving /metrics ----
cluster=(--ps_hosts="127.0.0.1:${ports[0]}" --worker_hosts="127.0.0.1:${ports[1]},127.0.0.1:${ports[2]}")
ps_metrics=${ports[3]} w_metrics=("${ports[4]}" "${ports[5]}") prom_port=${ports[6]}
"$BIN/dtrain_ps" --job_name=ps --task_index=0 "${cluster[@]}" --max_run_secs=120 --metrics_port="$ps_metrics" \
  >"$dir/ps.log" 2>&1 &
ps_pid=$!
bg+=("$ps_pid")
wait_for_line "$dir/ps.log" "listening on" 30 || { echo "FAIL: the ps did not start"; cat "$dir/ps.log"; exit 1; }
# Each progress line gets the time it arrived (seconds since the epoch, as Prometheus' timestamps).
stamp() { python3 -u -c '
import sys, time
for line in sys.stdin:
    sys.stdout.write("%.3f %s" % (time.time(), line)); sys.stdout.flush()'; }
for w in 0 1; do
  # Far more steps than the test waits for: the run is ended by SIGTERM once the checks are done. The worker
  # writes its pid first (the pipeline's pid is the stamper's).
  bash -c 'echo $$ >"$0"; exec "$@"' "$dir/w$w.pid" "$BIN/dtrain_worker" --job_name=worker --task_index=$w \
    "${cluster[@]}" --model=mlp --batch_size=100 --train_steps=1000000 --log_every=20 --eval_every=0 \
    --metrics_port="${w_metrics[$w]}" 2>"$dir/w$w.err" | stamp >"$dir/w$w.log" &
  bg+=($!)
done
for w in 0 1; do
  wait_for_line "$dir/w$w.pid" . 10 || { echo "FAIL: worker $w did not start"; exit 1; }
  bg+=("$(cat "$dir/w$w.pid")")
done
alive() { kill -0 "$1" 2>/dev/null; }

# ---- Prometheus scraping the three every second ----
cat >"$dir/prometheus.yml" <<EOF
global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: dtrain_ps
    static_configs:
      - targets: ['127.0.0.1:$ps_metrics']
        labels: {task: '0'}
  - job_name: dtrain_worker
    static_configs:
      - targets: ['127.0.0.1:${w_metrics[0]}']
        labels: {task: '0'}
      - targets: ['127.0.0.1:${w_metrics[1]}']
        labels: {task: '1'}
EOF
"$PROMETHEUS" --config.file="$dir/prometheus.yml" --storage.tsdb.path="$dir/tsdb" \
  --web.listen-address="127.0.0.1:$prom_port" --log.level=warn >"$dir/prometheus.log" 2>&1 &
prom_pid=$!
bg+=("$prom_pid")
API="http://127.0.0.1:$prom_port"
# The checks through the query API, in one python (each start costs a loaded machine a second):
#   promcheck wait             until Prometheus is ready and has scraped a step of every worker (60 s at most)
#   promcheck check FROM TO    the checks above; the examples/sec compared over the progress lines in (FROM, TO]
# Prints "ok: ..." / "FAIL: ..." lines; exits with the number of failures.
promcheck() {
  python3 - "$API" "$dir" "$@" <<'PY'
import json, re, sys, time, urllib.parse, urllib.request
api, d, what = sys.argv[1], sys.argv[2], sys.argv[3]

def query(expr, at=None):
    params = {"query": expr}
    if at is not None:
        params["time"] = "%.3f" % at
    with urllib.request.urlopen(api + "/api/v1/query?" + urllib.parse.urlencode(params), timeout=10) as r:
        body = json.load(r)
    if body.get("status") != "success":
        raise RuntimeError("query %s: %s" % (expr, body))
    return body["data"]["result"]

def value(expr, at=None):  # the single value of an instant query; None when it returned none
    r = query(expr, at)
    return float(r[0]["value"][1]) if len(r) == 1 else None

if what == "wait":
    deadline = time.time() + 60
    last = None
    while time.time() < deadline:
        try:
            if value("count(up == 1)") == 3 and value('count(dtrain_worker_steps_total > 0)') == 2:
                print("ok: prometheus scrapes all three processes, both workers training")
                sys.exit(0)
        except Exception as e:  # not ready yet
            last = e
        time.sleep(0.2)
    try:
        up = ", ".join("%s %s" % (r["metric"].get("instance"), r["value"][1]) for r in query("up"))
    except Exception as e:
        up = "no answer: %s" % e
    print("FAIL: prometheus did not scrape the three processes within 60 s (up: %s; last: %s)" % (up, last))
    sys.exit(1)

quiet_from, quiet_to = float(sys.argv[4]), float(sys.argv[5])
failures = 0
def check(name, ok, detail=""):
    global failures
    print(("ok: " if ok else "FAIL: ") + name + (" (" + detail + ")" if detail else ""))
    failures += 0 if ok else 1

check("every process is up", value('count(up{job=~"dtrain_ps|dtrain_worker"} == 1)') == 3)
check("every process reports its RSS > 0", value("count(process_resident_memory_bytes > 0)") == 3)
check("the ps counts 2 live workers", value('dtrain_ps_workers{state="live"}') == 2)
check("the ps counts no lost worker", value('dtrain_ps_workers{state="lost"}') == 0)
pushes = [float(v) for _, v in query("dtrain_ps_pushes_received_total[10s]")[0]["values"]]
check("the ps's pushes counter increases from scrape to scrape",
      len(pushes) >= 5 and all(b >= a for a, b in zip(pushes, pushes[1:])) and pushes[-1] > pushes[0],
      "last 10 s: %s" % pushes)
# The ps's own count of the bytes its shared-memory server read from and wrote to the workers' memory against the
# workers' counts of the same data (both tensor values at their wire size), as rates over the same 10 s.
for ps_dir, w_dir, what in (("in", "out", "pushed"), ("out", "in", "pulled")):
    ps_rate = value('rate(dtrain_ps_transport_bytes_total{transport="shm",direction="%s"}[10s])' % ps_dir)
    w_rate = value('sum(rate(dtrain_worker_transport_bytes_total{transport="shm",direction="%s"}[10s]))' % w_dir)
    check("the ps's shared-memory bytes %s match the workers' (rates over 10 s within 5%%)" % what,
          ps_rate is not None and w_rate is not None and w_rate > 0 and abs(ps_rate / w_rate - 1) <= 0.05,
          "ps %s B/s, workers %s B/s" % (ps_rate, w_rate))
for w in ("0", "1"):
    parts = value('sum(dtrain_worker_step_part_seconds_sum{part!="input_wait",task="%s"})' % w)
    steps = value('dtrain_worker_step_seconds_sum{task="%s"}' % w)
    check("worker %s: the steps' parts add up to at most the steps' time" % w,
          parts is not None and steps is not None and 0.8 * steps <= parts <= 1.001 * steps + 0.01,
          "parts %s s, steps %s s" % (parts, steps))

# examples/sec: Prometheus' rate() over the window between two progress lines of the quiet seconds (nothing else
# ran on the machine meanwhile), against what the lines in that window report. Each line reports the rate of its
# own window (--log_every=20 steps of --batch_size=100 examples, since the line before), so together the lines
# after the first cover exactly (first line, last line]: their examples over the sum of their windows' seconds.
for w in ("0", "1"):
    lines = []
    for line in open("%s/w%s.log" % (d, w)):
        m = re.match(r"([0-9.]+) step \d+, loss = \S+ \(([0-9.]+) examples/sec;", line)
        if m and quiet_from < float(m.group(1)) <= quiet_to and float(m.group(2)) > 0:
            lines.append((float(m.group(1)), float(m.group(2))))
    if len(lines) < 6:
        check("worker %s: enough progress lines in the quiet window" % w, False, "%d" % len(lines))
        continue
    t_start, t_end = lines[0][0], lines[-1][0]
    seconds = sum(20 * 100 / r for _, r in lines[1:])
    logs = 20 * 100 * (len(lines) - 1) / seconds
    prom = value('rate(dtrain_worker_examples_total{task="%s"}[%dms])' % (w, round(1000 * (t_end - t_start))), t_end)
    diff = abs(prom - logs) / logs if prom is not None else 1
    check("worker %s: Prometheus' examples/sec within 5%% of its logs" % w, diff <= 0.05,
          "rate() over %.1f s: %.1f; its %d progress lines: %.1f over %.1f s; %.1f%% apart"
          % (t_end - t_start, prom or 0, len(lines) - 1, logs, seconds, 100 * diff))
# The Grafana dashboard (deploy/grafana/dtrain.json): Prometheus accepts every query of it, and those about what this
# cluster has (no tables, checkpoints, deltas or TCP lanes here) return series.
dashboard = json.load(open(sys.argv[6]))
exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
empty, bad = [], []
for e in exprs:
    q = e.replace("$__rate_interval", "5s").replace("$job", ".*").replace("$ps0", ".*")
    try:
        if not query(q):
            empty.append(e)
    except Exception as ex:
        bad.append("%s: %s" % (e, ex))
optional = ("sparse", "checkpoint_age", "delta_age")
missing = [e for e in empty if not any(o in e for o in optional)]
check("Prometheus accepts the dashboard's %d queries" % len(exprs), not bad, "; ".join(bad))
check("the dashboard's queries about this cluster return series", not missing, "empty: %s" % missing)
sys.exit(failures)
PY
}
count_checks() {  # adds promcheck's ok/FAIL lines (on stdin) to passed/failed
  local out
  out=$(cat)
  echo "$out"
  passed=$((passed + $(grep -c '^ok: ' <<<"$out" || true)))
  failed=$((failed + $(grep -c '^FAIL: ' <<<"$out" || true)))
}
count_checks < <(promcheck wait || true)
[ "$failed" = 0 ] || { tail -n 5 "$dir/prometheus.log" "$dir/ps.log" "$dir/w0.err" "$dir/w1.err"; exit 1; }
# 12 quiet seconds of training and scraping (the comparison of rates reads this window).
quiet_from=$(date +%s.%N)
sleep 12
quiet_to=$(date +%s.%N)
count_checks < <(promcheck check "$quiet_from" "$quiet_to" "$ROOT/deploy/grafana/dtrain.json" || true)

# ---- stop: SIGTERM ends the run (the ps ends it, the workers leave), then Prometheus ----
w0=$(cat "$dir/w0.pid") w1=$(cat "$dir/w1.pid")
kill -TERM "$w0" "$w1" "$ps_pid" 2>/dev/null || true
stopped() {
  for _ in $(seq 400); do
    alive "$ps_pid" || alive "$w0" || alive "$w1" || return 0
    sleep 0.1
  done
  return 1
}
check "the cluster stops within 40 s of SIGTERM" stopped
kill -TERM "$prom_pid" 2>/dev/null || true
for _ in $(seq 100); do kill -0 "$prom_pid" 2>/dev/null || break; sleep 0.1; done
check "prometheus stops" bash -c "! kill -0 $prom_pid 2>/dev/null"
echo "passed=$passed failed=$failed"
[ "$failed" = 0 ]
