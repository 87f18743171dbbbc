#!/usr/bin/env bash
# deploy/slurm/dtrain.sbatch on a real Slurm started on this machine from Debian's packages (slurmctld,
# slurmd, slurm-client, munge): a private munged (own key and socket), a generated slurm.conf with three
# emulated nodes n1..n3 on this host (one slurmd each), every state, spool, log and pid file in a temp dir.
# Submits a 1 ps + 2 worker job with sbatch -N 3 and checks that it ends COMPLETED with exit code 0 and the
# chief's accuracy line; then a job whose workers fail (an unknown model) must end FAILED with their exit code
# 2; a bad --num_ps is refused. Then an elastic job (docs/elastic_schedulers.md): dtrain.sbatch --spare_nodes=1
# runs 1 ps + the chief on two nodes and writes --cluster_file; a worker added to the running allocation with
# `srun --jobid=ID -w SPARE dtrain_worker --cluster_spec=FILE --task_index=1 ...` (a second step) joins, leaves
# on `scancel --ctld --signal=TERM ID.STEP` (its step exits 143), a worker past --max_workers is refused (exit 2), and
# the job ends COMPLETED with the run complete naming the worker that left.
# Stops the daemons by their pid files and removes everything, also on failure. Needs root (exit 77 else)
# and the Slurm packages (scripts/install_deps.sh installs them; exit 77 with the reason if missing).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
export DTRAIN_BIN="${DTRAIN_BIN_DIR:-$ROOT/build/bin}"

source "$(dirname "$0")/skipping.sh"
if [ "$(id -u)" != 0 ]; then skip "needs root (Slurm daemons as SlurmUser=root)"; fi
for t in slurmctld slurmd sbatch scontrol sinfo munged; do
  command -v "$t" >/dev/null || skip "no $t (scripts/install_deps.sh installs slurmctld slurmd slurm-client munge)"
done
for b in dtrain_ps dtrain_worker; do [ -x "$DTRAIN_BIN/$b" ] || { echo "FAIL: $DTRAIN_BIN/$b not built"; exit 1; }; done

dir="$(mktemp -d /tmp/dtrain_slurm_test.XXXXXX)"
chmod 755 "$dir"  # munged wants its socket's directories searchable by all
conf="$dir/slurm.conf"
export SLURM_CONF="$conf"
stop_pidfile() {  # SIGTERM the daemon of a pid file, SIGKILL after 10 s
  local f="$1" p
  [ -s "$f" ] || return 0
  p="$(cat "$f")"
  kill -TERM "$p" 2>/dev/null || return 0
  for _ in $(seq 100); do kill -0 "$p" 2>/dev/null || return 0; sleep 0.1; done
  kill -KILL "$p" 2>/dev/null || true
}
cleanup() {
  if [ -s "$conf" ]; then scancel --quiet --full "$(cat "$dir/jobs" 2>/dev/null || true)" 2>/dev/null || true; fi
  for n in n1 n2 n3; do stop_pidfile "$dir/slurmd.$n.pid"; done
  stop_pidfile "$dir/slurmctld.pid"
  stop_pidfile "$dir/munged.pid"
  rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 143' TERM INT

# munge: a private daemon with its own key and socket (AuthInfo below points Slurm to it).
dd if=/dev/urandom of="$dir/munge.key" bs=1024 count=1 status=none
chmod 400 "$dir/munge.key"
munged --force --key-file="$dir/munge.key" --socket="$dir/munge.sock" --pid-file="$dir/munged.pid" \
  --log-file="$dir/munged.log" --seed-file="$dir/munged.seed"
for _ in $(seq 50); do [ -S "$dir/munge.sock" ] && break; sleep 0.1; done
munge -S "$dir/munge.sock" -n | unmunge -S "$dir/munge.sock" >/dev/null ||
  { cat "$dir/munged.log"; echo "FAIL: munged does not work"; exit 1; }

host="$(hostname -s)"
IFS=, read -r pc p1 p2 p3 pjob <<<"$(python3 "$ROOT/scripts/free_ports.py" 5)"
mkdir -p "$dir/state" "$dir/spool"
cat >"$conf" <<EOF
ClusterName=dtraintest
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$pc
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$dir/munge.sock
CredType=cred/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SchedulerType=sched/backfill
MpiDefault=none
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.%n.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.%n.log
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
ReturnToService=2
MinJobAge=600
# Slurm's default: a ps task's graceful stop on srun's SIGTERM may take --worker_timeout_secs + 5 s (with 5 here,
# a loaded CI run saw the ps killed while it waited for a chief that had not registered yet: exit 137, not 2)
KillWait=30
SlurmdTimeout=60
InactiveLimit=0
NodeName=n1 NodeHostname=$host NodeAddr=127.0.0.1 CPUs=2 Port=$p1 State=UNKNOWN
NodeName=n2 NodeHostname=$host NodeAddr=127.0.0.1 CPUs=2 Port=$p2 State=UNKNOWN
NodeName=n3 NodeHostname=$host NodeAddr=127.0.0.1 CPUs=2 Port=$p3 State=UNKNOWN
PartitionName=test Nodes=n[1-3] Default=YES MaxTime=10 State=UP
EOF

slurmctld -f "$conf" -i
for n in n1 n2 n3; do slurmd -f "$conf" -N "$n"; done
ready=0
for _ in $(seq 150); do  # 30 s for the three nodes to register
  if [ "$(sinfo -h -N -o '%N %T' 2>/dev/null | grep -c ' idle$')" = 3 ]; then ready=1; break; fi
  sleep 0.2
done
if [ "$ready" != 1 ]; then
  sinfo -N || true; tail -n 20 "$dir"/slurm*.log || true
  echo "FAIL: Slurm nodes did not come up"; exit 1
fi
sinfo -N

failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# wait_job ID SECONDS: prints the final "JobState ExitCode" once the job has ended.
wait_job() {
  local line state
  for _ in $(seq $(($2 * 5))); do
    line="$(scontrol show job -o "$1" 2>/dev/null || true)"
    state="$(sed -n 's/.* JobState=\([A-Z_]*\) .*/\1/p' <<<"$line")"
    case "$state" in
      COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY|BOOT_FAIL|DEADLINE|PREEMPTED)
        echo "$state $(sed -n 's/.* ExitCode=\([0-9:]*\) .*/\1/p' <<<"$line")"; return 0 ;;
    esac
    sleep 0.2
  done
  echo "TIMEOUT_WAITING ?"
}

