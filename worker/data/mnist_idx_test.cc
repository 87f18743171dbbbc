#include <string>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/data/data_test_util.h"
#include "worker/data/dataset.h"

namespace dtrain::data {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using namespace test_util;  // NOLINT

class MnistIdxTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir();
    images_ = dir_ + "/images-idx3-ubyte";
    labels_ = dir_ + "/labels-idx1-ubyte";
  }
  std::string dir_, images_, labels_;
};

void ExpectSameData(const Dataset& got, const Dataset& want) {
  EXPECT_EQ(got.height, want.height);
  EXPECT_EQ(got.width, want.width);
  EXPECT_EQ(got.channels, 1);
  EXPECT_EQ(got.labels, want.labels);
  EXPECT_EQ(got.pixels, want.pixels);
}

TEST_F(MnistIdxTest, RawRoundTrip) {
  const Dataset d = MakeDataset(13, 5, 4, 1);
  WriteFile(images_, IdxImages(d));
  WriteFile(labels_, IdxLabels(d.labels));
  absl::StatusOr<Dataset> got = ReadMnistIdx(images_, labels_);
  ASSERT_TRUE(got.ok()) << got.status();
  ExpectSameData(*got, d);
}

TEST_F(MnistIdxTest, GzipRoundTrip) {
  const Dataset d = MakeDataset(40, 28, 28, 1, /*seed=*/3);
  WriteGzFile(images_ + ".gz", IdxImages(d));
  WriteGzFile(labels_ + ".gz", IdxLabels(d.labels));
  absl::StatusOr<Dataset> got = ReadMnistIdx(images_ + ".gz", labels_ + ".gz");
  ASSERT_TRUE(got.ok()) << got.status();
  ExpectSameData(*got, d);
}

TEST_F(MnistIdxTest, WrongImagesMagicNamesFile) {
  const Dataset d = MakeDataset(3, 2, 2, 1);
  WriteFile(images_, IdxImages(d, /*magic=*/2049));
  WriteFile(labels_, IdxLabels(d.labels));
  absl::Status s = ReadMnistIdx(images_, labels_).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), AllOf(HasSubstr(images_), HasSubstr("magic 2049"), HasSubstr("2051")));
}

TEST_F(MnistIdxTest, WrongLabelsMagicNamesFile) {
  const Dataset d = MakeDataset(3, 2, 2, 1);
  WriteFile(images_, IdxImages(d));
  WriteFile(labels_, IdxLabels(d.labels, /*magic=*/2051));
  absl::Status s = ReadMnistIdx(images_, labels_).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), AllOf(HasSubstr(labels_), HasSubstr("magic 2051")));
}

TEST_F(MnistIdxTest, TruncatedPixelsReportOffset) {
  const Dataset d = MakeDataset(6, 3, 3, 1);
  std::string bytes = IdxImages(d);
  bytes.resize(bytes.size() - 4);
  WriteFile(images_, bytes);
  WriteFile(labels_, IdxLabels(d.labels));
  absl::Status s = ReadMnistIdx(images_, labels_).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), AllOf(HasSubstr(images_), HasSubstr("truncated at byte offset " +
                                                               std::to_string(bytes.size()))));
}

TEST_F(MnistIdxTest, TruncatedHeader) {
  WriteFile(images_, BigEndian32(2051) + BigEndian32(10));
  absl::Status s = ReadMnistIdx(images_, labels_).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), AllOf(HasSubstr(images_), HasSubstr("byte offset 8")));
}

TEST_F(MnistIdxTest, TruncatedGzipStream) {
  const Dataset d = MakeDataset(50, 28, 28, 1);
  WriteGzFile(images_ + ".gz", IdxImages(d));
  std::string gz = ReadFile(images_ + ".gz");
  gz.resize(gz.size() / 2);
  WriteFile(images_ + ".gz", gz);
  WriteFile(labels_, IdxLabels(d.labels));
  absl::Status s = ReadMnistIdx(images_ + ".gz", labels_).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr(images_ + ".gz"));
}

TEST_F(MnistIdxTest, TruncatedLabels) {
  const Dataset d = MakeDataset(6, 3, 3, 1);
  WriteFile(images_, IdxImages(d));
  std::string labels = IdxLabels(d.labels);
  labels.pop_back();
  WriteFile(labels_, labels);
  absl::Status s = ReadMnistIdx(images_, labels_).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), AllOf(HasSubstr(labels_), HasSubstr("byte offset 13")));
}

