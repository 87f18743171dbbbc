#!/usr/bin/env bash
# A ps task under 1,000 idle connections (issue 41's load): a process of the ps's own user opens 1,000 TCP
# connections to the task's gRPC port and 1,000 to its TCP data-lane port, says nothing, and opens a new one for
# each the ps closes, while 2 sync workers (on this host: their data goes through shared memory) train the mlp.
# The ps runs with a soft limit of 256 open files (as a shell with `ulimit -n 256`; many systems start servers at
# 1024), so the connections are more than the limit it was given. Checks:
#   - the run completes (every process exits 0) and its final values equal, bit for bit, those of the same run
#     without the connections (dtrain_eval --export of the final checkpoint, tests/compare_values.py --tol 0);
#   - the ps raised its soft limit of open files (its log says so) and its peak memory (VmHWM) stays within
#     64 MiB of the quiet run's;
#   - the silent lane connections were closed by the ps (its TCP server's hello timeout), so the attacker had to
#     open new ones.
# About 15 s on 2 cores. Needs Fashion-MNIST: exit 77 without (exit 1 with DTRAIN_REQUIRE_DEPS=1).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BIN="${DTRAIN_BIN_DIR:-$ROOT/build/bin}"
source "$(dirname "$0")/skipping.sh"
for b in dtrain_ps dtrain_worker dtrain_eval; do
  [ -x "$BIN/$b" ] || { echo "FAIL: $BIN/$b not built (set DTRAIN_BIN_DIR)"; exit 1; }
done
[ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] ||
  skip "dataset-fashion-mnist is not installed (scripts/install_deps.sh)"
/usr/bin/python3 -c "import numpy" 2>/dev/null || skip "/usr/bin/python3 cannot import numpy"
hard=$(ulimit -Hn)
if [ "$hard" != unlimited ] && [ "$hard" -lt 4096 ]; then
  # Not a missing package (skip() would fail under DTRAIN_REQUIRE_DEPS=1): the machine's own limit.
  echo "SKIP: the hard limit of open files is $hard: 2,000 connections and their peers need 4,096"
  exit 77
fi
source "$(dirname "$0")/checks.sh"
passed=0 failed=0
make_test_dir dtrain_idle_connections_test

# run NAME ATTACK: 1 ps + 2 sync workers, 120 steps; with ATTACK=1 the connections come in while they train.
run() {
  local name=$1 attack=$2 rc=0 p
  local ports
  IFS=, read -r -a ports < <(python3 "$ROOT/scripts/free_ports.py" 4)
  local cluster=(--ps_hosts="127.0.0.1:${ports[0]}" --worker_hosts="127.0.0.1:${ports[1]},127.0.0.1:${ports[2]}")
  local pids=()
  ( ulimit -Sn 256; exec "$BIN/dtrain_ps" --job_name=ps --task_index=0 "${cluster[@]}" --max_run_secs=120 \
      --tcp_port="${ports[3]}" --checkpoint_dir="$dir/$name.ckpt" ) >"$dir/$name.ps.log" 2>&1 &
  local ps_pid=$!
  bg+=("$ps_pid")
  # Its peak memory, read while it runs (it exits with the workers).
  ( while kill -0 "$ps_pid" 2>/dev/null; do
      awk '/VmHWM/ {print $2}' "/proc/$ps_pid/status" >"$dir/$name.hwm.tmp" 2>/dev/null &&
        mv "$dir/$name.hwm.tmp" "$dir/$name.hwm"
      sleep 0.2
    done ) &
  bg+=($!)
  wait_for_line "$dir/$name.ps.log" "listening on" 30 || { echo "FAIL: $name: the ps did not start"; exit 1; }
  local attacker=""
  if [ "$attack" = 1 ]; then
    /usr/bin/python3 - "${ports[0]}" "${ports[3]}" "$dir/$name.attack" <<'PY' &
import os, socket, sys, time
grpc_port, lane_port, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
import resource
hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
resource.setrlimit(resource.RLIMIT_NOFILE, (4096 if hard == resource.RLIM_INFINITY else min(4096, hard), hard))
conns = {grpc_port: [], lane_port: []}
opened = {grpc_port: 0, lane_port: 0}
def top_up():
    for port, held in conns.items():
        alive = []
        for s in held:
            try:
                if s.recv(1, socket.MSG_DONTWAIT) == b"":  # closed by the ps
                    s.close()
                    continue
            except BlockingIOError:
                pass
            except OSError:
                s.close()
                continue
            alive.append(s)
        while len(alive) < 1000:
            s = socket.socket()
            s.settimeout(2)
            try:
                s.connect(("127.0.0.1", port))
            except OSError:
                s.close()
                break
            alive.append(s)
            opened[port] += 1
        conns[port] = alive
deadline = time.time() + 110
while time.time() < deadline and not os.path.exists(out + ".stop"):
    top_up()
    with open(out, "w") as f:
        f.write("%d %d %d %d\n" % (len(conns[grpc_port]), opened[grpc_port], len(conns[lane_port]), opened[lane_port]))
    time.sleep(0.2)
PY
    attacker=$!
    bg+=("$attacker")
    for _ in $(seq 100); do
      [ -s "$dir/$name.attack" ] && [ "$(awk '{print $1}' "$dir/$name.attack")" -ge 1000 ] && break
      sleep 0.1
    done
    echo "$name: the attacker holds $(cat "$dir/$name.attack" 2>/dev/null) (gRPC held/opened, lanes held/opened)"
  fi
  for i in 1 0; do
    timeout 120 "$BIN/dtrain_worker" --job_name=worker --task_index=$i "${cluster[@]}" --model=mlp --mode=sync \
      --train_steps=120 --batch_size=50 --threads=1 --seed=7 --log_every=1000 >"$dir/$name.w$i.log" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || rc=$?; done
  wait "$ps_pid" || rc=$?
  if [ -n "$attacker" ]; then
    touch "$dir/$name.attack.stop"
    wait "$attacker" || true
    echo "$name: at the end the attacker held/opened $(cat "$dir/$name.attack")"
  fi
  check "$name: every process exits 0" test "$rc" = 0
  [ "$rc" = 0 ] || tail -n 5 "$dir/$name".*.log
  timeout 60 "$BIN/dtrain_eval" --checkpoint="$dir/$name.ckpt" --model=mlp --skip_eval --export="$dir/$name.npz" \
    >"$dir/$name.export.log" 2>&1 || { echo "FAIL: $name: dtrain_eval --export"; tail -3 "$dir/$name.export.log"; }
}

run quiet 0
run attacked 1
check "the attacked run's values equal the quiet run's, bit for bit" \
  /usr/bin/python3 "$ROOT/tests/compare_values.py" "attacked vs quiet" "$dir/attacked.npz" "$dir/quiet.npz" --tol 0
check "the ps raised its soft limit of open files" grep -q "open files: soft limit raised from 256" "$dir/attacked.ps.log"
quiet_kb=$(cat "$dir/quiet.hwm") attacked_kb=$(cat "$dir/attacked.hwm")
echo "ps peak memory (VmHWM): quiet $((quiet_kb / 1024)) MiB, under 2,000 idle connections $((attacked_kb / 1024)) MiB"
check "the ps's peak memory stays within 64 MiB of the quiet run's" test $((attacked_kb - quiet_kb)) -lt $((64 * 1024))
read -r _ _ lanes_held lanes_opened <"$dir/attacked.attack"
check "silent lane connections were closed by the ps (opened $lanes_opened for $lanes_held held)" \
  test "$lanes_opened" -gt "$lanes_held"
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
