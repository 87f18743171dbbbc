// Whole-model gradient checks: the flat gradient of TrainStep against central differences of the loss, on
// ~30 sampled coordinates of every variable, on the real CPU backend. Dropout stays on: the same step keys the
// same mask, so the loss is one fixed function of the parameters.
//
// Tolerance: the loss comes back as a float, so each evaluation carries rounding noise of a few ulps of the loss
// (forward sums of hundreds of terms); the difference quotient inherits noise/(2h). A coordinate passes when
//   |g - fd| <= 1e-3 + 32 * ulp(loss) / (2h) + 5e-2 * max(|g|, |fd|)
// (for mlp, loss ~2.3 and h = 1e-3: ~2e-3 absolute). The step h is per model: TF's cnn init (weights 0.1, biases
// 0.1) gives losses ~20-40 with large gradients and many units near a ReLU kink, so it uses a smaller h.
// A coordinate whose +-h evaluation crosses a ReLU kink or a max-pool switch legitimately disagrees, so up to
// 10% of a variable's sampled coordinates may fail; a real bug (wrong layout, missing term) fails most of them.
#include <algorithm>
#include <cmath>
#include <random>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "worker/models/model.h"
#include "worker/models/test_util.h"

namespace dtrain::models {
namespace {

constexpr int kCoordsPerVariable = 30;
constexpr double kAbsTol = 1e-3, kRelTol = 5e-2, kNoiseUlps = 32;

struct Case {
  std::string model;
  int batch, height, width, channels;
  float step;  // finite-difference step h
};

class GradientCheckTest : public ::testing::TestWithParam<Case> {};

TEST_P(GradientCheckTest, MatchesCentralDifferences) {
  const Case& c = GetParam();
  auto dev = testing::MakeCpuDevice();
  ASSERT_NE(dev, nullptr);
  ModelOptions o;
  o.batch_size = c.batch;
  o.height = c.height;
  o.width = c.width;
  o.channels = c.channels;
  o.seed = 3;
  auto model_or = CreateModelByName(c.model, o, dev.get());
  ASSERT_TRUE(model_or.ok()) << model_or.status();
  Model& model = **model_or;
  const std::vector<VariableInfo>& vars = model.variables();
  std::vector<float> params = InitialParameters(vars, 11);
  const testing::OwnedBatch batch = testing::RandomBatch(o, c.batch, 5);
  constexpr int64_t kStepIndex = 9;

  ASSERT_TRUE(model.SetParameters(params.data()).ok());
  std::vector<float> grads(params.size());
  auto loss0 = model.TrainStep(batch.view(), kStepIndex, grads.data());
  ASSERT_TRUE(loss0.ok()) << loss0.status();
  ASSERT_TRUE(std::isfinite(*loss0));

  auto loss_at = [&](int64_t i, float value) {
    const float saved = params[i];
    params[i] = value;
    EXPECT_TRUE(model.SetParameters(params.data()).ok());
    auto loss = model.ComputeGradients(batch.view(), kStepIndex);
    EXPECT_TRUE(loss.ok()) << loss.status();
    params[i] = saved;
    return loss.ok() ? static_cast<double>(*loss) : NAN;
  };

  const float loss_ulp = std::nextafter(std::fabs(*loss0), INFINITY) - std::fabs(*loss0);
  const double abs_tol = kAbsTol + kNoiseUlps * loss_ulp / (2.0 * c.step);
  std::mt19937_64 gen(17);
  const std::vector<int64_t> offsets = Offsets(vars);
  for (size_t v = 0; v < vars.size(); ++v) {
    const int64_t size = vars[v].size();
    const int samples = static_cast<int>(std::min<int64_t>(kCoordsPerVariable, size));
    int failed = 0;
    double grad_norm = 0;
    std::string first_failure;
    for (int s = 0; s < samples; ++s) {
      const int64_t i = offsets[v] + (samples == size ? s : static_cast<int64_t>(gen() % size));
      const float plus = params[i] + c.step, minus = params[i] - c.step;
      const double fd = (loss_at(i, plus) - loss_at(i, minus)) / (static_cast<double>(plus) - minus);
      const double g = grads[i];
      grad_norm += g * g;
      if (!(std::fabs(g - fd) <= abs_tol + kRelTol * std::max(std::fabs(g), std::fabs(fd)))) {
        if (failed++ == 0) first_failure = absl::StrCat("index ", i - offsets[v], ": analytic ", g, " vs fd ", fd);
      }
    }
    EXPECT_LE(failed, samples / 10) << c.model << " " << vars[v].name << ": " << failed << " of " << samples
                                    << " coordinates off; first " << first_failure;
    EXPECT_GT(grad_norm, 0.0) << c.model << " " << vars[v].name << ": sampled gradient is all zero";
  }
  // The restored parameters give the original loss again (nothing leaked between evaluations).
  ASSERT_TRUE(model.SetParameters(params.data()).ok());
  auto again = model.ComputeGradients(batch.view(), kStepIndex);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *loss0);
}

INSTANTIATE_TEST_SUITE_P(AllModels, GradientCheckTest,
                         ::testing::Values(Case{"mlp", 4, 28, 28, 1, 1e-3f}, Case{"cnn", 2, 28, 28, 1, 2e-4f},
                                           Case{"cifar10", 2, 24, 24, 3, 1e-3f},
                                           Case{"convnet", 2, 16, 16, 1, 1e-3f}),
                         [](const ::testing::TestParamInfo<Case>& info) { return info.param.model; });

}  // namespace
}  // namespace dtrain::models
