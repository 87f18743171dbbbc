// Test-only helpers for the image readers' tests: small synthetic pictures, encoded as JPEG and PNG with the same
// libraries the readers decode with (image_encode.h). Header-only.
#ifndef DTRAIN_WORKER_DATA_IMAGE_TEST_UTIL_H_
#define DTRAIN_WORKER_DATA_IMAGE_TEST_UTIL_H_

#include <spng.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "worker/data/image_encode.h"

namespace dtrain::data::test_util {

// A smooth picture with some detail (gradients, a disc, stripes) of width x height x channels bytes, varying with
// `seed`: JPEG-friendly, and different in every corner so that crops and flips show.
inline std::vector<uint8_t> Picture(int width, int height, int channels, int seed = 0) {
  std::vector<uint8_t> p(static_cast<size_t>(width) * height * channels);
  for (int y = 0; y < height; ++y) {
    for (int x = 0; x < width; ++x) {
      const double dx = x - width * 0.6, dy = y - height * 0.4;
      const bool disc = dx * dx + dy * dy < 0.04 * width * height;
      for (int c = 0; c < channels; ++c) {
        double v = 255.0 * x / width * (c == 0) + 255.0 * y / height * (c == 1) + (seed * 37 % 128) * (c == 2) +
                   40 * std::sin((x + 2 * y) * 0.15 + c + seed);
        if (disc) v = 255 - v * 0.5;
        p[(static_cast<size_t>(y) * width + x) * channels + c] = static_cast<uint8_t>(std::fmin(255, std::fmax(0, v)));
      }
    }
  }
  return p;
}

// JPEG / PNG of `pixels` (image_encode.h), failing the test if the encoder refuses.
inline std::string EncodeJpeg(const std::vector<uint8_t>& pixels, int width, int height, int channels,
                              int quality = 95, bool progressive = false) {
  absl::StatusOr<std::string> b = data::EncodeJpeg(pixels, width, height, channels, quality, progressive);
  EXPECT_TRUE(b.ok()) << b.status();
  return b.ok() ? *b : std::string();
}

inline std::string EncodePng(const std::vector<uint8_t>& pixels, int width, int height, int color_type,
                             int bit_depth = 8) {
  absl::StatusOr<std::string> b = data::EncodePng(pixels, width, height, color_type, bit_depth);
  EXPECT_TRUE(b.ok()) << b.status();
  return b.ok() ? *b : std::string();
}

// The mean absolute difference of two byte images of equal size.
inline double MeanAbsDiff(const uint8_t* a, const uint8_t* b, size_t n) {
  double sum = 0;
  for (size_t i = 0; i < n; ++i) sum += std::fabs(static_cast<double>(a[i]) - b[i]);
  return n ? sum / n : 0;
}

}  // namespace dtrain::data::test_util

#endif  // DTRAIN_WORKER_DATA_IMAGE_TEST_UTIL_H_
