#include "worker/data/image_folder.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/data/data_test_util.h"
#include "worker/data/dataset.h"
#include "worker/data/image_test_util.h"

namespace dtrain::data {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
namespace fs = std::filesystem;

void Jpeg(const std::string& path, int w, int h, int seed) {
  fs::create_directories(fs::path(path).parent_path());
  test_util::WriteFile(path, test_util::EncodeJpeg(test_util::Picture(w, h, 3, seed), w, h, 3, 90));
}

void Png(const std::string& path, int w, int h, int seed) {
  fs::create_directories(fs::path(path).parent_path());
  test_util::WriteFile(path, test_util::EncodePng(test_util::Picture(w, h, 3, seed), w, h, SPNG_COLOR_TYPE_TRUECOLOR));
}

// DIR/train/{cat,dog,eel}/ with a few images of varied sizes, DIR/val/{cat,dog}/.
std::string MakeFolder(int per_class = 4) {
  const std::string dir = test_util::MakeTempDir();
  int seed = 0;
  for (const char* c : {"cat", "dog", "eel"}) {
    for (int i = 0; i < per_class; ++i, ++seed) {
      const std::string path = absl::StrCat(dir, "/train/", c, "/", i, i % 2 ? ".png" : ".jpg");
      if (i % 2) {
        Png(path, 40 + 3 * i, 30 + 5 * i, seed);
      } else {
        Jpeg(path, 50 + 7 * i, 36 + 2 * i, seed);
      }
    }
  }
  Jpeg(dir + "/val/cat/a.jpg", 48, 40, 100);
  Jpeg(dir + "/val/dog/b.jpg", 40, 48, 101);
  return dir;
}

TEST(ImageFolderTest, ListsFilesAndClassesInImageFoldersOrder) {
  const std::string dir = test_util::MakeTempDir();
  // Class folders out of order, nested folders, upper-case extensions, files that are not images, a link.
  Jpeg(dir + "/b/2.jpg", 8, 8, 1);
  Jpeg(dir + "/b/10.JPG", 8, 8, 2);
  Png(dir + "/b/sub/z.png", 8, 8, 3);
  Png(dir + "/b/sub-a/y.png", 8, 8, 4);
  Jpeg(dir + "/a/x.jpeg", 8, 8, 5);
  test_util::WriteFile(dir + "/a/notes.txt", "not an image");
  Jpeg(dir + "/c/q.jpg", 8, 8, 6);
  fs::create_directories(dir + "/c/deeper");
  fs::create_symlink(dir + "/a", dir + "/c/deeper/linked");
  absl::StatusOr<ImageFolderIndex> index = ScanImageFolder(dir);
  ASSERT_TRUE(index.ok()) << index.status();
  EXPECT_THAT(index->classes, ElementsAre("a", "b", "c"));

  // torchvision.datasets.ImageFolder on the same folder (without the .txt, which it would refuse to load
  // only when read): the same (path, label) list.
  const std::string script = absl::StrCat(
      "from torchvision.datasets import ImageFolder\n", "for p, l in ImageFolder('", dir,
      "', loader=lambda p: p).samples: print(f'{l} {p}')\n");
  test_util::WriteFile(dir + "/../list_images.py", script);
  FILE* pipe = popen(absl::StrCat("/usr/bin/python3 ", dir, "/../list_images.py").c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string listing;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof(buf), pipe)) listing.append(buf, n);
  ASSERT_EQ(pclose(pipe), 0) << "needs /usr/bin/python3 with python3-torchvision (scripts/install_deps.sh)";
  std::vector<std::string> want = absl::StrSplit(listing, '\n', absl::SkipEmpty());
  std::vector<std::string> got;
  for (size_t i = 0; i < index->files.size(); ++i) got.push_back(absl::StrCat(index->labels[i], " ", index->files[i]));
  EXPECT_EQ(got, want);
  EXPECT_EQ(got.size(), 7u);
}

