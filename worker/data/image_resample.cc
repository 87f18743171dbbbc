#include "worker/data/image_resample.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "glog/logging.h"
#include "worker/data/preprocess.h"

namespace dtrain::data {
namespace {

// A uniform integer in [lo, hi] from an explicit draw (std::uniform_int_distribution is not portable).
int64_t UniformInt(std::mt19937_64* rng, int64_t lo, int64_t hi) {
  return lo + static_cast<int64_t>(Uniform01(rng) * static_cast<double>(hi - lo + 1));
}

double Uniform(std::mt19937_64* rng, double lo, double hi) { return lo + (hi - lo) * Uniform01(rng); }

// Python's round() (halves to even) for the sizes, as torchvision computes them.
int RoundHalfEven(double x) { return static_cast<int>(std::nearbyint(x)); }

// The taps of one output coordinate: input indices [first, first + weights.size()) with normalized weights.
struct Taps {
  std::vector<int> first, count;
  std::vector<float> weights;  // out_size * max_taps, row o holds count[o] weights
  int max_taps = 0;
};

// PIL's precompute_coeffs for the bilinear (triangle) filter: output o samples around
// center = crop0 + (o + 0.5) * scale with support widened by max(scale, 1); taps clamped to [lo, hi).
Taps ComputeTaps(double crop0, double crop_size, int out_size, int lo, int hi) {
  const double scale = crop_size / out_size;
  const double filter_scale = std::max(scale, 1.0);
  const double support = 1.0 * filter_scale;
  Taps t;
  t.max_taps = static_cast<int>(std::ceil(support)) * 2 + 1;
  t.first.resize(out_size);
  t.count.resize(out_size);
  t.weights.assign(static_cast<size_t>(out_size) * t.max_taps, 0.0f);
  std::vector<double> w(t.max_taps);
  for (int o = 0; o < out_size; ++o) {
    const double center = crop0 + (o + 0.5) * scale;
    int xmin = static_cast<int>(std::floor(center - support + 0.5));
    int xmax = static_cast<int>(std::floor(center + support + 0.5));
    xmin = std::max(xmin, lo);
    xmax = std::min(xmax, hi);
    int n = std::min(xmax - xmin, t.max_taps);
    double sum = 0;
    for (int k = 0; k < n; ++k) {
      const double x = (xmin + k - center + 0.5) / filter_scale;
      w[k] = std::max(0.0, 1.0 - std::fabs(x));
      sum += w[k];
    }
    if (n <= 0 || sum <= 0) {  // a crop edge exactly between pixels: the nearest pixel
      xmin = std::clamp(static_cast<int>(std::floor(center)), lo, hi - 1);
      n = 1;
      w[0] = sum = 1;
    }
    t.first[o] = xmin;
    t.count[o] = n;
    for (int k = 0; k < n; ++k) t.weights[static_cast<size_t>(o) * t.max_taps + k] = static_cast<float>(w[k] / sum);
  }
  return t;
}

}  // namespace

CropRect RandomResizedCrop(int width, int height, std::mt19937_64* rng, double scale_min, double scale_max,
                           double ratio_min, double ratio_max) {
  const double area = static_cast<double>(width) * height;
  const double log_lo = std::log(ratio_min), log_hi = std::log(ratio_max);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target_area = area * Uniform(rng, scale_min, scale_max);
    const double aspect = std::exp(Uniform(rng, log_lo, log_hi));
    const int w = RoundHalfEven(std::sqrt(target_area * aspect));
    const int h = RoundHalfEven(std::sqrt(target_area / aspect));
    if (w > 0 && w <= width && h > 0 && h <= height) {
      const int64_t y = UniformInt(rng, 0, height - h);
      const int64_t x = UniformInt(rng, 0, width - w);
      return {static_cast<double>(x), static_cast<double>(y), static_cast<double>(w), static_cast<double>(h)};
    }
  }
  const double in_ratio = static_cast<double>(width) / height;
  int w = width, h = height;
  if (in_ratio < ratio_min) {
    h = RoundHalfEven(w / ratio_min);
  } else if (in_ratio > ratio_max) {
    w = RoundHalfEven(h * ratio_max);
  }
  w = std::clamp(w, 1, width);
  h = std::clamp(h, 1, height);
  return {static_cast<double>((width - w) / 2), static_cast<double>((height - h) / 2), static_cast<double>(w),
          static_cast<double>(h)};
}

