#include <array>
#include <filesystem>
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

void WriteMnistDir(const std::string& dir, const Dataset& train, const Dataset& test) {
  WriteGzFile(dir + "/train-images-idx3-ubyte.gz", IdxImages(train));
  WriteGzFile(dir + "/train-labels-idx1-ubyte.gz", IdxLabels(train.labels));
  WriteFile(dir + "/t10k-images-idx3-ubyte", IdxImages(test));  // raw and gz may mix
  WriteFile(dir + "/t10k-labels-idx1-ubyte", IdxLabels(test.labels));
}

TEST(LoadDatasetTest, DetectsMnistIdx) {
  const std::string dir = MakeTempDir();
  const Dataset train = MakeDataset(30, 28, 28, 1), test = MakeDataset(10, 28, 28, 1, /*seed=*/2);
  WriteMnistDir(dir, train, test);
  absl::StatusOr<DatasetPair> got = LoadDataset(dir);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->format, "mnist-idx");
  EXPECT_EQ(got->train.pixels, train.pixels);
  EXPECT_EQ(got->test.labels, test.labels);
}

TEST(LoadDatasetTest, DetectsCifarInSubfolderWithMissingTrainBatches) {
  const std::string dir = MakeTempDir();
  const std::string sub = dir + "/cifar-10-batches-bin";
  std::filesystem::create_directories(sub);
  const Dataset all = MakeDataset(7, 32, 32, 3);
  WriteFile(sub + "/data_batch_1.bin", CifarRecords(Slice(all, 0, 3)));
  WriteFile(sub + "/data_batch_3.bin", CifarRecords(Slice(all, 3, 2)));
  WriteFile(sub + "/test_batch.bin", CifarRecords(Slice(all, 5, 2)));
  absl::StatusOr<DatasetPair> got = LoadDataset(dir);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->format, "cifar10-bin");
  EXPECT_EQ(got->train.count(), 5);
  EXPECT_EQ(got->train.pixels, Slice(all, 0, 5).pixels);
  EXPECT_EQ(got->test.pixels, Slice(all, 5, 2).pixels);
}

TEST(LoadDatasetTest, DetectsTfRecord) {
  const std::string dir = MakeTempDir();
  const Dataset train = MakeDataset(20, 28, 28, 1), test = MakeDataset(5, 28, 28, 1, /*seed=*/4);
  ASSERT_TRUE(WriteTfRecordExamples(train, dir + "/train.tfrecords").ok());
  ASSERT_TRUE(WriteTfRecordExamples(test, dir + "/test.tfrecords").ok());
  absl::StatusOr<DatasetPair> got = LoadDataset(dir);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->format, "tfrecord");
  EXPECT_EQ(got->train.pixels, train.pixels);
  EXPECT_EQ(got->test.labels, test.labels);
}

TEST(LoadDatasetTest, ExplicitFormatOnlyLooksForThatFormat) {
  const std::string dir = MakeTempDir();
  WriteMnistDir(dir, MakeDataset(3, 28, 28, 1), MakeDataset(3, 28, 28, 1));
  absl::Status s = LoadDataset(dir, DataFormat::kTfRecord).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr(dir + "/train.tfrecords"));
  EXPECT_THAT(s.message(), ::testing::Not(HasSubstr("idx3")));
  EXPECT_TRUE(LoadDataset(dir, DataFormat::kMnistIdx).ok());
}

TEST(LoadDatasetTest, NothingFoundListsWhatWasLookedFor) {
  const std::string dir = MakeTempDir();
  WriteFile(dir + "/train-images-idx3-ubyte.gz", "partial set: no labels or test files");
  absl::Status s = LoadDataset(dir).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), AllOf(HasSubstr(dir), HasSubstr("t10k-labels-idx1-ubyte[.gz]"),
                                 HasSubstr("data_batch_{1..5}.bin"), HasSubstr("cifar-10-batches-bin"),
                                 HasSubstr("test.tfrecords")));
}

TEST(LoadDatasetTest, ReaderErrorsPropagate) {
  const std::string dir = MakeTempDir();
  Dataset train = MakeDataset(3, 28, 28, 1);
  WriteMnistDir(dir, train, train);
  WriteFile(dir + "/t10k-labels-idx1-ubyte", IdxLabels({1, 2}));
  absl::Status s = LoadDataset(dir).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("t10k-labels-idx1-ubyte"));
}

TEST(LoadDatasetTest, ParsesTheNewFormatsAndTheInputFlagsValues) {
  EXPECT_EQ(*ParseDataFormat("image_folder"), DataFormat::kImageFolder);
  EXPECT_EQ(*ParseDataFormat("image-folder"), DataFormat::kImageFolder);
  EXPECT_EQ(*ParseDataFormat("npy"), DataFormat::kNpy);
  EXPECT_EQ(*ParseDataFormat("npz"), DataFormat::kNpy);
  EXPECT_EQ(*ParseDataFormat("csv"), DataFormat::kCsv);
  const absl::Status bad = ParseDataFormat("parquet").status();
  EXPECT_THAT(bad.message(), HasSubstr("criteo, image_folder, npy, csv"));
  EXPECT_EQ(*ParseBadExamples("fail"), BadExamples::kFail);
  EXPECT_FALSE(ParseBadExamples("ignore").ok());
  EXPECT_EQ(*ParseArrayLayout("nchw"), ArrayLayout::kNchw);
  EXPECT_FALSE(ParseArrayLayout("chw").ok());
}

TEST(LoadDatasetTest, NoDataSetNamesEveryLayoutLookedFor) {
  const std::string dir = MakeTempDir();
  const absl::Status s = LoadDataset(dir).status();
  EXPECT_TRUE(absl::IsNotFound(s)) << s;
  for (const char* what : {"train.npz", "train.csv[.gz]", "train/<class>/*.jpg|png", "train-images-idx3-ubyte"}) {
    EXPECT_THAT(s.message(), HasSubstr(what));
  }
}

// The real data set, where Debian's dataset-fashion-mnist package installed it.
TEST(LoadDatasetTest, RealFashionMnist) {
  const std::string dir = "/usr/share/datasets/fashion-mnist";
  if (!std::filesystem::exists(dir + "/train-images-idx3-ubyte.gz")) GTEST_SKIP() << dir << " is not installed";
  absl::StatusOr<DatasetPair> got = LoadDataset(dir);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->format, "mnist-idx");
  for (const Dataset* d : {&got->train, &got->test}) {
    EXPECT_EQ(d->height, 28);
    EXPECT_EQ(d->width, 28);
    EXPECT_EQ(d->channels, 1);
    EXPECT_EQ(static_cast<int64_t>(d->pixels.size()), d->count() * 784);
    std::array<int64_t, 10> per_class{};
    for (int32_t l : d->labels) ++per_class[l];
    for (int64_t n : per_class) EXPECT_EQ(n, d->count() / 10);  // Fashion-MNIST is balanced
  }
  EXPECT_EQ(got->train.count(), 60000);
  EXPECT_EQ(got->test.count(), 10000);
}

}  // namespace
}  // namespace dtrain::data
