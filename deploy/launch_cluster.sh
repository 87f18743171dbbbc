#!/usr/bin/env bash
# Launches every task of a cluster spec: one dtrain_ps per "ps" address and one dtrain_worker per "worker"
# address, each on its host, and watches them until all have ended.
#
#   deploy/launch_cluster.sh --cluster_spec=cluster.json [--remote_bin=/opt/dtrain/bin] [--logdir=DIR] \
#       [--ps_args="--checkpoint_dir=/ckpt --save_checkpoint_steps=500"] [--deadline_secs=86400] \
#       [--ssh_options="-i key -F ssh_config"] -- --mode=sync --model=cnn --train_steps=2000
#   (--model=PATH.onnx: an ONNX file, at the same absolute path on every worker host; checked here first)
#   cluster.json: {"ps": ["10.0.0.1:2222"], "worker": ["10.0.0.2:2222", "10.0.0.3:2222"]}
#
# - Tasks whose host is 127.x, localhost, this host's name or one of its addresses run here; the others over
#   ssh (key-based, BatchMode; the binaries at --remote_bin on every host, default: the local build path).
# - Every task gets the same cluster in TF_CONFIG (and its own task), so any of them may start first. Flags
#   after -- go to every worker; --ps_args (space-separated flags) to every ps task.
# - When a task fails (non-zero exit), the others get up to 3 s to end by themselves (a refused configuration
#   ends every task, and a remote task's code comes back later than a local one's), one line per task with its
#   exit code; every task still running is then stopped (SIGTERM, SIGKILL after --grace_secs) and the launcher
#   exits 1. Ctrl-C / SIGTERM stop every task the same way (exit 130 / 143). After
#   --deadline_secs every task is stopped and the exit code is 124. A remote task is stopped by closing its ssh
#   connection: a small watcher on the remote side ends the task when its ssh stdin closes, so a launcher that
#   dies, even by SIGKILL, leaves no task behind on other hosts.
# - Logs: DIR/ps_<i>.log and DIR/worker_<i>.log (default DIR: a new /tmp/dtrain_launch.XXXXXX). On success
#   prints the chief's last test accuracy line. Exit 2 on bad arguments or a bad spec.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
SPEC=""; REMOTE_BIN=""; LOGDIR=""; LOCAL_BIN="${DTRAIN_BIN:-$ROOT/build/bin}"
PS_ARGS=""; DEADLINE=86400; GRACE=10; SSH_OPTIONS=""
die() { echo "launch_cluster: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --cluster_spec=*) SPEC="${1#*=}" ;;
    --remote_bin=*) REMOTE_BIN="${1#*=}" ;;
    --logdir=*) LOGDIR="${1#*=}" ;;
    --ps_args=*) PS_ARGS="${1#*=}" ;;
    --deadline_secs=*) DEADLINE="${1#*=}" ;;
    --grace_secs=*) GRACE="${1#*=}" ;;
    --ssh_options=*) SSH_OPTIONS="${1#*=}" ;;
    --) shift; break ;;
    *) die "unknown argument '$1' (flags for the workers go after --)" ;;
  esac
  shift
done
[ -n "$SPEC" ] || die "--cluster_spec=FILE.json is required"
[ -r "$SPEC" ] || die "cannot read cluster spec '$SPEC'"
[[ "$DEADLINE" =~ ^[0-9]+$ ]] && [ "$DEADLINE" -gt 0 ] || die "--deadline_secs must be a positive integer, got '$DEADLINE'"
[[ "$GRACE" =~ ^[0-9]+$ ]] || die "--grace_secs must be a non-negative integer, got '$GRACE'"
[ -d "$LOCAL_BIN" ] && LOCAL_BIN="$(cd "$LOCAL_BIN" && pwd)"  # absolute: remote shells start in $HOME
[ -n "$REMOTE_BIN" ] || REMOTE_BIN="$LOCAL_BIN"
read -r -a ps_args <<<"$PS_ARGS"
read -r -a ssh_options <<<"$SSH_OPTIONS"
# A --model=PATH.onnx must be readable here; it is passed as an absolute path, at which every host must have it.
# shellcheck source=scripts/model_args.sh
source "$ROOT/scripts/model_args.sh"
resolve_model_args launch_cluster "$@"
set -- "${MODEL_ARGS[@]}"

# One line per task: "job index host"; then the cluster as one JSON line. Python's standard library parses.
spec_out="$(python3 - "$SPEC" <<'PY'
import json, sys
try:
    spec = json.load(open(sys.argv[1]))
except Exception as e:
    sys.exit("launch_cluster: %s is not valid JSON: %s" % (sys.argv[1], e))
if not isinstance(spec, dict):
    sys.exit("launch_cluster: %s must hold a JSON object {\"ps\": [...], \"worker\": [...]}" % sys.argv[1])
for job in ("ps", "worker"):
    addrs = spec.get(job)
    if not isinstance(addrs, list) or not addrs:
        sys.exit("launch_cluster: cluster spec needs a non-empty '%s' list" % job)
    for i, a in enumerate(addrs):
        if not isinstance(a, str) or ":" not in a or not a.rsplit(":", 1)[1].isdigit():
            sys.exit("launch_cluster: %s[%d] = %r is not host:port" % (job, i, a))
        print(job, i, a.rsplit(":", 1)[0].strip("[]"))
print("cluster", json.dumps({"ps": spec["ps"], "worker": spec["worker"]}))
PY
)" || exit 2
cluster_json="$(sed -n 's/^cluster //p' <<<"$spec_out")"
[ -n "$LOGDIR" ] || LOGDIR="$(mktemp -d /tmp/dtrain_launch.XXXXXX)"
mkdir -p "$LOGDIR"

