// The importer on models written here (worker/models/onnx/onnx_test_util.h): what becomes of initializers,
// inputs, heads and shape arithmetic; the geometry and class checks; every refusal's exact one-line message;
// external data read, and every bad one refused; and the time to import a 20 M-parameter file.
#include "worker/models/onnx/onnx_import.h"

#include <openssl/evp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "common/testing/scratch_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/device.h"
#include "worker/models/graph.h"
#include "worker/models/model.h"
#include "worker/models/onnx/onnx_file.h"
#include "worker/models/onnx/onnx_test_util.h"

namespace dtrain::models::onnx {
namespace {

using ::testing::HasSubstr;
using testing::FloatAttr;
using testing::IntAttr;
using testing::IntsAttr;
using testing::OnnxBuilder;
using testing::Ramp;
using testing::StringAttr;

const std::string kHint = kExportHint;

// fc1 (Gemm, transB) -> Relu -> fc2 (Gemm) on a flat [N, 784] input, as PyTorch exports an MLP.
OnnxBuilder Mlp() {
  OnnxBuilder b;
  b.Input("x", {-1, 784})
      .Initializer("fc1.weight", {32, 784}, Ramp(32 * 784))
      .Initializer("fc1.bias", {32}, Ramp(32))
      .Initializer("fc2.weight", {10, 32}, Ramp(320))
      .Initializer("fc2.bias", {10}, Ramp(10))
      .Node("Gemm", {"x", "fc1.weight", "fc1.bias"}, {"h"}, {IntAttr("transB", 1)}, "/fc1/Gemm")
      .Node("Relu", {"h"}, {"r"}, {}, "/Relu")
      .Node("Gemm", {"r", "fc2.weight", "fc2.bias"}, {"logits"}, {IntAttr("transB", 1)}, "/fc2/Gemm")
      .Output("logits", {-1, 10});
  return b;
}

// Conv -> BatchNormalization (training) -> Relu -> MaxPool -> x.view(x.size(0), -1) -> Gemm -> Softmax, as
// PyTorch exports it in training mode without constant folding.
OnnxBuilder Cnn() {
  OnnxBuilder b;
  b.Input("x", {-1, 1, 28, 28})
      .Initializer("conv.weight", {4, 1, 3, 3}, Ramp(36))
      .Initializer("conv.bias", {4}, Ramp(4))
      .Initializer("bn.weight", {4}, {1, 1, 1, 1})
      .Initializer("bn.bias", {4}, {0, 0, 0, 0})
      .Initializer("bn.running_mean", {4}, {0, 0, 0, 0})
      .Initializer("bn.running_var", {4}, {1, 1, 1, 1})
      .Initializer("fc.weight", {10, 784}, Ramp(7840))
      .Initializer("fc.bias", {10}, Ramp(10))
      .Node("Conv", {"x", "conv.weight", "conv.bias"}, {"c"},
            {IntsAttr("kernel_shape", {3, 3}), IntsAttr("pads", {1, 1, 1, 1}), IntsAttr("strides", {1, 1})},
            "/conv/Conv")
      .Node("BatchNormalization", {"c", "bn.weight", "bn.bias", "bn.running_mean", "bn.running_var"},
            {"n", "bn_mean_out", "bn_var_out"},
            {FloatAttr("epsilon", 1e-5f), FloatAttr("momentum", 0.9f), IntAttr("training_mode", 1)},
            "/bn/BatchNormalization")
      .Node("Relu", {"n"}, {"r"}, {}, "/Relu")
      .Node("MaxPool", {"r"}, {"p"}, {IntsAttr("kernel_shape", {2, 2}), IntsAttr("strides", {2, 2})}, "/MaxPool")
      .Node("Shape", {"p"}, {"shape"}, {}, "/Shape")
      .Constant(testing::IntTensor("zero", {}, {0}))
      .Node("Gather", {"shape", "zero"}, {"batch"}, {IntAttr("axis", 0)}, "/Gather")
      .Constant(testing::IntTensor("axes", {1}, {0}))
      .Node("Unsqueeze", {"batch", "axes"}, {"batch1"}, {}, "/Unsqueeze")
      .Constant(testing::IntTensor("minus_one", {1}, {-1}))
      .Node("Concat", {"batch1", "minus_one"}, {"new_shape"}, {IntAttr("axis", 0)}, "/Concat")
      .Node("Reshape", {"p", "new_shape"}, {"flat"}, {}, "/Reshape")
      .Node("Gemm", {"flat", "fc.weight", "fc.bias"}, {"logits"}, {IntAttr("transB", 1)}, "/fc/Gemm")
      .Node("Softmax", {"logits"}, {"probs"}, {IntAttr("axis", 1)}, "/Softmax")
      .Output("probs", {-1, 10});
  return b;
}

ModelOptions Images(int c, int h, int w, int classes = 10) {
  ModelOptions o;
  o.channels = c, o.height = h, o.width = w, o.num_classes = classes;
  return o;
}

absl::StatusOr<ModelRef> Import(const OnnxBuilder& b, const std::string& file = "model.onnx",
                                const ImportOptions& o = {}) {
  return ImportModelFromBytes(b.Bytes(), file, o);
}

// The message of an import (or of build_graph for 28x28x1 images when the import succeeds).
std::string Refusal(const OnnxBuilder& b, const std::string& file = "model.onnx") {
  absl::StatusOr<ModelRef> spec = Import(b, file);
  if (!spec.ok()) return std::string(spec.status().message());
  absl::StatusOr<Graph> g = (*spec)->build_graph(Images(1, 28, 28));
  return g.ok() ? std::string("(accepted)") : std::string(g.status().message());
}

TEST(OnnxImportTest, InitializersBecomeVariablesUnderTheirNamesWithTheFilesValues) {
  absl::StatusOr<ModelRef> spec = Import(Mlp(), "/models/mlp.onnx");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ((*spec)->name, "mlp");
  EXPECT_EQ((*spec)->path, "/models/mlp.onnx");
  EXPECT_TRUE((*spec)->imported());
  EXPECT_EQ((*spec)->defaults.optimizer, "pytorch_adam");
  EXPECT_EQ((*spec)->defaults.batch_size, 100);
  absl::StatusOr<std::vector<VariableInfo>> vars = ModelVariables(**spec, Images(1, 28, 28));
  ASSERT_TRUE(vars.ok()) << vars.status();
  ASSERT_EQ(vars->size(), 4u);
  EXPECT_EQ((*vars)[0].name, "fc1.weight");
  EXPECT_EQ((*vars)[0].shape, std::vector<int64_t>({32, 784}));  // ONNX's layout, [out, in] (transB = 1)
  EXPECT_EQ((*vars)[1].name, "fc1.bias");
  EXPECT_EQ((*vars)[3].name, "fc2.bias");
  for (const VariableInfo& v : *vars) EXPECT_TRUE(v.trainable) << v.name;
  const std::vector<float> init = InitialParameters(*vars, 99);  // the seed does not matter: the file's values
  const std::vector<float> ramp = Ramp(32 * 784);
  EXPECT_TRUE(std::equal(ramp.begin(), ramp.end(), init.begin()));
  EXPECT_EQ(init[32 * 784 + 32 + 320 + 3], Ramp(10)[3]);
}

TEST(OnnxImportTest, AFlatInputTakesImagesFlattenedChannelsFirst) {
  absl::StatusOr<ModelRef> spec = Import(Mlp(), "mlp.onnx");
  ASSERT_TRUE(spec.ok()) << spec.status();
  absl::StatusOr<Graph> g = (*spec)->build_graph(Images(1, 28, 28));
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->input_shape().dims, std::vector<int64_t>({1, 28, 28}));
  ASSERT_GE(g->nodes.size(), 1u);
  EXPECT_EQ(g->nodes[0].op, Op::kReshape);
  EXPECT_EQ(g->nodes[0].flatten_order, FlattenOrder::kChannelsFirst);
  EXPECT_EQ(g->output_shape().dims, std::vector<int64_t>({10}));
  // 4x14x14 images have 784 values too.
  EXPECT_TRUE((*spec)->build_graph(Images(4, 14, 14)).ok());
  EXPECT_EQ((*spec)->build_graph(Images(3, 32, 32)).status().message(),
            "mlp.onnx: the model's input 'x' takes 784 values per example but the data set's images are 3x32x32 "
            "(C x H x W), 3072 values; train it on data of its size or export it for these images");
}

TEST(OnnxImportTest, ImageGeometryAndClassesMustMatchTheDataSet) {
  absl::StatusOr<ModelRef> spec = Import(Cnn(), "cnn.onnx");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ((*spec)->defaults.data_channels, 1);
  EXPECT_EQ((*spec)->defaults.data_height, 28);
  EXPECT_TRUE((*spec)->build_graph(Images(1, 28, 28)).ok());
  EXPECT_EQ((*spec)->build_graph(Images(3, 32, 32)).status().message(),
            "cnn.onnx: the model's input 'x' takes 1x28x28 images (C x H x W) but the data set's images are 3x32x32 "
            "(C x H x W); train it on data of its shape or export it for these images");
  EXPECT_EQ((*spec)->build_graph(Images(1, 28, 28, 100)).status().message(),
            "cnn.onnx: the model's output 'logits' gives 10 class logits but the data set has 100 classes; export "
            "the model for 100 classes");
}

TEST(OnnxImportTest, ShapeArithmeticFoldsAndTheSoftmaxHeadIsStripped) {
  absl::StatusOr<ModelRef> spec = Import(Cnn(), "cnn.onnx");
  ASSERT_TRUE(spec.ok()) << spec.status();
  absl::StatusOr<Graph> g = (*spec)->build_graph(Images(1, 28, 28));
  ASSERT_TRUE(g.ok()) << g.status();
  std::vector<Op> ops;
  for (const Node& n : g->nodes) ops.push_back(n.op);
  EXPECT_EQ(ops, std::vector<Op>({Op::kConv, Op::kBatchNorm, Op::kRelu, Op::kMaxPool, Op::kReshape, Op::kDense}));
  EXPECT_EQ(g->nodes[4].shape, std::vector<int64_t>({784}));  // x.view(x.size(0), -1): the batch kept
  EXPECT_EQ(g->tensor_names[g->output], "logits");
  EXPECT_EQ(g->loss, Loss::kSoftmaxCrossEntropy);
  // Conv keeps ONNX's OIHW weights; BatchNormalization's momentum is PyTorch's (1 - ONNX's), its running
  // statistics state.
  EXPECT_EQ(g->nodes[0].conv.weight_layout, kernels::WeightLayout::kOIHW);
  EXPECT_EQ(g->nodes[0].conv.pad_top, 1);
  EXPECT_NEAR(g->nodes[1].momentum, 0.1f, 1e-6);
  EXPECT_TRUE(g->nodes[1].unbiased_running_var);
  ASSERT_EQ(g->variables.size(), 8u);
  EXPECT_EQ(g->variables[4].name, "bn.running_mean");
  EXPECT_FALSE(g->variables[4].trainable);
  EXPECT_FALSE(g->variables[5].trainable);
  EXPECT_TRUE(g->variables[2].trainable);
  ImportOptions biased;
  biased.bn_unbiased_running_var = false;
  absl::StatusOr<ModelRef> spec2 = Import(Cnn(), "cnn.onnx", biased);
  ASSERT_TRUE(spec2.ok());
  EXPECT_FALSE((*spec2)->build_graph(Images(1, 28, 28))->nodes[1].unbiased_running_var);
}

TEST(OnnxImportTest, StructureHashFollowsTheNodes) {
  const std::string a = (*Import(Cnn()))->structure;
  EXPECT_EQ(a.size(), 16u);
  EXPECT_EQ((*Import(Cnn()))->structure, a);
  OnnxBuilder other = Cnn();
  other.model().mutable_graph()->mutable_node(3)->mutable_attribute(1)->set_ints(0, 1);  // MaxPool stride 1
  other.model().mutable_graph()->mutable_node(3)->mutable_attribute(1)->set_ints(1, 1);
  // (The shapes no longer fit the Gemm: import that part fails; compare the hash on an MLP instead.)
  OnnxBuilder mlp = Mlp(), mlp2 = Mlp();
  mlp2.model().mutable_graph()->mutable_node(1)->set_op_type("Sigmoid");
  const ModelRef s1 = *Import(mlp), s2 = *Import(mlp2);
  EXPECT_NE(s1->structure, s2->structure);
  const std::vector<VariableInfo> vars = *ModelVariables(*s1, Images(1, 28, 28));
  EXPECT_NE(ModelSignature(*s1, vars), ModelSignature(*s2, vars));
  EXPECT_THAT(ModelSignature(*s1, vars), ::testing::StartsWith("onnx:model:"));
}

TEST(OnnxImportTest, MatMulAndAddOfABiasBecomeOneDense) {
  OnnxBuilder b;
  b.Input("x", {-1, 8})
      .Initializer("w", {8, 4}, Ramp(32))
      .Initializer("b", {4}, Ramp(4))
      .Initializer("w2", {4, 3}, Ramp(12))
      .Node("MatMul", {"x", "w"}, {"xw"})
      .Node("Add", {"xw", "b"}, {"h"})
      .Node("MatMul", {"h", "w2"}, {"logits"})
      .Output("logits", {-1, 3});
  absl::StatusOr<ModelRef> spec = Import(b);
  ASSERT_TRUE(spec.ok()) << spec.status();
  absl::StatusOr<Graph> g = (*spec)->build_graph(Images(8, 1, 1, 3));
  ASSERT_TRUE(g.ok()) << g.status();
  ASSERT_EQ(g->nodes.size(), 3u);  // the input's Reshape, two Dense
  EXPECT_EQ(g->nodes[1].op, Op::kDense);
  EXPECT_FALSE(g->nodes[1].dense.weights_transposed);
  EXPECT_EQ(g->nodes[1].variables.size(), 2u);
  EXPECT_EQ(g->nodes[2].variables.size(), 1u);
  EXPECT_EQ(g->tensor_names[g->nodes[1].output], "h");
}

TEST(OnnxImportTest, LrnAlphaIsDividedByTheSize) {
  OnnxBuilder b;
  b.Input("x", {-1, 8, 4, 4})
      .Initializer("fc.weight", {3, 128}, Ramp(384))
      .Node("LRN", {"x"}, {"n"}, {IntAttr("size", 5), FloatAttr("alpha", 1e-4f), FloatAttr("beta", 0.75f),
                                   FloatAttr("bias", 2.0f)})
      .Node("Flatten", {"n"}, {"f"}, {IntAttr("axis", 1)})
      .Node("Gemm", {"f", "fc.weight"}, {"logits"}, {IntAttr("transB", 1)})
      .Output("logits", {-1, 3});
  absl::StatusOr<ModelRef> spec = Import(b);
  ASSERT_TRUE(spec.ok()) << spec.status();
  absl::StatusOr<Graph> g = (*spec)->build_graph(Images(8, 4, 4, 3));
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->nodes[0].lrn.depth_radius, 2);
  EXPECT_FLOAT_EQ(g->nodes[0].lrn.alpha, 1e-4f / 5);
  EXPECT_FLOAT_EQ(g->nodes[0].lrn.bias, 2.0f);
}

