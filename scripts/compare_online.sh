#!/usr/bin/env bash
# The figures of online training with sparse tables (docs/sparse_and_online.md), each against its peer in the same
# run on synthetic click data (dtrain_convert --synthetic_ctr, Zipf-distributed ids):
#   online   a drifting stream (--stream_parts, --drift) trained online (--follow, deltas every 10 s) against the
#            same model trained once on the stream's first part and frozen; both scored on the stream's end (the
#            online model through the reader of its deltas, dtrain_eval --follow_deltas).
#   deltas   examples/sec of 1 ps + 2 sync workers with and without --delta_every_secs=10, interleaved.
#   tables   rows held, table bytes and the ps's peak RSS without, and with admission + expiry
#            (--admit_probability, --row_ttl), and with 16-bit rows (--row_dtype=fp16 --row_slot_dtype=bf16); AUC.
#   hybrid   examples/sec and AUC of 2 ps + 2 workers, sync against --sparse_mode=async, interleaved.
#   cache    the worker's sparse bytes per step and AUC without and with the row cache, on Zipf(1.1) ids.
# Every run is one process per task on 127.0.0.1, one thread each. Figures are medians of --repeats interleaved
# launches where speed is compared. Prints one block per section.
#
#   scripts/compare_online.sh [--sections=online,deltas,tables,hybrid,cache] [--repeats=3] [--examples=N] [--keep]
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BIN="${DTRAIN_BIN_DIR:-$ROOT/build/bin}"
sections="online,deltas,tables,hybrid,cache"
repeats=3
examples=400000
keep=0
for a in "$@"; do
  case "$a" in
    --sections=*) sections="${a#*=}" ;;
    --repeats=*) repeats="${a#*=}" ;;
    --examples=*) examples="${a#*=}" ;;
    --keep) keep=1 ;;
    *) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
  esac
done
for b in dtrain_ps dtrain_worker dtrain_eval dtrain_convert; do
  [ -x "$BIN/$b" ] || { echo "compare_online: $BIN/$b not built (set DTRAIN_BIN_DIR)" >&2; exit 2; }
done
work="$(mktemp -d /tmp/dtrain_compare_online.XXXXXX)"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  if [ "$keep" = 1 ]; then echo "kept $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT
model=(--model=dlrm --data_format=criteo --embedding_dim=16 --batch_size=256 --threads=1 --log_every=100)
has() { [[ ",$sections," == *",$1,"* ]]; }
median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{v[NR]=$1} END {print (NR%2 ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2)}'; }

# cluster NAME NUM_PS NUM_WORKERS "PS FLAGS" "WORKER FLAGS": runs it to the end; the logs are $work/NAME.*.log and the
# ps tasks' peak RSS (KiB) $work/NAME.ps<i>.rss. Prints the aggregate examples/sec of the workers.
cluster() {
  local name=$1 nps=$2 nw=$3 psf=$4 wf=$5 i rc=0
  local ports; ports=$(python3 "$ROOT/scripts/free_ports.py" $((nps + nw)))
  IFS=, read -r -a p <<< "$ports"
  local ps_hosts="" worker_hosts=""
  for ((i = 0; i < nps; i++)); do ps_hosts+="${ps_hosts:+,}127.0.0.1:${p[$i]}"; done
  for ((i = 0; i < nw; i++)); do worker_hosts+="${worker_hosts:+,}127.0.0.1:${p[$((nps + i))]}"; done
  local hosts=(--ps_hosts="$ps_hosts" --worker_hosts="$worker_hosts")
  read -r -a psa <<< "$psf"
  read -r -a wa <<< "$wf"
  pids=()
  for ((i = 0; i < nps; i++)); do
    /usr/bin/time -f "%M" -o "$work/$name.ps$i.rss" timeout 900 "$BIN/dtrain_ps" --job_name=ps --task_index=$i \
      "${hosts[@]}" "${psa[@]}" > "$work/$name.ps$i.log" 2>&1 &
    pids+=($!)
  done
  for ((i = nw - 1; i >= 0; i--)); do
    timeout 900 "$BIN/dtrain_worker" --job_name=worker --task_index=$i "${hosts[@]}" "${model[@]}" "${wa[@]}" \
      > "$work/$name.w$i.log" 2>&1 &
    pids+=($!)
  done
  for pp in "${pids[@]}"; do wait "$pp" || rc=$?; done
  pids=()
  [ "$rc" = 0 ] || { echo "compare_online: $name failed ($rc); $(tail -n 2 "$work/$name".*.log)" >&2; return 1; }
  local total=0
  for ((i = 0; i < nw; i++)); do
    total=$(awk -v t="$total" '/local steps, .* examples in .* sec/ {gsub(/[()]/, ""); print t + $(NF-1); exit}' \
      "$work/$name.w$i.log")
  done
  echo "$total"
}
# The chief's final test line -> "AUC LOGLOSS".
auc_of() { sed -n 's/^step [0-9]*: test log loss = \([0-9.]*\), AUC = \([0-9.]*\),.*/\2 \1/p' "$1" | tail -1; }
# dtrain_eval's line of a served model or checkpoint -> "AUC LOGLOSS".
eval_auc() { sed -n 's/.*: test log loss = \([0-9.]*\), AUC = \([0-9.]*\),.*/\2 \1/p' "$1" | tail -1; }