TEST(ImageFolderTest, ReadsTrainAndValWithTrainsClasses) {
  const std::string dir = MakeFolder();
  absl::StatusOr<DatasetPair> p = LoadDataset(dir, DataFormat::kAuto, LoadOptions{.image_size = 24});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->format, "image-folder");
  EXPECT_EQ(p->train.count(), 12);
  EXPECT_EQ(p->test.count(), 2);
  EXPECT_EQ(p->train.num_classes, 3);
  EXPECT_EQ(p->test.num_classes, 3);
  EXPECT_THAT(p->test.class_names, ElementsAre("cat", "dog", "eel"));
  EXPECT_THAT(p->test.labels, ElementsAre(0, 1));
  EXPECT_EQ(p->train.height, 24);
  EXPECT_EQ(p->train.channels, 3);
  EXPECT_TRUE(p->train.pixels.empty());
  // Evaluation batches: every test image, resized and centre-cropped, in [0, 1].
  const std::vector<Batch> batches = EvalBatches(p->test, 5, Preprocess::kScale01);
  ASSERT_EQ(batches.size(), 1u);
  EXPECT_EQ(batches[0].batch, 2);
  EXPECT_EQ(batches[0].images.size(), 2u * 24 * 24 * 3);
  for (float v : batches[0].images) ASSERT_TRUE(v >= 0 && v <= 1) << v;
}

TEST(ImageFolderTest, ValidationSplitHoldsOutEvenlySpacedFilesPerClass) {
  const std::string dir = MakeFolder(10);
  fs::remove_all(dir + "/val");
  LoadOptions o{.image_size = 16};
  absl::StatusOr<DatasetPair> p = LoadDataset(dir, DataFormat::kImageFolder, o);
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(std::string(p.status().message()), HasSubstr("--validation_split"));
  o.validation_split = 0.2;
  p = LoadDataset(dir, DataFormat::kImageFolder, o);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->train.count(), 24);
  EXPECT_THAT(p->test.labels, ElementsAre(0, 0, 1, 1, 2, 2));
  // DIR itself as the class folders, named explicitly.
  p = LoadDataset(dir + "/train", DataFormat::kImageFolder, o);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->test.count(), 6);
  // A split and a validation folder: one or the other.
  Jpeg(dir + "/val/cat/v.jpg", 20, 20, 1);
  p = LoadDataset(dir, DataFormat::kImageFolder, o);
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(std::string(p.status().message()), HasSubstr("use one or the other"));
}

TEST(ImageFolderTest, RefusesFoldersItCannotUse) {
  const std::string dir = MakeFolder();
  Jpeg(dir + "/val/fox/f.jpg", 20, 20, 1);
  absl::StatusOr<DatasetPair> p = LoadDataset(dir, DataFormat::kImageFolder);
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(std::string(p.status().message()), HasSubstr("class folders the training folder lacks: fox"));
  fs::remove_all(dir + "/val/fox");
  fs::create_directories(dir + "/train/empty");
  p = LoadDataset(dir, DataFormat::kImageFolder);
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(std::string(p.status().message()), HasSubstr("no JPEG or PNG file"));
  EXPECT_THAT(std::string(p.status().message()), HasSubstr("empty"));
  p = LoadDataset(dir + "/nowhere", DataFormat::kImageFolder);
  EXPECT_TRUE(absl::IsNotFound(p.status())) << p.status();
  p = LoadDataset(MakeFolder(), DataFormat::kImageFolder, LoadOptions{.image_size = 224, .resize_size = 100});
  EXPECT_TRUE(absl::IsInvalidArgument(p.status())) << p.status();
}

BatchStreamOptions StreamOptions(int threads) {
  BatchStreamOptions o;
  o.batch_size = 5;
  o.seed = 3;
  o.threads = threads;
  o.prefetch = 2;
  return o;
}

std::vector<Batch> Take(BatchStream* s, int n) {
  std::vector<Batch> out;
  for (int i = 0; i < n; ++i) out.push_back(s->Next());
  return out;
}

