#include "worker/data/array_source.h"

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/data/data_test_util.h"
#include "worker/data/dataset.h"
#include "worker/data/example_source.h"

namespace dtrain::data {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Runs NumPy (Debian's /usr/bin/python3) in `dir` to write the arrays a test reads.
void Python(const std::string& dir, const std::string& code) {
  test_util::WriteFile(dir + "/make.py", absl::StrCat("import numpy as np\nimport os\nos.chdir('", dir, "')\n", code));
  ASSERT_EQ(std::system(absl::StrCat("/usr/bin/python3 ", dir, "/make.py").c_str()), 0)
      << "needs /usr/bin/python3 with python3-numpy (scripts/install_deps.sh)";
  std::filesystem::remove(dir + "/make.py");
}

std::vector<float> ReadExample(const Dataset& d, int64_t i) {
  std::vector<float> out(static_cast<size_t>(d.height) * d.width * d.channels);
  EXPECT_TRUE(d.source->Read(i, false, nullptr, out.data()).ok());
  return out;
}

TEST(ArraySourceTest, NpzOfUint8ImagesReadsAsPixelsScaledToOne) {
  const std::string dir = test_util::MakeTempDir();
  Python(dir,
         "x = (np.arange(6 * 4 * 5 * 3) % 256).astype(np.uint8).reshape(6, 4, 5, 3)\n"
         "np.savez('train.npz', x=x, y=np.array([0, 1, 2, 0, 1, 2], dtype=np.int64))\n"
         "np.savez_compressed('test.npz', x=x[:2], y=np.array([[2], [1]], dtype=np.uint8))\n");
  absl::StatusOr<DatasetPair> p = LoadDataset(dir);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->format, "npy");
  EXPECT_EQ(p->train.count(), 6);
  EXPECT_EQ(p->test.count(), 2);
  EXPECT_EQ(p->train.height, 4);
  EXPECT_EQ(p->train.width, 5);
  EXPECT_EQ(p->train.channels, 3);
  EXPECT_EQ(p->train.num_classes, 3);
  EXPECT_THAT(p->test.labels, ElementsAre(2, 1));
  EXPECT_TRUE(p->train.source->bytes());
  const std::vector<float> e = ReadExample(p->train, 1);
  for (int k = 0; k < 60; ++k) ASSERT_FLOAT_EQ(e[k], ((60 + k) % 256) / 255.0f);
  EXPECT_EQ(ReadExample(p->test, 1), e);  // the deflated test.npz holds the same rows
  // Batches over the memory-mapped arrays.
  const std::vector<Batch> b = EvalBatches(p->train, 4, Preprocess::kScale01);
  ASSERT_EQ(b.size(), 2u);
  EXPECT_THAT(b[1].labels, ElementsAre(1, 2));
}

TEST(ArraySourceTest, FloatTablesChannelsFirstImagesAndKerasFiles) {
  const std::string dir = test_util::MakeTempDir();
  Python(dir,
         "np.save('x_train.npy', np.arange(10 * 7, dtype=np.float32).reshape(10, 7) / 8)\n"
         "np.save('y_train.npy', np.arange(10) % 4)\n");
  absl::StatusOr<DatasetPair> p = LoadDataset(dir, DataFormat::kNpy);
  ASSERT_FALSE(p.ok());  // no test part, no split
  EXPECT_THAT(std::string(p.status().message()), HasSubstr("--validation_split"));
  LoadOptions o;
  o.validation_split = 0.2;
  p = LoadDataset(dir, DataFormat::kNpy, o);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->train.count(), 8);
  EXPECT_THAT(p->test.labels, ElementsAre(0, 1));  // examples 4 and 9
  EXPECT_EQ(p->train.height * p->train.width, 1);
  EXPECT_EQ(p->train.channels, 7);
  EXPECT_FALSE(p->train.source->bytes());
  EXPECT_THAT(ReadExample(p->test, 0), ElementsAre(28 / 8.f, 29 / 8.f, 30 / 8.f, 31 / 8.f, 32 / 8.f, 33 / 8.f, 34 / 8.f));