if has online; then
  echo "== online: a drifting stream, trained online (deltas every 10 s) vs frozen after its first part"
  d="$work/drift"
  "$BIN/dtrain_convert" --synthetic_ctr --examples="$examples" --test_examples=50000 --stream_parts=12 --drift=1 \
    --out="$d" | grep -E "^law|planted" | sed 's/^/   /'
  mkdir -p "$d/first"
  cp "$d/stream/criteo_layout.txt" "$d"/stream/part-0000[0-2].txt "$d/first/"
  for run in online frozen; do
    src="$d/stream"; [ "$run" = frozen ] && src="$d/first"
    rate=$(cluster "$run" 1 1 "--checkpoint_dir=$work/$run.ckpt --delta_every_secs=10" \
      "--data_dir=$src --follow --follow_idle_secs=2 --train_steps=0 --eval_every=500")
    # The online model as serving reads it: the newest snapshot plus the deltas after it.
    "$BIN/dtrain_eval" --model=dlrm --data_format=criteo --embedding_dim=16 --data_dir="$d" \
      --checkpoint="$work/$run.ckpt" --follow_deltas > "$work/$run.eval.log" 2>&1
    read -r auc loss <<< "$(eval_auc "$work/$run.eval.log")"
    deltas=$(ls "$work/$run.ckpt" | grep -c model.delta- || true)
    printf "   %-7s AUC %s, log loss %s on the stream's end (%s deltas, %s examples/sec): %s\n" "$run" "$auc" "$loss" \
      "$deltas" "$rate" "$(grep '^model at step' "$work/$run.eval.log" | sed 's/:.*//')"
    eval "${run}_auc=$auc"
  done
  echo "   online - frozen: $(python3 -c "print('%.4f' % ($online_auc - $frozen_auc))") AUC"
fi

if has deltas || has hybrid || has tables; then
  s="$work/still"
  "$BIN/dtrain_convert" --synthetic_ctr --examples="$examples" --test_examples=50000 --out="$s" > /dev/null
fi

if has deltas; then
  # Six passes over the data: the run lasts several delta intervals, so that most deltas are written as in a long
  # run (the first one also pays for the writer's fresh buffers: 0.55 s against 0.15 s for the next ones here).
  steps=$((6 * examples / 512))
  echo "== deltas: 1 ps + 2 sync workers, $steps steps of 2 x 256, with and without a delta every 10 s ($repeats x, interleaved)"
  with=() without=()
  for ((r = 0; r < repeats; r++)); do
    without+=("$(cluster nodelta$r 1 2 "--checkpoint_dir=$work/nodelta$r.ckpt" \
      "--data_dir=$s --mode=sync --train_steps=$steps --shuffle=false")")
    with+=("$(cluster delta$r 1 2 "--checkpoint_dir=$work/delta$r.ckpt --delta_every_secs=10" \
      "--data_dir=$s --mode=sync --train_steps=$steps --shuffle=false")")
  done
  a=$(echo "${without[*]}" | median); b=$(echo "${with[*]}" | median)
  echo "   without deltas: ${without[*]} examples/sec (median $a)"
  echo "   with deltas:    ${with[*]} examples/sec (median $b)"
  grep -h "deltas written" "$work"/delta*.ps0.log | sed 's/.*ps task 0: /   ps: /'
  # Each pair ran back to back: its ratio holds while the machine's speed drifts between pairs.
  ratios=$(python3 -c "w='${with[*]}'.split(); o='${without[*]}'.split(); print(' '.join('%.3f' % (float(x) / float(y)) for x, y in zip(w, o)))")
  r=$(echo "$ratios" | median)
  echo "   with / without, pair by pair: $ratios (median $r)"
  echo "   cost: $(python3 -c "print('%.1f%%' % (100 * (1 - $r)))") of throughput (median of the pairs); $(python3 -c "print('%.1f%%' % (100 * (1 - $b / $a)))") (ratio of the medians)"
