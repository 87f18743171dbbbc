// SparseBatch (deduplication across towers, row indices, the hashing trick, bags) and the DLRM graph end to end
// on the CPU: the flat and the row gradients of a training step against central differences of the loss.
#include "worker/batch/sparse_batch.h"

#include <cmath>
#include <random>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/device.h"
#include "worker/models/dlrm.h"
#include "worker/models/graph_model.h"

namespace dtrain::worker {
namespace {

// A click-through-rate batch owning its storage: dense features, one id per sparse feature (or bags).
struct CtrBatch {
  int n = 0, dense = 0, sparse = 0;
  std::vector<float> features, labels;
  std::vector<int64_t> ids;
  std::vector<int32_t> offsets;
  models::HostBatch view() const {
    models::HostBatch b{n, 1, 1, dense, features.data(), labels.data()};
    b.num_sparse = sparse;
    b.ids = ids.data();
    b.id_offsets = offsets.data();
    return b;
  }
};

CtrBatch RandomCtr(int n, int dense, int sparse, int64_t vocab, uint64_t seed) {
  CtrBatch b{n, dense, sparse, {}, {}, {}, {}};
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  for (int i = 0; i < n * dense; ++i) b.features.push_back(u(gen));
  for (int i = 0; i < n; ++i) b.labels.push_back(static_cast<float>(gen() % 2));
  b.offsets.push_back(0);
  for (int e = 0; e < n; ++e) {
    for (int f = 0; f < sparse; ++f) {
      b.ids.push_back(static_cast<int64_t>(gen() % vocab) * 1000003 + f);
      b.offsets.push_back(static_cast<int32_t>(b.ids.size()));
    }
  }
  return b;
}

TEST(SparseBatchTest, DeduplicatesAcrossTowersAndIndexesEachId) {
  models::DlrmConfig c;
  c.embedding_dim = 4;
  c.bottom = {};
  c.top = {3};
  absl::StatusOr<models::Graph> g = models::DlrmGraph(c, 2, 3);
  ASSERT_TRUE(g.ok()) << g.status();
  SparseBatch sb(*g);
  ASSERT_EQ(sb.num_tables(), 3);
  const CtrBatch a = RandomCtr(8, 2, 3, 4, 1), b = RandomCtr(8, 2, 3, 4, 2);
  ASSERT_TRUE(sb.Prepare({a.view(), b.view()}).ok());
  for (int t = 0; t < 3; ++t) {
    const std::vector<int64_t>& ids = sb.unique_ids(t);
    EXPECT_LE(ids.size(), 4u);
    for (int k = 0; k < 2; ++k) {
      const CtrBatch& batch = k == 0 ? a : b;
      const models::SparseInputs in = sb.inputs(k);
      ASSERT_EQ(in.features[t].count, 8);
      for (int e = 0; e < 8; ++e) {
        EXPECT_EQ(ids[in.features[t].indices[e]], batch.ids[e * 3 + t]) << "tower " << k << " example " << e;
      }
    }
  }
  // A one-id feature with two ids is refused, naming it.
  CtrBatch bad = a;
  bad.offsets[1] = 0;
  absl::Status s = sb.Prepare({bad.view()});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("sparse feature 0 of example 0 has 0 ids"), std::string::npos) << s;
}

TEST(SparseBatchTest, FixedSizeTablesTakeIdsModuloTheirRows) {
  models::DlrmConfig c;
  c.embedding_dim = 2;
  c.bottom = {};
  c.top = {};
  c.table_rows = 5;
  absl::StatusOr<models::Graph> g = models::DlrmGraph(c, 1, 1);
  ASSERT_TRUE(g.ok()) << g.status();
  SparseBatch sb(*g);
  CtrBatch b = RandomCtr(4, 1, 1, 100, 3);
  b.ids = {3, 8, 13, -2};
  ASSERT_TRUE(sb.Prepare({b.view()}).ok());
  EXPECT_EQ(sb.unique_ids(0), std::vector<int64_t>({3}));  // 3, 8, 13 and -2 are all row 3 of 5
  EXPECT_EQ(sb.inputs(0).features[0].count, 4);
}

// The DLRM graph trains: its dense and row gradients match central differences of the loss.
TEST(DlrmTest, GradientsMatchCentralDifferences) {
  models::DlrmConfig c;
  c.embedding_dim = 4;
  c.bottom = {6};
  c.top = {5};
  const int dense = 3, sparse = 4, batch = 6;
  absl::StatusOr<models::Graph> g = models::DlrmGraph(c, dense, sparse);
  ASSERT_TRUE(g.ok()) << g.status();
  auto dev = kernels::CreateDevice(kernels::DeviceSpec::Cpu(1));
  ASSERT_TRUE(dev.ok());
  models::ModelOptions o;
  o.batch_size = batch;
  o.height = o.width = 1;
  o.channels = dense;
  o.num_classes = 2;
  o.num_sparse = sparse;
  auto model_or = models::GraphModel::Create(*g, o, dev->get());
  ASSERT_TRUE(model_or.ok()) << model_or.status();
  models::Model& model = **model_or;
  std::vector<float> params = models::InitialParameters(g->variables, 5);
  // DLRM's biases start at zero: a unit whose inputs are all zero would then sit exactly on its ReLU's kink,
  // where a central difference is not a derivative. Nudge them.
  {
    std::mt19937_64 gen(3);
    std::uniform_real_distribution<float> u(-0.1f, 0.1f);
    for (float& p : params) p += u(gen) * 0.3f;
  }
  ASSERT_TRUE(model.SetParameters(params.data()).ok());
  const CtrBatch b = RandomCtr(batch, dense, sparse, 3, 7);  // few ids: rows are shared by several examples
  SparseBatch sb(*g);
  ASSERT_TRUE(sb.Prepare({b.view()}).ok());
  std::mt19937_64 gen(9);
  std::uniform_real_distribution<float> u(-0.5f, 0.5f);
  for (int t = 0; t < sb.num_tables(); ++t) {
    for (size_t i = 0; i < sb.unique_ids(t).size() * c.embedding_dim; ++i) sb.rows(t)[i] = u(gen);
  }
  ASSERT_TRUE(model.SetSparseInputs(sb.inputs(0)).ok());
  std::vector<float> grads(params.size());
  auto loss0 = model.TrainStep(b.view(), 0, grads.data());
  ASSERT_TRUE(loss0.ok()) << loss0.status();
  ASSERT_TRUE(sb.AverageGradients({&model}).ok());
  auto loss_at = [&]() {
    EXPECT_TRUE(model.SetParameters(params.data()).ok());
    EXPECT_TRUE(model.SetSparseInputs(sb.inputs(0)).ok());
    auto l = model.ComputeGradients(b.view(), 0);
    EXPECT_TRUE(l.ok()) << l.status();
    return l.ok() ? static_cast<double>(*l) : NAN;
  };
  const double h = 1e-3;
  auto check = [&](float* x, double analytic, const std::string& what) {
    const float saved = *x;
    *x = saved + h;
    const double plus = loss_at();
    *x = saved - h;
    const double minus = loss_at();
    *x = saved;
    const double fd = (plus - minus) / (2 * h);
    EXPECT_NEAR(analytic, fd, 2e-3 + 5e-2 * std::fabs(fd)) << what;
  };
  const std::vector<int64_t> offsets = models::Offsets(g->variables);
  for (size_t v = 0; v < g->variables.size(); ++v) {
    for (int64_t i = 0; i < std::min<int64_t>(4, g->variables[v].size()); ++i) {
      check(&params[offsets[v] + i], grads[offsets[v] + i], absl::StrCat(g->variables[v].name, "[", i, "]"));
    }
  }
  for (int t = 0; t < sb.num_tables(); ++t) {
    const std::vector<float> row_grads(sb.grads(t), sb.grads(t) + sb.unique_ids(t).size() * c.embedding_dim);
    for (size_t i = 0; i < row_grads.size(); ++i) {
      check(&sb.rows(t)[i], row_grads[i], absl::StrCat(g->tables[t].name, " row value ", i));
    }
  }
}

// An EmbeddingBag (a bag of ids per example, mean and sum) through SparseBatch and a graph: the row gradients
// match central differences, and an empty bag reads as zeros.
TEST(SparseBatchTest, BagsTrain) {
  for (bool mean : {false, true}) {
    SCOPED_TRACE(mean);
    models::GraphBuilder b("bags", models::TensorShape{{2}});
    b.SetSparseFeatures(1);
    models::TableInfo t;
    t.name = "tokens";
    t.dim = 3;
    ASSERT_TRUE(b.AddTable(t).ok());
    models::Node e;
    e.op = models::Op::kEmbedding;
    e.name = "bag";
    e.embedding.bag = true;
    e.embedding.mean = mean;
    absl::StatusOr<int> bag = b.Add(e, {});
    ASSERT_TRUE(bag.ok()) << bag.status();
    models::Node cat;
    cat.op = models::Op::kConcat;
    cat.name = "cat";
    cat.axis = 1;  // the features (full axes: the batch is axis 0)
    absl::StatusOr<int> x = b.Add(cat, {b.input(), *bag});
    ASSERT_TRUE(x.ok()) << x.status();
    x = b.Add(models::Node::Dense("fc", 1), {*x},
              {models::VarSpec("fc/w", {5, 1}, models::TruncatedNormal(0.5f)),
               models::VarSpec("fc/b", {1}, models::Constant(0.1f))});
    ASSERT_TRUE(x.ok()) << x.status();
    absl::StatusOr<models::Graph> g = b.Finish(*x, models::Loss::kSigmoidCrossEntropy);
    ASSERT_TRUE(g.ok()) << g.status();
    auto dev = kernels::CreateDevice(kernels::DeviceSpec::Cpu(1));
    ASSERT_TRUE(dev.ok());
    models::ModelOptions o;
    o.batch_size = 4;
    o.height = o.width = 1;
    o.channels = 2;
    o.num_classes = 2;
    o.num_sparse = 1;
    auto model_or = models::GraphModel::Create(*g, o, dev->get());
    ASSERT_TRUE(model_or.ok()) << model_or.status();
    models::Model& model = **model_or;
    // Bags of 3, 0, 1 and 2 ids (id 7 twice in the first).
    CtrBatch batch{4, 2, 1, {0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f, 0.7f, 0.8f}, {1, 0, 1, 0}, {7, 9, 7, 4, 9, 11},
                   {0, 3, 3, 4, 6}};
    std::vector<float> params = models::InitialParameters(g->variables, 2);
    ASSERT_TRUE(model.SetParameters(params.data()).ok());
    SparseBatch sb(*g);
    ASSERT_TRUE(sb.Prepare({batch.view()}).ok());
    ASSERT_EQ(sb.unique_ids(0), std::vector<int64_t>({7, 9, 4, 11}));
    for (size_t i = 0; i < 4 * 3; ++i) sb.rows(0)[i] = 0.1f * static_cast<float>(i % 5) - 0.2f;
    ASSERT_TRUE(model.SetSparseInputs(sb.inputs(0)).ok());
    std::vector<float> grads(params.size());
    ASSERT_TRUE(model.TrainStep(batch.view(), 0, grads.data()).ok());
    ASSERT_TRUE(sb.AverageGradients({&model}).ok());
    const std::vector<float> row_grads(sb.grads(0), sb.grads(0) + 12);
    auto loss_at = [&]() {
      EXPECT_TRUE(model.SetSparseInputs(sb.inputs(0)).ok());
      auto l = model.ComputeGradients(batch.view(), 0);
      return l.ok() ? static_cast<double>(*l) : NAN;
    };
    for (size_t i = 0; i < 12; ++i) {
      const float saved = sb.rows(0)[i];
      sb.rows(0)[i] = saved + 1e-3f;
      const double plus = loss_at();
      sb.rows(0)[i] = saved - 1e-3f;
      const double minus = loss_at();
      sb.rows(0)[i] = saved;
      EXPECT_NEAR(row_grads[i], (plus - minus) / 2e-3, 1e-3) << "row value " << i;
    }
    // The empty bag (example 1) reads as zeros: its logit is fc's bias plus its dense part only.
    std::vector<float> logits(4);
    ASSERT_TRUE(model.SetSparseInputs(sb.inputs(0)).ok());
    ASSERT_TRUE(model.Predict(batch.view(), logits.data()).ok());
    const std::vector<int64_t> off = models::Offsets(g->variables);
    EXPECT_NEAR(logits[1], 0.3f * params[off[0]] + 0.4f * params[off[0] + 1] + params[off[1]], 1e-5);
  }
}

// DLRM on a GPU (embedding lookups, the interaction, sigmoid cross-entropy in CUDA) computes the CPU's loss,
// flat gradients and row gradients on the same rows and batch.
// A feature's ids index one table one way: a second lookup of it from another table, or as bags where the first
// takes one id, is refused when the graph is built; the same lookup twice is fine.
TEST(SparseBatchTest, AFeatureIsLookedUpInOneTable) {
  models::GraphBuilder b("twice", models::TensorShape{{2}});
  b.SetSparseFeatures(2);
  for (const char* name : {"a", "b"}) {
    models::TableInfo t;
    t.name = name;
    t.dim = 3;
    ASSERT_TRUE(b.AddTable(t).ok());
  }
  auto lookup = [&](const char* name, int table, int feature, bool bag) {
    models::Node e;
    e.op = models::Op::kEmbedding;
    e.name = name;
    e.embedding.table = table;
    e.embedding.feature = feature;
    e.embedding.bag = bag;
    return b.Add(e, {});
  };
  ASSERT_TRUE(lookup("f0", 0, 0, false).ok());
  ASSERT_TRUE(lookup("f0_again", 0, 0, false).ok());
  ASSERT_TRUE(lookup("f1", 1, 1, false).ok());
  const absl::Status other_table = lookup("f0_in_b", 1, 0, false).status();
  EXPECT_EQ(other_table.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(other_table.message().find("sparse feature 0 is read by node 'f0'"), absl::string_view::npos)
      << other_table;
  EXPECT_EQ(lookup("f1_bags", 1, 1, true).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(b.graph().table_of_feature(), (std::vector<int>{0, 1}));
}

TEST(DlrmTest, GpuMatchesCpu) {
  if (kernels::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  models::DlrmConfig c;
  c.embedding_dim = 8;
  c.bottom = {16};
  c.top = {16};
  const int dense = 4, sparse = 6, batch = 32;
  absl::StatusOr<models::Graph> g = models::DlrmGraph(c, dense, sparse);
  ASSERT_TRUE(g.ok()) << g.status();
  models::ModelOptions o;
  o.batch_size = batch;
  o.height = o.width = 1;
  o.channels = dense;
  o.num_classes = 2;
  o.num_sparse = sparse;
  const CtrBatch b = RandomCtr(batch, dense, sparse, 20, 3);
  std::vector<float> params = models::InitialParameters(g->variables, 4);
  struct Run {
    float loss = 0;
    std::vector<float> grads;
    std::vector<std::vector<float>> rows;
  };
  auto run = [&](const kernels::DeviceSpec& spec) {
    Run r;
    auto dev = kernels::CreateDevice(spec);
    EXPECT_TRUE(dev.ok()) << dev.status();
    if (!dev.ok()) return r;
    auto model = models::GraphModel::Create(*g, o, dev->get());
    EXPECT_TRUE(model.ok()) << model.status();
    if (!model.ok()) return r;
    SparseBatch sb(*g);
    EXPECT_TRUE(sb.Prepare({b.view()}).ok());
    std::mt19937_64 gen(9);
    std::uniform_real_distribution<float> u(-0.3f, 0.3f);
    for (int t = 0; t < sb.num_tables(); ++t) {
      for (size_t i = 0; i < sb.unique_ids(t).size() * c.embedding_dim; ++i) sb.rows(t)[i] = u(gen);
    }
    EXPECT_TRUE((*model)->SetParameters(params.data()).ok());
    EXPECT_TRUE((*model)->SetSparseInputs(sb.inputs(0)).ok());
    r.grads.resize(params.size());
    auto loss = (*model)->TrainStep(b.view(), 0, r.grads.data());
    EXPECT_TRUE(loss.ok()) << loss.status();
    r.loss = loss.ok() ? *loss : 0;
    EXPECT_TRUE(sb.AverageGradients({model->get()}).ok());
    for (int t = 0; t < sb.num_tables(); ++t) {
      r.rows.emplace_back(sb.grads(t), sb.grads(t) + sb.unique_ids(t).size() * c.embedding_dim);
    }
    return r;
  };
  const Run cpu = run(kernels::DeviceSpec::Cpu(1)), gpu = run(kernels::DeviceSpec::Gpu(0));
  EXPECT_NEAR(cpu.loss, gpu.loss, 1e-5 * std::abs(cpu.loss) + 1e-6);
  ASSERT_EQ(cpu.grads.size(), gpu.grads.size());
  for (size_t i = 0; i < cpu.grads.size(); ++i) EXPECT_NEAR(cpu.grads[i], gpu.grads[i], 1e-4 * std::abs(cpu.grads[i]) + 1e-6) << i;
  ASSERT_EQ(cpu.rows.size(), gpu.rows.size());
  for (size_t t = 0; t < cpu.rows.size(); ++t) {
    for (size_t i = 0; i < cpu.rows[t].size(); ++i) {
      EXPECT_NEAR(cpu.rows[t][i], gpu.rows[t][i], 1e-4 * std::abs(cpu.rows[t][i]) + 1e-6) << "table " << t << " " << i;
    }
  }
}

}  // namespace
}  // namespace dtrain::worker
