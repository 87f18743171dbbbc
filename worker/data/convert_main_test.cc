// Runs the dtrain_convert binary (from DTRAIN_BIN_DIR, set by ctest) on small generated inputs.
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "absl/strings/match.h"
#include "worker/data/criteo.h"
#include "worker/data/data_test_util.h"
#include "worker/data/dataset.h"
#include "worker/data/example_source.h"
#include "worker/data/image_test_util.h"

namespace dtrain::data {
namespace {

using ::testing::HasSubstr;
using namespace test_util;  // NOLINT

struct RunResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr
};

RunResult RunConvert(const std::string& args) {
  const char* bin_dir = std::getenv("DTRAIN_BIN_DIR");
  RunResult r;
  const std::string cmd = std::string(bin_dir) + "/dtrain_convert " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) r.output.append(buf, n);
  const int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

class ConvertMainTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::getenv("DTRAIN_BIN_DIR") == nullptr) GTEST_SKIP() << "DTRAIN_BIN_DIR not set (run under ctest)";
    dir_ = MakeTempDir();
  }
  std::string dir_;
};

TEST_F(ConvertMainTest, ConvertsMnistToTfRecords) {
  const Dataset train = MakeDataset(30, 28, 28, 1), test = MakeDataset(10, 28, 28, 1, /*seed=*/8);
  WriteGzFile(dir_ + "/train-images-idx3-ubyte.gz", IdxImages(train));
  WriteGzFile(dir_ + "/train-labels-idx1-ubyte.gz", IdxLabels(train.labels));
  WriteGzFile(dir_ + "/t10k-images-idx3-ubyte.gz", IdxImages(test));
  WriteGzFile(dir_ + "/t10k-labels-idx1-ubyte.gz", IdxLabels(test.labels));
  const RunResult r = RunConvert("--input_dir=" + dir_ + " --output_dir=" + dir_ + "/out --format=tfrecord");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("wrote 30 28x28x1 examples (mnist-idx) to " + dir_ + "/out/train.tfrecords"));
  EXPECT_THAT(r.output, HasSubstr("wrote 10 28x28x1 examples (mnist-idx) to " + dir_ + "/out/test.tfrecords"));
  absl::StatusOr<DatasetPair> back = LoadDataset(dir_ + "/out", DataFormat::kTfRecord);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->train.pixels, train.pixels);
  EXPECT_EQ(back->train.labels, train.labels);
  EXPECT_EQ(back->test.pixels, test.pixels);
}

TEST_F(ConvertMainTest, BadInputExitsTwoWithOneLine) {
  const RunResult r = RunConvert("--input_dir=" + dir_ + "/empty --output_dir=" + dir_ + "/out");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("NOT_FOUND"));
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
}

TEST_F(ConvertMainTest, CorruptInputExitsTwo) {
  WriteFile(dir_ + "/train.tfrecords", "garbage that is not a record");
  WriteFile(dir_ + "/test.tfrecords", "");
  const RunResult r = RunConvert("--input_dir=" + dir_ + " --output_dir=" + dir_ + "/out");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr(dir_ + "/train.tfrecords: corrupt record at byte offset 0"));
}

TEST_F(ConvertMainTest, SyntheticCtrWritesCriteoTextAndReportsThePlantedAuc) {
  const RunResult r = RunConvert("--synthetic_ctr --examples=2000 --test_examples=1000 --seed=3 --vocab=100 --out=" +
                                 dir_ + "/ctr");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("wrote 2000 examples to " + dir_ + "/ctr/train.txt"));
  EXPECT_THAT(r.output, HasSubstr("and 1000 to " + dir_ + "/ctr/test.txt"));
  EXPECT_THAT(r.output, HasSubstr("Zipf exponent 1.05 over vocabularies 100,100,"));
  EXPECT_THAT(r.output, HasSubstr("planted model on the test set: Bayes-optimal AUC 0."));
  absl::StatusOr<DatasetPair> back = LoadDataset(dir_ + "/ctr");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->format, "criteo");
  EXPECT_EQ(back->train.count(), 2000);

  // Criteo text -> TFRecord: the same examples.
  const RunResult c = RunConvert("--input_dir=" + dir_ + "/ctr --input_format=criteo --output_dir=" + dir_ + "/tfr");
  ASSERT_EQ(c.exit_code, 0) << c.output;
  EXPECT_THAT(c.output, HasSubstr("wrote 2000 CTR examples of 13 dense and 26 sparse features (criteo) to " + dir_ +
                                  "/tfr/train.tfrecords"));
  absl::StatusOr<DatasetPair> tfr = LoadDataset(dir_ + "/tfr", DataFormat::kTfRecord);
  ASSERT_TRUE(tfr.ok()) << tfr.status();
  EXPECT_EQ(tfr->test.ids, back->test.ids);
  EXPECT_EQ(tfr->test.dense, back->test.dense);
  EXPECT_EQ(tfr->test.labels, back->test.labels);
}