# 1. A job that trains: 1 ps + 2 workers on three nodes.
cd "$ROOT"
job="$(sbatch --parsable -N 3 --time=5 -o "$dir/job-%j.out" deploy/slurm/dtrain.sbatch --port="$pjob" \
       --model=mlp --mode=sync --train_steps=100 --log_every=50 --startup_wait_secs=60)"
echo "$job" >>"$dir/jobs"
read -r state code <<<"$(wait_job "$job" 150)"
echo "job $job: $state exit $code"; cat "$dir/job-$job.out"
[ "$state" = COMPLETED ] || fail "training job ended $state, not COMPLETED"
[ "$code" = "0:0" ] || fail "training job exit code $code, not 0:0"
grep -qE "^1: step 100: test accuracy = 0\.[0-9]+ \(10000 examples\)" "$dir/job-$job.out" ||
  fail "no accuracy line from the chief (task 1) in the job output"
grep -q "^0: .*cluster ps=\[127.0.0.1:$pjob\] worker=\[127.0.0.1:$((pjob + 1)),127.0.0.1:$((pjob + 2))\]" \
  "$dir/job-$job.out" || fail "task 0 did not report the expected cluster spec"
for t in 0 1 2; do grep -q "^$t: " "$dir/job-$job.out" || fail "no output from task $t"; done

# 2. A job whose workers fail: the failure ends the ps too, and the job is FAILED with exit code 2.
job2="$(sbatch --parsable -N 3 --time=5 -o "$dir/job-%j.out" deploy/slurm/dtrain.sbatch --port="$pjob" \
        --model=no_such_model)"
echo "$job2" >>"$dir/jobs"
read -r state code <<<"$(wait_job "$job2" 90)"
echo "job $job2: $state exit $code"; cat "$dir/job-$job2.out"
[ "$state" = FAILED ] || fail "failing job ended $state, not FAILED"
[ "$code" = "2:0" ] || fail "failing job exit code $code, not 2:0"
grep -q "unknown model \"no_such_model\"" "$dir/job-$job2.out" || fail "the worker's error is not in the job output"

# 3. A bad --num_ps is refused with a clear message (exit code 2).
job3="$(sbatch --parsable -N 3 --time=5 -o "$dir/job-%j.out" deploy/slurm/dtrain.sbatch --port="$pjob" --num_ps=3)"
echo "$job3" >>"$dir/jobs"
read -r state code <<<"$(wait_job "$job3" 60)"
echo "job $job3: $state exit $code"; cat "$dir/job-$job3.out"
[ "$state" = FAILED ] && [ "$code" = "2:0" ] || fail "--num_ps=3 on 3 tasks: job ended $state $code, not FAILED 2:0"
grep -q "leaves no worker among 3 tasks" "$dir/job-$job3.out" || fail "--num_ps=3: no clear message"

