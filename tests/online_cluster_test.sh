#!/usr/bin/env bash
# Online training on a real cluster: 1 ps + 2 sync workers, each its own process on 127.0.0.1, following a
# directory where the parts of a drifting synthetic click stream arrive while they train (dtrain_convert
# --synthetic_ctr --stream_parts --drift, written in the background), with deltas every 5 steps. Checks that
#   1. every process exits 0 once no new part has come for a while (the input ends: no --train_steps), and the ps
#      saved a final checkpoint and wrote its deltas;
#   2. the chief reported its progressive validation (the newest examples, scored before it trained on them) with
#      an AUC above 0.6 at the end;
#   3. serving (dtrain_eval --follow_deltas) from the deltas alone, without any snapshot, scores the test set as
#      the final checkpoint of the same step does: every logit equal to 1e-6;
#   4. a follower started while the cluster trains follows the deltas as they come (at least two states scored);
#   5. a part a producer wrote in place with a bad line (part-00000b.txt, line 151 cut short) is set aside by both
#      workers (--bad_records=skip, the default: one WARNING naming file, line and lines skipped, and the count in
#      the worker's end lines) and training goes on with the next part;
#   6. with --bad_records=fail a chief alone (1 ps + 1 worker) ends at that part: the worker exits 1 naming it, the
#      ps exits 4 after saving the final checkpoint of the steps trained before it.
# Every process is bounded in time. Exits 0 when all hold, 1 otherwise.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BIN="${DTRAIN_BIN_DIR:-$ROOT/build/bin}"
for b in dtrain_ps dtrain_worker dtrain_eval dtrain_convert; do
  [ -x "$BIN/$b" ] || { echo "FAIL: $BIN/$b not built (set DTRAIN_BIN_DIR)"; exit 1; }
done
dir="$(mktemp -d /tmp/dtrain_online_cluster.XXXXXX)"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  [ -n "${KEEP:-}" ] && echo "kept $dir" || rm -rf "$dir"
}
trap cleanup EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# 6 parts of 4000 examples; the first arrives at once, the others every 0.5 s while the cluster trains.
mkdir -p "$dir/ctr"
timeout 60 "$BIN/dtrain_convert" --synthetic_ctr --examples=24000 --test_examples=3000 --stream_parts=6 \
  --drift=0.5 --stream_interval_secs=0.5 --num_dense=4 --num_sparse=8 --vocab=100 --out="$dir/ctr" \
  > "$dir/convert.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do [ -f "$dir/ctr/stream/part-00000.txt" ] && break; sleep 0.1; done
# 5. A producer that writes in place, with line 151 of 300 cut short (3 fields of 13), between parts 0 and 1.
bad="$dir/ctr/stream/part-00000b.txt"
head -300 "$dir/ctr/stream/part-00000.txt" | awk 'NR == 151 { print "1\t2\t3"; next } { print }' > "$bad"

model_flags=(--model=dlrm --data_format=criteo --embedding_dim=8 --dlrm_bottom=16 --dlrm_top=16)
train_flags=(--learning_rate=0.01 --sparse_learning_rate=0.2 --batch_size=100)
IFS=, read -r p0 w0 w1 < <(python3 "$ROOT/scripts/free_ports.py" 3)
cluster=(--ps_hosts=127.0.0.1:$p0 --worker_hosts=127.0.0.1:$w0,127.0.0.1:$w1)
start=$SECONDS
timeout 120 "$BIN/dtrain_ps" --job_name=ps --task_index=0 "${cluster[@]}" --checkpoint_dir="$dir/ckpt" \
  --delta_every_steps=5 > "$dir/ps.log" 2>&1 &
ps_pid=$!
for i in 1 0; do
  timeout 120 "$BIN/dtrain_worker" --job_name=worker --task_index=$i "${cluster[@]}" "${model_flags[@]}" \
    --data_dir="$dir/ctr/stream" --follow --follow_idle_secs=2 --follow_poll_secs=0.1 --train_steps=0 \
    "${train_flags[@]}" --mode=sync --threads=1 --log_every=10 --eval_every=10 --eval_window=2000 \
    > "$dir/w$i.log" 2>&1 &
  wpid[$i]=$!
