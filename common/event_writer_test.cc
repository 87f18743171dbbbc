#include "common/event_writer.h"

#include <dirent.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <algorithm>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "common/crc32c.h"
#include "common/file_util.h"
#include "common/event_test_decoder.h"
#include "common/testing/scratch_dir.h"
#include "gtest/gtest.h"

namespace dtrain {
namespace {

using testing_decoder::AsDouble;
using testing_decoder::AsFloat;
using testing_decoder::Decode;
using testing_decoder::Message;
using testing_decoder::Only;
using testing_decoder::ReadLittleEndian;
using testing_decoder::ReadRecords;

struct Scalar {
  double wall_time;
  int64_t step;
  std::string tag;
  float value;
};

Scalar DecodeScalarEvent(const std::string& record) {
  Message event = Decode(record);
  Scalar s;
  EXPECT_EQ(Only(event, 1).wire_type, 1);
  s.wall_time = AsDouble(Only(event, 1).number);
  EXPECT_EQ(Only(event, 2).wire_type, 0);
  s.step = static_cast<int64_t>(Only(event, 2).number);
  EXPECT_EQ(event.count(3), 0u);  // no file_version
  Message summary = Decode(Only(event, 5).bytes);
  Message value = Decode(Only(summary, 1).bytes);
  s.tag = Only(value, 1).bytes;
  EXPECT_EQ(Only(value, 2).wire_type, 5);
  s.value = AsFloat(Only(value, 2).number);
  return s;
}

class EventWriterTest : public ::testing::Test {
 protected:
  ::dtrain::testing::ScratchDir scratch_{"event_writer_test"};
  const std::string dir_ = scratch_.path();
};

TEST_F(EventWriterTest, WritesFileVersionThenScalars) {
  const double before = absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
  absl::StatusOr<std::unique_ptr<EventWriter>> writer = EventWriter::Create(dir_ + "/logs/train");
  ASSERT_TRUE(writer.ok()) << writer.status();
  const std::string path = (*writer)->path();
  EXPECT_TRUE(absl::StartsWith(path, dir_ + "/logs/train/events.out.tfevents.")) << path;
  char host[256] = {};
  ASSERT_EQ(::gethostname(host, sizeof(host) - 1), 0);
  EXPECT_TRUE(absl::EndsWith(path, std::string(".") + host)) << path;

  ASSERT_TRUE((*writer)->AddScalar("loss", 0, 2.5).ok());
  ASSERT_TRUE((*writer)->AddScalar("loss", 100, 0.125).ok());
  ASSERT_TRUE((*writer)->AddScalar("accuracy/test", 1LL << 40, 0.875).ok());
  ASSERT_TRUE((*writer)->AddScalar("neg", -3, -1e30).ok());
  ASSERT_TRUE((*writer)->Flush().ok());
  const double after = absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());

  // Everything is readable after Flush(), before the writer closes.
  absl::StatusOr<std::string> file = ReadFileToString(path);
  ASSERT_TRUE(file.ok()) << file.status();
  std::vector<std::string> records = ReadRecords(*file);
  ASSERT_EQ(records.size(), 5u);

  Message first = Decode(records[0]);
  EXPECT_EQ(Only(first, 3).bytes, "brain.Event:2");
  const double first_time = AsDouble(Only(first, 1).number);
  EXPECT_GE(first_time, std::floor(before));
  EXPECT_LE(first_time, after);
  // The file name carries the same second as the first event.
  EXPECT_TRUE(absl::StrContains(path, ".tfevents." + std::to_string(static_cast<int64_t>(first_time)) + "."))
      << path;

