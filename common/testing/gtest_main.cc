// The main() of every dtrain GoogleTest binary (cmake/DtrainHelpers.cmake links it instead of gtest_main), so
// that ctest tells a skipped test from a passed one. GoogleTest exits 0 when tests GTEST_SKIP(); ctest would
// call that "Passed". This main maps the outcome to exit codes ctest understands:
//
//   0    every test that ran passed
//   1    a test failed (GoogleTest's own verdict)
//   1    no test ran at all: a --gtest_filter that matches nothing is a broken registration, not a pass
//   77   every test that ran was skipped: ctest's SKIP_RETURN_CODE (set by dtrain_cc_test), shown as
//   "Skipped" 1    with --dtrain_fail_on_mixed_skips (ctest entries get it): some tests passed and some were
//   skipped in
//        one entry. ctest could only call that "Passed" and the skip would go unseen: register the tests that
//        may skip as their own entry (dtrain_cc_test(... SKIPPABLE <group> <filter>)). Run by hand, without
//        the flag, a mixed run exits 0 and says how many tests were skipped.
//
// Each skip's reason is printed by GoogleTest ("[  SKIPPED ] ..." with the GTEST_SKIP() message); ctest keeps
// it in its log (ctest --output-on-failure does not show it; ctest -V or LastTest.log does).
//
// DTRAIN_REQUIRE_DEPS=1 in the environment (scripts/test.sh sets it, having installed every dependency): a test
// skipped for any other reason than the hardware (its GTEST_SKIP() message names a GPU or CUDA device, a CPU
// feature "on this CPU", or a build under AddressSanitizer) fails the binary (exit 1), naming it and the reason:
// a missing data set, package or tool is then a broken setup, not a pass. The scripts in tests/ do the same.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <regex>
#include <string>

namespace {

constexpr int kSkipReturnCode = 77;
constexpr char kFailOnMixedSkipsFlag[] = "--dtrain_fail_on_mixed_skips";

// Removes our own flags from argv (GoogleTest has left everything it does not know in place). Returns whether
// the mixed-skips flag was there.
bool TakeOwnFlags(int* argc, char** argv) {
  bool fail_on_mixed = false;
  int out = 1;
  for (int i = 1; i < *argc; ++i) {
    if (std::strcmp(argv[i], kFailOnMixedSkipsFlag) == 0) {
      fail_on_mixed = true;
    } else {
      argv[out++] = argv[i];
    }
  }
  *argc = out;
  argv[out] = nullptr;
  return fail_on_mixed;
}

// The skip messages of a test ("" when it was not skipped).
std::string SkipReason(const ::testing::TestResult& r) {
  std::string why;
  for (int i = 0; i < r.total_part_count(); ++i) {
    const ::testing::TestPartResult& p = r.GetTestPartResult(i);
    if (p.skipped()) why += std::string(why.empty() ? "" : "; ") + p.message();
  }
  return why;
}

// Skips that the hardware or the build explains (see the top of this file).
bool HardwareReason(const std::string& why) {
  static const std::regex hardware("GPU|CUDA device|on this CPU|AddressSanitizer");
  return std::regex_search(why, hardware);
}

// With DTRAIN_REQUIRE_DEPS=1: the tests skipped for another reason than the hardware, "Suite.Name (reason)".
std::string SkipsThatMustNotHappen(const ::testing::UnitTest& unit) {
  const char* require = std::getenv("DTRAIN_REQUIRE_DEPS");
  if (require == nullptr || std::strcmp(require, "1") != 0) return "";
  std::string bad;
  for (int i = 0; i < unit.total_test_suite_count(); ++i) {
    const ::testing::TestSuite& suite = *unit.GetTestSuite(i);
    for (int j = 0; j < suite.total_test_count(); ++j) {
      const ::testing::TestInfo& t = *suite.GetTestInfo(j);
      if (!t.should_run() || !t.result()->Skipped()) continue;
      const std::string why = SkipReason(*t.result());
      if (HardwareReason(why)) continue;
      bad += std::string(bad.empty() ? "" : ", ") + suite.name() + "." + t.name() + " (" + why + ")";
    }
  }
  return bad;
}

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  const bool fail_on_mixed = TakeOwnFlags(&argc, argv);
  if (argc > 1) {
    std::fprintf(stderr, "unknown argument '%s' (GoogleTest flags and %s are accepted)\n", argv[1],
                 kFailOnMixedSkipsFlag);
    return 1;
  }
  const int rc = RUN_ALL_TESTS();
  const ::testing::UnitTest& unit = *::testing::UnitTest::GetInstance();
  // --gtest_list_tests and friends run nothing on purpose.
  if (GTEST_FLAG_GET(list_tests)) return rc;
  if (rc != 0) return rc;
  if (const std::string bad = SkipsThatMustNotHappen(unit); !bad.empty()) {
    std::fprintf(stderr,
                 "skipped with DTRAIN_REQUIRE_DEPS=1, for a reason other than the hardware: %s. Install what they "
                 "need (scripts/install_deps.sh), or unset DTRAIN_REQUIRE_DEPS to let them skip\n",
                 bad.c_str());
    return 1;
  }
  const int ran = unit.test_to_run_count();
  const int skipped = unit.skipped_test_count();
  if (ran == 0) {
    std::fprintf(stderr, "no test ran: the test filter '%s' matches no test of this binary\n",
                 std::string(GTEST_FLAG_GET(filter)).c_str());
    return 1;
  }
  if (skipped == ran) {
    std::printf("all %d test%s skipped: exiting %d so that ctest reports this entry as skipped\n", ran,
                ran == 1 ? "" : "s", kSkipReturnCode);
    return kSkipReturnCode;
  }
  if (skipped > 0) {
    std::string names;
    for (int i = 0; i < unit.total_test_suite_count(); ++i) {
      const ::testing::TestSuite& suite = *unit.GetTestSuite(i);
      for (int j = 0; j < suite.total_test_count(); ++j) {
        const ::testing::TestInfo& t = *suite.GetTestInfo(j);
        if (t.should_run() && t.result()->Skipped()) {
          names += std::string(names.empty() ? "" : ", ") + suite.name() + "." + t.name();
        }
      }
    }
    if (fail_on_mixed) {
      std::fprintf(
          stderr,
          "%d of %d tests were skipped (%s) in a ctest entry whose other tests ran: ctest would report "
          "the skip as passed. Register them as their own entry: dtrain_cc_test(... SKIPPABLE <group> "
          "<gtest filter>)\n",
          skipped, ran, names.c_str());
      return 1;
    }
    std::printf("%d of %d tests skipped: %s\n", skipped, ran, names.c_str());
  }
  return 0;
}