CropRect ResizeCenterCrop(int width, int height, int resize_size, int size) {
  // torchvision's Resize(int): the shorter side to resize_size, the longer int(resize_size * long / short).
  int new_w, new_h;
  if (width <= height) {
    new_w = resize_size;
    new_h = static_cast<int>(static_cast<int64_t>(resize_size) * height / width);
  } else {
    new_h = resize_size;
    new_w = static_cast<int>(static_cast<int64_t>(resize_size) * width / height);
  }
  // CenterCrop: top = int(round((new_h - size) / 2)) (Python's round), likewise left. A crop larger than the
  // resized image (torchvision pads it with zeros) is clamped to the image here.
  const int crop_w = std::min(size, new_w), crop_h = std::min(size, new_h);
  const int left = RoundHalfEven((new_w - crop_w) / 2.0), top = RoundHalfEven((new_h - crop_h) / 2.0);
  const double sx = static_cast<double>(width) / new_w, sy = static_cast<double>(height) / new_h;
  return {left * sx, top * sy, crop_w * sx, crop_h * sy};
}

void ResampleRgb(const uint8_t* rgb, int width, int height, const CropRect& crop, const CropRect& bounds,
                 int out_width, int out_height, bool flip, float* out) {
  CHECK_GT(out_width, 0);
  CHECK_GT(out_height, 0);
  const int bx0 = std::max(0, static_cast<int>(std::floor(bounds.x)));
  const int by0 = std::max(0, static_cast<int>(std::floor(bounds.y)));
  const int bx1 = std::min(width, static_cast<int>(std::ceil(bounds.x + bounds.width)));
  const int by1 = std::min(height, static_cast<int>(std::ceil(bounds.y + bounds.height)));
  CHECK(bx1 > bx0 && by1 > by0) << "ResampleRgb: empty bounds";
  const Taps tx = ComputeTaps(crop.x, crop.width, out_width, bx0, bx1);
  const Taps ty = ComputeTaps(crop.y, crop.height, out_height, by0, by1);
  // The input rows any output row reads.
  const int row0 = ty.first.front(), row1 = ty.first.back() + ty.count.back();
  // Horizontal pass: every needed row to out_width pixels (floats, still 0..255).
  const size_t out_stride = static_cast<size_t>(out_width) * 3;
  std::vector<float> rows(static_cast<size_t>(row1 - row0) * out_stride);
  for (int y = row0; y < row1; ++y) {
    const uint8_t* src = rgb + static_cast<size_t>(y) * width * 3;
    float* dst = rows.data() + (y - row0) * out_stride;
    for (int o = 0; o < out_width; ++o) {
      const float* w = tx.weights.data() + static_cast<size_t>(o) * tx.max_taps;
      const uint8_t* p = src + static_cast<size_t>(tx.first[o]) * 3;
      float r = 0, g = 0, b = 0;
      for (int k = 0; k < tx.count[o]; ++k) {
        r += w[k] * p[3 * k];
        g += w[k] * p[3 * k + 1];
        b += w[k] * p[3 * k + 2];
      }
      const int x = flip ? out_width - 1 - o : o;
      dst[3 * x] = r;
      dst[3 * x + 1] = g;
      dst[3 * x + 2] = b;
    }
  }
  // Vertical pass, scaled to [0, 1].
  constexpr float kInv255 = 1.0f / 255.0f;
  std::vector<float> w(ty.max_taps);
  for (int o = 0; o < out_height; ++o) {
    const int n = ty.count[o];
    for (int k = 0; k < n; ++k) w[k] = ty.weights[static_cast<size_t>(o) * ty.max_taps + k] * kInv255;
    const float* src = rows.data() + (ty.first[o] - row0) * out_stride;
    float* dst = out + o * out_stride;
    for (size_t i = 0; i < out_stride; ++i) dst[i] = src[i] * w[0];
    for (int k = 1; k < n; ++k) {
      const float* s = src + k * out_stride;
      const float wk = w[k];
      for (size_t i = 0; i < out_stride; ++i) dst[i] += s[i] * wk;
    }
    for (size_t i = 0; i < out_stride; ++i) dst[i] = std::min(dst[i], 1.0f);  // weights sum to 1 up to rounding
  }
}

}  // namespace dtrain::data
