// The ParameterServer with the optimizers of ps/core/optimizer.h across ps tasks: gradient clipping by the
// global norm (each worker's norm over every task's slices, the same factor on every task; sync averages the
// clipped gradients, async applies each clipped push), the refusal of pushes without their norm, and checkpoints
// of every optimizer's slots with the schedule resuming where it stopped (a resumed run equals an uninterrupted
// one bit for bit; a checkpoint with another slot layout is refused by name).
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "ps/checkpoint/checkpoint_test_util.h"
#include "ps/core/optimizer.h"
#include "ps/core/parameter_server.h"
#include "ps/testing/ps_test_util.h"

namespace dtrain::ps {
namespace {

using ::dtrain::ps::testing::MakeConfig;
using ::dtrain::ps::testing::PushSlices;
using ::dtrain::ps::testing::ScratchDir;
using ::dtrain::ps::testing::SimCluster;
using ::dtrain::ps::testing::SimClusterOptions;
using ::dtrain::ps::testing::SimWorker;
using ::dtrain::ps::testing::Slices;
using ::dtrain::ps::testing::TestGradient;
using Outcome = PushResponse::Outcome;

constexpr int kFloats = 350;

// Four variables placed on `num_ps` tasks, fc/w partitioned: every task holds part of the gradient.
SimClusterOptions Options(const std::string& mode, int num_ps, int num_workers, const OptimizerConfig& optimizer) {
  SimClusterOptions o;
  o.variables = {{"conv/w", 40}, {"conv/b", 4}, {"fc/w", 300}, {"fc/b", 6}};
  o.num_ps = num_ps;
  o.placement.min_slice_bytes = 400;
  o.config = MakeConfig(mode, num_workers, num_workers);
  o.config.optimizer = optimizer;
  o.initial.resize(kFloats);
  for (size_t i = 0; i < o.initial.size(); ++i) o.initial[i] = 0.01f * static_cast<float>(i % 17) - 0.05f;
  return o;
}

OptimizerConfig Sgd(float lr, float clip_norm) {
  OptimizerConfig c = *DefaultOptimizerConfig("sgd");
  c.learning_rate = lr;
  c.clip_norm = clip_norm;
  return c;
}

double Norm(const std::vector<float>& g) {
  double sum = 0;
  for (float x : g) sum += static_cast<double>(x) * x;
  return std::sqrt(sum);
}

// torch.nn.utils.clip_grad_norm_'s factor, in double.
double Factor(double clip, const std::vector<float>& g) { return std::min(1.0, clip / (Norm(g) + 1e-6)); }

// A gradient of `value` everywhere but a ramp, so that its norm is known and every task's part differs.
std::vector<float> Gradient(float value) {
  std::vector<float> g(kFloats);
  for (int i = 0; i < kFloats; ++i) g[i] = value * (1.0f + 0.01f * static_cast<float>(i % 10));
  return g;
}

class ClipTest : public ::testing::TestWithParam<int> {};  // the number of ps tasks

TEST_P(ClipTest, SyncAveragesEachWorkersClippedGradientOnEveryTask) {
  const int num_ps = GetParam();
  const float lr = 0.5f, clip = 1.0f;
  auto cluster = SimCluster::Start(Options("sync", num_ps, 2, Sgd(lr, clip)));
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  if (num_ps == 2) {
    ASSERT_GT((*cluster)->placement().task_slices[1].size(), 0u);
  }
  SimWorker w0(cluster->get(), 0), w1(cluster->get(), 1);
  // Worker 0's gradient is far over the bound (norm ~ 60), worker 1's under it (norm ~ 0.2): unchanged.
  const std::vector<float> g0 = Gradient(3.0f), g1 = Gradient(0.01f);
  ASSERT_LT(Norm(g1), clip);
  EXPECT_EQ(*w0.Push(0, g0), Outcome::kAccepted);
  EXPECT_EQ(*w1.Push(0, g1), Outcome::kAccepted);
  std::vector<float> params;
  ASSERT_EQ(*w0.Pull(1, 0, &params), 1);
  const double c0 = Factor(clip, g0);
  for (int i = 0; i < kFloats; ++i) {
    const double want = (*cluster)->initial()[i] - lr * 0.5 * (c0 * g0[i] + g1[i]);
    ASSERT_NEAR(params[i], want, 1e-6) << i;
  }
  // A factor computed per task (from its part of the norm only) would have moved the second task's slices more.
}

TEST_P(ClipTest, AsyncClipsEachPushByItsGlobalNorm) {
  const int num_ps = GetParam();
  const float lr = 0.25f, clip = 2.0f;
  auto cluster = SimCluster::Start(Options("async", num_ps, 2, Sgd(lr, clip)));
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  SimWorker w0(cluster->get(), 0), w1(cluster->get(), 1);
  const std::vector<float> g0 = Gradient(1.0f), g1 = Gradient(-0.5f);
  EXPECT_EQ(*w0.Push(0, g0), Outcome::kAccepted);
  EXPECT_EQ(*w1.Push(0, g1), Outcome::kAccepted);
  std::vector<float> params;
  ASSERT_EQ(*w0.Pull(0, 0, &params), 2);
  const double c0 = Factor(clip, g0), c1 = Factor(clip, g1);
  ASSERT_LT(c0, 1.0);
  ASSERT_LT(c1, 1.0);
  for (int i = 0; i < kFloats; ++i) {
    ASSERT_NEAR(params[i], (*cluster)->initial()[i] - lr * (c0 * g0[i] + c1 * g1[i]), 1e-6) << i;
  }
}

INSTANTIATE_TEST_SUITE_P(NumPs, ClipTest, ::testing::Values(1, 2));

TEST(ClipProtocolTest, APushWithoutItsNormIsRefusedAndANegativeNormIsInvalid) {
  for (const char* mode : {"sync", "async"}) {
    SCOPED_TRACE(mode);
    auto cluster = SimCluster::Start(Options(mode, 1, 1, Sgd(0.1f, 1.0f)));
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    ParameterServer& ps = (*cluster)->task(0);
    PushHeader h;
    h.worker_id = 0;
    h.step = 0;
    h.request_id = 77;
    h.commit = true;
    h.session = (*cluster)->Session(0, 0);
    const Slices slices = (*cluster)->SlicesFor(0, Gradient(1.0f));
    absl::StatusOr<PushResponse> r = PushSlices(ps, h, slices);
    ASSERT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
    EXPECT_NE(r.status().message().find("gradient norm"), std::string::npos) << r.status();
    EXPECT_NE(r.status().message().find("clip_norm"), std::string::npos) << r.status();

    absl::StatusOr<std::unique_ptr<SliceUpload>> upload = ps.StartPush(h);
    ASSERT_TRUE(upload.ok());
    EXPECT_EQ((*upload)->SetGradientNorm(-1.0).code(), absl::StatusCode::kInvalidArgument);

    // The same push with its norm is taken (a retry under the same request id, as a client would send it).
    upload = ps.StartPush(h);
    ASSERT_TRUE(upload.ok());
    for (const auto& [key, values] : slices) {
      ASSERT_TRUE((*upload)->Write(key, 0, static_cast<int64_t>(values.size()), WireDtype::kF32, values.data()).ok());
    }
    ASSERT_TRUE((*upload)->SetGradientNorm(Norm(Gradient(1.0f))).ok());
    absl::StatusOr<PushResponse> taken = (*upload)->Finish();
    ASSERT_TRUE(taken.ok()) << taken.status();
    EXPECT_EQ(taken->outcome, Outcome::kAccepted);
    upload->reset();  // no longer in flight
    EXPECT_TRUE(ps.accounting().Balanced()) << ps.accounting().DebugString();
  }
}

// ---- checkpoints --------------------------------------------------------------------------------------------

// Sync steps [from, to) with two workers in lockstep (deterministic: gradients depend on worker, step, params).
void RunSteps(SimCluster* cluster, int64_t from, int64_t to) {
  std::vector<SimWorker> workers;
  std::vector<std::vector<float>> params(2);
  for (int w = 0; w < 2; ++w) {
    workers.emplace_back(cluster, w);
    absl::StatusOr<int64_t> step = workers[w].Pull(0, 0, &params[w]);
    ASSERT_TRUE(step.ok()) << step.status();
    ASSERT_EQ(*step, from);
  }
  for (int64_t s = from; s < to; ++s) {
    for (int w = 0; w < 2; ++w) {
      // Large enough that clipping bites on some steps.
      std::vector<float> g = TestGradient(w, s, params[w]);
      for (float& x : g) x *= 8.0f;
      absl::StatusOr<Outcome> o = workers[w].Push(s, g);
      ASSERT_TRUE(o.ok()) << o.status();
    }
    for (int w = 0; w < 2; ++w) ASSERT_EQ(*workers[w].Pull(s + 1, s, &params[w]), s + 1);
  }
}

std::vector<float> Values(SimCluster* cluster) {
  std::vector<float> flat;
  for (int t = 0; t < cluster->num_ps(); ++t) {
    PullRequest request;
    request.session = cluster->Session(t, 0);
    absl::StatusOr<testing::Pulled> r = testing::PullSlices(cluster->task(t), request);
    EXPECT_TRUE(r.ok()) << r.status();
    if (r.ok()) cluster->Scatter(r->slices, &flat);
  }
  return flat;
}

struct ResumeCase {
  std::string label;
  OptimizerConfig optimizer;
};

OptimizerConfig Edited(const std::string& name, float lr, const std::function<void(OptimizerConfig&)>& edit) {
  OptimizerConfig c = *DefaultOptimizerConfig(name);
  c.learning_rate = lr;
  edit(c);
  return c;
}

class OptimizerResumeTest : public ::testing::TestWithParam<ResumeCase> {};

TEST_P(OptimizerResumeTest, ResumedRunEqualsUninterruptedRun) {
  constexpr int64_t kStop = 7, kEnd = 12;  // the checkpoint before the stop is step 5's
  const OptimizerConfig& optimizer = GetParam().optimizer;
  auto options = [&](const std::string& dir) {
    SimClusterOptions o = Options("sync", 2, 2, optimizer);
    o.config.moving_average_decay = 0.9f;
    o.checkpoint.dir = dir;
    o.checkpoint.save_steps = 5;
    return o;
  };
  ScratchDir reference_dir("optimizer_resume_ref");
  auto reference = SimCluster::Start(options(reference_dir.path()));
  ASSERT_TRUE(reference.ok()) << reference.status();
  RunSteps(reference->get(), 0, kEnd);
  const std::vector<float> want = Values(reference->get());
  ASSERT_NE(want, (*reference)->initial());

  ScratchDir dir("optimizer_resume");
  {
    auto first = SimCluster::Start(options(dir.path()));
    ASSERT_TRUE(first.ok()) << first.status();
    RunSteps(first->get(), 0, kStop);  // then gone without Done: the newest checkpoint is step 5's
  }
  auto resumed = SimCluster::Start(options(dir.path()));
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  ASSERT_EQ((*resumed)->restored_step(), 5);
  RunSteps(resumed->get(), 5, kEnd);
  EXPECT_EQ(Values(resumed->get()), want) << "slots and the schedule's step must come back exactly";
}

INSTANTIATE_TEST_SUITE_P(
    Optimizers, OptimizerResumeTest,
    ::testing::Values(ResumeCase{"rmsprop_centered_momentum_clipped_cosine",
                                 Edited("rmsprop", 0.01f,
                                        [](OptimizerConfig& c) {
                                          c.momentum = 0.9f;
                                          c.centered = true;
                                          c.epsilon = 1e-6f;
                                          c.clip_norm = 1.0f;
                                          c.lr_schedule = "cosine";
                                          c.decay_steps = 10;
                                          c.warmup_steps = 3;
                                        })},
                      ResumeCase{"adamw_warmup",
                                 Edited("adamw", 0.01f, [](OptimizerConfig& c) { c.warmup_steps = 4; })},
                      ResumeCase{"adagrad_l2",
                                 Edited("adagrad", 0.1f, [](OptimizerConfig& c) { c.weight_decay = 0.01f; })},
                      ResumeCase{"nesterov_step", Edited("momentum", 0.01f,
                                                         [](OptimizerConfig& c) {
                                                           c.nesterov = true;
                                                           c.decay_steps = 4;
                                                           c.decay_rate = 0.5f;
                                                           c.staircase = true;
                                                         })},
                      ResumeCase{"pytorch_rmsprop_centered",
                                 Edited("pytorch_rmsprop", 0.01f, [](OptimizerConfig& c) { c.centered = true; })}),
    [](const auto& info) { return info.param.label; });

TEST(OptimizerCheckpointTest, AnotherSlotLayoutIsRefusedByName) {
  OptimizerConfig with_momentum = *DefaultOptimizerConfig("rmsprop");
  with_momentum.momentum = 0.9f;  // slots: ms, momentum
  ScratchDir dir("optimizer_layout");
  {
    SimClusterOptions o = Options("sync", 1, 2, with_momentum);
    o.checkpoint.dir = dir.path();
    o.checkpoint.save_steps = 1;
    auto first = SimCluster::Start(o);
    ASSERT_TRUE(first.ok()) << first.status();
    RunSteps(first->get(), 0, 2);
  }
  OptimizerConfig without = *DefaultOptimizerConfig("rmsprop");  // momentum 0: ms only
  SimClusterOptions o = Options("sync", 1, 2, without);
  o.checkpoint.dir = dir.path();
  absl::StatusOr<std::unique_ptr<SimCluster>> again = SimCluster::Start(o);
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition) << again.status();
  EXPECT_NE(again.status().message().find("optimizer slots"), std::string::npos) << again.status();
}

}  // namespace
}  // namespace dtrain::ps
