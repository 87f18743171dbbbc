// The importer on embedding models (what PyTorch exports for nn.Embedding): Gather of a float initializer by the
// int64 ids input becomes a table starting from the file's rows and one Embedding node per column, stacked when
// read whole; ReduceSum / ReduceMean over the columns; the columns picked by Gather / Slice / Squeeze /
// Unsqueeze; the one-logit head (sigmoid cross-entropy; a trailing Sigmoid or Squeeze stripped); the forward
// pass on bound rows against a hand computation; export of table rows; every refusal's exact message.
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/device.h"
#include "worker/models/graph.h"
#include "worker/models/model.h"
#include "worker/models/onnx/onnx_export.h"
#include "worker/models/onnx/onnx_file.h"
#include "worker/models/onnx/onnx_import.h"
#include "worker/models/onnx/onnx_test_util.h"

namespace dtrain::models::onnx {
namespace {

using testing::IntAttr;
using testing::IntsAttr;
using testing::IntTensor;
using testing::OnnxBuilder;
using testing::Ramp;
using testing::StringAttr;

const std::string kHint = kExportHint;
// What the refusals of tables and ids say is supported.
const std::string kIds =
    "supported: Gather(table, ids) of a float initializer table [rows, dim], with columns picked by Gather(ids, k, "
    "axis=1), Slice along axis 1, Squeeze or Unsqueeze";
constexpr int64_t kInt64 = ::onnx::TensorProto::INT64;

// Click-through-rate data: `dense` dense and `sparse` categorical features.
ModelOptions Ctr(int dense, int sparse, int batch = 2) {
  ModelOptions o;
  o.batch_size = o.eval_batch_size = batch;
  o.channels = dense, o.height = o.width = 1, o.num_sparse = sparse, o.num_classes = 2;
  return o;
}

// One nn.Embedding per column of [N, 3] ids, concatenated with 4 dense features, a Linear to one logit.
OnnxBuilder PerFeature() {
  OnnxBuilder b;
  b.Input("dense", {-1, 4}).Input("ids", {-1, 3}, kInt64);
  const int64_t rows[] = {7, 5, 9};
  for (int f = 0; f < 3; ++f) {
    const std::string k = absl::StrCat("/Constant_", f), col = absl::StrCat("/Gather_", f);
    b.Initializer(absl::StrCat("emb.", f, ".weight"), {rows[f], 2}, Ramp(rows[f] * 2, 0.1f * (f + 1)))
        .Constant(IntTensor(k, {}, {f}))
        .Node("Gather", {"ids", k}, {col}, {IntAttr("axis", 1)}, col)
        .Node("Gather", {absl::StrCat("emb.", f, ".weight"), col}, {absl::StrCat("e", f)}, {},
              absl::StrCat("/emb.", f, "/Gather"));
  }
  b.Initializer("fc.weight", {1, 10}, Ramp(10, 0.05f))
      .Initializer("fc.bias", {1}, {0.25f})
      .Node("Concat", {"dense", "e0", "e1", "e2"}, {"cat"}, {IntAttr("axis", 1)}, "/Concat")
      .Node("Gemm", {"cat", "fc.weight", "fc.bias"}, {"logit"}, {IntAttr("transB", 1)}, "/fc/Gemm")
      .Output("logit", {-1, 1});
  return b;
}

// One nn.Embedding over [N, 3] ids: flattened, summed and averaged over the columns, with the dense features, a
// Linear to one logit and a Sigmoid (the head).
OnnxBuilder OneTable() {
  OnnxBuilder b;
  b.Input("dense", {-1, 4})
      .Input("ids", {-1, 3}, kInt64)
      .Initializer("emb.weight", {6, 2}, Ramp(12, 0.1f))
      .Initializer("fc.weight", {1, 14}, Ramp(14, 0.05f))
      .Initializer("fc.bias", {1}, {-0.5f})
      .Node("Gather", {"emb.weight", "ids"}, {"e"}, {}, "/emb/Gather")
      .Node("Flatten", {"e"}, {"flat"}, {IntAttr("axis", 1)}, "/Flatten")
      .Constant(IntTensor("axes", {1}, {1}))
      .Node("ReduceSum", {"e", "axes"}, {"sum"}, {IntAttr("keepdims", 0)}, "/ReduceSum")
      .Node("ReduceMean", {"e"}, {"mean"}, {IntsAttr("axes", {1}), IntAttr("keepdims", 0)}, "/ReduceMean")
      .Node("Concat", {"dense", "flat", "sum", "mean"}, {"cat"}, {IntAttr("axis", 1)}, "/Concat")
      .Node("Gemm", {"cat", "fc.weight", "fc.bias"}, {"logit"}, {IntAttr("transB", 1)}, "/fc/Gemm")
      .Node("Sigmoid", {"logit"}, {"p"}, {}, "/Sigmoid")
      .Output("p", {-1, 1});
  return b;
}

// Ids alone, [N]: one lookup, a Linear, the logit squeezed to [N] and a Sigmoid.
OnnxBuilder OneFeature() {
  OnnxBuilder b;
  b.Input("ids", {-1}, kInt64)
      .Initializer("emb.weight", {4, 3}, Ramp(12, 0.1f))
      .Initializer("fc.weight", {1, 3}, {0.5f, -1.0f, 2.0f})
      .Initializer("fc.bias", {1}, {0.1f})
      .Node("Gather", {"emb.weight", "ids"}, {"e"}, {}, "/emb/Gather")
      .Node("Gemm", {"e", "fc.weight", "fc.bias"}, {"logit"}, {IntAttr("transB", 1)}, "/fc/Gemm")
      .Constant(IntTensor("axes", {1}, {1}))
      .Node("Squeeze", {"logit", "axes"}, {"squeezed"}, {}, "/Squeeze")
      .Node("Sigmoid", {"squeezed"}, {"p"}, {}, "/Sigmoid")
      .Output("p", {-1});
  return b;
}

absl::StatusOr<ModelRef> Import(const OnnxBuilder& b) { return ImportModelFromBytes(b.Bytes(), "ctr.onnx"); }

// The message of an import, or of build_graph for `options` when the import succeeds.
std::string Refusal(const OnnxBuilder& b, const ModelOptions& options = Ctr(4, 3)) {
  absl::StatusOr<ModelRef> spec = Import(b);
  if (!spec.ok()) return std::string(spec.status().message());
  absl::StatusOr<Graph> g = (*spec)->build_graph(options);
  return g.ok() ? std::string("(accepted)") : std::string(g.status().message());
}

std::vector<const Node*> Embeddings(const Graph& g) {
  std::vector<const Node*> out;
  for (const Node& n : g.nodes) {
    if (n.op == Op::kEmbedding) out.push_back(&n);
  }
  return out;
}

// The logits of `graph`'s model for a batch whose sparse feature f of example e reads row ids[e][f] of its table
// (every table bound whole, from the file's rows).
std::vector<float> Predict(const ModelRef& spec, const ModelOptions& o, const std::vector<float>& dense,
                           const std::vector<std::vector<int32_t>>& ids) {
  auto dev = kernels::CreateDevice(kernels::DeviceSpec::Cpu(1));
  EXPECT_TRUE(dev.ok());
  auto model = CreateModel(*spec, o, dev->get());
  EXPECT_TRUE(model.ok()) << model.status();
  if (!model.ok()) return {};
  const Graph& g = (*model)->graph();
  EXPECT_TRUE((*model)->SetParameters(InitialParameters(g.variables, 1).data()).ok());
  SparseInputs in;
  in.batch = static_cast<int>(ids.size());
  for (const TableInfo& t : g.tables) in.tables.push_back({t.initial_values->data(), t.rows});
  std::vector<std::vector<int32_t>> columns(g.num_sparse_features);
  for (const auto& example : ids) {
    for (int f = 0; f < g.num_sparse_features; ++f) columns[f].push_back(example[f]);
  }
  for (const auto& c : columns) in.features.push_back({c.data(), static_cast<int64_t>(c.size()), nullptr});
  EXPECT_TRUE((*model)->SetSparseInputs(in).ok());
  std::vector<float> labels(ids.size(), 0.0f), logits(ids.size());
  HostBatch batch;
  batch.batch = static_cast<int>(ids.size());
  batch.height = batch.width = 1;
  batch.channels = o.channels;
  batch.images = dense.data();
  batch.labels = labels.data();
  // The batch's own ids (the model reads the rows bound above; these only have to be there).
  std::vector<int64_t> raw(ids.size() * g.num_sparse_features, 0);
  std::vector<int32_t> offsets(raw.size() + 1);
  for (size_t k = 0; k < offsets.size(); ++k) offsets[k] = static_cast<int32_t>(k);
  batch.num_sparse = g.num_sparse_features;
  batch.ids = raw.data();
  batch.id_offsets = offsets.data();
  EXPECT_TRUE((*model)->Predict(batch, logits.data()).ok());
  return logits;
}

float Dot(const std::vector<float>& a, const std::vector<float>& b) {
  float s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// Row r of a [rows, dim] table given as Ramp(rows * dim, scale).
std::vector<float> Row(int64_t rows, int dim, float scale, int r) {
  const std::vector<float> all = Ramp(rows * dim, scale);
  return std::vector<float>(all.begin() + r * dim, all.begin() + (r + 1) * dim);
}

TEST(OnnxEmbeddingTest, ATablePerFeatureBecomesTablesStartingFromTheFilesRows) {
  absl::StatusOr<ModelRef> spec = Import(PerFeature());
  ASSERT_TRUE(spec.ok()) << spec.status();
  const ModelDefaults& d = (*spec)->defaults;
  EXPECT_TRUE(d.ctr_data);
  EXPECT_EQ(d.sparse_optimizer, "adam");
  EXPECT_EQ(d.data_channels, 4);
  absl::StatusOr<Graph> g = (*spec)->build_graph(Ctr(4, 3));
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->loss, Loss::kSigmoidCrossEntropy);
  EXPECT_EQ(g->num_sparse_features, 3);
  EXPECT_EQ(g->input_shape().dims, std::vector<int64_t>({4}));
  ASSERT_EQ(g->tables.size(), 3u);
  const int64_t rows[] = {7, 5, 9};
  for (int t = 0; t < 3; ++t) {
    EXPECT_EQ(g->tables[t].name, absl::StrCat("emb.", t, ".weight"));
    EXPECT_EQ(g->tables[t].rows, rows[t]);
    EXPECT_EQ(g->tables[t].dim, 2);
    ASSERT_NE(g->tables[t].initial_values, nullptr);
    EXPECT_EQ(*g->tables[t].initial_values, Ramp(rows[t] * 2, 0.1f * (t + 1)));
  }
  const std::vector<const Node*> e = Embeddings(*g);
  ASSERT_EQ(e.size(), 3u);
  for (int f = 0; f < 3; ++f) {
    EXPECT_EQ(e[f]->embedding.feature, f);
    EXPECT_EQ(e[f]->embedding.table, f);
    EXPECT_EQ(e[f]->name, absl::StrCat("/emb.", f, "/Gather"));
  }
  // The tables are not variables (they live on the ps as rows).
  ASSERT_EQ(g->variables.size(), 2u);
  EXPECT_EQ(g->variables[0].name, "fc.weight");

  // Forward: [dense, e0, e1, e2] . fc.weight + 0.25.
  const std::vector<float> dense = {1, 2, 3, 4, -1, 0.5f, 0, 2};
  const std::vector<std::vector<int32_t>> ids = {{6, 0, 8}, {2, 4, 1}};
  const std::vector<float> logits = Predict(*spec, Ctr(4, 3), dense, ids);
  ASSERT_EQ(logits.size(), 2u);
  for (int i = 0; i < 2; ++i) {
    std::vector<float> x(dense.begin() + 4 * i, dense.begin() + 4 * i + 4);
    for (int f = 0; f < 3; ++f) {
      const std::vector<float> r = Row(rows[f], 2, 0.1f * (f + 1), ids[i][f]);
      x.insert(x.end(), r.begin(), r.end());
    }
    EXPECT_NEAR(logits[i], Dot(x, Ramp(10, 0.05f)) + 0.25f, 1e-6) << i;
  }
}

TEST(OnnxEmbeddingTest, OneTableOverAllColumnsStacksSumsAndAverages) {
  absl::StatusOr<ModelRef> spec = Import(OneTable());
  ASSERT_TRUE(spec.ok()) << spec.status();
  absl::StatusOr<Graph> g = (*spec)->build_graph(Ctr(4, 3));
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->loss, Loss::kSigmoidCrossEntropy);  // the Sigmoid is the head, stripped
  EXPECT_EQ(g->tensor_names[g->output], "logit");
  ASSERT_EQ(g->tables.size(), 1u);
  const std::vector<const Node*> e = Embeddings(*g);
  ASSERT_EQ(e.size(), 3u);
  for (int f = 0; f < 3; ++f) {
    EXPECT_EQ(e[f]->embedding.table, 0);
    EXPECT_EQ(e[f]->embedding.feature, f);
    EXPECT_EQ(e[f]->name, absl::StrCat("/emb/Gather:", f));
  }
  int adds = 0, muls = 0, stacks = 0;
  for (const Node& n : g->nodes) {
    adds += n.op == Op::kBinary && n.binary == kernels::BinaryOp::kAdd;
    muls += n.op == Op::kBinary && n.binary == kernels::BinaryOp::kMul;
    stacks += n.op == Op::kConcat && n.name == "/emb/Gather/stack";
  }
  EXPECT_EQ(adds, 4);    // two for the sum, two for the mean
  EXPECT_EQ(muls, 1);    // the mean's 1/3
  EXPECT_EQ(stacks, 1);  // the stack, for the Flatten only
  // The 1/3: a constant variable, beside the trainable fc.weight and fc.bias.
  ASSERT_EQ(g->variables.size(), 3u);
  EXPECT_EQ(g->variables[0].name, "mean/1/3");
  EXPECT_FALSE(g->variables[0].trainable);

