// The learning rate a run takes and shows (issue 42, a new user's frictions): an adaptive optimizer without
// --learning_rate takes its framework's default rather than the model's SGD rate, and the ps tasks get that rate;
// the warmup starts at 1/3 of the rate by default (PyTorch LinearLR); the progress lines and the metrics file
// carry the scheduled rate.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/testing/relative_difference.h"
#include "ps/core/optimizer.h"
#include "worker/data/synthetic_data.h"
#include "worker/train/trainer.h"
#include "worker/train/trainer_test_util.h"

namespace dtrain::worker {
namespace {

WorkerOptions Resolved(const std::string& model, const std::string& optimizer, float learning_rate = 0) {
  WorkerOptions o;
  o.model = model;
  o.optimizer = optimizer;
  o.learning_rate = learning_rate;
  const absl::Status s = ApplyModelDefaults(&o);
  EXPECT_TRUE(s.ok()) << s;
  return o;
}

// A local mlp run over `data` in order, without the evaluation at the end and quiet, with rmsprop at its
// default rate (0.001: no --learning_rate): `batch_size` examples a step for `train_steps` steps.
WorkerOptions RmspropOptions(const data::DatasetPair* data, int batch_size, int train_steps) {
  WorkerOptions o;
  o.model = "mlp";
  o.dataset = data;
  o.shuffle = false;
  o.evaluate = false;
  o.quiet = true;
  o.optimizer = "rmsprop";  // without a rate: 0.001
  o.batch_size = batch_size;
  o.train_steps = train_steps;
  return o;
}

TEST(LearningRateTest, AnAdaptiveOptimizerOtherThanTheModelsTakesItsFrameworksRate) {
  struct Case {
    std::string optimizer;
    float rate;
    std::string source;
  };
  // Keras and PyTorch's documented defaults (mlp's own rate is 0.1, for its sgd).
  for (const Case& c : std::vector<Case>{{"rmsprop", 0.001f, "Keras' RMSprop"},
                                         {"adam", 0.001f, "tf.train.AdamOptimizer"},
                                         {"pytorch_adam", 0.001f, "torch.optim.Adam"},
                                         {"adamw", 0.001f, "torch.optim.AdamW"},
                                         {"adagrad", 0.001f, "Keras' Adagrad"},
                                         {"pytorch_rmsprop", 0.01f, "torch.optim.RMSprop"},
                                         {"pytorch_adagrad", 0.01f, "torch.optim.Adagrad"}}) {
    const WorkerOptions o = Resolved("mlp", c.optimizer);
    EXPECT_EQ(o.learning_rate, c.rate) << c.optimizer;
    EXPECT_TRUE(absl::StrContains(o.learning_rate_note, absl::StrCat("--optimizer=", c.optimizer, "'s default (as ",
                                                                      c.source, "), not the model mlp's 0.1")))
        << o.learning_rate_note;
    EXPECT_TRUE(absl::StrContains(o.learning_rate_note, "--learning_rate sets another")) << o.learning_rate_note;
    // The config the ps tasks get carries it.
    absl::StatusOr<ps::OptimizerConfig> config = OptimizerConfigOf(o);
    ASSERT_TRUE(config.ok()) << config.status();
    EXPECT_EQ(config->learning_rate, c.rate) << c.optimizer;
  }
}

TEST(LearningRateTest, AGivenRateWinsAndTheModelsOwnOptimizerKeepsTheModelsRate) {
  WorkerOptions o = Resolved("mlp", "rmsprop", 0.05f);
  EXPECT_EQ(o.learning_rate, 0.05f);
  EXPECT_EQ(o.learning_rate_note, "learning rate 0.05 (--learning_rate)");
  o = Resolved("mlp", "");  // sgd, the model's
  EXPECT_EQ(o.optimizer, "sgd");
  EXPECT_EQ(o.learning_rate, 0.1f);
  EXPECT_EQ(o.learning_rate_note, "learning rate 0.1: the model mlp's default (for sgd); --learning_rate sets another");
  EXPECT_EQ(Resolved("mlp", "momentum").learning_rate, 0.1f);  // no framework default for plain descent
  EXPECT_EQ(Resolved("cnn", "adam").learning_rate, 1e-4f);     // the cnn's own adam rate (TensorFlow's tutorial)
  EXPECT_EQ(Resolved("cnn", "rmsprop").learning_rate, 0.001f);
  // Resolving again (RunTraining after dtrain_worker's main) keeps the rate and its reason.
  WorkerOptions again = Resolved("mlp", "rmsprop");
  ASSERT_TRUE(ApplyModelDefaults(&again).ok());
  EXPECT_EQ(again.learning_rate, 0.001f);
  EXPECT_TRUE(absl::StrContains(again.learning_rate_note, "rmsprop's default")) << again.learning_rate_note;
}

TEST(LearningRateTest, TheWarmupStartsAtAThirdOfTheRateByDefault) {
  WorkerOptions o = Resolved("mlp", "sgd", 0.3f);
  o.warmup_steps = 3;
  absl::StatusOr<ps::OptimizerConfig> c = OptimizerConfigOf(o);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FLOAT_EQ(c->warmup_start_factor, 1.0f / 3);
  absl::StatusOr<ps::Optimizer> opt = ps::Optimizer::Create(*c);
  ASSERT_TRUE(opt.ok()) << opt.status();
  // torch.optim.lr_scheduler.LinearLR(start_factor=1/3, total_iters=3): 0.1, 0.1667, 0.2333, then 0.3.
  EXPECT_NEAR(opt->LearningRate(0), 0.1, 1e-6);
  EXPECT_NEAR(opt->LearningRate(1), 0.3 * (1.0 / 3 + (2.0 / 3) / 3), 1e-6);
  EXPECT_NEAR(opt->LearningRate(3), 0.3, 1e-6);
  // Without warmup steps the factor is none of the config's (workers given different ones agree).
  o.warmup_steps = 0;
  c = OptimizerConfigOf(o);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->warmup_start_factor, 0.0f);
}

// A local run with a warmup and a cosine schedule: every local step's rate is the schedule's at the step it
// computed, the progress lines show the rate at their step, and the metrics file has it as a third column.
TEST(LearningRateTest, ProgressLinesAndTheMetricsFileCarryTheScheduledRate) {
  const data::DatasetPair data = MakeSyntheticDataset(400, 100);
  WorkerOptions o = RmspropOptions(&data, 20, 12);
  o.quiet = false;  // the progress lines are read below
  o.warmup_steps = 4;
  o.lr_schedule = "cosine";
  o.log_every = 4;
  o.metrics_file = ::testing::TempDir() + "/trainer_learning_rate_metrics.csv";
  std::filesystem::remove(o.metrics_file);
  ::testing::internal::CaptureStdout();
  absl::StatusOr<TrainingResult> r = RunTraining(o, {});
  const std::string out = ::testing::internal::GetCapturedStdout();
  ASSERT_TRUE(r.ok()) << r.status();

  WorkerOptions resolved = o;
  ASSERT_TRUE(ApplyModelDefaults(&resolved).ok());
  absl::StatusOr<ps::OptimizerConfig> config = OptimizerConfigOf(resolved);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->learning_rate, 0.001f);
  absl::StatusOr<ps::Optimizer> schedule = ps::Optimizer::Create(*config);
  ASSERT_TRUE(schedule.ok()) << schedule.status();

