#!/usr/bin/env bash
# scripts/check_updates.py on the journals of real runs whose ps set changed (ps/checkpoint/checkpoint_reshard.h),
# with losses and doubles injected on both sides of each change. dlrm on tiny synthetic click data, 2 sync workers,
# every ps task with --journal_applied and every worker with --push_journal_dir, a checkpoint every 10 steps:
#   straight  1 ps task from step 0 to 30;
#   grown     2 ps tasks resume from the straight run's checkpoint of step 20 (copied to a directory of its own) to 40
#             (1 -> 2: the straight run's steps 20-29 are undone, the workers push them again);
#   shrunk    then 1 ps task resumes from the 2 tasks' checkpoint of step 40 to 50 (2 -> 1).
# Checks:
#   - each resumed ps task logs the reshard; the checker passes on the journals after the grow (1 -> 2) and after
#     the shrink (1 -> 2 -> 1): lost 0, doubled 0, every push of steps 0-19 and 20-49 applied once on the newest
#     layout, the straight run's 20-29 undone;
#   - on copies of the journals, each of these is caught (exit 1, lost 1 or doubled 1): an applied record deleted or
#     duplicated in the straight run (before the grow), in the grown run (after the grow, before the shrink) and in
#     the shrunk run (after the shrink); a push the resharded checkpoint holds applied again after the reshard.
# A few seconds on 2 cores.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BIN="${DTRAIN_BIN_DIR:-$ROOT/build/bin}"
for b in dtrain_ps dtrain_worker dtrain_convert; do
  [ -x "$BIN/$b" ] || { echo "FAIL: $BIN/$b not built (set DTRAIN_BIN_DIR)"; exit 1; }
done
dir="$(mktemp -d /tmp/dtrain_reshard_journal_test.XXXXXX)"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  if [ -n "${KEEP:-}" ]; then echo "kept $dir"; else rm -rf "$dir"; fi
}
trap cleanup EXIT
trap 'exit 143' TERM INT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# run NAME NUM_PS STEPS CKPT: NUM_PS ps tasks and 2 sync workers on fresh ports, journals kept.
run() {
  local name=$1 num_ps=$2 steps=$3 ckpt=$4 rc=0 p i
  local ports ps_hosts=""
  IFS=, read -r -a ports < <(python3 "$ROOT/scripts/free_ports.py" $((num_ps + 2)))
  for ((i = 0; i < num_ps; i++)); do ps_hosts+="${ps_hosts:+,}127.0.0.1:${ports[$i]}"; done
  local cluster=(--ps_hosts="$ps_hosts" --worker_hosts="127.0.0.1:${ports[$num_ps]},127.0.0.1:${ports[$((num_ps + 1))]}")
  pids=()
  for ((i = 0; i < num_ps; i++)); do
    timeout 60 "$BIN/dtrain_ps" --job_name=ps --task_index=$i "${cluster[@]}" --checkpoint_dir="$ckpt" \
      --save_checkpoint_steps=10 --keep_checkpoints=0 --journal_applied > "$dir/$name.ps$i.log" 2>&1 &
    pids+=($!)
  done
  for i in 1 0; do
    timeout 60 "$BIN/dtrain_worker" --job_name=worker --task_index=$i "${cluster[@]}" --model=dlrm \
      --data_dir="$dir/ctr" --data_format=criteo --table_rows=500 --embedding_dim=4 --batch_size=16 --mode=sync \
      --train_steps="$steps" --threads=1 --seed=5 --log_every=1000 --push_journal_dir="$dir/pushes" \
      > "$dir/$name.w$i.log" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || rc=$?; done
  pids=()
  if [ "$rc" != 0 ]; then
    fail "$name: a process exited $rc"
    tail -n 4 "$dir/$name".*.log
  fi
}

