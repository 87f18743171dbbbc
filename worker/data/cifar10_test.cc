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

TEST(Cifar10Test, ParsesPlanarRecordsIntoHwc) {
  const std::string dir = MakeTempDir();
  const Dataset d = MakeDataset(5, 32, 32, 3);
  const std::string records = CifarRecords(d);
  WriteFile(dir + "/a.bin", records.substr(0, 3 * 3073));
  WriteFile(dir + "/b.bin", records.substr(3 * 3073));
  absl::StatusOr<Dataset> got = ReadCifar10Bin({dir + "/a.bin", dir + "/b.bin"});
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->height, 32);
  EXPECT_EQ(got->width, 32);
  EXPECT_EQ(got->channels, 3);
  EXPECT_EQ(got->labels, d.labels);
  EXPECT_EQ(got->pixels, d.pixels);
  // One pixel by hand: image 4, row 5, column 7, blue = record byte 1 + 2*1024 + 5*32 + 7.
  const auto raw = static_cast<uint8_t>(records[4 * 3073 + 1 + 2 * 1024 + 5 * 32 + 7]);
  EXPECT_EQ(got->pixels[4 * 3072 + (5 * 32 + 7) * 3 + 2], raw);
}

TEST(Cifar10Test, BadSizeNamesFile) {
  const std::string dir = MakeTempDir();
  std::string records = CifarRecords(MakeDataset(2, 32, 32, 3));
  records.pop_back();
  WriteFile(dir + "/data_batch_1.bin", records);
  absl::Status s = ReadCifar10Bin({dir + "/data_batch_1.bin"}).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), AllOf(HasSubstr(dir + "/data_batch_1.bin"), HasSubstr("6145"), HasSubstr("3073")));
}

TEST(Cifar10Test, EmptyFileIsDataLoss) {
  const std::string dir = MakeTempDir();
  WriteFile(dir + "/empty.bin", "");
  EXPECT_EQ(ReadCifar10Bin({dir + "/empty.bin"}).status().code(), absl::StatusCode::kDataLoss);
}

TEST(Cifar10Test, LabelOutOfRange) {
  const std::string dir = MakeTempDir();
  Dataset d = MakeDataset(3, 32, 32, 3);
  d.labels[2] = 11;
  WriteFile(dir + "/x.bin", CifarRecords(d));
  absl::Status s = ReadCifar10Bin({dir + "/x.bin"}).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("label 11"), HasSubstr("byte offset 6146")));
}

TEST(Cifar10Test, MissingFileAndNoFiles) {
  const std::string dir = MakeTempDir();
  EXPECT_EQ(ReadCifar10Bin({dir + "/missing.bin"}).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ReadCifar10Bin({}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(Cifar10Test, ParsesBytesInMemory) {
  const Dataset d = MakeDataset(4, 32, 32, 3, /*seed=*/11);
  absl::StatusOr<Dataset> got = ParseCifar10Bin(CifarRecords(d), "batch");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->labels, d.labels);
  EXPECT_EQ(got->pixels, d.pixels);
  absl::Status s = ParseCifar10Bin("", "batch").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("batch: size 0"), HasSubstr("3073")));
}

}  // namespace
}  // namespace dtrain::data
