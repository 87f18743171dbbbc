#!/usr/bin/env bash
# The hostile-peer suite (issue 41): dtrain_hostile_peer (tests/hostile_peer.h) attacks ps tasks while they serve.
#  1. A stranger of the ps's own user, holding the cluster's token (and without it), attacks a ps task while 2 sync
#     workers (on this host: their data goes through shared memory) train the mlp, every scenario again and again
#     for the whole run: calls without or with a wrong token, registrations for ids outside the spec and for the
#     honest workers with a config not theirs, the honest workers' calls and shm/TCP offers with forged sessions,
#     messages past gRPC's 8 MiB, connections to the shm socket and the TCP lane port that stay silent, send half a
#     frame, an absurd length or a made-up ticket. Checks: every process exits 0, the final values equal bit for bit
#     those of the same run without the attacker (dtrain_eval --export, tests/compare_values.py --tol 0), the ps's
#     peak memory (VmHWM) within 96 MiB of the quiet run's (see below), every scenario refused (the tool exits 1 on any answer
#     that is not a refusal: the lines name it) with the answers expected of each, and the ps log names what it
#     refused.
#  2. A worker with a session (the tool registers as the chief of a ps task of its own, --max_push_rows and
#     --max_pull_rows 1000) sends pushes and pulls with out-of-range keys, offsets, tables and ids, rows past the
#     limits, references past its shared segment and to segments never sent, TCP frames claiming 6 GiB or absurd
#     lengths. Checks: every push and pull refused by name, the task's values unchanged bit for bit (nothing of it
#     applied), the ps exits 0 and its peak memory stays within 64 MiB of the quiet run's.
#  3. The checks can fail: against a ps task without a token, the tool reports the unauthenticated calls accepted
#     and exits 1.
# The attacker is started once both workers have registered: before that, a Done naming a worker that has no
# session yet is taken from anyone with the token (by design, for a worker refused at Register; see docs/
# security.md). About 40 s on 2 cores. Needs Fashion-MNIST: exit 77 without (exit 1 with DTRAIN_REQUIRE_DEPS=1).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BIN="${DTRAIN_BIN_DIR:-$ROOT/build/bin}"
source "$(dirname "$0")/skipping.sh"
for b in dtrain_ps dtrain_worker dtrain_eval dtrain_hostile_peer; do
  [ -x "$BIN/$b" ] || { echo "FAIL: $BIN/$b not built (set DTRAIN_BIN_DIR)"; exit 1; }
done
[ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] ||
  skip "dataset-fashion-mnist is not installed (scripts/install_deps.sh)"
/usr/bin/python3 -c "import numpy" 2>/dev/null || skip "/usr/bin/python3 cannot import numpy"
source "$(dirname "$0")/checks.sh"
passed=0 failed=0
make_test_dir dtrain_hostile_peer_test
STEPS=${HOSTILE_STEPS:-2500}
head -c 32 /dev/urandom | base64 >"$dir/token"
chmod 600 "$dir/token"

# watch_hwm PID NAME: records the process's peak memory (VmHWM, kB) in $dir/NAME.hwm while it runs.
watch_hwm() {
  local pid=$1 name=$2
  ( while kill -0 "$pid" 2>/dev/null; do
      awk '/VmHWM/ {print $2}' "/proc/$pid/status" >"$dir/$name.hwm.tmp" 2>/dev/null &&
        mv "$dir/$name.hwm.tmp" "$dir/$name.hwm"
      sleep 0.2
    done ) &
  bg+=($!)
}