# check WHAT: the checker on the journals as they are now, and the injections.
check() {
  python3 - "$ROOT/scripts/check_updates.py" "$dir" "$1" <<'PY' || fail "$1"
import glob, json, os, shutil, subprocess, sys, tempfile
check, d, what = sys.argv[1:]
bad = []

def checker(root):
    p = subprocess.run([sys.executable, check, "--ps_dir", os.path.join(root, "straight"), "--ps_dir",
                        os.path.join(root, "changed"), "--worker_dir", os.path.join(root, "pushes"), "--json"],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    counts = [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")]
    return p.returncode, counts[-1] if counts else {}, p.stdout

def journal(root, run, name):
    files = sorted(glob.glob(os.path.join(root, run, name)))
    if len(files) != 1:
        sys.exit("%s: %d journals %s in %s" % (what, len(files), name, run))
    return files[0]

def applied_line(lines, step):
    for i, l in enumerate(lines):
        f = l.split()
        if f and f[0] == "A" and f[1] == "1" and int(f[2]) == step:
            return i
    sys.exit("%s: no applied record of worker 1's step %d" % (what, step))

rc, counts, out = checker(d)
print(out.splitlines()[-2] if len(out.splitlines()) > 1 else out)
last = 50 if what.startswith("shrunk") else 40
want = dict(lost=0, doubled=0, accepted=2 * (30 + last - 20), applied_once=2 * last, undone=2 * 10)
if rc != 0 or any(counts.get(k, 0) != v for k, v in want.items()):
    bad.append("the journals as written: exit %d, counts %s (want %s)\n%s" % (rc, counts, want, out))

# (run, journal, step of worker 1's push): an applied record before and after each change.
places = [("straight", "applied.ps0-of-1.*.journal", 12), ("changed", "applied.ps1-of-2.*.journal", 33)]
if what.startswith("shrunk"):
    places += [("changed", "applied.ps0-of-1.*.journal", 45)]
for run, name, step in places:
    for fault in ("lost", "doubled"):
        with tempfile.TemporaryDirectory() as t:
            for sub in ("straight", "changed", "pushes"):
                shutil.copytree(os.path.join(d, sub), os.path.join(t, sub))
            path = journal(t, run, name)
            lines = open(path).read().splitlines(True)
            i = applied_line(lines, step)
            if fault == "lost":
                del lines[i]
            else:
                lines.insert(i + 1, lines[i])
            open(path, "w").write("".join(lines))
            rc, counts, out = checker(t)
        ok = rc == 1 and counts.get(fault) == 1 and counts.get("doubled" if fault == "lost" else "lost", 0) == 0
        print("%s: step %d %s in %s's %s: %s" % (what, step, fault, run, name, "caught" if ok else "WRONG"))
        if not ok:
            bad.append("step %d %s in %s's %s: exit %d, counts %s\n%s" % (step, fault, run, name, rc, counts, out))

# A push the resharded checkpoint holds (step 15, from the straight run) applied again by a new task after the X.
with tempfile.TemporaryDirectory() as t:
    for sub in ("straight", "changed", "pushes"):
        shutil.copytree(os.path.join(d, sub), os.path.join(t, sub))
    old = open(journal(t, "straight", "applied.ps0-of-1.*.journal")).read().splitlines(True)
    again = old[applied_line(old, 15)]
    path = journal(t, "changed", "applied.ps0-of-2.*.journal")
    lines = open(path).read().splitlines(True)
    x = next(i for i, l in enumerate(lines) if l.startswith("X "))
    lines.insert(x + 1, again)
    open(path, "w").write("".join(lines))
    rc, counts, out = checker(t)
ok = rc == 1 and counts.get("doubled") == 1 and counts.get("lost", 0) == 0
print("%s: step 15 applied again after the grow: %s" % (what, "caught" if ok else "WRONG"))
if not ok:
    bad.append("step 15 applied again after the grow: exit %d, counts %s\n%s" % (rc, counts, out))
if bad:
    sys.exit("\n".join(bad))
PY
}

"$BIN/dtrain_convert" --synthetic_ctr --examples=2000 --test_examples=100 --out="$dir/ctr" > "$dir/convert.log" 2>&1 ||
  { fail "dtrain_convert"; tail -3 "$dir/convert.log"; }
run straight 1 30 "$dir/straight"
mkdir -p "$dir/changed"
cp "$dir/straight/model.ckpt-20.ps0-of-1" "$dir/changed/" || fail "the straight run saved no checkpoint of step 20"
run grown 2 40 "$dir/changed"
for i in 0 1; do
  grep -q "resharded from 1 ps task onto 2" "$dir/grown.ps$i.log" ||
    fail "ps task $i of 2 did not restore step 20 resharded from 1 task"
done
check "grown (1 -> 2)"
run shrunk 1 50 "$dir/changed"
grep -q "resharded from 2 ps tasks onto 1" "$dir/shrunk.ps0.log" || fail "ps task 0 of 1 did not restore step 40 resharded"
check "shrunk (1 -> 2 -> 1)"

if [ "$failures" = 0 ]; then echo "1 passed, 0 failed"; exit 0; fi
echo "0 passed, 1 failed ($failures checks)"
exit 1