  ASSERT_EQ(r->learning_rates.size(), 12u);
  ASSERT_EQ(r->losses.size(), 12u);
  for (int i = 0; i < 12; ++i) EXPECT_EQ(r->learning_rates[i], schedule->LearningRate(i)) << "local step " << i + 1;
  EXPECT_NEAR(r->learning_rates[0], 0.001 / 3, 1e-9);  // the warmup's start
  EXPECT_NEAR(r->learning_rates[4], 0.001, 1e-9);      // the cosine's start
  EXPECT_LT(r->learning_rates[11], r->learning_rates[5]);

  for (int step : {4, 8, 12}) {
    const std::string rate = absl::StrFormat("learning rate %.4g)\n", schedule->LearningRate(step));
    const std::string head = absl::StrCat("step ", step, ", loss = ");
    const size_t at = out.find(head);
    ASSERT_NE(at, std::string::npos) << out;
    const size_t end = out.find('\n', at);
    EXPECT_EQ(out.substr(end + 1 - rate.size(), rate.size()), rate) << out.substr(at, end - at);
  }

  std::ifstream f(o.metrics_file);
  std::string line;
  ASSERT_TRUE(std::getline(f, line));
  EXPECT_EQ(line, "local_step,loss,learning_rate");
  for (int i = 0; i < 12; ++i) {
    ASSERT_TRUE(std::getline(f, line)) << "row " << i + 1;
    const std::vector<std::string> fields = absl::StrSplit(line, ',');
    ASSERT_EQ(fields.size(), 3u) << line;
    EXPECT_EQ(fields[0], absl::StrCat(i + 1));
    float loss = 0, rate = 0;
    ASSERT_TRUE(absl::SimpleAtof(fields[1], &loss) && absl::SimpleAtof(fields[2], &rate)) << line;
    EXPECT_EQ(loss, r->losses[i]);  // the digits give the floats back
    EXPECT_EQ(rate, r->learning_rates[i]);
  }
  EXPECT_FALSE(std::getline(f, line));
}

