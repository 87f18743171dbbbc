#!/usr/bin/env bash
# Installs what is missing and runs every check CI runs (this is what .ci/run calls), stage by stage, timed:
#   1. build        scripts/build.sh into build/ (the CUDA backend too where nvcc exists), then its suite with
#                   ctest: the multi-process tests (label "integration"), the GPU tests and the unit tests only a
#                   CUDA build has. Every dependency is installed by then, so DTRAIN_REQUIRE_DEPS=1 is set:
#                   a test that would skip for anything but the hardware (no GPU) fails instead
#                   (common/testing/gtest_main.cc, tests/skipping.sh, tests/skipping.py)
#   2. sanitizers   the unit tests (everything not labelled "integration") built with AddressSanitizer +
#                   UndefinedBehaviorSanitizer into build-asan/ (their own sources at -O0 and under ASan only, the
#                   code under test at -O1) and run with ctest. CI compiles each unit test once: here, not in stage 1
#                   (-DDTRAIN_UNIT_TESTS_IN_ALL=OFF there; with DTRAIN_TEST_SANITIZERS=0 stage 1 runs them)
#   3. fuzz         every libFuzzer harness for DTRAIN_FUZZ_SECONDS seconds (default 5), scripts/fuzz.sh
# Every stage runs even when an earlier one failed; the exit code is non-zero if any failed. Arguments go to
# the main build's configure step (e.g. -DDTRAIN_CUDA=OFF). DTRAIN_TEST_SANITIZERS=0 or DTRAIN_FUZZ_SECONDS=0
# skip stage 2 or 3.
set -uo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh || exit 1
# Installed: a test may skip only for want of hardware (a GPU); a missing package or data set fails.
export DTRAIN_REQUIRE_DEPS=1

jobs="$(nproc)"
launcher=()
if command -v ccache >/dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache); fi
names=()
results=()
failed=0

# stage NAME COMMAND...: runs the command, records its time and result.
stage() {
  local name="$1"
  shift
  echo "==== $name"
  local start=$SECONDS rc=0
  "$@" || rc=$?
  local secs=$((SECONDS - start))
  names+=("$name")
  if [ "$rc" = 0 ]; then results+=("passed   $((secs / 60)) min $((secs % 60)) s"); else
    results+=("FAILED   $((secs / 60)) min $((secs % 60)) s (exit $rc)")
    failed=1
  fi
}

# The unit tests run in the sanitizer stage; without it, in the main build.
unit_in_main=OFF
if [ "${DTRAIN_TEST_SANITIZERS:-1}" = 0 ]; then unit_in_main=ON; fi
# CUDA code is compiled for one architecture here (sm_80 and its PTX, which newer GPUs JIT): CI checks that it
# compiles and links; scripts/build.sh alone builds 80 and 90.
main_build() { scripts/build.sh "-DDTRAIN_UNIT_TESTS_IN_ALL=$unit_in_main" -DCMAKE_CUDA_ARCHITECTURES=80 "$@"; }
main_tests() { (cd build && ctest --output-on-failure --timeout 600 -j"$jobs"); }

sanitizer_build() {
  cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG" \
    "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG" -DDTRAIN_SANITIZE=address,undefined -DDTRAIN_CUDA=OFF \
    "-DDTRAIN_TEST_COMPILE_OPTIONS=-O0;-fno-sanitize=undefined" \
    "${launcher[@]}" >/dev/null &&
    cmake --build build-asan -j"$jobs" --target dtrain_unit_tests
}
sanitizer_tests() {
  # halt_on_error + print_stacktrace: the first report fails the test with its stack.
  (cd build-asan &&
    ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:strict_string_checks=1" \
    UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1" \
    ctest --output-on-failure --timeout 900 -LE integration -j"$jobs")
}

stage "build" main_build "$@"
stage "tests" main_tests
if [ "${DTRAIN_TEST_SANITIZERS:-1}" != 0 ]; then
  stage "sanitizer build (ASan+UBSan)" sanitizer_build
  stage "sanitizer unit tests" sanitizer_tests
fi
if [ "${DTRAIN_FUZZ_SECONDS:-5}" != 0 ]; then
  stage "fuzz (${DTRAIN_FUZZ_SECONDS:-5} s per harness, incl. build)" scripts/fuzz.sh --seconds="${DTRAIN_FUZZ_SECONDS:-5}"
fi

echo "==== summary"
for i in "${!names[@]}"; do printf '  %-45s %s\n' "${names[$i]}" "${results[$i]}"; done
exit "$failed"
