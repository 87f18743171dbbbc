// SparseOptimizer: each update against values computed by hand (in double) from TensorFlow's formulas, the
// learning-rate decay, the slots of a new row and the checks of the config.
#include "ps/core/sparse_optimizer.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"

namespace dtrain::ps {
namespace {

SparseOptimizer Make(const std::string& name, float lr, OptimizerConfig decay = {}) {
  SparseOptimizerConfig c;
  c.name = name;
  c.learning_rate = lr;
  absl::StatusOr<SparseOptimizer> opt = SparseOptimizer::Create(c, decay);
  EXPECT_TRUE(opt.ok()) << opt.status();
  return *opt;
}

TEST(SparseOptimizerTest, SgdScalesTheGradient) {
  SparseOptimizer opt = Make("sgd", 0.1f);
  EXPECT_EQ(opt.num_slots(), 0);
  std::vector<float> row = {1.0f, -2.0f};
  const float g[] = {2.0f, 4.0f};
  opt.ApplyRow(opt.Prepare(0), 0.5f, g, row.data(), 2);
  EXPECT_FLOAT_EQ(row[0], 1.0f - 0.1f * 1.0f);
  EXPECT_FLOAT_EQ(row[1], -2.0f - 0.1f * 2.0f);
}

TEST(SparseOptimizerTest, AdagradAccumulatesSquares) {
  SparseOptimizer opt = Make("adagrad", 0.1f);
  ASSERT_EQ(opt.num_slots(), 1);
  std::vector<float> row = {1.0f, 0.0f};  // value, accum (dim 1)
  opt.InitSlots(row.data() + 1, 1);
  EXPECT_FLOAT_EQ(row[1], 0.1f);
  const float g1[] = {1.0f}, g2[] = {-2.0f};
  opt.ApplyRow(opt.Prepare(0), 1.0f, g1, row.data(), 1);
  double acc = 0.1 + 1.0, w = 1.0 - 0.1 * 1.0 / std::sqrt(acc);
  EXPECT_NEAR(row[1], acc, 1e-6);
  EXPECT_NEAR(row[0], w, 1e-6);
  opt.ApplyRow(opt.Prepare(1), 0.5f, g2, row.data(), 1);  // g = -1
  acc += 1.0;
  w -= 0.1 * -1.0 / std::sqrt(acc);
  EXPECT_NEAR(row[1], acc, 1e-6);
  EXPECT_NEAR(row[0], w, 1e-6);
}

TEST(SparseOptimizerTest, LazyAdamUsesTheGlobalStepForBiasCorrection) {
  SparseOptimizer opt = Make("adam", 0.01f);
  ASSERT_EQ(opt.num_slots(), 2);
  std::vector<float> row = {0.5f, 7.0f, 7.0f};
  opt.InitSlots(row.data() + 1, 1);
  EXPECT_EQ(row[1], 0.0f);
  EXPECT_EQ(row[2], 0.0f);
  // The row is first touched at step 9 (t = 10): its moments start from zero, the bias correction is step 9's.
  const float g[] = {0.3f};
  opt.ApplyRow(opt.Prepare(9), 1.0f, g, row.data(), 1);
  const double t = 10, lr_t = 0.01 * std::sqrt(1 - std::pow(0.999, t)) / (1 - std::pow(0.9, t));
  const double m = 0.1 * 0.3, v = 0.001 * 0.09;
  // (1 - beta2 is rounded to float once: relative 1e-5.)
  EXPECT_NEAR(row[1], m, 1e-5 * m);
  EXPECT_NEAR(row[2], v, 1e-4 * v);
  EXPECT_NEAR(row[0], 0.5 - lr_t * m / (std::sqrt(v) + 1e-8), 1e-5);
}

// TensorFlow's ApplyFtrl for one element, in double.
void FtrlReference(double g, double lr, double l1, double l2, double p, double* w, double* z, double* n) {
  const double n_new = *n + g * g;
  *z += g - (std::pow(n_new, -p) - std::pow(*n, -p)) / lr * *w;
  const double sign = *z > 0 ? 1 : (*z < 0 ? -1 : 0);
  *w = std::fabs(*z) > l1 ? (sign * l1 - *z) / (std::pow(n_new, -p) / lr + 2 * l2) : 0.0;
  *n = n_new;
}

TEST(SparseOptimizerTest, FtrlMatchesTensorFlowsFormula) {
  for (float lr_power : {-0.5f, -0.7f}) {
    SparseOptimizerConfig c;
    c.name = "ftrl";
    c.learning_rate = 0.2f;
    c.l1 = 0.05f;
    c.l2 = 0.1f;
    c.lr_power = lr_power;
    absl::StatusOr<SparseOptimizer> opt = SparseOptimizer::Create(c, {});
    ASSERT_TRUE(opt.ok()) << opt.status();
    std::vector<float> row = {0.25f, -0.1f, 0.0f, 0.0f, 0.0f, 0.0f};  // dim 2: values, z, n
    opt->InitSlots(row.data() + 2, 2);
    EXPECT_EQ(row[2], 0.0f);
    EXPECT_FLOAT_EQ(row[4], 0.1f);
    double w[2] = {0.25, -0.1}, z[2] = {0, 0}, n[2] = {0.1, 0.1};
    const float grads[3][2] = {{0.5f, 0.01f}, {-0.2f, 0.02f}, {0.3f, -0.04f}};
    for (int s = 0; s < 3; ++s) {
      opt->ApplyRow(opt->Prepare(s), 1.0f, grads[s], row.data(), 2);
      for (int i = 0; i < 2; ++i) FtrlReference(grads[s][i], 0.2, 0.05, 0.1, lr_power, &w[i], &z[i], &n[i]);
    }
    for (int i = 0; i < 2; ++i) {
      EXPECT_NEAR(row[i], w[i], 1e-6) << lr_power << " " << i;
      EXPECT_NEAR(row[2 + i], z[i], 1e-6);
      EXPECT_NEAR(row[4 + i], n[i], 1e-6);
    }
    // The second element's |z| stays below l1: its value is exactly 0 (FTRL's sparsity).
    EXPECT_EQ(row[1], 0.0f);
  }
}

TEST(SparseOptimizerTest, LearningRateDecaysLikeTheDenseOne) {
  OptimizerConfig decay;
  decay.decay_steps = 10;
  decay.decay_rate = 0.5f;
  decay.staircase = true;
  SparseOptimizer opt = Make("sgd", 1.0f, decay);
  EXPECT_FLOAT_EQ(opt.Prepare(9).lr, 1.0f);
  EXPECT_FLOAT_EQ(opt.Prepare(10).lr, 0.5f);
  EXPECT_FLOAT_EQ(opt.Prepare(25).lr, 0.25f);
  decay.staircase = false;
  EXPECT_NEAR(Make("sgd", 1.0f, decay).Prepare(5).lr, std::pow(0.5, 0.5), 1e-6);
}

TEST(SparseOptimizerTest, BadConfigsNameTheField) {
  auto error = [](SparseOptimizerConfig c) {
    absl::StatusOr<SparseOptimizer> opt = SparseOptimizer::Create(c, {});
    EXPECT_FALSE(opt.ok());
    return std::string(opt.status().message());
  };
  SparseOptimizerConfig c;
  c.name = "rmsprop";
  EXPECT_NE(error(c).find("unknown sparse_optimizer"), std::string::npos);
  c.name = "adagrad";
  c.initial_accumulator = 0.0f;
  EXPECT_NE(error(c).find("initial_accumulator"), std::string::npos);
  c = {};
  c.name = "adam";
  c.beta2 = 1.0f;
  EXPECT_NE(error(c).find("beta2"), std::string::npos);
  c = {};
  c.name = "ftrl";
  c.lr_power = 0.5f;
  EXPECT_NE(error(c).find("lr_power"), std::string::npos);
  c.lr_power = -0.5f;
  c.learning_rate = 0.0f;
  EXPECT_NE(error(c).find("learning_rate"), std::string::npos);
  c = {};
  c.learning_rate = -1.0f;
  EXPECT_NE(error(c).find("learning_rate"), std::string::npos);
}

}  // namespace
}  // namespace dtrain::ps
