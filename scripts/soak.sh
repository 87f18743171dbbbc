#!/usr/bin/env bash
# Soak: 1 ps + 4 async workers on 127.0.0.1 train the MLP for N minutes (checkpoints every 30 s, the chief
# evaluating every 2000 steps) while the resident memory (VmRSS from /proc) of every process is sampled every
# few seconds. After a warm-up (the first 20% of the time, at least one minute) memory must stay flat: the
# script prints, per process, the mean RSS of the first window after the warm-up and of the last (a minute each by
# default, --window; means:
# one sample moves with the messages in flight at that moment, a few MiB), the peak and the growth between the
# two means, and exits 1 if any process grew by 5% or more (or died). The processes are stopped at the end
# (training has no time limit of its own: train_steps is set beyond reach).
# Also checked, the same windows: every process's thread count (it must not grow by more than 4: gRPC's pools
# breathe a little), and the global step rate (the chief's progress lines): the last window's at least
# --min_rate_ratio percent of the first window's after the warm-up. With --faults=S, every S seconds one of the
# workers 1-3 is killed with SIGKILL and started again at once (the chaos test's worker faults), and at the end
# scripts/check_updates.py proves from the journals (--journal_applied, --push_journal_dir) that no acknowledged
# push was lost or applied twice. The ps's malloc heap (its /metrics' dtrain_heap_bytes: bytes in use and held by
# the allocator) is sampled too and printed for the same windows, to tell memory the program keeps from the
# allocator's fragmentation when the ps grows.
# Usage: scripts/soak.sh [--minutes=N] [--interval=SECONDS] [--max_growth=PERCENT] [--min_rate_ratio=PERCENT]
#                        [--faults=SECONDS] [--cpus=LIST] [--window=SECONDS] [--checkpoint_secs=SECONDS]
#                        (default 10, 5, 5, 95, 0: no faults, all CPUs, 60, 30; --checkpoint_secs=0: none)
#   2-hour soak with faults: scripts/soak.sh --minutes=120 --faults=60 --window=600
# --cpus=LIST runs every process of the soak on those CPUs only (taskset -c LIST), so that other work on the
# machine can be kept off them (e.g. taskset -c 0 for the other work, --cpus=1 here) and the step rate stays a
# measure of the soak alone. --window=SECONDS: the length of the two windows compared (the first after the
# warm-up, the last), one minute by default; with faults, a window of several minutes holds several of them and
# their restarts, so that one fault more or less in a window does not decide the rate check (e.g. 600 for 2 hours).
# The whole script is one brace group, read before any of it runs: a soak lasts hours, and bash reads a script
# as it goes, so an edit of this file during a run would otherwise be read from the old offset when the loop ends.
{
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BIN="${DTRAIN_BIN_DIR:-$ROOT/build/bin}"
minutes=10
interval=5
max_growth=5
min_rate_ratio=95
faults=0
cpus=""
window=60
checkpoint_secs=30
for a in "$@"; do
  case "$a" in
    --minutes=*) minutes="${a#*=}" ;;
    --interval=*) interval="${a#*=}" ;;
    --max_growth=*) max_growth="${a#*=}" ;;
    --min_rate_ratio=*) min_rate_ratio="${a#*=}" ;;
    --faults=*) faults="${a#*=}" ;;
    --cpus=*) cpus="${a#*=}" ;;
    --window=*) window="${a#*=}" ;;
    --checkpoint_secs=*) checkpoint_secs="${a#*=}" ;;
    *) echo "usage: $0 [--minutes=N] [--interval=SECONDS] [--max_growth=PERCENT] [--min_rate_ratio=PERCENT]" \
            "[--faults=SECONDS] [--cpus=LIST] [--window=SECONDS] [--checkpoint_secs=SECONDS]" >&2; exit 2 ;;
  esac
done
[[ "$checkpoint_secs" =~ ^[0-9]+$ ]] ||
  { echo "soak: --checkpoint_secs=$checkpoint_secs: expected a whole number of seconds (0: no checkpoints)" >&2; exit 2; }
[[ "$faults" =~ ^[0-9]+$ ]] || { echo "soak: --faults=$faults: expected a whole number of seconds (0: none)" >&2; exit 2; }
pin=()
if [ -n "$cpus" ]; then
  command -v taskset > /dev/null || { echo "soak: --cpus needs taskset (util-linux)" >&2; exit 2; }
  taskset -c "$cpus" true 2> /dev/null || { echo "soak: --cpus=$cpus: not a CPU list this machine has" >&2; exit 2; }
  pin=(taskset -c "$cpus")
