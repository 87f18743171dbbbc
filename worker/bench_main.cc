// dtrain_bench: training throughput of one process (forward + backward + optimizer update), data in memory,
// warm-up excluded, median of several timing windows. Runs the same path as local training: towers → an
// in-process parameter server applying the optimizer.
//
//   dtrain_bench --model=cnn --batch_size=50 --threads=1
//   → dtrain_bench: model=cnn batch=50 threads=1 towers=cpu examples/sec median=1234.5 min=1200.1 max=1250.3
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <glog/logging.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/malloc_tuning.h"
#include "ps/placement.h"
#include "worker/data/dataset.h"
#include "worker/ps_group.h"
#include "worker/synthetic_data.h"
#include "worker/towers.h"
#include "worker/trainer.h"

ABSL_FLAG(std::string, model, "cnn", "mlp | cnn | convnet | cifar10");
ABSL_FLAG(int, batch_size, 0, "Examples per tower per step (0: the model's default)");
ABSL_FLAG(int, threads, 1, "CPU threads");
ABSL_FLAG(std::string, towers, "", "N CPU towers or gpu:0,...");
ABSL_FLAG(int, num_gpus, 0, "One tower per GPU");
ABSL_FLAG(std::string, optimizer, "", "Optimizer (default: the model's)");
ABSL_FLAG(double, learning_rate, 0, "Learning rate (default: the model's)");
ABSL_FLAG(int, warmup_steps, 5, "Steps before timing");
ABSL_FLAG(int, window_steps, 20, "Steps per timing window");
ABSL_FLAG(int, windows, 5, "Timing windows (the median is reported)");
ABSL_FLAG(std::string, data_dir, "/usr/share/datasets/fashion-mnist",
          "Data (synthetic data of the model's input shape when unreadable or for cifar10 without CIFAR files)");

