// A small, learnable MNIST-shaped data set generated in memory, for tests (no files needed).
// Class c's images are noisy versions of a per-class random template, so a model can learn them quickly.
//
// Thread-safety: a pure function.
#ifndef DTRAIN_WORKER_DATA_SYNTHETIC_DATA_H_
#define DTRAIN_WORKER_DATA_SYNTHETIC_DATA_H_

#include <algorithm>
#include <cstdint>
#include <random>

#include "worker/data/dataset.h"

namespace dtrain::worker {

inline data::Dataset MakeSyntheticSplit(int count, int height, int width, int channels, uint64_t seed,
                                        uint64_t template_seed) {
  data::Dataset d;
  d.height = height;
  d.width = width;
  d.channels = channels;
  d.num_classes = 10;
  const int64_t size = static_cast<int64_t>(height) * width * channels;
  std::mt19937_64 trng(template_seed);
  std::uniform_int_distribution<int> pix(0, 255);
  std::vector<std::vector<uint8_t>> templates(10, std::vector<uint8_t>(size));
  for (auto& t : templates) {
    for (auto& p : t) p = static_cast<uint8_t>(pix(trng) > 170 ? 230 : 20);
  }
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> noise(0.f, 40.f);
  d.pixels.resize(count * size);
  d.labels.resize(count);
  for (int i = 0; i < count; ++i) {
    const int c = static_cast<int>(rng() % 10);
    d.labels[i] = c;
    for (int64_t j = 0; j < size; ++j) {
      d.pixels[i * size + j] = static_cast<uint8_t>(std::clamp(templates[c][j] + noise(rng), 0.f, 255.f));
    }
  }
  return d;
}

inline data::DatasetPair MakeSyntheticDataset(int train, int test, uint64_t seed = 7, int height = 28,
                                              int width = 28, int channels = 1) {
  data::DatasetPair p;
  p.train = MakeSyntheticSplit(train, height, width, channels, seed, /*template_seed=*/99);
  p.test = MakeSyntheticSplit(test, height, width, channels, seed + 1, /*template_seed=*/99);
  p.format = "synthetic";
  return p;
}

}  // namespace dtrain::worker

#endif  // DTRAIN_WORKER_DATA_SYNTHETIC_DATA_H_
