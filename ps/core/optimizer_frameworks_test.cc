// Every optimizer name against its framework's update written out here in double precision, from the
// frameworks' own definitions (torch.optim's _single_tensor_* functions of PyTorch 1.13, TensorFlow's
// training_ops ApplyAdagrad / ApplyRMSProp / ApplyCenteredRMSProp / ApplyMomentum / ApplyAdam), with weight decay
// and the learning-rate schedules (torch.optim.lr_scheduler's closed forms), for 40 steps of varied gradients:
// every value within 1e-5 (relative to max(1, |value|)). tests/optimizers_pytorch_test.py checks the same against
// PyTorch itself.
#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/optimizer_ops.h"
#include "ps/core/optimizer.h"

namespace dtrain::ps {
namespace {

constexpr double kPi = 3.14159265358979323846;

// The schedule as torch.optim.lr_scheduler gives it (SequentialLR([LinearLR, decay], milestones=[warmup])).
double ReferenceLr(const OptimizerConfig& c, int64_t step) {
  const double lr = c.learning_rate;
  if (step < c.warmup_steps) {
    const double f = c.warmup_start_factor;
    return lr * (f + (1 - f) * static_cast<double>(step) / static_cast<double>(c.warmup_steps));
  }
  const int64_t t = step - c.warmup_steps;
  if (c.lr_schedule == "cosine") {
    const double tt = std::min<int64_t>(t, c.decay_steps);
    return c.min_learning_rate + (lr - c.min_learning_rate) * (1 + std::cos(kPi * tt / c.decay_steps)) / 2;
  }
  if (c.decay_steps == 0) return lr;
  double e = static_cast<double>(t) / static_cast<double>(c.decay_steps);
  if (c.staircase) e = std::floor(e);
  return lr * std::pow(static_cast<double>(c.decay_rate), e);
}

struct State {
  std::vector<double> var, s0, s1, s2;
};

// One step of the framework's update on every element (g: the raw gradient, before weight decay).
void ReferenceStep(const OptimizerConfig& c, int64_t step, const std::vector<double>& grad, State* st) {
  const double lr = ReferenceLr(c, step), t = static_cast<double>(step + 1), wd = c.weight_decay;
  for (size_t i = 0; i < grad.size(); ++i) {
    double& w = st->var[i];
    double g = grad[i];
    if (c.name != "adamw") g += wd * w;  // L2: torch's grad.add(param, alpha=weight_decay)
    if (c.name == "sgd") {
      w -= lr * g;
    } else if (c.name == "momentum") {
      double& buf = st->s0[i];
      buf = c.momentum * buf + g;
      w -= lr * (c.nesterov ? g + c.momentum * buf : buf);
    } else if (c.name == "adam" || c.name == "pytorch_adam" || c.name == "adamw") {
      if (c.name == "adamw") w *= 1 - lr * wd;
      double &m = st->s0[i], &v = st->s1[i];
      m = c.beta1 * m + (1 - c.beta1) * g;
      v = c.beta2 * v + (1 - c.beta2) * g * g;
      const double bc1 = 1 - std::pow(c.beta1, t), bc2 = 1 - std::pow(c.beta2, t);
      if (c.name == "adam") {
        w -= lr * std::sqrt(bc2) / bc1 * m / (std::sqrt(v) + c.epsilon);
      } else {
        w -= lr / bc1 * m / (std::sqrt(v) / std::sqrt(bc2) + c.epsilon);
      }
    } else if (c.name == "adagrad" || c.name == "pytorch_adagrad") {
      double& acc = st->s0[i];
      acc += g * g;
      w -= lr * g / (std::sqrt(acc) + c.epsilon);
    } else if (c.name == "rmsprop") {
      double& ms = st->s0[i];
      ms = c.rho * ms + (1 - c.rho) * g * g;
      double d = ms;
      double* mg = c.centered ? (c.momentum > 0 ? &st->s2[i] : &st->s1[i]) : nullptr;
      if (mg != nullptr) {
        *mg = c.rho * *mg + (1 - c.rho) * g;
        d = ms - *mg * *mg;
      }
      const double update = lr * g / std::sqrt(d + c.epsilon);
      if (c.momentum > 0) {
        double& mom = st->s1[i];
        mom = c.momentum * mom + update;
        w -= mom;
      } else {
        w -= update;
      }
    } else if (c.name == "pytorch_rmsprop") {
      double& sq = st->s0[i];
      sq = c.rho * sq + (1 - c.rho) * g * g;
      double avg;
      if (c.centered) {
        double& ga = c.momentum > 0 ? st->s2[i] : st->s1[i];
        ga = c.rho * ga + (1 - c.rho) * g;
        avg = std::sqrt(sq - ga * ga) + c.epsilon;
      } else {
        avg = std::sqrt(sq) + c.epsilon;
      }
      if (c.momentum > 0) {
        double& buf = st->s1[i];
        buf = c.momentum * buf + g / avg;
        w -= lr * buf;
      } else {
        w -= lr * g / avg;
      }
    } else {
      FAIL() << "no reference for " << c.name;
    }
  }
}

struct Case {
  std::string label;
  OptimizerConfig config;
};

OptimizerConfig Named(const std::string& name, float lr, const std::function<void(OptimizerConfig&)>& edit = {}) {
  OptimizerConfig c = *DefaultOptimizerConfig(name);
  c.learning_rate = lr;
  if (edit) edit(c);
  return c;
}

class FrameworkUpdateTest : public ::testing::TestWithParam<Case> {};

TEST_P(FrameworkUpdateTest, FortyStepsMatchTheFrameworksFormulaInDouble) {
  const OptimizerConfig& c = GetParam().config;
  absl::StatusOr<Optimizer> opt = Optimizer::Create(c);
  ASSERT_TRUE(opt.ok()) << opt.status();
  const int n = 64;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> init(-1.0f, 1.0f);
  std::vector<float> var(n);
  for (float& v : var) v = init(rng);
  std::vector<std::vector<float>> slots(kMaxOptimizerSlots);
  for (int k = 0; k < opt->num_slots(); ++k) slots[k].assign(n, opt->SlotInitialValue(k));
  State ref;
  ref.var.assign(var.begin(), var.end());
  ref.s0.assign(n, opt->num_slots() > 0 ? opt->SlotInitialValue(0) : 0.0);
  ref.s1.assign(n, 0.0);
  ref.s2.assign(n, 0.0);
  for (int64_t step = 0; step < 40; ++step) {
    // Gradients of every size, some of a sign that flips, a few near zero.
    std::vector<float> grad(n);
    for (int i = 0; i < n; ++i) {
      const float scale = std::pow(10.0f, static_cast<float>(i % 5) - 3.0f);  // 1e-3 .. 10
      grad[i] = scale * init(rng);
    }
    float* s[kMaxOptimizerSlots] = {slots[0].data(), slots[1].data(), slots[2].data()};
    opt->Apply(step, 1.0f, grad.data(), var.data(), s, n);
    ReferenceStep(c, step, std::vector<double>(grad.begin(), grad.end()), &ref);
    for (int i = 0; i < n; ++i) {
      ASSERT_NEAR(var[i], ref.var[i], 1e-5 * std::max(1.0, std::fabs(ref.var[i])))
          << "step " << step << " element " << i << " (gradient " << grad[i] << ")";
    }
  }
  EXPECT_NE(ref.var[0], static_cast<double>(init(rng))) << "sanity";
}

INSTANTIATE_TEST_SUITE_P(
    Names, FrameworkUpdateTest,
    ::testing::Values(
        Case{"sgd", Named("sgd", 0.05f)},
        Case{"sgd_l2_cosine_warmup", Named("sgd", 0.05f,
                                           [](OptimizerConfig& c) {
                                             c.weight_decay = 0.01f;
                                             c.lr_schedule = "cosine";
                                             c.decay_steps = 25;  // reaches the floor before step 40
                                             c.min_learning_rate = 0.005f;
                                             c.warmup_steps = 8;
                                             c.warmup_start_factor = 0.1f;
                                           })},
        Case{"momentum_step", Named("momentum", 0.02f,
                                    [](OptimizerConfig& c) {
                                      c.decay_steps = 10;
                                      c.decay_rate = 0.5f;
                                      c.staircase = true;
                                    })},
        Case{"nesterov_l2_exponential", Named("momentum", 0.02f,
                                              [](OptimizerConfig& c) {
                                                c.nesterov = true;
                                                c.weight_decay = 1e-3f;
                                                c.decay_steps = 1;  // ExponentialLR(gamma=0.97)
                                                c.decay_rate = 0.97f;
                                              })},
        Case{"adam", Named("adam", 0.01f)},
        Case{"adam_l2", Named("adam", 0.01f, [](OptimizerConfig& c) { c.weight_decay = 0.01f; })},
        Case{"pytorch_adam_l2_warmup", Named("pytorch_adam", 0.01f,
                                             [](OptimizerConfig& c) {
                                               c.weight_decay = 0.01f;
                                               c.warmup_steps = 5;
                                             })},
        Case{"adamw", Named("adamw", 0.01f)},
        Case{"adamw_cosine", Named("adamw", 0.01f,
                                   [](OptimizerConfig& c) {
                                     c.weight_decay = 0.1f;
                                     c.lr_schedule = "cosine";
                                     c.decay_steps = 40;
                                   })},
        Case{"adagrad", Named("adagrad", 0.1f)},
        Case{"pytorch_adagrad_l2", Named("pytorch_adagrad", 0.1f, [](OptimizerConfig& c) { c.weight_decay = 0.01f; })},
        Case{"rmsprop", Named("rmsprop", 0.01f)},
        Case{"rmsprop_momentum", Named("rmsprop", 0.01f, [](OptimizerConfig& c) { c.momentum = 0.9f; })},
        Case{"rmsprop_centered", Named("rmsprop", 0.01f,
                                       [](OptimizerConfig& c) {
                                         c.centered = true;
                                         c.epsilon = 1e-6f;
                                       })},
        Case{"rmsprop_centered_momentum_l2", Named("rmsprop", 0.01f,
                                                   [](OptimizerConfig& c) {
                                                     c.centered = true;
                                                     c.momentum = 0.5f;
                                                     c.epsilon = 1e-6f;
                                                     c.weight_decay = 0.01f;
                                                   })},
        Case{"pytorch_rmsprop", Named("pytorch_rmsprop", 0.01f)},
        Case{"pytorch_rmsprop_momentum_l2", Named("pytorch_rmsprop", 0.01f,
                                                  [](OptimizerConfig& c) {
                                                    c.momentum = 0.9f;
                                                    c.weight_decay = 0.01f;
                                                  })},
        Case{"pytorch_rmsprop_centered_momentum", Named("pytorch_rmsprop", 0.01f,
                                                        [](OptimizerConfig& c) {
                                                          c.centered = true;
                                                          c.momentum = 0.9f;
                                                          c.epsilon = 1e-6f;
                                                        })}),
    [](const auto& info) { return info.param.label; });

TEST(LearningRateScheduleTest, WarmupThenCosineThenFlat) {
  OptimizerConfig c = Named("sgd", 0.1f, [](OptimizerConfig& c) {
    c.lr_schedule = "cosine";
    c.decay_steps = 100;
    c.min_learning_rate = 0.001f;
    c.warmup_steps = 10;
    c.warmup_start_factor = 0.0f;
  });
  Optimizer opt = *Optimizer::Create(c);
  EXPECT_FLOAT_EQ(opt.LearningRate(0), 0.0f);    // warmup from 0
  EXPECT_FLOAT_EQ(opt.LearningRate(5), 0.05f);   // halfway
  EXPECT_FLOAT_EQ(opt.LearningRate(10), 0.1f);   // the cosine's start
  EXPECT_NEAR(opt.LearningRate(60), 0.001 + 0.099 * 0.5, 1e-8);  // halfway down: (1 + cos(pi/2)) / 2
  EXPECT_FLOAT_EQ(opt.LearningRate(110), 0.001f);  // the floor
  EXPECT_FLOAT_EQ(opt.LearningRate(500), 0.001f);  // stays there
  // The sparse tables' rate follows the same schedule from its own base.
  EXPECT_FLOAT_EQ(ScheduledLearningRate(c, 1.0f, 5), 0.5f);
  EXPECT_NEAR(ScheduledLearningRate(c, 1.0f, 60), 0.001 + 0.999 * 0.5, 1e-7);
}

TEST(LearningRateScheduleTest, StepAndExponentialAsPyTorchNamesThem) {
  // StepLR(step_size=3, gamma=0.1): staircase; ExponentialLR(gamma=0.9): decay_steps 1.
  OptimizerConfig step = Named("sgd", 1.0f, [](OptimizerConfig& c) {
    c.decay_steps = 3;
    c.decay_rate = 0.1f;
    c.staircase = true;
  });
  OptimizerConfig expo = Named("sgd", 1.0f, [](OptimizerConfig& c) {
    c.decay_steps = 1;
    c.decay_rate = 0.9f;
  });
  for (int64_t s = 0; s < 12; ++s) {
    EXPECT_NEAR(Optimizer::Create(step)->LearningRate(s), std::pow(0.1, s / 3), 1e-7 * std::pow(0.1, s / 3)) << s;
    // 0.9f is 0.89999998: relative 2e-8 per power.
    EXPECT_NEAR(Optimizer::Create(expo)->LearningRate(s), std::pow(0.9, s), 1e-6 * std::pow(0.9, s)) << s;
  }
}

TEST(ClipFactorTest, TorchsFactor) {
  EXPECT_FLOAT_EQ(kernels::ClipFactor(1.0f, 4.0), static_cast<float>(1.0 / (4.0 + 1e-6)));
  EXPECT_EQ(kernels::ClipFactor(1.0f, 0.5), 1.0f);  // under the bound: unchanged
  EXPECT_EQ(kernels::ClipFactor(0.0f, 100.0), 1.0f);  // off
  EXPECT_EQ(kernels::ClipFactor(1.0f, std::nan("")), 1.0f);
  EXPECT_EQ(kernels::ClipFactor(1.0f, INFINITY), 0.0f);
}

TEST(OptimizerNamesTest, DefaultsSlotsAndInitialValues) {
  struct Expect {
    std::string name;
    int slots;
    float first_slot_initial;
  };
  for (const Expect& e : {Expect{"sgd", 0, 0}, Expect{"momentum", 1, 0}, Expect{"adam", 2, 0},
                          Expect{"pytorch_adam", 2, 0}, Expect{"adamw", 2, 0}, Expect{"adagrad", 1, 0.1f},
                          Expect{"pytorch_adagrad", 1, 0}, Expect{"rmsprop", 1, 1.0f},
                          Expect{"pytorch_rmsprop", 1, 0}}) {
    SCOPED_TRACE(e.name);
    absl::StatusOr<OptimizerConfig> c = DefaultOptimizerConfig(e.name);
    ASSERT_TRUE(c.ok()) << c.status();
    Optimizer opt = *Optimizer::Create(*c);
    EXPECT_EQ(opt.num_slots(), e.slots);
    EXPECT_EQ(c->num_slots(), e.slots) << "ps_types.h's count agrees with the optimizer's";
    if (e.slots > 0) {
      EXPECT_EQ(opt.SlotInitialValue(0), e.first_slot_initial);
    }
  }
  // The frameworks' defaults.
  EXPECT_EQ(DefaultOptimizerConfig("adamw")->weight_decay, 0.01f);
  EXPECT_EQ(DefaultOptimizerConfig("pytorch_rmsprop")->rho, 0.99f);
  EXPECT_EQ(DefaultOptimizerConfig("pytorch_rmsprop")->epsilon, 1e-8f);
  EXPECT_EQ(DefaultOptimizerConfig("rmsprop")->epsilon, 1e-10f);
  EXPECT_EQ(DefaultOptimizerConfig("rmsprop")->momentum, 0.0f);
  EXPECT_EQ(DefaultOptimizerConfig("pytorch_adagrad")->initial_accumulator, 0.0f);
  EXPECT_EQ(DefaultOptimizerConfig("momentum")->momentum, 0.9f);
  EXPECT_EQ(DefaultOptimizerConfig("adadelta").status().code(), absl::StatusCode::kInvalidArgument);
  // RMSProp's slots follow momentum and centered, in both counts.
  for (const char* name : {"rmsprop", "pytorch_rmsprop"}) {
    for (float momentum : {0.0f, 0.9f}) {
      for (bool centered : {false, true}) {
        OptimizerConfig c = *DefaultOptimizerConfig(name);
        c.momentum = momentum;
        c.centered = centered;
        const int want = 1 + (momentum > 0) + centered;
        EXPECT_EQ(Optimizer::Create(c)->num_slots(), want) << name << momentum << centered;
        EXPECT_EQ(c.num_slots(), want);
      }
    }
  }
}

TEST(OptimizerNamesTest, OutOfRangeHyperparametersNameTheField) {
  auto error = [](const std::string& name, const std::function<void(OptimizerConfig&)>& edit) {
    OptimizerConfig c = *DefaultOptimizerConfig(name);
    edit(c);
    absl::Status s = Optimizer::Create(c).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << name;
    return std::string(s.message());
  };
  EXPECT_NE(error("sgd", [](OptimizerConfig& c) { c.weight_decay = -1; }).find("weight_decay"), std::string::npos);
  EXPECT_NE(error("sgd", [](OptimizerConfig& c) { c.clip_norm = -1; }).find("clip_norm"), std::string::npos);
  EXPECT_NE(error("sgd", [](OptimizerConfig& c) { c.lr_schedule = "linear"; }).find("linear"), std::string::npos);
  EXPECT_NE(error("sgd", [](OptimizerConfig& c) { c.lr_schedule = "cosine"; }).find("decay_steps"),
            std::string::npos);
  EXPECT_NE(error("sgd", [](OptimizerConfig& c) { c.warmup_steps = -2; }).find("warmup_steps"), std::string::npos);
  EXPECT_NE(error("sgd", [](OptimizerConfig& c) { c.warmup_start_factor = 1.5f; }).find("warmup_start_factor"),
            std::string::npos);
  EXPECT_NE(error("adam", [](OptimizerConfig& c) { c.nesterov = true; }).find("nesterov"), std::string::npos);
  EXPECT_NE(error("momentum",
                  [](OptimizerConfig& c) {
                    c.nesterov = true;
                    c.momentum = 0;
                  })
                .find("nesterov"),
            std::string::npos);
  EXPECT_NE(error("pytorch_adagrad", [](OptimizerConfig& c) { c.epsilon = 0; }).find("initial_accumulator"),
            std::string::npos);
  EXPECT_NE(error("rmsprop", [](OptimizerConfig& c) { c.rho = 1.0f; }).find("rho"), std::string::npos);
  EXPECT_NE(error("pytorch_rmsprop", [](OptimizerConfig& c) { c.epsilon = 0; }).find("epsilon"), std::string::npos);
}

}  // namespace
}  // namespace dtrain::ps