  // NCHW float16 images in Keras's one-file layout: transposed to HWC.
  const std::string keras = test_util::MakeTempDir() + "_keras";
  std::filesystem::create_directories(keras);
  Python(keras,
         "x = np.arange(3 * 3 * 2 * 5).reshape(3, 3, 2, 5).astype(np.float16) / 4\n"
         "np.savez('data.npz', x_train=x, y_train=np.array([1, 0, 1]), x_test=x[:1], y_test=np.array([0]))\n");
  p = LoadDataset(keras);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->train.height, 2);
  EXPECT_EQ(p->train.width, 5);
  EXPECT_EQ(p->train.channels, 3);
  const std::vector<float> e = ReadExample(p->train, 1);
  // HWC (h, w, c) = NCHW (c, h, w): example 1 starts at 30.
  for (int h = 0; h < 2; ++h) {
    for (int w = 0; w < 5; ++w) {
      for (int c = 0; c < 3; ++c) ASSERT_EQ(e[(h * 5 + w) * 3 + c], (30 + c * 10 + h * 5 + w) / 4.0f);
    }
  }
  o = LoadOptions();
  o.layout = ArrayLayout::kNhwc;  // the same arrays read as 3x2 images of 5 channels
  p = LoadDataset(keras, DataFormat::kNpy, o);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->train.channels, 5);
}

TEST(ArraySourceTest, BadArraysSayWhatIsWrong) {
  const std::string dir = test_util::MakeTempDir();
  Python(dir,
         "np.savez('train.npz', x=np.zeros((4, 2), np.float32), y=np.array([0, 1, 2]))\n"
         "np.savez('test.npz', images=np.zeros((4, 2), np.float32), y=np.array([0, 1, 2, 3]))\n");
  absl::StatusOr<DatasetPair> p = LoadDataset(dir);
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(std::string(p.status().message()), HasSubstr("labels of shape (3) for 4 examples"));
  Python(dir, "np.savez('train.npz', x=np.zeros((4, 2), np.float32), y=np.array([0, 1.5, 2, 3]))\n");
  p = LoadDataset(dir);
  EXPECT_THAT(std::string(p.status().message()), HasSubstr("label 1 is 1.5, not a class index"));
  Python(dir, "np.savez('train.npz', x=np.zeros((4, 2), np.float32), y=np.array([0, 1, 2, 3]))\n");
  p = LoadDataset(dir);
  EXPECT_THAT(std::string(p.status().message()), HasSubstr("has no array 'x' (it has images, y"));
  LoadOptions o;
  o.x_name = "images";
  p = LoadDataset(dir, DataFormat::kNpy, o);
  EXPECT_THAT(std::string(p.status().message()), HasSubstr("train.npz has no array 'images'"));
  Python(dir,
         "np.savez('test.npz', x=np.zeros((4, 3), np.float32), y=np.array([0, 1, 2, 3]))\n"
         "np.save('big.npy', np.zeros((4, 2), np.dtype('>f4')))\n"
         "np.save('ok.npy', np.zeros((4, 2), np.float32))\n");
  p = LoadDataset(dir);
  EXPECT_THAT(std::string(p.status().message()), HasSubstr("train and test images differ in shape"));
  absl::StatusOr<std::shared_ptr<const MappedFile>> f = MappedFile::Open(dir + "/big.npy");
  ASSERT_TRUE(f.ok());
  absl::StatusOr<NpyArray> a = ParseNpy((*f)->bytes(), "big.npy");
  EXPECT_TRUE(absl::IsInvalidArgument(a.status())) << a.status();
  f = MappedFile::Open(dir + "/ok.npy");
  ASSERT_TRUE(f.ok());
  ASSERT_TRUE(ParseNpy((*f)->bytes(), "ok.npy").ok());
  a = ParseNpy((*f)->bytes().substr(0, (*f)->bytes().size() - 1), "cut.npy");
  EXPECT_TRUE(absl::IsDataLoss(a.status())) << a.status();
  EXPECT_THAT(std::string(a.status().message()), HasSubstr("truncated"));
}

