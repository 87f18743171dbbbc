#include "worker/data/preprocess.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/ascii.h"

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

absl::StatusOr<Normalization> ParseNormalization(const std::string& mean, const std::string& stddev) {
  Normalization n;
  auto parse = [](const std::string& text, const char* flag, std::vector<float>* out) -> absl::Status {
    if (text.empty()) return absl::OkStatus();
    for (absl::string_view part : absl::StrSplit(text, ',')) {
      float v;
      if (!absl::SimpleAtof(absl::StripAsciiWhitespace(part), &v) || !std::isfinite(v)) {
        return absl::InvalidArgumentError(absl::StrCat(flag, ": '", part, "' is not a number (comma-separated "
                                                       "values per channel, e.g. 0.5,0.5,0.5)"));
      }
      out->push_back(v);
    }
    return absl::OkStatus();
  };
  if (absl::Status s = parse(mean, "--input_mean", &n.mean); !s.ok()) return s;
  if (absl::Status s = parse(stddev, "--input_std", &n.stddev); !s.ok()) return s;
  for (float s : n.stddev) {
    if (!(s > 0)) return absl::InvalidArgumentError(absl::StrCat("--input_std: ", s, " is not positive"));
  }
  if (n.mean.size() > 1 && n.stddev.size() > 1 && n.mean.size() != n.stddev.size()) {
    return absl::InvalidArgumentError(absl::StrCat("--input_mean has ", n.mean.size(), " values but --input_std ",
                                                   n.stddev.size(), " (one per channel, or one for all)"));
  }
  return n;
}

absl::Status CheckNormalization(const Normalization& n, int channels) {
  for (const auto* v : {&n.mean, &n.stddev}) {
    if (v->size() > 1 && static_cast<int>(v->size()) != channels) {
      return absl::InvalidArgumentError(absl::StrCat(v == &n.mean ? "--input_mean" : "--input_std", " has ", v->size(),
                                                     " values but the images have ", channels, " channel(s)"));
    }
  }
  return absl::OkStatus();
}

void NormalizeImage(const Normalization& n, const ImageShape& shape, float* image) {
  if (n.empty()) return;
  const int c = shape.channels;
  std::vector<float> mean(c, 0.0f), inv(c, 1.0f);
  for (int ch = 0; ch < c; ++ch) {
    if (!n.mean.empty()) mean[ch] = n.mean.size() == 1 ? n.mean[0] : n.mean[ch];
    if (!n.stddev.empty()) inv[ch] = 1.0f / (n.stddev.size() == 1 ? n.stddev[0] : n.stddev[ch]);
  }
  const int64_t pixels = static_cast<int64_t>(shape.height) * shape.width;
  for (int64_t p = 0; p < pixels; ++p) {
    for (int ch = 0; ch < c; ++ch) image[p * c + ch] = (image[p * c + ch] - mean[ch]) * inv[ch];
  }
}

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
