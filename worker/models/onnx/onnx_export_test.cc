// Export: the imported file with every variable's initializer replaced by trained values (FLOAT, raw_data, name
// and dims kept) and everything else as it was; written atomically.
#include "worker/models/onnx/onnx_export.h"

#include <string>
#include <vector>

#include "common/file_util.h"
#include "common/testing/fault_injection_env.h"
#include "common/testing/scratch_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/models/onnx/onnx_import.h"
#include "worker/models/onnx/onnx_test_util.h"
#include "worker/models/registry.h"

namespace dtrain::models::onnx {
namespace {

using testing::FloatAttr;
using testing::IntAttr;
using testing::IntsAttr;
using testing::OnnxBuilder;
using testing::Ramp;

// Conv -> BatchNormalization -> Relu -> Flatten -> Gemm, with a Constant operand (x * 0.5) and an initializer
// that is not a variable (a Reshape's shape); fc.weight in float_data, as some exporters write it.
OnnxBuilder Model() {
  OnnxBuilder b;
  b.model().set_doc_string("a model for the export test");
  b.model().set_producer_version("1.13.0");
  auto* meta = b.model().add_metadata_props();
  meta->set_key("author");
  meta->set_value("dtrain");
  b.Input("x", {-1, 1, 6, 6})
      .Initializer("conv.weight", {2, 1, 3, 3}, Ramp(18))
      .Initializer("bn.weight", {2}, {1, 1})
      .Initializer("bn.bias", {2}, {0, 0})
      .Initializer("bn.running_mean", {2}, {0, 0})
      .Initializer("bn.running_var", {2}, {1, 1})
      .IntInitializer("shape", {2}, {0, -1});
  *b.model().mutable_graph()->add_initializer() = testing::FloatTensor("fc.weight", {3, 72}, Ramp(216), /*raw=*/false);
  b.Initializer("fc.bias", {3}, Ramp(3))
      .Node("Conv", {"x", "conv.weight"}, {"c"}, {IntsAttr("kernel_shape", {3, 3}), IntsAttr("pads", {1, 1, 1, 1})},
            "/conv/Conv")
      .Node("BatchNormalization", {"c", "bn.weight", "bn.bias", "bn.running_mean", "bn.running_var"},
            {"n", "m_out", "v_out"}, {FloatAttr("momentum", 0.9f), IntAttr("training_mode", 1)}, "/bn/BN")
      .Node("Relu", {"n"}, {"r"}, {}, "/Relu")
      .Constant(testing::FloatTensor("half", {}, {0.5f}))
      .Node("Mul", {"r", "half"}, {"h"}, {}, "/Mul")
      .Node("Reshape", {"h", "shape"}, {"f"}, {}, "/Reshape")
      .Node("Gemm", {"f", "fc.weight", "fc.bias"}, {"logits"}, {IntAttr("transB", 1)}, "/fc/Gemm")
      .Output("logits", {-1, 3});
  return b;
}

ModelOptions Options() {
  ModelOptions o;
  o.channels = 1, o.height = 6, o.width = 6, o.num_classes = 3;
  return o;
}

struct Imported {
  ModelRef spec;
  std::vector<VariableInfo> vars;
  std::vector<float> trained;  // the file's values + 1
};

Imported ImportAndTrain(const OnnxBuilder& b) {
  Imported m;
  absl::StatusOr<ModelRef> spec = ImportModelFromBytes(b.Bytes(), "model.onnx");
  EXPECT_TRUE(spec.ok()) << spec.status();
  if (!spec.ok()) return m;
  m.spec = *spec;
  m.vars = *ModelVariables(*m.spec, Options());
  m.trained = InitialParameters(m.vars, 1);
  for (float& v : m.trained) v += 1.0f;
  return m;
}

std::vector<float> FloatsOf(const ::onnx::TensorProto& t) {
  std::vector<float> v(t.raw_data().size() / sizeof(float));
  std::memcpy(v.data(), t.raw_data().data(), t.raw_data().size());
  return v;
}

TEST(OnnxExportTest, ReplacesTheVariablesAndKeepsEverythingElse) {
  const OnnxBuilder b = Model();
  const Imported m = ImportAndTrain(b);
  ASSERT_NE(m.spec, nullptr);
  absl::StatusOr<std::string> bytes = ExportOnnxBytes(*m.spec, m.vars, m.trained.data());
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  ::onnx::ModelProto out;
  ASSERT_TRUE(out.ParseFromString(*bytes));

  // Every variable's initializer holds its trained values, FLOAT in raw_data, name and dims as before.
  const std::vector<std::string> variables = {"conv.weight", "bn.weight",   "bn.bias", "bn.running_mean",
                                              "bn.running_var", "fc.weight", "fc.bias"};
  ASSERT_EQ(m.vars.size(), variables.size() + 1);  // + the constant "half", which is no initializer
  int64_t offset = 0;
  for (const VariableInfo& v : m.vars) {
    for (const ::onnx::TensorProto& t : out.graph().initializer()) {
      if (t.name() != v.name) continue;
      EXPECT_EQ(t.data_type(), ::onnx::TensorProto::FLOAT) << v.name;
      EXPECT_EQ(std::vector<int64_t>(t.dims().begin(), t.dims().end()), v.shape) << v.name;
      EXPECT_EQ(t.float_data_size(), 0) << v.name;
      EXPECT_EQ(FloatsOf(t), std::vector<float>(m.trained.begin() + offset, m.trained.begin() + offset + v.size()))
          << v.name;
    }
    offset += v.size();
  }
  // The rest is the file as it was: clear the variables' data on both sides, and the models are equal.
  ::onnx::ModelProto want = b.model(), got = out;
  for (::onnx::ModelProto* p : {&want, &got}) {
    for (::onnx::TensorProto& t : *p->mutable_graph()->mutable_initializer()) {
      if (std::find(variables.begin(), variables.end(), t.name()) == variables.end()) continue;
      t.clear_raw_data();
      t.clear_float_data();
    }
  }
  EXPECT_EQ(got.SerializeAsString(), want.SerializeAsString());
  EXPECT_EQ(got.graph().initializer(5).name(), "shape");  // order kept, the int initializer untouched

  // Imported again, the exported file starts from the trained values.
  absl::StatusOr<ModelRef> again = ImportModelFromBytes(*bytes, "trained.onnx");
  ASSERT_TRUE(again.ok()) << again.status();
  const std::vector<VariableInfo> vars2 = *ModelVariables(**again, Options());
  std::vector<float> want_values = m.trained;
  ASSERT_EQ(m.vars[5].name, "half");  // the Constant's value is no initializer: it stays in its node
  want_values[18 + 8] = 0.5f;
  EXPECT_EQ(InitialParameters(vars2, 1), want_values);
  EXPECT_EQ((*again)->structure, m.spec->structure);
}

// For inference runtimes: BatchNormalization in inference mode, training outputs dropped; the checker and the
// importer accept the result.
TEST(OnnxExportTest, AnInferenceExportTurnsTrainingModeOff) {
  OnnxBuilder b = Model();
  b.Constant(testing::FloatTensor("ratio", {}, {0.25f}));
  ::onnx::TensorProto train_mode;
  train_mode.set_name("train");
  train_mode.set_data_type(::onnx::TensorProto::BOOL);
  train_mode.add_int32_data(1);
  b.Constant(train_mode);
  auto* g = b.model().mutable_graph();
  g->mutable_node(g->node_size() - 3)->set_output(0, "logits_before");  // the Gemm, then Dropout
  b.Node("Dropout", {"logits_before", "ratio", "train"}, {"logits", "mask"}, {}, "/drop/Dropout");
  const Imported m = ImportAndTrain(b);
  ASSERT_NE(m.spec, nullptr);
  ExportOptions o;
  o.inference = true;
  absl::StatusOr<std::string> bytes = ExportOnnxBytes(*m.spec, m.vars, m.trained.data(), o);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  ::onnx::ModelProto out;
  ASSERT_TRUE(out.ParseFromString(*bytes));
  for (const ::onnx::NodeProto& n : out.graph().node()) {
    if (n.op_type() == "BatchNormalization") {
      EXPECT_EQ(n.output_size(), 1);
      for (const auto& a : n.attribute()) {
        if (a.name() == "training_mode") {
          EXPECT_EQ(a.i(), 0);
        }
      }
    }
    if (n.op_type() == "Dropout") {
      EXPECT_EQ(n.input_size(), 2);
      EXPECT_EQ(n.output_size(), 1);
    }
  }
  EXPECT_TRUE(ImportModelFromBytes(*bytes, "inference.onnx").ok());
}

TEST(OnnxExportTest, WritesAtomically) {
  dtrain::testing::ScratchDir dir("onnx_export");
  const Imported m = ImportAndTrain(Model());
  ASSERT_NE(m.spec, nullptr);
  const std::string path = dir.path() + "/trained.onnx";
  ASSERT_TRUE(ExportOnnx(*m.spec, m.vars, m.trained.data(), path).ok());
  const std::string first = *ReadFileToString(path);
  // A rename that fails leaves the old file and no temporary file.
  dtrain::testing::FaultInjectionEnv env(Env::Default());
  env.FailRenames(1);
  std::vector<float> other = m.trained;
  other[0] = 42.0f;
  absl::Status s = ExportOnnx(*m.spec, m.vars, other.data(), path, {}, &env);
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(*ReadFileToString(path), first);
  EXPECT_EQ(*Env::Default()->GetChildren(dir.path()), std::vector<std::string>({"trained.onnx"}));
  // No directory: an error, nothing written.
  EXPECT_FALSE(ExportOnnx(*m.spec, m.vars, m.trained.data(), dir.path() + "/missing/trained.onnx").ok());
}

TEST(OnnxExportTest, OnlyImportedModelsExport) {
  absl::StatusOr<ModelRef> mlp = ResolveModel("mlp");
  ASSERT_TRUE(mlp.ok());
  ModelOptions o;
  const std::vector<VariableInfo> vars = *ModelVariables(**mlp, o);
  const std::vector<float> params = InitialParameters(vars, 1);
  absl::Status s = ExportOnnxBytes(**mlp, vars, params.data()).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), ::testing::HasSubstr("not an ONNX import"));
}

}  // namespace
}  // namespace dtrain::models::onnx