  const std::vector<float> dense = {1, 2, 3, 4, 0, 0, -1, 1};
  const std::vector<std::vector<int32_t>> ids = {{0, 5, 5}, {3, 1, 2}};
  const std::vector<float> logits = Predict(*spec, Ctr(4, 3), dense, ids);
  ASSERT_EQ(logits.size(), 2u);
  for (int i = 0; i < 2; ++i) {
    std::vector<float> x(dense.begin() + 4 * i, dense.begin() + 4 * i + 4), sum(2, 0.0f);
    for (int f = 0; f < 3; ++f) {
      const std::vector<float> r = Row(6, 2, 0.1f, ids[i][f]);
      x.insert(x.end(), r.begin(), r.end());
      sum[0] += r[0], sum[1] += r[1];
    }
    x.insert(x.end(), sum.begin(), sum.end());
    x.insert(x.end(), {sum[0] / 3, sum[1] / 3});
    EXPECT_NEAR(logits[i], Dot(x, Ramp(14, 0.05f)) - 0.5f, 1e-6) << i;
  }
}

TEST(OnnxEmbeddingTest, IdsAloneWithASqueezedLogitAndASigmoidHead) {
  absl::StatusOr<ModelRef> spec = Import(OneFeature());
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ((*spec)->defaults.data_channels, 1);
  const ModelOptions o = Ctr(13, 1);  // the data's dense features: read by nothing
  absl::StatusOr<Graph> g = (*spec)->build_graph(o);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->loss, Loss::kSigmoidCrossEntropy);
  EXPECT_EQ(g->tensor_names[g->output], "logit");
  EXPECT_EQ(g->num_sparse_features, 1);
  const std::vector<float> logits = Predict(*spec, o, std::vector<float>(26, 9.0f), {{3}, {0}});
  ASSERT_EQ(logits.size(), 2u);
  for (int i = 0; i < 2; ++i) {
    EXPECT_NEAR(logits[i], Dot(Row(4, 3, 0.1f, i == 0 ? 3 : 0), {0.5f, -1.0f, 2.0f}) + 0.1f, 1e-6);
  }
  // Another number of categorical features, images, another class count: named.
  EXPECT_EQ(Refusal(OneFeature(), Ctr(13, 26)),
            "ctr.onnx: the model's input 'ids' takes 1 categorical feature per example (int64 ids) but the data set "
            "has 26; train it on data with that many or export it for these");
  ModelOptions images;
  EXPECT_EQ(Refusal(OneFeature(), images),
            "ctr.onnx: the model's input 'ids' takes 1 categorical feature per example (int64 ids) but the data set "
            "has 0 (images; train it on click-through-rate data, e.g. --data_format=criteo)");
  ModelOptions ten = Ctr(13, 1);
  ten.num_classes = 10;
  EXPECT_EQ(Refusal(OneFeature(), ten), "ctr.onnx: the model's output 'logit' is one logit (sigmoid cross-entropy "
                                        "against 0/1 labels) but the data set has 10 classes");
  EXPECT_EQ(Refusal(PerFeature(), Ctr(5, 3)),
            "ctr.onnx: the model's input 'dense' takes 4 values per example but the data set has 5 dense features; "
            "train it on data with 4 dense features or export it for 5");
}