// A run that may never end (dtrain_worker: keep_step_losses false) holds one progress line's window of losses,
// not every step's, and its metrics file is the same, line for line, as a run that keeps them all: written as the
// run goes (PATH.tmp) and renamed at the end.
TEST(LearningRateTest, TheMetricsFileStreamsWhatARunDoesNotKeep) {
  const data::DatasetPair data = MakeSyntheticDataset(400, 100);
  WorkerOptions o = RmspropOptions(&data, 20, 45);
  o.warmup_steps = 4;
  o.lr_schedule = "cosine";
  o.log_every = 10;  // 45 steps: four whole windows and a last of 5
  const std::string dir = ::testing::TempDir();
  auto read = [](const std::string& path) {
    std::ifstream f(path);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  };

  o.metrics_file = dir + "/trainer_metrics_kept.csv";
  std::filesystem::remove(o.metrics_file);
  absl::StatusOr<TrainingResult> kept = RunTraining(o, {});
  ASSERT_TRUE(kept.ok()) << kept.status();
  ASSERT_EQ(kept->losses.size(), 45u);

  o.metrics_file = dir + "/trainer_metrics_streamed.csv";
  o.keep_step_losses = false;
  std::filesystem::remove(o.metrics_file);
  absl::StatusOr<TrainingResult> streamed = RunTraining(o, {});
  ASSERT_TRUE(streamed.ok()) << streamed.status();
  EXPECT_TRUE(streamed->losses.empty());
  EXPECT_TRUE(streamed->learning_rates.empty());
  EXPECT_LE(streamed->losses.capacity(), 2u * o.log_every) << "more than a window held";
  EXPECT_EQ(streamed->last_loss, kept->losses.back());
  EXPECT_FALSE(std::filesystem::exists(o.metrics_file + ".tmp"));

  const std::string all = read(dir + "/trainer_metrics_kept.csv");
  EXPECT_EQ(std::count(all.begin(), all.end(), '\n'), 46) << all;
  EXPECT_EQ(read(o.metrics_file), all);
}

// In a cluster the rate travels to the ps tasks resolved: a worker without --learning_rate and one given the
// optimizer's default register the same config (the ps refuses a mismatch), and they train as local mode with
// twice the batch and that rate given.
TEST(LearningRateTest, ThePsTasksGetTheResolvedRate) {
  const data::DatasetPair data = MakeSyntheticDataset(400, 100);
  WorkerOptions base = RmspropOptions(&data, 10, 8);
  base.startup_wait_secs = 30;

  WorkerOptions local = base;
  local.batch_size = 20;
  local.learning_rate = 0.001f;
  absl::StatusOr<TrainingResult> expected = RunTraining(local, {});
  ASSERT_TRUE(expected.ok()) << expected.status();

  PsTasks ps_tasks(1, 2);
  std::vector<absl::StatusOr<TrainingResult>> results(2, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int w = 0; w < 2; ++w) {
    threads.emplace_back([&, w] {
      WorkerOptions o = base;
      o.worker_id = w;
      o.num_workers = 2;
      o.num_ps = 1;
      if (w == 1) o.learning_rate = 0.001f;  // given; worker 0 (the chief, which registers the config) is not
      results[w] = RunTraining(o, ps_tasks.tasks);
    });
  }
  for (std::thread& t : threads) t.join();
  for (int w = 0; w < 2; ++w) ASSERT_TRUE(results[w].ok()) << "worker " << w << ": " << results[w].status();
  EXPECT_EQ(results[0]->global_step, 8);
  EXPECT_LE(::dtrain::testing::RelativeDifference(results[0]->parameters, expected->parameters), 1e-5);
}

}  // namespace
}  // namespace dtrain::worker
