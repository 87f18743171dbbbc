#include "common/open_files.h"

#include <sys/resource.h>

#include "gtest/gtest.h"

namespace dtrain {
namespace {

TEST(OpenFilesTest, RaisesTheSoftLimitToTheHardOneCappedAndNeverLowersIt) {
  struct rlimit r;
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &r), 0);
  if (r.rlim_max != RLIM_INFINITY && r.rlim_max < 512) GTEST_SKIP() << "hard limit " << r.rlim_max << " < 512";
  struct rlimit low = r;
  low.rlim_cur = 256;
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &low), 0);
  OpenFileLimit got = RaiseOpenFileLimit(/*cap=*/400);
  EXPECT_TRUE(got.error.empty()) << got.error;
  EXPECT_EQ(got.before, 256);
  EXPECT_EQ(got.after, 400);
  struct rlimit now;
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &now), 0);
  EXPECT_EQ(now.rlim_cur, 400u);
  got = RaiseOpenFileLimit(/*cap=*/300);  // already above the cap: left as it is
  EXPECT_EQ(got.before, 400);
  EXPECT_EQ(got.after, 400);
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &r), 0);
}

}  // namespace
}  // namespace dtrain
