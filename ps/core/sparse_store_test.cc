// SparseStore: rows created from the initializer and updated by each optimizer, fixed-size tables, ownership,
// eviction (max_rows held, CLOCK's choice), admission, concurrent pulls and updates, checkpoint state, and the
// memory a row costs (RSS growth for 1.5 M rows of dim 16 with adagrad).
#include "ps/core/sparse_store.h"

#include <unistd.h>

#include <atomic>
#include <cmath>
#include <fstream>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace dtrain::ps {
namespace {

SparseTableSpec Table(int dim, int64_t rows = 0, int64_t max_rows = 0, int admit_after = 0) {
  SparseTableSpec t;
  t.table = 0;
  t.name = "emb";
  t.dim = dim;
  t.rows = rows;
  t.max_rows = max_rows;
  t.admit_after = admit_after;
  t.init_scale = 0.5f;
  t.init_seed = 7;
  return t;
}

std::unique_ptr<SparseStore> Make(SparseTableSpec table, const std::string& optimizer = "sgd", float lr = 0.1f,
                                  SparseStoreOptions options = {}) {
  SparseOptimizerConfig c;
  c.name = optimizer;
  c.learning_rate = lr;
  absl::StatusOr<std::unique_ptr<SparseStore>> s = SparseStore::Create({table}, c, {}, options);
  EXPECT_TRUE(s.ok()) << s.status();
  return *std::move(s);
}

std::vector<float> Initial(const SparseTableSpec& t, int64_t id) {
  std::vector<float> row(t.dim);
  SparseInitialRow(t, id, row.data());
  return row;
}

std::vector<float> Lookup(SparseStore& s, std::vector<int64_t> ids) {
  std::vector<float> out(ids.size() * s.spec(0).dim);
  EXPECT_TRUE(s.CheckIds(0, ids.data(), ids.size()).ok());
  s.Lookup(0, ids.data(), ids.size(), WireDtype::kF32, out.data());
  return out;
}

std::vector<float> Row(SparseStore& s, int64_t id) { return Lookup(s, {id}); }

TEST(SparseStoreTest, RowsStartFromTheirInitializerAndSgdUpdatesThem) {
  const SparseTableSpec t = Table(3);
  auto store = Make(t, "sgd", 0.5f);
  const std::vector<int64_t> ids = {42, -7, int64_t{1} << 60};
  std::vector<float> rows = Lookup(*store, ids);
  for (size_t i = 0; i < ids.size(); ++i) {
    EXPECT_EQ(std::vector<float>(rows.begin() + 3 * i, rows.begin() + 3 * i + 3), Initial(t, ids[i]));
  }
  const std::vector<float> grads = {1, 2, 3, 4, 5, 6};
  store->Apply(0, 0, ids.data(), 2, grads.data(), 0.5f);  // ids 42, -7
  std::vector<float> want = Initial(t, 42);
  for (int k = 0; k < 3; ++k) want[k] -= 0.5f * 0.5f * grads[k];
  EXPECT_EQ(Row(*store, 42), want);
  EXPECT_EQ(Row(*store, int64_t{1} << 60), Initial(t, int64_t{1} << 60));  // untouched
  const SparseTableStats stats = store->Stats()[0];
  EXPECT_EQ(stats.name, "emb");
  EXPECT_EQ(stats.rows, 3);
  EXPECT_EQ(stats.created, 3);
  EXPECT_EQ(stats.updates, 2);
  EXPECT_EQ(stats.lookups, 5);
}

TEST(SparseStoreTest, EachOptimizerUpdatesRowAndSlots) {
  const SparseTableSpec t = Table(2);
  const float g[] = {0.4f, -0.2f};
  const int64_t id = 5;
  for (const std::string name : {"adagrad", "adam", "ftrl"}) {
    auto store = Make(t, name, 0.1f);
    const std::vector<float> w0 = Row(*store, id);
    store->Apply(0, 3, &id, 1, g, 1.0f);
    const std::vector<float> w = Row(*store, id);
    std::vector<SparseTableState> state = store->ExportState();
    ASSERT_EQ(state[0].ids, std::vector<int64_t>({id}));
    ASSERT_EQ(state[0].slots.size(), 1u + (name != "adagrad"));
    for (int k = 0; k < 2; ++k) {
      double want;
      if (name == "adagrad") {
        const double acc = 0.1 + g[k] * g[k];
        want = w0[k] - 0.1 * g[k] / std::sqrt(acc);
        EXPECT_NEAR(state[0].slots[0][k], acc, 1e-6);
      } else if (name == "adam") {
        const double lr_t = 0.1 * std::sqrt(1 - std::pow(0.999, 4)) / (1 - std::pow(0.9, 4));
        const double m = 0.1 * g[k], v = 0.001 * g[k] * g[k];
        want = w0[k] - lr_t * m / (std::sqrt(v) + 1e-8);
        EXPECT_NEAR(state[0].slots[0][k], m, 1e-5 * std::fabs(m));
        EXPECT_NEAR(state[0].slots[1][k], v, 1e-4 * v);
      } else {  // ftrl, lr_power -0.5, no l1/l2
        const double n = 0.1, n1 = n + g[k] * g[k];
        const double z = g[k] - (std::sqrt(n1) - std::sqrt(n)) / 0.1 * w0[k];
        want = -z / (std::sqrt(n1) / 0.1);
        EXPECT_NEAR(state[0].slots[0][k], z, 1e-6);
        EXPECT_NEAR(state[0].slots[1][k], n1, 1e-6);
      }
      EXPECT_NEAR(w[k], want, 1e-6) << name << " " << k;
    }
  }
}

TEST(SparseStoreTest, LazyAdamLeavesUntouchedRowsAlone) {
  auto store = Make(Table(1), "adam", 0.1f);
  const int64_t a = 1, b = 2;
  const float g = 1.0f;
  Lookup(*store, {a, b});
  store->Apply(0, 0, &a, 1, &g, 1.0f);
  store->Apply(0, 0, &b, 1, &g, 1.0f);
  const std::vector<float> b_after_one = Row(*store, b);
  for (int step = 1; step < 5; ++step) store->Apply(0, step, &a, 1, &g, 1.0f);
  EXPECT_EQ(Row(*store, b), b_after_one);  // no decay of b's moments, no drift of its value
  const std::vector<SparseTableState> state = store->ExportState();
  for (size_t i = 0; i < 2; ++i) {
    if (state[0].ids[i] == b) {
      EXPECT_FLOAT_EQ(state[0].slots[0][i], 0.1f);  // m after one step
    }
  }
}

TEST(SparseStoreTest, FixedSizeTablesCheckBoundsAndReadAsPrefilled) {
  const SparseTableSpec t = Table(4, /*rows=*/100);
  auto store = Make(t, "sgd", 1.0f);
  const int64_t bad[] = {100}, negative[] = {-1};
  EXPECT_EQ(store->CheckIds(0, bad, 1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->CheckIds(0, negative, 1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->CheckIds(1, bad, 0).code(), absl::StatusCode::kInvalidArgument);  // no table 1
  EXPECT_EQ(Row(*store, 99), Initial(t, 99));
  // A gradient for a row nobody read yet updates the row the pre-filled table would hold.
  const int64_t id = 17;
  const float g[] = {1, 1, 1, 1};
  store->Apply(0, 0, &id, 1, g, 1.0f);
  std::vector<float> want = Initial(t, 17);
  for (float& x : want) x -= 1.0f;
  EXPECT_EQ(Row(*store, 17), want);
  EXPECT_EQ(store->Stats()[0].dropped_gradients, 0);
}

TEST(SparseStoreTest, InitialRowsAreWrittenWithFreshSlotsAndCheckedComplete) {
  SparseTableSpec t = Table(2, /*rows=*/10);
  t.initial_values = true;
  SparseStoreOptions o;
  o.task_index = 1;
  o.num_ps = 2;
  o.max_rows_cap = 1;  // not for a table with initial values
  auto store = Make(t, "adagrad", 0.5f, o);
  EXPECT_EQ(store->max_rows(0), 0);
  std::vector<int64_t> mine;
  for (int64_t id = 0; id < 10; ++id) {
    if (ShardOfId(id, 2) == 1) mine.push_back(id);
  }
  ASSERT_EQ(store->OwnedRows(0), static_cast<int64_t>(mine.size()));
  std::vector<float> values;
  for (int64_t id : mine) values.insert(values.end(), {id + 0.5f, -id - 0.25f});
  // The first row alone: incomplete.
  ASSERT_TRUE(store->WriteRows(0, mine.data(), 1, 2, WireDtype::kF32, values.data()).ok());
  const absl::Status partial = store->CheckInitialRows();
  EXPECT_EQ(partial.message(), absl::StrCat("no complete initial rows for sparse table 'emb': 1 of the ",
                                            mine.size(), " rows this task holds"));
  // Then all of them (the first again, overwritten) in bf16 on the wire: exact for these values.
  std::vector<uint16_t> narrow(values.size());
  EncodeFloats(WireDtype::kBF16, values.data(), values.size(), narrow.data());
  ASSERT_TRUE(store->WriteRows(0, mine.data(), mine.size(), 2, WireDtype::kBF16, narrow.data()).ok());
  ASSERT_TRUE(store->CheckInitialRows().ok());
  EXPECT_EQ(store->Stats()[0].rows, static_cast<int64_t>(mine.size()));
  EXPECT_EQ(Lookup(*store, mine), values);
  // Adagrad's accumulator starts at its initial value (0.1): g = 1 moves the row by 0.5 / sqrt(1.1).
  const float g[] = {1, 0};
  store->Apply(0, 0, mine.data(), 1, g, 1.0f);
  EXPECT_FLOAT_EQ(Row(*store, mine[0])[0], values[0] - 0.5f / std::sqrt(1.1f));
  EXPECT_EQ(Row(*store, mine[0])[1], values[1]);

  // Refusals: another task's id, an id outside the table, another dim, a table that starts from its initializer.
  int64_t theirs = 0;
  while (ShardOfId(theirs, 2) != 0) ++theirs;
  const int64_t outside = 10;
  EXPECT_EQ(store->WriteRows(0, &theirs, 1, 2, WireDtype::kF32, values.data()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->WriteRows(0, &outside, 1, 2, WireDtype::kF32, values.data()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->WriteRows(0, mine.data(), 1, 3, WireDtype::kF32, values.data()).message(),
            "initial rows of 'emb' with 3 values a row, the table has 2");
  auto plain = Make(Table(2, 10));
  const int64_t zero = 0;
  EXPECT_EQ(plain->WriteRows(0, &zero, 1, 2, WireDtype::kF32, values.data()).message(),
            "sparse table 'emb' starts from its initializer (init_scale): the chief uploads rows only for tables "
            "with initial values");
  EXPECT_TRUE(plain->CheckInitialRows().ok());
  // Initial values need a fixed-size table that holds every row.
  for (SparseTableSpec bad : {Table(2), Table(2, 10, 5), Table(2, 10, 0, 3)}) {
    bad.initial_values = true;
    const absl::Status s = ValidateSparseTables({bad});
    EXPECT_EQ(s.message(), "sparse table 0 ('emb'): initial values need a fixed-size table without max_rows, "
                           "admission or expiry (every row held from the start)");
  }
}

TEST(SparseStoreTest, HashTablesDropGradientsOfRowsThatDoNotExist) {
  auto store = Make(Table(2));
  const int64_t id = 3;
  const float g[] = {1, 1};
  store->Apply(0, 0, &id, 1, g, 1.0f);
  const SparseTableStats s = store->Stats()[0];
  EXPECT_EQ(s.rows, 0);
  EXPECT_EQ(s.dropped_gradients, 1);
  EXPECT_EQ(s.updates, 0);
}

TEST(SparseStoreTest, EachTaskHoldsOnlyTheIdsItOwns) {
  SparseStoreOptions o;
  o.task_index = 1;
  o.num_ps = 2;
  auto store = Make(Table(2), "sgd", 0.1f, o);
  int64_t mine = 0, other = 0;
  while (ShardOfId(mine, 2) != 1) ++mine;
  while (ShardOfId(other, 2) != 0) ++other;
  EXPECT_TRUE(store->CheckIds(0, &mine, 1).ok());
  const absl::Status s = store->CheckIds(0, &other, 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("belongs to ps task 0"), std::string::npos) << s;
}

TEST(SparseStoreTest, ClockEvictsARowNotTouchedSinceTheHandPassed) {
  auto store = Make(Table(1, 0, /*max_rows=*/4));
  EXPECT_EQ(store->max_rows(0), 4);
  Lookup(*store, {1, 2, 3, 4, 4});  // 4 is looked up again: its bit is set
  Lookup(*store, {5});              // the hand takes the first row with its bit clear: id 1's
  Lookup(*store, {2, 3});           // looked up again
  Lookup(*store, {6});              // the hand clears 2's, 3's and 4's bits and comes round to 5 (never
                                    // looked up again: LRU would have taken 4)
  Lookup(*store, {7});              // then 2, whose bit the last pass cleared
  std::vector<int64_t> held = store->ExportState()[0].ids;
  std::sort(held.begin(), held.end());
  EXPECT_EQ(held, std::vector<int64_t>({3, 4, 6, 7}));
  EXPECT_EQ(store->Stats()[0].evicted, 3);
  EXPECT_EQ(store->Stats()[0].rows, 4);
  // An evicted id comes back from its initializer.
  EXPECT_EQ(Row(*store, 1), Initial(Table(1), 1));
}

TEST(SparseStoreTest, EvictionHoldsMaxRowsAndKeepsHotRows) {
  const int64_t max_rows = 20000;  // several sub-shards
  auto store = Make(Table(4, 0, max_rows));
  const int64_t hot = max_rows / 4;
  int64_t next_cold = 1'000'000;
  int64_t created_after_warmup = 0;
  constexpr int kRounds = 200, kWarmup = 40, kCold = 1000;
  for (int round = 0; round < kRounds; ++round) {
    if (round == kWarmup) created_after_warmup = store->Stats()[0].created;
    std::vector<int64_t> ids(hot);
    std::iota(ids.begin(), ids.end(), 0);                      // a working set touched every step
    for (int i = 0; i < kCold; ++i) ids.push_back(next_cold++);  // and ids seen once
    Lookup(*store, ids);
    ASSERT_LE(store->Stats()[0].rows, max_rows);
  }
  const SparseTableStats s = store->Stats()[0];
  EXPECT_EQ(s.rows, max_rows);
  EXPECT_EQ(s.created - s.evicted, max_rows);
  // CLOCK approximates LRU: once the table has filled, the working set stays while (kRounds - kWarmup) * kCold
  // ids seen once go through it.
  const int64_t hot_recreated = s.created - created_after_warmup - (kRounds - kWarmup) * kCold;
  EXPECT_EQ(hot_recreated, 0);
  EXPECT_GT(s.evicted, (kRounds - kWarmup) * kCold / 2);
}

TEST(SparseStoreTest, AdmissionCreatesTheRowAtTheNthLookup) {
  const SparseTableSpec t = Table(2, 0, 0, /*admit_after=*/3);
  auto store = Make(t, "sgd", 1.0f);
  const int64_t id = 77;
  const float g[] = {1, 1};
  EXPECT_EQ(Row(*store, id), std::vector<float>({0, 0}));
  store->Apply(0, 0, &id, 1, g, 1.0f);  // not admitted: dropped
  EXPECT_EQ(Row(*store, id), std::vector<float>({0, 0}));
  EXPECT_EQ(Row(*store, id), Initial(t, id));  // the third lookup creates it
  store->Apply(0, 0, &id, 1, g, 1.0f);
  EXPECT_EQ(Row(*store, id), std::vector<float>({Initial(t, id)[0] - 1, Initial(t, id)[1] - 1}));
  const SparseTableStats s = store->Stats()[0];
  EXPECT_EQ(s.not_admitted, 2);
  EXPECT_EQ(s.dropped_gradients, 1);
  EXPECT_EQ(s.created, 1);
  EXPECT_EQ(s.updates, 1);
  // Most ids seen once stay out (a few may be admitted early through the sketch's collisions, never late).
  std::vector<int64_t> once(5000);
  std::iota(once.begin(), once.end(), 1000);
  Lookup(*store, once);
  EXPECT_LT(store->Stats()[0].created, 1 + 50);
}

TEST(SparseStoreTest, ConcurrentPullsAndUpdatesAddUp) {
  SparseTableSpec t = Table(8, 0, 0);
  t.init_scale = 0.0f;  // rows start at 0: sgd with lr 1 and gradient 1 counts updates exactly
  auto store = Make(t, "sgd", 1.0f);
  constexpr int kThreads = 8, kRounds = 200;
  constexpr int64_t kIds = 3000;
  std::vector<std::thread> threads;
  std::vector<std::vector<int64_t>> counts(kThreads, std::vector<int64_t>(kIds, 0));
  for (int th = 0; th < kThreads; ++th) {
    threads.emplace_back([&, th] {
      std::mt19937_64 gen(th);
      std::vector<float> rows, grads;
      for (int r = 0; r < kRounds; ++r) {
        std::vector<int64_t> ids;
        for (int64_t i = gen() % 5; i < kIds; i += 1 + gen() % 9) ids.push_back(i);
        rows.resize(ids.size() * 8);
        store->Lookup(0, ids.data(), ids.size(), WireDtype::kF32, rows.data());
        for (float x : rows) ASSERT_LE(x, 0.0f);
        grads.assign(ids.size() * 8, 1.0f);
        store->Apply(0, r, ids.data(), ids.size(), grads.data(), 1.0f);
        for (int64_t id : ids) ++counts[th][id];
      }
    });
  }
  for (auto& th : threads) th.join();
  std::vector<int64_t> all(kIds);
  std::iota(all.begin(), all.end(), 0);
  const std::vector<float> rows = Lookup(*store, all);
  for (int64_t id = 0; id < kIds; ++id) {
    int64_t n = 0;
    for (int th = 0; th < kThreads; ++th) n += counts[th][id];
    for (int k = 0; k < 8; ++k) ASSERT_EQ(rows[id * 8 + k], -static_cast<float>(n)) << id;
  }
}

TEST(SparseStoreTest, ExportImportRoundTripAndRefusals) {
  const SparseTableSpec t = Table(3);
  auto a = Make(t, "adagrad");
  std::vector<int64_t> ids(1000);
  std::iota(ids.begin(), ids.end(), -500);
  Lookup(*a, ids);
  std::vector<float> g(ids.size() * 3, 0.25f);
  a->Apply(0, 0, ids.data(), ids.size(), g.data(), 1.0f);
  const std::vector<SparseTableState> state = a->ExportState();
  ASSERT_EQ(state[0].ids.size(), ids.size());

  auto b = Make(t, "adagrad");
  ASSERT_TRUE(b->ImportState(state, 9).ok());
  EXPECT_EQ(b->version(), 9);
  EXPECT_EQ(Lookup(*b, ids), Lookup(*a, ids));
  EXPECT_EQ(b->Stats()[0].created, 0);  // restored, not created

  std::vector<SparseTableState> dup = state;
  dup[0].ids[1] = dup[0].ids[0];
  const absl::Status s = b->ImportState(dup, 10);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("given twice"), std::string::npos) << s;
  EXPECT_EQ(b->version(), 9);  // nothing changed
  EXPECT_EQ(b->Stats()[0].rows, 1000);
  std::vector<SparseTableState> other_dim = state;
  other_dim[0].spec.dim = 4;
  EXPECT_EQ(b->ImportState(other_dim, 10).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(b->ImportState({}, 10).code(), absl::StatusCode::kInvalidArgument);  // no state for the table

  // Into a smaller max_rows: the excess is evicted.
  auto small = Make(Table(3, 0, 100), "adagrad");
  ASSERT_TRUE(small->ImportState(state, 1).ok());
  EXPECT_EQ(small->Stats()[0].rows, 100);
}

int64_t RssBytes() {
  std::ifstream f("/proc/self/statm");
  int64_t size = 0, resident = 0;
  f >> size >> resident;
  return resident * sysconf(_SC_PAGESIZE);
}

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
#else
constexpr bool kSanitized = false;
#endif

// The memory target: rows x (dim + slots) x 4 bytes, within 10%, plus a fixed overhead. A table with max_rows
// sizes its index for it (the normal configuration when memory matters); one that grows without a bound costs
// a little more (its index is 72% to 90% full).
TEST(SparseStoreTest, MemoryPerRowIsWithinTenPercentOfTheFloats) {
  constexpr int64_t kRows = 1'500'000;
  const double floats_bytes = kRows * 16 * 2 * 4.0;  // dim 16, adagrad: values + accum
  for (int64_t max_rows : {kRows, int64_t{0}}) {
    const int64_t before = RssBytes();
    auto store = Make(Table(16, 0, max_rows), "adagrad");
    std::vector<int64_t> ids(100'000);
    std::vector<float> rows(ids.size() * 16);
    std::mt19937_64 gen(3);
    // Until the table holds kRows (with max_rows, the sub-shards fill unevenly: some evict before all are full).
    for (int64_t done = 0; done < kRows || store->Stats()[0].rows < kRows; done += ids.size()) {
      if (max_rows == 0) ids.resize(std::min<int64_t>(ids.size(), kRows - done));
      for (int64_t& id : ids) id = static_cast<int64_t>(gen());  // hashed feature values
      store->Lookup(0, ids.data(), ids.size(), WireDtype::kF32, rows.data());
    }
    const int64_t held = store->Stats()[0].rows;
    ASSERT_EQ(held, kRows);
    const double grown = static_cast<double>(RssBytes() - before);
    const double accounted = static_cast<double>(store->MemoryBytes());
    std::printf("max_rows=%ld: %.1f bytes per row in the store (%.1f of them beyond the floats), RSS grew %.1f "
                "bytes per row\n",
                static_cast<long>(max_rows), accounted / kRows, (accounted - floats_bytes) / kRows, grown / kRows);
    EXPECT_LE(accounted, (max_rows > 0 ? 1.10 : 1.12) * floats_bytes + (16 << 20));
    if (!kSanitized) {
      EXPECT_LE(grown, (max_rows > 0 ? 1.10 : 1.12) * floats_bytes + (24 << 20));
    }
  }
}

}  // namespace
}  // namespace dtrain::ps