# run NAME ATTACK: 1 ps + 2 sync workers, $STEPS steps (about 10 s on one core); with ATTACK=1 the stranger attacks while they train.
run() {
  local name=$1 attack=$2 rc=0 p ports
  IFS=, read -r -a ports < <(python3 "$ROOT/scripts/free_ports.py" 4)
  local cluster=(--ps_hosts="127.0.0.1:${ports[0]}" --worker_hosts="127.0.0.1:${ports[1]},127.0.0.1:${ports[2]}")
  local pids=()
  "$BIN/dtrain_ps" --job_name=ps --task_index=0 "${cluster[@]}" --max_run_secs=120 --tcp_port="${ports[3]}" \
    --auth_token_file="$dir/token" --checkpoint_dir="$dir/$name.ckpt" >"$dir/$name.ps.log" 2>&1 &
  local ps_pid=$!
  bg+=("$ps_pid")
  watch_hwm "$ps_pid" "$name"
  wait_for_line "$dir/$name.ps.log" "listening on" 30 || { echo "FAIL: $name: the ps did not start"; exit 1; }
  for i in 1 0; do
    timeout 120 "$BIN/dtrain_worker" --job_name=worker --task_index=$i "${cluster[@]}" --model=mlp --mode=sync \
      --train_steps=$STEPS --batch_size=50 --threads=1 --seed=7 --log_every=100 --auth_token_file="$dir/token" \
      >"$dir/$name.w$i.log" 2>&1 &
    pids+=($!)
  done
  local attackers=() kind
  if [ "$attack" = 1 ]; then
    # Both workers have registered once each has logged a step.
    for i in 0 1; do
      wait_for_line "$dir/$name.w$i.log" "^step [0-9]" 60 || { echo "FAIL: $name: worker $i did not start"; exit 1; }
    done
    # Two attackers: the gRPC calls (rounds of milliseconds) and the lanes (rounds of seconds: the ps closes a
    # silent connection after 2 s), each repeating its scenarios until the workers are done.
    for kind in grpc lanes; do
      local scenarios=no_token,wrong_token,register_outside,register_honest,session_forgery,offer_flood,oversize
      [ "$kind" = lanes ] && scenarios=shm_stranger,tcp_stranger
      "$BIN/dtrain_hostile_peer" "${cluster[@]}" --auth_token_file="$dir/token" --ps_pid="$ps_pid" \
        --tcp_port="${ports[3]}" --scenarios="$scenarios" --secs=120 --stop_file="$dir/$name.stop" \
        >"$dir/$name.attack.$kind" 2>&1 &
      attackers+=($!)
      bg+=($!)
    done
  fi
  for p in "${pids[@]}"; do wait "$p" || rc=$?; done
  if [ "$attack" = 1 ]; then
    touch "$dir/$name.stop"
    local arc=0 rounds
    for p in "${attackers[@]}"; do wait "$p" || arc=$?; done
    cat "$dir/$name.attack.grpc" "$dir/$name.attack.lanes" >"$dir/$name.attack"
    grep -v '^  ' "$dir/$name.attack" || true
    check "$name: the attackers found nothing accepted (exit $arc)" test "$arc" = 0
    for kind in grpc lanes; do
      rounds=$(grep -o "^hostile rounds=[0-9]*" "$dir/$name.attack.$kind" | tr -dc 0-9)
      check "$name: the $kind attacker ran its scenarios again and again while the workers trained ($rounds rounds)" \
        test "${rounds:-0}" -ge 2
    done
  fi
  wait "$ps_pid" || rc=$?
  check "$name: every process exits 0" test "$rc" = 0
  [ "$rc" = 0 ] || tail -n 5 "$dir/$name".*.log
  timeout 60 "$BIN/dtrain_eval" --checkpoint="$dir/$name.ckpt" --model=mlp --skip_eval --export="$dir/$name.npz" \
    >"$dir/$name.export.log" 2>&1 || { echo "FAIL: $name: dtrain_eval --export"; tail -3 "$dir/$name.export.log"; }
}

# expect FILE SCENARIO ANSWER...: the scenario's line shows at least one of each answer and nothing accepted.
expect() {
  local file=$1 scenario=$2 line a ok=0
  shift 2
  line=$(grep "^hostile $scenario: " "$file" || true)
  [[ "$line" == *" accepted=0 "* ]] && [[ "$line" =~ refused=[1-9] ]] || ok=1
  for a in "$@"; do [[ "$line" == *[=,]"$a:"* ]] || { echo "  $scenario: no '$a'"; ok=1; }; done
  return $ok
}

run quiet 0
run attacked 1
check "the attacked run's values equal the quiet run's, bit for bit" \
  /usr/bin/python3 "$ROOT/tests/compare_values.py" "attacked vs quiet" "$dir/attacked.npz" "$dir/quiet.npz" --tol 0