// A Constant operand (x * 0.5, as exported from Python floats; a Gemm's bias written as a constant) is a constant
// variable: not trainable, and its gradient stays zero through a training step.
TEST(OnnxImportTest, ConstantOperandsAreConstantVariables) {
  OnnxBuilder b;
  b.Input("x", {-1, 6})
      .Constant(testing::FloatTensor("/Constant_output_0", {}, {0.5f}))
      .Node("Mul", {"x", "/Constant_output_0"}, {"half"})
      .Initializer("fc.weight", {3, 6}, Ramp(18))
      .Constant(testing::FloatTensor("/Constant_1_output_0", {3}, {0.1f, 0.2f, 0.3f}))
      .Node("Gemm", {"half", "fc.weight", "/Constant_1_output_0"}, {"logits"}, {IntAttr("transB", 1)})
      .Output("logits", {-1, 3});
  absl::StatusOr<ModelRef> spec = Import(b);
  ASSERT_TRUE(spec.ok()) << spec.status();
  ModelOptions o = Images(6, 1, 1, 3);
  o.batch_size = 2;
  absl::StatusOr<std::vector<VariableInfo>> vars = ModelVariables(**spec, o);
  ASSERT_TRUE(vars.ok());
  ASSERT_EQ(vars->size(), 3u);
  EXPECT_EQ((*vars)[0].name, "/Constant_output_0");
  EXPECT_FALSE((*vars)[0].trainable);
  auto dev = kernels::CreateDevice(kernels::DeviceSpec::Cpu(1));
  ASSERT_TRUE(dev.ok());
  absl::StatusOr<std::unique_ptr<Model>> model = CreateModel(**spec, o, dev->get());
  ASSERT_TRUE(model.ok()) << model.status();
  std::vector<float> params = InitialParameters(*vars, 1), grads(params.size(), 7.0f);
  ASSERT_TRUE((*model)->SetParameters(params.data()).ok());
  const std::vector<float> images = Ramp(12, 0.1f), labels = {0, 2};
  HostBatch batch{2, 1, 1, 6, images.data(), labels.data()};
  ASSERT_TRUE((*model)->TrainStep(batch, 0, grads.data()).ok());
  EXPECT_EQ(grads[0], 0.0f);  // the constant factor
  EXPECT_NE(grads[1], 0.0f);  // fc.weight
  EXPECT_FALSE((*vars)[2].trainable);
  for (int k = 0; k < 3; ++k) EXPECT_EQ(grads[1 + 18 + k], 0.0f) << "the constant bias, " << k;
}

