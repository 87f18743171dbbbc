// The training loop on an image folder (worker/data/image_folder.h): the source's stream, the chief's evaluation
// batch by batch, the input wait, and a bad image skipped or stopping the run with its path.
#include <filesystem>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "worker/data/data_test_util.h"
#include "worker/data/image_test_util.h"
#include "worker/train/trainer.h"

namespace dtrain::worker {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

// Three classes a small model tells apart by colour: pictures tinted red, green or blue.
std::string MakeFolder(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "/" + name;
  fs::remove_all(dir);
  for (const char* split : {"train", "val"}) {
    for (int c = 0; c < 3; ++c) {
      const std::string class_dir = absl::StrCat(dir, "/", split, "/class", c);
      fs::create_directories(class_dir);
      for (int i = 0; i < (split[0] == 't' ? 12 : 4); ++i) {
        const int w = 20 + 3 * i, h = 24 + 2 * (i % 3);
        std::vector<uint8_t> p = data::test_util::Picture(w, h, 3, i);
        for (size_t k = 0; k < p.size(); ++k) p[k] = static_cast<uint8_t>(k % 3 == static_cast<size_t>(c) ? 200 : p[k] / 4);
        data::test_util::WriteFile(absl::StrCat(class_dir, "/", i, ".jpg"), data::test_util::EncodeJpeg(p, w, h, 3));
      }
    }
  }
  return dir;
}

WorkerOptions Options(const std::string& dir) {
  WorkerOptions o;
  o.model = "mlp";
  o.data_dir = dir;
  o.data_format = data::DataFormat::kImageFolder;
  o.data_options.image_size = 12;
  o.input_threads = 2;
  o.batch_size = 8;
  o.train_steps = 60;
  o.optimizer = "sgd";
  o.learning_rate = 0.05f;
  o.quiet = true;
  o.startup_wait_secs = 30;
  return o;
}

TEST(TrainerImageFolderTest, TrainsAndEvaluatesOnAnImageFolder) {
  absl::StatusOr<TrainingResult> r = RunTraining(Options(MakeFolder("trainer_folder")), {});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->global_step, 60);
  EXPECT_GT(r->test_accuracy, 0.9);  // 12 validation images, colours apart
  EXPECT_GE(r->input_wait_seconds, 0);
  EXPECT_LT(r->input_wait_seconds, r->seconds);
}

TEST(TrainerImageFolderTest, ABadImageIsSkippedOrStopsTheRunWithItsPath) {
  const std::string dir = MakeFolder("trainer_folder_bad");
  data::test_util::WriteFile(dir + "/train/class1/broken.jpg", "GIF89a, not a JPEG");
  WorkerOptions o = Options(dir);
  o.train_steps = 10;
  o.evaluate = false;
  absl::StatusOr<TrainingResult> r = RunTraining(o, {});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->global_step, 10);
  o.bad_images = data::BadExamples::kFail;
  r = RunTraining(o, {});
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("class1/broken.jpg: not a JPEG or PNG image (a GIF image"));
}

}  // namespace
}  // namespace dtrain::worker
