// Local training with the training state on the devices (worker/train/resident_steps.h), run here on CPU towers
// whose models own their buffers (the GPU towers' code path on the CPU backend): it equals today's local mode
// (host-resident towers, the in-process ps applying every step) over many steps for SGD, momentum and Adam
// with learning-rate decay and moving averages, one and two towers, with dropout, and for the other optimizers
// (Nesterov, AdamW, Adagrad, both RMSProps) with weight decay, schedules and gradient clipping; checkpoints it writes
// resume to exactly the uninterrupted run (through either path), and divergence is reported like local mode
// does.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "common/testing/relative_difference.h"
#include "ps/checkpoint/checkpoint_dir.h"
#include "ps/checkpoint/checkpoint_set.h"
#include "worker/models/registry.h"
#include "worker/train/device_state.h"
#include "worker/data/synthetic_data.h"
#include "worker/train/trainer.h"

namespace dtrain::worker {
namespace {

// The tests name their models; Towers take the resolved value.
models::ModelRef ResolvedModel(const std::string& name) {
  absl::StatusOr<models::ModelRef> spec = models::ResolveModel(name);
  EXPECT_TRUE(spec.ok()) << spec.status();
  return spec.ok() ? *spec : nullptr;
}

struct Config {
  std::string name;
  std::string model;
  std::string optimizer;
  float learning_rate;
  int64_t decay_steps;
  bool staircase;
  float moving_average_decay;
  int towers;
  std::function<void(WorkerOptions&)> edit = nullptr;  // further optimizer options
};

WorkerOptions Options(const data::DatasetPair* data, const Config& c) {
  WorkerOptions o;
  o.model = c.model;
  o.dataset = data;
  o.shuffle = true;
  o.optimizer = c.optimizer;
  o.learning_rate = c.learning_rate;
  o.decay_steps = c.decay_steps;
  o.decay_rate = 0.7f;
  o.staircase = c.staircase;
  o.moving_average_decay = c.moving_average_decay;
  o.momentum = 0.8f;
  o.batch_size = c.model == "mlp" ? 20 : 8;
  o.towers = std::to_string(c.towers);
  o.threads = c.towers;
  o.quiet = true;
  o.evaluate = true;
  o.eval_every = 25;  // a mid-run evaluation on the devices' parameters
  o.log_every = 7;    // losses read back every 7 steps (and at the end)
  o.startup_wait_secs = 30;
  if (c.edit) c.edit(o);
  return o;
}

using ::dtrain::testing::RelativeDifference;

void PrintTo(const Config& c, std::ostream* os) { *os << c.name; }

class DeviceResidentTest : public ::testing::TestWithParam<Config> {};

TEST_P(DeviceResidentTest, EqualsLocalModeOverManySteps) {
  const Config& c = GetParam();
  const data::DatasetPair data = MakeSyntheticDataset(600, 200);
  WorkerOptions host = Options(&data, c);
  host.train_steps = c.model == "mlp" ? 60 : 30;
  WorkerOptions device = host;
  device.cpu_towers_in_place = false;  // models own their buffers: device-resident state in local mode
  absl::StatusOr<TrainingResult> want = RunTraining(host, {});
  absl::StatusOr<TrainingResult> got = RunTraining(device, {});
  ASSERT_TRUE(want.ok()) << want.status();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->global_step, host.train_steps);
  EXPECT_EQ(got->local_steps, host.train_steps);
  ASSERT_EQ(got->losses.size(), want->losses.size());
  for (size_t i = 0; i < want->losses.size(); ++i) {
    EXPECT_NEAR(got->losses[i], want->losses[i], 1e-6 * std::abs(want->losses[i])) << "step " << i;
  }
  EXPECT_EQ(got->last_loss, want->last_loss);
  ASSERT_EQ(got->parameters.size(), want->parameters.size());
  EXPECT_LE(RelativeDifference(got->parameters, want->parameters), 1e-6);
  EXPECT_EQ(got->test_accuracy, want->test_accuracy);
  EXPECT_EQ(got->test_accuracy_averaged, want->test_accuracy_averaged);
  if (c.moving_average_decay > 0) {
    EXPECT_GE(got->test_accuracy_averaged, 0.0);
  }
  if (host.clip_norm > 0) {  // not vacuous: the clipping changed the run
    WorkerOptions unclipped = host;
    unclipped.clip_norm = 0;
    absl::StatusOr<TrainingResult> free = RunTraining(unclipped, {});
    ASSERT_TRUE(free.ok()) << free.status();
    EXPECT_GT(RelativeDifference(free->parameters, got->parameters), 1e-4);
  }
  // Not vacuous: the parameters moved from their initial values.
  WorkerOptions one = device;
  one.train_steps = 1;
  absl::StatusOr<TrainingResult> first = RunTraining(one, {});
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_GT(RelativeDifference(first->parameters, got->parameters), 1e-4);
}

INSTANTIATE_TEST_SUITE_P(
    Optimizers, DeviceResidentTest,
    ::testing::Values(Config{"sgd_decay_averages", "mlp", "sgd", 0.1f, 20, false, 0.99f, 1},
                      Config{"momentum_staircase_averages", "mlp", "momentum", 0.05f, 15, true, 0.9f, 1},
                      Config{"adam_decay_averages", "mlp", "adam", 1e-3f, 25, false, 0.999f, 1},
                      Config{"adam_two_towers", "mlp", "adam", 1e-3f, 25, false, 0.99f, 2},
                      Config{"cnn_dropout_adam", "cnn", "adam", 1e-3f, 10, true, 0.99f, 1},
                      Config{"cnn_dropout_two_towers", "cnn", "momentum", 0.01f, 0, false, 0.0f, 2},
                      // Gradient clipping: the host path clips by the norm the worker sends the ps, the devices
                      // by the norm they gather themselves.
                      Config{"rmsprop_centered_clipped_cosine", "mlp", "rmsprop", 1e-3f, 50, false, 0.99f, 1,
                             [](WorkerOptions& o) {
                               o.centered = true;
                               o.momentum = 0.9f;
                               o.clip_norm = 0.5f;
                               o.lr_schedule = "cosine";
                               o.warmup_steps = 5;
                             }},
                      Config{"adamw_clipped_two_towers", "mlp", "adamw", 1e-3f, 0, false, 0.0f, 2,
                             [](WorkerOptions& o) {
                               o.weight_decay = 0.05f;
                               o.clip_norm = 0.3f;
                             }},
                      Config{"nesterov_l2_step", "mlp", "momentum", 0.05f, 10, true, 0.0f, 1,
                             [](WorkerOptions& o) {
                               o.nesterov = true;
                               o.weight_decay = 1e-3f;
                               o.lr_schedule = "step";
                             }},
                      Config{"adagrad_averages", "mlp", "adagrad", 0.05f, 0, false, 0.9f, 1},
                      Config{"pytorch_rmsprop_l2", "mlp", "pytorch_rmsprop", 1e-3f, 0, false, 0.0f, 1,
                             [](WorkerOptions& o) {
                               o.momentum = 0.0f;
                               o.weight_decay = 1e-3f;
                             }}),
    [](const auto& info) { return info.param.name; });

// One batch repeated (the data set is one batch, unshuffled), so a resumed run sees the batches an
// uninterrupted one would: only the state (values, slots, moving averages, step) carries over.
WorkerOptions ResumeOptions(const data::DatasetPair* data, const std::string& dir) {
  Config c{"", "mlp", "adam", 1e-3f, 9, false, 0.99f, 1};
  WorkerOptions o = Options(data, c);
  o.shuffle = false;
  o.eval_every = 0;
  o.checkpoint.dir = dir;
  o.checkpoint.save_steps = 10;
  o.cpu_towers_in_place = false;
  return o;
}

std::string ScratchDir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "/resident_steps_test_" + name;
  std::filesystem::remove_all(dir);
  return dir;
}