// Columns picked by Slice ([N, 2]) and by Gather + Unsqueeze ([N, 1]), a lookup squeezed back to [N, dim].
TEST(OnnxEmbeddingTest, ColumnsPickedBySliceGatherSqueezeAndUnsqueeze) {
  OnnxBuilder b;
  b.Input("ids", {-1, 3}, kInt64)
      .Initializer("a.weight", {5, 2}, Ramp(10, 0.1f))
      .Initializer("b.weight", {4, 2}, Ramp(8, 0.2f))
      .Initializer("fc.weight", {1, 6}, Ramp(6, 0.05f))
      .Constant(IntTensor("starts", {1}, {1}))
      .Constant(IntTensor("ends", {1}, {INT64_MAX}))
      .Constant(IntTensor("axes", {1}, {1}))
      .Node("Slice", {"ids", "starts", "ends", "axes"}, {"last2"}, {}, "/Slice")
      .Node("Gather", {"a.weight", "last2"}, {"ea"}, {}, "/a/Gather")
      .Constant(IntTensor("shape", {2}, {-1, 4}))
      .Node("Reshape", {"ea", "shape"}, {"flat"}, {}, "/Reshape")
      .Constant(IntTensor("zero", {}, {0}))
      .Node("Gather", {"ids", "zero"}, {"first"}, {IntAttr("axis", 1)}, "/Gather")
      .Node("Unsqueeze", {"first", "axes"}, {"first1"}, {}, "/Unsqueeze")
      .Node("Gather", {"b.weight", "first1"}, {"eb"}, {}, "/b/Gather")
      .Node("Squeeze", {"eb", "axes"}, {"eb2"}, {}, "/Squeeze")
      .Node("Concat", {"flat", "eb2"}, {"cat"}, {IntAttr("axis", 1)}, "/Concat")
      .Node("Gemm", {"cat", "fc.weight"}, {"logit"}, {IntAttr("transB", 1)}, "/fc/Gemm")
      .Output("logit", {-1, 1});
  absl::StatusOr<ModelRef> spec = Import(b);
  ASSERT_TRUE(spec.ok()) << spec.status();
  absl::StatusOr<Graph> g = (*spec)->build_graph(Ctr(2, 3));
  ASSERT_TRUE(g.ok()) << g.status();
  const std::vector<const Node*> e = Embeddings(*g);
  ASSERT_EQ(e.size(), 3u);
  EXPECT_EQ(e[0]->embedding.feature, 1);
  EXPECT_EQ(e[1]->embedding.feature, 2);
  EXPECT_EQ(e[2]->embedding.feature, 0);
  EXPECT_EQ(e[2]->embedding.table, 1);
  const std::vector<float> logits = Predict(*spec, Ctr(2, 3), {0, 0, 0, 0}, {{1, 4, 0}, {3, 2, 2}});
  ASSERT_EQ(logits.size(), 2u);
  for (int i = 0; i < 2; ++i) {
    const int32_t c[2][3] = {{1, 4, 0}, {3, 2, 2}};
    std::vector<float> x = Row(5, 2, 0.1f, c[i][1]);
    for (float v : Row(5, 2, 0.1f, c[i][2])) x.push_back(v);
    for (float v : Row(4, 2, 0.2f, c[i][0])) x.push_back(v);
    EXPECT_NEAR(logits[i], Dot(x, Ramp(6, 0.05f)), 1e-6) << i;
  }
}

