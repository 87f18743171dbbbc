#!/usr/bin/env bash
# A network partition, tested: 2 ps tasks and 2 sync workers, each on its own emulated host (network namespaces on
# a bridge, scripts/netns_hosts.sh), training the MLP with checkpoints, the ps tasks' applied journals and the
# workers' push journals. Twice a link is cut for $PARTITION_SECS s (8), longer than the workers' RPC deadline
# (--rpc_timeout_secs=2) and than the ps tasks' lease (--worker_timeout_secs=4), then healed: frames between the two
# hosts silently vanish, as on a failed link, while each still reaches every other host (netns_hosts.sh cut/heal).
#   1. worker 1 <-> ps task 1;
#   2. the chief (worker 0) <-> ps task 0, the coordinator.
# What each side must do, checked from the logs and reported:
#   - the ps task across the cut declares the worker lost after its lease ("worker N lost");
#   - the worker waits: its calls across the cut end at their deadline and are retried (--rpc_retry_secs=30, more
#     than the partition); once healed, the ps task answers that it has no session for it, so the worker connects
#     again ("connecting again"), rejoins ("worker N is back") and trains to the end;
#   - the others: cut from the coordinator (partition 2), the chief is lost to the step decisions and worker 1 trains
#     on alone (the global step advances during the partition: checked). Cut from ps task 1 only (partition 1),
#     worker 1 still heartbeats ps task 0, which keeps waiting for its commits: the step may stall until the link
#     is healed (reported, not required either way);
#   - every process exits 0, training reaches its last step, and scripts/check_updates.py proves from the journals
#     that no acknowledged push was lost or applied twice.
# Needs root and network namespaces (exit 77 otherwise; exit 1 with DTRAIN_REQUIRE_DEPS=1) and Fashion-MNIST.
# Removes every namespace, process and file it made, also on failure. About 80 s on 2 cores.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BIN="${DTRAIN_BIN_DIR:-$ROOT/build/bin}"
NETNS="$ROOT/scripts/netns_hosts.sh"
PARTITION_SECS="${PARTITION_SECS:-8}"
source "$(dirname "$0")/skipping.sh"
if ! why="$(NETNS_CHECK_TBF=0 "$NETNS" check)"; then skip "$why"; fi
[ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] ||
  skip "dataset-fashion-mnist is not installed (scripts/install_deps.sh)"
for b in dtrain_ps dtrain_worker; do [ -x "$BIN/$b" ] || { echo "FAIL: $BIN/$b not built"; exit 1; }; done

NAME="dtpart$$-$RANDOM"
dir="$(mktemp -d /tmp/dtrain_partition_test.XXXXXX)"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  "$NETNS" down "$NAME" >/dev/null 2>&1 || true
  if [ -n "${KEEP:-}" ]; then echo "kept $dir"; else rm -rf "$dir"; fi
}
trap cleanup EXIT
trap 'exit 143' TERM INT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# Hosts: 0 ps 0, 1 ps 1, 2 the chief, 3 worker 1.
"$NETNS" up "$NAME" 4 --subnet=10.78.$((RANDOM % 200)) >"$dir/hosts"
addr() { sed -n "$(($1 + 1))p" "$dir/hosts" | awk '{print $2}'; }
cluster=(--ps_hosts="$(addr 0):2222,$(addr 1):2222" --worker_hosts="$(addr 2):2222,$(addr 3):2222")
steps=1000
for i in 0 1; do
  "$NETNS" exec "$NAME" "$i" timeout 300 "$BIN/dtrain_ps" --job_name=ps --task_index=$i "${cluster[@]}" \
    --worker_timeout_secs=4 --checkpoint_dir="$dir/ckpt" --save_checkpoint_steps=100 --journal_applied \
    >"$dir/ps$i.log" 2>&1 &
  pids+=($!)