namespace dtrain::worker {
namespace {

int Main() {
  WorkerOptions o;
  o.model = absl::GetFlag(FLAGS_model);
  o.batch_size = absl::GetFlag(FLAGS_batch_size);
  o.threads = absl::GetFlag(FLAGS_threads);
  o.towers = absl::GetFlag(FLAGS_towers);
  o.num_gpus = absl::GetFlag(FLAGS_num_gpus);
  o.optimizer = absl::GetFlag(FLAGS_optimizer);
  o.learning_rate = static_cast<float>(absl::GetFlag(FLAGS_learning_rate));
  if (absl::Status s = ApplyModelDefaults(&o); !s.ok()) {
    std::fprintf(stderr, "dtrain_bench: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  absl::StatusOr<std::vector<kernels::DeviceSpec>> specs = ParseTowers(o.towers, o.num_gpus, o.threads);
  if (!specs.ok()) {
    std::fprintf(stderr, "dtrain_bench: %s\n", std::string(specs.status().message()).c_str());
    return 2;
  }
  // Data in memory: the real set when it loads (and fits the model), else synthetic of the same shape.
  data::DatasetPair dataset;
  absl::StatusOr<data::DatasetPair> loaded = data::LoadDataset(absl::GetFlag(FLAGS_data_dir));
  const models::ModelDefaults d = models::DefaultsFor(o.model);
  if (loaded.ok() && loaded->train.channels == d.data_channels) {
    dataset = *std::move(loaded);
  } else {
    dataset = MakeSyntheticDataset(5000, 10, 7, d.data_height, d.data_width, d.data_channels);
  }
  models::ModelOptions mopt;
  mopt.batch_size = o.batch_size;
  models::SetInputGeometry(d, dataset.train.height, dataset.train.width, dataset.train.channels, &mopt);
  absl::StatusOr<std::unique_ptr<Towers>> towers = Towers::Create(o.model, mopt, *specs);
  if (!towers.ok()) {
    std::fprintf(stderr, "dtrain_bench: %s\n", std::string(towers.status().message()).c_str());
    return towers.status().code() == absl::StatusCode::kFailedPrecondition ? 2 : 1;
  }
  models::Model* model0 = (*towers)->tower(0);
  // Batches prepared up front: the benchmark times compute and the update, not input.
  data::BatchStreamOptions so;
  so.batch_size = o.batch_size;
  so.preprocess = d.train_preprocess;
  so.crop_h = mopt.height;
  so.crop_w = mopt.width;
  auto stream = data::BatchStream::Create(dataset.train, so);
  if (!stream.ok()) {
    std::fprintf(stderr, "dtrain_bench: %s\n", std::string(stream.status().message()).c_str());
    return 1;
  }
  std::vector<data::Batch> batches;
  for (int i = 0; i < 16; ++i) batches.push_back((*stream)->Next());

  std::vector<ps::VariableInfo> vars;
  for (const auto& v : model0->variables()) vars.push_back({v.name, v.size()});
  ps::ParameterServerOptions po;
  po.apply_threads = o.threads;
  ps::ParameterServer server(po);
  absl::StatusOr<ps::Placement> placement = ps::PlaceVariables(vars, 1);
  PsGroup group({&server}, placement->task_slices, 0, true);
  ps::TrainConfig config;
  config.model_signature = models::Signature(o.model, model0->variables());
  config.num_workers = 1;
  config.optimizer.name = o.optimizer;
  config.optimizer.learning_rate = o.learning_rate;
  std::vector<float> params = models::InitialParameters(model0->variables(), 1);
  std::vector<float> grads(params.size());
  if (absl::Status s = group.Connect(config, params.data(), absl::Seconds(10)); !s.ok()) {
    std::fprintf(stderr, "dtrain_bench: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  const int n_towers = (*towers)->size();
  int64_t step = 0;
  size_t next_batch = 0;
  std::vector<models::HostBatch> views(n_towers);
  auto run_step = [&]() -> absl::Status {
    absl::Status s = (*towers)->SetParameters(params.data());
    if (!s.ok()) return s;
    for (int t = 0; t < n_towers; ++t) {
      const data::Batch& b = batches[next_batch++ % batches.size()];
      views[t] = models::HostBatch{b.batch, b.height, b.width, b.channels, b.images.data(), b.labels.data()};
    }
    absl::StatusOr<float> loss = (*towers)->ComputeGradients(views, step, grads.data());
    if (!loss.ok()) return loss.status();
    absl::StatusOr<ps::PushResponse> pushed = group.Push(step, grads.data());
    if (!pushed.ok()) return pushed.status();
    absl::StatusOr<PullResult> pulled = group.Pull(step + 1, step, params.data());
    if (!pulled.ok()) return pulled.status();
    step = pulled->step;
    return absl::OkStatus();
  };
  for (int i = 0; i < absl::GetFlag(FLAGS_warmup_steps); ++i) {
    if (absl::Status s = run_step(); !s.ok()) {
      std::fprintf(stderr, "dtrain_bench: %s\n", s.ToString().c_str());
      return 1;
    }
  }
  std::vector<double> rates;
  const int window_steps = std::max(1, absl::GetFlag(FLAGS_window_steps));
  for (int w = 0; w < std::max(1, absl::GetFlag(FLAGS_windows)); ++w) {
    const absl::Time t0 = absl::Now();
    for (int i = 0; i < window_steps; ++i) {
      if (absl::Status s = run_step(); !s.ok()) {
        std::fprintf(stderr, "dtrain_bench: %s\n", s.ToString().c_str());
        return 1;
      }
    }
    const double secs = absl::ToDoubleSeconds(absl::Now() - t0);
    rates.push_back(static_cast<double>(window_steps) * o.batch_size * n_towers / secs);
    std::fprintf(stderr, "  window %d: %.1f examples/sec\n", w, rates.back());
  }
  std::vector<double> sorted = rates;
  std::sort(sorted.begin(), sorted.end());
  std::vector<std::string> names;
  for (const auto& s : *specs) names.push_back(s.ToString());
  std::printf("dtrain_bench: model=%s batch=%d threads=%d towers=%s examples/sec median=%.1f min=%.1f max=%.1f\n",
              o.model.c_str(), o.batch_size, o.threads, absl::StrJoin(names, ",").c_str(),
              sorted[sorted.size() / 2], sorted.front(), sorted.back());
  return 0;
}

}  // namespace
}  // namespace dtrain::worker

int main(int argc, char** argv) {
  dtrain::TuneMallocForLargeReusedBuffers();
  absl::ParseCommandLine(argc, argv);
  FLAGS_logtostderr = true;
  FLAGS_minloglevel = 1;
  google::InitGoogleLogging(argv[0]);
  return dtrain::worker::Main();
}
