#include "ps/checkpoint/checkpoint_reshard.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "ps/checkpoint/checkpoint_test_util.h"

namespace dtrain::ps {
namespace {

using testing::ScratchDir;
using testing::SameBits;

// One model's whole state, cut into the files of any placement: variables w1 (12 floats), bn/mean (4, state, not
// trained) and w2 (9) one after the other in the flat buffer, adam's two slots, moving averages; a hash table of
// 3-float rows and a fixed [50, 2] table, adagrad-free (adam's lazy slots: two per row element).
constexpr int64_t kFloats = 25;
constexpr int kSlots = 2;

struct Piece {
  uint32_t key;
  std::string variable;
  int64_t offset, length;
  int task;
  bool trainable = true;
};

float Value(int array, int64_t i) { return 0.5f * array - 0.01f * static_cast<float>(i) + 1e-7f * (array + 1) * i; }

std::vector<SparseTableSpec> Tables() {
  SparseTableSpec a;
  a.table = 0;
  a.name = "emb/hash";
  a.dim = 3;
  a.init_seed = 5;
  SparseTableSpec b;
  b.table = 1;
  b.name = "emb/fixed";
  b.dim = 2;
  b.rows = 50;
  return {a, b};
}
std::vector<int64_t> Ids(int table) {
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < (table == 0 ? 200 : 37); ++i) ids.push_back(table == 0 ? (i - 90) * 987654321LL : i);
  return ids;
}
float RowValue(int table, int64_t id, int array, int k) {
  return 0.001f * static_cast<float>(id % 1000) + array + 0.1f * k + table;
}

TrainConfig Config(const std::vector<Piece>& layout, int task) {
  TrainConfig c;
  c.model_signature = "reshard/v1";
  c.optimizer.name = "adam";
  c.moving_average_decay = 0.99f;
  for (const Piece& p : layout) {
    if (p.task == task) c.slices.push_back(SliceSpec{p.key, p.variable, p.offset, p.length, p.trainable});
  }
  c.tables = Tables();
  c.sparse_optimizer.name = "adam";
  return c;
}

// Task `task`'s file of the state under `layout` with `num_ps` tasks.
CheckpointData Cut(const std::vector<Piece>& layout, int task, int num_ps, int64_t step = 300) {
  CheckpointData d;
  d.task_index = task;
  d.num_ps = num_ps;
  d.global_step = step;
  d.task_step = step;
  d.model_signature = "reshard/v1";
  d.optimizer = "adam";
  d.num_slots = kSlots;
  d.has_moving_averages = true;
  if (task == 0) d.input_positions = {{0, "w0 at 299"}, {1, "w1 at 299"}};
  for (const Piece& p : layout) {
    if (p.task != task) continue;
    SliceState s;
    s.spec = SliceSpec{p.key, p.variable, p.offset, p.length, p.trainable};
    s.slots.resize(kSlots);
    for (int64_t i = p.offset; i < p.offset + p.length; ++i) {
      s.values.push_back(Value(0, i));
      for (int k = 0; k < kSlots; ++k) s.slots[k].push_back(Value(1 + k, i));
      s.moving_average.push_back(Value(3, i));
    }
    d.slices.push_back(std::move(s));
  }
  d.sparse_optimizer = "adam";
  d.sparse_num_slots = 2;
  for (const SparseTableSpec& spec : Tables()) {
    SparseTableState t;
    t.spec = spec;
    t.slots.resize(2);
    for (int64_t id : Ids(spec.table)) {
      if (ShardOfId(id, num_ps) != task) continue;
      t.ids.push_back(id);
      for (int k = 0; k < spec.dim; ++k) {
        t.values.push_back(RowValue(spec.table, id, 0, k));
        for (int s = 0; s < 2; ++s) t.slots[s].push_back(RowValue(spec.table, id, 1 + s, k));
      }
    }
    d.tables.push_back(std::move(t));
  }
  return d;
}

std::vector<CheckpointData> Files(const std::vector<Piece>& layout, int num_ps) {
  std::vector<CheckpointData> parts;
  for (int t = 0; t < num_ps; ++t) parts.push_back(Cut(layout, t, num_ps));
  return parts;
}

// One ps task, w1 and w2 whole.
const std::vector<Piece> kOne = {{0, "w1", 0, 12, 0}, {1, "bn/mean", 12, 4, 0, false}, {2, "w2", 16, 9, 0}};
// Three tasks, w1 cut in two.
const std::vector<Piece> kThree = {
    {0, "w1", 0, 6, 0}, {1, "w1", 6, 6, 1}, {2, "bn/mean", 12, 4, 2, false}, {3, "w2", 16, 9, 0}};
// Two tasks, w2 cut in two, unlike the cuts above.
const std::vector<Piece> kTwo = {
    {0, "w1", 0, 12, 1}, {1, "bn/mean", 12, 4, 0, false}, {2, "w2", 16, 4, 1}, {3, "w2", 20, 5, 0}};

// The rows of a table as a map, so that the order (which depends on the files' order) does not matter.
std::map<int64_t, std::vector<float>> Rows(const SparseTableState& t, int array) {
  std::map<int64_t, std::vector<float>> rows;
  const std::vector<float>& v = array == 0 ? t.values : t.slots[array - 1];
  for (size_t i = 0; i < t.ids.size(); ++i) {
    rows[t.ids[i]] = std::vector<float>(v.begin() + i * t.spec.dim, v.begin() + (i + 1) * t.spec.dim);
  }
  return rows;
}

void ExpectResharded(const std::vector<Piece>& from, int from_n, const std::vector<Piece>& to, int to_n) {
  const std::vector<CheckpointData> parts = Files(from, from_n);
  int64_t rows = 0;
  for (int t = 0; t < to_n; ++t) {
    SCOPED_TRACE(::testing::Message() << from_n << " -> " << to_n << ", task " << t);
    absl::StatusOr<CheckpointData> got = ReshardCheckpoint(parts, "ckpt", Config(to, t), t, to_n);
    ASSERT_TRUE(got.ok()) << got.status();
    const CheckpointData want = Cut(to, t, to_n);
    ASSERT_EQ(got->slices.size(), want.slices.size());
    for (size_t i = 0; i < want.slices.size(); ++i) {
      EXPECT_EQ(got->slices[i].spec, want.slices[i].spec);
      EXPECT_TRUE(SameBits(got->slices[i].values, want.slices[i].values)) << i;
      for (int k = 0; k < kSlots; ++k) EXPECT_TRUE(SameBits(got->slices[i].slots[k], want.slices[i].slots[k])) << i;
      EXPECT_TRUE(SameBits(got->slices[i].moving_average, want.slices[i].moving_average)) << i;
    }
    EXPECT_EQ(got->task_index, t);
    EXPECT_EQ(got->num_ps, to_n);
    EXPECT_EQ(got->global_step, 300);
    EXPECT_EQ(got->task_step, 300);
    EXPECT_EQ(got->input_positions, want.input_positions);  // task 0 only
    ASSERT_EQ(got->tables.size(), 2u);
    for (int tb = 0; tb < 2; ++tb) {
      EXPECT_EQ(got->tables[tb].spec, want.tables[tb].spec);
      for (int a = 0; a < 3; ++a) EXPECT_EQ(Rows(got->tables[tb], a), Rows(want.tables[tb], a)) << tb << " " << a;
      rows += static_cast<int64_t>(got->tables[tb].ids.size());
    }
    EXPECT_TRUE(CheckCompatible(*got, "ckpt", Config(to, t), t, to_n).ok());
  }
  EXPECT_EQ(rows, 200 + 37);  // every row went somewhere, once
}

TEST(CheckpointReshardTest, GrowsAndShrinksByNameAndById) {
  ExpectResharded(kOne, 1, kThree, 3);
  ExpectResharded(kThree, 3, kTwo, 2);
  ExpectResharded(kTwo, 2, kOne, 1);
  ExpectResharded(kThree, 3, kThree, 3);  // the same layout: the same files
}

TEST(CheckpointReshardTest, RefusesWhatDoesNotFit) {
  const std::vector<CheckpointData> parts = Files(kOne, 1);
  // Another variable where this run has w2.
  std::vector<Piece> renamed = kThree;
  renamed[3].variable = "w3";
  absl::StatusOr<CheckpointData> r = ReshardCheckpoint(parts, "ckpt", Config(renamed, 0), 0, 3);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(r.status().message(), "belong to variable 'w2'")) << r.status();
  // A variable that is state here but trained there.
  std::vector<Piece> flipped = kThree;
  flipped[2].trainable = true;
  r = ReshardCheckpoint(parts, "ckpt", Config(flipped, 2), 2, 3);
  EXPECT_TRUE(absl::StrContains(r.status().message(), "trainable or not")) << r.status();
  // Floats beyond what the checkpoint holds.
  std::vector<Piece> longer = kThree;
  longer[3].length = 12;
  r = ReshardCheckpoint(parts, "ckpt", Config(longer, 0), 0, 3);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(r.status().message(), "holds no values for floats [25, 28) of variable 'w2'"))
      << r.status();
  // Another model.
  TrainConfig other = Config(kThree, 0);
  other.model_signature = "other";
  r = ReshardCheckpoint(parts, "ckpt", other, 0, 3);
  EXPECT_TRUE(absl::StrContains(r.status().message(), "another model")) << r.status();
  // A row on a task that does not own its id.
  std::vector<CheckpointData> bad = Files(kThree, 3);
  bad[1].tables[0].ids[0] = bad[0].tables[0].ids[0];
  r = ReshardCheckpoint(bad, "ckpt", Config(kTwo, 0), 0, 2);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << r.status();
  // Files of two steps.
  bad = Files(kThree, 3);
  bad[2].global_step = 250;
  r = ReshardCheckpoint(bad, "ckpt", Config(kTwo, 0), 0, 2);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << r.status();
}

