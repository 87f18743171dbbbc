// main() of the GPU test binaries: GoogleTest's, except that a run in which every selected test skipped (no
// usable GPU) exits 77, which ctest's SKIP_RETURN_CODE reports as "Skipped". Any failure still exits 1.
#include <cstdio>

#include "gtest/gtest.h"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  const int rc = RUN_ALL_TESTS();
  const ::testing::UnitTest* u = ::testing::UnitTest::GetInstance();
  if (rc == 0 && u->test_to_run_count() > 0 && u->skipped_test_count() == u->test_to_run_count()) {
    std::printf("all %d tests skipped (no usable CUDA device): exit code 77 (ctest: Skipped)\n",
                u->test_to_run_count());
    return 77;
  }
  return rc;
}
