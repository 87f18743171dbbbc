#!/usr/bin/env bash
# Builds the libFuzzer harnesses (clang, ASan + UBSan, in build-fuzz/) and runs each for N seconds, then prints
# executions, executions per second and crashes per harness. Exits 1 if any harness crashed (a crash, a
# sanitizer report, a failed CHECK, a timeout or running out of memory), 2 on bad arguments.
#
#   scripts/fuzz.sh --seconds=60               # every harness registered with dtrain_fuzzer, 60 s each
#   scripts/fuzz.sh --seconds=600 --only=checkpoint_fuzzer
#   scripts/fuzz.sh --runs=1000000 --jobs=1    # depth: each harness until 1 M executions (at most --seconds,
#                                              # default then 3600), one at a time beside other work
#
# The corpus each harness grows is kept in build-fuzz/fuzz/corpus/<harness>/ (so later runs start from it);
# crashing inputs land in build-fuzz/fuzz/crashes/<harness>/ (replay one: build-fuzz/bin/<harness> FILE), the
# fuzzer's output in build-fuzz/fuzz/logs/<harness>.log.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=""
runs=""
jobs="$(nproc)"
only=""
build=build-fuzz
usage() { sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; }
for arg in "$@"; do
  case "$arg" in
    --seconds=*) seconds="${arg#*=}" ;;
    --only=*) only="${arg#*=}" ;;
    --runs=*) runs="${arg#*=}" ;;
    --jobs=*) jobs="${arg#*=}" ;;
    --build_dir=*) build="${arg#*=}" ;;
    -h|--help) usage; exit 0 ;;
    *) echo "fuzz.sh: unknown argument '$arg'" >&2; usage >&2; exit 2 ;;
  esac
done
[ -n "$seconds" ] || { if [ -n "$runs" ]; then seconds=3600; else seconds=10; fi; }
for v in seconds:"$seconds" jobs:"$jobs" ${runs:+runs:"$runs"}; do
  if ! [[ "${v#*:}" =~ ^[0-9]+$ ]] || [ "${v#*:}" -lt 1 ]; then
    echo "fuzz.sh: --${v%%:*} must be a positive integer, got '${v#*:}'" >&2; exit 2
  fi
done
for tool in clang clang++; do
  command -v "$tool" >/dev/null || { echo "fuzz.sh: $tool not found (scripts/install_deps.sh installs it)" >&2; exit 2; }
done

launcher=()
if command -v ccache >/dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache); fi
# -O1 -fno-omit-frame-pointer, as OSS-Fuzz builds its fuzzers: quicker to compile than -O3.
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -DNDEBUG" \
  "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -DNDEBUG" -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DDTRAIN_FUZZ=ON -DDTRAIN_CUDA=OFF "${launcher[@]}" >/dev/null
nice -n 10 cmake --build "$build" -j"$(nproc)" --target dtrain_fuzzers >/dev/null
"$build/bin/dtrain_fuzz_seeds" "$build/fuzz/seeds"

# The harnesses run side by side, one a core (each alone takes one core; --jobs), and report in their listed order.
results="$build/fuzz/results"
rm -rf "$results"
mkdir -p "$results"
# run_one INDEX NAME SEEDS: runs a harness and writes its table row (and, on a crash, the end of its log) to
# $results/INDEX.{row,err}.
run_one() {
  local i="$1" name="$2" seeds="$3"
  local corpus="$build/fuzz/corpus/$name" crashes="$build/fuzz/crashes/$name" log="$build/fuzz/logs/$name.log"
  mkdir -p "$corpus" "$crashes" "$(dirname "$log")"
  local seed_dirs=() dirs d
  IFS=: read -r -a dirs <<<"$seeds"
  for d in "${dirs[@]}"; do [ -d "$d" ] && seed_dirs+=("$d"); done
  local before after rc=0 execs rate new
  before=$(find "$crashes" -type f | wc -l)
  nice -n 10 "$build/bin/$name" -max_total_time="$seconds" ${runs:+-runs="$runs"} -print_final_stats=1 -timeout=10 -rss_limit_mb=2048 \
    -artifact_prefix="$crashes/" "$corpus" "${seed_dirs[@]}" >"$log" 2>&1 || rc=$?
  after=$(find "$crashes" -type f | wc -l)
  execs=$(awk '/stat::number_of_executed_units/ {print $2}' "$log" | tail -1)
  rate=$(awk '/stat::average_exec_per_sec/ {print $2}' "$log" | tail -1)
  new=$((after - before))
  printf '%-22s %12s %10s %8s\n' "$name" "${execs:-?}" "${rate:-?}" "$new" >"$results/$i.row"
  if [ "$rc" != 0 ] || [ "$new" != 0 ]; then
    {
      echo "---- $name exited $rc; the end of $log:"
      tail -40 "$log"
      ls -t "$crashes" | head -n "$new" | sed "s|^|crashing input: $crashes/|"
    } >"$results/$i.err"
  fi
}

ran=0
while read -r name seeds; do
  [ -n "$name" ] || continue
  if [ -n "$only" ] && [ "$name" != "$only" ]; then continue; fi
  while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || true; done
  run_one "$ran" "$name" "$seeds" &
  ran=$((ran + 1))
done <"$build/fuzzers.txt"
if [ "$ran" = 0 ]; then echo "fuzz.sh: no harness matched '${only}' (see $build/fuzzers.txt)" >&2; exit 2; fi
wait
failed=0
printf '%-22s %12s %10s %8s  %s\n' harness executions exec/s crashes \
  "(each run ${runs:+to $runs executions or }${seconds} s, ${jobs} at a time)"
for ((i = 0; i < ran; i++)); do
  if ! cat "$results/$i.row" 2>/dev/null; then echo "harness $i: no result" >&2; failed=1; fi
  if [ -f "$results/$i.err" ]; then cat "$results/$i.err" >&2; failed=1; fi
done
exit "$failed"
