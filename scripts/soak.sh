#!/usr/bin/env bash
# Soak: 1 ps + 4 async workers on 127.0.0.1 train the MLP for N minutes (checkpoints every 30 s, the chief
# evaluating every 2000 steps) while the resident memory (VmRSS from /proc) of every process is sampled every
# few seconds. After a warm-up (the first 20% of the time, at least one minute) memory must stay flat: the
# script prints, per process, the mean RSS of the first minute after the warm-up and of the last minute (means:
# one sample moves with the messages in flight at that moment, a few MiB), the peak and the growth between the
# two means, and exits 1 if any process grew by 5% or more (or died). The processes are stopped at the end
# (training has no time limit of its own: train_steps is set beyond reach).
# Usage: scripts/soak.sh [--minutes=N] [--interval=SECONDS] [--max_growth=PERCENT]   (default 10, 5, 5)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BIN="${DTRAIN_BIN_DIR:-$ROOT/build/bin}"
minutes=10
interval=5
max_growth=5
for a in "$@"; do
  case "$a" in
    --minutes=*) minutes="${a#*=}" ;;
    --interval=*) interval="${a#*=}" ;;
    --max_growth=*) max_growth="${a#*=}" ;;
    *) echo "usage: $0 [--minutes=N] [--interval=SECONDS] [--max_growth=PERCENT]" >&2; exit 2 ;;
  esac
done
for v in minutes interval max_growth; do
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

IFS=, read -r p0 p1 p2 p3 p4 < <(python3 "$ROOT/scripts/free_ports.py" 5)
cluster=(--ps_hosts=127.0.0.1:$p0 --worker_hosts=127.0.0.1:$p1,127.0.0.1:$p2,127.0.0.1:$p3,127.0.0.1:$p4)
names=(ps worker0 worker1 worker2 worker3)
pids=()
"$BIN/dtrain_ps" --job_name=ps --task_index=0 "${cluster[@]}" --checkpoint_dir="$dir/ckpt" \
  --save_checkpoint_secs=30 > "$dir/ps.log" 2>&1 &
pids+=($!)
for i in 0 1 2 3; do
  "$BIN/dtrain_worker" --job_name=worker --task_index=$i "${cluster[@]}" --mode=async --model=mlp --threads=1 \
    --train_steps=1000000000 --log_every=5000 --eval_every=2000 > "$dir/w$i.log" 2>&1 &
  pids+=($!)
done

rss() { awk '/^VmRSS:/ {print $2}' "/proc/$1/status" 2>/dev/null || echo 0; }
total=$((minutes * 60))
warmup=$((total / 5)); [ $warmup -ge 60 ] || warmup=60
[ $((warmup + 60)) -le $((total - 60)) ] || warmup=$((total - 120))
[ $warmup -ge 60 ] || { echo "soak: --minutes must be at least 3 (a minute of warm-up, then two to compare)" >&2; exit 2; }
echo "soak: 1 ps + 4 async workers, ${minutes} min, RSS every ${interval} s, warm-up ${warmup} s, limit +${max_growth}%"
echo "  (growth: the mean RSS of the last minute against the mean of the first minute after the warm-up)"
for k in 0 1 2 3 4; do : > "$dir/rss.$k"; done
start=$(date +%s)
died=""
next_report=60
while true; do
  now=$(( $(date +%s) - start ))
  [ $now -lt $total ] || break
  for k in 0 1 2 3 4; do
    r=$(rss "${pids[$k]}")
    if [ "$r" = 0 ]; then died="$died ${names[$k]}"; continue; fi
    echo "$now $r" >> "$dir/rss.$k"
  done
  if [ -n "$died" ]; then break; fi
  if [ $now -ge $next_report ]; then
    echo "  t=${now}s RSS MiB: $(for k in 0 1 2 3 4; do printf '%s=%.1f ' "${names[$k]}" \
      "$(tail -1 "$dir/rss.$k" | awk '{print $2 / 1024}')"; done)"
    next_report=$((next_report + 60))
  fi
  sleep "$interval"
done
elapsed=$(( $(date +%s) - start ))
step=$(grep -o '^step [0-9]*' "$dir/w0.log" | tail -1 | grep -o '[0-9]*' || echo 0)
echo "soak: ran ${elapsed} s; the chief's last progress line: global step ${step}"
fail=0
if [ -n "$died" ]; then
  echo "FAIL: exited before the end:$died"; fail=1
  for k in 0 1 2 3 4; do tail -3 "$dir/$( [ $k = 0 ] && echo ps || echo w$((k - 1)) ).log" | sed "s/^/  ${names[$k]}: /"; done
fi
printf '%-8s %16s %16s %12s %9s\n' process "after warm-up MiB" "last minute MiB" "peak MiB" growth
for k in 0 1 2 3 4; do
  # mean of [warmup, warmup + 60), mean of [elapsed - 60, elapsed), peak after the warm-up; in KiB
  read -r w e p < <(awk -v a=$warmup -v b=$((warmup + 60)) -v c=$((elapsed - 60)) '
    $1 >= a && $1 < b {sw += $2; nw++} $1 >= c {se += $2; ne++} $1 >= a && $2 > p {p = $2}
    END {printf "%.1f %.1f %d\n", nw ? sw / nw : 0, ne ? se / ne : 0, p}' "$dir/rss.$k")
  if [ "${w%.*}" = 0 ] || [ "${e%.*}" = 0 ]; then
    printf '%-8s %16s\n' "${names[$k]}" "(too few samples after the warm-up)"; fail=1; continue
  fi
  g=$(echo "($e - $w) * 100 / $w" | bc -l)
  printf '%-8s %16.1f %16.1f %12.1f %8.2f%%\n' "${names[$k]}" "$(echo "$w/1024" | bc -l)" "$(echo "$e/1024" | bc -l)" \
    "$(echo "$p/1024" | bc -l)" "$g"
  if [ "$(echo "$g >= $max_growth" | bc -l)" = 1 ]; then
    printf 'FAIL: %s grew %.2f%% after the warm-up\n' "${names[$k]}" "$g"; fail=1
  fi
done
[ $fail = 0 ] && echo "soak: PASS (no process grew by ${max_growth}% or more after the warm-up)"
exit $fail
