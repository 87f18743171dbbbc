#include "worker/data/image_resample.h"

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "worker/data/data_test_util.h"
#include "worker/data/image_test_util.h"

namespace dtrain::data {
namespace {

using test_util::Picture;

TEST(ImageResampleTest, SameSizeIsTheImageScaledToOne) {
  const std::vector<uint8_t> p = Picture(17, 11, 3);
  std::vector<float> out(p.size());
  const CropRect all{0, 0, 17, 11};
  ResampleRgb(p.data(), 17, 11, all, all, 17, 11, /*flip=*/false, out.data());
  for (size_t i = 0; i < p.size(); ++i) ASSERT_NEAR(out[i], p[i] / 255.0f, 1e-6) << i;
  // Flipped: columns mirrored.
  ResampleRgb(p.data(), 17, 11, all, all, 17, 11, /*flip=*/true, out.data());
  for (int y = 0; y < 11; ++y) {
    for (int x = 0; x < 17; ++x) {
      for (int c = 0; c < 3; ++c) {
        ASSERT_NEAR(out[(y * 17 + x) * 3 + c], p[(y * 17 + 16 - x) * 3 + c] / 255.0f, 1e-6);
      }
    }
  }
}

TEST(ImageResampleTest, DownscalingAveragesAndStaysInsideTheBounds) {
  // A 2x2 checkerboard of 0 / 255 blocks of 4 pixels, halved: the antialiasing filter averages each block with
  // its neighbours; a constant crop stays constant even though the outside differs (bounds = the crop).
  std::vector<uint8_t> p(16 * 16 * 3);
  for (int y = 0; y < 16; ++y) {
    for (int x = 0; x < 16; ++x) {
      for (int c = 0; c < 3; ++c) p[(y * 16 + x) * 3 + c] = ((x / 8) ^ (y / 8)) ? 255 : 0;
    }
  }
  std::vector<float> out(4 * 4 * 3);
  const CropRect crop{8, 0, 8, 8};  // the top-right block: all 255
  ResampleRgb(p.data(), 16, 16, crop, crop, 4, 4, false, out.data());
  for (float v : out) EXPECT_NEAR(v, 1.0f, 1e-6);
  // With the whole image as bounds, the filter reaches across the block's edge at the left.
  ResampleRgb(p.data(), 16, 16, crop, CropRect{0, 0, 16, 16}, 4, 4, false, out.data());
  EXPECT_LT(out[0], 0.99f);
  EXPECT_NEAR(out[3 * 3], 1.0f, 1e-6);
}

TEST(ImageResampleTest, RandomResizedCropDrawsTorchvisionsRanges) {
  std::mt19937_64 rng(7);
  int fallbacks = 0;
  for (int i = 0; i < 2000; ++i) {
    const CropRect c = RandomResizedCrop(500, 375, &rng);
    ASSERT_GE(c.x, 0);
    ASSERT_GE(c.y, 0);
    ASSERT_LE(c.x + c.width, 500);
    ASSERT_LE(c.y + c.height, 375);
    ASSERT_EQ(c.x, std::floor(c.x));
    ASSERT_EQ(c.width, std::floor(c.width));
    const double area = c.width * c.height / (500.0 * 375.0), ratio = c.width / c.height;
    if (area > 0.999 && std::fabs(ratio - 500.0 / 375.0) < 1e-9) {
      ++fallbacks;
      continue;
    }
    EXPECT_GE(area, 0.08 * 0.97);
    EXPECT_LE(area, 1.0);
    EXPECT_GE(ratio, 0.75 * 0.97);
    EXPECT_LE(ratio, 4.0 / 3.0 * 1.03);
  }
  EXPECT_LT(fallbacks, 20);
  // A very wide image: every draw too wide, the fallback is the central crop of ratio 4/3.
  const CropRect c = RandomResizedCrop(1000, 10, &rng);
  EXPECT_EQ(c.height, 10);
  EXPECT_EQ(c.width, 13);
  EXPECT_EQ(c.x, (1000 - 13) / 2);
}

TEST(ImageResampleTest, ResizeCenterCropIsTorchvisionsGeometry) {
  // 500x375: Resize(256) -> 341x256, CenterCrop(224) at left round(58.5) = 58 (half to even), top 16.
  const CropRect c = ResizeCenterCrop(500, 375, 256, 224);
  EXPECT_DOUBLE_EQ(c.x, 58 * 500.0 / 341);
  EXPECT_DOUBLE_EQ(c.y, 16 * 375.0 / 256);
  EXPECT_DOUBLE_EQ(c.width, 224 * 500.0 / 341);
  EXPECT_DOUBLE_EQ(c.height, 224 * 375.0 / 256);
}

// The evaluation transform against torchvision's Resize + CenterCrop + ToTensor on the same (lossless) pixels.
TEST(ImageResampleTest, EvaluationTransformMatchesTorchvision) {
  const std::string dir = test_util::MakeTempDir();
  const int w = 157, h = 93;
  const std::vector<uint8_t> p = Picture(w, h, 3, 3);
  test_util::WriteFile(dir + "/in.png", test_util::EncodePng(p, w, h, SPNG_COLOR_TYPE_TRUECOLOR));
  const int resize = 80, size = 64;
  const std::string script = absl::StrCat(
      "import numpy as np\nfrom PIL import Image\nfrom torchvision import transforms as T\n",
      "img = Image.open('", dir, "/in.png').convert('RGB')\n", "t = T.Compose([T.Resize(", resize, "), T.CenterCrop(",
      size, "), T.ToTensor()])\n", "np.asarray(t(img).permute(1, 2, 0), dtype=np.float32).tofile('", dir,
      "/out.bin')\n");
  test_util::WriteFile(dir + "/t.py", script);
  ASSERT_EQ(std::system(absl::StrCat("/usr/bin/python3 ", dir, "/t.py").c_str()), 0)
      << "needs /usr/bin/python3 with python3-torchvision (scripts/install_deps.sh)";
  const std::string want_bytes = test_util::ReadFile(dir + "/out.bin");
  ASSERT_EQ(want_bytes.size(), size * size * 3 * sizeof(float));
  const auto* want = reinterpret_cast<const float*>(want_bytes.data());
  std::vector<float> got(size * size * 3);
  ResampleRgb(p.data(), w, h, ResizeCenterCrop(w, h, resize, size), CropRect{0, 0, double(w), double(h)}, size, size,
              false, got.data());
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::fabs(double(got[i]) - want[i]));
  // PIL rounds to bytes (and computes in fixed point): half a step, and a little.
  EXPECT_LT(worst, 1.01 / 255) << worst * 255 << " steps";
}

}  // namespace
}  // namespace dtrain::data
