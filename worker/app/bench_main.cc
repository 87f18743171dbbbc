// dtrain_bench: training throughput of one process (forward + backward + optimizer update), data in memory,
// warm-up excluded. Runs the same path as local training (worker/train/training_steps.h): CPU towers → StepRunner →
// an in-process parameter server applying the optimizer; GPU towers → the training state on the devices
// (worker/train/resident_steps.h), the step captured as a CUDA graph (--cuda_graphs). Reports two figures:
//   - the median of several early timing windows (what compares with a peer's short benchmark), and
//   - the steady-state rate: the last window of a long run (--steps_total, default one epoch), where denormal
//     floats, allocator growth or thermal limits would show.
//
//   dtrain_bench --model=cnn --batch_size=50 --threads=1
//   → dtrain_bench: model=cnn batch=50 threads=1 towers=cpu examples/sec median=1234.5 min=1200.1 max=1250.3
//     steady=1230.2 (steps 1180-1200 of 1200) state=ps
// (GPU towers end with state=device graphs=on, or graphs=off without a captured graph.) Every timing window
// ends when its steps are complete on the devices and their losses are read back and finite.
#include <glog/logging.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "common/command_line.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/denormals.h"
#include "common/malloc_tuning.h"
#include "common/trace_recorder.h"
#include "ps/core/parameter_server.h"
#include "ps/client/placement.h"
#include "ps/client/worker_client.h"
#include "worker/data/dataset.h"
#include "worker/app/model_flags.h"
#include "worker/train/resident_steps.h"
#include "worker/data/synthetic_data.h"
#include "worker/towers/towers.h"
#include "worker/train/trainer.h"
#include "worker/train/make_training_steps.h"

ABSL_FLAG(std::string, model, "cnn", "mlp | cnn | convnet | cifar10, or PATH.onnx: a model exported as ONNX");
ABSL_FLAG(int, batch_size, 0, "Examples per tower per step (0: the model's default)");
ABSL_FLAG(std::string, towers, "", "N CPU towers or gpu:0,...");
ABSL_FLAG(int, num_gpus, 0, "One tower per GPU");
ABSL_FLAG(std::string, optimizer, "", "Optimizer (default: the model's)");
ABSL_FLAG(double, learning_rate, 0,
          "Learning rate (default: the model's; an adaptive --optimizer other than the model's takes its "
          "framework's, as dtrain_worker does)");
ABSL_FLAG(int, warmup_steps, 5, "Steps before timing");
ABSL_FLAG(int, window_steps, 20, "Steps per timing window");
ABSL_FLAG(int, windows, 5, "Early timing windows (the median is reported)");
ABSL_FLAG(int64_t, steps_total, -1,
          "Steps of the whole run; its last window gives the steady-state rate (-1: one epoch of the training "
          "set, at least the early windows; 0: no steady-state figure)");
ABSL_FLAG(
    bool, cuda_graphs, true,
    "GPU towers: capture the training step once as a CUDA graph and replay it (eager steps where capture "
    "fails, with one log line saying why)");
ABSL_FLAG(bool, device_resident, true,
          "GPU towers: keep variables, optimizer slots and moving averages on the devices (false: every step "
          "goes through the in-process parameter server on the host, the previous path)");
ABSL_FLAG(std::string, data_dir, "/usr/share/datasets/fashion-mnist",
          "Data (synthetic data of the model's input shape when unreadable or for cifar10 without CIFAR files)");
ABSL_FLAG(std::string, trace_steps, "",
          "Record a timeline of steps A to B (A:B, 0 <= A <= B; the warm-up's first step is 0) as Chrome trace-event "
          "JSON, --trace_dir/bench.trace.json (docs/timelines.md)");
ABSL_FLAG(std::string, trace_dir, "", "--trace_steps: the directory of the trace file (made when missing)");
ABSL_FLAG(int, synthetic_examples, 5000,
          "Training examples of the synthetic data (16 batches are timed over and over: 16 x --batch_size "
          "suffice; 224x224x3 images are 150 KB each)");

