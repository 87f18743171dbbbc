// SparseStore's online features: rows kept in 16 bits (rounded reads, unbiased stochastic updates, the memory
// they save), expiry by steps and by seconds (with the index intact after the rows move), probabilistic
// admission, and the changes a delta carries (a shadow copy kept from the changes alone equals the store).
#include <unistd.h>

#include <cmath>
#include <fstream>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "ps/core/row_codec.h"
#include "ps/core/sparse_store.h"

namespace dtrain::ps {
namespace {

SparseTableSpec Table(int dim) {
  SparseTableSpec t;
  t.name = "emb";
  t.dim = dim;
  t.init_scale = 0.5f;
  t.init_seed = 7;
  return t;
}

std::unique_ptr<SparseStore> Make(SparseTableSpec table, const std::string& optimizer = "sgd", float lr = 0.1f,
                                  SparseStoreOptions options = {}) {
  SparseOptimizerConfig c;
  c.name = optimizer;
  c.learning_rate = lr;
  absl::StatusOr<std::unique_ptr<SparseStore>> s = SparseStore::Create({table}, c, {}, std::move(options));
  EXPECT_TRUE(s.ok()) << s.status();
  return *std::move(s);
}

std::vector<float> Lookup(SparseStore& s, const std::vector<int64_t>& ids) {
  std::vector<float> out(ids.size() * s.spec(0).dim);
  s.Lookup(0, ids.data(), static_cast<int64_t>(ids.size()), WireDtype::kF32, out.data());
  return out;
}

std::vector<float> Initial(const SparseTableSpec& t, int64_t id) {
  std::vector<float> row(t.dim);
  SparseInitialRow(t, id, row.data());
  return row;
}

std::vector<int64_t> Range(int64_t first, int64_t n) {
  std::vector<int64_t> v(n);
  std::iota(v.begin(), v.end(), first);
  return v;
}

TEST(SparseStoreOnlineTest, SixteenBitRowsReadBackRoundedAndExportExactly) {
  for (RowDtype d : {RowDtype::kF16, RowDtype::kBF16}) {
    SparseTableSpec t = Table(5);
    t.row_dtype = d;
    auto store = Make(t, "adagrad");
    const std::vector<int64_t> ids = Range(-20, 40);
    const std::vector<float> rows = Lookup(*store, ids);
    for (size_t i = 0; i < ids.size(); ++i) {
      const std::vector<float> want = Initial(t, ids[i]);
      for (int k = 0; k < 5; ++k) ASSERT_EQ(rows[i * 5 + k], RoundTrip(WireDtypeOf(d), want[k])) << RowDtypeName(d);
    }
    // A pull in the row's own type sends its bits; checkpoints hold exactly what lookups read.
    std::vector<uint16_t> narrow(ids.size() * 5);
    store->Lookup(0, ids.data(), ids.size(), WireDtypeOf(d), narrow.data());
    std::vector<float> widened(narrow.size());
    DecodeFloats(WireDtypeOf(d), narrow.data(), narrow.size(), widened.data());
    EXPECT_EQ(widened, rows);
    const std::vector<float> g(ids.size() * 5, 0.3f);
    store->Apply(0, 1, ids.data(), ids.size(), g.data(), 1.0f);
    const std::vector<SparseTableState> state = store->ExportState();
    std::map<int64_t, std::vector<float>> exported;
    for (size_t i = 0; i < state[0].ids.size(); ++i) {
      exported[state[0].ids[i]].assign(state[0].values.begin() + i * 5, state[0].values.begin() + (i + 1) * 5);
    }
    const std::vector<float> after = Lookup(*store, ids);
    for (size_t i = 0; i < ids.size(); ++i) {
      EXPECT_EQ(exported[ids[i]], std::vector<float>(after.begin() + i * 5, after.begin() + (i + 1) * 5));
    }
    // Restored into a store of the same type, nothing moves.
    auto b = Make(t, "adagrad");
    ASSERT_TRUE(b->ImportState(state, 1).ok());
    EXPECT_EQ(Lookup(*b, ids), after);
  }
}

// Updates far below half a unit in the last place: rounded to nearest they would never move the row; rounded
// stochastically the row moves by the sum of the updates on average.
TEST(SparseStoreOnlineTest, StochasticRoundingKeepsSmallUpdatesOnAverage) {
  constexpr int kIds = 2000, kSteps = 50;
  constexpr float kLr = 1e-5f;  // an fp16 value near 0.5 has a unit in the last place of 2^-11 ~ 4.9e-4
  SparseTableSpec t = Table(4);
  t.init_scale = 0.0f;
  std::vector<std::unique_ptr<SparseStore>> stores;
  for (RowDtype d : {RowDtype::kF32, RowDtype::kF16, RowDtype::kBF16}) {
    t.row_dtype = d;
    stores.push_back(Make(t, "sgd", kLr));
  }
  const std::vector<int64_t> ids = Range(0, kIds);
  std::vector<float> g(kIds * 4, -50000.0f);  // first move every row to 0.5
  for (auto& s : stores) {
    Lookup(*s, ids);
    s->Apply(0, 0, ids.data(), kIds, g.data(), 1.0f);
  }
  std::fill(g.begin(), g.end(), 1.0f);  // then 50 updates of -1e-5 each
  for (int step = 1; step <= kSteps; ++step) {
    for (auto& s : stores) s->Apply(0, step, ids.data(), kIds, g.data(), 1.0f);
  }
  auto mean = [&](SparseStore& s) {
    const std::vector<float> rows = Lookup(s, ids);
    return std::accumulate(rows.begin(), rows.end(), 0.0) / static_cast<double>(rows.size());
  };
  const double exact = mean(*stores[0]);
  EXPECT_NEAR(exact, 0.5 - kSteps * kLr, 1e-6);
  EXPECT_NEAR(mean(*stores[1]), exact, 2e-5) << "fp16";   // the drift is 5e-4: within 4% of it
  EXPECT_NEAR(mean(*stores[2]), exact, 2e-4) << "bf16";   // bf16's unit near 0.5 is 2^-8: coarser draws
}

TEST(SparseStoreOnlineTest, SixteenBitRowsAndSlotsHalveTheBytesPerRow) {
  SparseTableSpec t = Table(16);
  auto full = Make(t, "adagrad");
  t.row_dtype = RowDtype::kF16;
  t.slot_dtype = RowDtype::kBF16;
  auto half = Make(t, "adagrad");
  const std::vector<int64_t> ids = Range(0, 200000);
  Lookup(*full, ids);
  Lookup(*half, ids);
  const double a = static_cast<double>(full->MemoryBytes()) / ids.size();
  const double b = static_cast<double>(half->MemoryBytes()) / ids.size();
  // 128 bytes of floats (values + accumulator) -> 64, plus the same id, index and bits.
  EXPECT_NEAR(a - b, 64.0, 0.5);
  EXPECT_LT(b / a, 0.56) << a << " vs " << b << " bytes per row";
}

// Rows that were each updated with their own gradient, so that every id's row is unique: after rows move (expiry
// fills holes with the last row), each id must still find its own values.
TEST(SparseStoreOnlineTest, ExpiryByStepsRemovesRowsNotTouchedAndKeepsTheRestFindable) {
  SparseTableSpec t = Table(2);
  t.ttl_steps = 10;
  SparseStoreOptions o;
  o.track_changes = true;
  auto store = Make(t, "sgd", 1.0f, o);
  const std::vector<int64_t> ids = Range(0, 3000);
  store->SetClock(0);
  Lookup(*store, ids);
  std::vector<float> g(ids.size() * 2);
  for (size_t i = 0; i < ids.size(); ++i) g[2 * i] = g[2 * i + 1] = static_cast<float>(i);
  store->Apply(0, 0, ids.data(), ids.size(), g.data(), 1.0f);
  std::vector<float> want = Lookup(*store, ids);
  std::vector<SparseTableState> changed;
  std::vector<std::vector<int64_t>> removed;
  store->TakeChanges(&changed, &removed);
  // The even ids are touched again at step 8; at step 15 the odd ones (last touched at 0) are 15 > 10 behind.
  std::vector<int64_t> even;
  for (int64_t id : ids) {
    if (id % 2 == 0) even.push_back(id);
  }
  store->SetClock(8);
  Lookup(*store, even);
  store->SetClock(10);
  EXPECT_EQ(store->Expire(), 0);  // 10 steps: not more than the ttl
  store->SetClock(15);
  EXPECT_EQ(store->Expire(), 1500);
  const SparseTableStats s = store->Stats()[0];
  EXPECT_EQ(s.rows, 1500);
  EXPECT_EQ(s.expired, 1500);
  const std::vector<float> kept = Lookup(*store, even);
  for (size_t i = 0; i < even.size(); ++i) {
    ASSERT_EQ(kept[2 * i], want[2 * even[i]]) << even[i];
  }
  store->TakeChanges(&changed, &removed);
  EXPECT_TRUE(changed[0].ids.empty());  // lookups of existing rows change nothing
  EXPECT_EQ(removed[0].size(), 1500u);
  for (int64_t id : removed[0]) EXPECT_EQ(id % 2, 1);
  // An expired id that comes back is a new row.
  const int64_t odd = 7;
  EXPECT_EQ(Lookup(*store, {odd}), Initial(t, odd));
  EXPECT_EQ(store->Stats()[0].created, 3001);
}

TEST(SparseStoreOnlineTest, ExpiryBySecondsFollowsTheClockAndMaybeExpireSweepsOnSchedule) {
  absl::Time now = absl::FromUnixSeconds(1000);
  SparseStoreOptions o;
  o.clock = [&now] { return now; };
  SparseTableSpec t = Table(1);
  t.ttl_secs = 80;
  auto store = Make(t, "sgd", 1.0f, o);
  Lookup(*store, Range(0, 100));
  now += absl::Seconds(50);
  Lookup(*store, Range(0, 10));
  now += absl::Seconds(5);
  EXPECT_EQ(store->MaybeExpire(), 0);  // nothing is older than 80 s
  now += absl::Seconds(40);            // 95 s since the first lookups, 45 s since the second
  EXPECT_EQ(store->MaybeExpire(), 90);
  now += absl::Seconds(5);  // less than ttl / 8 = 10 s since that sweep: none now, whatever it would remove
  EXPECT_EQ(store->MaybeExpire(), 0);
  now += absl::Seconds(40);
  EXPECT_EQ(store->MaybeExpire(), 10);
  EXPECT_EQ(store->Stats()[0].rows, 0);
  EXPECT_EQ(store->MemoryBytes(), store->Stats()[0].bytes);
}

TEST(SparseStoreOnlineTest, ExpiredChunksAreUnmapped) {
  SparseTableSpec t = Table(64);
  t.ttl_steps = 1;
  auto store = Make(t, "adagrad");
  std::ifstream statm;
  auto rss = [] {
    std::ifstream f("/proc/self/statm");
    int64_t size = 0, resident = 0;
    f >> size >> resident;
    return resident * sysconf(_SC_PAGESIZE);
  };
  const int64_t before = rss();
  Lookup(*store, Range(0, 200000));  // ~100 MB of rows
  const int64_t full = rss();
  store->SetClock(5);
  EXPECT_EQ(store->Expire(), 200000);
  const int64_t after = rss();
#if !defined(__SANITIZE_ADDRESS__)  // ASan's allocator keeps freed memory in quarantine: RSS says nothing there
  EXPECT_GT(full - before, 90 << 20);
  EXPECT_LT(after - before, (full - before) / 4) << "RSS before " << before << ", full " << full << ", after " << after;
#else
  (void)before;
  (void)full;
  (void)after;
#endif
}

TEST(SparseStoreOnlineTest, ProbabilisticAdmissionAdmitsAShareAndIsReproducible) {
  SparseTableSpec t = Table(1);
  t.admit_probability = 0.25f;
  auto a = Make(t), b = Make(t);
  const std::vector<int64_t> ids = Range(100, 20000);
  a->SetClock(3);
  b->SetClock(3);
  const std::vector<float> ra = Lookup(*a, ids), rb = Lookup(*b, ids);
  EXPECT_EQ(ra, rb);  // the same draws
  const int64_t created = a->Stats()[0].created;
  EXPECT_NEAR(static_cast<double>(created) / ids.size(), 0.25, 0.02);
  EXPECT_EQ(a->Stats()[0].not_admitted, static_cast<int64_t>(ids.size()) - created);
  int64_t zeros = 0;
  for (float x : ra) zeros += x == 0.0f;
  EXPECT_EQ(zeros, static_cast<int64_t>(ids.size()) - created);
  // Each lookup at another step is a new draw: ids seen at 10 steps are nearly all admitted (1 - 0.75^10 ~ 0.94).
  for (int step = 4; step < 13; ++step) {
    a->SetClock(step);
    Lookup(*a, ids);
  }
  EXPECT_GT(a->Stats()[0].rows, 0.92 * ids.size());
  // Beside the count filter: an id needs both.
  t.admit_after = 3;
  auto c = Make(t);
  for (int step = 0; step < 2; ++step) {
    c->SetClock(step);
    Lookup(*c, ids);
  }
  EXPECT_EQ(c->Stats()[0].rows, 0);
}

// The changes replayed on a copy (removals first, then the changed rows) give the store's state, through
// creation, updates, CLOCK eviction, expiry and ids that come back after their row was removed.
TEST(SparseStoreOnlineTest, ChangesReplayedOnACopyGiveTheStoresState) {
  SparseTableSpec t = Table(3);
  t.max_rows = 1500;
  t.ttl_steps = 6;
  SparseStoreOptions o;
  o.track_changes = true;
  auto store = Make(t, "adagrad", 0.1f, o);
  std::map<int64_t, std::vector<float>> copy;  // id -> values and slot
  std::mt19937_64 gen(5);
  std::vector<SparseTableState> changed;
  std::vector<std::vector<int64_t>> removed;
  for (int step = 0; step < 40; ++step) {
    store->SetClock(step);
    std::vector<int64_t> ids;
    // A window of ids that moves on: ids it left behind expire, some come back (a jump back every 10 steps).
    const int64_t first = (step % 10 == 9 ? step - 8 : step) * 150;
    for (int64_t id = first + gen() % 7; id < first + 3000; id += 1 + gen() % 13) ids.push_back(id);
    Lookup(*store, ids);
    std::vector<float> g(ids.size() * 3);
    for (float& x : g) x = static_cast<float>(gen() % 100) / 50.0f - 1.0f;
    store->Apply(0, step, ids.data(), ids.size(), g.data(), 1.0f);
    store->MaybeExpire();
    if (step % 3 == 2) {
      store->TakeChanges(&changed, &removed);
      for (int64_t id : removed[0]) copy.erase(id);
      const SparseTableState& c = changed[0];
      for (size_t i = 0; i < c.ids.size(); ++i) {
        std::vector<float>& row = copy[c.ids[i]];
        row.assign(c.values.begin() + i * 3, c.values.begin() + (i + 1) * 3);
        row.insert(row.end(), c.slots[0].begin() + i * 3, c.slots[0].begin() + (i + 1) * 3);
      }
      const SparseTableState now = store->ExportState()[0];
      ASSERT_EQ(now.ids.size(), copy.size()) << "step " << step;
      for (size_t i = 0; i < now.ids.size(); ++i) {
        auto it = copy.find(now.ids[i]);
        ASSERT_NE(it, copy.end()) << now.ids[i];
        std::vector<float> row(now.values.begin() + i * 3, now.values.begin() + (i + 1) * 3);
        row.insert(row.end(), now.slots[0].begin() + i * 3, now.slots[0].begin() + (i + 1) * 3);
        ASSERT_EQ(it->second, row) << now.ids[i];
      }
    }
  }
  const SparseTableStats s = store->Stats()[0];
  EXPECT_GT(s.evicted, 0);
  EXPECT_GT(s.expired, 0);
  // Without tracking, nothing is kept.
  auto plain = Make(Table(3));
  Lookup(*plain, Range(0, 10));
  plain->TakeChanges(&changed, &removed);
  EXPECT_TRUE(changed[0].ids.empty());
  EXPECT_TRUE(removed[0].empty());
}

TEST(SparseStoreOnlineTest, BadOnlineSettingsAreRefusedByName) {
  SparseTableSpec t = Table(2);
  t.admit_probability = 0.0f;
  EXPECT_EQ(ValidateSparseTables({t}).message(),
            "sparse table 0 ('emb'): admit_probability 0 not in (0, 1] (--admit_probability)");
  t = Table(2);
  t.ttl_steps = 5;
  t.ttl_secs = 5;
  EXPECT_EQ(ValidateSparseTables({t}).message(),
            "sparse table 0 ('emb'): ttl of 5 steps and 5 seconds: give one of them (--row_ttl), >= 0 and < 2^31");
  t = Table(2);
  t.slot_dtype = RowDtype::kF16;
  EXPECT_EQ(ValidateSparseTables({t}).code(), absl::StatusCode::kInvalidArgument);
  t.slot_dtype = static_cast<RowDtype>(9);
  EXPECT_EQ(ValidateSparseTables({t}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseRowDtype("fp8").status().message(), "row dtype 'fp8': expected fp32, fp16 or bf16");
  t = Table(2);
  t.rows = 10;
  t.initial_values = true;
  t.ttl_steps = 3;
  EXPECT_EQ(ValidateSparseTables({t}).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dtrain::ps
