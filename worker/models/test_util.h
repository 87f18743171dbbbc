// Test helpers for worker/models tests: a CPU device and random batches. Test-only.
//
// Thread-safety: plain functions and value types.
#ifndef DTRAIN_WORKER_MODELS_TEST_UTIL_H_
#define DTRAIN_WORKER_MODELS_TEST_UTIL_H_

#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/device.h"
#include "worker/models/model.h"
#include "worker/models/registry.h"

namespace dtrain::models {

// Tests name models; the code under test takes the resolved value (worker/models/registry.h).
inline absl::StatusOr<std::vector<VariableInfo>> ModelVariablesByName(const std::string& name,
                                                                      const ModelOptions& o) {
  absl::StatusOr<ModelRef> spec = ResolveModel(name);
  if (!spec.ok()) return spec.status();
  return ModelVariables(**spec, o);
}
inline absl::StatusOr<std::unique_ptr<Model>> CreateModelByName(const std::string& name, const ModelOptions& o,
                                                                kernels::Device* device) {
  absl::StatusOr<ModelRef> spec = ResolveModel(name);
  if (!spec.ok()) return spec.status();
  return CreateModel(**spec, o, device);
}
inline ModelDefaults DefaultsByName(const std::string& name) {
  absl::StatusOr<ModelRef> spec = ResolveModel(name);
  return spec.ok() ? (*spec)->defaults : ModelDefaults{};
}

}  // namespace dtrain::models

namespace dtrain::models::testing {

// The real CPU (oneDNN) backend with one thread; fails the test when it cannot be made.
inline std::unique_ptr<kernels::Device> MakeCpuDevice(kernels::ComputeDtype dtype = kernels::ComputeDtype::kFp32) {
  auto dev = kernels::CreateDevice(kernels::DeviceSpec::Cpu(1, dtype));
  EXPECT_TRUE(dev.ok()) << dev.status();
  return dev.ok() ? std::move(dev).value() : nullptr;
}

// A batch of random images (uniform [0, 1)) and labels, owning its storage.
struct OwnedBatch {
  int n = 0, height = 0, width = 0, channels = 0;
  std::vector<float> images, labels;
  HostBatch view() const { return {n, height, width, channels, images.data(), labels.data()}; }
};

inline OwnedBatch RandomBatch(const ModelOptions& o, int n, uint64_t seed) {
  OwnedBatch b{n, o.height, o.width, o.channels, {}, {}};
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  b.images.resize(static_cast<size_t>(n) * o.height * o.width * o.channels);
  for (float& x : b.images) x = u(gen);
  b.labels.resize(n);
  for (float& l : b.labels) l = static_cast<float>(gen() % o.num_classes);
  return b;
}

}  // namespace dtrain::models::testing

#endif  // DTRAIN_WORKER_MODELS_TEST_UTIL_H_
