// The device optimizer of the CPU backend (kernels/optimizer_ops.h, the oracle of the CUDA one) against the
// parameter server's optimizer: 200 steps of every optimizer (SGD, momentum and Nesterov, both Adams and AdamW,
// both Adagrads, both RMSProps with momentum and centered), with weight decay, learning-rate schedules (exponential
// smooth and staircase, cosine with warmup) and moving averages give the same bits as ps::Optimizer::Apply
// followed by ps::UpdateMovingAverage with num_updates = step + 1 (what SliceStore::Apply does), for one and
// several threads. With gradient clipping the device gathers the global norm itself (ClearNorm, AddToNorm in
// parts) and must agree with the ps given the same norm (to the last bit of the factor).
#include <cmath>
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
  absl::StatusOr<kernels::OptimizerParams> p = ToOptimizerParams(c, moving_average_decay);
  EXPECT_TRUE(p.ok()) << p.status();
  return *p;
}

class DeviceOptimizerTest : public ::testing::TestWithParam<std::tuple<Case, int>> {};

constexpr int64_t kN = 150001;  // several of the CPU optimizer's chunks

// The gradients of the steps: step s uses the (s mod 7)-th, drawn once for every case (drawing 200 of them per
// case took most of the test's time in the sanitizer build, whose test sources are unoptimized).
const std::vector<float>& Gradient(int64_t step) {
  static const auto* const gradients = [] {
    auto* g = new std::vector<std::vector<float>>;
    for (uint64_t k = 0; k < 7; ++k) g->push_back(kernels::testing::RandomVector(kN, 100 + k, -0.3f, 0.3f));
    return g;
  }();
  return (*gradients)[step % gradients->size()];
}

TEST_P(DeviceOptimizerTest, TwoHundredStepsEqualTheParameterServersBitForBit) {
  const auto& [c, threads] = GetParam();
  const int64_t n = kN;
  absl::StatusOr<Optimizer> ps_opt = Optimizer::Create(c.config);
  ASSERT_TRUE(ps_opt.ok()) << ps_opt.status();
  std::vector<float> var = kernels::testing::RandomVector(n, 1), shadow = var;
  const int slots = ps_opt->num_slots();
  std::vector<std::vector<float>> slot(3);
  for (int k = 0; k < slots; ++k) slot[k].assign(n, ps_opt->SlotInitialValue(k));

  auto dev = kernels::CreateDevice(kernels::DeviceSpec::Cpu(threads));
  ASSERT_TRUE(dev.ok());
  auto step = (*dev)->MakeCounter(0);
  ASSERT_TRUE(step.ok());
  auto opt = (*dev)->MakeOptimizer(ToParams(c.config, c.moving_average_decay), step->get());
  ASSERT_TRUE(opt.ok()) << opt.status();
  // CPU "device memory" is host memory: plain vectors serve as the device buffers.
  std::vector<float> d_var = var, d_shadow = shadow;
  std::vector<std::vector<float>> d_slot = slot;

  for (int64_t s = 0; s < 200; ++s) {
    const std::vector<float>& grad = Gradient(s);
    float grad_scale = 1.0f / 3.0f;
    // The device gathers the clipping norm itself; the ps gets the factor folded into its grad_scale (as
    // SliceStore::Apply does with the norm a worker sent).
    float ps_scale = grad_scale;
    if (c.config.clip_norm > 0) {
      double sum = 0;
      for (float g : grad) sum += static_cast<double>(g) * g;
      ps_scale = grad_scale * kernels::ClipFactor(c.config.clip_norm, std::sqrt(sum) * grad_scale);
    }
    float* ps_slots[3] = {slot[0].data(), slot[1].data(), slot[2].data()};
    ps_opt->Apply(s, ps_scale, grad.data(), var.data(), ps_slots, n);
    if (c.moving_average_decay > 0) {
      UpdateMovingAverage(MovingAverageDecay(c.moving_average_decay, s + 1), var.data(), shadow.data(), n);
    }
    kernels::OptimizerBuffers b;
    b.grad = grad.data();
    b.var = d_var.data();
    b.slot0 = slots >= 1 ? d_slot[0].data() : nullptr;
    b.slot1 = slots >= 2 ? d_slot[1].data() : nullptr;
    b.slot2 = slots >= 3 ? d_slot[2].data() : nullptr;
    b.shadow = c.moving_average_decay > 0 ? d_shadow.data() : nullptr;
    b.n = n;
    if (c.config.clip_norm > 0) {
      ASSERT_TRUE((*opt)->ClearNorm().ok());
      // In two parts, as DeviceState adds one run of variables after another.
      ASSERT_TRUE((*opt)->AddToNorm(grad.data(), n / 3, grad_scale).ok());
      ASSERT_TRUE((*opt)->AddToNorm(grad.data() + n / 3, n - n / 3, grad_scale).ok());
    }
    ASSERT_TRUE((*opt)->Apply(b, grad_scale).ok());
    ASSERT_TRUE((*step)->Increment().ok());
  }
  if (c.config.clip_norm > 0) {
    // The norm is summed in another order on the device: the factor may differ in its last bit.
    for (int64_t i = 0; i < n; ++i) ASSERT_NEAR(d_var[i], var[i], 1e-5f * (1 + std::fabs(var[i]))) << i;
  } else {
    EXPECT_EQ(d_var, var);
    EXPECT_EQ(d_slot, slot);
    EXPECT_EQ(d_shadow, shadow);
  }
  EXPECT_NE(var, kernels::testing::RandomVector(n, 1)) << "the variables moved";
}