TEST(OnnxEmbeddingTest, ExportWritesEachTablesRows) {
  absl::StatusOr<ModelRef> spec = Import(OneTable());
  ASSERT_TRUE(spec.ok()) << spec.status();
  absl::StatusOr<Graph> g = (*spec)->build_graph(Ctr(4, 3));
  ASSERT_TRUE(g.ok()) << g.status();
  const std::vector<float> params = InitialParameters(g->variables, 1);
  TableRows rows = FileTableRows(*g);
  ASSERT_EQ(rows.size(), 1u);
  rows["emb.weight"][5] = 42.0f;
  absl::StatusOr<std::string> bytes = ExportOnnxBytes(**spec, g->variables, params.data(), rows);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  ::onnx::ModelProto out;
  ASSERT_TRUE(out.ParseFromString(*bytes));
  std::vector<float> written;
  for (const ::onnx::TensorProto& t : out.graph().initializer()) {
    if (t.name() != "emb.weight") continue;
    ASSERT_EQ(t.raw_data().size(), 12 * sizeof(float));
    written.resize(12);
    std::memcpy(written.data(), t.raw_data().data(), t.raw_data().size());
    EXPECT_EQ(std::vector<int64_t>(t.dims().begin(), t.dims().end()), std::vector<int64_t>({6, 2}));
  }
  EXPECT_EQ(written, rows["emb.weight"]);
  // The rows read back as the table's initial values.
  absl::StatusOr<ModelRef> again = ImportModelFromBytes(*bytes, "again.onnx");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*(*again)->build_graph(Ctr(4, 3))->tables[0].initial_values, rows["emb.weight"]);

  // No rows for a table, rows of another size, rows for what is no initializer.
  EXPECT_EQ(ExportOnnxBytes(**spec, g->variables, params.data()).status().message(),
            "ctr.onnx: no rows for the embedding table 'emb.weight' (its rows live on the ps: export with "
            "dtrain_worker --export_onnx, or dtrain_eval --checkpoint=DIR --export=FILE.onnx)");
  TableRows short_rows = rows;
  short_rows["emb.weight"].pop_back();
  EXPECT_EQ(ExportOnnxBytes(**spec, g->variables, params.data(), short_rows).status().message(),
            "ctr.onnx: 11 values for the embedding table 'emb.weight' of shape 6x2");
  TableRows extra = rows;
  extra["nothing"] = {1.0f};
  EXPECT_EQ(ExportOnnxBytes(**spec, g->variables, params.data(), extra).status().message(),
            "ctr.onnx: rows for 'nothing', which is not an initializer");
}