quiet_kb=$(cat "$dir/quiet.hwm") attacked_kb=$(cat "$dir/attacked.hwm")
echo "ps peak memory (VmHWM): quiet $((quiet_kb / 1024)) MiB, attacked $((attacked_kb / 1024)) MiB"
# A ps built with AddressSanitizer (DTRAIN_BIN_DIR pointing at a build-asan) keeps freed memory in quarantine:
# its peak says nothing about what the ps holds, and the memory checks are left out (its reports fail the run).
sanitized=0
ldd "$BIN/dtrain_ps" 2>/dev/null | grep -q libasan && sanitized=1
memory_check() {
  if [ "$sanitized" = 1 ]; then echo "skipped (the ps is built with AddressSanitizer): $1"; else check "$@"; fi
}
# 96 MiB rather than the idle test's 64: gRPC receives a message past its 8 MiB limit in full before it refuses
# it, so each oversize round costs the ps about 17 MB for a moment, and glibc keeps such freed buffers until the
# ps's next malloc_trim (every 10 s). Measured on an idle ps under that scenario alone: a plateau of about 80 MiB
# above its start after 1,600 rounds, RSS back to 30 MiB above its start after the trim. The other scenarios
# cost the ps 1-2 MiB.
memory_check "the attacked ps's peak memory stays within 96 MiB of the quiet run's" \
  test $((attacked_kb - quiet_kb)) -lt $((96 * 1024))
a="$dir/attacked.attack"
check "no token: refused" expect "$a" no_token GetStats:UNAUTHENTICATED Register:UNAUTHENTICATED \
  "Control(drain):UNAUTHENTICATED"
check "a wrong token: refused" expect "$a" wrong_token GetStats:UNAUTHENTICATED Register:UNAUTHENTICATED
check "registrations outside the spec: refused" expect "$a" register_outside id-1:INVALID_ARGUMENT \
  id2:INVALID_ARGUMENT id4096:INVALID_ARGUMENT
check "registrations as the honest workers with another config: refused" expect "$a" register_honest \
  worker0:FAILED_PRECONDITION worker1_chief:FAILED_PRECONDITION
check "forged sessions: refused" expect "$a" session_forgery Heartbeat:PERMISSION_DENIED Pull:PERMISSION_DENIED \
  Push:PERMISSION_DENIED Done:PERMISSION_DENIED
check "offers for the honest workers: refused for their session" expect "$a" offer_flood \
  AttachShm:PERMISSION_DENIED AttachTcp:PERMISSION_DENIED
check "messages past gRPC's limit: refused" expect "$a" oversize "Push(8MiB+64KiB):RESOURCE_EXHAUSTED" \
  "Pull(1.05M ids):RESOURCE_EXHAUSTED"
# (The tool counts a connection refused only when the ps closed it within 5 s, after a Welcome that refuses if
# one came.)
check "strangers on the shm socket: closed" expect "$a" shm_stranger silent half_frame absurd_length \
  "made_up_ticket:welcome PERMISSION_DENIED then closed" segment_before_hello
check "strangers on the TCP lane port: closed" expect "$a" tcp_stranger silent half_header absurd_payload_length \
  bulk_on_hello "made_up_ticket:welcome PERMISSION_DENIED then closed"
check "the ps log names the refused lanes" \
  grep -q "refused a shared-memory connection: PERMISSION_DENIED: process [0-9]* presented no valid ticket" \
  "$dir/attacked.ps.log"
offers() { grep -o "shared memory: [0-9]* attachments offered" "$1" | tr -dc 0-9; }
echo "shared-memory attachments offered: quiet $(offers "$dir/quiet.ps.log"), attacked $(offers "$dir/attacked.ps.log")"
check "no honest worker was cut off: as many attachments offered as in the quiet run" \
  test "$(offers "$dir/attacked.ps.log")" = "$(offers "$dir/quiet.ps.log")"

# 2. A worker with a session, on a ps task of its own.
IFS=, read -r -a ports < <(python3 "$ROOT/scripts/free_ports.py" 3)
own=(--ps_hosts="127.0.0.1:${ports[0]}" --worker_hosts="127.0.0.1:${ports[1]}")
"$BIN/dtrain_ps" --job_name=ps --task_index=0 "${own[@]}" --max_run_secs=60 --tcp_port="${ports[2]}" \
  --auth_token_file="$dir/token" --max_push_rows=1000 --max_pull_rows=1000 >"$dir/own.ps.log" 2>&1 &
