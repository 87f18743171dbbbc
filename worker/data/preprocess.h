// Per-image preprocessing shared by BatchStream and EvalBatches (internal to the data library).
//
// Thread-safety: the functions are stateless; each call uses only the RNG it is given.
#ifndef DTRAIN_WORKER_DATA_PREPROCESS_H_
#define DTRAIN_WORKER_DATA_PREPROCESS_H_

#include <cstdint>
#include <random>

#include "absl/status/status.h"
#include "worker/data/dataset.h"

namespace dtrain::data {

struct ImageShape {
  int height = 0, width = 0, channels = 0;
  int64_t size() const { return static_cast<int64_t>(height) * width * channels; }
};

// The shape `mode` turns images of `in` into: `in` for kScale01, crop_h x crop_w x channels for the CIFAR
// modes. InvalidArgument if the crop does not fit inside the image or is not positive.
absl::StatusOr<ImageShape> PreprocessedShape(const ImageShape& in, Preprocess mode, int crop_h, int crop_w);

// Writes the preprocessed `image` (uint8 HWC of shape `in`) to `out` (shape `out_shape`, from
// PreprocessedShape). kCifarTrain draws its crop, flip, brightness and contrast from `rng`.
void PreprocessImage(const uint8_t* image, const ImageShape& in, Preprocess mode, const ImageShape& out_shape,
                     std::mt19937_64* rng, float* out);

// Applies `n` (CheckNormalization'ed for shape's channels) to one preprocessed image (HWC) in place.
void NormalizeImage(const Normalization& n, const ImageShape& shape, float* image);

// A double uniform in [0, 1) from 53 random bits (std::uniform_real_distribution is not portable).
inline double Uniform01(std::mt19937_64* rng) { return static_cast<double>((*rng)() >> 11) * 0x1.0p-53; }

}  // namespace dtrain::data

#endif  // DTRAIN_WORKER_DATA_PREPROCESS_H_