// Swin's attention mask: slice assignments into zeros (ScatterND of constants) folded at import into a constant
// operand, which is added to the activations.
TEST(OnnxImportTest, ScatterNDOfConstantsFoldsIntoAConstantOperand) {
  ::onnx::AttributeProto zero;
  zero.set_name("value");
  zero.set_type(::onnx::AttributeProto::TENSOR);
  *zero.mutable_t() = testing::FloatTensor("", {1}, {0.0f});
  OnnxBuilder b;
  b.Input("x", {-1, 6})
      .Constant(testing::IntTensor("/mask_shape", {1}, {6}))
      .Node("ConstantOfShape", {"/mask_shape"}, {"/zeros"}, {zero}, "/ConstantOfShape")
      .Constant(testing::IntTensor("/rows", {2, 1}, {1, -2}))
      .Constant(testing::FloatTensor("/values", {2}, {-100.0f, -50.0f}))
      .Node("ScatterND", {"/zeros", "/rows", "/values"}, {"/mask"}, {}, "/ScatterND")
      .Node("Add", {"x", "/mask"}, {"masked"}, {}, "/Add")
      .Initializer("fc.weight", {3, 6}, Ramp(18))
      .Node("Gemm", {"masked", "fc.weight"}, {"logits"}, {IntAttr("transB", 1)}, "/fc/Gemm")
      .Output("logits", {-1, 3});
  absl::StatusOr<ModelRef> spec = Import(b);
  ASSERT_TRUE(spec.ok()) << spec.status();
  absl::StatusOr<std::vector<VariableInfo>> vars = ModelVariables(**spec, Images(6, 1, 1, 3));
  ASSERT_TRUE(vars.ok()) << vars.status();
  ASSERT_EQ(vars->size(), 2u);
  EXPECT_FALSE((*vars)[0].trainable);
  ASSERT_EQ((*vars)[0].size(), 6);
  const std::vector<float> params = InitialParameters(*vars, 1);
  EXPECT_EQ(std::vector<float>(params.begin(), params.begin() + 6),
            std::vector<float>({0.0f, -100.0f, 0.0f, 0.0f, -50.0f, 0.0f}));
}