done
# A follower serving while the cluster trains (deltas only: the snapshot directory is empty).
mkdir -p "$dir/no_snapshots"
for _ in $(seq 100); do ls "$dir/ckpt"/model.delta-* > /dev/null 2>&1 && break; sleep 0.1; done
timeout 120 "$BIN/dtrain_eval" "${model_flags[@]}" --data_dir="$dir/ctr" --checkpoint="$dir/no_snapshots" \
  --delta_dir="$dir/ckpt" --follow_deltas --follow_poll_secs=0.2 --follow_timeout_secs=4 \
  > "$dir/follower.log" 2>&1 &
follower_pid=$!
rc=0
for p in "$ps_pid" "${wpid[0]}" "${wpid[1]}"; do wait "$p" || { rc=$?; fail "a process of the cluster exited $rc"; }; done
wait "$follower_pid" || fail "the live follower exited $?"
echo "cluster done in $((SECONDS - start)) s"

# 1. The end: the input ended on both workers, the ps checkpointed the last step and wrote deltas.
end_step=$(sed -n 's/.*training reached step \([0-9]*\).*/\1/p' "$dir/ps.log" | tail -1)
[ -n "$end_step" ] || fail "the ps did not report 'training reached step N': $(tail -n 3 "$dir/ps.log")"
for i in 0 1; do grep -q "the input ended at global step" "$dir/w$i.log" || fail "worker $i: its input did not end"; done
[ -f "$dir/ckpt/model.ckpt-$end_step.ps0-of-1" ] || fail "no final checkpoint of step $end_step"
grep -q " deltas written (" "$dir/ps.log" || fail "the ps reported no deltas written"
echo "training ended at step $end_step; deltas: $(ls "$dir/ckpt" | grep -c model.delta- || true)"

# 5. The part written in place with a bad line: set aside by both workers, counted; training went on (1. above).
for i in 0 1; do
  line=$(grep "set aside part-00000b.txt" "$dir/w$i.log" || true)
  [[ "$line" == *"part-00000b.txt:151: 3 fields, expected 13"*"its 300 lines (this worker's shard: 150) not trained on"* ]] ||
    fail "worker $i: no 'set aside part-00000b.txt' line naming line 151 and the lines skipped: ${line:-none}"
  grep -q "^worker $i: 1 input file(s) set aside as bad (300 lines" "$dir/w$i.log" ||
    fail "worker $i: its end lines do not count the file set aside"
done
echo "worker 0: ${line:-no line}" | sed 's/^\(.\{220\}\).*/\1.../'

# 2. Progressive validation on the chief.
window=$(grep "^step [0-9]*: newest [0-9]* examples (scored before training on them)" "$dir/w0.log" | tail -1 || true)
echo "chief: ${window:-none}"
if [[ "$window" =~ AUC\ =\ ([0-9.]+) ]]; then
  /usr/bin/python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) > 0.6 else 1)" "${BASH_REMATCH[1]}" ||
    fail "the chief's window AUC ${BASH_REMATCH[1]} is not above 0.6"
else
  fail "no progressive validation line from the chief"
fi

# 3. The newest delta step that is also a checkpoint step (the last one, with deltas every 5 steps).
delta_step=$(ls "$dir/ckpt" | sed -n 's/^model\.delta-\([0-9]*\)\.ps0-of-1$/\1/p' | sort -n | tail -1)
[ -f "$dir/ckpt/model.ckpt-$delta_step.ps0-of-1" ] ||
  fail "the newest delta (step ${delta_step:-?}) has no checkpoint of the same step (final: $end_step)"
timeout 60 "$BIN/dtrain_eval" "${model_flags[@]}" --data_dir="$dir/ctr" --checkpoint="$dir/no_snapshots" \
  --delta_dir="$dir/ckpt" --follow_deltas --until_step="$delta_step" --logits_out="$dir/served.npz" \
  > "$dir/served.log" 2>&1 || fail "dtrain_eval --follow_deltas exited $?"
