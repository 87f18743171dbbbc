#include <limits>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_replace.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/data/data_test_util.h"
#include "worker/data/dataset.h"
#include "worker/data/example_proto.h"
#include "worker/data/record_io.h"

namespace dtrain::data {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using namespace test_util;  // NOLINT

class TfRecordTest : public ::testing::Test {
 protected:
  void SetUp() override { path_ = MakeTempDir() + "/train.tfrecords"; }

  // Writes `examples` with the raw record writer (for files WriteTfRecordExamples would not produce).
  void WriteExamples(const std::vector<ImageExample>& examples) {
    TfRecordWriter w;
    ASSERT_TRUE(w.Open(path_).ok());
    for (const ImageExample& e : examples) ASSERT_TRUE(w.Write(EncodeImageExample(e)).ok());
    ASSERT_TRUE(w.Close().ok());
  }

  std::string path_;
};

TEST_F(TfRecordTest, RoundTripGrayscaleAndColor) {
  for (const Dataset& d : {MakeDataset(25, 28, 28, 1), MakeDataset(12, 32, 32, 3, /*seed=*/9)}) {
    ASSERT_TRUE(WriteTfRecordExamples(d, path_).ok());
    absl::StatusOr<Dataset> got = ReadTfRecordExamples(path_);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->height, d.height);
    EXPECT_EQ(got->width, d.width);
    EXPECT_EQ(got->channels, d.channels);
    EXPECT_EQ(got->labels, d.labels);
    EXPECT_EQ(got->pixels, d.pixels);
  }
}

TEST_F(TfRecordTest, WritesTheFeaturesConvertToRecordsWrites) {
  ASSERT_TRUE(WriteTfRecordExamples(MakeDataset(2, 28, 28, 1), path_).ok());
  TfRecordReader r;
  ASSERT_TRUE(r.Open(path_).ok());
  std::string rec;
  ASSERT_TRUE(r.Read(&rec).value());
  absl::StatusOr<ImageExample> e = DecodeImageExample(rec);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->height, 28);
  EXPECT_EQ(e->width, 28);
  EXPECT_EQ(e->depth, 1);
  EXPECT_EQ(e->pixels, 784);
  EXPECT_EQ(e->label, 0);
  EXPECT_EQ(e->image_raw.size(), 784u);
}

TEST_F(TfRecordTest, CorruptedDataByteIsDataLossWithOffset) {
  const Dataset d = MakeDataset(10, 28, 28, 1);
  ASSERT_TRUE(WriteTfRecordExamples(d, path_).ok());
  std::string bytes = ReadFile(path_);
  const size_t record_size = bytes.size() / 10;  // equal-sized records: same features, labels < 128
  ASSERT_EQ(bytes.size() % 10, 0u);
  bytes[3 * record_size + 12 + 100] ^= 0x20;
  WriteFile(path_, bytes);
  absl::Status s = ReadTfRecordExamples(path_).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), AllOf(HasSubstr(path_ + ": corrupt record at byte offset " +
                                           std::to_string(3 * record_size) + ": data crc mismatch")));
}

TEST_F(TfRecordTest, TruncatedRecord) {
  ASSERT_TRUE(WriteTfRecordExamples(MakeDataset(4, 28, 28, 1), path_).ok());
  std::string bytes = ReadFile(path_);
  const size_t record_size = bytes.size() / 4;
  WriteFile(path_, bytes.substr(0, bytes.size() - 300));
  absl::Status s = ReadTfRecordExamples(path_).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), AllOf(HasSubstr(path_), HasSubstr("byte offset " + std::to_string(3 * record_size)),
                                 HasSubstr("truncated")));
}

TEST_F(TfRecordTest, BadLengthCrc) {
  ASSERT_TRUE(WriteTfRecordExamples(MakeDataset(3, 28, 28, 1), path_).ok());
  std::string bytes = ReadFile(path_);
  bytes[8] ^= 0x01;
  WriteFile(path_, bytes);
  absl::Status s = ReadTfRecordExamples(path_).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr(path_ + ": corrupt record at byte offset 0: length crc mismatch"));
}

