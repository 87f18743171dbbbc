#include "ps/core/optimizer.h"

#include <cmath>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace dtrain::ps {
namespace {

// Optimizer::Apply with up to two slots given one by one.
void ApplyWith(const Optimizer& opt, int64_t step, float grad_scale, const float* grad, float* var, float* slot0,
               float* slot1, int64_t n) {
  float* slots[kMaxOptimizerSlots] = {slot0, slot1, nullptr};
  opt.Apply(step, grad_scale, grad, var, slots, n);
}

OptimizerConfig Config(const std::string& name, float lr) {
  OptimizerConfig c;
  c.name = name;
  c.learning_rate = lr;
  return c;
}

TEST(OptimizerTest, UnknownNameIsInvalidArgument) {
  absl::StatusOr<Optimizer> opt = Optimizer::Create(Config("adadelta", 0.1f));
  ASSERT_FALSE(opt.ok());
  EXPECT_EQ(opt.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(opt.status().message().find("adadelta"), std::string::npos);
}

TEST(OptimizerTest, BadHyperparametersAreInvalidArgument) {
  OptimizerConfig c = Config("adam", 0.1f);
  c.beta1 = 1.0f;
  EXPECT_EQ(Optimizer::Create(c).status().code(), absl::StatusCode::kInvalidArgument);
  c = Config("sgd", -1.0f);
  EXPECT_EQ(Optimizer::Create(c).status().code(), absl::StatusCode::kInvalidArgument);
  c = Config("sgd", 0.1f);
  c.decay_steps = 10;
  c.decay_rate = 0.0f;
  EXPECT_EQ(Optimizer::Create(c).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(OptimizerTest, SlotCounts) {
  EXPECT_EQ(Optimizer::Create(Config("sgd", 0.1f))->num_slots(), 0);
  EXPECT_EQ(Optimizer::Create(Config("momentum", 0.1f))->num_slots(), 1);
  EXPECT_EQ(Optimizer::Create(Config("adam", 0.1f))->num_slots(), 2);
}

TEST(OptimizerTest, SgdByHand) {
  Optimizer opt = *Optimizer::Create(Config("sgd", 0.1f));
  std::vector<float> var = {1.0f, -2.0f};
  const std::vector<float> grad = {0.5f, -1.0f};
  ApplyWith(opt, 0, 1.0f, grad.data(), var.data(), nullptr, nullptr, 2);
  // 1 - 0.1*0.5 = 0.95;  -2 - 0.1*(-1) = -1.9
  EXPECT_NEAR(var[0], 0.95f, 1e-6);
  EXPECT_NEAR(var[1], -1.9f, 1e-6);
  // grad_scale 0.5 halves the gradient: 0.95 - 0.1*0.25 = 0.925;  -1.9 + 0.05 = -1.85
  ApplyWith(opt, 1, 0.5f, grad.data(), var.data(), nullptr, nullptr, 2);
  EXPECT_NEAR(var[0], 0.925f, 1e-6);
  EXPECT_NEAR(var[1], -1.85f, 1e-6);
}

TEST(OptimizerTest, MomentumByHand) {
  OptimizerConfig c = Config("momentum", 0.1f);
  c.momentum = 0.9f;
  Optimizer opt = *Optimizer::Create(c);
  std::vector<float> var = {1.0f}, accum = {0.0f};
  const std::vector<float> grad = {1.0f};
  // step 0: accum = 1;            var = 1 - 0.1*1       = 0.9
  // step 1: accum = 0.9*1 + 1 = 1.9;   var = 0.9 - 0.19  = 0.71
  // step 2: accum = 0.9*1.9 + 1 = 2.71; var = 0.71 - 0.271 = 0.439
  const float expected_var[] = {0.9f, 0.71f, 0.439f};
  const float expected_accum[] = {1.0f, 1.9f, 2.71f};
  for (int step = 0; step < 3; ++step) {
    ApplyWith(opt, step, 1.0f, grad.data(), var.data(), accum.data(), nullptr, 1);
    EXPECT_NEAR(accum[0], expected_accum[step], 1e-6) << "step " << step;
    EXPECT_NEAR(var[0], expected_var[step], 1e-6) << "step " << step;
  }
}

TEST(OptimizerTest, AdamByHand) {
  OptimizerConfig c = Config("adam", 0.1f);  // beta1 0.9, beta2 0.999, epsilon 1e-8
  Optimizer opt = *Optimizer::Create(c);
  std::vector<float> var = {1.0f}, m = {0.0f}, v = {0.0f};
  // t=1, g=1:    lr_t = 0.1*sqrt(0.001)/0.1 = 0.0316228; m = 0.1; v = 0.001
  //              var = 1 - 0.0316228*0.1/(0.0316228 + 1e-8) = 0.9000000
  // t=2, g=0.5:  lr_t = 0.1*sqrt(1-0.998001)/(1-0.81) = 0.0235317; m = 0.09+0.05 = 0.14;
  //              v = 0.000999 + 0.00025 = 0.001249; var = 0.9 - 0.0235317*0.14/0.0353412 = 0.8067821
  // t=3, g=-0.25: lr_t = 0.1*sqrt(1-0.997003)/(1-0.729) = 0.0202011; m = 0.126 - 0.025 = 0.101;
  //              v = 0.001247751 + 0.0000625 = 0.001310251; var = 0.8067821 - 0.0202011*0.101/0.0361974
  //              = 0.7504160
  const float grads[] = {1.0f, 0.5f, -0.25f};
  const float expected_m[] = {0.1f, 0.14f, 0.101f};
  const float expected_v[] = {0.001f, 0.001249f, 0.001310251f};
  const float expected_var[] = {0.9000000f, 0.8067821f, 0.7504160f};
  for (int step = 0; step < 3; ++step) {
    ApplyWith(opt, step, 1.0f, &grads[step], var.data(), m.data(), v.data(), 1);
    EXPECT_NEAR(m[0], expected_m[step], 1e-6) << "step " << step;
    // 1 - 0.999f is 0.00099998713 in float: v carries a relative error of about 1.3e-5.
    EXPECT_NEAR(v[0], expected_v[step], 3e-8) << "step " << step;
    EXPECT_NEAR(var[0], expected_var[step], 2e-6) << "step " << step;
  }
  EXPECT_NEAR(AdamLearningRate(0.1f, 0.9f, 0.999f, 0), 0.0316228f, 1e-6);
  EXPECT_NEAR(AdamLearningRate(0.1f, 0.9f, 0.999f, 1), 0.0235317f, 1e-6);
}

// "pytorch_adam" is torch.optim.Adam: var -= lr / (1 - b1^t) * m / (sqrt(v / (1 - b2^t)) + eps). With a large
// epsilon the two forms differ visibly; each follows its own formula (computed here in double).
TEST(OptimizerTest, PytorchAdamPutsEpsilonWhereTorchDoes) {
  for (const char* name : {"adam", "pytorch_adam"}) {
    SCOPED_TRACE(name);
    OptimizerConfig c = Config(name, 0.1f);
    c.epsilon = 0.05f;
    Optimizer opt = *Optimizer::Create(c);
    std::vector<float> var = {1.0f}, m = {0.0f}, v = {0.0f};
    double dvar = 1.0, dm = 0.0, dv = 0.0;
    const float grads[] = {1.0f, 0.5f, -0.25f, 2.0f};
    for (int step = 0; step < 4; ++step) {
      ApplyWith(opt, step, 1.0f, &grads[step], var.data(), m.data(), v.data(), 1);
      const double t = step + 1, g = grads[step];
      dm = 0.9 * dm + 0.1 * g;
      dv = 0.999 * dv + (1 - 0.999) * g * g;
      const double b1t = std::pow(0.9, t), b2t = std::pow(0.999, t);
      if (std::string(name) == "adam") {
        dvar -= 0.1 * std::sqrt(1 - b2t) / (1 - b1t) * dm / (std::sqrt(dv) + 0.05);
      } else {
        dvar -= 0.1 / (1 - b1t) * dm / (std::sqrt(dv / (1 - b2t)) + 0.05);
      }
      EXPECT_NEAR(var[0], dvar, 2e-5) << "step " << step;
    }
  }
  // The two differ by much more than that here.
  OptimizerConfig a = Config("adam", 0.1f), p = Config("pytorch_adam", 0.1f);
  a.epsilon = p.epsilon = 0.05f;
  std::vector<float> va = {1.0f}, vp = {1.0f}, ma = {0}, mp = {0}, sa = {0}, sp = {0};
  const float g = 1.0f;
  ApplyWith(*Optimizer::Create(a), 0, 1.0f, &g, va.data(), ma.data(), sa.data(), 1);
  ApplyWith(*Optimizer::Create(p), 0, 1.0f, &g, vp.data(), mp.data(), sp.data(), 1);
  EXPECT_GT(std::fabs(va[0] - vp[0]), 1e-2);
}

TEST(OptimizerTest, VectorLoopsMatchScalarReferenceOnLongArrays) {
  // Lengths that are not multiples of any vector width exercise the vector body and the remainder.
  for (int64_t n : {1, 7, 16, 1000, 4099}) {
    std::vector<float> grad(n), var(n), m(n, 0.0f), v(n, 0.0f);
    for (int64_t i = 0; i < n; ++i) {
      grad[i] = 0.001f * static_cast<float>((i * 37) % 101) - 0.05f;
      var[i] = 0.01f * static_cast<float>(i % 13);
    }
    std::vector<float> ref_var = var, ref_m = m, ref_v = v;
    ApplyAdam(0.01f, 0.9f, 0.999f, 1e-8f, 0.5f, grad.data(), var.data(), m.data(), v.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      const float g = 0.5f * grad[i];
      ref_m[i] = 0.1f * g;
      ref_v[i] = 0.001f * g * g;
      ref_var[i] -= 0.01f * ref_m[i] / (std::sqrt(ref_v[i]) + 1e-8f);
    }
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_NEAR(m[i], ref_m[i], 1e-7) << "n=" << n << " i=" << i;
      ASSERT_NEAR(v[i], ref_v[i], 1e-9) << "n=" << n << " i=" << i;
      ASSERT_NEAR(var[i], ref_var[i], 1e-6) << "n=" << n << " i=" << i;
    }
    std::vector<float> sum(n, 1.0f);
    AddInto(grad.data(), sum.data(), n);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(sum[i], 1.0f + grad[i]);
  }
}

TEST(OptimizerTest, ExponentialDecay) {
  OptimizerConfig c = Config("sgd", 0.1f);
  EXPECT_FLOAT_EQ(Optimizer::Create(c)->LearningRate(12345), 0.1f);  // decay_steps 0: constant
  c.decay_steps = 10;
  c.decay_rate = 0.5f;
  Optimizer smooth = *Optimizer::Create(c);
  EXPECT_FLOAT_EQ(smooth.LearningRate(0), 0.1f);
  EXPECT_NEAR(smooth.LearningRate(5), 0.0707107f, 1e-7);  // 0.1 * 0.5^0.5
  EXPECT_NEAR(smooth.LearningRate(20), 0.025f, 1e-8);     // 0.1 * 0.5^2
  c.staircase = true;
  Optimizer stairs = *Optimizer::Create(c);
  EXPECT_FLOAT_EQ(stairs.LearningRate(9), 0.1f);    // floor(0.9) = 0
  EXPECT_FLOAT_EQ(stairs.LearningRate(10), 0.05f);  // floor(1.0) = 1
  EXPECT_FLOAT_EQ(stairs.LearningRate(15), 0.05f);
  EXPECT_FLOAT_EQ(stairs.LearningRate(29), 0.025f);

  // The schedule drives Apply: SGD at step 20 of the smooth schedule moves by 0.025 * g.
  std::vector<float> var = {1.0f};
  const float g = 2.0f;
  ApplyWith(smooth, 20, 1.0f, &g, var.data(), nullptr, nullptr, 1);
  EXPECT_NEAR(var[0], 0.95f, 1e-6);
}

TEST(OptimizerTest, MovingAverageDecayWarmsUp) {
  EXPECT_NEAR(MovingAverageDecay(0.99f, 0), 0.1f, 1e-7);          // 1/10
  EXPECT_NEAR(MovingAverageDecay(0.99f, 1), 2.0f / 11.0f, 1e-7);  // 2/11 = 0.181818
  EXPECT_NEAR(MovingAverageDecay(0.99f, 100), 101.0f / 110.0f, 1e-7);
  EXPECT_FLOAT_EQ(MovingAverageDecay(0.99f, 1000), 0.99f);  // 1001/1010 > 0.99
}

TEST(OptimizerTest, MovingAverageByHand) {
  std::vector<float> var = {2.0f, -1.0f}, shadow = {1.0f, 1.0f};
  // decay 0.75: shadow -= 0.25 * (shadow - var): 1 - 0.25*(1-2) = 1.25;  1 - 0.25*(1+1) = 0.5
  UpdateMovingAverage(0.75f, var.data(), shadow.data(), 2);
  EXPECT_NEAR(shadow[0], 1.25f, 1e-7);
  EXPECT_NEAR(shadow[1], 0.5f, 1e-7);
  // Again: 1.25 - 0.25*(1.25-2) = 1.4375;  0.5 - 0.25*(0.5+1) = 0.125
  UpdateMovingAverage(0.75f, var.data(), shadow.data(), 2);
  EXPECT_NEAR(shadow[0], 1.4375f, 1e-7);
  EXPECT_NEAR(shadow[1], 0.125f, 1e-7);
}

}  // namespace
}  // namespace dtrain::ps
