#!/usr/bin/env bash
# Chaos trials: each starts 1 ps + 3 sync workers on 127.0.0.1 (the MLP, checkpoints every 25 steps, a 3 s worker
# timeout), kills a random process with SIGKILL at a random moment and, when it was the ps, starts it again with
# the same flags (a killed worker is started again half of the time). Each trial passes when:
#   - every process exits by itself before the deadline (no hang: otherwise it is killed and the trial fails);
#   - exit codes are the documented ones: the last ps and every worker not killed exit 0;
#   - training reached its last step (the ps's "training reached step N of N");
#   - the ps's push accounting balances (ps/core/parameter_server.h, PushAccounting), recomputed here from its
#     "accounting:" line: received == accepted + duplicates + dropped_stale + dropped_backup + rejected_nonfinite
#     + refused + abandoned + in_flight, and accepted == applied + skipped_nonfinite + discarded + pending.
# Prints one line per trial and "chaos: P/N trials passed, H hangs"; exits 1 on any failure, 77 without the
# data set. Usage: tests/chaos.sh [--trials=N] [--seed=S] [--steps=N] [--keep]   (DTRAIN_BIN_DIR: the binaries)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BIN="${DTRAIN_BIN_DIR:-$ROOT/build/bin}"
trials=5
seed=$(( $(date +%s) % 100000 ))
steps=400
keep=0
for a in "$@"; do
  case "$a" in
    --trials=*) trials="${a#*=}" ;;
    --seed=*) seed="${a#*=}" ;;
    --steps=*) steps="${a#*=}" ;;
    --keep) keep=1 ;;
    *) echo "usage: $0 [--trials=N] [--seed=S] [--steps=N] [--keep]" >&2; exit 2 ;;
  esac