void ExpectSame(const std::vector<Batch>& a, const std::vector<Batch>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].labels, b[i].labels) << "batch " << i;
    EXPECT_EQ(a[i].images, b[i].images) << "batch " << i;
  }
}

TEST(ImageFolderTest, StreamsAreTheSameWhateverTheThreadsAndResumeWhereSaved) {
  const std::string dir = MakeFolder();
  absl::StatusOr<DatasetPair> p = LoadDataset(dir, DataFormat::kAuto, LoadOptions{.image_size = 20});
  ASSERT_TRUE(p.ok()) << p.status();
  auto one = BatchStream::Create(p->train, StreamOptions(1));
  auto three = BatchStream::Create(p->train, StreamOptions(3));
  ASSERT_TRUE(one.ok() && three.ok());
  const std::vector<Batch> a = Take(one->get(), 7), b = Take(three->get(), 7);  // 35 examples: ~3 epochs of 12
  ExpectSame(a, b);
  EXPECT_EQ(a[0].images.size(), 5u * 20 * 20 * 3);
  EXPECT_EQ(a[2].epoch, 0);
  EXPECT_EQ(a[3].epoch, 1);
  // Augmentation: an epoch's examples differ from the next epoch's reads of the same images (random crops).
  EXPECT_NE(a[0].images, a[3].images);
  // Every label of an epoch once per image: 4 of each class in the first 12 examples.
  std::vector<int> counts(3);
  for (int k = 0; k < 12; ++k) ++counts[static_cast<int>(a[k / 5].labels[k % 5])];
  EXPECT_THAT(counts, ElementsAre(4, 4, 4));

  // Save after 3 batches; a new stream restored there gives batches 3.. again.
  auto first = BatchStream::Create(p->train, StreamOptions(2));
  ASSERT_TRUE(first.ok());
  Take(first->get(), 3);
  const std::string position = (*first)->SaveState();
  auto resumed = BatchStream::Create(p->train, StreamOptions(2));
  ASSERT_TRUE(resumed.ok());
  Take(resumed->get(), 1);  // reads ahead, then moves
  ASSERT_TRUE((*resumed)->Restore(position).ok());
  ExpectSame(Take(resumed->get(), 4), std::vector<Batch>(a.begin() + 3, a.end()));
  // A position of another kind of stream (in memory, no augmentation) is refused.
  BatchStreamOptions plain = StreamOptions(2);
  plain.augment = false;
  auto other = BatchStream::Create(p->train, plain);
  ASSERT_TRUE(other.ok());
  const absl::Status s = (*other)->Restore(position);
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
}

TEST(ImageFolderTest, ShardsSplitTheImagesBetweenWorkers) {
  const std::string dir = MakeFolder();
  absl::StatusOr<DatasetPair> p = LoadDataset(dir, DataFormat::kAuto, LoadOptions{.image_size = 16});
  ASSERT_TRUE(p.ok());
  std::vector<int> seen(3);
  for (int shard = 0; shard < 2; ++shard) {
    BatchStreamOptions o = StreamOptions(2);
    o.shard_index = shard;
    o.num_shards = 2;
    o.batch_size = 6;
    o.shuffle = false;
    auto s = BatchStream::Create(p->train, o);
    ASSERT_TRUE(s.ok());
    EXPECT_EQ((*s)->shard_size(), 6);
    for (float l : (*s)->Next().labels) ++seen[static_cast<int>(l)];
  }
  EXPECT_THAT(seen, ElementsAre(4, 4, 4));
}