// ---- refusals ----

TEST(OnnxEmbeddingTest, RefusesAGatherOnATableThatIsNoInitializer) {
  OnnxBuilder b;
  b.Input("ids", {-1}, kInt64)
      .Input("x", {-1, 3})
      .Initializer("fc.weight", {1, 3}, {1, 1, 1})
      .Node("Gather", {"x", "ids"}, {"e"}, {}, "/emb/Gather")
      .Node("Gemm", {"e", "fc.weight"}, {"logit"}, {IntAttr("transB", 1)}, "/fc/Gemm")
      .Output("logit", {-1, 1});
  EXPECT_EQ(Refusal(b, Ctr(3, 1)),
            absl::StrCat("ctr.onnx: node '/emb/Gather' (Gather): its table 'x' is computed by the graph (", kIds,
                         "); ", kHint));
}

TEST(OnnxEmbeddingTest, RefusesAGatherAlongTheTablesColumns) {
  // [4, 3] gathered along axis 1 by [N] ids is [4, N].
  OnnxBuilder c;
  c.Input("ids", {-1}, kInt64)
      .Initializer("emb.weight", {4, 3}, Ramp(12))
      .Node("Gather", {"emb.weight", "ids"}, {"e"}, {IntAttr("axis", 1)}, "/emb/Gather")
      .Output("e", {4, -1});
  EXPECT_EQ(Refusal(c, Ctr(1, 1)),
            absl::StrCat("ctr.onnx: node '/emb/Gather' (Gather): attribute axis=1 gathers columns of the table "
                         "'emb.weight' (supported: axis=0, its rows, as nn.Embedding exports); ",
                         kHint));
}

