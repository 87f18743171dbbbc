// The import's forward pass against ONNX's reference outputs: each operator test Debian's libonnx-testdata ships
// (/usr/share/libonnx-testdata/data/node/test_*: model.onnx, test_data_set_0/{input,output}_K.pb) is imported,
// run by GraphNetwork on the CPU and compared with its outputs (|got - want| <= 1e-5 + 1e-5 |want|).
//
// dtrain feeds one input, the data, and keeps the batch as the first axis. So the harness turns the tests'
// further inputs (weights, biases, a Reshape's shape, Clip's bounds) into initializers with test_data_set_0's
// values. A test whose first axis is not a batch of examples (two equal-shape operands of Add) gets a batch axis
// of 1 in front ("lift"); a Concat of two inputs reads its second one as x0 * 0 + value1 ("tensorize"), so that
// both operands are tensors. Operator tests older than opset 11 whose operator has not changed since (the global
// pools, opset 1) are read as opset 11.
//
// A lifted test's axis attributes (axis, axes, perm) and axes inputs move up by one with its data.
//
// Not run here, because dtrain's conventions cannot express them: concatenation along the batch axis
// (test_concat_*_axis_0, 1-D concat), 1-D and 3-D pooling, uint8/int8 data, MaxPool with dilations or its
// Indices output, Gemm with transA or a bias per example (matrix_bias), MatMul of 3-D/4-D tensors whose second
// operand would be a weight with a batch of its own, Flatten at axis 0 (the batch moved off the first axis),
// Reshapes that move values across the batch axis (one_dim, reordered_all_dims, negative_extended_dims,
// allowzero), reductions over every axis (the batch's too), empty slices, Expand and Tile across the batch,
// tests whose defaults name the first axis (Split's default axis, Slice's default axes), and random dropout
// masks (test_training_dropout with ratio > 0).
#include <sys/stat.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "gtest/gtest.h"
#include "kernels/device.h"
#include "worker/models/graph.h"
#include "worker/models/graph_network.h"
#include "worker/models/onnx/onnx_constants.h"
#include "worker/models/onnx/onnx_import.h"

