#!/usr/bin/env bash
# Chaos trials: each starts 1 ps + 3 sync workers on 127.0.0.1 (--model, the MLP by default; checkpoints every 25
# steps, a 3 s worker timeout). From the seeded RNG each trial draws a victim (the ps or worker 0, 1, 2) and a
# step in [10, 80% of --steps] (for the ps, not in the last 10 steps before a checkpoint: such a step moves 10
# back); it follows the workers' progress lines ("step N, loss = ...", one per step) until the global step
# reaches the drawn step, kills the victim there with SIGKILL and, when it was the ps, starts it again with the
# same flags (a killed worker is started again half of the time). Each trial passes when:
#   - the victim was killed (a trial whose run ended, or whose victim exited, before the drawn step fails);
#   - every process exits by itself before the deadline (no hang: otherwise it is killed and the trial fails);
#   - exit codes are the documented ones (common/exit_codes.h): the last ps and every worker not killed exit 0,
#     or 3 when a killed worker was not started again (the run reached its end degraded: "run degraded: ...");
#   - training reached its last step (the ps's "training reached step N of N");
#   - a restarted ps restored the newest checkpoint there was when it was killed (its "restored ..." line), with
#     sparse rows when the model has embedding tables (the chief's "sparse tables:" line says so);
#   - the ps's push accounting balances (ps/core/parameter_server.h, PushAccounting), recomputed here from its
#     "accounting:" line: received == accepted + duplicates + dropped_stale + dropped_backup + rejected_nonfinite
#     + refused + abandoned + in_flight, and accepted == applied + skipped_nonfinite + discarded + pending;
#   - nothing acknowledged was lost or applied twice: the ps keeps an applied journal (--journal_applied) and every
#     worker a journal of the pushes ps 0 acknowledged (--push_journal_dir); scripts/check_updates.py proves from
#     them that every push a worker saw accepted is in the ps's final state exactly once, unless the restore after
#     a ps kill undid it (then the worker pushed that step again), and that no push is there twice.
#   - with deltas (--ps_flags="--delta_every_secs=..."), the restarted ps restored the newest state there was: its
#     newest checkpoint and the deltas after it ("restored ... + N deltas to step S"), so it lost at most the steps
#     since the last delta (printed as "lost L steps");
# Prints one line per trial ("trial 3: killed ps at step 212 (restarted): passed in 7.9 s; ...; updates: 1200
# checked, 24 undone by the restore, lost 0, doubled 0") and "chaos: P/N trials passed, H hangs; killed: ps X (Y
# after a checkpoint, restoring R sparse rows), worker Y (Z restarted), nothing W; updates checked U (undone by a
# restore V), lost L, doubled D"; exits 1 on any failure, 77 without the data set (Fashion-MNIST, or the
# --data_dir given in --worker_flags; with DTRAIN_REQUIRE_DEPS=1 that is a failure, exit 1).
# Usage: tests/chaos.sh [--trials=N] [--seed=S] [--steps=N] [--model=NAME] [--worker_flags="FLAGS"]
#                       [--ps_flags="FLAGS"] [--require=WHAT,...] [--keep]
#   --worker_flags, --ps_flags: more dtrain_worker / dtrain_ps flags, split at white space, after (so overriding)
#     the script's own (e.g. another transport).
#   --require: what the trials together must have done, else the run fails (so that a change of the draws cannot
#     silently drop a path): ps_after_checkpoint (the ps killed after its first checkpoint and restored from it),
#     sparse_rows_restored (a restarted ps restored sparse rows), worker_restarted, worker_lost (a worker killed
#     and not started again), undone (a restore undid acknowledged pushes, which the checker accounted for).
#   DTRAIN_BIN_DIR: the binaries.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BIN="${DTRAIN_BIN_DIR:-$ROOT/build/bin}"
trials=5
seed=$(( $(date +%s) % 100000 ))
steps=400
model=mlp
extra_flags=""
ps_extra_flags=""
require=""
keep=0
usage="usage: $0 [--trials=N] [--seed=S] [--steps=N] [--model=NAME] [--worker_flags=\"FLAGS\"] [--ps_flags=\"FLAGS\"]"
usage+=" [--require=ps_after_checkpoint,sparse_rows_restored,worker_restarted,worker_lost,undone] [--keep]"
for a in "$@"; do
  case "$a" in
    --trials=*) trials="${a#*=}" ;;
    --seed=*) seed="${a#*=}" ;;
    --steps=*) steps="${a#*=}" ;;
    --model=*) model="${a#*=}" ;;
    --worker_flags=*) extra_flags="${a#*=}" ;;
    --ps_flags=*) ps_extra_flags="${a#*=}" ;;
    --require=*) require="${a#*=}" ;;
    --keep) keep=1 ;;
    *) echo "$usage" >&2; exit 2 ;;
  esac
