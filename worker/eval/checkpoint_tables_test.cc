// CheckpointTables: the checks against the model's tables (each message names the difference and its flag), the
// rows an evaluation batch reads (from the checkpoint, else the initializer the ps would use; ids of a fixed-size
// table modulo its rows) and the exported arrays.
#include "worker/eval/checkpoint_tables.h"

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "worker/models/dlrm.h"

namespace dtrain::worker {
namespace {

models::Graph Dlrm(int64_t table_rows, int num_sparse = 2) {
  models::DlrmConfig c;
  c.embedding_dim = 3;
  c.bottom = {};
  c.top = {2};
  c.table_rows = table_rows;
  absl::StatusOr<models::Graph> g = models::DlrmGraph(c, 2, num_sparse);
  EXPECT_TRUE(g.ok()) << g.status();
  return *g;
}

// What ReadSparseTables gives for the graph's tables: table t holds `ids` (ascending) with values 100 t + i.
std::vector<ps::SparseTableRows> Saved(const models::Graph& g, const std::vector<int64_t>& ids) {
  std::vector<ps::SparseTableRows> out;
  for (size_t t = 0; t < g.tables.size(); ++t) {
    ps::SparseTableRows r;
    r.spec.table = static_cast<uint32_t>(t);
    r.spec.name = g.tables[t].name;
    r.spec.dim = g.tables[t].dim;
    r.spec.rows = g.tables[t].rows;
    r.spec.init_scale = g.tables[t].init_scale;
    r.spec.init_seed = 7;
    r.ids = ids;
    for (size_t i = 0; i < ids.size() * r.spec.dim; ++i) r.values.push_back(100.0f * t + i);
    out.push_back(r);
  }
  return out;
}

// One example per id pair: feature 0 reads ids0[e], feature 1 ids1[e].
struct Batch {
  std::vector<float> dense, labels;
  std::vector<int64_t> ids;
  std::vector<int32_t> offsets = {0};
  models::HostBatch view() const {
    models::HostBatch b{static_cast<int>(labels.size()), 1, 1, 2, dense.data(), labels.data()};
    b.num_sparse = 2;
    b.ids = ids.data();
    b.id_offsets = offsets.data();
    return b;
  }
};
Batch MakeBatch(const std::vector<int64_t>& ids0, const std::vector<int64_t>& ids1) {
  Batch b;
  for (size_t e = 0; e < ids0.size(); ++e) {
    b.dense.insert(b.dense.end(), {0.5f, 0.25f});
    b.labels.push_back(e % 2);
    for (int64_t id : {ids0[e], ids1[e]}) {
      b.ids.push_back(id);
      b.offsets.push_back(static_cast<int32_t>(b.ids.size()));
    }
  }
  return b;
}

TEST(CheckpointTablesTest, RowsComeFromTheCheckpointElseFromTheInitializer) {
  const models::Graph g = Dlrm(/*table_rows=*/0);
  const std::vector<ps::SparseTableRows> saved = Saved(g, {-4, 10, 123456789});
  absl::StatusOr<CheckpointTables> tables = CheckpointTables::Create(saved, g.tables);
  ASSERT_TRUE(tables.ok()) << tables.status();
  SparseBatch sb(g);
  const Batch b = MakeBatch({10, 55, 10}, {123456789, -4, 77});
  ASSERT_TRUE(sb.Prepare({b.view()}).ok());
  tables->FillRows(&sb);
  for (int t = 0; t < 2; ++t) {
    const std::vector<int64_t>& ids = sb.unique_ids(t);
    for (size_t i = 0; i < ids.size(); ++i) {
      std::vector<float> want(3);
      const auto& s = saved[t];
      const auto it = std::find(s.ids.begin(), s.ids.end(), ids[i]);
      if (it != s.ids.end()) {
        const size_t k = it - s.ids.begin();
        want.assign(s.values.begin() + k * 3, s.values.begin() + k * 3 + 3);
      } else {
        ps::SparseInitialRow(s.spec, ids[i], want.data());
        EXPECT_NE(want[0], 0.0f);
      }
      EXPECT_EQ(std::vector<float>(sb.rows(t) + i * 3, sb.rows(t) + i * 3 + 3), want) << "table " << t << " id "
                                                                                        << ids[i];
    }
  }
}

TEST(CheckpointTablesTest, FixedSizeTablesTakeIdsModuloTheirRows) {
  const models::Graph g = Dlrm(/*table_rows=*/10);
  absl::StatusOr<CheckpointTables> tables = CheckpointTables::Create(Saved(g, {3}), g.tables);
  ASSERT_TRUE(tables.ok()) << tables.status();
  SparseBatch sb(g);
  const Batch b = MakeBatch({13}, {-7});  // rows 3 and 3
  ASSERT_TRUE(sb.Prepare({b.view()}).ok());
  tables->FillRows(&sb);
  EXPECT_EQ(std::vector<float>(sb.rows(0), sb.rows(0) + 3), (std::vector<float>{0, 1, 2}));
  EXPECT_EQ(std::vector<float>(sb.rows(1), sb.rows(1) + 3), (std::vector<float>{100, 101, 102}));
}

// A table from an ONNX file: the rows the checkpoint lacks are the file's.
TEST(CheckpointTablesTest, RowsATableWithInitialValuesLacksAreItsInitialValues) {
  models::Graph g = Dlrm(/*table_rows=*/10);
  for (models::TableInfo& t : g.tables) {
    auto values = std::make_shared<std::vector<float>>(30);
    for (int i = 0; i < 30; ++i) (*values)[i] = -1.0f - i;
    t.initial_values = values;
  }
  absl::StatusOr<CheckpointTables> tables = CheckpointTables::Create(Saved(g, {3}), g.tables);
  ASSERT_TRUE(tables.ok()) << tables.status();
  SparseBatch sb(g);
  const Batch b = MakeBatch({13}, {5});  // rows 3 (held) and 5 (not)
  ASSERT_TRUE(sb.Prepare({b.view()}).ok());
  tables->FillRows(&sb);
  EXPECT_EQ(std::vector<float>(sb.rows(0), sb.rows(0) + 3), (std::vector<float>{0, 1, 2}));
  EXPECT_EQ(std::vector<float>(sb.rows(1), sb.rows(1) + 3), (std::vector<float>{-16, -17, -18}));
}

// No checkpoint (dtrain_eval --model=FILE.onnx): every row is the file's.
TEST(CheckpointTablesTest, FromTheModelEveryRowIsItsInitialValues) {
  models::Graph g = Dlrm(/*table_rows=*/10);
  for (models::TableInfo& t : g.tables) {
    auto values = std::make_shared<std::vector<float>>(30);
    for (int i = 0; i < 30; ++i) (*values)[i] = 0.5f * i;
    t.initial_values = values;
  }
  const CheckpointTables tables = CheckpointTables::FromModel(g.tables);
  ASSERT_EQ(tables.num_tables(), 2);
  EXPECT_TRUE(tables.table(0).ids.empty());
  SparseBatch sb(g);
  const Batch b = MakeBatch({13}, {9});  // rows 3 and 9
  ASSERT_TRUE(sb.Prepare({b.view()}).ok());
  tables.FillRows(&sb);
  EXPECT_EQ(std::vector<float>(sb.rows(0), sb.rows(0) + 3), (std::vector<float>{4.5f, 5, 5.5f}));
  EXPECT_EQ(std::vector<float>(sb.rows(1), sb.rows(1) + 3), (std::vector<float>{13.5f, 14, 14.5f}));
}

void ExpectRefused(const std::vector<ps::SparseTableRows>& saved, const models::Graph& g, const std::string& says) {
  absl::StatusOr<CheckpointTables> tables = CheckpointTables::Create(saved, g.tables);
  ASSERT_FALSE(tables.ok());
  EXPECT_EQ(tables.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(tables.status().message().find(says), std::string::npos) << tables.status();
}

TEST(CheckpointTablesTest, RefusesTablesThatDifferFromTheModelsNamingTheFlag) {
  const models::Graph g = Dlrm(0);
  ExpectRefused({}, g, "the checkpoint holds no sparse tables, but the model has 2 (embedding/C1, embedding/C2)");
  ExpectRefused(Saved(Dlrm(0, 3), {1}), g, "the checkpoint holds 3 sparse tables");
  ExpectRefused(Saved(g, {1}), models::Graph(), "the model has 0");
  ExpectRefused(Saved(Dlrm(1000), {1}), g, "rows is 1000 in the checkpoint but 0 for the model (--table_rows)");
  std::vector<ps::SparseTableRows> saved = Saved(g, {1});
  saved[1].spec.dim = 8;
  ExpectRefused(saved, g, "sparse table 1 'embedding/C2': dim is 8 in the checkpoint but 3 for the model "
                          "(--embedding_dim)");
  saved = Saved(g, {1});
  saved[0].spec.max_rows = 50;
  ExpectRefused(saved, g, "(--max_rows)");
  saved = Saved(g, {1});
  saved[0].spec.admit_after = 2;
  ExpectRefused(saved, g, "(--admit_after)");
  saved = Saved(g, {1});
  saved[0].spec.name = "emb";
  ExpectRefused(saved, g, "the checkpoint names it 'emb'");
}

TEST(CheckpointTablesTest, ExportsEachTablesIdsAndValues) {
  const models::Graph g = Dlrm(0);
  absl::StatusOr<CheckpointTables> tables = CheckpointTables::Create(Saved(g, {-4, 10}), g.tables);
  ASSERT_TRUE(tables.ok());
  const std::vector<NpyArray> arrays = tables->ExportArrays();
  ASSERT_EQ(arrays.size(), 4u);
  EXPECT_EQ(arrays[0].name, "embedding_C1_ids");
  EXPECT_EQ(arrays[0].type, NpyType::kInt64);
  EXPECT_EQ(arrays[0].int64_data, (std::vector<int64_t>{-4, 10}));
  EXPECT_EQ(arrays[3].name, "embedding_C2_values");
  EXPECT_EQ(arrays[3].shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(arrays[3].data[0], 100.0f);
  EXPECT_TRUE(EncodeNpz(arrays).ok());
}

}  // namespace
}  // namespace dtrain::worker
