#include "worker/models/registry.h"
#include "worker/towers/towers.h"

#include <gtest/gtest.h>

#include <atomic>
#include <fstream>
#include <cmath>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "common/denormals.h"
#include "worker/models/onnx/onnx_test_util.h"
#include "worker/data/synthetic_data.h"

namespace dtrain::worker {
namespace {

// The tests name their models; Towers take the resolved value.
models::ModelRef ResolvedModel(const std::string& name) {
  absl::StatusOr<models::ModelRef> spec = models::ResolveModel(name);
  EXPECT_TRUE(spec.ok()) << spec.status();
  return spec.ok() ? *spec : nullptr;
}

TEST(ParseTowersTest, Forms) {
  auto one = ParseTowers("", 0, 2);
  ASSERT_TRUE(one.ok());
  ASSERT_EQ(one->size(), 1u);
  EXPECT_EQ((*one)[0].threads, 2);

  auto three = ParseTowers("3", 0, 4);
  ASSERT_TRUE(three.ok());
  ASSERT_EQ(three->size(), 3u);
  EXPECT_EQ((*three)[0].threads + (*three)[1].threads + (*three)[2].threads, 4);

  auto gpus = ParseTowers("gpu:0,gpu:0,gpu:1", 0, 1);
  ASSERT_TRUE(gpus.ok());
  ASSERT_EQ(gpus->size(), 3u);
  EXPECT_EQ((*gpus)[2].kind, kernels::DeviceSpec::Kind::kGpu);
  EXPECT_EQ((*gpus)[2].gpu_index, 1);

  auto num_gpus = ParseTowers("", 2, 1);
  ASSERT_TRUE(num_gpus.ok());
  EXPECT_EQ(num_gpus->size(), 2u);

  EXPECT_EQ(ParseTowers("gpu:x", 0, 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseTowers("0", 0, 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseTowers("cpu,gpu:0", 0, 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseTowers("", 0, 0).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(TowersTest, GpuTowerWithoutGpuFailsClearly) {
  if (kernels::CudaDeviceCount() > 0) GTEST_SKIP() << "a GPU is present";
  models::ModelOptions mo;
  mo.batch_size = 4;
  auto towers = Towers::Create(*ResolvedModel("mlp"), mo, {kernels::DeviceSpec::Gpu(0)});
  ASSERT_FALSE(towers.ok());
  EXPECT_EQ(towers.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(towers.status().message().rfind("no CUDA device available", 0), 0u) << towers.status();
}

// Averaging two towers' gradients on batches A and B equals one tower's gradient on A ∪ B (the seeds'
// average_gradients): the mean loss over 2b examples.
TEST(TowersTest, TwoTowerAverageEqualsOneTowerOnConcatenatedBatch) {
  const int b = 8;
  const data::DatasetPair data = MakeSyntheticDataset(2 * b, 1);
  models::ModelOptions mo;
  mo.batch_size = b;
  auto two = Towers::Create(*ResolvedModel("mlp"), mo, {kernels::DeviceSpec::Cpu(1), kernels::DeviceSpec::Cpu(1)});
  ASSERT_TRUE(two.ok()) << two.status();
  mo.batch_size = 2 * b;
  auto one = Towers::Create(*ResolvedModel("mlp"), mo, {kernels::DeviceSpec::Cpu(1)});
  ASSERT_TRUE(one.ok()) << one.status();

  const std::vector<float> params = models::InitialParameters((*one)->tower(0)->variables(), 3);
  ASSERT_TRUE((*one)->SetParameters(params.data()).ok());
  ASSERT_TRUE((*two)->SetParameters(params.data()).ok());

  std::vector<data::Batch> all = data::EvalBatches(data.train, 2 * b, data::Preprocess::kScale01);
  ASSERT_EQ(all.size(), 1u);
  const data::Batch& full = all[0];
  const int64_t image = static_cast<int64_t>(full.height) * full.width * full.channels;
  models::HostBatch whole{2 * b, full.height, full.width, full.channels, full.images.data(), full.labels.data()};
  models::HostBatch first{b, full.height, full.width, full.channels, full.images.data(), full.labels.data()};
  models::HostBatch second{b, full.height, full.width, full.channels, full.images.data() + b * image,
                           full.labels.data() + b};

  const int64_t n = (*one)->num_parameters();
  auto l1 = (*one)->ComputeGradients({whole}, 0);
  auto l2 = (*two)->ComputeGradients({first, second}, 0);
  ASSERT_TRUE(l1.ok()) << l1.status();
  ASSERT_TRUE(l2.ok()) << l2.status();
  const float* g1 = (*one)->host_grads();
  const float* g2 = (*two)->host_grads();
  EXPECT_NEAR(*l1, *l2, 1e-5 * std::abs(*l1));
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; ++i) {
    num += (g1[i] - g2[i]) * static_cast<double>(g1[i] - g2[i]);
    den += g1[i] * static_cast<double>(g1[i]);
  }
  ASSERT_GT(den, 0);
  EXPECT_LE(std::sqrt(num / den), 1e-5);
}

// Losses of `steps` SGD steps of `model` on fixed synthetic batches with the given towers.
std::vector<float> LossCurve(const std::string& model, int batch, const std::vector<kernels::DeviceSpec>& specs,
                             int steps, float lr) {
  const data::DatasetPair data = MakeSyntheticDataset(batch * static_cast<int>(specs.size()) * 4, 1);
  models::ModelOptions mo;
  mo.batch_size = batch;
  auto towers = Towers::Create(*ResolvedModel(model), mo, specs);
  EXPECT_TRUE(towers.ok()) << towers.status();
  if (!towers.ok()) return {};
  std::vector<float> params = models::InitialParameters((*towers)->tower(0)->variables(), 5);
  std::vector<data::Batch> batches = data::EvalBatches(data.train, batch, data::Preprocess::kScale01);
  std::vector<float> losses;
  for (int s = 0; s < steps; ++s) {
    EXPECT_TRUE((*towers)->SetParameters(params.data()).ok());
    std::vector<models::HostBatch> views;
    for (size_t t = 0; t < specs.size(); ++t) {
      const data::Batch& b = batches[(s * specs.size() + t) % batches.size()];
      views.push_back({b.batch, b.height, b.width, b.channels, b.images.data(), b.labels.data()});
    }
    auto loss = (*towers)->ComputeGradients(views, s);
    EXPECT_TRUE(loss.ok()) << loss.status();
    if (!loss.ok()) return {};
    losses.push_back(*loss);
    const float* grads = (*towers)->host_grads();
    for (size_t i = 0; i < params.size(); ++i) params[i] -= lr * grads[i];
  }
  return losses;
}

// The GPU tower trains like the CPU tower: same initial values, same batches, same dropout masks (the shared
// counter-based RNG), so the loss curves agree within fp32 tolerance.
TEST(TowersTest, GpuCnnLossCurveMatchesCpu) {
  if (kernels::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  const std::vector<float> cpu = LossCurve("cnn", 16, {kernels::DeviceSpec::Cpu(2)}, 8, 0.01f);
  const std::vector<float> gpu = LossCurve("cnn", 16, {kernels::DeviceSpec::Gpu(0)}, 8, 0.01f);
  ASSERT_EQ(cpu.size(), gpu.size());
  for (size_t i = 0; i < cpu.size(); ++i) EXPECT_NEAR(cpu[i], gpu[i], 2e-3 * std::abs(cpu[i]) + 1e-4) << "step " << i;
  EXPECT_LT(cpu.back(), cpu.front());
}

// Two GPU towers (sharing GPU 0) averaged on the device equal the CPU's two-tower average.
TEST(TowersTest, TwoGpuTowersMatchTwoCpuTowers) {
  if (kernels::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  const std::vector<float> cpu =
      LossCurve("mlp", 32, {kernels::DeviceSpec::Cpu(1), kernels::DeviceSpec::Cpu(1)}, 6, 0.1f);
  const std::vector<float> gpu =
      LossCurve("mlp", 32, {kernels::DeviceSpec::Gpu(0), kernels::DeviceSpec::Gpu(0)}, 6, 0.1f);
  ASSERT_EQ(cpu.size(), gpu.size());
  for (size_t i = 0; i < cpu.size(); ++i) EXPECT_NEAR(cpu[i], gpu[i], 1e-3 * std::abs(cpu[i]) + 1e-4) << "step " << i;
}

// An imported graph (BatchNorm in training mode, a residual Add, a transposed Gemm, ONNX's OIHW filters) on a GPU
// tower trains like on the CPU tower.
TEST(TowersTest, GpuImportedResidualNetMatchesCpu) {
  if (kernels::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  const std::string path = ::testing::TempDir() + "/towers_residual_bn.onnx";
  std::ofstream(path, std::ios::binary) << models::onnx::testing::ResidualNetBytes(/*batch_norm=*/true);
  const std::vector<float> cpu = LossCurve(path, 16, {kernels::DeviceSpec::Cpu(2)}, 6, 0.05f);
  const std::vector<float> gpu = LossCurve(path, 16, {kernels::DeviceSpec::Gpu(0)}, 6, 0.05f);
  ASSERT_EQ(cpu.size(), gpu.size());
  for (size_t i = 0; i < cpu.size(); ++i) EXPECT_NEAR(cpu[i], gpu[i], 2e-3 * std::abs(cpu[i]) + 1e-4) << "step " << i;
}

// The CPU two-tower loop itself trains (the helper the GPU tests rely on is sound).
TEST(TowersTest, LossCurveFallsOnCpu) {
  const std::vector<float> cpu =
      LossCurve("mlp", 32, {kernels::DeviceSpec::Cpu(1), kernels::DeviceSpec::Cpu(1)}, 10, 0.1f);
  ASSERT_EQ(cpu.size(), 10u);
  EXPECT_LT(cpu.back(), 0.7f * cpu.front());
}

// CPU towers compute on the host buffers in place, and a step's hooks see it layer by layer: every tower waits
// for each layer's parameters before reading them (forward order), and each layer's gradient is handed on once,
// already averaged over the towers, last layer first.
TEST(TowersTest, PerLayerHooksSeeAveragedGradientsLastLayerFirst) {
  const int b = 8;
  const data::DatasetPair data = MakeSyntheticDataset(4 * b, 1);
  models::ModelOptions mo;
  mo.batch_size = b;
  auto towers = Towers::Create(*ResolvedModel("cnn"), mo, {kernels::DeviceSpec::Cpu(1), kernels::DeviceSpec::Cpu(1)});
  ASSERT_TRUE(towers.ok()) << towers.status();
  EXPECT_TRUE((*towers)->host_resident());
  const std::vector<float> params = models::InitialParameters((*towers)->tower(0)->variables(), 3);
  std::copy(params.begin(), params.end(), (*towers)->host_params());
  std::vector<data::Batch> batches = data::EvalBatches(data.train, b, data::Preprocess::kScale01);
  std::vector<models::HostBatch> views;
  for (int t = 0; t < 2; ++t) {
    const data::Batch& x = batches[t];
    views.push_back({x.batch, x.height, x.width, x.channels, x.images.data(), x.labels.data()});
  }
  absl::Mutex mu;
  std::vector<std::pair<int64_t, int64_t>> waited, ready;
  std::vector<std::vector<float>> at_ready;
  models::StepHooks hooks;
  hooks.before_forward = [&](int64_t begin, int64_t end) {
    absl::MutexLock lock(&mu);
    waited.emplace_back(begin, end);
    return absl::OkStatus();
  };
  hooks.gradients_ready = [&](int64_t begin, int64_t end) {
    absl::MutexLock lock(&mu);
    ready.emplace_back(begin, end);
    const float* g = (*towers)->host_grads();
    at_ready.emplace_back(g + begin, g + end);
    return absl::OkStatus();
  };
  ASSERT_TRUE((*towers)->ComputeGradients(views, 0, &hooks).ok());
  // cnn: conv1, conv2, fc1, fc2, each [weights, biases]: 4 ranges, waited for by both towers.
  ASSERT_EQ(waited.size(), 8u);
  ASSERT_EQ(ready.size(), 4u);
  for (size_t i = 1; i < ready.size(); ++i) EXPECT_EQ(ready[i].second, ready[i - 1].first) << "last layer first";
  EXPECT_EQ(ready.back().first, 0);
  EXPECT_EQ(ready.front().second, (*towers)->num_parameters());
  const float* final_grads = (*towers)->host_grads();
  for (size_t i = 0; i < ready.size(); ++i) {
    EXPECT_EQ(at_ready[i], std::vector<float>(final_grads + ready[i].first, final_grads + ready[i].second))
        << "range " << i << " changed after it was handed on";
  }
  // The same as computing without hooks.
  std::vector<float> hooked(final_grads, final_grads + (*towers)->num_parameters());
  ASSERT_TRUE((*towers)->ComputeGradients(views, 0).ok());
  EXPECT_EQ(hooked, std::vector<float>((*towers)->host_grads(), (*towers)->host_grads() + (*towers)->num_parameters()));
}

// Denormal floats are flushed on the towers' threads: with denormal inputs (and so denormal products) the
// first convolution's weight gradient (the cnn has no weight decay) is exactly zero.
TEST(TowersTest, TowerThreadsFlushDenormals) {
  const int b = 2;
  models::ModelOptions mo;
  mo.batch_size = b;
  auto towers = Towers::Create(*ResolvedModel("cnn"), mo, {kernels::DeviceSpec::Cpu(1), kernels::DeviceSpec::Cpu(1)});
  ASSERT_TRUE(towers.ok()) << towers.status();
  const std::vector<models::VariableInfo> vars = (*towers)->tower(0)->variables();
  const std::vector<float> params = models::InitialParameters(vars, 3);
  std::copy(params.begin(), params.end(), (*towers)->host_params());
  std::vector<float> images(b * 28 * 28, 1e-39f), labels(b, 1.0f);  // 1e-39: denormal
  const models::HostBatch batch{b, 28, 28, 1, images.data(), labels.data()};
  std::thread t([&] {
    ClearFlushDenormals();  // as if the caller had never set it (threads inherit the mode)
    ASSERT_TRUE((*towers)->ComputeGradients({batch, batch}, 0).ok());
  });
  t.join();
  const float* g = (*towers)->host_grads();
  ASSERT_EQ(vars[0].name, "conv1/weights");
  int64_t nonzero = 0;
  for (int64_t i = 0; i < vars[0].size(); ++i) nonzero += g[i] != 0.0f;
  EXPECT_EQ(nonzero, 0) << "denormal products survived on a tower thread";
}

// ---- device-owned towers (the GPU towers' code path), run on the CPU backend ----

struct HookLog {
  absl::Mutex mu;
  std::vector<std::pair<int64_t, int64_t>> waited, ready;
  std::vector<std::vector<float>> at_ready;
  std::vector<float> losses;
  size_t ready_before_loss = 0;
};

models::StepHooks LoggingHooks(HookLog* log, Towers* towers) {
  models::StepHooks hooks;
  hooks.before_forward = [log](int64_t begin, int64_t end) {
    absl::MutexLock lock(&log->mu);
    log->waited.emplace_back(begin, end);
    return absl::OkStatus();
  };
  hooks.after_forward = [log](float loss) {
    absl::MutexLock lock(&log->mu);
    log->losses.push_back(loss);
    log->ready_before_loss += log->ready.size();
    return absl::OkStatus();
  };
  hooks.gradients_ready = [log, towers](int64_t begin, int64_t end) {
    absl::MutexLock lock(&log->mu);
    log->ready.emplace_back(begin, end);
    log->at_ready.emplace_back(towers->host_grads() + begin, towers->host_grads() + end);
    return absl::OkStatus();
  };
  return hooks;
}

// A cluster step on device-owned towers (per-layer parameter uploads from host_params() as before_forward
// lets them, per-layer downloads of the averaged gradients into host_grads(), gradients_ready once each has
// landed) computes what the host-resident towers compute, for one and two towers and for the cnn's dropout.
TEST(TowersTest, DeviceOwnedTowersEqualHostResidentTowersWithPerLayerHooks) {
  for (int n_towers : {1, 2}) {
    SCOPED_TRACE(::testing::Message() << n_towers << " towers");
    const int b = 8;
    const data::DatasetPair data = MakeSyntheticDataset(4 * b, 1);
    models::ModelOptions mo;
    mo.batch_size = b;
    const std::vector<kernels::DeviceSpec> specs(n_towers, kernels::DeviceSpec::Cpu(1));
    auto host = Towers::Create(*ResolvedModel("cnn"), mo, specs);
    TowersOptions device_owned;
    device_owned.cpu_in_place = false;
    auto dev = Towers::Create(*ResolvedModel("cnn"), mo, specs, device_owned);
    ASSERT_TRUE(host.ok() && dev.ok()) << host.status() << dev.status();
    EXPECT_TRUE((*host)->host_resident());
    EXPECT_FALSE((*dev)->host_resident());
    const int64_t n = (*host)->num_parameters();
    std::vector<data::Batch> batches = data::EvalBatches(data.train, b, data::Preprocess::kScale01);
    for (int step = 0; step < 3; ++step) {
      const std::vector<float> params = models::InitialParameters((*host)->tower(0)->variables(), 3 + step);
      std::copy(params.begin(), params.end(), (*host)->host_params());
      std::copy(params.begin(), params.end(),
                (*dev)->host_params());  // uploaded layer by layer, no SetParameters
      std::vector<models::HostBatch> views;
      for (int t = 0; t < n_towers; ++t) {
        const data::Batch& x = batches[(step + t) % batches.size()];
        views.push_back({x.batch, x.height, x.width, x.channels, x.images.data(), x.labels.data()});
      }
      auto want = (*host)->ComputeGradients(views, step);
      ASSERT_TRUE(want.ok()) << want.status();
      HookLog log;
      const models::StepHooks hooks = LoggingHooks(&log, dev->get());
      auto got = (*dev)->ComputeGradients(views, step, &hooks);
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_EQ(*got, *want) << "step " << step;
      const std::vector<float> grads((*dev)->host_grads(), (*dev)->host_grads() + n);
      EXPECT_EQ(grads, std::vector<float>((*host)->host_grads(), (*host)->host_grads() + n))
          << "step " << step;
      // cnn: 4 layers with variables, each waited for by every tower, handed on once, last layer first, after
      // the loss, and already final when handed on.
      EXPECT_EQ(log.waited.size(), 4u * n_towers);
      ASSERT_EQ(log.ready.size(), 4u);
      ASSERT_EQ(log.losses.size(), 1u);
      EXPECT_EQ(log.losses[0], *want);
      EXPECT_EQ(log.ready_before_loss, 0u);
      EXPECT_EQ(log.ready.front().second, n);
      EXPECT_EQ(log.ready.back().first, 0);
      for (size_t i = 1; i < log.ready.size(); ++i) EXPECT_EQ(log.ready[i].second, log.ready[i - 1].first);
      for (size_t i = 0; i < log.ready.size(); ++i) {
        EXPECT_EQ(log.at_ready[i], std::vector<float>(grads.begin() + log.ready[i].first,
                                                      grads.begin() + log.ready[i].second));
      }
    }
  }
}

// A failing hook on one tower's thread ends the step with its error; the other tower does not wait forever at
// the per-layer meeting. A bad label is InvalidArgument before anything is enqueued.
TEST(TowersTest, DeviceOwnedTowersFailCleanly) {
  const int b = 4;
  const data::DatasetPair data = MakeSyntheticDataset(4 * b, 1);
  models::ModelOptions mo;
  mo.batch_size = b;
  TowersOptions device_owned;
  device_owned.cpu_in_place = false;
  auto towers =
      Towers::Create(*ResolvedModel("mlp"), mo, {kernels::DeviceSpec::Cpu(1), kernels::DeviceSpec::Cpu(1)}, device_owned);
  ASSERT_TRUE(towers.ok()) << towers.status();
  std::vector<data::Batch> batches = data::EvalBatches(data.train, b, data::Preprocess::kScale01);
  std::vector<models::HostBatch> views;
  for (int t = 0; t < 2; ++t) {
    views.push_back({b, 28, 28, 1, batches[t].images.data(), batches[t].labels.data()});
  }
  std::atomic<int> calls{0};
  models::StepHooks hooks;
  hooks.before_forward = [&](int64_t begin, int64_t end) -> absl::Status {
    if (begin > 0 && calls.fetch_add(1) == 0) return absl::DeadlineExceededError("no parameters");
    return absl::OkStatus();
  };
  auto failed = (*towers)->ComputeGradients(views, 0, &hooks);
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kDeadlineExceeded) << failed.status();
  auto again = (*towers)->ComputeGradients(views, 1);
  EXPECT_TRUE(again.ok()) << again.status();
  std::vector<float> bad_labels(batches[0].labels.begin(), batches[0].labels.end());
  bad_labels[1] = 12.0f;
  views[1].labels = bad_labels.data();
  EXPECT_EQ((*towers)->ComputeGradients(views, 2).status().code(), absl::StatusCode::kInvalidArgument);
  auto host = Towers::Create(*ResolvedModel("mlp"), mo, {kernels::DeviceSpec::Cpu(1)});
  ASSERT_TRUE(host.ok());
  EXPECT_EQ((*host)->EnqueueGradients(nullptr).code(), absl::StatusCode::kFailedPrecondition);
}

// The GPU tower's cluster step (per-layer uploads and downloads on the copy stream, events between streams)
// equals the CPU tower's, for one GPU tower and for two sharing gpu:0 (averaged per layer while backward
// runs).
TEST(TowersTest, GpuClusterStepMatchesCpu) {
  if (kernels::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  for (int n_towers : {1, 2}) {
    SCOPED_TRACE(::testing::Message() << n_towers << " towers");
    const int b = 16;
    const data::DatasetPair data = MakeSyntheticDataset(4 * b, 1);
    models::ModelOptions mo;
    mo.batch_size = b;
    auto cpu =
        Towers::Create(*ResolvedModel("cnn"), mo, std::vector<kernels::DeviceSpec>(n_towers, kernels::DeviceSpec::Cpu(1)));
    auto gpu =
        Towers::Create(*ResolvedModel("cnn"), mo, std::vector<kernels::DeviceSpec>(n_towers, kernels::DeviceSpec::Gpu(0)));
    ASSERT_TRUE(cpu.ok() && gpu.ok()) << cpu.status() << gpu.status();
    const int64_t n = (*cpu)->num_parameters();
    std::vector<data::Batch> batches = data::EvalBatches(data.train, b, data::Preprocess::kScale01);
    for (int step = 0; step < 3; ++step) {
      const std::vector<float> params = models::InitialParameters((*cpu)->tower(0)->variables(), 3 + step);
      std::copy(params.begin(), params.end(), (*cpu)->host_params());
      std::copy(params.begin(), params.end(), (*gpu)->host_params());
      std::vector<models::HostBatch> views;
      for (int t = 0; t < n_towers; ++t) {
        const data::Batch& x = batches[(step + t) % batches.size()];
        views.push_back({x.batch, x.height, x.width, x.channels, x.images.data(), x.labels.data()});
      }
      auto want = (*cpu)->ComputeGradients(views, step);
      HookLog log;
      const models::StepHooks hooks = LoggingHooks(&log, gpu->get());
      auto got = (*gpu)->ComputeGradients(views, step, &hooks);
      ASSERT_TRUE(want.ok() && got.ok()) << want.status() << got.status();
      EXPECT_NEAR(*got, *want, 1e-4 * std::abs(*want));
      double num = 0, den = 0;
      for (int64_t i = 0; i < n; ++i) {
        const double d = (*gpu)->host_grads()[i] - (*cpu)->host_grads()[i];
        num += d * d;
        den += static_cast<double>((*cpu)->host_grads()[i]) * (*cpu)->host_grads()[i];
      }
      EXPECT_LE(std::sqrt(num / den), 1e-4) << "step " << step;
      ASSERT_EQ(log.ready.size(), 4u);
      for (size_t i = 0; i < log.ready.size(); ++i) {
        EXPECT_EQ(log.at_ready[i], std::vector<float>((*gpu)->host_grads() + log.ready[i].first,
                                                      (*gpu)->host_grads() + log.ready[i].second))
            << "range " << i << " was handed on before its download had landed";
      }
    }
  }
}

}  // namespace
}  // namespace dtrain::worker