TEST(ArraySourceTest, CsvWithHeaderAndNamedClasses) {
  const std::string dir = test_util::MakeTempDir();
  test_util::WriteFile(dir + "/train.csv",
                       "sepal_length,sepal_width,species\r\n5.1,3.5,setosa\r\n7.0,3.2,versicolor\r\n6.3,3.3,virginica\r\n"
                       "4.9,3.0,setosa\r\n");
  test_util::WriteFile(dir + "/test.csv", "sepal_length,sepal_width,species\n6.4,3.2,versicolor\n");
  LoadOptions o;
  o.label_column = "species";
  absl::StatusOr<DatasetPair> p = LoadDataset(dir, DataFormat::kAuto, o);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->format, "csv");
  EXPECT_THAT(p->train.labels, ElementsAre(0, 1, 2, 0));
  EXPECT_THAT(p->test.labels, ElementsAre(1));
  EXPECT_THAT(p->train.class_names, ElementsAre("setosa", "versicolor", "virginica"));
  EXPECT_EQ(p->train.num_classes, 3);
  EXPECT_EQ(p->train.channels, 2);
  EXPECT_THAT(ReadExample(p->train, 1), ElementsAre(7.0f, 3.2f));
  // The default label column "label" is not there: the message names the columns.
  p = LoadDataset(dir, DataFormat::kCsv);
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(std::string(p.status().message()), HasSubstr("no column named 'label'"));
  EXPECT_THAT(std::string(p.status().message()), HasSubstr("sepal_length,sepal_width,species"));
}

TEST(ArraySourceTest, CsvWithoutHeaderByIndexAndItsErrors) {
  absl::StatusOr<Dataset> d = ParseCsv("1,0.5,2\n0,1e-3,-4\n", "t.csv", "0");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_THAT(d->labels, ElementsAre(1, 0));
  EXPECT_EQ(d->num_classes, 2);
  std::vector<float> e(2);
  ASSERT_TRUE(d->source->Read(1, false, nullptr, e.data()).ok());
  EXPECT_THAT(e, ElementsAre(1e-3f, -4.0f));
  d = ParseCsv("0.5,2,1\n", "t.csv", "-1");
  ASSERT_TRUE(d.ok());
  EXPECT_THAT(d->labels, ElementsAre(1));
  d = ParseCsv("a,b,label\n1,,0\n", "t.csv", "label");
  EXPECT_THAT(std::string(d.status().message()), HasSubstr("t.csv: line 2, column 1 (b): empty value"));
  d = ParseCsv("a,b,label\n1,x,0\n", "t.csv", "label");
  EXPECT_THAT(std::string(d.status().message()), HasSubstr("'x' is not a number"));
  d = ParseCsv("a,b,label\n1,2,0\n1,2\n", "t.csv", "label");
  EXPECT_THAT(std::string(d.status().message()), HasSubstr("line 3 has 2 fields"));
  std::vector<std::string> classes = {"cat", "dog"};
  d = ParseCsv("x,label\n1,eel\n", "test.csv", "label", &classes);
  EXPECT_THAT(std::string(d.status().message()), HasSubstr("label 'eel' is not a class of the training file"));
  d = ParseCsv("x,\"label, quoted\"\n\"1\",2\n", "t.csv", "label, quoted");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_THAT(d->labels, ElementsAre(2));
}

TEST(ArraySourceTest, ArraysShardAndResumeLikeTheOtherReaders) {
  const std::string dir = test_util::MakeTempDir();
  Python(dir,
         "np.savez('train.npz', x=np.arange(20, dtype=np.float32).reshape(20, 1), y=np.arange(20) % 2)\n"
         "np.savez('test.npz', x=np.zeros((2, 1), np.float32), y=np.array([0, 1]))\n");
  absl::StatusOr<DatasetPair> p = LoadDataset(dir);
  ASSERT_TRUE(p.ok()) << p.status();
  BatchStreamOptions o;
  o.batch_size = 3;
  o.num_shards = 2;
  o.shard_index = 1;
  auto s = BatchStream::Create(p->train, o);
  ASSERT_TRUE(s.ok());
  std::vector<float> seen;
  for (int k = 0; k < 4; ++k) {
    const Batch& b = (*s)->Next();
    seen.insert(seen.end(), b.images.begin(), b.images.end());
  }
  const std::string position = (*s)->SaveState();
  const std::vector<float> next = (*s)->Next().images;
  std::sort(seen.begin(), seen.begin() + 10);
  EXPECT_THAT(std::vector<float>(seen.begin(), seen.begin() + 10), ElementsAre(1, 3, 5, 7, 9, 11, 13, 15, 17, 19));
  auto again = BatchStream::Create(p->train, o);
  ASSERT_TRUE(again.ok());
  ASSERT_TRUE((*again)->Restore(position).ok());
  EXPECT_EQ((*again)->Next().images, next);
}

}  // namespace
}  // namespace dtrain::data
