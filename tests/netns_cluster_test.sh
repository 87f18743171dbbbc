#!/usr/bin/env bash
# A cluster across a real (emulated) network: three hosts in network namespaces on a bridge
# (scripts/netns_hosts.sh), every link capped at 1 Gbit/s with tc tbf; dtrain_ps on host 0 (10.77.0.1), one
# dtrain_worker on each of hosts 1 and 2. Trains the MLP sync, then async, then sync with one worker (the early
# apply measured and chosen by the worker: --apply_early=auto); checks every exit code, the chief's
# test accuracy, that the data went over the TCP lanes (--transport=auto across hosts) and the traffic through the
# shaped links (tbf counters on the ps host). Removes
# every namespace, process and file it made, also on failure or timeout. Needs root (exit 77 otherwise, or
# where the kernel lacks namespaces, veth, bridge or tbf).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BIN="${DTRAIN_BIN_DIR:-$ROOT/build/bin}"
NETNS="$ROOT/scripts/netns_hosts.sh"

source "$(dirname "$0")/skipping.sh"
if ! why="$("$NETNS" check)"; then skip "$why"; fi
for b in dtrain_ps dtrain_worker; do
  [ -x "$BIN/$b" ] || { echo "FAIL: $BIN/$b not built"; exit 1; }
done

NAME="dtnet$$-$RANDOM"  # unique: parallel runs never share namespaces
dir="$(mktemp -d /tmp/dtrain_netns_test.XXXXXX)"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  "$NETNS" down "$NAME" >/dev/null 2>&1 || true
  rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 143' TERM INT

"$NETNS" up "$NAME" 3 --bandwidth=1gbit >"$dir/hosts"
cat "$dir/hosts"
read -r _ A0 < <(sed -n 1p "$dir/hosts"); read -r _ A1 < <(sed -n 2p "$dir/hosts"); read -r _ A2 < <(sed -n 3p "$dir/hosts")
cluster=(--ps_hosts="$A0:2222" --worker_hosts="$A1:2222,$A2:2222")

failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# run_cluster MODE STEPS: one ps and two workers, each in its own namespace, each bounded by timeout.
run_cluster() {
  local mode="$1" steps="$2" logs="$dir/$1"
  mkdir -p "$logs"
  pids=()
  "$NETNS" exec "$NAME" 0 timeout 240 "$BIN/dtrain_ps" --job_name=ps --task_index=0 "${cluster[@]}" \
    --max_run_secs=200 >"$logs/ps.log" 2>&1 &
  pids+=($!)
  for k in 1 0; do
    "$NETNS" exec "$NAME" $((k + 1)) timeout 240 "$BIN/dtrain_worker" --job_name=worker --task_index=$k \
      "${cluster[@]}" --model=mlp --mode="$mode" --train_steps="$steps" --log_every=50 --startup_wait_secs=60 \
      >"$logs/worker_$k.log" 2>&1 &
    pids+=($!)
  done
  local names=(ps worker_1 worker_0) rc
  for i in 0 1 2; do
    rc=0; wait "${pids[$i]}" || rc=$?
    [ "$rc" = 0 ] || fail "$mode: ${names[$i]} exited with $rc"
  done
  pids=()
  for f in ps worker_0 worker_1; do echo "--- $mode $f"; tail -n 8 "$logs/$f.log"; done
  local acc
  acc="$(sed -n 's/^step [0-9]*: test accuracy = \([0-9.]*\) (10000 examples)$/\1/p' "$logs/worker_0.log" | tail -1)"
  if [ -z "$acc" ]; then
    fail "$mode: no final test accuracy line from the chief"
  elif ! awk -v a="$acc" 'BEGIN { exit !(a >= 0.60 && a <= 1.0) }'; then
    fail "$mode: test accuracy $acc < 0.60"
  fi
  # Both workers reached the ps over the network: the chief's log names the addresses it used; the data went
  # over TCP lanes (--transport=auto across hosts), and the ps's lanes carried it.
  grep -q "$A0:2222" "$logs/worker_0.log" || fail "$mode: the chief's log does not mention ps $A0:2222"
  for k in 0 1; do
    grep -q "data over TCP lanes" "$logs/worker_$k.log" || fail "$mode: worker $k did not use the TCP lanes"
  done
  grep -q "TCP lanes: 2 attachments offered, 4 lanes accepted" "$logs/ps.log" ||
    fail "$mode: the ps's log does not show both workers' TCP lanes"
}

run_cluster sync 150
run_cluster async 300

# One worker (host 1) on the ps across the link, sync: the worker measures the early apply against the usual
# order (--apply_early=auto, the default: after 10 steps, 12 steps each) and keeps the faster; the ps grants it
# (the worker is on another host), so the trial's pushes are applied as they arrive.
logs="$dir/one"
mkdir -p "$logs"
one=(--ps_hosts="$A0:2222" --worker_hosts="$A1:2222")
pids=()
"$NETNS" exec "$NAME" 0 timeout 240 "$BIN/dtrain_ps" --job_name=ps --task_index=0 "${one[@]}" --max_run_secs=200 \
  >"$logs/ps.log" 2>&1 &
pids+=($!)
"$NETNS" exec "$NAME" 1 timeout 240 "$BIN/dtrain_worker" --job_name=worker --task_index=0 "${one[@]}" --model=mlp \
  --mode=sync --train_steps=60 --log_every=50 --startup_wait_secs=60 >"$logs/worker_0.log" 2>&1 &
pids+=($!)
for i in 0 1; do
  rc=0; wait "${pids[$i]}" || rc=$?
  [ "$rc" = 0 ] || fail "one worker: process $i exited with $rc"
done
pids=()
grep "early apply" "$logs/ps.log" "$logs/worker_0.log" || true
grep -q "(early apply)" "$logs/ps.log" || fail "one worker: the ps never applied a push as it arrived"
grep -Eq "early apply \(--apply_early=auto\) at step [0-9]+: (on|off): median step" "$logs/worker_0.log" ||
  fail "one worker: the worker made no measured choice"

# Everything the ps sent went through the 1 Gbit/s tbf on its eth0: each of the ~450 pulls moves the MLP's
# 1.6 MB of parameters, so well over 100 MB must have passed through the qdisc.
sent="$("$NETNS" exec "$NAME" 0 tc -s qdisc show dev eth0 | awk '/^qdisc tbf/ {t=1} t && /Sent/ {print $2; exit}')"
echo "ps host: tbf qdisc sent ${sent:-?} bytes"
if [ -z "$sent" ] || [ "$sent" -lt 100000000 ]; then fail "tbf on the ps host passed only ${sent:-no} bytes"; fi

"$NETNS" down "$NAME"
if ip netns list | grep -q "^$NAME-"; then fail "namespaces left behind: $(ip netns list | grep "^$NAME-" | xargs)"; fi
if [ "$failures" = 0 ]; then echo "1 passed, 0 failed"; exit 0; fi
echo "0 passed, 1 failed"
exit 1
