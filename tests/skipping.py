"""skip(why): how the Python tests in tests/ give up when something they need is missing. Exit 77 (ctest's
SKIP_RETURN_CODE: reported as skipped), or exit 1 with DTRAIN_REQUIRE_DEPS=1: scripts/test.sh sets it after
installing every dependency, so that a missing package or data set fails CI instead of skipping silently."""
import os
import sys


def skip(why):
    if os.environ.get("DTRAIN_REQUIRE_DEPS") == "1":
        print("FAIL: %s (DTRAIN_REQUIRE_DEPS=1: a missing dependency fails; scripts/install_deps.sh installs it)" % why)
        sys.exit(1)
    print("SKIP: %s" % why)
    sys.exit(77)
