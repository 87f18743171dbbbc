// Export: the imported file with every variable's initializer replaced by trained values (FLOAT, raw_data, name
// and dims kept) and everything else as it was; written atomically; the weights as external data beside it when
// the model was imported so, the file would be too large, or it is asked for.
#include "worker/models/onnx/onnx_export.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "common/file_util.h"
#include "common/testing/fault_injection_env.h"
#include "common/testing/scratch_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/models/onnx/onnx_file.h"
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
// that is not a variable (a Reshape's shape); fc.weight in float_data, as some exporters write it. Images
// side x side, `channels` after the Conv.
OnnxBuilder Model(int side = 6, int channels = 2) {
  OnnxBuilder b;
  b.model().set_doc_string("a model for the export test");
  b.model().set_producer_version("1.13.0");
  auto* meta = b.model().add_metadata_props();
  meta->set_key("author");
  meta->set_value("dtrain");
  const int c = channels, flat = channels * side * side;
  b.Input("x", {-1, 1, side, side})
      .Initializer("conv.weight", {c, 1, 3, 3}, Ramp(c * 9))
      .Initializer("bn.weight", {c}, std::vector<float>(c, 1))
      .Initializer("bn.bias", {c}, std::vector<float>(c, 0))
      .Initializer("bn.running_mean", {c}, std::vector<float>(c, 0))
      .Initializer("bn.running_var", {c}, std::vector<float>(c, 1))
      .IntInitializer("shape", {2}, {0, -1});
  *b.model().mutable_graph()->add_initializer() =
      testing::FloatTensor("fc.weight", {3, flat}, Ramp(3 * flat), /*raw=*/false);
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

ModelOptions Options(int side = 6) {
  ModelOptions o;
  o.channels = 1, o.height = side, o.width = side, o.num_classes = 3;
  return o;
}

struct Imported {
  ModelRef spec;
  std::vector<VariableInfo> vars;
  std::vector<float> trained;  // the file's values + 1
};

// `path`: where the file would be (external data beside it).
Imported ImportAndTrain(const OnnxBuilder& b, int side = 6, const std::string& path = "model.onnx") {
  Imported m;
  absl::StatusOr<ModelRef> spec = ImportModelFromBytes(b.Bytes(), path);
  EXPECT_TRUE(spec.ok()) << spec.status();
  if (!spec.ok()) return m;
  m.spec = *spec;
  m.vars = *ModelVariables(*m.spec, Options(side));
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

// An initializer's location/offset/length entries (empty: inline).
std::map<std::string, std::string> EntriesOf(const ::onnx::TensorProto& t) {
  std::map<std::string, std::string> e;
  for (const auto& kv : t.external_data()) e[kv.key()] = kv.value();
  return e;
}

const ::onnx::TensorProto& InitializerOf(const ::onnx::ModelProto& m, const std::string& name) {
  for (const ::onnx::TensorProto& t : m.graph().initializer()) {
    if (t.name() == name) return t;
  }
  ADD_FAILURE() << "no initializer " << name;
  return m.graph().initializer(0);
}

// The values of a variable in the trained buffer.
std::vector<float> TrainedValues(const Imported& m, const std::string& name) {
  int64_t offset = 0;
  for (const VariableInfo& v : m.vars) {
    if (v.name == name) return std::vector<float>(m.trained.begin() + offset, m.trained.begin() + offset + v.size());
    offset += v.size();
  }
  ADD_FAILURE() << "no variable " << name;
  return {};
}

std::vector<float> FloatsAt(const std::string& data, int64_t offset, int64_t length) {
  std::vector<float> v(length / sizeof(float));
  std::memcpy(v.data(), data.data() + offset, length);
  return v;
}

// A model imported with external data exports with it: PATH and PATH.data, every initializer of 1 KB or more
// there at 4096-aligned offsets, the small ones inside; imported again, it starts from the trained values.
TEST(OnnxExportTest, AModelImportedWithExternalDataExportsWithIt) {
  dtrain::testing::ScratchDir dir("onnx_export_external");
  ASSERT_TRUE(Env::Default()->CreateDirs(dir.path() + "/in").ok());
  ASSERT_TRUE(Env::Default()->CreateDirs(dir.path() + "/out").ok());
  OnnxBuilder b = Model(/*side=*/12, /*channels=*/32);  // conv.weight 1152 bytes, fc.weight 55296
  ASSERT_TRUE(testing::MoveToExternalData(&b.model(), {"conv.weight", "bn.weight", "fc.weight"}, dir.path() + "/in",
                                          "model.onnx.data"));
  const std::string in = dir.path() + "/in/model.onnx";
  ASSERT_TRUE(WriteFileAtomically(in, b.Bytes()).ok());
  absl::StatusOr<ModelRef> spec = ImportModel(in);
  ASSERT_TRUE(spec.ok()) << spec.status();
  Imported m;
  m.spec = *spec;
  m.vars = *ModelVariables(*m.spec, Options(12));
  m.trained = InitialParameters(m.vars, 1);
  for (float& v : m.trained) v += 1.0f;

  const std::string path = dir.path() + "/out/trained.onnx";
  ASSERT_TRUE(ExportOnnx(*m.spec, m.vars, m.trained.data(), path).ok());
  std::vector<std::string> files = *Env::Default()->GetChildren(dir.path() + "/out");
  std::sort(files.begin(), files.end());
  EXPECT_EQ(files, std::vector<std::string>({"trained.onnx", "trained.onnx.data"}));
  ::onnx::ModelProto out;
  ASSERT_TRUE(out.ParseFromString(*ReadFileToString(path)));
  const std::string data = *ReadFileToString(path + ".data");
  EXPECT_EQ(data.size(), 4096 + 55296u);
  for (const auto& [name, offset, length] : {std::tuple<std::string, int64_t, int64_t>{"conv.weight", 0, 1152},
                                             {"fc.weight", 4096, 55296}}) {
    const ::onnx::TensorProto& t = InitializerOf(out, name);
    EXPECT_EQ(t.data_location(), ::onnx::TensorProto::EXTERNAL) << name;
    EXPECT_FALSE(t.has_raw_data()) << name;
    EXPECT_EQ(EntriesOf(t), (std::map<std::string, std::string>{{"location", "trained.onnx.data"},
                                                                 {"offset", absl::StrCat(offset)},
                                                                 {"length", absl::StrCat(length)}}))
        << name;
    EXPECT_EQ(FloatsAt(data, offset, length), TrainedValues(m, name)) << name;
  }
  // Small initializers inside, bn.weight included (it was external in the file).
  for (const char* name : {"bn.weight", "bn.bias", "bn.running_var"}) {
    const ::onnx::TensorProto& t = InitializerOf(out, name);
    EXPECT_NE(t.data_location(), ::onnx::TensorProto::EXTERNAL) << name;
    EXPECT_EQ(FloatsOf(t), TrainedValues(m, name)) << name;
  }
  EXPECT_EQ(InitializerOf(out, "shape").int64_data_size(), 2);

  // Imported again (and so through ONNX's checker): the trained values, the same structure.
  absl::StatusOr<ModelRef> again = ImportModel(path);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ((*again)->structure, m.spec->structure);
  std::vector<float> want = m.trained;
  int64_t offset = 0;
  for (const VariableInfo& v : m.vars) {
    if (v.name == "half") want[offset] = 0.5f;  // the Constant's value stays in its node
    offset += v.size();
  }
  EXPECT_EQ(InitialParameters(*ModelVariables(**again, Options(12)), 1), want);

  // Inside on request (and from ExportOnnxBytes): one file. Exported inside to a path that had external data
  // before, the earlier PATH.data goes.
  ExportOptions inside;
  inside.weights = ExportOptions::Weights::kInside;
  ASSERT_TRUE(Env::Default()->FileExists(path + ".data"));
  ASSERT_TRUE(ExportOnnx(*m.spec, m.vars, m.trained.data(), path, inside).ok());
  EXPECT_FALSE(Env::Default()->FileExists(path + ".data"));
  ASSERT_TRUE(ImportModel(path).ok());
  ASSERT_TRUE(ExportOnnx(*m.spec, m.vars, m.trained.data(), dir.path() + "/one.onnx", inside).ok());
  EXPECT_FALSE(Env::Default()->FileExists(dir.path() + "/one.onnx.data"));
  ASSERT_TRUE(out.ParseFromString(*ReadFileToString(dir.path() + "/one.onnx")));
  EXPECT_EQ(FloatsOf(InitializerOf(out, "fc.weight")), TrainedValues(m, "fc.weight"));
  absl::StatusOr<std::string> bytes = ExportOnnxBytes(*m.spec, m.vars, m.trained.data());
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_EQ(*bytes, *ReadFileToString(dir.path() + "/one.onnx"));
}

// A model imported from one file exports as one, unless its .onnx would pass the limit (lowered here from 2 GB)
// or external data is asked for.
TEST(OnnxExportTest, ExternalDataWhenTheFileWouldBeTooLargeOrOnRequest) {
  dtrain::testing::ScratchDir dir("onnx_export_external");
  const Imported m = ImportAndTrain(Model(12, 32), 12);
  ASSERT_NE(m.spec, nullptr);
  ASSERT_TRUE(ExportOnnx(*m.spec, m.vars, m.trained.data(), dir.path() + "/small.onnx").ok());
  EXPECT_EQ(*Env::Default()->GetChildren(dir.path()), std::vector<std::string>({"small.onnx"}));

  ExportOptions limited;
  limited.max_file_bytes = 50000;
  ExportOptions external;
  external.weights = ExportOptions::Weights::kExternal;
  for (const ExportOptions& o : {limited, external}) {
    const std::string path = dir.path() + (o.weights == ExportOptions::Weights::kAuto ? "/large.onnx" : "/asked.onnx");
    ASSERT_TRUE(ExportOnnx(*m.spec, m.vars, m.trained.data(), path, o).ok());
    ::onnx::ModelProto out;
    ASSERT_TRUE(out.ParseFromString(*ReadFileToString(path)));
    EXPECT_EQ(InitializerOf(out, "fc.weight").data_location(), ::onnx::TensorProto::EXTERNAL);
    EXPECT_LT(ReadFileToString(path)->size(), 2000u);
    absl::StatusOr<ModelRef> again = ImportModel(path);
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_TRUE(std::static_pointer_cast<const OnnxFile>((*again)->source)->external_data);
  }
  EXPECT_EQ(ExportOnnxBytes(*m.spec, m.vars, m.trained.data(), external).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// A failure while writing either file, or renaming the data file, leaves both files as they were and no
// temporary file.
TEST(OnnxExportTest, WritesExternalDataAtomically) {
  dtrain::testing::ScratchDir dir("onnx_export_external");
  const Imported m = ImportAndTrain(Model(12, 32), 12);
  ASSERT_NE(m.spec, nullptr);
  ExportOptions o;
  o.weights = ExportOptions::Weights::kExternal;
  const std::string path = dir.path() + "/trained.onnx";
  ASSERT_TRUE(ExportOnnx(*m.spec, m.vars, m.trained.data(), path, o).ok());
  const std::string model = *ReadFileToString(path), data = *ReadFileToString(path + ".data");
  std::vector<float> other = m.trained;
  for (float& v : other) v *= 2.0f;
  for (int fault = 0; fault < 3; ++fault) {
    dtrain::testing::FaultInjectionEnv env(Env::Default());
    if (fault == 0) env.FailWritesAfter(100);  // in the data file
    if (fault == 1) env.FailWritesAfter(data.size() + 100);  // in the .onnx, the data file complete
    if (fault == 2) env.FailRenames(1);  // the data file's
    EXPECT_FALSE(ExportOnnx(*m.spec, m.vars, other.data(), path, o, &env).ok()) << fault;
    EXPECT_TRUE(*ReadFileToString(path) == model) << fault;
    EXPECT_TRUE(*ReadFileToString(path + ".data") == data) << fault;
    std::vector<std::string> files = *Env::Default()->GetChildren(dir.path());
    std::sort(files.begin(), files.end());
    EXPECT_EQ(files, std::vector<std::string>({"trained.onnx", "trained.onnx.data"})) << fault;
  }
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