TEST(CheckpointReshardTest, ReadsTheOwnFileOrReshardsACompleteCheckpoint) {
  ScratchDir dir("reshard_dir");
  for (int t = 0; t < 3; ++t) testing::WriteCheckpointFile(CheckpointPath(dir.path(), 300, t, 3), Cut(kThree, t, 3));
  // Step 400 of 3 tasks is incomplete; step 200 of 2 tasks is ours.
  testing::WriteCheckpointFile(CheckpointPath(dir.path(), 400, 0, 3), Cut(kThree, 0, 3, 400));
  for (int t = 0; t < 2; ++t) {
    testing::WriteCheckpointFile(CheckpointPath(dir.path(), 200, t, 2), Cut(kTwo, t, 2, 200));
  }
  absl::StatusOr<std::vector<int64_t>> steps = CandidateSteps(Env::Default(), dir.path(), 1, 2);
  ASSERT_TRUE(steps.ok());
  EXPECT_EQ(*steps, (std::vector<int64_t>{300, 200}));
  steps = RestorableSteps(Env::Default(), dir.path(), Config(kTwo, 1), 1, 2);
  ASSERT_TRUE(steps.ok());
  EXPECT_EQ(*steps, (std::vector<int64_t>{200, 300}));

  absl::StatusOr<RestorableCheckpoint> r =
      ReadCheckpointForTask(Env::Default(), dir.path(), 300, Config(kTwo, 1), 1, 2);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->resharded_from, 3);
  EXPECT_EQ(r->path, CheckpointPrefix(dir.path(), 300) + ".ps*-of-3");
  EXPECT_TRUE(SameBits(r->data.slices[0].values, Cut(kTwo, 1, 2).slices[0].values));
  r = ReadCheckpointForTask(Env::Default(), dir.path(), 200, Config(kTwo, 1), 1, 2);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->resharded_from, 0);
  EXPECT_EQ(r->path, CheckpointPath(dir.path(), 200, 1, 2));
  r = ReadCheckpointForTask(Env::Default(), dir.path(), 400, Config(kTwo, 1), 1, 2);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound) << r.status();

  // The restore policy takes the newest: step 300, resharded.
  absl::StatusOr<std::optional<RestorableCheckpoint>> found =
      FindCheckpointToRestore(Env::Default(), dir.path(), Config(kTwo, 0), 0, 2, kRestoreNewest);
  ASSERT_TRUE(found.ok()) << found.status();
  ASSERT_TRUE(found->has_value());
  EXPECT_EQ((*found)->data.global_step, 300);
  EXPECT_EQ((*found)->resharded_from, 3);
  // A corrupt file of the resharded checkpoint: skipped for the previous step.
  const std::string p = CheckpointPath(dir.path(), 300, 2, 3);
  std::filesystem::resize_file(p, std::filesystem::file_size(p) - 5);
  found = FindCheckpointToRestore(Env::Default(), dir.path(), Config(kTwo, 0), 0, 2, kRestoreNewest);
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ((*found)->data.global_step, 200);
  EXPECT_EQ((*found)->resharded_from, 0);
}

}  // namespace
}  // namespace dtrain::ps