fi
for v in minutes interval max_growth min_rate_ratio window; do
  [[ "${!v}" =~ ^[1-9][0-9]*$ ]] || { echo "soak: --$v=${!v}: expected a whole number > 0" >&2; exit 2; }
done
[ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] ||
  { echo "soak: dataset-fashion-mnist is not installed (scripts/install_deps.sh)" >&2; exit 77; }
for b in dtrain_ps dtrain_worker; do
  [ -x "$BIN/$b" ] || { echo "FAIL: $BIN/$b not built (set DTRAIN_BIN_DIR)" >&2; exit 1; }
done

dir="$(mktemp -d /tmp/dtrain_soak.XXXXXX)"
cleanup() {
  exec 2>/dev/null  # no "Killed" notices for the processes stopped here
  for p in $(jobs -p); do kill -KILL "$p" || true; done
  wait || true
  rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 143' TERM INT

IFS=, read -r p0 p1 p2 p3 p4 pm < <(python3 "$ROOT/scripts/free_ports.py" 6)
cluster=(--ps_hosts=127.0.0.1:$p0 --worker_hosts=127.0.0.1:$p1,127.0.0.1:$p2,127.0.0.1:$p3,127.0.0.1:$p4)
names=(ps worker0 worker1 worker2 worker3)
pids=()
"${pin[@]}" "$BIN/dtrain_ps" --job_name=ps --task_index=0 "${cluster[@]}" --checkpoint_dir="$dir/ckpt" \
  --save_checkpoint_secs="$checkpoint_secs" --journal_applied --worker_timeout_secs=5 --metrics_port="$pm" \
  > "$dir/ps.log" 2>&1 &
pids+=($!)
start_worker() {
  "${pin[@]}" "$BIN/dtrain_worker" --job_name=worker --task_index="$1" "${cluster[@]}" --mode=async --model=mlp --threads=1 \
    --train_steps=1000000000 --log_every=500 --eval_every=2000 --push_journal_dir="$dir/pushes" >> "$dir/w$1.log" 2>&1 &
  pids[$(($1 + 1))]=$!
}
for i in 0 1 2 3; do start_worker $i; done

# VmRSS and its parts (anonymous, file-backed, shared memory), KiB; "0" once the process is gone.
rss() {
  awk '/^VmRSS:/ {r = $2} /^RssAnon:/ {a = $2} /^RssFile:/ {f = $2} /^RssShmem:/ {s = $2}
       END {if (r) print r, a, f, s; else print 0}' "/proc/$1/status" 2>/dev/null || echo 0
}
threads() { awk '/^Threads:/ {print $2}' "/proc/$1/status" 2>/dev/null || echo 0; }
# The ps's malloc heap from its /metrics (dtrain_heap_bytes): in use, held by the allocator; KiB ("" if unread).
heap() {
  python3 - "$pm" <<'PY' 2>/dev/null || true
import sys, urllib.request
try:
    text = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=2).read().decode()
except Exception:
    sys.exit(0)
v = {}
for line in text.splitlines():
    if line.startswith("dtrain_heap_bytes{"):
        v[line.split('"')[1]] = float(line.split()[-1]) / 1024
if "in_use" in v and "held" in v:
    print(f"{v['in_use']:.0f} {v['held']:.0f}")
PY
}
chief_step() { grep -o '^step [0-9]*' "$dir/w0.log" 2>/dev/null | tail -1 | grep -o '[0-9]*' || echo 0; }
total=$((minutes * 60))
warmup=$((total / 5)); [ $warmup -ge 60 ] || warmup=60
[ $((warmup + window)) -le $((total - window)) ] || warmup=$((total - 2 * window))
[ $warmup -ge 60 ] || { echo "soak: --minutes must leave a minute of warm-up and two --window=${window}s windows to" \
  "compare (at least $(( (60 + 2 * window + 59) / 60 )) minutes)" >&2; exit 2; }
echo "soak: 1 ps + 4 async workers, ${minutes} min, RSS every ${interval} s, warm-up ${warmup} s, limit +${max_growth}%" \
     "$([ "$faults" -gt 0 ] && echo "; a worker killed and restarted every ${faults} s")" \
     "$([ -n "$cpus" ] && echo "; on CPUs $cpus")"
