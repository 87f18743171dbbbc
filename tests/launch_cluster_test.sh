#!/usr/bin/env bash
# deploy/launch_cluster.sh end to end.
# On 127.0.0.1: a JSON spec of 1 ps + 2 workers trains the MLP with --ps_args reaching the ps (checkpoints
# appear); a failing ps stops the waiting workers at once (exit 1); Ctrl-C (SIGINT) and the deadline stop every
# task (exit 130 / 124); bad arguments and specs exit 2.
# Across network namespaces (root, scripts/netns_hosts.sh, Debian's openssh-server): sshd runs on two emulated
# hosts with throwaway keys; the launcher runs on a third, starts the ps there and the workers over ssh, trains;
# a failing remote worker fails the launch; SIGTERM to the launcher ends the remote tasks too.
# Every process, namespace and file it made is removed, also on failure.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
export DTRAIN_BIN="${DTRAIN_BIN_DIR:-$ROOT/build/bin}"
# Exit 77 (ctest: Skipped, SKIP_RETURN_CODE) with the reason when what the test needs is not installed (exit 1
# with DTRAIN_REQUIRE_DEPS=1, as under scripts/test.sh).
source "$ROOT/tests/skipping.sh"
if [ ! -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
  skip "dataset-fashion-mnist is not installed (scripts/install_deps.sh)"
fi
if ! command -v python3 >/dev/null; then skip "python3 (scripts/free_ports.py) is not installed"; fi
LAUNCH="$ROOT/deploy/launch_cluster.sh"
NETNS="$ROOT/scripts/netns_hosts.sh"
dir="$(mktemp -d /tmp/dtrain_launch_test.XXXXXX)"
NAME="dtlaunch$$-$RANDOM"
bg=()
made_run_sshd=0
cleanup() {
  for p in "${bg[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  if [ -n "$(ip netns list 2>/dev/null | grep "^$NAME-" || true)" ]; then "$NETNS" down "$NAME" >/dev/null 2>&1 || true; fi
  # Anything of ours still running (every task's command line names $dir).
  for p in $(pgrep -f -- "$dir/" || true); do kill -KILL "$p" 2>/dev/null || true; done
  if [ "$made_run_sshd" = 1 ]; then rmdir /run/sshd 2>/dev/null || true; fi
  rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 143' TERM INT

passed=0; failed=0
check() {  # check NAME CONDITION-COMMAND...
  local name="$1"; shift
  if "$@"; then echo "ok: $name"; passed=$((passed + 1)); else echo "FAIL: $name"; failed=$((failed + 1)); fi
}
# Our tasks still alive: every task (and ssh client) started by a test below has "$dir/" in its command line.
none_left() {
  local left
  for _ in $(seq 50); do
    left="$(pgrep -f -- "(dtrain_ps|dtrain_worker|BatchMode=yes) .*$dir/" || true)"
    [ -z "$left" ] && return 0
    sleep 0.2
  done
  echo "still running:"; ps -o pid,args -p "$(tr '\n' , <<<"$left" | sed 's/,$//')" || true
  return 1
}
wait_for_line() {  # wait_for_line FILE REGEX SECONDS
  for _ in $(seq $(($3 * 5))); do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 0.2; done
  return 1
}

IFS=, read -r p0 p1 p2 <<<"$(python3 "$ROOT/scripts/free_ports.py" 3)"
echo "{\"ps\": [\"127.0.0.1:$p0\"], \"worker\": [\"127.0.0.1:$p1\", \"127.0.0.1:$p2\"]}" >"$dir/cluster.json"

# 1. A whole run; --ps_args reach the ps (it writes checkpoints where told).
rc=0
out="$(timeout 300 "$LAUNCH" --cluster_spec="$dir/cluster.json" --logdir="$dir/logs" \
       --ps_args="--checkpoint_dir=$dir/ckpt --save_checkpoint_steps=100" \
       -- --model=mlp --mode=async --train_steps=200 --log_every=100 2>&1)" || rc=$?
echo "$out"
check "launch exits 0" test "$rc" = 0
check "prints the chief's test accuracy" grep -q "test accuracy = " <<<"$out"
check "a log per task" test -s "$dir/logs/ps_0.log" -a -s "$dir/logs/worker_0.log" -a -s "$dir/logs/worker_1.log"
has_checkpoint() { compgen -G "$dir/ckpt/model.ckpt-*.ps0-of-1" >/dev/null; }
check "--ps_args reached the ps (checkpoint written)" has_checkpoint

# 2. A failing ps: the workers, which would wait 300 s for it, are stopped at once.
start=$SECONDS; rc=0
timeout 120 "$LAUNCH" --cluster_spec="$dir/cluster.json" --logdir="$dir/logs_fail" --ps_args=--no_such_flag \
  -- --model=mlp --train_steps=200 --logdir="$dir/tb_fail" >"$dir/fail.out" 2>&1 || rc=$?
cat "$dir/fail.out"
check "failed ps: exit 1" test "$rc" = 1
check "failed ps: named in the message" grep -q "ps:0@127.0.0.1 exited with" "$dir/fail.out"
check "failed ps: stopped within 60 s (took $((SECONDS - start)) s)" test $((SECONDS - start)) -lt 60
check "failed ps: no task left" none_left

# 3. Ctrl-C: SIGINT to the launcher stops every task (env restores SIGINT, which a background job ignores).
env --default-signal=INT "$LAUNCH" --cluster_spec="$dir/cluster.json" --logdir="$dir/logs_int" \
  --ps_args=--checkpoint_dir="$dir/ckpt_int" -- --model=mlp --train_steps=1000000 --log_every=20 --logdir="$dir/tb_int" >"$dir/int.out" 2>&1 &
launcher=$!; bg+=("$launcher")
check "SIGINT: training started" wait_for_line "$dir/logs_int/worker_0.log" "^step " 60
kill -INT "$launcher"
rc=0; timeout 60 tail --pid="$launcher" -f /dev/null || true
wait "$launcher" || rc=$?
cat "$dir/int.out"
check "SIGINT: exit 130" test "$rc" = 130
check "SIGINT: no task left" none_left

# 4. The deadline.
start=$SECONDS; rc=0
timeout 120 "$LAUNCH" --cluster_spec="$dir/cluster.json" --logdir="$dir/logs_deadline" --deadline_secs=4 \
  --ps_args=--checkpoint_dir="$dir/ckpt_deadline" -- --model=mlp --train_steps=1000000 --logdir="$dir/tb_deadline" >"$dir/deadline.out" 2>&1 || rc=$?
cat "$dir/deadline.out"
check "deadline: exit 124" test "$rc" = 124
check "deadline: said so" grep -q "deadline; stopping 3 running task" "$dir/deadline.out"
check "deadline: no task left" none_left

# 5. Bad input.
echo '{"ps": [], "worker": ["127.0.0.1:1"]}' >"$dir/bad.json"
rc=0; "$LAUNCH" --cluster_spec="$dir/bad.json" -- --model=mlp >"$dir/bad.out" 2>&1 || rc=$?
check "empty ps list refused" test "$rc" = 2 -a -n "$(grep "non-empty 'ps' list" "$dir/bad.out")"
echo '{"ps": ["nohostport"], "worker": ["127.0.0.1:1"]}' >"$dir/bad2.json"
rc=0; "$LAUNCH" --cluster_spec="$dir/bad2.json" >"$dir/bad2.out" 2>&1 || rc=$?
check "address without port refused" test "$rc" = 2 -a -n "$(grep "is not host:port" "$dir/bad2.out")"
rc=0; "$LAUNCH" --cluster_spec="$dir/cluster.json" --deadline_secs=soon >"$dir/bad3.out" 2>&1 || rc=$?
check "bad --deadline_secs refused" test "$rc" = 2 -a -n "$(grep "deadline_secs must be" "$dir/bad3.out")"

# 6. The ssh path across network namespaces.
ssh_reason=""
if ! ssh_reason="$("$NETNS" check)"; then :
elif [ ! -x /usr/sbin/sshd ] || ! command -v ssh-keygen >/dev/null; then
  ssh_reason="no sshd (apt-get install openssh-server)"
else
  ssh_reason=""
fi
if [ -n "$ssh_reason" ]; then
  echo "skipped: the ssh path across namespaces ($ssh_reason)"
else
  "$NETNS" up "$NAME" 3 >"$dir/hosts"
  mapfile -t addr < <(awk '{print $2}' "$dir/hosts")
  mkdir -p "$dir/ssh"
  ssh-keygen -q -t ed25519 -N '' -f "$dir/ssh/host_key"
  ssh-keygen -q -t ed25519 -N '' -f "$dir/ssh/client_key"
  cp "$dir/ssh/client_key.pub" "$dir/ssh/authorized_keys"
  [ -d /run/sshd ] || { mkdir -p /run/sshd; made_run_sshd=1; }
  for k in 1 2; do
    cat >"$dir/ssh/sshd_$k.conf" <<EOF
ListenAddress ${addr[$k]}:22
HostKey $dir/ssh/host_key
PidFile $dir/ssh/sshd_$k.pid
AuthorizedKeysFile $dir/ssh/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
LogLevel ERROR
EOF
    "$NETNS" exec "$NAME" "$k" /usr/sbin/sshd -D -e -f "$dir/ssh/sshd_$k.conf" 2>"$dir/ssh/sshd_$k.log" &
    bg+=($!)
  done
  ssh_opts="-i $dir/ssh/client_key -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR -o ConnectTimeout=5"
  ssh_ready() {
    for _ in $(seq 40); do
      # shellcheck disable=SC2086
      "$NETNS" exec "$NAME" 0 ssh -o BatchMode=yes $ssh_opts "${addr[$1]}" true 2>/dev/null && return 0
      sleep 0.25
    done
    cat "$dir/ssh/sshd_$1.log"; return 1
  }
  check "sshd answers on host 1" ssh_ready 1
  check "sshd answers on host 2" ssh_ready 2
  echo "{\"ps\": [\"${addr[0]}:2222\"], \"worker\": [\"${addr[1]}:2222\", \"${addr[2]}:2222\"]}" >"$dir/net.json"

  rc=0
  out="$(timeout 300 "$NETNS" exec "$NAME" 0 "$LAUNCH" --cluster_spec="$dir/net.json" --logdir="$dir/logs_ssh" \
         --ssh_options="$ssh_opts" -- --model=mlp --mode=sync --train_steps=100 --log_every=50 2>&1)" || rc=$?
  echo "$out"; tail -n 3 "$dir/logs_ssh/worker_1.log"
  check "ssh: launch exits 0" test "$rc" = 0
  check "ssh: chief's test accuracy" grep -q "test accuracy = " <<<"$out"
  check "ssh: remote worker 1 trained on its host" grep -q "worker 1: 100 local steps" "$dir/logs_ssh/worker_1.log"

  rc=0
  timeout 120 "$NETNS" exec "$NAME" 0 "$LAUNCH" --cluster_spec="$dir/net.json" --logdir="$dir/logs_ssh_fail" \
    --ssh_options="$ssh_opts" --ps_args=--checkpoint_dir="$dir/ckpt_ssh_fail" -- --model=no_such_model >"$dir/ssh_fail.out" 2>&1 || rc=$?
  cat "$dir/ssh_fail.out"
  check "ssh: a failing remote worker fails the launch" test "$rc" = 1
  check "ssh: its exit code 2 came back over ssh" grep -qE "worker:[01]@[0-9.]+ exited with 2 " "$dir/ssh_fail.out"
  check "ssh: the ps was stopped" none_left

  "$NETNS" exec "$NAME" 0 "$LAUNCH" --cluster_spec="$dir/net.json" --logdir="$dir/logs_ssh_term" \
    --ssh_options="$ssh_opts" --ps_args=--checkpoint_dir="$dir/ckpt_ssh_term" -- --model=mlp --mode=async --train_steps=1000000 --log_every=20 \
    --logdir="$dir/tb_term" >"$dir/ssh_term.out" 2>&1 &
  launcher=$!; bg+=("$launcher")
  check "ssh SIGTERM: remote training started" wait_for_line "$dir/logs_ssh_term/worker_1.log" "^step " 60
  kill -TERM "$launcher"
  rc=0; timeout 60 tail --pid="$launcher" -f /dev/null || true
  wait "$launcher" || rc=$?
  cat "$dir/ssh_term.out"
  check "ssh SIGTERM: exit 143" test "$rc" = 143
  check "ssh SIGTERM: local and remote tasks ended" none_left
  "$NETNS" down "$NAME"
fi

echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
