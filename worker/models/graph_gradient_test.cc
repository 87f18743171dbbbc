// Graph-level gradient checks of GraphNetwork (through GraphModel::TrainStep) on graphs that are not chains:
// residual Adds with BatchNorm, branches joined by Concat, a tensor read by several nodes (accumulated
// gradients, Add(x, x)), a Concat whose first input needs no gradient, transposing Reshapes, broadcasting Muls with a variable, depthwise and dilated
// convolutions, padded and ceil_mode pooling, smooth activations, and a dead branch. Every trainable variable's
// gradient is compared with central differences of the loss (BatchNorm's running statistics are state: their
// slots hold the change of the running statistics, checked separately against the batch statistics).
//
// Tolerance as in gradient_check_test.cc: |g - fd| <= 1e-3 + 32 ulp(loss) / (2h) + 5e-2 max(|g|, |fd|), with up
// to 10% of a variable's sampled coordinates allowed to cross a ReLU / max-pool kink.
#include <algorithm>
#include <cmath>
#include <functional>
#include <random>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "worker/models/graph.h"
#include "worker/models/graph_model.h"
#include "worker/models/test_util.h"

namespace dtrain::models {
namespace {

using kernels::Padding;
using kernels::WeightLayout;

Initializer Normal(float stddev) { return TruncatedNormal(stddev); }

VarSpec Var(const std::string& name, std::vector<int64_t> shape, float stddev = 0.3f) {
  return VarSpec(name, std::move(shape), Normal(stddev));
}

// A convolution node with explicit pads and an OIHW weight (the layout imported models keep).
Node ConvNode(const std::string& name, int k, int out_c, int pad, int stride = 1, int dilation = 1, int groups = 1,
              bool bias = true) {
  Node n = Node::Conv(name, k, k, out_c, Padding::kValid, stride);
  n.conv.explicit_padding = true;
  n.conv.pad_top = n.conv.pad_bottom = n.conv.pad_left = n.conv.pad_right = pad;
  n.conv.dilation_h = n.conv.dilation_w = dilation;
  n.conv.groups = groups;
  n.conv.weight_layout = WeightLayout::kOIHW;
  n.conv.has_bias = bias;
  return n;
}

std::vector<VarSpec> ConvVars(const std::string& name, int in_c, int out_c, int k, int groups = 1, bool bias = true) {
  std::vector<VarSpec> v = {Var(name + ".weight", {out_c, in_c / groups, k, k})};
  if (bias) v.push_back(Var(name + ".bias", {out_c}, 0.1f));
  return v;
}

std::vector<VarSpec> BnVars(const std::string& name, int c) {
  std::vector<VarSpec> v = {VarSpec(name + ".weight", {c}, Constant(1.0f)),
                            VarSpec(name + ".bias", {c}, Constant(0.1f)),
                            VarSpec(name + ".running_mean", {c}, Constant(0.0f), 0.0f, false),
                            VarSpec(name + ".running_var", {c}, Constant(1.0f), 0.0f, false)};
  return v;
}

Node Simple(Op op, const std::string& name) {
  Node n;
  n.op = op;
  n.name = name;
  return n;
}

Node Act(kernels::ActivationParams::Kind kind, const std::string& name) {
  Node n = Simple(Op::kActivation, name);
  n.activation.kind = kind;
  n.activation.alpha = 0.1f;
  n.activation.lo = -0.5f;
  n.activation.hi = 0.7f;
  return n;
}

Node Binary(kernels::BinaryOp op, const std::string& name) {
  Node n = Simple(Op::kBinary, name);
  n.binary = op;
  return n;
}

Node Flatten(const std::string& name, int64_t size) { return Node::Reshape(name, {size}, FlattenOrder::kChannelsFirst); }

Node DenseT(const std::string& name, int out) {
  Node n = Node::Dense(name, out);
  n.dense.weights_transposed = true;
  return n;
}

#define ADD(var, ...)                                        \
  do {                                                       \
    absl::StatusOr<int> added = b.Add(__VA_ARGS__);          \
    ASSERT_TRUE(added.ok()) << added.status();               \
    var = *added;                                            \
  } while (false)

// conv-bn-relu-conv-bn + residual Add, relu, global average pool, Gemm (transB).
void ResidualGraph(Graph* out) {
  GraphBuilder b("residual", TensorShape{{3, 6, 6}});
  int x = b.input(), h = 0, r = 0;
  ADD(h, ConvNode("conv0", 3, 4, 1, 1, 1, 1, false), {x}, ConvVars("conv0", 3, 4, 3, 1, false));
  ADD(h, Simple(Op::kBatchNorm, "bn0"), {h}, BnVars("bn0", 4));
  ADD(r, Node::Relu("relu0"), {h});
  ADD(h, ConvNode("conv1", 3, 4, 1), {r}, ConvVars("conv1", 4, 4, 3));
  ADD(h, Simple(Op::kBatchNorm, "bn1"), {h}, BnVars("bn1", 4));
  ADD(h, Binary(kernels::BinaryOp::kAdd, "add"), {h, r});
  ADD(h, Node::Relu("relu1"), {h});
  Node gap = Simple(Op::kAvgPool, "gap");
  gap.pool.window_h = gap.pool.window_w = 6;
  gap.pool.stride_h = gap.pool.stride_w = 1;
  gap.pool.explicit_padding = true;
  ADD(h, gap, {h});
  ADD(h, Flatten("flat", 4), {h});
  ADD(h, DenseT("fc", 5), {h}, {Var("fc.weight", {5, 4}), Var("fc.bias", {5}, 0.1f)});
  auto g = b.Finish(h, Loss::kSoftmaxCrossEntropy);
  ASSERT_TRUE(g.ok()) << g.status();
  *out = *g;
}

// Two branches (1x1 conv + sigmoid; dilated 3x3 conv + tanh) joined by Concat, a per-channel Mul by a variable,
// a padded ceil_mode average pool, LeakyRelu, a channels-first flatten and a Gemm.
void BranchGraph(Graph* out) {
  GraphBuilder b("branches", TensorShape{{3, 6, 6}});
  int x = b.input(), a = 0, c = 0, h = 0;
  ADD(a, ConvNode("conv_a", 1, 2, 0), {x}, ConvVars("conv_a", 3, 2, 1));
  ADD(a, Act(kernels::ActivationParams::Kind::kSigmoid, "sig"), {a});
  ADD(c, ConvNode("conv_b", 3, 3, 2, 1, 2), {x}, ConvVars("conv_b", 3, 3, 3));
  ADD(c, Act(kernels::ActivationParams::Kind::kTanh, "tanh"), {c});
  Node cat = Simple(Op::kConcat, "cat");
  cat.axis = 1;  // full axes: the channels
  ADD(h, cat, {a, c});
  ADD(h, Binary(kernels::BinaryOp::kMul, "scale"), {h}, {Var("scale", {5, 1, 1}, 1.0f)});
  Node pool = Simple(Op::kAvgPool, "pool");
  pool.pool.window_h = pool.pool.window_w = 3;
  pool.pool.stride_h = pool.pool.stride_w = 2;
  pool.pool.explicit_padding = true;
  pool.pool.pad_top = pool.pool.pad_left = 1;
  pool.pool.ceil_mode = true;
  pool.pool.count_include_pad = true;
  ADD(h, pool, {h});
  ADD(h, Act(kernels::ActivationParams::Kind::kLeakyRelu, "leaky"), {h});
  const int64_t flat = b.shape(h).size();
  ADD(h, Flatten("flat", flat), {h});
  ADD(h, DenseT("fc", 4), {h}, {Var("fc.weight", {4, flat}, 0.2f), Var("fc.bias", {4}, 0.1f)});
  auto g = b.Finish(h, Loss::kSoftmaxCrossEntropy);
  ASSERT_TRUE(g.ok()) << g.status();
  *out = *g;
}

// One tensor read by several nodes: t feeds Add(t, t), a Mul of two tensors and a Sub; a depthwise conv and a
// max pool with asymmetric pads; an unused branch (its variables get zero gradients).
void SharedGraph(Graph* out) {
  GraphBuilder b("shared", TensorShape{{2, 5, 5}});
  int x = b.input(), t = 0, u = 0, v = 0, h = 0, dead = 0;
  ADD(t, ConvNode("conv", 3, 4, 1), {x}, ConvVars("conv", 2, 4, 3));
  ADD(t, Act(kernels::ActivationParams::Kind::kTanh, "tanh"), {t});
  ADD(u, Binary(kernels::BinaryOp::kAdd, "twice"), {t, t});
  ADD(v, Binary(kernels::BinaryOp::kMul, "product"), {t, u});
  ADD(h, Binary(kernels::BinaryOp::kSub, "diff"), {v, t});
  ADD(h, ConvNode("depthwise", 3, 4, 1, 1, 1, /*groups=*/4), {h}, ConvVars("depthwise", 4, 4, 3, 4));
  Node pool = Node::MaxPool("pool", 2, 2, Padding::kValid);
  pool.pool.explicit_padding = true;
  pool.pool.pad_top = 1;
  pool.pool.pad_left = 0;
  pool.pool.pad_bottom = 0;
  pool.pool.pad_right = 1;
  ADD(h, pool, {h});
  ADD(dead, ConvNode("unused", 1, 2, 0), {t}, ConvVars("unused", 4, 2, 1));
  static_cast<void>(dead);  // nothing reads the unused branch: that is its point
  const int64_t flat = b.shape(h).size();
  ADD(h, Flatten("flat", flat), {h});
  ADD(h, Node::Dense("fc", 3), {h}, {Var("fc.weight", {flat, 3}, 0.2f), Var("fc.bias", {3}, 0.1f)});
  auto g = b.Finish(h, Loss::kSoftmaxCrossEntropy);
  ASSERT_TRUE(g.ok()) << g.status();
  *out = *g;
}

// A tensor read by two Concats (DLRM's bottom output feeds the interaction's stack and the top MLP), one of
// them followed by a view Reshape.
void TwoConcatsGraph(Graph* out) {
  GraphBuilder b("two_concats", TensorShape{{1, 2, 2}});
  int x = b.input(), bot = 0, e = 0, stack = 0, top = 0, h = 0;
  ADD(x, Flatten("flat_in", 4), {x});
  ADD(bot, Node::Dense("bottom", 3), {x}, {Var("bottom/w", {4, 3}), Var("bottom/b", {3}, 0.1f)});
  ADD(bot, Node::Relu("bottom/act"), {bot});
  ADD(e, Node::Dense("side", 3), {x}, {Var("side/w", {4, 3}), Var("side/b", {3}, 0.1f)});
  Node cat = Simple(Op::kConcat, "stack");
  cat.axis = 1;
  ADD(stack, cat, {bot, e});
  ADD(stack, Node::Reshape("rows", {2, 3}, FlattenOrder::kChannelsFirst), {stack});
  ADD(stack, Simple(Op::kInteraction, "dots"), {stack});
  Node cat2 = Simple(Op::kConcat, "top_in");
  cat2.axis = 1;
  ADD(top, cat2, {bot, stack});
  ADD(h, Node::Dense("fc", 3), {top}, {Var("fc/w", {4, 3}), Var("fc/b", {3}, 0.1f)});
  auto g = b.Finish(h, Loss::kSoftmaxCrossEntropy);
  ASSERT_TRUE(g.ok()) << g.status();
  *out = *g;
}

// A Concat whose first input needs no gradient (the data, beside a computed branch: a click-through-rate
// model's dense features beside its embeddings); the branch still gets its gradient.
void DataFirstConcatGraph(Graph* out) {
  GraphBuilder b("data_first_concat", TensorShape{{1, 2, 2}});
  int x = b.input(), side = 0, cat = 0, h = 0;
  ADD(x, Flatten("flat_in", 4), {x});
  ADD(side, Node::Dense("side", 3), {x}, {Var("side/w", {4, 3}), Var("side/b", {3}, 0.1f)});
  Node c = Simple(Op::kConcat, "cat");
  c.axis = 1;
  ADD(cat, c, {x, side});
  ADD(h, Node::Dense("fc", 3), {cat}, {Var("fc/w", {7, 3}), Var("fc/b", {3}, 0.1f)});
  auto g = b.Finish(h, Loss::kSoftmaxCrossEntropy);
  ASSERT_TRUE(g.ok()) << g.status();
  *out = *g;
}

struct GraphCase {
  std::string name;
  std::function<void(Graph*)> make;
  int batch;
  float step;
};

class GraphGradientTest : public ::testing::TestWithParam<GraphCase> {};

TEST_P(GraphGradientTest, TrainableGradientsMatchCentralDifferences) {
  const GraphCase& c = GetParam();
  Graph graph;
  c.make(&graph);
  if (::testing::Test::HasFatalFailure()) return;
  auto dev = testing::MakeCpuDevice();
  ASSERT_NE(dev, nullptr);
  ModelOptions o;
  o.batch_size = c.batch;
  o.channels = static_cast<int>(graph.input_shape().dims[0]);
  o.height = static_cast<int>(graph.input_shape().dims[1]);
  o.width = static_cast<int>(graph.input_shape().dims[2]);
  o.num_classes = static_cast<int>(graph.output_shape().size());
  const std::vector<VariableInfo> vars = graph.variables;
  auto model_or = GraphModel::Create(graph, o, dev.get());
  ASSERT_TRUE(model_or.ok()) << model_or.status();
  Model& model = **model_or;
  std::vector<float> params = InitialParameters(vars, 11);
  const testing::OwnedBatch batch = testing::RandomBatch(o, c.batch, 5);
  ASSERT_TRUE(model.SetParameters(params.data()).ok());
  std::vector<float> grads(params.size());
  auto loss0 = model.TrainStep(batch.view(), 3, grads.data());
  ASSERT_TRUE(loss0.ok()) << loss0.status();
  ASSERT_TRUE(std::isfinite(*loss0));

  auto loss_at = [&](int64_t i, float value) {
    const float saved = params[i];
    params[i] = value;
    EXPECT_TRUE(model.SetParameters(params.data()).ok());
    auto loss = model.ComputeGradients(batch.view(), 3);
    EXPECT_TRUE(loss.ok()) << loss.status();
    params[i] = saved;
    return loss.ok() ? static_cast<double>(*loss) : NAN;
  };
  const float ulp = std::nextafter(std::fabs(*loss0), INFINITY) - std::fabs(*loss0);
  const double abs_tol = 1e-3 + 32 * ulp / (2.0 * c.step);
  const std::vector<int64_t> offsets = Offsets(vars);
  std::mt19937_64 gen(17);
  for (size_t v = 0; v < vars.size(); ++v) {
    if (!vars[v].trainable) continue;
    const int64_t size = vars[v].size();
    const int samples = static_cast<int>(std::min<int64_t>(24, size));
    int failed = 0;
    std::string first;
    bool any_nonzero = false;
    for (int s = 0; s < samples; ++s) {
      const int64_t i = offsets[v] + (samples == size ? s : static_cast<int64_t>(gen() % size));
      const float plus = params[i] + c.step, minus = params[i] - c.step;
      const double fd = (loss_at(i, plus) - loss_at(i, minus)) / (static_cast<double>(plus) - minus);
      const double g = grads[i];
      any_nonzero = any_nonzero || g != 0.0;
      if (!(std::fabs(g - fd) <= abs_tol + 5e-2 * std::max(std::fabs(g), std::fabs(fd)))) {
        if (failed++ == 0) first = absl::StrCat("index ", i - offsets[v], ": analytic ", g, ", numeric ", fd);
      }
    }
    EXPECT_LE(failed, samples / 10) << c.name << " variable " << vars[v].name << ": " << failed << " of " << samples
                                    << " coordinates disagree; first: " << first;
    if (vars[v].name.rfind("unused", 0) == 0) {
      EXPECT_FALSE(any_nonzero) << vars[v].name << " is on a dead branch: its gradient must be zero";
    } else {
      EXPECT_TRUE(any_nonzero) << vars[v].name << ": an all-zero gradient";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Graphs, GraphGradientTest,
                         ::testing::Values(GraphCase{"residual", ResidualGraph, 4, 1e-2f},
                                           GraphCase{"branches", BranchGraph, 3, 2e-3f},
                                           GraphCase{"shared", SharedGraph, 3, 1e-2f},
                                           GraphCase{"two_concats", TwoConcatsGraph, 3, 1e-4f},
                                           GraphCase{"data_first_concat", DataFirstConcatGraph, 3, 1e-3f}),
                         [](const ::testing::TestParamInfo<GraphCase>& i) { return i.param.name; });

// The slots of BatchNorm's running statistics hold momentum * (running - batch statistic) after a training
// step, the batch variance unbiased (PyTorch's rule); evaluation reads the running statistics.
TEST(GraphNetworkBatchNormTest, RunningStatisticsChange) {
  GraphBuilder b("bn", TensorShape{{2, 3, 3}});
  int h = 0;
  Node bn = Simple(Op::kBatchNorm, "bn");
  bn.momentum = 0.25f;
  std::vector<VarSpec> vars = BnVars("bn", 2);
  vars[2].init = Constant(0.5f);
  vars[3].init = Constant(2.0f);
  {
    absl::StatusOr<int> added = b.Add(bn, {b.input()}, vars);
    ASSERT_TRUE(added.ok()) << added.status();
    h = *added;
  }
  absl::StatusOr<int> flat = b.Add(Flatten("flat", 18), {h});
  ASSERT_TRUE(flat.ok());
  absl::StatusOr<int> fc = b.Add(Node::Dense("fc", 2), {*flat}, {Var("fc.w", {18, 2}), Var("fc.b", {2})});
  ASSERT_TRUE(fc.ok());
  absl::StatusOr<Graph> g = b.Finish(*fc, Loss::kSoftmaxCrossEntropy);
  ASSERT_TRUE(g.ok()) << g.status();
  auto dev = testing::MakeCpuDevice();
  ModelOptions o;
  o.batch_size = 4;
  o.channels = 2;
  o.height = o.width = 3;
  o.num_classes = 2;
  auto model = GraphModel::Create(*g, o, dev.get());
  ASSERT_TRUE(model.ok()) << model.status();
  std::vector<float> params = InitialParameters(g->variables, 1), grads(params.size(), 7.0f);
  ASSERT_TRUE((*model)->SetParameters(params.data()).ok());
  const testing::OwnedBatch batch = testing::RandomBatch(o, 4, 9);
  ASSERT_TRUE((*model)->TrainStep(batch.view(), 0, grads.data()).ok());
  const std::vector<int64_t> offsets = Offsets(g->variables);
  for (int c = 0; c < 2; ++c) {
    double sum = 0, sq = 0;
    const int n = 4 * 9;
    for (int e = 0; e < 4; ++e) {
      for (int p = 0; p < 9; ++p) {
        const double x = batch.images[(e * 9 + p) * 2 + c];  // NHWC
        sum += x;
        sq += x * x;
      }
    }
    const double mean = sum / n, var = (sq - n * mean * mean) / (n - 1);
    EXPECT_NEAR(grads[offsets[2] + c], 0.25 * (0.5 - mean), 1e-5);
    EXPECT_NEAR(grads[offsets[3] + c], 0.25 * (2.0 - var), 1e-5);
  }
}

// An in-place ReLU (its input read by nobody else) computes what a ReLU whose input is also read elsewhere does.
TEST(GraphNetworkInPlaceTest, InPlaceReluMatchesACopy) {
  auto build = [](bool share, Graph* out) {
    GraphBuilder b("relu", TensorShape{{2, 4, 4}});
    int h = 0, r = 0, extra = 0;
    ADD(h, ConvNode("conv", 3, 3, 1), {b.input()}, ConvVars("conv", 2, 3, 3));
    ADD(r, Node::Relu("relu"), {h});
    if (share) {
      ADD(extra, Binary(kernels::BinaryOp::kMul, "zero"), {h}, {VarSpec("zero", {1}, Constant(0.0f), 0.0f, false)});
      ADD(r, Binary(kernels::BinaryOp::kAdd, "plus0"), {r, extra});
    }
    ADD(h, Flatten("flat", 48), {r});
    ADD(h, Node::Dense("fc", 3), {h}, {Var("fc.weight", {48, 3}, 0.2f), Var("fc.bias", {3}, 0.1f)});
    auto g = b.Finish(h, Loss::kSoftmaxCrossEntropy);
    ASSERT_TRUE(g.ok()) << g.status();
    *out = *g;
  };
  Graph plain, shared;
  build(false, &plain);
  build(true, &shared);
  if (HasFatalFailure()) return;
  auto dev = testing::MakeCpuDevice();
  ModelOptions o;
  o.batch_size = 3;
  o.channels = 2;
  o.height = o.width = 4;
  o.num_classes = 3;
  auto a = GraphModel::Create(plain, o, dev.get());
  auto s = GraphModel::Create(shared, o, dev.get());
  ASSERT_TRUE(a.ok() && s.ok());
  std::vector<float> pa = InitialParameters(plain.variables, 4), ps = InitialParameters(shared.variables, 4);
  // The shared graph's extra variable ("zero") sits after conv's: copy conv's and fc's values across.
  const std::vector<int64_t> oa = Offsets(plain.variables), os = Offsets(shared.variables);
  for (size_t v = 0; v < plain.variables.size(); ++v) {
    size_t w = 0;
    while (shared.variables[w].name != plain.variables[v].name) ++w;
    std::copy(pa.begin() + oa[v], pa.begin() + oa[v] + plain.variables[v].size(), ps.begin() + os[w]);
  }
  ASSERT_TRUE((*a)->SetParameters(pa.data()).ok());
  ASSERT_TRUE((*s)->SetParameters(ps.data()).ok());
  const testing::OwnedBatch batch = testing::RandomBatch(o, 3, 2);
  std::vector<float> ga(pa.size()), gs(ps.size());
  auto la = (*a)->TrainStep(batch.view(), 0, ga.data());
  auto ls = (*s)->TrainStep(batch.view(), 0, gs.data());
  ASSERT_TRUE(la.ok() && ls.ok());
  EXPECT_FLOAT_EQ(*la, *ls);
  for (size_t v = 0; v < plain.variables.size(); ++v) {
    size_t w = 0;
    while (shared.variables[w].name != plain.variables[v].name) ++w;
    for (int64_t k = 0; k < plain.variables[v].size(); ++k) {
      ASSERT_NEAR(ga[oa[v] + k], gs[os[w] + k], 1e-6) << plain.variables[v].name << "[" << k << "]";
    }
  }
}

}  // namespace
}  // namespace dtrain::models