echo "  (growth: the mean RSS of the last ${window} s against the mean of the first ${window} s after the warm-up)"
for k in 0 1 2 3 4; do : > "$dir/rss.$k"; : > "$dir/threads.$k"; done
: > "$dir/steps"
: > "$dir/heap"
start=$(date +%s)
died=""
next_report=60
next_fault=$faults
kills=0
while true; do
  now=$(( $(date +%s) - start ))
  [ $now -lt $total ] || break
  for k in 0 1 2 3 4; do
    r=$(rss "${pids[$k]}")
    if [ "$r" = 0 ] || [ -z "$r" ]; then died="$died ${names[$k]}"; continue; fi
    echo "$now $r" >> "$dir/rss.$k"
    echo "$now $(threads "${pids[$k]}")" >> "$dir/threads.$k"
  done
  echo "$now $(chief_step)" >> "$dir/steps"
  h=$(heap); [ -z "$h" ] || echo "$now $h" >> "$dir/heap"
  if [ -n "$died" ]; then break; fi
  if [ "$faults" -gt 0 ] && [ $now -ge $next_fault ]; then
    k=$((1 + RANDOM % 3))
    kill -KILL "${pids[$((k + 1))]}" 2>/dev/null || true
    wait "${pids[$((k + 1))]}" 2>/dev/null || true
    start_worker $k
    kills=$((kills + 1))
    next_fault=$((next_fault + faults))
  fi
  if [ $now -ge $next_report ]; then
    echo "  t=${now}s RSS MiB: $(for k in 0 1 2 3 4; do printf '%s=%.1f ' "${names[$k]}" \
      "$(tail -1 "$dir/rss.$k" | awk '{print $2 / 1024}')"; done)global steps/s over the last minute:" \
      "$(awk -v c=$((now - 60)) '$1 >= c { if (!f) {f = 1; t0 = $1; s0 = $2} t1 = $1; s1 = $2 }
             END {printf "%.1f", (t1 > t0) ? (s1 - s0) / (t1 - t0) : 0}' "$dir/steps")"
    next_report=$((next_report + 60))
  fi
  sleep "$interval"
done
elapsed=$(( $(date +%s) - start ))
step=$(grep -o '^step [0-9]*' "$dir/w0.log" | tail -1 | grep -o '[0-9]*' || echo 0)
echo "soak: ran ${elapsed} s; the chief's last progress line: global step ${step}; workers killed and restarted: $kills"
fail=0
if [ -n "$died" ]; then
  echo "FAIL: exited before the end:$died"; fail=1
  for k in 0 1 2 3 4; do tail -3 "$dir/$( [ $k = 0 ] && echo ps || echo w$((k - 1)) ).log" | sed "s/^/  ${names[$k]}: /"; done