// F.pad by zeros (Swin's pad to a multiple of its window when the image already is one) of a tensor that no Conv
// reads: nothing to compute.
TEST(OnnxImportTest, APadOfZerosIsTheIdentity) {
  OnnxBuilder b = Mlp();
  b.Constant(testing::IntTensor("/pads", {4}, {0, 0, 0, 0}));
  b.Node("Pad", {"r", "/pads"}, {"padded"}, {}, "/Pad");
  b.model().mutable_graph()->mutable_node(2)->set_input(0, "padded");  // fc2 reads the Pad
  std::rotate(b.model().mutable_graph()->mutable_node()->begin() + 2,
              b.model().mutable_graph()->mutable_node()->end() - 2, b.model().mutable_graph()->mutable_node()->end());
  absl::StatusOr<ModelRef> spec = Import(b);
  ASSERT_TRUE(spec.ok()) << spec.status();
  absl::StatusOr<Graph> g = (*spec)->build_graph(Images(1, 28, 28));
  ASSERT_TRUE(g.ok()) << g.status();
  std::vector<Op> ops;
  for (const Node& n : g->nodes) ops.push_back(n.op);
  EXPECT_EQ(ops, std::vector<Op>({Op::kReshape, Op::kDense, Op::kRelu, Op::kDense}));
  // Non-zero pads of a tensor no Conv reads stay refused.
  b.model().mutable_graph()->mutable_node(2)->mutable_attribute(0)->mutable_t()->set_int64_data(1, 1);
  EXPECT_THAT(Refusal(b), HasSubstr("node '/Pad' (Pad)"));
}

// ---- refusals: one line naming the node, its op and the attribute, what is supported, the export hint ----

TEST(OnnxImportTest, RefusesAnOperatorItDoesNotCompute) {
  OnnxBuilder b = Mlp();
  b.model().mutable_graph()->mutable_node(1)->set_op_type("ConvTranspose");
  EXPECT_EQ(Refusal(b), absl::StrCat("model.onnx: node '/Relu' (ConvTranspose): operator ConvTranspose is not "
                                     "supported (", SupportedOpsText(), "); ", kHint));
}

TEST(OnnxImportTest, RefusesControlFlow) {
  for (const char* op : {"If", "Loop"}) {
    OnnxBuilder b = Mlp();
    b.model().mutable_graph()->mutable_node(1)->set_op_type(op);
    EXPECT_EQ(Refusal(b), absl::StrCat("model.onnx: node '/Relu' (", op, "): control flow (", op,
                                       ") is not supported (supported: a fixed graph; trace the model instead of "
                                       "scripting its data-dependent branches and loops); ",
                                       kHint));
  }
}

TEST(OnnxImportTest, RefusesAForeignDomain) {
  OnnxBuilder b = Mlp();
  b.model().mutable_graph()->mutable_node(1)->set_domain("com.microsoft");
  EXPECT_EQ(Refusal(b), absl::StrCat("model.onnx: node '/Relu' (Relu): domain 'com.microsoft' is not supported "
                                     "(supported: ai.onnx); ",
                                     kHint));
}

TEST(OnnxImportTest, RefusesOpsetsAndIrVersionsOutsideTheSupportedOnes) {
  OnnxBuilder old = Mlp();
  old.model().mutable_opset_import(0)->set_version(10);
  EXPECT_EQ(Refusal(old), absl::StrCat("model.onnx: opset 10 of ai.onnx is not supported (supported: 11-17); ", kHint));
  OnnxBuilder newer = Mlp();
  newer.model().mutable_opset_import(0)->set_version(18);
  EXPECT_EQ(Refusal(newer),
            absl::StrCat("model.onnx: opset 18 of ai.onnx is not supported (supported: 11-17); ", kHint));
  OnnxBuilder ir9 = Mlp();
  ir9.model().set_ir_version(9);
  EXPECT_EQ(Refusal(ir9), absl::StrCat("model.onnx: IR version 9 is not supported (supported: 3-8, what ONNX 1.12 "
                                       "reads); ",
                                       kHint));
}