fi

if has tables; then
  echo "== tables: rows held, table bytes and ps peak RSS on the drifting stream ($examples examples, 1 ps + 1 worker)"
  d="$work/drift"
  [ -d "$d/stream" ] || "$BIN/dtrain_convert" --synthetic_ctr --examples="$examples" --test_examples=50000 \
    --stream_parts=12 --drift=1 --out="$d" > /dev/null
  base="--data_dir=$d/stream --follow --follow_idle_secs=2 --train_steps=0"
  for run in plain admit_ttl fp16; do
    extra=""
    [ "$run" = admit_ttl ] && extra="--admit_probability=0.25 --row_ttl=300"
    [ "$run" = fp16 ] && extra="--row_dtype=fp16 --row_slot_dtype=bf16"
    cluster "tables_$run" 1 1 "--checkpoint_dir=$work/tables_$run.ckpt" "$base $extra" > /dev/null
    "$BIN/dtrain_eval" --model=dlrm --data_format=criteo --embedding_dim=16 --data_dir="$d" \
      --checkpoint="$work/tables_$run.ckpt" > "$work/tables_$run.eval.log" 2>&1
    read -r auc loss <<< "$(eval_auc "$work/tables_$run.eval.log")"
    line=$(grep "^sparse tables:" "$work/tables_$run.w0.log")
    rows=$(echo "$line" | sed -n 's/^sparse tables: \([0-9]*\) rows.*/\1/p')
    bytes=$(echo "$line" | sed -n 's/.*; \([0-9]*\) bytes of tables.*/\1/p')
    printf "   %-9s %s; %s rows held, %s MB of tables, ps peak RSS %s MB; AUC %s, log loss %s\n" "$run" "$extra" \
      "$rows" "$((bytes / 1000000))" "$(($(cat "$work/tables_$run.ps0.rss") / 1024))" "$auc" "$loss"
  done
fi

if has hybrid; then
  echo "== hybrid: 2 ps + 2 workers, sync vs --sparse_mode=async, $examples examples ($repeats x, interleaved)"
  sync_rates=() hybrid_rates=()
  steps=$((examples / 512))
  for ((r = 0; r < repeats; r++)); do
    sync_rates+=("$(cluster sync$r 2 2 "" "--data_dir=$s --mode=sync --train_steps=$steps --shuffle=false")")
    hybrid_rates+=("$(cluster hybrid$r 2 2 "" \
      "--data_dir=$s --mode=sync --sparse_mode=async --train_steps=$steps --shuffle=false")")
  done
  a=$(echo "${sync_rates[*]}" | median); b=$(echo "${hybrid_rates[*]}" | median)
  echo "   sync:   ${sync_rates[*]} examples/sec (median $a); AUC/log loss $(auc_of "$work/sync0.w0.log")"
  echo "   hybrid: ${hybrid_rates[*]} examples/sec (median $b); AUC/log loss $(auc_of "$work/hybrid0.w0.log")"
  echo "   hybrid / sync: $(python3 -c "print('%.2fx' % ($b / $a))")"
fi

if has cache; then
  echo "== cache: the worker's sparse bytes per step on Zipf(1.1) ids, without and with a row cache (1 ps + 1 worker)"
  z="$work/zipf11"
  "$BIN/dtrain_convert" --synthetic_ctr --examples="$examples" --test_examples=50000 --zipf_exponent=1.1 \
    --out="$z" > /dev/null
  steps=$((examples / 256))
  for run in plain cache8 cache32; do
    extra=""
    [ "$run" = cache8 ] && extra="--row_cache_rows=200000 --row_cache_staleness=8"
    [ "$run" = cache32 ] && extra="--row_cache_rows=200000 --row_cache_staleness=32"
    rate=$(cluster "cache_$run" 1 1 "" "--data_dir=$z --train_steps=$steps --shuffle=false $extra")
    printf "   %-7s %s: %s; AUC/log loss %s; %s examples/sec\n" "$run" "$extra" \
      "$(grep 'sparse rows:' "$work/cache_$run.w0.log" | sed 's/^worker 0: sparse rows: //')" \
      "$(auc_of "$work/cache_$run.w0.log")" "$rate"
  done
fi