namespace dtrain::models::onnx {
namespace {

const char kNodeDir[] = "/usr/share/libonnx-testdata/data/node";

struct NodeCase {
  const char* name;
  bool training = false;   // a training forward (BatchNorm's batch statistics, dropout)
  bool lift = false;       // put a batch axis of 1 in front of the inputs and outputs
  bool tensorize = false;  // further inputs as x0 * 0 + value (Concat of two data inputs)
  double tolerance = 1e-5;
};

void PrintTo(const NodeCase& c, std::ostream* os) { *os << c.name; }

std::vector<NodeCase> Cases() {
  std::vector<NodeCase> cases = {
      // Conv: padding, strides, asymmetric pads, auto_pad.
      {"test_basic_conv_with_padding"}, {"test_basic_conv_without_padding"}, {"test_conv_with_autopad_same"},
      {"test_conv_with_strides_and_asymmetric_padding"}, {"test_conv_with_strides_no_padding"},
      {"test_conv_with_strides_padding"},
      // MaxPool and AveragePool: ceil_mode, pads, strides, same_upper/lower, count_include_pad.
      {"test_maxpool_2d_ceil"}, {"test_maxpool_2d_default"}, {"test_maxpool_2d_pads"},
      {"test_maxpool_2d_precomputed_pads"}, {"test_maxpool_2d_precomputed_same_upper"},
      {"test_maxpool_2d_precomputed_strides"}, {"test_maxpool_2d_same_lower"}, {"test_maxpool_2d_same_upper"},
      {"test_maxpool_2d_strides"},
      {"test_averagepool_2d_ceil"}, {"test_averagepool_2d_default"}, {"test_averagepool_2d_pads"},
      {"test_averagepool_2d_pads_count_include_pad"}, {"test_averagepool_2d_precomputed_pads"},
      {"test_averagepool_2d_precomputed_pads_count_include_pad"}, {"test_averagepool_2d_precomputed_same_upper"},
      {"test_averagepool_2d_precomputed_strides"}, {"test_averagepool_2d_same_lower"},
      {"test_averagepool_2d_same_upper"}, {"test_averagepool_2d_strides"},
      {"test_globalaveragepool"}, {"test_globalaveragepool_precomputed"}, {"test_globalmaxpool"},
      {"test_globalmaxpool_precomputed"},
      // Gemm (alpha, beta, transB, biases of every broadcast shape) and MatMul.
      {"test_gemm_alpha"}, {"test_gemm_beta"}, {"test_gemm_default_no_bias"}, {"test_gemm_default_scalar_bias"},
      {"test_gemm_default_single_elem_vector_bias"}, {"test_gemm_default_vector_bias"},
      {"test_gemm_default_zero_bias"}, {"test_gemm_transposeB"}, {"test_matmul_2d"},
      // Elementwise with broadcasting.
      {"test_add", false, true}, {"test_add_bcast"}, {"test_sub", false, true}, {"test_sub_bcast"},
      {"test_mul", false, true}, {"test_mul_bcast"}, {"test_mul_example", false, true},
      {"test_div", false, true}, {"test_div_bcast"},
      // Activations.
      {"test_relu"}, {"test_leakyrelu"}, {"test_leakyrelu_default"}, {"test_leakyrelu_example"},
      {"test_clip"}, {"test_clip_default_inbounds"}, {"test_clip_default_max"}, {"test_clip_default_min"},
      {"test_clip_example"}, {"test_clip_inbounds"}, {"test_clip_outbounds"}, {"test_clip_splitbounds"},
      {"test_sigmoid"}, {"test_sigmoid_example"}, {"test_tanh"}, {"test_tanh_example"},
      // BatchNormalization: inference, and training (output, running mean and variance; biased variance).
      {"test_batchnorm_epsilon"}, {"test_batchnorm_example"},
      {"test_batchnorm_epsilon_training_mode", true}, {"test_batchnorm_example_training_mode", true},
      {"test_lrn", false, false, false, 1e-5}, {"test_lrn_default"},
      {"test_flatten_axis1"}, {"test_flatten_default_axis"}, {"test_flatten_negative_axis3"},
      {"test_flatten_axis2"}, {"test_flatten_axis3"}, {"test_flatten_negative_axis1"},
      {"test_flatten_negative_axis2"},  // [N * k, ...]: the batch merged with the axes before
      {"test_reshape_extended_dims"}, {"test_reshape_negative_dim"}, {"test_reshape_reduced_dims"},
      {"test_reshape_reordered_last_dims"}, {"test_reshape_zero_and_negative_dim"}, {"test_reshape_zero_dim"},
      {"test_concat_2d_axis_1", false, true, true}, {"test_concat_2d_axis_negative_1", false, true, true},
      {"test_concat_3d_axis_1", false, true, true}, {"test_concat_3d_axis_2", false, true, true},
      {"test_concat_3d_axis_negative_1", false, true, true}, {"test_concat_3d_axis_negative_2", false, true, true},
      {"test_identity"},
      // Dropout: inference (identity), and training with ratio 0.
      {"test_dropout_default"}, {"test_dropout_default_ratio"}, {"test_dropout_default_mask"},
      {"test_dropout_default_mask_ratio"}, {"test_dropout_default_old"}, {"test_dropout_random_old"},
      {"test_training_dropout_zero_ratio", true}, {"test_training_dropout_zero_ratio_mask", true},
      // The activations of today's nets.
      {"test_erf"}, {"test_hardsigmoid"}, {"test_hardsigmoid_default"}, {"test_hardsigmoid_example"},
      {"test_hardswish"}, {"test_hardswish_expanded"}, {"test_sqrt"}, {"test_sqrt_example"},
      {"test_pow_bcast_scalar"},
      // Transpose (every permutation of a lifted [1, 2, 3, 4]).
      {"test_transpose_all_permutations_0", false, true}, {"test_transpose_all_permutations_1", false, true},
      {"test_transpose_all_permutations_2", false, true}, {"test_transpose_all_permutations_3", false, true},
      {"test_transpose_all_permutations_4", false, true}, {"test_transpose_all_permutations_5", false, true},
      // Softmax and LogSoftmax along every axis (opset 13), and their expansions into ReduceMax, Sub, Exp...
      {"test_softmax_axis_0", false, true}, {"test_softmax_axis_1", false, true}, {"test_softmax_axis_2", false, true},
      {"test_softmax_default_axis", false, true}, {"test_softmax_example", false, true},
      {"test_softmax_large_number", false, true}, {"test_softmax_negative_axis", false, true},
      {"test_logsoftmax_axis_0", false, true}, {"test_logsoftmax_axis_1", false, true},
      {"test_logsoftmax_axis_2", false, true}, {"test_logsoftmax_default_axis", false, true},
      {"test_logsoftmax_example_1", false, true}, {"test_logsoftmax_large_number", false, true},
      {"test_logsoftmax_negative_axis", false, true},
      // LayerNormalization (opset 17) over the trailing axes from each axis, and its expansion.
      {"test_layer_normalization_2d_axis0", false, true}, {"test_layer_normalization_2d_axis1", false, true},
      {"test_layer_normalization_2d_axis_negative_1", false, true},
      {"test_layer_normalization_3d_axis0_epsilon", false, true},
      {"test_layer_normalization_3d_axis1_epsilon", false, true},
      {"test_layer_normalization_3d_axis2_epsilon", false, true},
      {"test_layer_normalization_4d_axis0", false, true}, {"test_layer_normalization_4d_axis1", false, true},
      {"test_layer_normalization_4d_axis2", false, true}, {"test_layer_normalization_4d_axis3", false, true},
      {"test_layer_normalization_4d_axis_negative_2", false, true},
      {"test_layer_normalization_default_axis", false, true},
      // Reductions over axes past the batch's, with and without keepdims.
      {"test_reduce_mean_keepdims_example"}, {"test_reduce_mean_keepdims_random"},
      {"test_reduce_mean_do_not_keepdims_example"}, {"test_reduce_mean_do_not_keepdims_random"},
      {"test_reduce_mean_negative_axes_keepdims_random"}, {"test_reduce_max_keepdims_random"},
      {"test_reduce_max_do_not_keepdims_random"}, {"test_reduce_max_negative_axes_keepdims_random"},
      {"test_reduce_sum_keepdims_random"}, {"test_reduce_sum_do_not_keepdims_random"},
      // Gather, Slice, Split, Squeeze and Unsqueeze of tensors (lifted where they read the first axis).
      {"test_gather_0", false, true}, {"test_gather_1"}, {"test_gather_2d_indices"},
      {"test_slice", false, true}, {"test_slice_neg"}, {"test_slice_negative_axes", false, true},
      {"test_slice_end_out_of_bounds"}, {"test_split_equal_parts_2d"}, {"test_split_variable_parts_2d"},
      {"test_squeeze", false, true}, {"test_squeeze_negative_axes"},
      {"test_unsqueeze_axis_0", false, true}, {"test_unsqueeze_axis_1"}, {"test_unsqueeze_axis_2"},
      {"test_unsqueeze_axis_3"}, {"test_unsqueeze_negative_axes"}, {"test_unsqueeze_three_axes"},
      {"test_unsqueeze_two_axes"}, {"test_unsqueeze_unsorted_axes"},
  };
  return cases;
}

bool HaveTestData() {
  struct stat st;
  return ::stat(kNodeDir, &st) == 0;
}

::onnx::TensorProto ReadTensor(const std::string& path) {
  absl::StatusOr<std::string> bytes = ReadFileToString(path);
  ::onnx::TensorProto t;
  EXPECT_TRUE(bytes.ok()) << bytes.status();
  if (bytes.ok()) {
    EXPECT_TRUE(t.ParseFromString(*bytes)) << path;
  }
  return t;
}

std::vector<float> Floats(const ::onnx::TensorProto& t) {
  absl::StatusOr<ConstRef> c = DecodeTensor(t, t.name());
  EXPECT_TRUE(c.ok()) << c.status();
  if (!c.ok() || (*c)->type != Const::Type::kFloat) return {};
  return *(*c)->floats;
}

void PrependOne(::onnx::TypeProto* type) {
  auto* shape = type->mutable_tensor_type()->mutable_shape();
  shape->add_dim();
  for (int k = shape->dim_size() - 1; k > 0; --k) shape->mutable_dim()->SwapElements(k, k - 1);
  shape->mutable_dim(0)->set_dim_value(1);
}

// The test's model rewritten as the class comment says; `inputs` are test_data_set_0's inputs, in order.
::onnx::ModelProto Prepare(const NodeCase& c, ::onnx::ModelProto m, const std::vector<::onnx::TensorProto>& inputs) {
  ::onnx::GraphProto* g = m.mutable_graph();
  for (auto& o : *m.mutable_opset_import()) {
    if ((o.domain().empty() || o.domain() == "ai.onnx") && o.version() < 11) o.set_version(11);
  }
  const int rank0 = g->input(0).type().tensor_type().shape().dim_size();
  if (c.lift) {
    PrependOne(g->mutable_input(0)->mutable_type());
    for (auto& out : *g->mutable_output()) PrependOne(out.mutable_type());
    // Axes past the new one move up by one (negative ones count from the end and stay).
    for (auto& n : *g->mutable_node()) {
      for (auto& a : *n.mutable_attribute()) {
        if (a.name() == "axis" && a.i() >= 0) a.set_i(a.i() + 1);
        if (a.name() == "axes") {
          for (auto& x : *a.mutable_ints()) x = x >= 0 ? x + 1 : x;
        }
        if (a.name() == "perm") {
          for (auto& x : *a.mutable_ints()) ++x;
          a.mutable_ints()->Add(0);
          for (int k = a.ints_size() - 1; k > 0; --k) a.mutable_ints()->SwapElements(k, k - 1);
        }
      }
    }
  }
  // Further inputs: initializers (lifted along with the data when they have its rank).
  std::vector<::onnx::NodeProto> front;
  for (int k = g->input_size() - 1; k >= 1; --k) {
    const std::string name = g->input(k).name();
    ::onnx::TensorProto t = inputs[k];
    // An axes input (Squeeze, Unsqueeze, ReduceSum from opset 13, Slice's input 3) moves with a lift too.
    bool axes_input = false;
    for (const auto& n : g->node()) {
      for (int j = 0; j < n.input_size(); ++j) {
        if (n.input(j) != name) continue;
        axes_input = axes_input || (j == 1 && (n.op_type() == "Squeeze" || n.op_type() == "Unsqueeze" ||
                                                n.op_type() == "ReduceSum")) ||
                     (j == 3 && n.op_type() == "Slice");
      }
    }
    if (c.lift && axes_input) {
      for (auto& x : *t.mutable_int64_data()) x = x >= 0 ? x + 1 : x;
      if (t.has_raw_data()) {
        std::string raw = t.raw_data();
        for (size_t b = 0; b + 8 <= raw.size(); b += 8) {
          int64_t x;
          std::memcpy(&x, raw.data() + b, 8);
          if (x >= 0) ++x;
          std::memcpy(raw.data() + b, &x, 8);
        }
        t.set_raw_data(raw);
      }
    } else if (c.lift && t.dims_size() == rank0) {
      t.add_dims(1);
      for (int d = t.dims_size() - 1; d > 0; --d) t.mutable_dims()->SwapElements(d, d - 1);
    }
    t.set_name(c.tensorize ? name + "_value" : name);
    *g->add_initializer() = t;
    g->mutable_input()->DeleteSubrange(k, 1);
    if (c.tensorize) {
      ::onnx::NodeProto mul, add;
      mul.set_op_type("Mul");
      mul.add_input(g->input(0).name());
      mul.add_input("zero");
      mul.add_output(name + "_zeros");
      add.set_op_type("Add");
      add.add_input(name + "_zeros");
      add.add_input(name + "_value");
      add.add_output(name);
      front.push_back(mul);
      front.push_back(add);
    }
  }
  if (!front.empty()) {
    ::onnx::NodeProto zero;
    zero.set_op_type("Constant");
    zero.add_output("zero");
    auto* a = zero.add_attribute();
    a->set_name("value_float");
    a->set_type(::onnx::AttributeProto::FLOAT);
    a->set_f(0.0f);
    front.insert(front.begin(), zero);
    ::onnx::GraphProto copy = *g;
    g->clear_node();
    for (const auto& n : front) *g->add_node() = n;
    for (const auto& n : copy.node()) *g->add_node() = n;
  }
  return m;
}

// NCHW (logical) <-> NHWC (stored) for per-example rank 3 (`dims` the logical N, C, H, W); other ranks as they are.
std::vector<float> Relayout(const std::vector<float>& in, const std::vector<int64_t>& dims, bool to_stored) {
  if (dims.size() != 4) return in;
  const int64_t n = dims[0], c = dims[1], hw = dims[2] * dims[3];
  std::vector<float> out(in.size());
  for (int64_t b = 0; b < n; ++b)
    for (int64_t ch = 0; ch < c; ++ch)
      for (int64_t i = 0; i < hw; ++i) {
        const int64_t logical = (b * c + ch) * hw + i, stored = (b * hw + i) * c + ch;
        out[to_stored ? stored : logical] = in[to_stored ? logical : stored];
      }
  return out;
}

void ExpectNear(const std::vector<float>& got, const std::vector<float>& want, double tol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!(std::fabs(got[i] - want[i]) <= tol + tol * std::fabs(want[i]))) {
      if (++bad <= 5) ADD_FAILURE() << what << "[" << i << "]: got " << got[i] << ", want " << want[i];
    }
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << got.size() << " values differ";
}

class OnnxNodeTest : public ::testing::TestWithParam<NodeCase> {};

TEST_P(OnnxNodeTest, MatchesReferenceOutputs) {
  if (!HaveTestData()) GTEST_SKIP() << kNodeDir << " is missing (apt-get install libonnx-testdata)";
  const NodeCase& c = GetParam();
  const std::string dir = absl::StrCat(kNodeDir, "/", c.name);
  absl::StatusOr<std::string> bytes = ReadFileToString(dir + "/model.onnx");
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  ::onnx::ModelProto model;
  ASSERT_TRUE(model.ParseFromString(*bytes));
  std::vector<::onnx::TensorProto> inputs, outputs;
  for (int k = 0; k < model.graph().input_size(); ++k) {
    inputs.push_back(ReadTensor(absl::StrCat(dir, "/test_data_set_0/input_", k, ".pb")));
  }
  for (int k = 0; k < model.graph().output_size(); ++k) {
    outputs.push_back(ReadTensor(absl::StrCat(dir, "/test_data_set_0/output_", k, ".pb")));
  }
  const ::onnx::ModelProto prepared = Prepare(c, model, inputs);

  ImportOptions io;
  io.forward_only = true;
  io.bn_unbiased_running_var = false;  // ONNX's reference updates running_var with the biased variance
  absl::StatusOr<ModelRef> spec = ImportModelFromBytes(prepared.SerializeAsString(), c.name, io);
  ASSERT_TRUE(spec.ok()) << spec.status();

  std::vector<int64_t> in_dims(inputs[0].dims().begin(), inputs[0].dims().end());
  if (c.lift) in_dims.insert(in_dims.begin(), 1);
  const int batch = static_cast<int>(in_dims[0]);
  ModelOptions mo;
  int64_t per_example = 1;
  for (size_t k = 1; k < in_dims.size(); ++k) per_example *= in_dims[k];
  if (in_dims.size() == 4) {
    mo.channels = static_cast<int>(in_dims[1]), mo.height = static_cast<int>(in_dims[2]);
    mo.width = static_cast<int>(in_dims[3]);
  } else {
    mo.channels = static_cast<int>(per_example), mo.height = mo.width = 1;
  }
  absl::StatusOr<Graph> graph = (*spec)->build_graph(mo);
  ASSERT_TRUE(graph.ok()) << graph.status();

  absl::StatusOr<std::unique_ptr<kernels::Device>> dev = kernels::CreateDevice(kernels::DeviceSpec::Cpu(1));
  ASSERT_TRUE(dev.ok()) << dev.status();
  const int64_t num_params = std::max<int64_t>(1, TotalSize(graph->variables));
  std::vector<float> params = InitialParameters(graph->variables, 1);
  params.resize(num_params);
  std::vector<float> grads(num_params, 0.0f);
  absl::StatusOr<std::unique_ptr<GraphNetwork>> net =
      GraphNetwork::Create(dev->get(), *graph, batch, c.training, params.data(), c.training ? grads.data() : nullptr);
  ASSERT_TRUE(net.ok()) << net.status();
  const std::vector<float> x = Relayout(Floats(inputs[0]), in_dims, /*to_stored=*/true);
  ASSERT_EQ(static_cast<int64_t>(x.size()), batch * per_example);
  ASSERT_TRUE((*dev)->CopyToDevice(x.data(), (*net)->input(), static_cast<int64_t>(x.size())).ok());
  absl::Status ran = (*net)->Forward(c.training, /*seed=*/1, /*step=*/0);
  ASSERT_TRUE(ran.ok()) << ran;

  std::vector<int64_t> out_dims(outputs[0].dims().begin(), outputs[0].dims().end());
  if (c.lift) out_dims.insert(out_dims.begin(), 1);
  const std::vector<float> want = Floats(outputs[0]);
  std::vector<float> got(want.size());
  ASSERT_EQ(static_cast<int64_t>(got.size()), batch * (*net)->output_size_per_example());
  ASSERT_TRUE((*dev)->CopyToHost((*net)->output(), got.data(), static_cast<int64_t>(got.size())).ok());
  // The output is stored NHWC when the graph made it an image (every rank-4 output of a convolution or pool).
  ExpectNear(graph->output_shape().is_image() ? Relayout(got, out_dims, /*to_stored=*/false) : got, want, c.tolerance,
             "output 0");

  // BatchNormalization in training: outputs 1 and 2 are the running mean and variance after the update, i.e.
  // the variables minus the change written to their gradient slots (what the ps applies).
  if (c.training && model.graph().node(0).op_type() == "BatchNormalization") {
    const std::vector<int64_t> offsets = graph->variable_offsets();
    for (int k = 1; k <= 2; ++k) {
      const int v = k + 1;  // scale, bias, mean, var
      std::vector<float> updated(graph->variables[v].size());
      for (size_t j = 0; j < updated.size(); ++j) updated[j] = params[offsets[v] + j] - grads[offsets[v] + j];
      ExpectNear(updated, Floats(outputs[k]), c.tolerance, absl::StrCat("output ", k));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Operators, OnnxNodeTest, ::testing::ValuesIn(Cases()),
                         [](const ::testing::TestParamInfo<NodeCase>& i) { return std::string(i.param.name); });

}  // namespace
}  // namespace dtrain::models::onnx
