# Sourced by the cluster tests in tests/ (after skipping.sh): the assertions they share. The sourcing script sets
# passed=0 failed=0 and prints them at its end.
#   check NAME CMD ARGS...      runs CMD; prints "ok: NAME" or "FAIL: NAME" and counts it
#   wait_for_line FILE REGEX S  waits up to S seconds (polled every 0.1 s) for a line of FILE matching REGEX
check() {
  local name="$1"; shift
  if "$@"; then echo "ok: $name"; passed=$((passed + 1)); else echo "FAIL: $name"; failed=$((failed + 1)); fi
}
wait_for_line() {
  for _ in $(seq $(($3 * 10))); do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 0.1; done
  return 1
}
#   make_test_dir PREFIX        a fresh directory in $dir and an empty list bg of background pids: at exit the pids
#                               are killed and the directory removed (kept, and named, with KEEP=1)
make_test_dir() {
  dir="$(mktemp -d "/tmp/$1.XXXXXX")"
  bg=()
  trap _end_test_dir EXIT
}
_end_test_dir() {
  for p in "${bg[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  if [ -z "${KEEP:-}" ]; then rm -rf "$dir"; else echo "kept $dir"; fi
}
#   last_step FILE              the step of FILE's last progress line ("step N, loss ..."), empty before one
#   wait_step FILE N            waits up to 120 s for a progress line of step N or later; else FAIL and exit 1
last_step() { grep -o '^step [0-9]*,' "$1" 2>/dev/null | tail -1 | tr -dc 0-9; }
wait_step() {
  for _ in $(seq 1200); do [ "$(last_step "$1")" -ge "$2" ] 2>/dev/null && return 0; sleep 0.1; done
  echo "FAIL: $1 did not reach step $2"; tail -5 "$1"; exit 1
}