TEST(OnnxEmbeddingTest, RefusesEmbeddingBagAsLoopOrATen) {
  // A Loop whose body gathers rows and sums them, as PyTorch 1.13 exports nn.EmbeddingBag (after ops of its
  // own, such as ReduceProd and Range, that are not named).
  OnnxBuilder b = OneFeature();
  auto* g = b.model().mutable_graph();
  ::onnx::NodeProto* rp = g->add_node();
  rp->set_op_type("ReduceProd");
  rp->set_name("/emb/ReduceProd");
  rp->add_input("ids");
  rp->add_output("rp");
  g->mutable_node()->SwapElements(0, g->node_size() - 1);
  ::onnx::NodeProto* loop = g->add_node();
  loop->set_op_type("Loop");
  loop->set_name("/emb/Loop");
  loop->add_input("");
  loop->add_input("");
  loop->add_output("bag");
  ::onnx::AttributeProto* body = loop->add_attribute();
  body->set_name("body");
  body->set_type(::onnx::AttributeProto::GRAPH);
  for (const char* op : {"Gather", "ReduceSum"}) {
    ::onnx::NodeProto* n = body->mutable_g()->add_node();
    n->set_op_type(op);
  }
  EXPECT_EQ(Refusal(b, Ctr(1, 1)),
            absl::StrCat("ctr.onnx: node '/emb/Loop' (Loop): a Loop that gathers and reduces rows: nn.EmbeddingBag "
                         "exports as a Loop (or, with ATen fallback, an ATen op) dtrain cannot train; supported: "
                         "nn.Embedding on int64 ids [N] or [N, F], then .sum(1) or .mean(1) for a bag of F ids; ",
                         kHint));
  OnnxBuilder aten = OneFeature();
  ::onnx::NodeProto* n = aten.model().mutable_graph()->mutable_node(0);
  n->set_op_type("ATen");
  n->set_domain("org.pytorch.aten");
  *n->add_attribute() = StringAttr("operator", "embedding_bag");
  EXPECT_EQ(Refusal(aten, Ctr(1, 1)),
            absl::StrCat("ctr.onnx: node '/emb/Gather' (ATen): PyTorch's ATen operator 'embedding_bag' is not "
                         "supported: nn.EmbeddingBag exports as a Loop (or, with ATen fallback, an ATen op) dtrain "
                         "cannot train; supported: nn.Embedding on int64 ids [N] or [N, F], then .sum(1) or "
                         ".mean(1) for a bag of F ids; ",
                         kHint));
}