timeout 60 "$BIN/dtrain_eval" "${model_flags[@]}" --data_dir="$dir/ctr" \
  --checkpoint="$dir/ckpt/model.ckpt-$delta_step" --logits_out="$dir/trained.npz" > "$dir/trained.log" 2>&1 ||
  fail "dtrain_eval --checkpoint exited $?"
grep "^model at step" "$dir/served.log" || fail "no line from the served model: $(tail -n 2 "$dir/served.log")"
grep "^checkpoint model" "$dir/trained.log" || true
/usr/bin/python3 - "$dir/served.npz" "$dir/trained.npz" <<'PY' || fail "the served logits differ from the trained model's"
import struct, sys, zipfile
def logits(path):
    with zipfile.ZipFile(path) as z:
        raw = z.read("logits.npy")
    n = struct.unpack("<H", raw[8:10])[0]
    data = raw[10 + n:]
    return struct.unpack("<%df" % (len(data) // 4), data)
a, b = logits(sys.argv[1]), logits(sys.argv[2])
worst = max(abs(x - y) for x, y in zip(a, b)) if len(a) == len(b) else float("inf")
print("served vs trained: %d logits, largest difference %g" % (len(a), worst))
sys.exit(0 if len(a) == len(b) and len(a) > 0 and worst <= 1e-6 else 1)
PY

# 4. The live follower scored more than one state as the deltas came.
states=$(grep -c "^model at step" "$dir/follower.log" || true)
echo "live follower: $states states scored; last: $(grep '^model at step' "$dir/follower.log" | tail -1)"
[ "${states:-0}" -ge 2 ] || fail "the live follower scored $states states (expected at least 2): $(tail -n 3 "$dir/follower.log")"

# 6. --bad_records=fail: a chief alone on the same parts ends at the bad one, and the ps saved what it trained.
IFS=, read -r p0 w0 < <(python3 "$ROOT/scripts/free_ports.py" 2)
cluster=(--ps_hosts=127.0.0.1:$p0 --worker_hosts=127.0.0.1:$w0)
start=$SECONDS
timeout 60 "$BIN/dtrain_ps" --job_name=ps --task_index=0 "${cluster[@]}" --checkpoint_dir="$dir/ckpt_fail" \
  > "$dir/ps_fail.log" 2>&1 &
ps_pid=$!
rc=0
timeout 60 "$BIN/dtrain_worker" --job_name=worker --task_index=0 "${cluster[@]}" "${model_flags[@]}" \
  --data_dir="$dir/ctr/stream" --follow --follow_idle_secs=2 --follow_poll_secs=0.1 --train_steps=0 \
  "${train_flags[@]}" --threads=1 --log_every=10 --bad_records=fail > "$dir/w_fail.log" 2>&1 || rc=$?
ps_rc=0
wait "$ps_pid" || ps_rc=$?
echo "--bad_records=fail: worker exited $rc, ps $ps_rc in $((SECONDS - start)) s"
[ "$rc" = 1 ] || fail "--bad_records=fail: the worker exited $rc, expected 1 (its own error)"
[ "$ps_rc" = 4 ] || fail "--bad_records=fail: the ps exited $ps_rc, expected 4 (a peer failed)"
grep -q "^dtrain_worker: .*part-00000b.txt:151: 3 fields, expected 13" "$dir/w_fail.log" ||
  fail "--bad_records=fail: the worker's error does not name part-00000b.txt:151: $(tail -n 1 "$dir/w_fail.log")"
fail_step=$(sed -n 's/.*final checkpoint of step \([0-9]*\) saved.*/\1/p' "$dir/ps_fail.log" | tail -1)
# The first part's 4000 examples in batches of 100, read one ahead: 39 steps trained before the bad part.
[ "${fail_step:-0}" -ge 39 ] && [ -f "$dir/ckpt_fail/model.ckpt-$fail_step.ps0-of-1" ] ||
  fail "--bad_records=fail: no final checkpoint of the steps trained (step ${fail_step:-none}): $(ls "$dir/ckpt_fail" 2>&1)"
echo "--bad_records=fail: final checkpoint of step ${fail_step:-none}"

if [ "$failures" = 0 ]; then echo "1 passed, 0 failed"; exit 0; fi
echo "0 passed, 1 failed ($failures checks)"
exit 1