// Mlp() with fc1.weight and fc2.weight in "mlp.onnx.data" (at offsets 0 and 100352) and fc2.bias alone in
// "fc2.bias" with no offset or length (to the end of the file), as torch.onnx.export writes a model over 2 GB; the
// model itself written to `dir`/mlp.onnx.
OnnxBuilder ExternalMlp(const std::string& dir) {
  OnnxBuilder b = Mlp();
  EXPECT_TRUE(testing::MoveToExternalData(&b.model(), {"fc1.weight", "fc2.weight"}, dir, "mlp.onnx.data", 4096));
  EXPECT_TRUE(testing::MoveToExternalData(&b.model(), {"fc2.bias"}, dir, "fc2.bias"));
  ::onnx::TensorProto* bias = b.model().mutable_graph()->mutable_initializer(3);
  bias->mutable_external_data()->DeleteSubrange(1, 2);  // location only
  return b;
}

void Save(const OnnxBuilder& b, const std::string& path) { ASSERT_TRUE(WriteFileAtomically(path, b.Bytes()).ok()); }

TEST(OnnxImportTest, ReadsExternalData) {
  dtrain::testing::ScratchDir dir("onnx_external");
  const std::vector<VariableInfo> inline_vars = *ModelVariables(**Import(Mlp()), Images(1, 28, 28));
  const std::vector<float> want = InitialParameters(inline_vars, 1);

  const std::string path = dir.path() + "/mlp.onnx";
  Save(ExternalMlp(dir.path()), path);
  absl::StatusOr<ModelRef> spec = ImportModel(path);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_TRUE(std::static_pointer_cast<const OnnxFile>((*spec)->source)->external_data);
  EXPECT_EQ(InitialParameters(*ModelVariables(**spec, Images(1, 28, 28)), 1), want);
  EXPECT_FALSE(std::static_pointer_cast<const OnnxFile>((*Import(Mlp()))->source)->external_data);

  // From bytes, the locations are relative to the directory of the path given; a data file in a subdirectory, a
  // symbolic link inside the directory and a checksum (the file's SHA-1, any case) are fine.
  OnnxBuilder b = Mlp();
  ASSERT_EQ(::mkdir((dir.path() + "/weights").c_str(), 0755), 0);
  ASSERT_TRUE(testing::MoveToExternalData(&b.model(), {"fc1.weight"}, dir.path(), "weights/w.bin"));
  ASSERT_EQ(::symlink("w.bin", (dir.path() + "/weights/link.bin").c_str()), 0);
  ASSERT_TRUE(testing::MoveToExternalData(&b.model(), {"fc2.weight"}, dir.path(), "b.bin"));
  b.model().mutable_graph()->mutable_initializer(0)->mutable_external_data(0)->set_value("weights/link.bin");
  const std::string data = *ReadFileToString(dir.path() + "/b.bin");
  std::string sha1;
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  ASSERT_EQ(EVP_Digest(data.data(), data.size(), digest, &n, EVP_sha1(), nullptr), 1);
  for (unsigned int i = 0; i < n; ++i) absl::StrAppend(&sha1, absl::Hex(digest[i], absl::kZeroPad2));
  auto* sum = b.model().mutable_graph()->mutable_initializer(2)->add_external_data();
  sum->set_key("checksum");
  sum->set_value(absl::AsciiStrToUpper(sha1));
  spec = ImportModelFromBytes(b.Bytes(), path);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(InitialParameters(*ModelVariables(**spec, Images(1, 28, 28)), 1), want);

  // A Constant's value from external data (Cnn's [-1] of the Reshape's shape).
  OnnxBuilder cnn = Cnn();
  ASSERT_TRUE(testing::MoveToExternalData(&cnn.model(), {"minus_one"}, dir.path(), "cnn.data"));
  EXPECT_TRUE(ImportModelFromBytes(cnn.Bytes(), dir.path() + "/cnn.onnx").ok());
}