TEST(OnnxEmbeddingTest, RefusesIdsThatAreNotInt64OrAreComputed) {
  OnnxBuilder i32 = OneFeature();
  i32.model().mutable_graph()->mutable_input(0)->mutable_type()->mutable_tensor_type()->set_elem_type(
      ::onnx::TensorProto::INT32);
  EXPECT_EQ(Refusal(i32, Ctr(1, 1)),
            absl::StrCat("ctr.onnx: input 'ids' has type INT32 (supported: INT64 ids, as nn.Embedding takes them; "
                         "export with torch.long ids); ",
                         kHint));
  // ids + 1 (an offset per feature into one shared table, say).
  OnnxBuilder add;
  add.Input("ids", {-1}, kInt64)
      .Initializer("emb.weight", {4, 3}, Ramp(12))
      .Initializer("fc.weight", {1, 3}, {1, 1, 1})
      .Constant(IntTensor("one", {}, {1}))
      .Node("Add", {"ids", "one"}, {"shifted"}, {}, "/Add")
      .Node("Gather", {"emb.weight", "shifted"}, {"e"}, {}, "/emb/Gather")
      .Node("Gemm", {"e", "fc.weight"}, {"logit"}, {IntAttr("transB", 1)}, "/fc/Gemm")
      .Output("logit", {-1, 1});
  EXPECT_EQ(Refusal(add, Ctr(1, 1)),
            absl::StrCat("ctr.onnx: node '/Add' (Add): reads the ids 'ids' (the int64 input, which dtrain feeds as "
                         "the rows of its embedding tables) as a tensor: computed ids are not supported (", kIds,
                         "); ", kHint));
  // Cast of the ids to int32.
  OnnxBuilder cast;
  cast.Input("ids", {-1}, kInt64)
      .Initializer("emb.weight", {4, 3}, Ramp(12))
      .Node("Cast", {"ids"}, {"ids32"}, {IntAttr("to", ::onnx::TensorProto::INT32)}, "/Cast")
      .Node("Gather", {"emb.weight", "ids32"}, {"e"}, {}, "/emb/Gather")
      .Output("e", {-1, 3});
  EXPECT_EQ(Refusal(cast, Ctr(1, 1)),
            absl::StrCat("ctr.onnx: node '/Cast' (Cast): Cast of the ids to INT32 is not supported (supported: INT64 "
                         "ids, as nn.Embedding takes them); ",
                         kHint));
  // Rows at constant indices (a positional embedding) are a tensor of the weight, computed in the graph; but
  // as the output, without a batch axis, they are no logits.
  OnnxBuilder pos;
  pos.Input("ids", {-1}, kInt64)
      .Initializer("pos.weight", {4, 3}, Ramp(12))
      .Constant(IntTensor("where", {2}, {0, 1}))
      .Node("Gather", {"pos.weight", "where"}, {"p"}, {}, "/pos/Gather")
      .Output("p", {2, 3});
  EXPECT_EQ(Refusal(pos, Ctr(1, 1)), "ctr: the output 'p' has shape 2x3; expected the batch as its first axis");
  // Indices computed from the dense features.
  OnnxBuilder computed;
  computed.Input("x", {-1, 1})
      .Input("ids", {-1}, kInt64)
      .Initializer("emb.weight", {4, 3}, Ramp(12))
      .Node("Cast", {"x"}, {"xi"}, {IntAttr("to", kInt64)}, "/Cast")
      .Node("Gather", {"emb.weight", "xi"}, {"e"}, {}, "/emb/Gather")
      .Output("e", {-1, 1, 3});
  EXPECT_EQ(Refusal(computed, Ctr(1, 1)),
            absl::StrCat("ctr.onnx: node '/Cast' (Cast): Cast of a tensor computed from the input is not supported "
                         "(supported: Cast of constants, i.e. shape arithmetic); ",
                         kHint));
  // A second int64 input.
  OnnxBuilder two = OneFeature();
  auto* in = two.model().mutable_graph()->add_input();
  *in = two.model().graph().input(0);
  in->set_name("more_ids");
  EXPECT_EQ(Refusal(two, Ctr(1, 1)),
            absl::StrCat("ctr.onnx: input 'more_ids' is a second int64 input (supported: one input of ids, [N] or "
                         "[N, F]: 'ids'); ",
                         kHint));
}

