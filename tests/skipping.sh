# Sourced by the test scripts in tests/: `skip WHY` exits 77 (ctest's SKIP_RETURN_CODE: reported as skipped), or
# exits 1 with DTRAIN_REQUIRE_DEPS=1: scripts/test.sh sets it after installing every dependency, so that a missing
# package, data set or tool fails CI instead of skipping silently.
skip() {
  if [ "${DTRAIN_REQUIRE_DEPS:-0}" = 1 ]; then
    echo "FAIL: $* (DTRAIN_REQUIRE_DEPS=1: a missing dependency fails; scripts/install_deps.sh installs it)"
    exit 1
  fi
  echo "SKIP: $*"
  exit 77
}