TEST(DeviceResidentCheckpointTest, ResumedRunEqualsUninterruptedRun) {
  const data::DatasetPair data = MakeSyntheticDataset(20, 200);
  WorkerOptions uninterrupted = ResumeOptions(&data, "");
  uninterrupted.train_steps = 40;
  absl::StatusOr<TrainingResult> want = RunTraining(uninterrupted, {});
  ASSERT_TRUE(want.ok()) << want.status();

  // Device-resident to step 25 (saves 10, 20 and the final 25), then resumed to 40 on the devices ...
  const std::string dir = ScratchDir("resume");
  WorkerOptions first = ResumeOptions(&data, dir);
  first.train_steps = 25;
  absl::StatusOr<TrainingResult> a = RunTraining(first, {});
  ASSERT_TRUE(a.ok()) << a.status();
  absl::StatusOr<std::vector<ps::CheckpointFile>> files = ps::ListCheckpointFiles(Env::Default(), dir);
  ASSERT_TRUE(files.ok());
  std::vector<int64_t> steps;
  for (const auto& f : *files) steps.push_back(f.step);
  EXPECT_EQ(steps, (std::vector<int64_t>{10, 20, 25}));
  WorkerOptions second = ResumeOptions(&data, dir);
  second.train_steps = 40;
  absl::StatusOr<TrainingResult> b = RunTraining(second, {});
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->first_step, 25);
  EXPECT_EQ(b->local_steps, 15);
  EXPECT_LE(RelativeDifference(b->parameters, want->parameters), 1e-6);
  EXPECT_EQ(b->test_accuracy_averaged, want->test_accuracy_averaged);
  // ... and the checkpoint set reads back as dtrain_eval reads it.
  absl::StatusOr<std::vector<ps::CheckpointData>> newest = ps::ReadCheckpointSet(Env::Default(), dir);
  ASSERT_TRUE(newest.ok()) << newest.status();
  EXPECT_EQ((*newest)[0].global_step, 40);
  absl::StatusOr<std::vector<float>> flat =
      ps::AssembleFlatBuffer(*newest, static_cast<int64_t>(want->parameters.size()), false);
  ASSERT_TRUE(flat.ok()) << flat.status();
  EXPECT_EQ(*flat, b->parameters);

  // A checkpoint written on the devices resumes on the host path too (one format), and the other way round.
  const std::string dir2 = ScratchDir("cross");
  WorkerOptions device_first = ResumeOptions(&data, dir2);
  device_first.train_steps = 20;
  ASSERT_TRUE(RunTraining(device_first, {}).ok());
  WorkerOptions host_second = ResumeOptions(&data, dir2);
  host_second.cpu_towers_in_place = true;
  host_second.train_steps = 30;
  absl::StatusOr<TrainingResult> c = RunTraining(host_second, {});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->first_step, 20);
  WorkerOptions device_third = ResumeOptions(&data, dir2);
  device_third.train_steps = 40;
  absl::StatusOr<TrainingResult> d = RunTraining(device_third, {});
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->first_step, 30);
  EXPECT_LE(RelativeDifference(d->parameters, want->parameters), 1e-6);
}