fi
printf '%-8s %16s %16s %12s %9s\n' process "after warm-up MiB" "last window MiB" "peak MiB" growth
for k in 0 1 2 3 4; do
  # mean of [warmup, warmup + window), mean of [elapsed - window, elapsed), peak after the warm-up; in KiB
  read -r w e p < <(awk -v a=$warmup -v b=$((warmup + window)) -v c=$((elapsed - window)) '
    $1 >= a && $1 < b {sw += $2; nw++} $1 >= c {se += $2; ne++} $1 >= a && $2 > p {p = $2}
    END {printf "%.1f %.1f %d\n", nw ? sw / nw : 0, ne ? se / ne : 0, p}' "$dir/rss.$k")
  if [ "${w%.*}" = 0 ] || [ "${e%.*}" = 0 ]; then
    printf '%-8s %16s\n' "${names[$k]}" "(too few samples after the warm-up)"; fail=1; continue
  fi
  g=$(echo "($e - $w) * 100 / $w" | bc -l)
  printf '%-8s %16.1f %16.1f %12.1f %8.2f%%\n' "${names[$k]}" "$(echo "$w/1024" | bc -l)" "$(echo "$e/1024" | bc -l)" \
    "$(echo "$p/1024" | bc -l)" "$g"
  # Where the change lies: the same two windows' means of the anonymous, file-backed and shared-memory parts.
  awk -v a=$warmup -v b=$((warmup + window)) -v c=$((elapsed - window)) '
    $1 >= a && $1 < b {for (i = 3; i <= 5; i++) w[i] += $i; nw++} $1 >= c {for (i = 3; i <= 5; i++) e[i] += $i; ne++}
    END {if (nw && ne) printf "         parts MiB, after warm-up -> last window: anon %.1f -> %.1f, file %.1f -> %.1f, shmem %.1f -> %.1f\n",
           w[3] / nw / 1024, e[3] / ne / 1024, w[4] / nw / 1024, e[4] / ne / 1024, w[5] / nw / 1024, e[5] / ne / 1024}' \
    "$dir/rss.$k"
  if [ "$(echo "$g >= $max_growth" | bc -l)" = 1 ]; then
    printf 'FAIL: %s grew %.2f%% after the warm-up\n' "${names[$k]}" "$g"; fail=1
  fi
done
# The ps's heap, the same windows: a rise of the bytes in use is memory the program keeps (a leak, or a table
# that grows); a rise of the bytes held with those in use flat is the allocator's (fragmentation).
awk -v a=$warmup -v b=$((warmup + window)) -v c=$((elapsed - window)) '
  $1 >= a && $1 < b {wu += $2; wh += $3; nw++} $1 >= c {eu += $2; eh += $3; ne++}
  END {if (nw && ne) printf "ps heap MiB (glibc malloc), after warm-up -> last window: in use %.1f -> %.1f, held %.1f -> %.1f\n",
         wu / nw / 1024, eu / ne / 1024, wh / nw / 1024, eh / ne / 1024;
       else print "ps heap: too few samples of its /metrics"}' "$dir/heap"
# Threads: the most in the first window after the warm-up against the most in the last window.
printf '%-8s %16s %16s\n' process "threads after warm-up" "last window"
for k in 0 1 2 3 4; do
  read -r tw te < <(awk -v a=$warmup -v b=$((warmup + window)) -v c=$((elapsed - window)) '
    $1 >= a && $1 < b && $2 > w {w = $2} $1 >= c && $2 > e {e = $2} END {print w + 0, e + 0}' "$dir/threads.$k")
  printf '%-8s %16d %16d\n' "${names[$k]}" "$tw" "$te"
  # A restarted worker is a new process: its count is compared only when it was not killed in between.
  if [ "$k" = 0 ] || [ "$k" = 1 ] || [ "$faults" = 0 ]; then
    [ "$te" -le $((tw + 4)) ] || { echo "FAIL: ${names[$k]}'s threads grew from $tw to $te"; fail=1; }
  fi
done
# The global step rate: the first window after the warm-up against the last window.
read -r r_first r_last < <(awk -v a=$warmup -v b=$((warmup + window)) -v c=$((elapsed - window)) '
  $1 >= a && $1 < b { if (!fa) {fa = 1; t0 = $1; s0 = $2} t1 = $1; s1 = $2 }
  $1 >= c { if (!fc) {fc = 1; t2 = $1; s2 = $2} t3 = $1; s3 = $2 }
  END {f = (t1 > t0) ? (s1 - s0) / (t1 - t0) : 0; l = (t3 > t2) ? (s3 - s2) / (t3 - t2) : 0; printf "%.1f %.1f\n", f, l}' \
  "$dir/steps")
echo "global steps/sec: ${r_first} in the first ${window} s after the warm-up, ${r_last} in the last ${window} s"
if [ "$(echo "$r_first > 0 && $r_last * 100 >= $r_first * $min_rate_ratio" | bc -l)" != 1 ]; then
  echo "FAIL: the last window's step rate is below ${min_rate_ratio}% of the first's"; fail=1
fi
# Every process stopped (SIGTERM: the ps saves and journals), then the journals judged.
for p in "${pids[@]:1}"; do kill -TERM "$p" 2>/dev/null || true; done
for p in "${pids[@]:1}"; do wait "$p" 2>/dev/null || true; done
kill -TERM "${pids[0]}" 2>/dev/null || true
wait "${pids[0]}" 2>/dev/null || true
if out=$(python3 "$ROOT/scripts/check_updates.py" --ps_dir="$dir/ckpt" --worker_dir="$dir/pushes" 2>&1); then
  echo "update checker: $(echo "$out" | tail -1)"
else
  echo "FAIL: the update checker:"; echo "$out" | tail -8; fail=1
fi
[ $fail = 0 ] && echo "soak: PASS (no process grew by ${max_growth}% or more after the warm-up, no thread leak," \
                      "the step rate held, no update lost or doubled)"
exit $fail
}
