// The device optimizer of the CPU backend (kernels/optimizer_ops.h, the oracle of the CUDA one) against the
// parameter server's optimizer: 200 steps of SGD, momentum and Adam with exponential decay (smooth and
// staircase) and moving averages give the same bits as ps::Optimizer::Apply followed by
// ps::UpdateMovingAverage with num_updates = step + 1 (what SliceStore::ApplyGradient does), for one and
// several threads.
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/device.h"
#include "kernels/gradient_check.h"
#include "ps/core/optimizer.h"

namespace dtrain::ps {
namespace {

struct Case {
  std::string name;
  OptimizerConfig config;
  float moving_average_decay;
};

OptimizerConfig Config(const std::string& name, float lr, int64_t decay_steps, float decay_rate,
                       bool staircase) {
  OptimizerConfig c;
  c.name = name;
  c.learning_rate = lr;
  c.decay_steps = decay_steps;
  c.decay_rate = decay_rate;
  c.staircase = staircase;
  c.momentum = 0.8f;
  return c;
}

kernels::OptimizerParams ToParams(const OptimizerConfig& c, float moving_average_decay) {
  kernels::OptimizerParams p;
  EXPECT_TRUE(kernels::SetOptimizerFromName(c.name, &p).ok()) << c.name;
  p.learning_rate = c.learning_rate;
  p.decay_steps = c.decay_steps;
  p.decay_rate = c.decay_rate;
  p.staircase = c.staircase;
  p.momentum = c.momentum;
  p.beta1 = c.beta1;
  p.beta2 = c.beta2;
  p.epsilon = c.epsilon;
  p.moving_average_decay = moving_average_decay;
  return p;
}

class DeviceOptimizerTest : public ::testing::TestWithParam<std::tuple<Case, int>> {};

TEST_P(DeviceOptimizerTest, TwoHundredStepsEqualTheParameterServersBitForBit) {
  const auto& [c, threads] = GetParam();
  const int64_t n = 150001;  // several of the CPU optimizer's chunks
  absl::StatusOr<Optimizer> ps_opt = Optimizer::Create(c.config);
  ASSERT_TRUE(ps_opt.ok()) << ps_opt.status();
  std::vector<float> var = kernels::testing::RandomVector(n, 1), shadow = var;
  std::vector<float> slot0(n, 0.0f), slot1(n, 0.0f);

  auto dev = kernels::CreateDevice(kernels::DeviceSpec::Cpu(threads));
  ASSERT_TRUE(dev.ok());
  auto step = (*dev)->MakeCounter(0);
  ASSERT_TRUE(step.ok());
  auto opt = (*dev)->MakeOptimizer(ToParams(c.config, c.moving_average_decay), step->get());
  ASSERT_TRUE(opt.ok()) << opt.status();
  // CPU "device memory" is host memory: plain vectors serve as the device buffers.
  std::vector<float> d_var = var, d_shadow = shadow, d_slot0 = slot0, d_slot1 = slot1;

  const int slots = ps_opt->num_slots();
  for (int64_t s = 0; s < 200; ++s) {
    const std::vector<float> grad = kernels::testing::RandomVector(n, 100 + s, -0.3f, 0.3f);
    const float grad_scale = 1.0f / 3.0f;
    ps_opt->Apply(s, grad_scale, grad.data(), var.data(), slots >= 1 ? slot0.data() : nullptr,
                  slots >= 2 ? slot1.data() : nullptr, n);
    if (c.moving_average_decay > 0) {
      UpdateMovingAverage(MovingAverageDecay(c.moving_average_decay, s + 1), var.data(), shadow.data(), n);
    }
    kernels::OptimizerBuffers b;
    b.grad = grad.data();
    b.var = d_var.data();
    b.slot0 = slots >= 1 ? d_slot0.data() : nullptr;
    b.slot1 = slots >= 2 ? d_slot1.data() : nullptr;
    b.shadow = c.moving_average_decay > 0 ? d_shadow.data() : nullptr;
    b.n = n;
    ASSERT_TRUE((*opt)->Apply(b, grad_scale).ok());
    ASSERT_TRUE((*step)->Increment().ok());
  }
  EXPECT_EQ(d_var, var);
  EXPECT_EQ(d_slot0, slot0);
  EXPECT_EQ(d_slot1, slot1);
  EXPECT_EQ(d_shadow, shadow);
  EXPECT_NE(var, kernels::testing::RandomVector(n, 1)) << "the variables moved";
}

INSTANTIATE_TEST_SUITE_P(
    Optimizers, DeviceOptimizerTest,
    ::testing::Combine(::testing::Values(Case{"sgd_smooth", Config("sgd", 0.1f, 50, 0.5f, false), 0.99f},
                                         Case{"momentum_staircase", Config("momentum", 0.05f, 30, 0.7f, true),
                                              0.9f},
                                         Case{"adam_decay", Config("adam", 1e-3f, 40, 0.9f, false), 0.999f},
                                         Case{"adam_plain", Config("adam", 1e-4f, 0, 1.0f, false), 0.0f},
                                         Case{"pytorch_adam_decay", Config("pytorch_adam", 1e-3f, 40, 0.9f, false),
                                              0.999f}),
                       ::testing::Values(1, 3)),
    [](const auto& info) {
      return std::get<0>(info.param).name + "_threads" + std::to_string(std::get<1>(info.param));
    });

}  // namespace
}  // namespace dtrain::ps