done
for i in 1 0; do
  "$NETNS" exec "$NAME" $((i + 2)) timeout 300 "$BIN/dtrain_worker" --job_name=worker --task_index=$i \
    "${cluster[@]}" --model=mlp --mode=sync --train_steps=$steps --threads=1 --log_every=10 --seed=3 \
    --debug_step_delay_ms=20 --rpc_timeout_secs=2 --rpc_retry_secs=30 --startup_wait_secs=60 \
    --push_journal_dir="$dir/pushes" >"$dir/w$i.log" 2>&1 &
  pids+=($!)
done

# The newest global step a worker printed ("step N, loss = ...").
step_of() { { grep -o '^step [0-9]*, loss' "$dir/w$1.log" || true; } | tail -1 | grep -o '[0-9]*' || echo 0; }
newest() { local a b; a=$(step_of 0); b=$(step_of 1); echo $((a > b ? a : b)); }
wait_step() {  # wait_step STEP: until a worker printed it (60 s at most)
  local until=$((SECONDS + 60))
  while [ "$(newest)" -lt "$1" ]; do
    [ $SECONDS -lt $until ] || { fail "step $1 not reached within 60 s (at $(newest))"; return 1; }
    sleep 0.2
  done
}
# partition NUMBER WORKER PS_TASK MUST_ADVANCE: cut worker <-> ps task for PARTITION_SECS, heal, and check what
# both sides did (MUST_ADVANCE=1: the others trained on meanwhile).
partition() {
  local n=$1 w=$2 t=$3 must=$4 before during after
  before=$(newest)
  "$NETNS" cut "$NAME" $((w + 2)) "$t"
  echo "partition $n: worker $w <-> ps task $t cut at step $before for $PARTITION_SECS s"
  sleep "$PARTITION_SECS"
  during=$(newest)
  "$NETNS" heal "$NAME" $((w + 2)) "$t"
  echo "partition $n: healed at step $during (the others trained $((during - before)) steps meanwhile)"
  if [ "$must" = 1 ] && [ "$during" -le $((before + 10)) ]; then
    fail "partition $n: sync training did not go on without worker $w"
  fi
  grep -q "worker $w lost" "$dir/ps$t.log" || fail "partition $n: ps task $t did not declare worker $w lost"
  local until=$((SECONDS + 40))
  while ! grep -q "worker $w is back" "$dir/ps$t.log"; do
    [ $SECONDS -lt $until ] || { fail "partition $n: worker $w did not rejoin ps task $t within 40 s"; return 1; }
    sleep 0.2
  done
  after=$(newest)
  echo "partition $n: worker $w rejoined ps task $t at step $after"
}
{ wait_step 100 && partition 1 1 1 0; } || true
{ wait_step $(($(newest) + 100)) && partition 2 0 0 1; } || true

names=(ps0 ps1 w1 w0)
for i in 0 1 2 3; do
  rc=0; wait "${pids[$i]}" || rc=$?
  [ "$rc" = 0 ] || { fail "${names[$i]} exited $rc"; tail -5 "$dir/${names[$i]}.log"; }
done
pids=()
for i in 0 1; do
  grep -q "training reached step $steps of $steps" "$dir/ps$i.log" || fail "ps task $i did not reach step $steps"
  echo "ps task $i: $(grep -c 'worker [0-9]* lost:' "$dir/ps$i.log" || true) declared lost, $(grep -c 'is back' "$dir/ps$i.log" || true) back;" \
       "$(grep -o 'accounting: .*' "$dir/ps$i.log" | tail -1)"
done
for w in 0 1; do
  echo "worker $w: connected again $(grep -c 'connecting again' "$dir/w$w.log" || true) times"
done
grep -q "connecting again" "$dir/w1.log" || fail "worker 1 never connected again"
grep -q "connecting again" "$dir/w0.log" || fail "the chief never connected again"
check_rc=0
python3 "$ROOT/scripts/check_updates.py" --ps_dir="$dir/ckpt" --worker_dir="$dir/pushes" || check_rc=$?
[ "$check_rc" = 0 ] || fail "the update checker found lost or doubled updates (exit $check_rc)"
"$NETNS" down "$NAME"
if [ "$failures" = 0 ]; then echo "1 passed, 0 failed"; exit 0; fi
echo "0 passed, 1 failed ($failures checks)"
exit 1
