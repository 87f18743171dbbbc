#include "common/trace_flags.h"

#include <unistd.h>

#include <string>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

ABSL_DECLARE_FLAG(std::string, trace_steps);
ABSL_DECLARE_FLAG(std::string, trace_dir);

namespace dtrain {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

class TraceFlagsTest : public ::testing::Test {
 protected:
  absl::FlagSaver flags_;  // what a test sets goes back to the defaults after it
  std::string Dir(const std::string& name) {
    return absl::StrCat(::testing::TempDir(), "/trace_flags_test.", ::getpid(), ".", name);
  }
};

TEST_F(TraceFlagsTest, NoFlagsNoRecorder) {
  absl::StatusOr<std::unique_ptr<TraceRecorder>> trace = TimelineFromFlags("ps 0");
  ASSERT_TRUE(trace.ok()) << trace.status();
  EXPECT_EQ(*trace, nullptr);
}

TEST_F(TraceFlagsTest, OneFlagWithoutTheOtherIsRefusedNamingIt) {
  absl::SetFlag(&FLAGS_trace_steps, "2:4");
  absl::StatusOr<std::unique_ptr<TraceRecorder>> trace = TimelineFromFlags("ps 0");
  ASSERT_FALSE(trace.ok());
  EXPECT_EQ(trace.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(trace.status().message()), HasSubstr("--trace_dir"));
}

TEST_F(TraceFlagsTest, WritesTheFileInTraceDirAndSaysSo) {
  const std::string dir = Dir("written");
  absl::SetFlag(&FLAGS_trace_steps, "2:4");
  absl::SetFlag(&FLAGS_trace_dir, dir);
  absl::StatusOr<std::unique_ptr<TraceRecorder>> trace = TimelineFromFlags("worker 1");
  ASSERT_TRUE(trace.ok()) << trace.status();
  ASSERT_NE(*trace, nullptr);
  { TraceSpan span(trace->get(), "forward", "compute", 3); }
  { TraceSpan span(trace->get(), "outside", "compute", 7); }
  absl::StatusOr<std::string> line = WriteTimeline(**trace, "worker-1");
  ASSERT_TRUE(line.ok()) << line.status();
  const std::string path = dir + "/worker-1.trace.json";
  EXPECT_EQ(*line, "timeline of steps 2:4 (1 events, 0 dropped) written to " + path);
  absl::StatusOr<std::string> text = ReadFileToString(path);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_THAT(*text, HasSubstr("\"forward\""));
  EXPECT_THAT(*text, HasSubstr("worker 1"));
}

TEST_F(TraceFlagsTest, AFailedWriteNamesTheFlag) {
  const std::string dir = Dir("gone");
  absl::SetFlag(&FLAGS_trace_steps, "0:1");
  absl::SetFlag(&FLAGS_trace_dir, dir);
  absl::StatusOr<std::unique_ptr<TraceRecorder>> trace = TimelineFromFlags("ps 0");
  ASSERT_TRUE(trace.ok()) << trace.status();
  ASSERT_NE(*trace, nullptr);
  absl::SetFlag(&FLAGS_trace_dir, dir + "/not/a/directory");  // the directory was made for the first one
  absl::StatusOr<std::string> line = WriteTimeline(**trace, "ps-0");
  ASSERT_FALSE(line.ok());
  EXPECT_THAT(std::string(line.status().message()), StartsWith("--trace_dir: "));
}

}  // namespace
}  // namespace dtrain
