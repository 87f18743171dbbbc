// Whole models with bf16 products (kernels::ComputeDtype::kBf16) against the same models in fp32: the same
// parameters, batch and dropout masks give a loss and a gradient within what bf16's rounding of every
// product's operands allows, and the Device reports every convolution and dense layer in bf16.
//
// The op tests (kernels/cpu/cpu_bf16_test.cc) prove each product is the fp32 product of operands rounded to
// bf16 (unit roundoff u = 2^-8), within bounds derived from that. Through a network:
// - The loss is a continuous function of every product (ReLU and max pooling are continuous), and each layer's
//   forward product adds a relative error of at most about 2u: the bound is L * 4u for L product layers
//   (measured: 1e-5 to 5e-4 against bounds of 3e-2 to 9e-2).
// - The gradient is not bounded by u: it goes through ReLU's derivative (and max pooling's argmax), steps that
//   flip for an activation within rounding distance of its threshold, and that unit's gradient for that example
//   changes entirely. Measured, its relative L2 error is 2-7% at initialization (with a few % of the units
//   flipped); the test bounds it at 1/8 to catch a product computing the wrong thing (a wrong transpose or
//   a stale copy is off by ~100%), and requires it above u / 64, which an fp32 computation (2^-20) cannot reach.
#include <cmath>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "worker/models/model.h"
#include "worker/models/test_util.h"

namespace dtrain::models {
namespace {

constexpr double kU = 1.0 / 256;  // bf16's unit roundoff

struct Case {
  std::string model;
  int batch;
  int height, width, channels;
  int product_layers;  // convolutions + dense layers
};

struct Outcome {
  float loss = 0;
  std::vector<float> grads;
  std::string report;
};

Outcome TrainOnce(const Case& c, kernels::ComputeDtype dtype) {
  ModelOptions o;
  o.batch_size = c.batch;
  o.height = c.height;
  o.width = c.width;
  o.channels = c.channels;
  o.seed = 3;
  Outcome out;
  auto dev = testing::MakeCpuDevice(dtype);
  if (dev == nullptr) return out;
  auto model = CreateModelByName(c.model, o, dev.get());
  EXPECT_TRUE(model.ok()) << model.status();
  if (!model.ok()) return out;
  const std::vector<float> params = InitialParameters((*model)->variables(), 7);
  const testing::OwnedBatch batch = testing::RandomBatch(o, c.batch, 11);
  EXPECT_TRUE((*model)->SetParameters(params.data()).ok());
  out.grads.assign(params.size(), 0.0f);
  auto loss = (*model)->TrainStep(batch.view(), 5, out.grads.data());
  EXPECT_TRUE(loss.ok()) << loss.status();
  out.loss = loss.ok() ? *loss : NAN;
  out.report = dev->PrecisionReport();
  return out;
}

class Bf16ModelTest : public ::testing::TestWithParam<Case> {};

TEST_P(Bf16ModelTest, LossAndGradientWithinBf16OfFp32) {
  const Case& c = GetParam();
  const Outcome fp32 = TrainOnce(c, kernels::ComputeDtype::kFp32);
  const Outcome bf16 = TrainOnce(c, kernels::ComputeDtype::kBf16);
  ASSERT_EQ(fp32.grads.size(), bf16.grads.size());
  ASSERT_TRUE(std::isfinite(bf16.loss));
  const double bound = c.product_layers * 4 * kU;
  const double loss_err = std::fabs(bf16.loss - fp32.loss) / std::fabs(fp32.loss);
  double diff2 = 0, norm2 = 0;
  for (size_t i = 0; i < fp32.grads.size(); ++i) {
    const double d = static_cast<double>(bf16.grads[i]) - fp32.grads[i];
    diff2 += d * d;
    norm2 += static_cast<double>(fp32.grads[i]) * fp32.grads[i];
  }
  const double grad_err = std::sqrt(diff2 / norm2);
  std::printf("%s batch %d: loss %.6f (fp32 %.6f, relative error %.2e, bound %.2e), gradient relative error %.2e\n",
              c.model.c_str(), c.batch, bf16.loss, fp32.loss, loss_err, bound, grad_err);
  EXPECT_LE(loss_err, bound);
  EXPECT_LE(grad_err, 0.125);
  EXPECT_GT(grad_err, kU / 64) << "an error this small is fp32's: were the products computed in bf16?";
  EXPECT_NE(bf16.report.find("fp32 fallback: none"), std::string::npos) << bf16.report;
  EXPECT_EQ(fp32.report, "");
}

INSTANTIATE_TEST_SUITE_P(BuiltIns, Bf16ModelTest,
                         ::testing::Values(Case{"mlp", 32, 28, 28, 1, 2}, Case{"cnn", 8, 28, 28, 1, 4},
                                           Case{"convnet", 4, 28, 28, 1, 6}, Case{"cifar10", 8, 24, 24, 3, 5}),
                         [](const ::testing::TestParamInfo<Case>& info) { return info.param.model; });

}  // namespace
}  // namespace dtrain::models
