// Registry, layout, initialization and signature tests (no device needed except where a model is built).
#include "worker/models/model.h"

#include <cmath>

#include "gtest/gtest.h"
#include "worker/models/test_util.h"

namespace dtrain::models {
namespace {

int64_t Count(const std::string& name, const ModelOptions& o) {
  auto vars = ModelVariablesByName(name, o);
  EXPECT_TRUE(vars.ok()) << vars.status();
  return vars.ok() ? TotalSize(*vars) : -1;
}

TEST(ModelVariablesTest, ParameterCounts) {
  // mlp: 784*500 + 500 + 500*10 + 10.
  EXPECT_EQ(Count("mlp", {}), 397510);
  // cnn: 5*5*1*32+32 + 5*5*32*64+64 + 3136*1024+1024 + 1024*10+10.
  EXPECT_EQ(Count("cnn", {}), 3274634);
  // convnet on 28x28x1: conv1 5*5*1*64+64 = 1,664; conv2 3*3*64*256+256 = 147,712;
  // conv3 3*3*256*512+512 = 1,180,160; fc1 (4*4*512=8192)*2048+2048 = 16,779,264;
  // fc2 2048*1024+1024 = 2,098,176; fc3 1024*10+10 = 10,250. Total 20,217,226.
  EXPECT_EQ(Count("convnet", {}), 20217226);
  // cifar10 on 24x24x3: 4,864 + 102,464 + (6*6*64=2304)*384+384 + 384*192+192 + 192*10+10 (TF's tutorial).
  ModelOptions cifar;
  cifar.height = cifar.width = 24;
  cifar.channels = 3;
  EXPECT_EQ(Count("cifar10", cifar), 1068298);
}

TEST(ModelVariablesTest, NamesShapesAndDecay) {
  auto vars = ModelVariablesByName("mlp", {});
  ASSERT_TRUE(vars.ok()) << vars.status();
  ASSERT_EQ(vars->size(), 4u);
  EXPECT_EQ((*vars)[0].name, "hidden1/weights");
  EXPECT_EQ((*vars)[0].shape, (std::vector<int64_t>{784, 500}));
  EXPECT_FLOAT_EQ((*vars)[0].weight_decay, 1e-4f);
  EXPECT_FLOAT_EQ((*vars)[0].init.stddev, 1.0f / 28.0f);
  EXPECT_EQ((*vars)[1].name, "hidden1/biases");
  EXPECT_EQ((*vars)[3].name, "softmax_linear/biases");
  EXPECT_EQ(Offsets(*vars), (std::vector<int64_t>{0, 392000, 392500, 397500}));

  ModelOptions o;
  o.height = o.width = 24;
  o.channels = 3;
  auto cifar = ModelVariablesByName("cifar10", o);
  ASSERT_TRUE(cifar.ok()) << cifar.status();
  EXPECT_EQ((*cifar)[0].name, "conv1/weights");
  EXPECT_EQ((*cifar)[0].shape, (std::vector<int64_t>{5, 5, 3, 64}));  // HWIO
  EXPECT_EQ((*cifar)[3].init.value, 0.1f);                              // conv2/biases
  EXPECT_EQ((*cifar)[4].name, "local3/weights");
  EXPECT_EQ((*cifar)[4].shape, (std::vector<int64_t>{2304, 384}));
  EXPECT_FLOAT_EQ((*cifar)[4].weight_decay, 0.004f);
  EXPECT_EQ((*cifar)[0].weight_decay, 0.0f);
}

TEST(ModelVariablesTest, RejectsUnknownNamesAndSmallInputs) {
  auto bad = ModelVariablesByName("resnet", {});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("mlp, cnn, convnet, cifar10"), std::string::npos) << bad.status();