TEST_F(ConvertMainTest, BadSyntheticOrFormatFlagsExitTwo) {
  for (const std::string& flags : {"--synthetic_ctr --examples=10 --vocab=1,2 --out=" + dir_ + "/x",
                                   "--synthetic_ctr --examples=10 --vocab=ten --out=" + dir_ + "/x",
                                   std::string("--synthetic_ctr --examples=10"), "--input_format=xml --output_dir=" + dir_}) {
    const RunResult r = RunConvert(flags);
    EXPECT_EQ(r.exit_code, 2) << flags << ": " << r.output;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
  }
}


TEST_F(ConvertMainTest, ConvertsAnImageFolderAsEvaluationReadsIt) {
  for (const char* path : {"/train/a/1.jpg", "/train/a/2.png", "/train/b/1.jpg", "/val/b/2.jpg"}) {
    std::filesystem::create_directories(std::filesystem::path(dir_ + path).parent_path());
    const std::vector<uint8_t> p = Picture(40, 30, 3, path[7]);
    WriteFile(dir_ + path, absl::EndsWith(path, ".png") ? test_util::EncodePng(p, 40, 30, SPNG_COLOR_TYPE_TRUECOLOR)
                                                         : test_util::EncodeJpeg(p, 40, 30, 3));
  }
  WriteFile(dir_ + "/train/b/broken.jpg", "not a jpeg");
  RunResult r = RunConvert("--input_dir=" + dir_ + " --input_format=image_folder --image_size=16 --output_dir=" +
                           dir_ + "/out");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("wrote 4 16x16x3 examples (image-folder)"));  // 4 images listed, 3 written
  EXPECT_THAT(r.output, HasSubstr("broken.jpg"));
  absl::StatusOr<DatasetPair> back = LoadDataset(dir_ + "/out", DataFormat::kTfRecord);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->train.count(), 3);
  EXPECT_EQ(back->test.count(), 1);
  EXPECT_EQ(back->train.height, 16);
  // The bytes are the evaluation batches' values, rounded.
  absl::StatusOr<DatasetPair> folder =
      LoadDataset(dir_, DataFormat::kImageFolder, LoadOptions{.image_size = 16});
  ASSERT_TRUE(folder.ok());
  const std::vector<Batch> b = EvalBatches(folder->test, 1, Preprocess::kScale01);
  ASSERT_EQ(b.size(), 1u);
  for (size_t k = 0; k < b[0].images.size(); ++k) {
    ASSERT_NEAR(back->test.pixels[k] / 255.0, b[0].images[k], 0.5 / 255 + 1e-6);
  }
  r = RunConvert("--input_dir=" + dir_ + " --input_format=image_folder --image_size=16 --bad_images=fail "
                 "--output_dir=" + dir_ + "/out2");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("broken.jpg: not a JPEG or PNG image"));
}

TEST_F(ConvertMainTest, ConvertsCsvRowsAsFloatsThatReadBack) {
  WriteFile(dir_ + "/train.csv", "a,b,label\n0.5,-1,cat\n2,3.25,dog\n1,1,cat\n");
  WriteFile(dir_ + "/test.csv", "a,b,label\n7,8,dog\n");
  const RunResult r = RunConvert("--input_dir=" + dir_ + " --output_dir=" + dir_ + "/out");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("wrote 3 1x1x2 examples (csv)"));
  absl::StatusOr<DatasetPair> back = LoadDataset(dir_ + "/out", DataFormat::kTfRecord);
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->train.count(), 3);
  ASSERT_NE(back->train.source, nullptr);
  EXPECT_EQ(back->train.labels, std::vector<int32_t>({0, 1, 0}));
  std::vector<float> e(2);
  ASSERT_TRUE(back->train.source->Read(1, false, nullptr, e.data()).ok());
  EXPECT_EQ(e, std::vector<float>({2.0f, 3.25f}));
  ASSERT_TRUE(back->test.source->Read(0, false, nullptr, e.data()).ok());
  EXPECT_EQ(e, std::vector<float>({7.0f, 8.0f}));
}

TEST_F(ConvertMainTest, UnknownFlagNamesTheClosestAndExitsTwo) {
  const RunResult r = RunConvert("--output_dri=" + dir_);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("unknown flag --output_dri; did you mean --output_dir?"));
}

}  // namespace
}  // namespace dtrain::data
