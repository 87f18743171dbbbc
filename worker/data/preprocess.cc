#include "worker/data/preprocess.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"

namespace dtrain::data {
namespace {

// Per-image standardization as tf.image.per_image_standardization: (x - mean) / max(stddev, 1/sqrt(N)).
void Standardize(float* x, int64_t n) {
  double sum = 0, sum_sq = 0;
  for (int64_t i = 0; i < n; ++i) {
    sum += x[i];
    sum_sq += static_cast<double>(x[i]) * x[i];
  }
  const double mean = sum / n;
  const double var = std::max(0.0, sum_sq / n - mean * mean);
  const double scale = 1.0 / std::max(std::sqrt(var), 1.0 / std::sqrt(static_cast<double>(n)));
  for (int64_t i = 0; i < n; ++i) x[i] = static_cast<float>((x[i] - mean) * scale);
}

// Copies the crop at (top, left) of `image` to `out` as floats on the 0..255 scale, mirrored if `flip`.
void Crop(const uint8_t* image, const ImageShape& in, int top, int left, bool flip, const ImageShape& o,
          float* out) {
  const int c = in.channels;
  for (int y = 0; y < o.height; ++y) {
    const uint8_t* row = image + (static_cast<int64_t>(top + y) * in.width + left) * c;
    float* dst = out + static_cast<int64_t>(y) * o.width * c;
    for (int x = 0; x < o.width; ++x) {
      const int sx = flip ? o.width - 1 - x : x;
      for (int ch = 0; ch < c; ++ch) dst[x * c + ch] = row[sx * c + ch];
    }
  }
}

}  // namespace

absl::StatusOr<ImageShape> PreprocessedShape(const ImageShape& in, Preprocess mode, int crop_h, int crop_w) {
  if (mode == Preprocess::kScale01) return in;
  if (crop_h <= 0 || crop_w <= 0 || crop_h > in.height || crop_w > in.width) {
    return absl::InvalidArgumentError(absl::StrCat("crop ", crop_h, "x", crop_w, " does not fit images of ",
                                                   in.height, "x", in.width));
  }
  return ImageShape{crop_h, crop_w, in.channels};
}

void PreprocessImage(const uint8_t* image, const ImageShape& in, Preprocess mode, const ImageShape& o,
                     std::mt19937_64* rng, float* out) {
  const int64_t n = o.size();
  switch (mode) {
    case Preprocess::kScale01:
      for (int64_t i = 0; i < n; ++i) out[i] = image[i] * (1.0f / 255.0f);
      return;
    case Preprocess::kCifarEval:
      Crop(image, in, (in.height - o.height) / 2, (in.width - o.width) / 2, /*flip=*/false, o, out);
      Standardize(out, n);
      return;
    case Preprocess::kCifarTrain: {
      // Draw order is part of the reproducibility contract: top, left, flip, brightness, contrast.
      const int top = static_cast<int>(Uniform01(rng) * (in.height - o.height + 1));
      const int left = static_cast<int>(Uniform01(rng) * (in.width - o.width + 1));
      const bool flip = Uniform01(rng) < 0.5;
      const float delta = static_cast<float>(-63.0 + 126.0 * Uniform01(rng));
      const float factor = static_cast<float>(0.2 + 1.6 * Uniform01(rng));
      Crop(image, in, top, left, flip, o, out);
      for (int64_t i = 0; i < n; ++i) out[i] += delta;
      // Contrast as tf.image.adjust_contrast: (x - mean) * factor + mean, mean per channel.
      const int c = o.channels;
      const int64_t pixels = static_cast<int64_t>(o.height) * o.width;
      std::vector<double> mean(c, 0.0);
      for (int64_t p = 0; p < pixels; ++p) {
        for (int ch = 0; ch < c; ++ch) mean[ch] += out[p * c + ch];
      }
      for (int ch = 0; ch < c; ++ch) mean[ch] /= pixels;
      for (int64_t p = 0; p < pixels; ++p) {
        for (int ch = 0; ch < c; ++ch) {
          float& v = out[p * c + ch];
          v = static_cast<float>((v - mean[ch]) * factor + mean[ch]);
        }
      }
      Standardize(out, n);
      return;
    }
  }
}

}  // namespace dtrain::data