  ModelOptions small;
  small.height = small.width = 14;  // convnet's VALID pools need >= 16x16
  auto too_small = ModelVariablesByName("convnet", small);
  ASSERT_FALSE(too_small.ok());
  EXPECT_EQ(too_small.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(too_small.status().message().find("too small"), std::string::npos) << too_small.status();
  small.height = small.width = 16;
  EXPECT_TRUE(ModelVariablesByName("convnet", small).ok());

  auto dev = testing::MakeCpuDevice();
  ASSERT_NE(dev, nullptr);
  auto unknown = CreateModelByName("lenet", {}, dev.get());
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  ModelOptions no_batch;
  no_batch.batch_size = 0;
  EXPECT_EQ(CreateModelByName("mlp", no_batch, dev.get()).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(InitialParametersTest, TruncatedNormalAndConstants) {
  auto vars = ModelVariablesByName("mlp", {});
  ASSERT_TRUE(vars.ok());
  const std::vector<float> p = InitialParameters(*vars, 42);
  ASSERT_EQ(static_cast<int64_t>(p.size()), TotalSize(*vars));
  const float stddev = 1.0f / 28.0f;
  double sum = 0, sum2 = 0;
  const int64_t n = (*vars)[0].size();
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_LE(std::fabs(p[i]), 2.0f * stddev + 1e-7f) << "at " << i;
    sum += p[i];
    sum2 += static_cast<double>(p[i]) * p[i];
  }
  const double mean = sum / n, sd = std::sqrt(sum2 / n - mean * mean);
  EXPECT_NEAR(mean, 0.0, 0.01 * stddev);  // 7 standard errors
  // A normal truncated at two standard deviations has stddev 0.8796 * sigma.
  EXPECT_NEAR(sd / stddev, 0.8796, 0.01);
  for (int64_t i = n; i < n + 500; ++i) EXPECT_EQ(p[i], 0.0f);  // hidden1/biases

  ModelOptions o;
  auto cnn = ModelVariablesByName("cnn", o);
  ASSERT_TRUE(cnn.ok());
  const std::vector<float> c = InitialParameters(*cnn, 1);
  EXPECT_EQ(c[5 * 5 * 32], 0.1f);  // conv1/biases[0]
}

TEST(InitialParametersTest, DeterministicInSeed) {
  auto vars = ModelVariablesByName("cnn", {});
  ASSERT_TRUE(vars.ok());
  EXPECT_EQ(InitialParameters(*vars, 7), InitialParameters(*vars, 7));
  EXPECT_NE(InitialParameters(*vars, 7), InitialParameters(*vars, 8));
  // Variables draw from separate streams: conv1 and conv2 weights do not start with the same values.
  const std::vector<float> p = InitialParameters(*vars, 7);
  const std::vector<int64_t> off = Offsets(*vars);
  EXPECT_NE(p[off[0]] / (*vars)[0].init.stddev, p[off[2]] / (*vars)[2].init.stddev);
}

TEST(SignatureTest, NamesShapesAndChangesWithShapes) {
  auto mlp = ModelVariablesByName("mlp", {});
  ASSERT_TRUE(mlp.ok());
  const std::string sig = Signature("mlp", *mlp);
  EXPECT_EQ(sig.rfind("mlp/v1/784x500,500,500x10,10/", 0), 0u) << sig;
  EXPECT_EQ(sig, Signature("mlp", *mlp));

  ModelOptions o;
  o.num_classes = 11;
  auto mlp11 = ModelVariablesByName("mlp", o);
  ASSERT_TRUE(mlp11.ok());
  EXPECT_NE(Signature("mlp", *mlp11), sig);
  EXPECT_NE(Signature("cnn", *mlp), sig);
  std::vector<VariableInfo> renamed = *mlp;
  renamed[0].name = "fc/weights";
  EXPECT_NE(Signature("mlp", renamed), sig);  // same shapes, other names: the hash differs
}

TEST(DefaultsTest, SeedsDefaults) {
  EXPECT_EQ(DefaultsByName("mlp").optimizer, "sgd");
  EXPECT_EQ(DefaultsByName("mlp").batch_size, 100);
  EXPECT_EQ(DefaultsByName("cnn").optimizer, "adam");
  EXPECT_FLOAT_EQ(DefaultsByName("cnn").learning_rate, 1e-4f);
  EXPECT_EQ(DefaultsByName("cnn").batch_size, 50);
  EXPECT_EQ(DefaultsByName("convnet").optimizer, "adam");
  EXPECT_FLOAT_EQ(DefaultsByName("convnet").learning_rate, 1e-3f);
  EXPECT_EQ(DefaultsByName("cifar10").batch_size, 128);
  EXPECT_FLOAT_EQ(DefaultsByName("cifar10").learning_rate, 0.1f);
}

// What used to be special-cased for cifar10 in the training loop now comes from the model's definition.
TEST(DefaultsTest, InputPipelineAndScheduleComeFromTheModel) {
  const ModelDefaults cifar = DefaultsByName("cifar10");
  EXPECT_EQ(cifar.train_preprocess, data::Preprocess::kCifarTrain);
  EXPECT_EQ(cifar.eval_preprocess, data::Preprocess::kCifarEval);
  EXPECT_EQ(cifar.crop_height, 24);
  EXPECT_EQ(cifar.data_channels, 3);
  ModelOptions o;
  SetInputGeometry(cifar, 32, 32, 3, &o);
  EXPECT_EQ(o.height, 24);
  EXPECT_EQ(o.width, 24);
  EXPECT_EQ(o.channels, 3);
  // The tutorial's schedule: x0.1 every 350 epochs, staircase; 50,000 examples at batch 128 = 390
  // steps/epoch.
  EXPECT_EQ(DefaultDecaySteps(cifar, 50000, 128), 390 * 350);
  EXPECT_FLOAT_EQ(cifar.decay_rate, 0.1f);
  EXPECT_TRUE(cifar.staircase);
  EXPECT_EQ(DefaultDecaySteps(cifar, 10, 128), 350) << "at least one step per epoch";

  for (const char* name : {"mlp", "cnn", "convnet"}) {
    SCOPED_TRACE(name);
    const ModelDefaults d = DefaultsByName(name);
    EXPECT_EQ(d.train_preprocess, data::Preprocess::kScale01);
    EXPECT_EQ(d.eval_preprocess, data::Preprocess::kScale01);
    EXPECT_EQ(DefaultDecaySteps(d, 60000, 50), 0);
    ModelOptions m;
    SetInputGeometry(d, 28, 28, 1, &m);
    EXPECT_EQ(m.height, 28);
    EXPECT_EQ(m.width, 28);
    EXPECT_EQ(m.channels, 1);
  }
}

}  // namespace
}  // namespace dtrain::models