TEST_F(MnistIdxTest, CountMismatchNamesBothFiles) {
  const Dataset d = MakeDataset(7, 2, 2, 1);
  WriteFile(images_, IdxImages(d));
  WriteFile(labels_, IdxLabels({1, 2, 3, 4, 5, 6}));
  absl::Status s = ReadMnistIdx(images_, labels_).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), AllOf(HasSubstr(images_), HasSubstr(labels_), HasSubstr("6 labels"),
                                 HasSubstr("7 images")));
}

TEST_F(MnistIdxTest, LabelOutOfRange) {
  Dataset d = MakeDataset(5, 2, 2, 1);
  d.labels[3] = 10;
  WriteFile(images_, IdxImages(d));
  WriteFile(labels_, IdxLabels(d.labels));
  absl::Status s = ReadMnistIdx(images_, labels_).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), AllOf(HasSubstr(labels_), HasSubstr("label 10 of example 3")));
}

TEST_F(MnistIdxTest, MissingFileIsNotFound) {
  absl::Status s = ReadMnistIdx(dir_ + "/nope", labels_).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr(dir_ + "/nope"));
}

TEST_F(MnistIdxTest, ImplausibleHeaderIsRejectedBeforeAllocating) {
  WriteFile(images_, BigEndian32(2051) + BigEndian32(0xFFFFFFFF) + BigEndian32(1 << 20) + BigEndian32(28));
  absl::Status s = ReadMnistIdx(images_, labels_).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("implausible image size"));
}

// The in-memory entry point: raw or gzip bytes, the same data and the same errors (named by the given names).
TEST_F(MnistIdxTest, ParsesBytesInMemoryRawAndGzip) {
  const Dataset d = MakeDataset(9, 4, 3, 1, /*seed=*/5);
  absl::StatusOr<Dataset> got = ParseMnistIdx(IdxImages(d), IdxLabels(d.labels));
  ASSERT_TRUE(got.ok()) << got.status();
  ExpectSameData(*got, d);

  WriteGzFile(images_ + ".gz", IdxImages(d));
  WriteGzFile(labels_ + ".gz", IdxLabels(d.labels));
  got = ParseMnistIdx(ReadFile(images_ + ".gz"), ReadFile(labels_ + ".gz"));
  ASSERT_TRUE(got.ok()) << got.status();
  ExpectSameData(*got, d);

  // Two gzip members one after the other, then trailing garbage: read as gzread reads such a file.
  const std::string images = IdxImages(d);
  WriteGzFile(images_ + ".1.gz", images.substr(0, 20));
  WriteGzFile(images_ + ".2.gz", images.substr(20));
  const std::string two_members = ReadFile(images_ + ".1.gz") + ReadFile(images_ + ".2.gz") + "garbage";
  WriteFile(images_ + ".both.gz", two_members);
  got = ParseMnistIdx(two_members, IdxLabels(d.labels));
  ASSERT_TRUE(got.ok()) << got.status();
  ExpectSameData(*got, d);
  absl::StatusOr<Dataset> from_file = ReadMnistIdx(images_ + ".both.gz", labels_ + ".gz");
  ASSERT_TRUE(from_file.ok()) << from_file.status();
  ExpectSameData(*from_file, d);
}

TEST_F(MnistIdxTest, BytesInMemoryGiveTheFileReadersErrors) {
  const Dataset d = MakeDataset(6, 3, 3, 1);
  std::string images = IdxImages(d);
  images.resize(images.size() - 4);
  absl::Status s = ParseMnistIdx(images, IdxLabels(d.labels), "img", "lbl").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(s.message(), "img: truncated at byte offset " + std::to_string(images.size()) +
                             " while reading pixel data (needed 4 more bytes)");
  // A header claiming 4 billion images fails on the size at once (no allocation of the claim).
  s = ParseMnistIdx(BigEndian32(2051) + BigEndian32(0xFFFFFFFF) + BigEndian32(28) + BigEndian32(28), "", "img",
                    "lbl")
          .status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("img: truncated at byte offset 16"), HasSubstr("pixel data")));
  s = ParseMnistIdx(IdxImages(d), IdxLabels({1, 2}), "img", "lbl").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("lbl: has 2 labels"), HasSubstr("img has 6 images")));
  WriteGzFile(images_ + ".gz", IdxImages(d));
  std::string gz = ReadFile(images_ + ".gz");
  gz.resize(gz.size() / 2);
  s = ParseMnistIdx(gz, IdxLabels(d.labels), "img.gz", "lbl").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("img.gz: "));
}

}  // namespace
}  // namespace dtrain::data