TEST_F(TfRecordTest, GeometryFromPixelsWhenNoHeightWidthDepth) {
  ImageExample e;
  e.pixels = 784;
  e.label = 4;
  e.image_raw = std::string(784, '\x11');
  WriteExamples({e, e});
  absl::StatusOr<Dataset> got = ReadTfRecordExamples(path_);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->height, 28);
  EXPECT_EQ(got->width, 28);
  EXPECT_EQ(got->channels, 1);
  EXPECT_EQ(got->count(), 2);
}

TEST_F(TfRecordTest, RejectsInconsistentExamples) {
  ImageExample a;
  a.height = a.width = 2;
  a.depth = 1;
  a.label = 1;
  a.image_raw = "abcd";
  ImageExample b = a;
  b.height = b.width = 3;
  b.image_raw = "abcdefghi";
  WriteExamples({a, b});
  absl::Status s = ReadTfRecordExamples(path_).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("record 1 at byte offset"), HasSubstr("3x3x1")));

  ImageExample short_image = a;
  short_image.image_raw = "abc";
  WriteExamples({short_image});
  EXPECT_THAT(ReadTfRecordExamples(path_).status().message(), HasSubstr("image_raw has 3 bytes, expected 4"));

  // Labels past 9 make more classes (an image folder of 11 classes converted); absurd ones are refused.
  ImageExample big_label = a;
  big_label.label = 10;
  WriteExamples({big_label});
  absl::StatusOr<Dataset> eleven = ReadTfRecordExamples(path_);
  ASSERT_TRUE(eleven.ok()) << eleven.status();
  EXPECT_EQ(eleven->num_classes, 11);
  big_label.label = 1 << 24;
  WriteExamples({big_label});
  EXPECT_THAT(ReadTfRecordExamples(path_).status().message(), HasSubstr("label 16777216 is not below"));
}

TEST_F(TfRecordTest, GarbagePayloadAndEmptyFile) {
  TfRecordWriter w;
  ASSERT_TRUE(w.Open(path_).ok());
  ASSERT_TRUE(w.Write("\x0a\x7fnot a proto").ok());
  ASSERT_TRUE(w.Close().ok());
  absl::Status s = ReadTfRecordExamples(path_).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("record 0 at byte offset 0"), HasSubstr("malformed")));

  WriteFile(path_, "");
  EXPECT_EQ(ReadTfRecordExamples(path_).status().code(), absl::StatusCode::kDataLoss);
}

TEST_F(TfRecordTest, ParsesBytesInMemoryLikeTheFile) {
  const Dataset d = MakeDataset(7, 5, 4, 3, /*seed=*/2);
  ASSERT_TRUE(WriteTfRecordExamples(d, path_).ok());
  std::string bytes = ReadFile(path_);
  absl::StatusOr<Dataset> got = ParseTfRecordExamples(bytes, "mem");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->labels, d.labels);
  EXPECT_EQ(got->pixels, d.pixels);
  EXPECT_EQ(got->channels, 3);
  bytes.resize(bytes.size() - 3);
  absl::Status s = ParseTfRecordExamples(bytes, "mem").status();
  WriteFile(path_, bytes);
  const absl::Status from_file = ReadTfRecordExamples(path_).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(s.code(), from_file.code());
  EXPECT_EQ(s.message(), absl::StrReplaceAll(from_file.message(), {{path_, "mem"}}));
  EXPECT_THAT(s.message(), AllOf(HasSubstr("mem: corrupt record at byte offset"), HasSubstr("truncated record")));
}

// Found with tfrecord_fuzzer (hand-made inputs): height x width x depth of 2^31 - 1 each overflowed
// image_size() (signed overflow, undefined behaviour), and a "pixels" feature near 2^63 the square check.
TEST_F(TfRecordTest, HugeGeometryIsRejectedWithoutOverflow) {
  ImageExample e;
  e.image_raw = "abcd";
  e.label = 1;
  e.height = e.width = e.depth = (int64_t{1} << 31) - 1;
  WriteExamples({e});
  absl::Status s = ReadTfRecordExamples(path_).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("record 0 at byte offset 0"),
                                 HasSubstr("implausible image size 2147483647x2147483647x2147483647")));
  e.height = e.width = e.depth = -1;
  e.pixels = std::numeric_limits<int64_t>::max();
  WriteExamples({e});
  s = ReadTfRecordExamples(path_).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("implausible image size: 9223372036854775807 pixels"));
}

}  // namespace
}  // namespace dtrain::data