TEST(OnnxImportTest, RefusesBadExternalData) {
  dtrain::testing::ScratchDir dir("onnx_external");
  dtrain::testing::ScratchDir elsewhere("onnx_elsewhere");
  const std::string path = dir.path() + "/mlp.onnx";
  const OnnxBuilder good = ExternalMlp(dir.path());
  ASSERT_TRUE(WriteFileAtomically(elsewhere.path() + "/secret", std::string(100352, 'x')).ok());
  ASSERT_EQ(::symlink((elsewhere.path() + "/secret").c_str(), (dir.path() + "/out.bin").c_str()), 0);
  ASSERT_EQ(::mkdir((dir.path() + "/adir").c_str(), 0755), 0);
  ASSERT_TRUE(WriteFileAtomically(dir.path() + "/short.bin", std::string(400, 'x')).ok());

  // fc1.weight's external data entries replaced by these.
  auto with = [&](std::vector<std::pair<std::string, std::string>> entries) {
    OnnxBuilder b = good;
    ::onnx::TensorProto* t = b.model().mutable_graph()->mutable_initializer(0);
    t->clear_external_data();
    for (const auto& [key, value] : entries) {
      auto* e = t->add_external_data();
      e->set_key(key);
      e->set_value(value);
    }
    return b;
  };
  const std::string fc1 = path + ": initializer 'fc1.weight': ";
  const std::string in = "its external data in 'mlp.onnx.data' (103680 bytes): ";
  struct Case {
    OnnxBuilder model;
    absl::StatusCode code;
    std::string message;
  };
  std::vector<Case> cases = {
      {with({{"location", "/etc/passwd"}}), absl::StatusCode::kInvalidArgument,
       fc1 + "its external data file '/etc/passwd' is an absolute path (supported: a path relative to the model's "
             "directory, as ONNX's checker requires)"},
      {with({{"location", "../mlp.onnx.data"}}), absl::StatusCode::kInvalidArgument,
       fc1 + "its external data file '../mlp.onnx.data' has a '..' part (supported: a file in the model's "
             "directory or below it, as ONNX's checker requires)"},
      {with({{"location", "adir/../../x"}}), absl::StatusCode::kInvalidArgument, "has a '..' part"},
      {with({{"location", "out.bin"}}), absl::StatusCode::kInvalidArgument,
       "outside the model's directory '"},
      {with({{"location", "missing.data"}}), absl::StatusCode::kNotFound,
       fc1 + "its external data file 'missing.data' does not exist (looked for '" + dir.path() +
           "/missing.data'; keep the data file beside the .onnx file as it was saved)"},
      {with({{"location", "adir"}}), absl::StatusCode::kInvalidArgument,
       fc1 + "its external data file 'adir' is not a regular file"},
      {with({{"location", ""}}), absl::StatusCode::kInvalidArgument, fc1 + "its external data has an empty location"},
      {with({{"offset", "0"}}), absl::StatusCode::kInvalidArgument, fc1 + "its external data has no location"},
      {with({{"location", "mlp.onnx.data"}, {"offset", "103681"}}), absl::StatusCode::kInvalidArgument,
       fc1 + in + "offset 103681 is past the end of the file"},
      {with({{"location", "mlp.onnx.data"}, {"offset", "20000"}, {"length", "100352"}}),
       absl::StatusCode::kInvalidArgument, fc1 + in + "offset 20000 + length 100352 runs past the end of the file"},
      {with({{"location", "mlp.onnx.data"}, {"length", "400"}}), absl::StatusCode::kInvalidArgument,
       fc1 + in + "length 400 bytes, but its dims 32x784 of FLOAT take 100352 bytes"},
      {with({{"location", "short.bin"}}), absl::StatusCode::kInvalidArgument,
       fc1 + "its external data in 'short.bin' (400 bytes): length 400 bytes, but its dims 32x784 of FLOAT take "
             "100352 bytes"},
      {with({{"location", "mlp.onnx.data"}, {"offset", "abc"}}), absl::StatusCode::kInvalidArgument,
       fc1 + "external data offset 'abc' is not a non-negative integer"},
      {with({{"location", "mlp.onnx.data"}, {"length", "-4"}}), absl::StatusCode::kInvalidArgument,
       fc1 + "external data length '-4' is not a non-negative integer"},
      {with({{"location", "mlp.onnx.data"}, {"basepath", "/tmp"}}), absl::StatusCode::kInvalidArgument,
       fc1 + "unknown external data key 'basepath' (supported: location, offset, length, checksum)"},
      {with({{"location", "mlp.onnx.data"}, {"location", "fc2.bias"}}), absl::StatusCode::kInvalidArgument,
       fc1 + "external data key 'location' appears twice"},
      {with({{"location", "mlp.onnx.data"}, {"length", "100352"}, {"checksum", "0123"}}),
       absl::StatusCode::kInvalidArgument, fc1 + in + "checksum '0123' is not the file's SHA-1 ("},
  };
  {  // data inline and outside
    OnnxBuilder b = good;
    b.model().mutable_graph()->mutable_initializer(0)->add_float_data(1.0f);
    cases.push_back({b, absl::StatusCode::kInvalidArgument,
                     fc1 + "it holds data inside the .onnx file as well as in external data (ONNX allows one)"});
  }
  {  // entries without data_location EXTERNAL
    OnnxBuilder b = good;
    b.model().mutable_graph()->mutable_initializer(0)->clear_data_location();
    cases.push_back({b, absl::StatusCode::kInvalidArgument,
                     fc1 + "it has external data entries but its data_location is not EXTERNAL"});
  }
  {  // a STRING tensor
    OnnxBuilder b = good;
    b.model().mutable_graph()->mutable_initializer(0)->set_data_type(::onnx::TensorProto::STRING);
    cases.push_back({b, absl::StatusCode::kInvalidArgument,
                     fc1 + "its type STRING cannot be external data (supported: numeric and BOOL tensors)"});
  }
  {  // a Constant's value
    OnnxBuilder b = Cnn();
    ASSERT_TRUE(testing::MoveToExternalData(&b.model(), {"minus_one"}, dir.path(), "cnn.data"));
    for (::onnx::NodeProto& n : *b.model().mutable_graph()->mutable_node()) {
      if (n.op_type() == "Constant" && n.output(0) == "minus_one") {
        n.mutable_attribute(0)->mutable_t()->mutable_external_data(0)->set_value("gone.data");
      }
    }
    cases.push_back({b, absl::StatusCode::kNotFound,
                     path + ": node '/Constant_9' (Constant): attribute value: its external data file 'gone.data' "
                            "does not exist"});
  }
  for (const Case& c : cases) {
    Save(c.model, path);
    absl::Status s = ImportModel(path).status();
    EXPECT_EQ(s.code(), c.code) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.message));
    EXPECT_EQ(s.message().find('\n'), absl::string_view::npos) << s;
  }
}

TEST(OnnxImportTest, RefusesAModelFileOverTwoGigabytes) {
  dtrain::testing::ScratchDir dir("onnx_huge");
  const std::string path = dir.path() + "/huge.onnx";
  ASSERT_TRUE(WriteFileAtomically(path, "").ok());
  ASSERT_EQ(::truncate(path.c_str(), int64_t{1} << 31), 0);  // sparse: no disk space, and never read
  absl::Status s = ImportModel(path).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            path + ": 2147483648 bytes, over protobuf's limit of 2147483647 bytes (2 GB) on one message: no ONNX "
                   "reader can parse a model file this large; save its weights as external data beside it "
                   "(torch.onnx.export does so by itself for a model over 2 GB; or onnx.save_model(model, path, "
                   "save_as_external_data=True, all_tensors_to_one_file=True, location='NAME.onnx.data'))");
}

// What torch.onnx.export writes for a module in eval mode: BatchNorm folded into the Conv, whose weights get the
// exporter's names, and equal initializers merged into Identity aliases.
TEST(OnnxImportTest, RefusesAnEvalModeExport) {
  OnnxBuilder folded;
  folded.Input("x", {-1, 1, 28, 28})
      .Initializer("onnx::Conv_28", {4, 1, 3, 3}, Ramp(36))
      .Initializer("onnx::Conv_29", {4}, Ramp(4))
      .Initializer("fc.weight", {10, 2704}, Ramp(27040))
      .Node("Conv", {"x", "onnx::Conv_28", "onnx::Conv_29"}, {"c"}, {IntsAttr("kernel_shape", {3, 3})}, "/conv/Conv")
      .Node("Flatten", {"c"}, {"f"}, {IntAttr("axis", 1)}, "/Flatten")
      .Node("Gemm", {"f", "fc.weight"}, {"logits"}, {IntAttr("transB", 1)}, "/fc/Gemm")
      .Output("logits", {-1, 10});
  EXPECT_EQ(Refusal(folded), absl::StrCat("model.onnx: node '/conv/Conv' (Conv): its weight 'onnx::Conv_28' is not a "
                                          "parameter of the PyTorch module but a value the exporter made (an "
                                          "eval-mode export that folded BatchNorm into Conv; supported: parameters "
                                          "under their state_dict names); ",
                                          kHint));
  OnnxBuilder alias = Mlp();
  alias.Node("Identity", {"fc2.bias"}, {"fc3.bias"}, {}, "Identity_7");
  EXPECT_EQ(Refusal(alias), absl::StrCat("model.onnx: node 'Identity_7' (Identity): an alias of initializer "
                                         "'fc2.bias' (an eval-mode export merges equal initializers into Identity "
                                         "aliases; supported: Identity of a tensor); ",
                                         kHint));
}