TEST(OnnxEmbeddingTest, RefusesTiedTablesAFeatureInTwoTablesAndOtherReductions) {
  // The table is also the weight of a Gemm (tied input and output embeddings).
  OnnxBuilder tied;
  tied.Input("ids", {-1}, kInt64)
      .Initializer("emb.weight", {4, 3}, Ramp(12))
      .Node("Gather", {"emb.weight", "ids"}, {"e"}, {}, "/emb/Gather")
      .Node("Gemm", {"e", "emb.weight"}, {"logit"}, {IntAttr("transB", 1)}, "/fc/Gemm")
      .Output("logit", {-1, 4});
  EXPECT_EQ(Refusal(tied, Ctr(1, 1)),
            absl::StrCat("ctr.onnx: node '/fc/Gemm' (Gemm): its weight 'emb.weight' is an embedding table (a Gather "
                         "reads it), whose rows live on the ps (supported: a table that only Gather reads); ",
                         kHint));
  // Column 0 in two tables.
  OnnxBuilder two;
  two.Input("ids", {-1}, kInt64)
      .Initializer("a.weight", {4, 2}, Ramp(8))
      .Initializer("b.weight", {4, 2}, Ramp(8))
      .Initializer("fc.weight", {1, 4}, Ramp(4))
      .Node("Gather", {"a.weight", "ids"}, {"ea"}, {}, "/a/Gather")
      .Node("Gather", {"b.weight", "ids"}, {"eb"}, {}, "/b/Gather")
      .Node("Concat", {"ea", "eb"}, {"cat"}, {IntAttr("axis", 1)}, "/Concat")
      .Node("Gemm", {"cat", "fc.weight"}, {"logit"}, {IntAttr("transB", 1)}, "/fc/Gemm")
      .Output("logit", {-1, 1});
  EXPECT_EQ(Refusal(two, Ctr(1, 1)),
            absl::StrCat("ctr.onnx: node '/b/Gather' (Gather): column 0 of the ids is looked up in tables 'a.weight' "
                         "and 'b.weight' (supported: each column in one table); ",
                         kHint));
  // ReduceSum over the embedding dimension.
  OnnxBuilder b;
  b.Input("ids", {-1, 3}, kInt64)
      .Initializer("emb.weight", {6, 2}, Ramp(12))
      .Initializer("fc.weight", {1, 3}, Ramp(3))
      .Node("Gather", {"emb.weight", "ids"}, {"e"}, {}, "/emb/Gather")
      .Constant(IntTensor("axes", {1}, {2}))
      .Node("ReduceSum", {"e", "axes"}, {"sum"}, {IntAttr("keepdims", 0)}, "/ReduceSum")
      .Node("Gemm", {"sum", "fc.weight"}, {"logit"}, {IntAttr("transB", 1)}, "/fc/Gemm")
      .Output("logit", {-1, 1});
  EXPECT_EQ(Refusal(b, Ctr(1, 3)),
            absl::StrCat("ctr.onnx: node '/ReduceSum' (ReduceSum): ReduceSum over axes [2] of 'e' is not supported "
                         "(supported: over axis 1, the columns, of an embedding lookup of [N, F] ids: [N, F, dim] -> "
                         "[N, dim], as .sum(1) / .mean(1)); ",
                         kHint));
}

}  // namespace
}  // namespace dtrain::models::onnx