own_pid=$!
bg+=("$own_pid")
watch_hwm "$own_pid" own
wait_for_line "$dir/own.ps.log" "listening on" 30 || { echo "FAIL: own: the ps did not start"; exit 1; }
orc=0
"$BIN/dtrain_hostile_peer" --own "${own[@]}" --auth_token_file="$dir/token" --tcp_port="${ports[2]}" \
  --max_push_rows=1000 --max_pull_rows=1000 --secs=2 >"$dir/own.attack" 2>&1 || orc=$?
grep -v '^  ' "$dir/own.attack" || true
check "own: every hostile push and pull refused, the values unchanged (exit $orc)" test "$orc" = 0
prc=0
wait "$own_pid" || prc=$?
check "own: the ps exits 0" test "$prc" = 0
o="$dir/own.attack"
check "own: gRPC pushes refused" expect "$o" push_bad_refs unknown_key:INVALID_ARGUMENT \
  past_slice_end:INVALID_ARGUMENT ids_outside_table:INVALID_ARGUMENT rows_past_max_push_rows:RESOURCE_EXHAUSTED \
  nan_gradient:INVALID_ARGUMENT as_worker_outside:INVALID_ARGUMENT other_session:PERMISSION_DENIED
check "own: gRPC pulls refused" expect "$o" pull_bad_refs unknown_table:INVALID_ARGUMENT \
  ids_outside_table:INVALID_ARGUMENT ids_past_max_pull_rows:RESOURCE_EXHAUSTED
check "own: shm references refused" expect "$o" shm_bad_refs "other_identity:welcome PERMISSION_DENIED" \
  past_segment:FAILED_PRECONDITION segment_never_sent:FAILED_PRECONDITION \
  rows_past_max_push_rows:RESOURCE_EXHAUSTED "rows_2^40" "pull_ids_2^40" pull_past_segment
check "own: TCP frames refused" expect "$o" tcp_bad_frames "other_identity:welcome PERMISSION_DENIED" \
  rows_past_max_push_rows:RESOURCE_EXHAUSTED "rows_2^28_claimed:reading past the claimed bytes" \
  "pull_ids_2^28_claimed:RESOURCE_EXHAUSTED" bulk_not_its_size:closed absurd_payload_length:closed
check "own: the refusals name their limits" grep -q "refused (--max_push_rows)" "$o"
check "own: the ps log names the pull past --max_pull_rows" grep -q "refused (--max_pull_rows)" "$dir/own.ps.log"
own_kb=$(cat "$dir/own.hwm")
echo "ps peak memory (VmHWM) under the worker's attack: $((own_kb / 1024)) MiB (6 GiB and 2^40 rows claimed)"
memory_check "own: the ps's peak memory stays within 64 MiB of the quiet run's" test $((own_kb - quiet_kb)) -lt $((64 * 1024))

# 3. The checks can fail: a ps without a token takes the calls that carry none, and the tool says so.
IFS=, read -r -a ports < <(python3 "$ROOT/scripts/free_ports.py" 2)
open_ps=(--ps_hosts="127.0.0.1:${ports[0]}" --worker_hosts="127.0.0.1:${ports[1]}")
"$BIN/dtrain_ps" --job_name=ps --task_index=0 "${open_ps[@]}" --max_run_secs=20 >"$dir/open.ps.log" 2>&1 &
open_pid=$!
bg+=("$open_pid")
wait_for_line "$dir/open.ps.log" "listening on" 30 || { echo "FAIL: open: the ps did not start"; exit 1; }
nrc=0
"$BIN/dtrain_hostile_peer" "${open_ps[@]}" --scenarios=no_token --secs=0 >"$dir/open.attack" 2>&1 || nrc=$?
kill "$open_pid" 2>/dev/null || true
check "a ps without a token: the tool reports the calls accepted and exits 1" \
  bash -c "[ $nrc = 1 ] && grep -q 'FIRST ACCEPTED: GetStats' '$dir/open.attack'"

echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