TEST(OnnxImportTest, RefusesAttributesItCannotExpress) {
  {  // Flatten at axis 2 merges the batch with the channels ([4 N, 196]): the Gemm's weight no longer fits
    OnnxBuilder b = Cnn();
    b.model().mutable_graph()->mutable_node(11)->set_op_type("Flatten");  // the Reshape
    b.model().mutable_graph()->mutable_node(11)->mutable_input()->RemoveLast();
    *b.model().mutable_graph()->mutable_node(11)->add_attribute() = IntAttr("axis", 2);
    EXPECT_EQ(Refusal(b), "model: node '/fc/Gemm' (Gemm): its weight 'fc.weight' has shape 10x784, expected 10x196");
  }
  {  // Reshape to a literal batch
    OnnxBuilder b = Mlp();
    b.IntInitializer("shape", {2}, {50, 32});
    auto* g = b.model().mutable_graph();
    g->mutable_node(2)->set_input(0, "rr");
    ::onnx::NodeProto* n = g->add_node();
    n->set_op_type("Reshape");
    n->set_name("/Reshape");
    n->add_input("r");
    n->add_input("shape");
    n->add_output("rr");
    // Move it before fc2 (nodes in topological order).
    for (int k = g->node_size() - 1; k > 2; --k) g->mutable_node()->SwapElements(k, k - 1);
    EXPECT_EQ(Refusal(b), absl::StrCat("model.onnx: node '/Reshape' (Reshape): shape [50,32] leaves no room for the "
                                       "batch (supported: the batch size as x.size(0), 0, or -1 with the other "
                                       "sizes fixed); ",
                                       kHint));
  }
  {  // Gemm with transA
    OnnxBuilder b = Mlp();
    *b.model().mutable_graph()->mutable_node(0)->add_attribute() = IntAttr("transA", 1);
    EXPECT_EQ(Refusal(b), absl::StrCat("model.onnx: node '/fc1/Gemm' (Gemm): attribute transA=1 is not supported "
                                       "(supported: transA=0, the batch along A's first axis); ",
                                       kHint));
  }
  {  // MaxPool with dilations
    OnnxBuilder b = Cnn();
    *b.model().mutable_graph()->mutable_node(3)->add_attribute() = IntsAttr("dilations", {2, 2});
    EXPECT_EQ(Refusal(b), absl::StrCat("model.onnx: node '/MaxPool' (MaxPool): attribute dilations=[2,2] is not "
                                       "supported (supported: 1, 1); ",
                                       kHint));
  }
  {  // Conv auto_pad value
    OnnxBuilder b = Cnn();
    *b.model().mutable_graph()->mutable_node(0)->add_attribute() = StringAttr("auto_pad", "SAME_MIDDLE");
    const std::string m = Refusal(b);
    EXPECT_THAT(m, HasSubstr("auto_pad"));  // ONNX's checker or ours, naming the attribute
    EXPECT_THAT(m, HasSubstr(kHint));
  }
  {  // LRN with an even size
    OnnxBuilder b;
    b.Input("x", {-1, 8, 4, 4})
        .Initializer("fc.weight", {3, 128}, Ramp(384))
        .Node("LRN", {"x"}, {"n"}, {IntAttr("size", 4)}, "/lrn/LRN")
        .Node("Flatten", {"n"}, {"f"}, {IntAttr("axis", 1)})
        .Node("Gemm", {"f", "fc.weight"}, {"logits"}, {IntAttr("transB", 1)})
        .Output("logits", {-1, 3});
    EXPECT_EQ(Refusal(b), absl::StrCat("model.onnx: node '/lrn/LRN' (LRN): attribute size=4 is not supported "
                                       "(supported: odd sizes, a window centred on each channel); ",
                                       kHint));
  }
}

TEST(OnnxImportTest, ASoftmaxInsideTheGraphIsComputedAndTheHeadStripped) {
  OnnxBuilder b = Mlp();
  b.model().mutable_graph()->mutable_node(1)->set_op_type("Softmax");  // between the two Gemms
  b.Node("LogSoftmax", {"logits"}, {"log_probs"}, {IntAttr("axis", -1)}, "/LogSoftmax");
  b.model().mutable_graph()->mutable_output(0)->set_name("log_probs");
  absl::StatusOr<ModelRef> spec = Import(b);
  ASSERT_TRUE(spec.ok()) << spec.status();
  absl::StatusOr<Graph> g = (*spec)->build_graph(Images(1, 28, 28));
  ASSERT_TRUE(g.ok()) << g.status();
  std::vector<Op> ops;
  for (const Node& n : g->nodes) ops.push_back(n.op);
  EXPECT_EQ(ops, std::vector<Op>({Op::kReshape, Op::kDense, Op::kSoftmax, Op::kDense}));
  EXPECT_EQ(g->nodes[2].axis, 1);  // the features' full axis (the batch's is 0)
  EXPECT_FALSE(g->nodes[2].log_softmax);
  EXPECT_EQ(g->tensor_names[g->output], "logits");
}

