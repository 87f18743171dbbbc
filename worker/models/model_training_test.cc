// Training behaviour on the real CPU backend: an MLP learns a synthetic separable problem with plain SGD,
// runs are deterministic, and bad batches are rejected.
#include <cmath>
#include <random>

#include "gtest/gtest.h"
#include "worker/models/model.h"
#include "worker/models/test_util.h"

namespace dtrain::models {
namespace {

// Ten Gaussian clusters in 784 dimensions around random centers: linearly separable in practice.
struct Clusters {
  std::vector<std::vector<float>> centers;
  testing::OwnedBatch Sample(const ModelOptions& o, int n, std::mt19937_64& gen) const {
    testing::OwnedBatch b{n, o.height, o.width, o.channels, {}, {}};
    std::normal_distribution<float> noise(0.0f, 0.5f);
    const size_t dim = centers[0].size();
    for (int i = 0; i < n; ++i) {
      const int label = static_cast<int>(gen() % centers.size());
      b.labels.push_back(static_cast<float>(label));
      for (size_t d = 0; d < dim; ++d) b.images.push_back(centers[label][d] + noise(gen));
    }
    return b;
  }
};

Clusters MakeClusters(int classes, int dim, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  Clusters c;
  c.centers.assign(classes, std::vector<float>(dim));
  for (auto& center : c.centers) {
    for (float& x : center) x = u(gen) < 0.2f ? 1.0f : 0.0f;  // sparse binary "strokes"
  }
  return c;
}

// 100 SGD steps of the mlp on ten clusters, with its matrix products in `dtype`.
void MlpLearnsSeparableDataWithSgd(kernels::ComputeDtype dtype) {
  auto dev = testing::MakeCpuDevice(dtype);
  ASSERT_NE(dev, nullptr);
  ModelOptions o;
  o.batch_size = 100;
  o.eval_batch_size = 500;  // a separate forward-only network
  auto model_or = CreateModelByName("mlp", o, dev.get());
  ASSERT_TRUE(model_or.ok()) << model_or.status();
  Model& model = **model_or;
  std::vector<float> params = InitialParameters(model.variables(), 1);
  std::vector<float> grads(params.size());
  const Clusters clusters = MakeClusters(10, 784, 99);
  std::mt19937_64 gen(4);
  const testing::OwnedBatch test = clusters.Sample(o, 500, gen);

  ASSERT_TRUE(model.SetParameters(params.data()).ok());
  auto correct_before = model.CountCorrect(test.view());
  ASSERT_TRUE(correct_before.ok()) << correct_before.status();

  const float lr = DefaultsByName("mlp").learning_rate;
  float first_loss = 0, last_loss = 0;
  for (int step = 0; step < 100; ++step) {
    const testing::OwnedBatch b = clusters.Sample(o, 100, gen);
    auto loss = model.TrainStep(b.view(), step, grads.data());
    ASSERT_TRUE(loss.ok()) << loss.status();
    ASSERT_TRUE(std::isfinite(*loss)) << "step " << step;
    if (step == 0) first_loss = *loss;
    last_loss = *loss;
    for (size_t i = 0; i < params.size(); ++i) params[i] -= lr * grads[i];
    ASSERT_TRUE(model.SetParameters(params.data()).ok());
  }
  auto correct_after = model.CountCorrect(test.view());
  ASSERT_TRUE(correct_after.ok()) << correct_after.status();
  EXPECT_LT(*correct_before, 150) << "chance is ~50 of 500";
  EXPECT_GT(*correct_after, 450) << "after 100 SGD steps";
  EXPECT_LT(last_loss, 0.3f * first_loss) << "first " << first_loss << " last " << last_loss;

  // Counting a prefix of the evaluation batch agrees with counting it by hand from two halves.
  testing::OwnedBatch half = test;
  half.n = 250;
  auto first_half = model.CountCorrect(half.view());
  ASSERT_TRUE(first_half.ok());
  testing::OwnedBatch second = test;
  second.n = 250;
  second.images.erase(second.images.begin(), second.images.begin() + 250 * 784);
  second.labels.erase(second.labels.begin(), second.labels.begin() + 250);
  auto second_half = model.CountCorrect(second.view());
  ASSERT_TRUE(second_half.ok());
  EXPECT_EQ(*first_half + *second_half, *correct_after);
}

TEST(ModelTrainingTest, MlpLearnsSeparableDataWithSgd) { MlpLearnsSeparableDataWithSgd(kernels::ComputeDtype::kFp32); }

// The same with bf16 products (fp32 parameters, loss and update): it learns as well.
TEST(ModelTrainingTest, MlpLearnsSeparableDataWithSgdInBf16) {
  MlpLearnsSeparableDataWithSgd(kernels::ComputeDtype::kBf16);
}

TEST(ModelTrainingTest, SameSeedSameLossAndGradients) {
  ModelOptions o;
  o.batch_size = 4;
  o.seed = 5;
  auto vars = ModelVariablesByName("cnn", o);
  ASSERT_TRUE(vars.ok());
  const std::vector<float> params = InitialParameters(*vars, 3);
  const testing::OwnedBatch batch = testing::RandomBatch(o, 4, 8);
  auto run = [&](int64_t step, std::vector<float>* grads) {
    auto dev = testing::MakeCpuDevice();
    auto model = CreateModelByName("cnn", o, dev.get());
    EXPECT_TRUE(model.ok()) << model.status();
    EXPECT_TRUE((*model)->SetParameters(params.data()).ok());
    grads->assign(params.size(), 0.0f);
    auto loss = (*model)->TrainStep(batch.view(), step, grads->data());
    EXPECT_TRUE(loss.ok()) << loss.status();
    return *loss;
  };
  std::vector<float> g1, g2, g3;
  const float l1 = run(10, &g1), l2 = run(10, &g2), l3 = run(11, &g3);
  EXPECT_EQ(l1, l2);
  EXPECT_EQ(g1, g2);
  // Another step draws another dropout mask.
  EXPECT_NE(g1, g3);
  EXPECT_NE(l1, l3);
}

// The weight-decay terms, isolated: with pixel 0 black in every image, row 0 of hidden1/weights does not affect
// the cross-entropy, so its gradient is exactly wd * w and it changes the loss by exactly wd * l2_loss(row 0).
TEST(ModelTrainingTest, WeightDecayAddsToLossAndGradient) {
  auto dev = testing::MakeCpuDevice();
  ASSERT_NE(dev, nullptr);
  ModelOptions o;
  o.batch_size = 8;
  auto model_or = CreateModelByName("mlp", o, dev.get());
  ASSERT_TRUE(model_or.ok()) << model_or.status();
  Model& model = **model_or;
  ASSERT_EQ(model.variables()[0].name, "hidden1/weights");
  const float wd = model.variables()[0].weight_decay;
  ASSERT_GT(wd, 0.0f);
  testing::OwnedBatch b = testing::RandomBatch(o, 8, 2);
  for (int i = 0; i < 8; ++i) b.images[i * 784] = 0.0f;
  std::vector<float> params = InitialParameters(model.variables(), 1);
  std::vector<float> g0(params.size()), g1(params.size());
  for (int j = 0; j < 500; ++j) params[j] = 0.0f;  // row 0: input pixel 0
  ASSERT_TRUE(model.SetParameters(params.data()).ok());
  auto l0 = model.TrainStep(b.view(), 0, g0.data());
  ASSERT_TRUE(l0.ok()) << l0.status();
  for (int j = 0; j < 500; ++j) params[j] = 1.0f;
  ASSERT_TRUE(model.SetParameters(params.data()).ok());
  auto l1 = model.TrainStep(b.view(), 0, g1.data());
  ASSERT_TRUE(l1.ok()) << l1.status();
  // l2_loss(row 0) = 500 * 1^2 / 2.
  EXPECT_NEAR(*l1 - *l0, wd * 250.0f, 1e-4) << "l0 " << *l0 << " l1 " << *l1;
  for (int j = 0; j < 500; ++j) {
    ASSERT_EQ(g0[j], 0.0f) << j;
    ASSERT_FLOAT_EQ(g1[j], wd) << j;
  }
  for (size_t j = 500; j < params.size(); ++j) ASSERT_EQ(g0[j], g1[j]) << j;
}

TEST(ModelTrainingTest, RejectsBadBatches) {
  auto dev = testing::MakeCpuDevice();
  ASSERT_NE(dev, nullptr);
  ModelOptions o;
  o.batch_size = 8;
  auto model_or = CreateModelByName("mlp", o, dev.get());
  ASSERT_TRUE(model_or.ok()) << model_or.status();
  Model& model = **model_or;
  std::vector<float> grads(model.num_parameters());

  testing::OwnedBatch wrong_count = testing::RandomBatch(o, 7, 1);
  EXPECT_EQ(model.TrainStep(wrong_count.view(), 0, grads.data()).status().code(),
            absl::StatusCode::kInvalidArgument);
  testing::OwnedBatch b = testing::RandomBatch(o, 8, 1);
  HostBatch wrong_shape = b.view();
  wrong_shape.height = 32;
  EXPECT_EQ(model.TrainStep(wrong_shape, 0, grads.data()).status().code(), absl::StatusCode::kInvalidArgument);
  b.labels[3] = 10;  // out of range
  EXPECT_EQ(model.TrainStep(b.view(), 0, grads.data()).status().code(), absl::StatusCode::kInvalidArgument);
  b.labels[3] = 1.5f;
  EXPECT_EQ(model.CountCorrect(b.view()).status().code(), absl::StatusCode::kInvalidArgument);
  testing::OwnedBatch too_many = testing::RandomBatch(o, 9, 1);
  EXPECT_EQ(model.CountCorrect(too_many.view()).status().code(), absl::StatusCode::kInvalidArgument);
  testing::OwnedBatch none = testing::RandomBatch(o, 0, 1);
  auto zero = model.CountCorrect(none.view());
  ASSERT_TRUE(zero.ok());
  EXPECT_EQ(*zero, 0);
}

// The device-side step (inputs already in device memory, dropout's counter read from a device counter, the
// loss left on the device, hooks called as the step is enqueued) computes exactly what ComputeGradients
// computes for the same counter, for every model with its dropout and weight decay.
TEST(ModelTrainingTest, EnqueueGradientsEqualsComputeGradients) {
  for (const char* name : {"mlp", "cnn", "cifar10"}) {
    SCOPED_TRACE(name);
    auto dev = testing::MakeCpuDevice();
    ASSERT_NE(dev, nullptr);
    ModelOptions o;
    o.batch_size = 4;
    if (std::string(name) == "cifar10") {
      o.height = o.width = 24;
      o.channels = 3;
    }
    auto a = CreateModelByName(name, o, dev.get());
    auto b = CreateModelByName(name, o, dev.get());
    ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();
    const std::vector<float> params = InitialParameters((*a)->variables(), 3);
    ASSERT_TRUE((*a)->SetParameters(params.data()).ok());
    ASSERT_TRUE((*b)->SetParameters(params.data()).ok());
    const int64_t n = (*a)->num_parameters();
    const testing::OwnedBatch batch = testing::RandomBatch(o, 4, 11);
    auto counter = dev->MakeCounter(5);
    ASSERT_TRUE(counter.ok());
    for (int step = 5; step < 7; ++step) {
      auto want_loss = (*a)->ComputeGradients(batch.view(), step * 64 + 3);
      ASSERT_TRUE(want_loss.ok()) << want_loss.status();
      ASSERT_TRUE((*b)->CheckTrainingBatch(batch.view()).ok());
      ASSERT_TRUE(dev->CopyToDevice(batch.images.data(), (*b)->device_images(), batch.images.size()).ok());
      ASSERT_TRUE(dev->CopyToDevice(batch.labels.data(), (*b)->device_labels(), 4).ok());
      std::vector<std::pair<int64_t, int64_t>> waited, ready;
      int losses = 0;
      EnqueueHooks hooks;
      hooks.before_forward = [&](int64_t begin, int64_t end) {
        waited.emplace_back(begin, end);
        return absl::OkStatus();
      };
      hooks.loss_enqueued = [&] {
        ++losses;
        EXPECT_EQ(ready.size(), 0u) << "the loss comes before any gradient";
        return absl::OkStatus();
      };
      hooks.gradients_enqueued = [&](int64_t begin, int64_t end) {
        ready.emplace_back(begin, end);
        return absl::OkStatus();
      };
      ASSERT_TRUE((*b)->EnqueueGradients(**counter, 64, 3, &hooks).ok());
      ASSERT_TRUE((*counter)->Increment().ok());
      float loss = 0;
      ASSERT_TRUE(dev->CopyToHost((*b)->device_loss(), &loss, 1).ok());
      EXPECT_EQ(loss, *want_loss) << "step " << step;
      std::vector<float> ga(n), gb(n);
      ASSERT_TRUE(dev->CopyToHost((*a)->device_gradients(), ga.data(), n).ok());
      ASSERT_TRUE(dev->CopyToHost((*b)->device_gradients(), gb.data(), n).ok());
      EXPECT_EQ(ga, gb) << "step " << step;
      EXPECT_EQ(losses, 1);
      ASSERT_FALSE(waited.empty());
      EXPECT_EQ(waited.front().first, 0);
      EXPECT_EQ(waited.back().second, n);
      ASSERT_EQ(ready.size(), waited.size());
      EXPECT_EQ(ready.front().second, n) << "last layer first";
      EXPECT_EQ(ready.back().first, 0);
    }
    std::vector<float> p(n);
    ASSERT_TRUE(dev->CopyToHost((*b)->device_parameters(), p.data(), n).ok());
    EXPECT_EQ(p, params);
    testing::OwnedBatch bad = batch;
    bad.labels[2] = 10.0f;
    EXPECT_EQ((*b)->CheckTrainingBatch(bad.view()).code(), absl::StatusCode::kInvalidArgument);
    auto other = testing::MakeCpuDevice();
    auto foreign = other->MakeCounter(0);
    ASSERT_TRUE(foreign.ok());
    EXPECT_EQ((*b)->EnqueueGradients(**foreign, 64, 0).code(), absl::StatusCode::kInvalidArgument);
  }
}

}  // namespace
}  // namespace dtrain::models