TEST(ImageFolderTest, BadFilesAreReportedAndSkippedOrStopTheStream) {
  const std::string dir = MakeFolder();
  const std::string good = test_util::ReadFile(dir + "/train/cat/0.jpg");
  test_util::WriteFile(dir + "/train/cat/1.png", good.substr(0, good.size() / 3));    // truncated (and misnamed)
  test_util::WriteFile(dir + "/train/dog/0.jpg", "this is a text file, not a JPEG");  // wrong contents
  fs::create_symlink(dir + "/gone.jpg", dir + "/train/eel/9.jpg");                    // unreadable
  test_util::WriteFile(dir + "/val/dog/bad.jpg", "");
  absl::StatusOr<DatasetPair> p = LoadDataset(dir, DataFormat::kAuto, LoadOptions{.image_size = 16});
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_EQ(p->train.count(), 13);

  // Skipped: full batches of readable images, every epoch.
  BatchStreamOptions o = StreamOptions(2);
  o.shuffle = false;
  auto s = BatchStream::Create(p->train, o);
  ASSERT_TRUE(s.ok());
  for (const Batch& b : Take(s->get(), 6)) {
    ASSERT_EQ(b.batch, 5);
    for (float v : b.images) ASSERT_TRUE(v >= 0 && v <= 1);
  }
  EXPECT_TRUE((*s)->status().ok());
  // Evaluation leaves the bad one out, every visit, and logs it at the first only.
  EvalBatchOptions eo;
  eo.batch_size = 2;
  absl::StatusOr<std::unique_ptr<EvalBatchSet>> eval = EvalBatchSet::Create(p->test, eo);
  ASSERT_TRUE(eval.ok());
  ::testing::internal::CaptureStderr();
  for (int visit = 0; visit < 2; ++visit) {
    int examples = 0;
    ASSERT_TRUE((*eval)->ForEach([&](const Batch& b) {
      examples += b.batch;
      return absl::OkStatus();
    }).ok());
    EXPECT_EQ(examples, 2);
  }
  const std::string logged = ::testing::internal::GetCapturedStderr();
  const size_t first = logged.find("val/dog/bad.jpg");
  EXPECT_NE(first, std::string::npos) << logged;
  EXPECT_EQ(logged.find("val/dog/bad.jpg", first + 1), std::string::npos) << logged;

  // Refused: the stream stops with the path in its status.
  o.bad_examples = BadExamples::kFail;
  s = BatchStream::Create(p->train, o);
  ASSERT_TRUE(s.ok());
  int batches = 0;
  while ((*s)->Next().batch > 0) ++batches;
  EXPECT_EQ(batches, 0);  // the first batch holds cat/1.png
  EXPECT_THAT(std::string((*s)->status().message()), HasSubstr("cat/1.png"));
  EXPECT_THAT(std::string((*s)->status().message()), HasSubstr("truncated"));
  eo.bad_examples = BadExamples::kFail;
  eval = EvalBatchSet::Create(p->test, eo);
  ASSERT_TRUE(eval.ok());
  const absl::Status visited = (*eval)->ForEach([](const Batch&) { return absl::OkStatus(); });
  EXPECT_THAT(std::string(visited.message()), HasSubstr("val/dog/bad.jpg: not a JPEG or PNG image (an empty file"));
}

TEST(ImageFolderTest, AShardWithNothingReadableFails) {
  const std::string dir = test_util::MakeTempDir();
  fs::create_directories(dir + "/train/a");
  fs::create_directories(dir + "/train/b");
  test_util::WriteFile(dir + "/train/a/1.jpg", "x");
  test_util::WriteFile(dir + "/train/b/1.jpg", "y");
  Jpeg(dir + "/val/a/1.jpg", 10, 10, 1);
  absl::StatusOr<DatasetPair> p = LoadDataset(dir, DataFormat::kAuto, LoadOptions{.image_size = 8});
  ASSERT_TRUE(p.ok());
  auto s = BatchStream::Create(p->train, StreamOptions(1));
  ASSERT_TRUE(s.ok());
  EXPECT_EQ((*s)->Next().batch, 0);
  EXPECT_THAT(std::string((*s)->status().message()), HasSubstr("could be read"));
}

}  // namespace
}  // namespace dtrain::data