// x [N, 784] as [N, 4, 196] (a 4-token sequence), an attention score of it and of its ReLU by Einsum, flattened
// into a Gemm: MaxViT's q k^T ("... i d, ... j d -> ... i j") is a MatMul of two tensors, b transposed.
OnnxBuilder EinsumNet(const std::string& equation, std::vector<int64_t> scores_shape) {
  OnnxBuilder b;
  const int64_t scores = scores_shape[1] * scores_shape[2];
  b.Input("x", {-1, 784})
      .Initializer("fc.weight", {10, scores}, Ramp(10 * scores))
      .Initializer("fc.bias", {10}, Ramp(10))
      .Constant(testing::IntTensor("seq_shape", {3}, {0, 4, 196}))
      .Node("Reshape", {"x", "seq_shape"}, {"q"}, {}, "/Reshape")
      .Node("Relu", {"q"}, {"k"}, {}, "/Relu")
      .Node("Einsum", {"q", "k"}, {"s"}, {StringAttr("equation", equation)}, "/Einsum")
      .Constant(testing::IntTensor("flat_shape", {2}, {0, -1}))
      .Node("Reshape", {"s", "flat_shape"}, {"flat"}, {}, "/Reshape_1")
      .Node("Gemm", {"flat", "fc.weight", "fc.bias"}, {"logits"}, {IntAttr("transB", 1)}, "/fc/Gemm")
      .Output("logits", {-1, 10});
  return b;
}

TEST(OnnxImportTest, EinsumOfBatchedMatrixProductsIsAMatMulOfTwoTensors) {
  struct Case {
    std::string equation;
    bool trans_a, trans_b;
    int64_t m, n;
  };
  for (const Case& c : {Case{"bid,bjd->bij", false, true, 4, 4}, Case{"b i d , b j d -> b i j", false, true, 4, 4},
                        Case{"bdi,bdj->bij", true, false, 196, 196}}) {
    SCOPED_TRACE(c.equation);
    absl::StatusOr<ModelRef> spec = Import(EinsumNet(c.equation, {1, c.m, c.n}));
    ASSERT_TRUE(spec.ok()) << spec.status();
    absl::StatusOr<Graph> g = (*spec)->build_graph(Images(1, 28, 28));
    ASSERT_TRUE(g.ok()) << g.status();
    const Node* mm = nullptr;
    for (const Node& n : g->nodes) {
      if (n.op == Op::kMatMul) mm = &n;
    }
    ASSERT_NE(mm, nullptr);
    EXPECT_EQ(mm->trans_a, c.trans_a);
    EXPECT_EQ(mm->trans_b, c.trans_b);
    const std::vector<int64_t> dims = g->tensors[mm->output].SymbolicDims();
    ASSERT_EQ(dims.size(), 3u);
    EXPECT_EQ(dims[1], c.m);
    EXPECT_EQ(dims[2], c.n);
  }
  // Not a batched matrix product: a reduction over i, a diagonal, an ellipsis.
  for (const char* eq : {"bij,bjk->bk", "bii,bij->bij", "...ij,...jk->...ik"}) {
    SCOPED_TRACE(eq);
    EXPECT_THAT(Refusal(EinsumNet(eq, {1, 4, 4})),
                HasSubstr("model.onnx: node '/Einsum' (Einsum): equation '" + std::string(eq) + "'"));
  }
}

TEST(OnnxImportTest, FilesThatAreMissingOrNotOnnx) {
  absl::StatusOr<ModelRef> missing = ImportModel("/nonexistent/model.onnx");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("/nonexistent/model.onnx"));
  absl::StatusOr<ModelRef> garbage = ImportModelFromBytes("this is not a protobuf \x01\x02\xff", "notes.onnx");
  EXPECT_EQ(garbage.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(garbage.status().message(), HasSubstr("notes.onnx: not an ONNX model"));
}

// A 20 M-parameter file (fc layers 784 -> 5000 -> 3200 -> 10, 20.0 M floats, 80 MB) imports whole (how long it
// takes is a benchmark's matter: onnx_import_bench).
TEST(OnnxImportTest, ImportsA20MParameterFile) {
  dtrain::testing::ScratchDir dir("onnx_import");
  OnnxBuilder b;
  b.Input("x", {-1, 784})
      .Initializer("fc1.weight", {5000, 784}, std::vector<float>(5000 * 784, 0.01f))
      .Initializer("fc1.bias", {5000}, std::vector<float>(5000, 0.0f))
      .Initializer("fc2.weight", {3200, 5000}, std::vector<float>(3200 * 5000, 0.01f))
      .Initializer("fc2.bias", {3200}, std::vector<float>(3200, 0.0f))
      .Initializer("fc3.weight", {10, 3200}, std::vector<float>(32000, 0.01f))
      .Initializer("fc3.bias", {10}, std::vector<float>(10, 0.0f))
      .Node("Gemm", {"x", "fc1.weight", "fc1.bias"}, {"h1"}, {IntAttr("transB", 1)})
      .Node("Relu", {"h1"}, {"r1"})
      .Node("Gemm", {"r1", "fc2.weight", "fc2.bias"}, {"h2"}, {IntAttr("transB", 1)})
      .Node("Relu", {"h2"}, {"r2"})
      .Node("Gemm", {"r2", "fc3.weight", "fc3.bias"}, {"logits"}, {IntAttr("transB", 1)})
      .Output("logits", {-1, 10});
  const std::string path = dir.path() + "/big.onnx";
  ASSERT_TRUE(WriteFileAtomically(path, b.Bytes()).ok());
  absl::StatusOr<ModelRef> spec = ImportModel(path);
  ASSERT_TRUE(spec.ok()) << spec.status();
  absl::StatusOr<std::vector<VariableInfo>> vars = ModelVariables(**spec, Images(1, 28, 28));
  ASSERT_TRUE(vars.ok());
  EXPECT_EQ(TotalSize(*vars), 5000 * 784 + 5000 + 3200 * 5000 + 3200 + 32000 + 10);
  ASSERT_EQ(vars->size(), 6u);
  const auto fc2 = std::find_if(vars->begin(), vars->end(), [](const VariableInfo& v) { return v.name == "fc2.weight"; });
  ASSERT_NE(fc2, vars->end());
  EXPECT_EQ(fc2->size(), 3200 * 5000);
}

}  // namespace
}  // namespace dtrain::models::onnx