done
if [ ! -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
  echo "SKIP: dataset-fashion-mnist is not installed (scripts/install_deps.sh)"; exit 77
fi
for b in dtrain_ps dtrain_worker; do
  [ -x "$BIN/$b" ] || { echo "FAIL: $BIN/$b not built (set DTRAIN_BIN_DIR)"; exit 1; }
done
RANDOM=$seed
TRIAL_DEADLINE=90   # seconds for a whole trial (an uninterrupted one takes about 10 s on 2 cores)

top="$(mktemp -d /tmp/dtrain_chaos.XXXXXX)"
cleanup() {
  # Our children not reaped yet (jobs -p lists nothing else, so no pid of another process is hit).
  for p in $(jobs -p); do kill -KILL "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  if [ "$keep" = 1 ]; then echo "logs kept in $top"; else rm -rf "$top"; fi
}
trap cleanup EXIT
trap 'exit 143' TERM INT

# Running (an exited child stays a zombie until it is waited for: that is not running).
alive() { local s; s=$(ps -o stat= -p "$1" 2>/dev/null) || return 1; [[ "$s" != Z* ]]; }
# The newest global step a worker printed ("step N, loss = ..."), 0 if none yet.
last_step() { grep -o '^step [0-9]*, loss' "$1" 2>/dev/null | tail -1 | grep -o '[0-9]*' || echo 0; }
# Milliseconds in [lo, hi).
rand_ms() { echo $(( $1 + (RANDOM * 32768 + RANDOM) % ($2 - $1) )); }
sleep_ms() { sleep "$(printf '%d.%03d' $(($1 / 1000)) $(($1 % 1000)))"; }

passed=0; hangs=0
echo "chaos: $trials trials, seed $seed, $steps steps each, binaries in $BIN"
for ((t = 1; t <= trials; t++)); do
  dir="$top/trial$t"; mkdir -p "$dir"
  IFS=, read -r p0 p1 p2 p3 < <(python3 "$ROOT/scripts/free_ports.py" 4)
  cluster=(--ps_hosts=127.0.0.1:$p0 --worker_hosts=127.0.0.1:$p1,127.0.0.1:$p2,127.0.0.1:$p3)
  ps_flags=(--job_name=ps --task_index=0 "${cluster[@]}" --worker_timeout_secs=3 --checkpoint_dir="$dir/ckpt"
            --save_checkpoint_steps=25)
  worker_flags=("${cluster[@]}" --mode=sync --model=mlp --train_steps="$steps" --log_every=10 --threads=1
                --seed=$((t + seed)))
  start=$(date +%s%N)
  "$BIN/dtrain_ps" "${ps_flags[@]}" > "$dir/ps.0.log" 2>&1 & ps_pid=$!
  declare -a wpid=()
  for i in 0 1 2; do
    "$BIN/dtrain_worker" --job_name=worker --task_index=$i "${worker_flags[@]}" > "$dir/w$i.0.log" 2>&1 &
    wpid[$i]=$!
  done
  declare -a wlog=("$dir/w0.0.log" "$dir/w1.0.log" "$dir/w2.0.log")
  declare -a killed=(0 0 0)
  ps_log="$dir/ps.0.log"

  # The victim (0: the ps, 1..3: worker 0..2) and the moment: while training runs (after the first steps,
  # before the last 20%).
  victim=$((RANDOM % 4))
  at_ms=$(rand_ms 300 4000)
  what="nothing killed"
  waited=0
  while [ "$(last_step "${wlog[0]}")" -lt 10 ] && [ $waited -lt 60000 ]; do sleep 0.1; waited=$((waited + 100)); done
  sleep_ms "$at_ms"
  step_now=$(last_step "${wlog[0]}")
  all_alive=1
  for p in "$ps_pid" "${wpid[@]}"; do alive "$p" || all_alive=0; done
  if [ "$all_alive" = 1 ] && [ "$step_now" -lt $((steps * 8 / 10)) ]; then
    if [ "$victim" = 0 ]; then
      kill -KILL "$ps_pid"; wait "$ps_pid" 2>/dev/null || true
      sleep_ms "$(rand_ms 200 1500)"
      ps_log="$dir/ps.1.log"
      "$BIN/dtrain_ps" "${ps_flags[@]}" > "$ps_log" 2>&1 & ps_pid=$!
      what="ps killed at step ~$step_now, restarted"
    else
      i=$((victim - 1))
      kill -KILL "${wpid[$i]}"; wait "${wpid[$i]}" 2>/dev/null || true
      what="worker $i killed at step ~$step_now"
      if [ $((RANDOM % 2)) = 0 ]; then
        sleep_ms "$(rand_ms 200 2000)"
        wlog[$i]="$dir/w$i.1.log"
        "$BIN/dtrain_worker" --job_name=worker --task_index=$i "${worker_flags[@]}" > "${wlog[$i]}" 2>&1 &
        wpid[$i]=$!
        what="$what, restarted"
      else
        killed[$i]=1
      fi
    fi
  else
    what="nothing killed (at step $step_now the run was too far or a process had exited)"
  fi

  # Every process must exit by itself before the deadline.
  problems=()
  hung=0
  deadline=$((start / 1000000 + TRIAL_DEADLINE * 1000))
  declare -A code=()
  for p in "$ps_pid" "${wpid[@]}"; do
    while alive "$p" && [ "$(date +%s%3N)" -lt $deadline ]; do sleep 0.1; done
    if alive "$p"; then
      hung=1
      kill -KILL "$p" 2>/dev/null || true
    fi
    set +e; wait "$p" 2>/dev/null; code[$p]=$?; set -e
  done
  secs=$(( ($(date +%s%N) - start) / 1000000 ))
  [ "$hung" = 1 ] && problems+=("HANG: a process was still running after ${TRIAL_DEADLINE} s")

  [ "${code[$ps_pid]}" = 0 ] || problems+=("ps exited ${code[$ps_pid]}, expected 0")
  for i in 0 1 2; do
    [ "${killed[$i]}" = 1 ] && continue
    [ "${code[${wpid[$i]}]}" = 0 ] || problems+=("worker $i exited ${code[${wpid[$i]}]}, expected 0")
  done
  grep -q "training reached step $steps of $steps" "$ps_log" ||
    problems+=("the ps did not report 'training reached step $steps of $steps'")

  acct=$(grep -o 'accounting: .*' "$ps_log" | tail -1 || true)
  if [ -z "$acct" ]; then
    problems+=("no accounting line in the ps output")
  else
    v() { echo "$acct" | grep -o "$1=[0-9]*" | head -1 | cut -d= -f2; }
    rec=$(v received); acc=$(v accepted); dup=$(v duplicates); st=$(v dropped_stale); bk=$(v dropped_backup)
    rej=$(v rejected_nonfinite); ref=$(v refused); ab=$(v abandoned); fl=$(v in_flight); ap=$(v applied)
    sk=$(v skipped_nonfinite); di=$(v discarded); pe=$(v pending)
    if [ $rec -ne $((acc + dup + st + bk + rej + ref + ab + fl)) ] || [ $acc -ne $((ap + sk + di + pe)) ]; then
      problems+=("accounting does not balance: $acct")
    fi
    [ "$ap" -gt 0 ] || problems+=("the ps applied nothing: $acct")
  fi

  if [ ${#problems[@]} = 0 ]; then
    passed=$((passed + 1))
    echo "trial $t: PASS  $what; ${secs} ms; ps: received=$rec applied=$ap stale=$st backup=$bk dup=$dup refused=$ref abandoned=$ab"
  else
    [ "$hung" = 1 ] && hangs=$((hangs + 1))
    echo "trial $t: FAIL  $what; ${secs} ms"
    for m in "${problems[@]}"; do echo "    $m"; done
    failed_dir="/tmp/dtrain_chaos_failed.$seed.$t"
    rm -rf "$failed_dir"; mv "$dir" "$failed_dir"
    echo "    logs: $failed_dir"
  fi
  [ "$keep" = 1 ] || rm -rf "$dir"
  unset code wpid wlog killed
done
echo "chaos: $passed/$trials trials passed, $hangs hangs"
[ "$passed" = "$trials" ]
