#include "worker/models/dlrm.h"

#include <cmath>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"

namespace dtrain::models {
namespace {

// Xavier-like weights (stddev sqrt(2 / (in + out)), truncated), zero biases.
absl::StatusOr<int> Linear(GraphBuilder* b, int x, const std::string& name, int out) {
  const int64_t in = b->shape(x).dims[0];
  const float stddev = std::sqrt(2.0f / static_cast<float>(in + out));
  return b->Add(Node::Dense(name, out), {x},
                {VarSpec(name + "/weights", {in, out}, TruncatedNormal(stddev)),
                 VarSpec(name + "/biases", {out}, Constant(0.0f))});
}

absl::StatusOr<int> Mlp(GraphBuilder* b, int x, const std::string& prefix, const std::vector<int>& widths,
                        bool relu_last) {
  for (size_t i = 0; i < widths.size(); ++i) {
    const std::string name = absl::StrCat(prefix, i);
    ASSIGN_OR_RETURN(x, Linear(b, x, name, widths[i]));
    if (i + 1 < widths.size() || relu_last) {
      ASSIGN_OR_RETURN(x, b->Add(Node::Relu(name + "/relu"), {x}));
    }
  }
  return x;
}

absl::StatusOr<std::vector<int>> Widths(const std::string& flag, const std::string& text) {
  std::vector<int> out;
  if (text.empty()) return out;
  for (absl::string_view w : absl::StrSplit(text, ',')) {
    int v = 0;
    if (!absl::SimpleAtoi(w, &v) || v < 1) {
      return absl::InvalidArgumentError(absl::StrCat("--", flag, "=", text, ": expected positive widths separated by "
                                                     "commas, e.g. 128,64"));
    }
    out.push_back(v);
  }
  return out;
}

}  // namespace

absl::StatusOr<DlrmConfig> ParseDlrmConfig(int embedding_dim, const std::string& bottom, const std::string& top,
                                           int64_t table_rows, int64_t max_rows, int admit_after) {
  DlrmConfig c;
  if (embedding_dim < 1) return absl::InvalidArgumentError("--embedding_dim must be > 0");
  if (table_rows < 0 || max_rows < 0 || admit_after < 0) {
    return absl::InvalidArgumentError("--table_rows, --max_rows and --admit_after must be >= 0");
  }
  if (admit_after > 255) return absl::InvalidArgumentError("--admit_after must be at most 255");
  c.embedding_dim = embedding_dim;
  ASSIGN_OR_RETURN(c.bottom, Widths("dlrm_bottom", bottom));
  ASSIGN_OR_RETURN(c.top, Widths("dlrm_top", top));
  c.table_rows = table_rows;
  c.max_rows = max_rows;
  c.admit_after = admit_after;
  return c;
}

absl::StatusOr<Graph> DlrmGraph(const DlrmConfig& c, int num_dense, int num_sparse) {
  if (c.embedding_dim < 1 || num_dense < 1 || num_sparse < 1 || c.table_rows < 0 || c.max_rows < 0 ||
      c.admit_after < 0) {
    return absl::InvalidArgumentError(absl::StrCat("dlrm: needs dense and sparse features (got ", num_dense, " and ",
                                                   num_sparse, "; click-through-rate data such as --data_format="
                                                   "criteo) and a positive embedding dimension"));
  }
  for (int w : c.bottom) {
    if (w < 1) return absl::InvalidArgumentError("dlrm: MLP widths must be positive");
  }
  for (int w : c.top) {
    if (w < 1) return absl::InvalidArgumentError("dlrm: MLP widths must be positive");
  }
  GraphBuilder b("dlrm", TensorShape{{num_dense}}, "dense");
  b.SetSparseFeatures(num_sparse);
  // Bottom MLP: the hidden widths, then the embedding dimension (so its output stacks with the embeddings).
  std::vector<int> bottom = c.bottom;
  bottom.push_back(c.embedding_dim);
  ASSIGN_OR_RETURN(const int bot, Mlp(&b, b.input(), "bottom", bottom, /*relu_last=*/true));
  std::vector<int> stacked = {bot};
  for (int f = 0; f < num_sparse; ++f) {
    TableInfo t;
    t.name = absl::StrCat("embedding/C", f + 1);
    t.dim = c.embedding_dim;
    t.rows = c.table_rows;
    // DLRM's uniform(-sqrt(1 / rows), sqrt(1 / rows)); hash tables, whose size is open, as a 10,000-row one.
    t.init_scale = 1.0f / std::sqrt(static_cast<float>(c.table_rows > 0 ? c.table_rows : 10000));
    t.max_rows = c.max_rows;
    t.admit_after = c.admit_after;
    ASSIGN_OR_RETURN(const int table, b.AddTable(t));
    Node e;
    e.op = Op::kEmbedding;
    e.name = absl::StrCat("embedding/C", f + 1, "/lookup");
    e.embedding.table = table;
    e.embedding.feature = f;
    ASSIGN_OR_RETURN(const int out, b.Add(e, {}));
    stacked.push_back(out);
  }
  Node cat;
  cat.op = Op::kConcat;
  cat.name = "stack";
  cat.axis = 1;  // the features (full axes: the batch is axis 0)
  ASSIGN_OR_RETURN(int z, b.Add(cat, stacked));
  const int64_t rows = num_sparse + 1;
  ASSIGN_OR_RETURN(z, b.Add(Node::Reshape("stack/rows", {rows, c.embedding_dim}, FlattenOrder::kChannelsFirst), {z}));
  Node inter;
  inter.op = Op::kInteraction;
  inter.name = "interaction";
  ASSIGN_OR_RETURN(const int dots, b.Add(inter, {z}));
  Node top_in;
  top_in.op = Op::kConcat;
  top_in.name = "top/input";
  top_in.axis = 1;
  ASSIGN_OR_RETURN(int x, b.Add(top_in, {bot, dots}));
  std::vector<int> top = c.top;
  top.push_back(1);
  ASSIGN_OR_RETURN(x, Mlp(&b, x, "top", top, /*relu_last=*/false));
  return b.Finish(x, Loss::kSigmoidCrossEntropy);
}

}  // namespace dtrain::models
