#!/usr/bin/env bash
# What live metrics cost a training run: 1 ps + 1 sync worker on 127.0.0.1, the same run with --metrics_port on
# both and a real Prometheus (Debian's prometheus) scraping them every second (B), against --metrics_port=0 (A),
# interleaved A B A B ... Prints each run's examples/sec (the worker's own final line: training only) and the CPU
# seconds the ps and the worker took per 1000 steps (user + system, whole processes: start-up and the exporter
# included; less sensitive than the rate to other load on a shared machine), their medians, and B/A.
# docs/metrics.md has the figures.
#
# Usage: scripts/bench_metrics_cost.sh [PAIRS=3] [MODEL=mlp] [STEPS=1500]
#   Prefix with `taskset -c 0` to pin everything (the cluster and Prometheus) to one CPU.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BIN="${DTRAIN_BIN_DIR:-$ROOT/build/bin}"
PAIRS="${1:-3}" MODEL="${2:-mlp}" STEPS="${3:-1500}"
PROMETHEUS="${PROMETHEUS:-/usr/bin/prometheus}"
[ -x "$PROMETHEUS" ] || { echo "$PROMETHEUS is missing (scripts/install_deps.sh)"; exit 1; }
dir="$(mktemp -d /tmp/dtrain_metrics_cost.XXXXXX)"
pids=()
cleanup() { for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done; rm -rf "$dir"; }
trap cleanup EXIT

run() {  # run on|off N: one run; prints its examples/sec
  local metrics=$1 n=$2
  IFS=, read -r -a p < <(python3 "$ROOT/scripts/free_ports.py" 5)
  local cluster=(--ps_hosts="127.0.0.1:${p[0]}" --worker_hosts="127.0.0.1:${p[1]}")
  local mps=0 mw=0 prom=""
  if [ "$metrics" = on ]; then
    mps=${p[2]} mw=${p[3]}
    cat >"$dir/prometheus.yml" <<EOF
global: {scrape_interval: 1s, scrape_timeout: 1s}
scrape_configs:
  - job_name: dtrain
    static_configs: [{targets: ['127.0.0.1:$mps', '127.0.0.1:$mw']}]
EOF
    rm -rf "$dir/tsdb"
    "$PROMETHEUS" --config.file="$dir/prometheus.yml" --storage.tsdb.path="$dir/tsdb" \
      --web.listen-address="127.0.0.1:${p[4]}" --log.level=warn >"$dir/prometheus.log" 2>&1 &
    prom=$!
    pids+=("$prom")
    for _ in $(seq 300); do curl -sf --max-time 2 "127.0.0.1:${p[4]}/-/ready" >/dev/null 2>&1 && break; sleep 0.1; done
  fi
  /usr/bin/time -f "%U %S" -o "$dir/ps.cpu" "$BIN/dtrain_ps" --job_name=ps --task_index=0 "${cluster[@]}" \
    --max_run_secs=600 --metrics_port="$mps" >"$dir/ps.log" 2>&1 &
  local ps=$!
  pids+=("$ps")
  /usr/bin/time -f "%U %S" -o "$dir/w.cpu" "$BIN/dtrain_worker" --job_name=worker --task_index=0 "${cluster[@]}" \
    --model="$MODEL" --train_steps="$STEPS" --log_every=100 --eval_every=0 --metrics_port="$mw" >"$dir/w.log" 2>&1
  wait "$ps"
  local scrapes=""
  if [ -n "$prom" ]; then
    scrapes=$(curl -sg --max-time 5 "127.0.0.1:${p[4]}/api/v1/query" --data-urlencode "query=sum(count_over_time(up[10m]))" |
      python3 -c 'import json, sys; r = json.load(sys.stdin)["data"]["result"]; print(r[0]["value"][1] if r else 0)')
    kill "$prom"; wait "$prom" 2>/dev/null || true
  fi
  local rate
  rate=$(sed -n 's/^worker 0: .* examples in .* sec (\([0-9.]*\) examples\/sec)$/\1/p' "$dir/w.log")
  [ -n "$rate" ] || { echo "run failed:"; tail -5 "$dir/w.log"; exit 1; }
  local cpu
  cpu=$(cat "$dir/ps.cpu" "$dir/w.cpu" | awk -v steps="$STEPS" '{c += $1 + $2} END {printf "%.3f", 1000 * c / steps}')
  echo "$n metrics=$metrics examples/sec=$rate cpu_s_per_1000_steps=$cpu${scrapes:+ scrapes=$scrapes}" >&2
  echo "$rate $cpu"
}

a=() b=()
for i in $(seq "$PAIRS"); do
  a+=("$(run off "A$i")")
  b+=("$(run on "B$i")")
done
python3 - "$MODEL" "$STEPS" "${a[@]}" -- "${b[@]}" <<'PY'
import statistics, sys
model, steps, rest = sys.argv[1], sys.argv[2], sys.argv[3:]
cut = rest.index("--")
a = [tuple(map(float, x.split())) for x in rest[:cut]]
b = [tuple(map(float, x.split())) for x in rest[cut + 1:]]
for i, name in ((0, "examples/sec"), (1, "CPU s per 1000 steps (ps + worker)")):
    ma, mb = statistics.median(x[i] for x in a), statistics.median(x[i] for x in b)
    print("%s x %s steps, 1 ps + 1 worker, %s: A (--metrics_port=0) %s median %.2f; B (scraped every 1 s) %s "
          "median %.2f; B/A %.3f" % (model, steps, name, [x[i] for x in a], ma, [x[i] for x in b], mb, mb / ma))
PY