std::vector<Case> Cases() {
  std::vector<Case> cases = {
      {"sgd_smooth", Config("sgd", 0.1f, 50, 0.5f, false), 0.99f},
      {"momentum_staircase", Config("momentum", 0.05f, 30, 0.7f, true), 0.9f},
      {"adam_decay", Config("adam", 1e-3f, 40, 0.9f, false), 0.999f},
      {"adam_plain", Config("adam", 1e-4f, 0, 1.0f, false), 0.0f},
      {"pytorch_adam_decay", Config("pytorch_adam", 1e-3f, 40, 0.9f, false), 0.999f},
      {"adagrad", Config("adagrad", 0.05f, 50, 0.5f, true), 0.0f},
  };
  auto add = [&](const std::string& name, OptimizerConfig c, float ema, auto edit) {
    edit(c);
    cases.push_back({name, c, ema});
  };
  add("nesterov_l2", Config("momentum", 0.05f, 30, 0.7f, true), 0.9f, [](OptimizerConfig& c) {
    c.nesterov = true;
    c.weight_decay = 1e-3f;
  });
  add("sgd_l2_cosine_warmup", Config("sgd", 0.1f, 100, 1.0f, false), 0.0f, [](OptimizerConfig& c) {
    c.lr_schedule = "cosine";
    c.warmup_steps = 20;
    c.min_learning_rate = 0.01f;
    c.weight_decay = 1e-2f;
  });
  add("adam_l2", Config("adam", 1e-3f, 0, 1.0f, false), 0.0f, [](OptimizerConfig& c) { c.weight_decay = 1e-2f; });
  add("adamw_warmup", Config("adamw", 1e-3f, 0, 1.0f, false), 0.99f, [](OptimizerConfig& c) {
    c.weight_decay = 0.05f;
    c.warmup_steps = 10;
  });
  add("pytorch_adagrad_l2", Config("pytorch_adagrad", 0.05f, 0, 1.0f, false), 0.0f, [](OptimizerConfig& c) {
    c.initial_accumulator = 0.0f;
    c.epsilon = 1e-10f;
    c.weight_decay = 1e-3f;
  });
  add("rmsprop_centered_momentum", Config("rmsprop", 1e-3f, 0, 1.0f, false), 0.9f, [](OptimizerConfig& c) {
    c.epsilon = 1e-10f;
    c.momentum = 0.9f;
    c.centered = true;
  });
  add("rmsprop_plain", Config("rmsprop", 1e-3f, 0, 1.0f, false), 0.0f, [](OptimizerConfig& c) {
    c.epsilon = 1e-10f;
    c.momentum = 0.0f;
  });
  add("pytorch_rmsprop_momentum", Config("pytorch_rmsprop", 1e-3f, 0, 1.0f, false), 0.0f, [](OptimizerConfig& c) {
    c.rho = 0.99f;
    c.momentum = 0.5f;
    c.weight_decay = 1e-3f;
  });
  add("pytorch_rmsprop_centered", Config("pytorch_rmsprop", 1e-3f, 0, 1.0f, false), 0.0f, [](OptimizerConfig& c) {
    c.rho = 0.99f;
    c.momentum = 0.0f;
    c.centered = true;
  });
  add("momentum_clipped", Config("momentum", 0.05f, 0, 1.0f, false), 0.0f,
      [](OptimizerConfig& c) { c.clip_norm = 1.0f; });
  add("adamw_clipped", Config("adamw", 1e-3f, 0, 1.0f, false), 0.0f, [](OptimizerConfig& c) {
    c.clip_norm = 5.0f;
    c.weight_decay = 0.01f;
  });
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Optimizers, DeviceOptimizerTest,
                         ::testing::Combine(::testing::ValuesIn(Cases()), ::testing::Values(1, 3)),
                         [](const auto& info) {
                           return std::get<0>(info.param).name + "_threads" +
                                  std::to_string(std::get<1>(info.param));
                         });

}  // namespace
}  // namespace dtrain::ps