my_addresses=" $(hostname -I 2>/dev/null || true) "
is_local() {
  case "$1" in 127.*|localhost|::1|"$(hostname)"|"$(hostname -f 2>/dev/null)") return 0 ;; esac
  [[ "$my_addresses" == *" $1 "* ]]
}

# Remote tasks read their ssh stdin from this FIFO; the launcher holds its write end and never writes. When
# the launcher ends or kills an ssh client, the remote watcher sees end-of-file and stops the task.
tmp="$(mktemp -d /tmp/dtrain_launch_ctl.XXXXXX)"
mkfifo "$tmp/keepalive"
exec {keepalive}<>"$tmp/keepalive"

declare -A name_of=()  # pid → "job:index@host"
timer=""
stop_reason=""
failed=0
exit_code=0
cleanup() {
  for p in "${!name_of[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  [ -z "$timer" ] || kill "$timer" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'stop_reason=interrupted; exit_code=130' INT
trap 'stop_reason=terminated; exit_code=143' TERM
trap 'stop_reason=deadline; exit_code=124' USR1

while read -r job index host; do
  [ "$job" = cluster ] && continue
  tf_config="{\"cluster\": $cluster_json, \"task\": {\"type\": \"$job\", \"index\": $index}}"
  if [ "$job" = ps ]; then cmd=(dtrain_ps "${ps_args[@]}"); else cmd=(dtrain_worker "$@"); fi
  log="$LOGDIR/${job}_${index}.log"
  if is_local "$host"; then
    TF_CONFIG="$tf_config" "$LOCAL_BIN/${cmd[0]}" "${cmd[@]:1}" </dev/null >"$log" 2>&1 {keepalive}>&- &
  else
    task="TF_CONFIG=$(printf %q "$tf_config") $(printf '%q ' "$REMOTE_BIN/${cmd[0]}" "${cmd[@]:1}")"
    # A background job's stdin is /dev/null unless redirected: the watcher reads the ssh stdin through fd 3.
    remote="exec 3<&0; $task </dev/null 3<&- & p=\$!; ( while read -r _ <&3; do :; done; kill -TERM \$p )"
    remote+=" >/dev/null 2>&1 & w=\$!; exec 3<&-; wait \$p; rc=\$?; kill \$w 2>/dev/null; exit \$rc"
    ssh -o BatchMode=yes "${ssh_options[@]}" "$host" "$remote" <"$tmp/keepalive" >"$log" 2>&1 {keepalive}>&- &
  fi
  name_of[$!]="$job:$index@$host"
done <<<"$spec_out"
echo "launched ${#name_of[@]} tasks; logs in $LOGDIR" >&2

# The deadline timer; its sleep ends with it (no stray sleep after the launcher exits).
( trap 'kill "$s" 2>/dev/null; exit 0' TERM; sleep "$DEADLINE" & s=$!; wait "$s"; kill -USR1 $$ ) \
  {keepalive}>&- >/dev/null 2>&1 &
timer=$!

# Stops every task still running: SIGTERM, then SIGKILL after the grace period (bounded).
stop_all() {
  local p
  for p in "${!name_of[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for ((i = 0; i < GRACE * 10; i++)); do
    local alive=0
    for p in "${!name_of[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    [ "$alive" = 0 ] && break
    sleep 0.1
  done
  for p in "${!name_of[@]}"; do kill -KILL "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  name_of=()
}

log_of() { echo "$LOGDIR/$(cut -d@ -f1 <<<"$1" | tr : _).log"; }

# For up to 3 s (or --grace_secs, if shorter), reaps the tasks that end by themselves, one line each.
settle_others() {
  local p i rc
  for ((i = 0; i < (GRACE < 3 ? GRACE : 3) * 10 && ${#name_of[@]} > 0; i++)); do
    for p in "${!name_of[@]}"; do
      kill -0 "$p" 2>/dev/null && continue
      rc=0
      wait "$p" 2>/dev/null || rc=$?
      echo "launch_cluster: ${name_of[$p]} exited with $rc (log: $(log_of "${name_of[$p]}"))" >&2
      unset "name_of[$p]"
    done
    if [ ${#name_of[@]} -gt 0 ]; then sleep 0.1; fi
  done
}

while [ ${#name_of[@]} -gt 0 ]; do
  finished=""
  rc=0
  wait -n -p finished "${!name_of[@]}" || rc=$?
  if [ -n "$stop_reason" ]; then
    echo "launch_cluster: $stop_reason; stopping ${#name_of[@]} running task(s)" >&2
    stop_all
    break
  fi
  [ -n "$finished" ] || continue
  name="${name_of[$finished]}"
  unset "name_of[$finished]"
  if [ "$rc" != 0 ]; then
    echo "launch_cluster: $name exited with $rc (log: $(log_of "$name"))" >&2
    failed=1
    # A refused configuration ends every task of the run by itself (exit 2 on each), and a remote task's code
    # comes back over ssh later than a local one's: let the others end on their own for a moment, and say how
    # each did, so that the task that caused it is named whichever ended first.
    settle_others
    if [ ${#name_of[@]} -gt 0 ]; then
      echo "launch_cluster: stopping ${#name_of[@]} other task(s)" >&2
      stop_all
    fi
  fi
done
if [ "$exit_code" = 0 ] && [ "$failed" = 1 ]; then exit_code=1; fi
if [ "$exit_code" = 0 ]; then grep -h "test accuracy = " "$LOGDIR/worker_0.log" 2>/dev/null | tail -1 || true; fi
exit "$exit_code"