namespace dtrain::worker {
namespace {

int Fail(const absl::Status& s, int code = 1) {
  std::fprintf(stderr, "dtrain_bench: %s\n", std::string(s.message()).c_str());
  return code;
}

int Main() {
  SetFlushDenormals();
  WorkerOptions o;
  o.model = absl::GetFlag(FLAGS_model);
  o.batch_size = absl::GetFlag(FLAGS_batch_size);
  absl::StatusOr<ThreadDecision> threads = ThreadsFromFlags();
  if (!threads.ok()) return Fail(threads.status(), 2);
  std::fprintf(stderr, "dtrain_bench: %s%s\n", threads->exceeds_budget ? "warning: " : "", threads->line.c_str());
  o.threads = threads->threads;
  o.towers = absl::GetFlag(FLAGS_towers);
  o.num_gpus = absl::GetFlag(FLAGS_num_gpus);
  o.optimizer = absl::GetFlag(FLAGS_optimizer);
  o.learning_rate = static_cast<float>(absl::GetFlag(FLAGS_learning_rate));
  if (absl::Status s = ApplyModelDefaults(&o); !s.ok()) return Fail(s, 2);
  if (o.resolved_model->defaults.ctr_data) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
                    "--model=", o.model, " trains on click-through-rate data with its tables on the ps; time it with "
                    "dtrain_worker --job_name=local --data_dir=DIR (its progress lines give examples/sec) or "
                    "scripts/compare_cluster_sizes.sh --model=", o.model)),
                2);
  }
  absl::StatusOr<data::Normalization> normalize = InputNormalizationFromFlags();  // as dtrain_worker takes them
  if (!normalize.ok()) return Fail(normalize.status(), 2);
  absl::StatusOr<kernels::ComputeDtype> dtype = ComputeDtypeFromFlags();
  if (!dtype.ok()) return Fail(dtype.status(), 2);
  absl::StatusOr<std::vector<kernels::DeviceSpec>> specs = ParseTowers(o.towers, o.num_gpus, o.threads, *dtype);
  if (!specs.ok()) return Fail(specs.status(), 2);
  // Data in memory: the real set when it loads (and fits the model), else synthetic of the same shape.
  data::DatasetPair dataset;
  absl::StatusOr<data::DatasetPair> loaded = data::LoadDataset(absl::GetFlag(FLAGS_data_dir));
  const models::ModelDefaults& d = o.resolved_model->defaults;
  // An imported model takes exactly its input's images (a built-in one adapts to the data set's size).
  const bool fits = loaded.ok() && loaded->train.channels == d.data_channels &&
                    (!o.resolved_model->imported() ||
                     (loaded->train.height == d.data_height && loaded->train.width == d.data_width));
  if (fits) {
    dataset = *std::move(loaded);
  } else {
    const int examples = absl::GetFlag(FLAGS_synthetic_examples);
    if (examples < 1) return Fail(absl::InvalidArgumentError("--synthetic_examples must be positive"), 2);
    dataset = MakeSyntheticDataset(examples, 10, 7, d.data_height, d.data_width, d.data_channels);
  }
  models::ModelOptions mopt;
  mopt.batch_size = o.batch_size;
  models::SetInputGeometry(d, dataset.train.height, dataset.train.width, dataset.train.channels, &mopt);
  const bool resident =
      absl::GetFlag(FLAGS_device_resident) && (*specs)[0].kind == kernels::DeviceSpec::Kind::kGpu;
  TowersOptions topt;
  topt.replicated = resident;
  absl::StatusOr<std::unique_ptr<Towers>> towers = Towers::Create(*o.resolved_model, mopt, *specs, topt);
  if (!towers.ok()) {
    const absl::StatusCode code = towers.status().code();
    return Fail(towers.status(),
                code == absl::StatusCode::kFailedPrecondition || code == absl::StatusCode::kInvalidArgument ? 2 : 1);
  }
  models::Model* model0 = (*towers)->tower(0);
  absl::StatusOr<std::unique_ptr<TraceRecorder>> trace =
      TraceRecorderFromFlags(absl::GetFlag(FLAGS_trace_steps), absl::GetFlag(FLAGS_trace_dir), "bench");
  if (!trace.ok()) return Fail(trace.status(), 2);
  // Batches prepared up front: the benchmark times compute and the update, not input.
  data::BatchStreamOptions so;
  so.batch_size = o.batch_size;
  so.preprocess = d.train_preprocess;
  so.crop_h = mopt.height;
  so.crop_w = mopt.width;
  if (absl::Status s = data::CheckNormalization(*normalize, dataset.train.channels); !s.ok()) return Fail(s, 2);
  so.normalize = *normalize;
  auto stream = data::BatchStream::Create(dataset.train, so);
  if (!stream.ok()) return Fail(stream.status());
  std::vector<data::Batch> batches;
  for (int i = 0; i < 16; ++i) batches.push_back((*stream)->Next());

  // The local-mode path: an in-process ps, a WorkerClient running inline, the training steps.
  std::vector<ps::VariableInfo> vars;
  for (const auto& v : model0->variables()) vars.push_back({v.name, v.size(), v.trainable});
  ps::ParameterServerOptions po;
  po.apply_threads = o.threads;
  po.trace = trace->get();
  absl::StatusOr<std::unique_ptr<ps::ParameterServer>> server = ps::ParameterServer::Create(po);
  if (!server.ok()) return Fail(server.status());
  absl::StatusOr<ps::Placement> placement = ps::PlaceVariables(vars, 1);
  if (!placement.ok()) return Fail(placement.status());
  ps::WorkerClientOptions copt;
  copt.background = false;
  copt.keep_initial_values = false;  // as dtrain_worker's local mode
  copt.trace = trace->get();
  ps::WorkerClient client({server->get()}, placement->task_slices, 0, true, copt);
  ps::TrainConfig config;
  config.model_signature = models::ModelSignature(*o.resolved_model, model0->variables());
  config.num_workers = 1;
  absl::StatusOr<ps::OptimizerConfig> optimizer = OptimizerConfigOf(o);  // the optimizer's framework defaults
  if (!optimizer.ok()) return Fail(optimizer.status(), 2);
  config.optimizer = *optimizer;
  models::WriteInitialParameters(model0->variables(), 1, (*towers)->host_params());
  if (absl::Status s = client.Connect(config, (*towers)->host_params(), absl::Seconds(10)); !s.ok()) return Fail(s);
  TrainingStepsOptions sopt;
  sopt.local_ps = resident ? server->get() : nullptr;
  sopt.config = config;
  sopt.cuda_graphs = absl::GetFlag(FLAGS_cuda_graphs);
  sopt.trace = trace->get();
  absl::StatusOr<std::unique_ptr<TrainingSteps>> steps = MakeTrainingSteps(towers->get(), &client, sopt);
  if (!steps.ok()) return Fail(steps.status());
  TrainingSteps& runner = **steps;
  absl::StatusOr<ps::PullResult> at = runner.Start();
  if (!at.ok()) return Fail(at.status());

  const int n_towers = (*towers)->size();
  size_t next_batch = 0;
  std::vector<models::HostBatch> views(n_towers);
  auto run_steps = [&](int64_t count) -> absl::Status {
    for (int64_t i = 0; i < count; ++i) {
      for (int t = 0; t < n_towers; ++t) {
        const data::Batch& b = batches[next_batch++ % batches.size()];
        views[t] = models::HostBatch{b.batch, b.height, b.width, b.channels, b.images.data(), b.labels.data()};
      }
      TraceRecorder* const t = trace->get();
      const int64_t step = at->step, began = t != nullptr ? TraceRecorder::NowNs() : 0;
      if (t != nullptr) t->SetStep(step);
      if (absl::Status s = runner.Step(views, step); !s.ok()) return s;
      at = runner.NextStep();
      if (!at.ok()) return at.status();
      if (t != nullptr) t->Complete(absl::StrCat("step ", step), "step", began, TraceRecorder::NowNs(), step);
    }
    // The steps are complete (device-resident steps: read back from the devices) and their losses finite.
    return runner.TakeLosses().status();
  };
  auto timed_window = [&](int64_t count) -> absl::StatusOr<double> {
    const absl::Time t0 = absl::Now();
    if (absl::Status s = run_steps(count); !s.ok()) return s;
    return static_cast<double>(count) * o.batch_size * n_towers / absl::ToDoubleSeconds(absl::Now() - t0);
  };

  if (absl::Status s = run_steps(absl::GetFlag(FLAGS_warmup_steps)); !s.ok()) return Fail(s);
  if (const std::string report = (*towers)->PrecisionReport(); !report.empty()) {
    std::fprintf(stderr, "dtrain_bench: %s\n", report.c_str());
  }
  std::vector<double> rates;
  const int window_steps = std::max(1, absl::GetFlag(FLAGS_window_steps));
  const int windows = std::max(1, absl::GetFlag(FLAGS_windows));
  for (int w = 0; w < windows; ++w) {
    absl::StatusOr<double> rate = timed_window(window_steps);
    if (!rate.ok()) return Fail(rate.status());
    rates.push_back(*rate);
    std::fprintf(stderr, "  window %d: %.1f examples/sec\n", w, *rate);
  }
  // Steady state: run on to steps_total, then time one more window.
  int64_t steps_total = absl::GetFlag(FLAGS_steps_total);
  if (steps_total < 0) steps_total = dataset.train.count() / (static_cast<int64_t>(o.batch_size) * n_towers);
  const int64_t early = absl::GetFlag(FLAGS_warmup_steps) + static_cast<int64_t>(windows) * window_steps;
  double steady = -1;
  int64_t steady_from = 0;
  if (steps_total > 0) {
    steps_total = std::max(steps_total, early + window_steps);
    const int64_t middle = steps_total - early - window_steps;
    for (int64_t done = 0; done < middle; done += 200) {
      if (absl::Status s = run_steps(std::min<int64_t>(200, middle - done)); !s.ok()) return Fail(s);
      std::fprintf(stderr, "  step %lld of %lld\n", static_cast<long long>(early + done + std::min<int64_t>(200, middle - done)),
                   static_cast<long long>(steps_total));
    }
    steady_from = steps_total - window_steps;
    absl::StatusOr<double> rate = timed_window(window_steps);
    if (!rate.ok()) return Fail(rate.status());
    steady = *rate;
  }
  if (absl::StatusOr<ps::PullResult> settled = runner.Settle(); !settled.ok()) return Fail(settled.status());
  if (*trace != nullptr) {
    const std::string path = absl::StrCat(absl::GetFlag(FLAGS_trace_dir), "/bench.trace.json");
    if (absl::Status s = (*trace)->Write(path); !s.ok()) return Fail(s);
    std::fprintf(stderr, "dtrain_bench: timeline of steps %s (%lld events, %lld dropped) written to %s\n",
                 absl::GetFlag(FLAGS_trace_steps).c_str(), static_cast<long long>((*trace)->events()),
                 static_cast<long long>((*trace)->dropped()), path.c_str());
  }
  std::vector<double> sorted = rates;
  std::sort(sorted.begin(), sorted.end());
  std::vector<std::string> names;
  for (const auto& s : *specs) names.push_back(s.ToString());
  std::printf("dtrain_bench: model=%s batch=%d threads=%d towers=%s compute=%s examples/sec median=%.1f min=%.1f "
              "max=%.1f",
              o.model.c_str(), o.batch_size, o.threads, absl::StrJoin(names, ",").c_str(),
              kernels::ComputeDtypeName(*dtype), sorted[sorted.size() / 2], sorted.front(), sorted.back());
  if (steady >= 0) {
    std::printf(" steady=%.1f (steps %lld-%lld of %lld)", steady, static_cast<long long>(steady_from),
                static_cast<long long>(steps_total), static_cast<long long>(steps_total));
  }
  if (const auto* device_steps = dynamic_cast<const ResidentSteps*>(&runner); device_steps != nullptr) {
    std::printf(" state=device graphs=%s", device_steps->graph_captured() ? "on" : "off");
  } else {
    std::printf(" state=ps");
  }
  std::printf("\n");
  return 0;
}

}  // namespace
}  // namespace dtrain::worker

int main(int argc, char** argv) {
  dtrain::TuneMallocForLargeReusedBuffers();
  dtrain::CommandLineSpec spec;
  spec.program = "dtrain_bench";
  spec.summary = "training examples/sec of one process: forward, backward and the update (median of windows)";
  spec.epilogue = "Exit codes: 0 measured; 1 a failure; 2 bad flags.";
  dtrain::ParseCommandLineOrExit(argc, argv, spec);
  FLAGS_logtostderr = true;
  FLAGS_minloglevel = 1;
  google::InitGoogleLogging(argv[0]);
  return dtrain::worker::Main();
}