  const std::vector<Scalar> expected = {{0, 0, "loss", 2.5f},
                                        {0, 100, "loss", 0.125f},
                                        {0, 1LL << 40, "accuracy/test", 0.875f},
                                        {0, -3, "neg", -1e30f}};
  for (size_t i = 0; i < expected.size(); ++i) {
    SCOPED_TRACE(i);
    Scalar s = DecodeScalarEvent(records[i + 1]);
    EXPECT_EQ(s.tag, expected[i].tag);
    EXPECT_EQ(s.step, expected[i].step);
    EXPECT_EQ(s.value, expected[i].value);
    EXPECT_GE(s.wall_time, first_time);
    EXPECT_LE(s.wall_time, after);
  }
}

TEST_F(EventWriterTest, TwoWritersInOneDirectoryGetDistinctFiles) {
  auto a = EventWriter::Create(dir_);
  auto b = EventWriter::Create(dir_);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_NE((*a)->path(), (*b)->path());
  ASSERT_TRUE((*a)->AddScalar("x", 1, 1.0).ok());
  ASSERT_TRUE((*b)->AddScalar("y", 2, 2.0).ok());
  ASSERT_TRUE((*a)->Close().ok());
  ASSERT_TRUE((*b)->Close().ok());
  absl::StatusOr<std::string> fa = ReadFileToString((*a)->path());
  absl::StatusOr<std::string> fb = ReadFileToString((*b)->path());
  ASSERT_TRUE(fa.ok() && fb.ok());
  std::vector<std::string> ra = ReadRecords(*fa);
  std::vector<std::string> rb = ReadRecords(*fb);
  ASSERT_EQ(ra.size(), 2u);
  ASSERT_EQ(rb.size(), 2u);
  EXPECT_EQ(DecodeScalarEvent(ra[1]).tag, "x");
  EXPECT_EQ(DecodeScalarEvent(rb[1]).tag, "y");
}

TEST_F(EventWriterTest, ConcurrentWritersProduceWholeRecords) {
  auto writer = EventWriter::Create(dir_);
  ASSERT_TRUE(writer.ok()) << writer.status();
  constexpr int kThreads = 4;
  constexpr int kPerThread = 500;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        EXPECT_TRUE((*writer)->AddScalar("t" + std::to_string(t), i, i * 0.5).ok());
      }
    });
  }
  for (std::thread& th : threads) th.join();
  const std::string path = (*writer)->path();
  writer->reset();  // destructor flushes and closes
  absl::StatusOr<std::string> file = ReadFileToString(path);
  ASSERT_TRUE(file.ok());
  std::vector<std::string> records = ReadRecords(*file);
  ASSERT_EQ(records.size(), 1u + kThreads * kPerThread);
  std::map<std::string, int64_t> next_step;
  for (size_t i = 1; i < records.size(); ++i) {
    Scalar s = DecodeScalarEvent(records[i]);
    // Each thread's events appear in its own order.
    EXPECT_EQ(s.step, next_step[s.tag]++);
    EXPECT_EQ(s.value, static_cast<float>(s.step * 0.5));
  }
  EXPECT_EQ(next_step.size(), static_cast<size_t>(kThreads));
}