# 4. An elastic job grown and shrunk inside its allocation: 1 ps + the chief on n1, n2; n3 left spare.
wait_for_line() {  # wait_for_line FILE REGEX SECONDS
  for _ in $(seq $(($3 * 10))); do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 0.1; done
  return 1
}
W=(--model=mlp --mode=sync --train_steps=3000 --elastic_batch=per_worker --log_every=100 --startup_wait_secs=60)
job4="$(sbatch --parsable -N 3 --time=5 -o "$dir/job-%j.out" deploy/slurm/dtrain.sbatch --port="$pjob" \
        --spare_nodes=1 --cluster_file="$dir/cluster-%j.json" --ps_args="--max_workers=3" "${W[@]}")"
echo "$job4" >>"$dir/jobs"
out4="$dir/job-$job4.out"
spec4="$dir/cluster-$job4.json"
if wait_for_line "$out4" "^1: step 100," 90 && [ -s "$spec4" ]; then
  cat "$spec4"
  grep -qx "{\"ps\": \[\"127.0.0.1:$pjob\"\], \"worker\": \[\"127.0.0.1:$((pjob + 1))\"\]}" "$spec4" ||
    fail "--cluster_file does not hold the job's spec"
  squeue -s -j "$job4" || true
  # The joiner: a second step of the running job, on the spare node, with the job's worker flags.
  srun --jobid="$job4" -N 1 -n 1 -w n3 "$DTRAIN_BIN/dtrain_worker" --cluster_spec="$spec4" --job_name=worker \
    --task_index=1 "${W[@]}" >"$dir/joiner.out" 2>&1 &
  joiner=$!
  if wait_for_line "$dir/joiner.out" "^step [0-9]*, loss" 60; then
    step_id="$(squeue -h -s -j "$job4" -o '%i %N' | awk '$2 == "n3" && $1 !~ /batch|extern/ {print $1}' | head -n 1)"
    echo "the joiner runs as step $step_id"
    squeue -s -j "$job4" || true
    # --ctld: through slurmctld (straight to the emulated nodes, scancel delivers the signal but exits 225 with
    # "Kill job error on job step id N: Invalid job id specified" on this one-host Slurm 22.05).
    [ -n "$step_id" ] && scancel --ctld --signal=TERM "$step_id" || fail "scancel --signal=TERM of step '$step_id' failed"
  else
    fail "the worker added with srun --jobid did not train"
  fi
  rc=0; wait "$joiner" || rc=$?
  echo "joiner (srun --jobid=$job4): exit $rc"; grep -v "^I2\|, loss = " "$dir/joiner.out" | tail -n 8
  [ "$rc" = 143 ] || fail "the joiner's srun exited $rc after scancel --signal=TERM, not 143"
  grep -q "stopped by SIGTERM at step [0-9]*; it left the cluster" "$dir/joiner.out" || fail "the joiner did not leave"
  grep -q "^0: .*worker 1 joined (2 workers, aggregating 2, global batch 200)" "$out4" || fail "ps 0 did not log the join"
  grep -q "^1: step [0-9]*: worker 1 joined" "$out4" || fail "the chief did not log the join"
  grep -q "^0: .*worker 1 left (1 worker, aggregating 1" "$out4" || fail "ps 0 did not log the leave"
  # Past --max_workers=3: refused, exit 2, naming the flag.
  rc=0; srun --jobid="$job4" -N 1 -n 1 -w n3 "$DTRAIN_BIN/dtrain_worker" --cluster_spec="$spec4" --job_name=worker \
    --task_index=3 "${W[@]}" >"$dir/past.out" 2>&1 || rc=$?
  [ "$rc" = 2 ] && grep -q "max_workers" "$dir/past.out" || { tail -n 3 "$dir/past.out"; fail "a worker past --max_workers: exit $rc, not 2 naming it"; }
else
  fail "the elastic job's chief did not train or no --cluster_file was written"
fi
read -r state code <<<"$(wait_job "$job4" 120)"
echo "job $job4: $state exit $code"; grep -E "joined|left|run complete|accuracy" "$out4"
[ "$state" = COMPLETED ] && [ "$code" = "0:0" ] || fail "elastic job ended $state $code, not COMPLETED 0:0"
grep -q "^0: .*run complete: training reached step 3000 of 3000; 2 workers took part; left before the end: worker 1 (stopped" \
  "$out4" || fail "the elastic run did not end complete naming worker 1"

if [ "$failures" = 0 ]; then echo "1 passed, 0 failed"; exit 0; fi
tail -n 30 "$dir"/slurmctld.log || true
echo "0 passed, 1 failed"
exit 1