// A diverging run fails with the same error on both paths (the device path finds it when it reads the losses
// back, naming the same step).
TEST(DeviceResidentTest, DivergenceIsReportedLikeLocalMode) {
  const data::DatasetPair data = MakeSyntheticDataset(200, 100);
  Config c{"", "mlp", "sgd", 1e9f, 0, false, 0.0f, 1};
  WorkerOptions host = Options(&data, c);
  host.train_steps = 30;
  host.evaluate = false;
  host.eval_every = 0;
  WorkerOptions device = host;
  device.cpu_towers_in_place = false;
  absl::StatusOr<TrainingResult> want = RunTraining(host, {});
  absl::StatusOr<TrainingResult> got = RunTraining(device, {});
  ASSERT_EQ(want.status().code(), absl::StatusCode::kInternal) << want.status();
  ASSERT_EQ(got.status().code(), absl::StatusCode::kInternal) << got.status();
  EXPECT_TRUE(absl::StrContains(got.status().message(), "training diverged")) << got.status();
  EXPECT_EQ(got.status().message(), want.status().message());
}

// The state holder alone: a ps state loads onto every tower and exports back as it was; the moving averages
// swap in and out for evaluation; a state that does not fit is refused.
TEST(DeviceStateTest, LoadExportAndMovingAverages) {
  models::ModelOptions mo;
  mo.batch_size = 4;
  TowersOptions topt;
  topt.cpu_in_place = false;
  topt.replicated = true;
  auto towers = Towers::Create(*ResolvedModel("mlp"), mo, {kernels::DeviceSpec::Cpu(1), kernels::DeviceSpec::Cpu(1)}, topt);
  ASSERT_TRUE(towers.ok()) << towers.status();
  const int64_t n = (*towers)->num_parameters();
  kernels::OptimizerParams p;
  p.kind = kernels::OptimizerParams::Kind::kMomentum;
  p.moving_average_decay = 0.9f;
  auto state = DeviceState::Create(towers->get(), p);
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_TRUE((*state)->has_moving_averages());

  ps::CheckpointData ckpt;
  ckpt.task_step = 17;
  ckpt.num_slots = 1;
  ckpt.has_moving_averages = true;
  const int64_t cut = 1000;
  for (int k = 0; k < 2; ++k) {
    ps::SliceState s;
    s.spec = {static_cast<uint32_t>(k), k == 0 ? "a" : "b", k == 0 ? 0 : cut, k == 0 ? cut : n - cut};
    for (int64_t i = 0; i < s.spec.length; ++i) s.values.push_back(0.001f * static_cast<float>((i + k) % 97));
    s.slots.push_back(std::vector<float>(s.spec.length, 0.5f + k));
    s.moving_average.assign(s.spec.length, -1.0f - k);
    ckpt.slices.push_back(s);
  }
  ASSERT_TRUE((*state)->Load(ckpt).ok());
  for (int t = 0; t < 2; ++t) {
    auto step = (*towers)->step_counter(t)->Read();
    ASSERT_TRUE(step.ok());
    EXPECT_EQ(*step, 17);
  }
  auto exported = (*state)->Export();
  ASSERT_TRUE(exported.ok()) << exported.status();
  ASSERT_EQ(exported->size(), 2u);
  for (int k = 0; k < 2; ++k) {
    EXPECT_EQ((*exported)[k].spec, ckpt.slices[k].spec);
    EXPECT_EQ((*exported)[k].values, ckpt.slices[k].values);
    EXPECT_EQ((*exported)[k].slots, ckpt.slices[k].slots);
    EXPECT_EQ((*exported)[k].moving_average, ckpt.slices[k].moving_average);
  }
  // Tower 1 holds the same values.
  std::vector<float> tower1(n);
  ASSERT_TRUE(
      (*towers)->device(1)->CopyToHost((*towers)->tower(1)->device_parameters(), tower1.data(), n).ok());
  EXPECT_EQ(std::vector<float>(tower1.begin(), tower1.begin() + cut), ckpt.slices[0].values);

  ASSERT_TRUE((*state)->UseMovingAverages(true).ok());
  std::vector<float> params0(n);
  ASSERT_TRUE(
      (*towers)->device(0)->CopyToHost((*towers)->tower(0)->device_parameters(), params0.data(), n).ok());
  EXPECT_EQ(params0[0], -1.0f);
  EXPECT_EQ(params0[n - 1], -2.0f);
  auto values = (*state)->ExportValues();
  ASSERT_TRUE(values.ok());
  EXPECT_EQ(std::vector<float>(values->begin(), values->begin() + cut), ckpt.slices[0].values)
      << "kept aside";
  EXPECT_EQ((*state)->EnqueueUpdates().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE((*state)->UseMovingAverages(false).ok());
  ASSERT_TRUE(
      (*towers)->device(0)->CopyToHost((*towers)->tower(0)->device_parameters(), params0.data(), n).ok());
  EXPECT_EQ(std::vector<float>(params0.begin(), params0.begin() + cut), ckpt.slices[0].values);

  ps::CheckpointData gap = ckpt;
  gap.slices[1].spec.flat_offset += 1;
  EXPECT_EQ((*state)->Load(gap).code(), absl::StatusCode::kFailedPrecondition);
  ps::CheckpointData slots = ckpt;
  slots.num_slots = 2;
  EXPECT_EQ((*state)->Load(slots).code(), absl::StatusCode::kFailedPrecondition);
  auto host = Towers::Create(*ResolvedModel("mlp"), mo, {kernels::DeviceSpec::Cpu(1)});
  ASSERT_TRUE(host.ok());
  EXPECT_EQ(DeviceState::Create(host->get(), p).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dtrain::worker