TEST_F(EventWriterTest, ErrorsAfterCloseAndOnBadInput) {
  auto writer = EventWriter::Create(dir_);
  ASSERT_TRUE(writer.ok());
  EXPECT_EQ((*writer)->AddScalar("", 1, 1.0).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE((*writer)->Close().ok());
  EXPECT_TRUE((*writer)->Close().ok());
  EXPECT_EQ((*writer)->AddScalar("x", 1, 1.0).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ((*writer)->Flush().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(EventWriterTest, CreateFailsWhenDirectoryIsAFile) {
  const std::string file_path = dir_ + "/plain_file";
  ASSERT_TRUE(WriteFileAtomically(file_path, "x").ok());
  auto writer = EventWriter::Create(file_path + "/sub");
  ASSERT_FALSE(writer.ok());
  EXPECT_TRUE(absl::StrContains(writer.status().message(), file_path)) << writer.status();
}

std::vector<double> UnpackDoubles(const std::string& packed) {
  EXPECT_EQ(packed.size() % 8, 0u);
  std::vector<double> out;
  for (size_t i = 0; i + 8 <= packed.size(); i += 8) out.push_back(AsDouble(ReadLittleEndian(packed, i, 8)));
  return out;
}

TEST(HistogramTest, DefaultLimitsAreTensorFlows) {
  const std::vector<double>& limits = Histogram::DefaultLimits();
  // TF: positive limits 1e-12 * 1.1^k below 1e20, then DBL_MAX; mirrored negatives; 0 in the middle.
  int positive = 0;
  for (double v = 1e-12; v < 1e20; v *= 1.1) ++positive;
  ASSERT_EQ(limits.size(), 2u * (positive + 1) + 1);
  EXPECT_EQ(limits.front(), -DBL_MAX);
  EXPECT_EQ(limits.back(), DBL_MAX);
  EXPECT_EQ(limits[positive + 1], 0.0);
  EXPECT_EQ(limits[positive + 2], 1e-12);
  EXPECT_TRUE(std::is_sorted(limits.begin(), limits.end()));
  for (size_t i = 0; i < limits.size(); ++i) EXPECT_EQ(limits[i], -limits[limits.size() - 1 - i]) << i;
}

TEST(HistogramTest, CountsMomentsAndBuckets) {
  Histogram h;
  for (double v : {-1.0, 0.0, 0.5, 0.5, 2.0, std::nan("")}) h.Add(v);
  EXPECT_EQ(h.min(), -1.0);
  EXPECT_EQ(h.max(), 2.0);
  EXPECT_EQ(h.num(), 5.0);
  EXPECT_DOUBLE_EQ(h.sum(), 2.0);
  EXPECT_DOUBLE_EQ(h.sum_squares(), 5.5);
  const std::vector<double>& limits = Histogram::DefaultLimits();
  double total = 0;
  double previous_limit = -DBL_MAX;
  for (const auto& [limit, count] : h.EncodedBuckets()) {
    EXPECT_GT(limit, previous_limit);
    total += count;
    if (count > 0) {
      // The bucket ending at `limit` holds the values in [the limit before it, limit).
      const size_t i = std::find(limits.begin(), limits.end(), limit) - limits.begin();
      ASSERT_LT(i, limits.size());
      ASSERT_GT(i, 0u);
      int expected = 0;
      for (double v : {-1.0, 0.0, 0.5, 0.5, 2.0}) expected += limits[i - 1] <= v && v < limit;
      EXPECT_EQ(count, expected) << "bucket ending at " << limit;
    }
    previous_limit = limit;
  }
  EXPECT_EQ(total, 5.0);
  // Five distinct non-empty buckets (-1, 0, 0.5 x2, 2) separated and surrounded by merged empty runs.
  EXPECT_EQ(h.EncodedBuckets().size(), 4u + 5u);
  EXPECT_EQ(h.EncodedBuckets().back().first, DBL_MAX);

  Histogram weighted;
  weighted.Add(3.0, 7);
  EXPECT_EQ(weighted.num(), 7.0);
  EXPECT_DOUBLE_EQ(weighted.sum_squares(), 63.0);

  Histogram empty;
  ASSERT_EQ(empty.EncodedBuckets().size(), 1u);
  EXPECT_EQ(empty.EncodedBuckets()[0].first, DBL_MAX);
  EXPECT_EQ(empty.EncodedBuckets()[0].second, 0.0);
}

TEST_F(EventWriterTest, WritesHistogramProto) {
  auto writer = EventWriter::Create(dir_);
  ASSERT_TRUE(writer.ok()) << writer.status();
  std::vector<float> values = {-0.25f, 0.001f, 0.001f, 4.0f};
  Histogram h;
  h.AddAll(values.data(), static_cast<int64_t>(values.size()));
  ASSERT_TRUE((*writer)->AddHistogram("weights/w", 42, h).ok());
  EXPECT_EQ((*writer)->AddHistogram("", 1, h).code(), absl::StatusCode::kInvalidArgument);
  const std::string path = (*writer)->path();
  ASSERT_TRUE((*writer)->Close().ok());
  absl::StatusOr<std::string> file = ReadFileToString(path);
  ASSERT_TRUE(file.ok());
  std::vector<std::string> records = ReadRecords(*file);
  ASSERT_EQ(records.size(), 2u);
  Message event = Decode(records[1]);
  EXPECT_EQ(Only(event, 2).number, 42u);
  Message value = Decode(Only(Decode(Only(event, 5).bytes), 1).bytes);
  EXPECT_EQ(Only(value, 1).bytes, "weights/w");
  EXPECT_EQ(value.count(2), 0u);  // no simple_value
  Message histo = Decode(Only(value, 5).bytes);
  EXPECT_EQ(AsDouble(Only(histo, 1).number), -0.25);
  EXPECT_EQ(AsDouble(Only(histo, 2).number), 4.0);
  EXPECT_EQ(AsDouble(Only(histo, 3).number), 4.0);
  EXPECT_DOUBLE_EQ(AsDouble(Only(histo, 4).number), h.sum());
  EXPECT_DOUBLE_EQ(AsDouble(Only(histo, 5).number), h.sum_squares());
  EXPECT_EQ(Only(histo, 6).wire_type, 2);  // packed
  const std::vector<double> limits = UnpackDoubles(Only(histo, 6).bytes);
  const std::vector<double> counts = UnpackDoubles(Only(histo, 7).bytes);
  const auto expected = h.EncodedBuckets();
  ASSERT_EQ(limits.size(), expected.size());
  ASSERT_EQ(counts.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(limits[i], expected[i].first) << i;
    EXPECT_EQ(counts[i], expected[i].second) << i;
  }
}

}  // namespace
}  // namespace dtrain
