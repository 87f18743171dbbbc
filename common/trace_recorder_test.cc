#include "common/trace_recorder.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/file_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dtrain {
namespace {

using json = nlohmann::json;
using ::testing::HasSubstr;

std::vector<json> EventsOfPhase(const json& trace, const std::string& ph) {
  std::vector<json> out;
  for (const json& e : trace["traceEvents"]) {
    if (e["ph"] == ph) out.push_back(e);
  }
  return out;
}

TEST(TraceRecorderTest, KeepsOnlyTheWindowsSteps) {
  TraceRecorder trace({.first_step = 3, .last_step = 5, .max_events = 100, .process_name = "worker 7"});
  for (int64_t step = 0; step < 10; ++step) {
    trace.SetStep(step);
    TraceSpan span(&trace, "step", "step");
    EXPECT_EQ(span.recording(), step >= 3 && step <= 5);
  }
  trace.Complete("apply", "ps", 100, 200, /*step=*/4, "slice 1");
  trace.Complete("apply", "ps", 100, 200, /*step=*/6);
  EXPECT_EQ(trace.events(), 4);
  const json j = json::parse(trace.ToJson());
  std::set<int64_t> steps;
  for (const json& e : EventsOfPhase(j, "X")) {
    steps.insert(e["args"]["step"].get<int64_t>());
    EXPECT_GE(e["dur"].get<double>(), 0.0);
    EXPECT_EQ(e["pid"].get<int>(), getpid());
  }
  EXPECT_EQ(steps, (std::set<int64_t>{3, 4, 5}));
  EXPECT_EQ(j["otherData"]["first_step"], 3);
  EXPECT_EQ(j["otherData"]["last_step"], 5);
  const std::vector<json> meta = EventsOfPhase(j, "M");
  ASSERT_FALSE(meta.empty());
  EXPECT_EQ(meta[0]["name"], "process_name");
  EXPECT_EQ(meta[0]["args"]["name"], "worker 7");
}

TEST(TraceRecorderTest, TimesAreMicrosecondsOfTheSteadyClock) {
  TraceRecorder trace({.first_step = 0, .last_step = 0, .process_name = "p"});
  trace.SetStep(0);
  const int64_t before = TraceRecorder::NowNs();
  { TraceSpan span(&trace, "sleep", "test"); std::this_thread::sleep_for(std::chrono::milliseconds(20)); }
  const int64_t after = TraceRecorder::NowNs();
  const json j = json::parse(trace.ToJson());
  const std::vector<json> x = EventsOfPhase(j, "X");
  ASSERT_EQ(x.size(), 1u);
  const double ts = x[0]["ts"], dur = x[0]["dur"];
  EXPECT_GE(ts, static_cast<double>(before) / 1e3);
  EXPECT_LE(ts + dur, static_cast<double>(after) / 1e3 + 1);
  EXPECT_GE(dur, 19000.0);
}

TEST(TraceRecorderTest, CapHoldsAndDropsAreCounted) {
  TraceRecorder trace({.first_step = 0, .last_step = 100, .max_events = 50, .process_name = "p"});
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&trace, t] {
      trace.NameThread("lane " + std::to_string(t));
      for (int i = 0; i < 100; ++i) trace.Complete("e", "c", i, i + 1, /*step=*/i % 101);
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(trace.events(), 50);
  EXPECT_EQ(trace.dropped(), 350);
  const json j = json::parse(trace.ToJson());
  EXPECT_EQ(EventsOfPhase(j, "X").size(), 50u);
  EXPECT_EQ(j["otherData"]["dropped_events"], 350);
  std::set<std::string> names;
  std::set<int> tids;
  for (const json& e : EventsOfPhase(j, "M")) {
    if (e["name"] == "thread_name") {
      names.insert(e["args"]["name"].get<std::string>());
      tids.insert(e["tid"].get<int>());
    }
  }
  EXPECT_EQ(names, (std::set<std::string>{"lane 0", "lane 1", "lane 2", "lane 3"}));
  EXPECT_EQ(tids.size(), 4u);  // one track per thread
}

TEST(TraceRecorderTest, ClockOffsetsAndMetadataAreWritten) {
  TraceRecorder trace({.first_step = 0, .last_step = 1, .process_name = "worker 0"});
  trace.SetClockOffset(0, -12345, 800);
  trace.SetClockOffset(1, 777, 900);
  trace.SetMetadata("job", "worker");
  const std::string dir = ::testing::TempDir() + "/trace_recorder_test";
  ASSERT_TRUE(CheckTraceDir(dir).ok());
  const std::string path = dir + "/worker-0.trace.json";
  ASSERT_TRUE(trace.Write(path).ok());
  absl::StatusOr<std::string> text = ReadFileToString(path);
  ASSERT_TRUE(text.ok());
  const json j = json::parse(*text);
  ASSERT_EQ(j["otherData"]["clock_offsets"].size(), 2u);
  EXPECT_EQ(j["otherData"]["clock_offsets"][0]["ps_task"], 0);
  EXPECT_EQ(j["otherData"]["clock_offsets"][0]["offset_ns"], -12345);
  EXPECT_EQ(j["otherData"]["clock_offsets"][1]["rtt_ns"], 900);
  EXPECT_EQ(j["otherData"]["job"], "worker");
}

TEST(TraceRecorderTest, NullRecorderSpanDoesNothing) {
  TraceSpan span(nullptr, "x", "y");
  EXPECT_FALSE(span.recording());
}

TEST(TraceStepsFlagTest, ParsesAndRejects) {
  absl::StatusOr<TraceWindow> w = ParseTraceSteps("10:29");
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(w->first, 10);
  EXPECT_EQ(w->last, 29);
  EXPECT_TRUE(ParseTraceSteps("0:0").ok());
  for (const char* bad : {"", "5", "5:", ":5", "a:b", "1:2:3", "-1:4", "9:3"}) {
    absl::StatusOr<TraceWindow> r = ParseTraceSteps(bad);
    EXPECT_FALSE(r.ok()) << bad;
    EXPECT_THAT(std::string(r.status().message()), HasSubstr("--trace_steps")) << bad;
  }
  EXPECT_THAT(std::string(ParseTraceSteps("9:3").status().message()), HasSubstr("0 <= A <= B"));
}

TEST(TraceDirFlagTest, RejectsWhatCannotHoldFiles) {
  const std::string base = ::testing::TempDir() + "/trace_dir_test";
  ASSERT_TRUE(CheckTraceDir(base + "/made/here").ok());
  struct stat st;
  EXPECT_EQ(stat((base + "/made/here").c_str(), &st), 0);
  ASSERT_TRUE(WriteFileAtomically(base + "/a_file", "x").ok());
  absl::Status s = CheckTraceDir(base + "/a_file");
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr("--trace_dir=" + base + "/a_file"));
  EXPECT_FALSE(CheckTraceDir("").ok());
  if (geteuid() != 0) {  // root writes anywhere
    ASSERT_EQ(chmod((base + "/made").c_str(), 0500), 0);
    EXPECT_THAT(std::string(CheckTraceDir(base + "/made").message()), HasSubstr("not writable"));
    chmod((base + "/made").c_str(), 0700);
  }
}

}  // namespace
}  // namespace dtrain
