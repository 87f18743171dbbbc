// The CUDA device optimizer against the CPU one (the oracle, itself equal to the parameter server's
// optimizer: see ps/core/device_optimizer_test.cc): 200 steps of each optimizer kind (Nesterov, AdamW, Adagrad,
// both RMSProps included) with learning-rate schedules, weight decay, gradient clipping (the norm gathered on the
// device, inside the graph too) and moving averages, eagerly and replayed from a captured CUDA graph, agree to
// 1e-6 relative. Every test skips without a usable CUDA device.
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/device.h"
#include "kernels/optimizer_ops.h"

namespace dtrain::kernels::cuda {
namespace {

constexpr int kSteps = 200;
// The arithmetic is the same fp32 sequence on both (no FMA); only the per-step scalars (double pow, cos) and
// the clipping norm (summed in another order) may differ in their last bit, which moves the variables by far
// less than this.
constexpr float kOptRel = 1e-6f, kOptAbs = 1e-7f;

struct Case {
  std::string name;
  OptimizerParams params;
};

OptimizerParams Params(OptimizerParams::Kind kind, float lr, int64_t decay_steps, float decay_rate,
                       bool staircase, float ema) {
  OptimizerParams p;
  p.kind = kind;
  p.learning_rate = lr;
  p.decay_steps = decay_steps;
  p.decay_rate = decay_rate;
  p.staircase = staircase;
  p.moving_average_decay = ema;
  return p;
}

OptimizerParams PaperAdam(OptimizerParams p) {
  p.adam_paper_epsilon = true;
  return p;
}

template <typename F>
OptimizerParams With(OptimizerParams p, F f) {
  f(p);
  return p;
}

std::vector<Case> Cases() {
  using K = OptimizerParams::Kind;
  return {
      {"sgd_smooth_decay", Params(K::kSgd, 0.1f, 50, 0.5f, false, 0.99f)},
      {"momentum_staircase", Params(K::kMomentum, 0.05f, 30, 0.7f, true, 0.9f)},
      {"adam_smooth_decay", Params(K::kAdam, 1e-3f, 40, 0.9f, false, 0.999f)},
      {"adam_no_decay_no_ema", Params(K::kAdam, 1e-4f, 0, 1.0f, false, 0.0f)},
      {"pytorch_adam_smooth_decay", PaperAdam(Params(K::kAdam, 1e-3f, 40, 0.9f, false, 0.999f))},
      {"nesterov_l2_cosine_warmup", With(Params(K::kMomentum, 0.05f, 150, 1.0f, false, 0.0f),
                                         [](OptimizerParams& p) {
                                           p.nesterov = true;
                                           p.weight_decay = 1e-3f;
                                           p.schedule = LrSchedule::kCosine;
                                           p.min_learning_rate = 1e-3f;
                                           p.warmup_steps = 20;
                                         })},
      {"adamw", With(PaperAdam(Params(K::kAdam, 1e-3f, 0, 1.0f, false, 0.99f)),
                     [](OptimizerParams& p) {
                       p.decoupled_weight_decay = true;
                       p.weight_decay = 0.01f;
                     })},
      {"adagrad_l2", With(Params(K::kAdagrad, 0.05f, 0, 1.0f, false, 0.0f),
                          [](OptimizerParams& p) {
                            p.initial_accumulator = 0.1f;
                            p.epsilon = 0.0f;
                            p.weight_decay = 1e-3f;
                          })},
      {"rmsprop_centered_momentum", With(Params(K::kRmsProp, 1e-3f, 0, 1.0f, false, 0.9f),
                                         [](OptimizerParams& p) {
                                           p.momentum = 0.9f;
                                           p.centered = true;
                                           p.epsilon = 1e-10f;
                                         })},
      {"pytorch_rmsprop_momentum", With(Params(K::kRmsProp, 1e-3f, 0, 1.0f, false, 0.0f),
                                        [](OptimizerParams& p) {
                                          p.torch_rmsprop = true;
                                          p.rho = 0.99f;
                                          p.momentum = 0.5f;
                                        })},
      {"momentum_clipped", With(Params(K::kMomentum, 0.05f, 0, 1.0f, false, 0.0f),
                                [](OptimizerParams& p) { p.clip_norm = 10.0f; })},
  };
}

class CudaOptimizerTest : public CudaVsCpuTest, public ::testing::WithParamInterface<Case> {
 protected:
  // The state of one run on both devices.
  struct State {
    Both var, slot0, slot1, slot2, shadow, grad;
  };
  State MakeState(int64_t n, const OptimizerParams& p) {
    State s;
    const std::vector<float> init = Random(n, 101);
    s.var = Upload(init);
    // Slots start where the parameter server starts them (adagrad's accumulator, TensorFlow's rmsprop's ms).
    s.slot0 = Upload(std::vector<float>(n, p.SlotInitialValue(0)));
    s.slot1 = Zeros(n);
    s.slot2 = Zeros(n);
    s.shadow = Upload(init);  // shadows start at the variable's value, as the parameter server's do
    s.grad = Zeros(n);
    return s;
  }
  static OptimizerBuffers Buffers(const State& s, bool gpu, const OptimizerParams& p) {
    OptimizerBuffers b;
    b.grad = gpu ? s.grad.gpu : s.grad.cpu;
    b.var = gpu ? s.var.gpu : s.var.cpu;
    b.slot0 = p.num_slots() >= 1 ? (gpu ? s.slot0.gpu : s.slot0.cpu) : nullptr;
    b.slot1 = p.num_slots() >= 2 ? (gpu ? s.slot1.gpu : s.slot1.cpu) : nullptr;
    b.slot2 = p.num_slots() >= 3 ? (gpu ? s.slot2.gpu : s.slot2.cpu) : nullptr;
    b.shadow = p.moving_average_decay > 0 ? (gpu ? s.shadow.gpu : s.shadow.cpu) : nullptr;
    b.n = s.var.n;
    return b;
  }
  void ExpectSame(const State& s, const OptimizerParams& p) {
    EXPECT_TRUE(Same(s.var, kOptRel, kOptAbs)) << "var";
    if (p.num_slots() >= 1) {
      EXPECT_TRUE(Same(s.slot0, kOptRel, 1e-12f)) << "slot0";
    }
    if (p.num_slots() >= 2) {
      EXPECT_TRUE(Same(s.slot1, kOptRel, 1e-12f)) << "slot1";
    }
    if (p.num_slots() >= 3) {
      EXPECT_TRUE(Same(s.slot2, kOptRel, 1e-12f)) << "slot2";
    }
    if (p.moving_average_decay > 0) {
      EXPECT_TRUE(Same(s.shadow, kOptRel, kOptAbs)) << "shadow";
    }
  }
};

TEST_P(CudaOptimizerTest, TwoHundredEagerStepsMatchCpu) {
  const OptimizerParams& p = GetParam().params;
  const int64_t n = 100003;  // several blocks, not a multiple of the block size
  State s = MakeState(n, p);
  auto cpu_step = cpu_->MakeCounter(0);
  auto gpu_step = gpu_->MakeCounter(0);
  ASSERT_TRUE(cpu_step.ok() && gpu_step.ok());
  auto cpu_opt = cpu_->MakeOptimizer(p, cpu_step->get());
  auto gpu_opt = gpu_->MakeOptimizer(p, gpu_step->get());
  ASSERT_TRUE(cpu_opt.ok()) << cpu_opt.status();
  ASSERT_TRUE(gpu_opt.ok()) << gpu_opt.status();
  for (int step = 0; step < kSteps; ++step) {
    const std::vector<float> g = Random(n, 1000 + step, -0.5f, 0.5f);
    ASSERT_TRUE(cpu_->CopyToDevice(g.data(), s.grad.cpu, n).ok());
    ASSERT_TRUE(gpu_->CopyToDevice(g.data(), s.grad.gpu, n).ok());
    if (p.clip_norm > 0) {  // the norm gathered in two parts, as DeviceState adds runs of variables
      for (DeviceOptimizer* opt : {cpu_opt->get(), gpu_opt->get()}) {
        const float* grad = opt == cpu_opt->get() ? s.grad.cpu : s.grad.gpu;
        ASSERT_TRUE(opt->ClearNorm().ok());
        ASSERT_TRUE(opt->AddToNorm(grad, n / 2, 0.5f).ok());
        ASSERT_TRUE(opt->AddToNorm(grad + n / 2, n - n / 2, 0.5f).ok());
      }
    }
    ASSERT_TRUE((*cpu_opt)->Apply(Buffers(s, false, p), 0.5f).ok());
    ASSERT_TRUE((*gpu_opt)->Apply(Buffers(s, true, p), 0.5f).ok());
    ASSERT_TRUE((*cpu_step)->Increment().ok());
    ASSERT_TRUE((*gpu_step)->Increment().ok());
    if (step == 0 || step == kSteps / 2) ExpectSame(s, p);
  }
  ExpectSame(s, p);
  auto final_step = (*gpu_step)->Read();
  ASSERT_TRUE(final_step.ok()) << final_step.status();
  EXPECT_EQ(*final_step, kSteps);
}

// One Apply + Increment captured once and replayed 200 times: the replays read the advancing step from device
// memory (with a baked-in step the decayed learning rate and Adam's correction would be wrong).
TEST_P(CudaOptimizerTest, GraphReplaysMatchEagerCpu) {
  const OptimizerParams& p = GetParam().params;
  const int64_t n = 4099;
  State s = MakeState(n, p);
  auto cpu_step = cpu_->MakeCounter(0);
  auto gpu_step = gpu_->MakeCounter(0);
  ASSERT_TRUE(cpu_step.ok() && gpu_step.ok());
  auto cpu_opt = cpu_->MakeOptimizer(p, cpu_step->get());
  auto gpu_opt = gpu_->MakeOptimizer(p, gpu_step->get());
  ASSERT_TRUE(cpu_opt.ok() && gpu_opt.ok());
  auto pinned = gpu_->AllocHostPinned(n);
  ASSERT_TRUE(pinned.ok()) << pinned.status();

  ASSERT_TRUE(gpu_->BeginCapture().ok());
  ASSERT_TRUE(gpu_->CopyToDeviceAsync(*pinned, s.grad.gpu, n, Queue::kCompute).ok());
  if (p.clip_norm > 0) {  // the norm is gathered inside the graph too
    ASSERT_TRUE((*gpu_opt)->ClearNorm().ok());
    ASSERT_TRUE((*gpu_opt)->AddToNorm(s.grad.gpu, n, 0.5f).ok());
  }
  ASSERT_TRUE((*gpu_opt)->Apply(Buffers(s, true, p), 0.5f).ok());
  ASSERT_TRUE((*gpu_step)->Increment().ok());
  auto graph = gpu_->EndCapture();
  ASSERT_TRUE(graph.ok()) << graph.status();

  for (int step = 0; step < kSteps; ++step) {
    const std::vector<float> g = Random(n, 2000 + step, -0.5f, 0.5f);
    std::memcpy(*pinned, g.data(),
                n * sizeof(float));  // the previous replay has finished (Synchronize below)
    ASSERT_TRUE((*graph)->Launch().ok());
    ASSERT_TRUE(cpu_->CopyToDevice(g.data(), s.grad.cpu, n).ok());
    if (p.clip_norm > 0) {
      ASSERT_TRUE((*cpu_opt)->ClearNorm().ok());
      ASSERT_TRUE((*cpu_opt)->AddToNorm(s.grad.cpu, n, 0.5f).ok());
    }
    ASSERT_TRUE((*cpu_opt)->Apply(Buffers(s, false, p), 0.5f).ok());
    ASSERT_TRUE((*cpu_step)->Increment().ok());
    ASSERT_TRUE(gpu_->Synchronize().ok());
  }
  ExpectSame(s, p);
  auto final_step = (*gpu_step)->Read();
  ASSERT_TRUE(final_step.ok());
  EXPECT_EQ(*final_step, kSteps);
  graph->reset();
  gpu_->FreeHostPinned(*pinned);
}

INSTANTIATE_TEST_SUITE_P(Optimizers, CudaOptimizerTest, ::testing::ValuesIn(Cases()),
                         [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

// Resuming: Set puts the step anywhere (e.g. a checkpoint's global step); the update then uses that step.
TEST_F(CudaVsCpuTest, OptimizerStepSetByHostMatchesCpu) {
  OptimizerParams p = Params(OptimizerParams::Kind::kAdam, 1e-3f, 100, 0.5f, true, 0.0f);
  const int64_t n = 1000;
  Both var = Upload(Random(n, 7)), m = Zeros(n), v = Zeros(n), grad = Upload(Random(n, 8));
  auto cpu_step = cpu_->MakeCounter(0);
  auto gpu_step = gpu_->MakeCounter(0);
  ASSERT_TRUE(cpu_step.ok() && gpu_step.ok());
  ASSERT_TRUE((*cpu_step)->Set(12345).ok());
  ASSERT_TRUE((*gpu_step)->Set(12345).ok());
  auto cpu_opt = cpu_->MakeOptimizer(p, cpu_step->get());
  auto gpu_opt = gpu_->MakeOptimizer(p, gpu_step->get());
  ASSERT_TRUE(cpu_opt.ok() && gpu_opt.ok());
  ASSERT_TRUE((*cpu_opt)->Apply({grad.cpu, var.cpu, m.cpu, v.cpu, nullptr, n}, 1.0f).ok());
  ASSERT_TRUE((*gpu_opt)->Apply({grad.gpu, var.gpu, m.gpu, v.gpu, nullptr, n}, 1.0f).ok());
  EXPECT_TRUE(Same(var, kOptRel, kOptAbs));
  auto read = (*gpu_step)->Read();
  ASSERT_TRUE(read.ok());
  EXPECT_EQ(*read, 12345);
}

TEST_F(CudaVsCpuTest, OptimizerRejectsBadArguments) {
  auto gpu_step = gpu_->MakeCounter(0);
  auto cpu_step = cpu_->MakeCounter(0);
  ASSERT_TRUE(gpu_step.ok() && cpu_step.ok());
  OptimizerParams p;
  p.kind = OptimizerParams::Kind::kAdam;
  EXPECT_EQ(gpu_->MakeOptimizer(p, cpu_step->get()).status().code(), absl::StatusCode::kInvalidArgument)
      << "a counter of another device";
  p.beta1 = 1.0f;
  EXPECT_EQ(gpu_->MakeOptimizer(p, gpu_step->get()).status().code(), absl::StatusCode::kInvalidArgument);
  p.beta1 = 0.9f;
  auto opt = gpu_->MakeOptimizer(p, gpu_step->get());
  ASSERT_TRUE(opt.ok()) << opt.status();
  Both x = Zeros(10);
  EXPECT_EQ((*opt)->Apply({x.gpu, x.gpu, x.gpu, nullptr, nullptr, 10}, 1.0f).code(),
            absl::StatusCode::kInvalidArgument)
      << "adam without v";
  EXPECT_EQ((*opt)->Apply({x.gpu, x.gpu, x.gpu, x.gpu, x.gpu, 10}, 1.0f).code(),
            absl::StatusCode::kInvalidArgument)
      << "a shadow without moving_average_decay";
}

}  // namespace
}  // namespace dtrain::kernels::cuda