done
[[ "$trials" =~ ^[0-9]+$ && "$seed" =~ ^[0-9]+$ && "$steps" =~ ^[0-9]+$ ]] || { echo "$usage" >&2; exit 2; }
first_kill=10
last_kill=$((steps * 8 / 10))
[ "$last_kill" -ge "$first_kill" ] || { echo "--steps=$steps leaves no step to kill at (at least 13)" >&2; exit 2; }
read -r -a extra <<< "$extra_flags"
read -r -a ps_extra <<< "$ps_extra_flags"
for r in ${require//,/ }; do
  case "$r" in ps_after_checkpoint | sparse_rows_restored | worker_restarted | worker_lost | undone) ;;
    *) echo "--require: unknown '$r'; $usage" >&2; exit 2 ;;
  esac
done
source "$ROOT/tests/skipping.sh"
data_dir=""
for f in "${extra[@]}"; do [[ "$f" == --data_dir=* ]] && data_dir="${f#*=}"; done
if [ -z "$data_dir" ]; then
  if [ ! -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
    skip "dataset-fashion-mnist is not installed (scripts/install_deps.sh)"
  fi
elif [ ! -d "$data_dir" ]; then
  skip "no data set in $data_dir (the --data_dir of --worker_flags)"
fi
for b in dtrain_ps dtrain_worker; do
  [ -x "$BIN/$b" ] || { echo "FAIL: $BIN/$b not built (set DTRAIN_BIN_DIR)"; exit 1; }
done
RANDOM=$seed
TRIAL_DEADLINE=90   # seconds for a whole trial (an uninterrupted MLP one takes about 10 s on 2 cores)

top="$(mktemp -d /tmp/dtrain_chaos.XXXXXX)"
cleanup() {
  # Our children not reaped yet (jobs -p lists nothing else, so no pid of another process is hit).
  for p in $(jobs -p); do kill -KILL "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  if [ "$keep" = 1 ]; then echo "logs kept in $top"; else rm -rf "$top"; fi
}
trap cleanup EXIT
trap 'exit 143' TERM INT

# The loop that waits for the drawn step polls every 20 ms while the cluster trains on the same cores: it runs
# on builtins only (no process started per poll). A read from a FIFO that this shell holds open at both ends
# never gets data, so "read -t" on it is a sleep.
mkfifo "$top/sleep"
exec {sleep_fd}<>"$top/sleep"
sleep_ms() {
  local secs
  printf -v secs '%d.%03d' $(($1 / 1000)) $(($1 % 1000))
  read -r -t "$secs" -u "$sleep_fd" _ || true
}
# Milliseconds since the epoch, in NOW_MS.
now_ms() { local t=${EPOCHREALTIME/[.,]/}; NOW_MS=$((10#$t / 1000)); }
# Running (an exited child stays a zombie until it is waited for: that is not running).
alive() {
  local s
  { IFS= read -r s < "/proc/$1/stat"; } 2>/dev/null || return 1
  s=${s##*") "}
  [[ "$s" != Z* ]]
}
# An integer in [lo, hi], in RAND. Not through $(...): bash seeds RANDOM afresh in a subshell (from the time and
# its pid), so a draw there is not the seed's and does not advance this shell's sequence.
rand_in() { RAND=$(( $1 + (RANDOM * 32768 + RANDOM) % ($2 - $1 + 1) )); }

# The workers' logs are followed through open descriptors: each poll reads the lines added since the last one.
# A line still being written is kept in wpart and completed by the next read.
declare -a wfd=() wpart=()
# Reads the new lines of every worker log; SEEN is the highest global step printed so far.
read_progress() {
  local i line
  for i in 0 1 2; do
    while true; do
      if IFS= read -r -u "${wfd[$i]}" line; then
        line="${wpart[$i]}$line"; wpart[$i]=""
        if [[ "$line" =~ ^step\ ([0-9]+),\ loss ]] && [ "${BASH_REMATCH[1]}" -gt "$SEEN" ]; then
          SEEN=${BASH_REMATCH[1]}
        fi
      else
        wpart[$i]="${wpart[$i]}$line"
        break
      fi
    done
  done
}

passed=0; hangs=0
kills_ps=0; kills_worker=0; workers_restarted=0; kills_nothing=0
kills_ps_after_ckpt=0; sparse_rows_restored=0
upd_checked=0; upd_undone=0; upd_lost=0; upd_doubled=0; upd_acked=0
echo "chaos: $trials trials, seed $seed, $steps steps each, model $model${extra_flags:+, worker flags $extra_flags}," \
     "binaries in $BIN"
for ((t = 1; t <= trials; t++)); do
  # The trial's plan, drawn before it starts (the same number of draws in every trial, so a trial's plan depends
  # only on the seed and its number): the victim (0: the ps, 1..3: worker 0..2), the step to kill it at, whether
  # a killed worker is started again, and how long the victim stays down.
  victim=$((RANDOM % 4))
  rand_in $first_kill $last_kill; kill_step=$RAND
  # The ps is killed inside a checkpoint interval (every 25 steps), not in its last 10 steps: the watcher sees the
  # step up to 20 ms late and the cluster runs on meanwhile, so a kill drawn just before a checkpoint could land
  # after it and undo nothing, which is not the case drawn. (No extra draw: the later plans stay the seed's.)
  if [ "$victim" = 0 ] && [ $((kill_step % 25)) -ge 15 ] && [ $((kill_step - 10)) -ge "$first_kill" ]; then
    kill_step=$((kill_step - 10))
  fi
  restart_worker=$((RANDOM % 2))
  rand_in 200 1500; ps_down_ms=$RAND
  rand_in 200 2000; worker_down_ms=$RAND

  dir="$top/trial$t"; mkdir -p "$dir"
  IFS=, read -r p0 p1 p2 p3 < <(python3 "$ROOT/scripts/free_ports.py" 4)
  cluster=(--ps_hosts=127.0.0.1:$p0 --worker_hosts=127.0.0.1:$p1,127.0.0.1:$p2,127.0.0.1:$p3)
  ps_flags=(--job_name=ps --task_index=0 "${cluster[@]}" --worker_timeout_secs=3 --checkpoint_dir="$dir/ckpt"
            --save_checkpoint_steps=25 --journal_applied "${ps_extra[@]}")
  # --log_every=1: a progress line per step, so that the drawn step is seen within a step or two.
  worker_flags=("${cluster[@]}" --mode=sync --model="$model" --train_steps="$steps" --log_every=1 --threads=1
                --seed=$((t + seed)) --push_journal_dir="$dir/pushes" "${extra[@]}")
  now_ms; start=$NOW_MS
  "$BIN/dtrain_ps" "${ps_flags[@]}" > "$dir/ps.0.log" 2>&1 & ps_pid=$!
  declare -a wpid=() wlog=()
  for i in 0 1 2; do
    wlog[$i]="$dir/w$i.0.log"
    : > "${wlog[$i]}"
    exec {fd}<"${wlog[$i]}"
    wfd[$i]=$fd; wpart[$i]=""
    "$BIN/dtrain_worker" --job_name=worker --task_index=$i "${worker_flags[@]}" > "${wlog[$i]}" 2>&1 &
    wpid[$i]=$!
  done
  declare -a killed=(0 0 0)
  newest_ckpt=-1
  newest_kind=""
  killed_at=0
  declare -A code=()
  ps_log="$dir/ps.0.log"
  problems=()
  deadline=$((start + TRIAL_DEADLINE * 1000))

  # Wait until the global step reaches the drawn step, every process still running.
  if [ "$victim" = 0 ]; then victim_name="ps"; victim_pid=$ps_pid; else
    victim_name="worker $((victim - 1))"; victim_pid=${wpid[$((victim - 1))]}; fi
  SEEN=0
  gone=""
  while true; do
    read_progress
    [ "$SEEN" -ge "$kill_step" ] && break
    for n in ps 0 1 2; do
      if [ "$n" = ps ]; then p=$ps_pid; else p=${wpid[$n]}; fi
      alive "$p" || { gone=$([ "$n" = ps ] && echo "the ps" || echo "worker $n"); break; }
    done
    [ -n "$gone" ] && break
    now_ms; [ "$NOW_MS" -lt "$deadline" ] || break
    sleep_ms 20
  done
  for i in 0 1 2; do fd=${wfd[$i]}; exec {fd}<&-; done

  what=""
  if [ "$SEEN" -lt "$kill_step" ]; then
    if [ -n "$gone" ]; then
      why="$gone exited before step $kill_step (last step seen $SEEN)"
    else
      why="step $kill_step not reached within ${TRIAL_DEADLINE} s (last step seen $SEEN)"
    fi
    problems+=("nothing killed: $why")
    what="killed nothing ($victim_name drawn at step $kill_step)"
    kills_nothing=$((kills_nothing + 1))
  else
    kill -KILL "$victim_pid" 2>/dev/null || true
    set +e; wait "$victim_pid" 2>/dev/null; victim_code=$?; set -e
    if [ "$victim_code" != 137 ]; then
      # It exited by itself between the last look and the kill: nothing was killed.
      code[$victim_pid]=$victim_code
      problems+=("nothing killed: $victim_name exited $victim_code by itself at step ~$SEEN, before the kill")
      what="killed nothing ($victim_name drawn at step $kill_step)"
      kills_nothing=$((kills_nothing + 1))
    elif [ "$victim" = 0 ]; then
      # The checkpoint the restarted ps must restore (none before the first save: then the chief starts afresh).
      for f in "$dir"/ckpt/model.ckpt-*.ps0-of-1 "$dir"/ckpt/model.delta-*.ps0-of-1; do
        [[ "$f" =~ model\.(ckpt|delta)-([0-9]+)\.ps0-of-1$ ]] && [ "${BASH_REMATCH[2]}" -gt "$newest_ckpt" ] &&
          newest_ckpt=${BASH_REMATCH[2]} && newest_kind=${BASH_REMATCH[1]}
      done
      killed_at=$SEEN
      sleep_ms "$ps_down_ms"
      ps_log="$dir/ps.1.log"
      "$BIN/dtrain_ps" "${ps_flags[@]}" > "$ps_log" 2>&1 & ps_pid=$!
      what="killed ps at step $SEEN (restarted)"
      kills_ps=$((kills_ps + 1))
    else
      i=$((victim - 1))
      kills_worker=$((kills_worker + 1))
      if [ "$restart_worker" = 1 ]; then
        sleep_ms "$worker_down_ms"
        wlog[$i]="$dir/w$i.1.log"
        "$BIN/dtrain_worker" --job_name=worker --task_index=$i "${worker_flags[@]}" > "${wlog[$i]}" 2>&1 &
        wpid[$i]=$!
        what="killed worker $i at step $SEEN (restarted)"
        workers_restarted=$((workers_restarted + 1))
      else
        killed[$i]=1
        what="killed worker $i at step $SEEN"
      fi
    fi
  fi

  # Every process must exit by itself before the deadline.
  hung=0
  for p in "$ps_pid" "${wpid[@]}"; do
    [ -n "${code[$p]+set}" ] && continue
    while alive "$p"; do
      now_ms; [ "$NOW_MS" -lt "$deadline" ] || break
      sleep_ms 100
    done
    if alive "$p"; then
      hung=1
      kill -KILL "$p" 2>/dev/null || true
    fi
    set +e; wait "$p" 2>/dev/null; code[$p]=$?; set -e
  done
  now_ms; secs=$(( (NOW_MS - start) / 1000 )).$(( (NOW_MS - start) % 1000 / 100 ))
  [ "$hung" = 1 ] && problems+=("HANG: a process was still running after ${TRIAL_DEADLINE} s")

  # A worker killed for good leaves the run degraded: 3 from everyone left (0 with --allow_degraded).
  expected=0
  for i in 0 1 2; do [ "${killed[$i]}" = 1 ] && expected=3; done
  [ "${code[$ps_pid]}" = "$expected" ] || problems+=("ps exited ${code[$ps_pid]}, expected $expected")
  for i in 0 1 2; do
    [ "${killed[$i]}" = 1 ] && continue
    [ "${code[${wpid[$i]}]}" = "$expected" ] ||
      problems+=("worker $i exited ${code[${wpid[$i]}]}, expected $expected")
  done
  grep -q "training reached step $steps of $steps" "$ps_log" ||
    problems+=("the ps did not report 'training reached step $steps of $steps'")

  restored=""
  trial_ps_after_ckpt=0; trial_rows_restored=0
  if [ "$newest_ckpt" -ge 0 ]; then
    # At the chief's Register ("restored PATH (step N, S slices, R sparse rows)"), or when the chief rolls every
    # task back to a common step ("restored PATH on the chief's request (was at step A, now N, R sparse rows)").
    # With deltas: "restored <checkpoint> + N deltas to step S (...)" or "restored <dir>: N deltas from a fresh
    # start to step S (...)".
    line=$(grep -o 'restored [^ ]*\(model.ckpt-[0-9]*\.ps0-of-1\|: [0-9]* deltas\? from a fresh start\) [^)]*)' \
           "$ps_log" | head -1 || true)
    if [[ "$line" =~ (\(step|now)\ ([0-9]+) ]]; then
      rstep=${BASH_REMATCH[2]}
      restored="; restored step $rstep"
      [ "$newest_kind" = delta ] && restored+=" (deltas; lost $((killed_at - rstep)) steps)"
      [ "$rstep" = "$newest_ckpt" ] ||
        problems+=("the restarted ps restored step $rstep, not its newest checkpoint $newest_ckpt")
      [ "$rstep" -gt 0 ] && trial_ps_after_ckpt=1
      if [[ "$line" =~ ,\ ([0-9]+)\ sparse\ rows ]]; then
        restored+=" with ${BASH_REMATCH[1]} sparse rows"
        [ "${BASH_REMATCH[1]}" -gt 0 ] || problems+=("the restarted ps restored no sparse rows: $line")
        [ "${BASH_REMATCH[1]}" -gt 0 ] && trial_rows_restored=${BASH_REMATCH[1]}
      elif grep -q "^sparse tables:" "$dir"/w0.*.log; then
        problems+=("the restarted ps restored no sparse tables (the model has them): $line")
      fi
    else
      problems+=("the restarted ps restored no checkpoint (its newest was step $newest_ckpt)")
    fi
  fi

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

  # Nothing acknowledged lost or applied twice (scripts/check_updates.py on the journals).
  updates=""
  set +e
  check_out=$(python3 "$ROOT/scripts/check_updates.py" --ps_dir="$dir/ckpt" --worker_dir="$dir/pushes" --json 2>&1)
  check_rc=$?
  set -e
  counts=$(echo "$check_out" | grep '^{' | tail -1 || true)
  if [ "$check_rc" != 0 ] || [ -z "$counts" ]; then
    problems+=("the update checker failed (exit $check_rc):")
    while IFS= read -r l; do problems+=("  $l"); done <<< "$(echo "$check_out" | grep -v '^{' | head -8)"
  fi
  if [ -n "$counts" ]; then
    c() { local m; m=$(echo "$counts" | grep -o "\"$1\": [0-9]*" | grep -o '[0-9]*$' || true); echo "${m:-0}"; }
    t_checked=$(c updates_checked); t_undone=$(c undone); t_lost=$(c lost); t_doubled=$(c doubled)
    t_acked=$(c acknowledged)
    upd_checked=$((upd_checked + t_checked)); upd_undone=$((upd_undone + t_undone))
    upd_lost=$((upd_lost + t_lost)); upd_doubled=$((upd_doubled + t_doubled)); upd_acked=$((upd_acked + t_acked))
    updates="; updates: $t_checked checked, $t_undone undone by the restore, lost $t_lost, doubled $t_doubled"
  fi

  if [ ${#problems[@]} = 0 ]; then
    passed=$((passed + 1))
    [ "$trial_ps_after_ckpt" = 1 ] && kills_ps_after_ckpt=$((kills_ps_after_ckpt + 1))
    sparse_rows_restored=$((sparse_rows_restored + trial_rows_restored))
    echo "trial $t: $what: passed in $secs s; drawn step $kill_step; ps: received=$rec applied=$ap stale=$st" \
         "backup=$bk dup=$dup refused=$ref abandoned=$ab discarded=$di$restored$updates"
  else
    [ "$hung" = 1 ] && hangs=$((hangs + 1))
    echo "trial $t: $what: FAILED in $secs s; drawn step $kill_step"
    for m in "${problems[@]}"; do echo "    $m"; done
    failed_dir="/tmp/dtrain_chaos_failed.$seed.$t"
    rm -rf "$failed_dir"; mv "$dir" "$failed_dir"
    echo "    logs: $failed_dir"
  fi
  [ "$keep" = 1 ] || rm -rf "$dir"
  unset code wpid wlog killed
done
echo "chaos: $passed/$trials trials passed, $hangs hangs; killed: ps $kills_ps ($kills_ps_after_ckpt after a" \
     "checkpoint, restoring $sparse_rows_restored sparse rows), worker $kills_worker ($workers_restarted restarted)," \
     "nothing $kills_nothing; pushes acknowledged $upd_acked, updates checked $upd_checked (undone by a restore" \
     "$upd_undone), lost $upd_lost, doubled $upd_doubled"
missing=()
for r in ${require//,/ }; do
  case "$r" in
    ps_after_checkpoint) [ "$kills_ps_after_ckpt" -gt 0 ] || missing+=("no trial killed the ps after a checkpoint and restored it") ;;
    sparse_rows_restored) [ "$sparse_rows_restored" -gt 0 ] || missing+=("no restarted ps restored sparse rows") ;;
    worker_restarted) [ "$workers_restarted" -gt 0 ] || missing+=("no worker was killed and started again") ;;
    worker_lost) [ $((kills_worker - workers_restarted)) -gt 0 ] || missing+=("no worker was killed for good") ;;
    undone) [ "$upd_undone" -gt 0 ] || missing+=("no restore undid acknowledged pushes") ;;
  esac
done
for m in "${missing[@]}"; do echo "chaos: FAILED --require: $m (the seed's draws no longer cover it: pick another)"; done
[ "$passed" = "$trials" ] && [ ${#missing[@]} = 0 ]
