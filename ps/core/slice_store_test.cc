#include "ps/core/slice_store.h"

#include <atomic>
#include <future>
#include <cmath>
#include <limits>
#include <map>

#include "common/cancellation.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace dtrain::ps {
namespace {

std::vector<SliceSpec> TwoSlices() { return {{3, "w", 0, 2}, {7, "b", 2, 1}}; }

OptimizerConfig Sgd(float lr) {
  OptimizerConfig c;
  c.name = "sgd";
  c.learning_rate = lr;
  return c;
}

std::vector<float> Values(const SliceStore& s, int i, bool averages = false) {
  std::vector<float> v(s.spec(i).length);
  s.Read(i, averages, 0, static_cast<int64_t>(v.size()), WireDtype::kF32, v.data());
  return v;
}
std::vector<float> Slot(const SliceStore& s, int i, int k) { return s.ExportState()[i].slots[k]; }

// Sets every slice and resets slots and averages, as an Initialize does.
void Set(SliceStore& s, const std::map<int, std::vector<float>>& values) {
  for (const auto& [i, v] : values) {
    ASSERT_TRUE(s.WriteValues(i, 0, static_cast<int64_t>(v.size()), WireDtype::kF32, v.data()).ok());
  }
  s.ResetSlotsAndAverages(0);
}

void Apply(SliceStore& s, int i, int64_t step, const float* grad, float scale) {
  s.Apply(i, step, &grad, 1, scale, step + 1);
}

// The guard (lent gradients: a checked copy) changes nothing of a finite update, bit for bit, with and without
// clip weights, for one gradient or a sum; a value not finite in the copy is applied as 0 and counted.
TEST(SliceStoreTest, TheGuardedApplyEqualsThePlainOneAndZeroesWhatIsNotFinite) {
  OptimizerConfig adam;
  adam.name = "adam";
  adam.learning_rate = 0.01f;
  const int64_t n = 200000;  // several chunks
  std::vector<float> g1(n), g2(n);
  for (int64_t k = 0; k < n; ++k) {
    g1[k] = std::sin(0.001f * static_cast<float>(k));
    g2[k] = std::cos(0.003f * static_cast<float>(k));
  }
  const float* grads[] = {g1.data(), g2.data()};
  const float weights[] = {0.5f, 0.25f};
  for (int num_grads : {1, 2}) {
    for (const float* w : {static_cast<const float*>(nullptr), weights}) {
      SCOPED_TRACE(absl::StrCat(num_grads, " gradient(s), ", w ? "weighted" : "plain"));
      std::unique_ptr<SliceStore> plain = *SliceStore::Create({{1, "w", 0, n}}, adam, 0.99f);
      std::unique_ptr<SliceStore> guarded = *SliceStore::Create({{1, "w", 0, n}}, adam, 0.99f);
      plain->ResetSlotsAndAverages(0);
      guarded->ResetSlotsAndAverages(0);
      for (int64_t step = 0; step < 3; ++step) {
        EXPECT_EQ(plain->Apply(0, step, grads, num_grads, 0.5f, step + 1, w), 0);
        EXPECT_EQ(guarded->Apply(0, step, grads, num_grads, 0.5f, step + 1, w, ApplyGuard::kCopyFinite), 0);
      }
      EXPECT_EQ(Values(*plain, 0), Values(*guarded, 0));
      EXPECT_EQ(Values(*plain, 0, true), Values(*guarded, 0, true));
    }
  }
  std::unique_ptr<SliceStore> store = *SliceStore::Create(TwoSlices(), Sgd(1.0f), 0.0f);
  Set(*store, {{0, {1, 2}}, {1, {3}}});
  const float bad[] = {std::numeric_limits<float>::quiet_NaN(), 1};
  const float* one[] = {bad};
  EXPECT_EQ(store->Apply(0, 0, one, 1, 1.0f, 1, nullptr, ApplyGuard::kCopyFinite), 1);
  EXPECT_EQ(Values(*store, 0), std::vector<float>({1, 1}));
}

TEST(SliceStoreTest, WritesAreCheckedAgainstTheSlice) {
  std::unique_ptr<SliceStore> store = *SliceStore::Create(TwoSlices(), Sgd(0.1f), 0.0f);
  EXPECT_EQ(store->total_floats(), 3);
  EXPECT_EQ(*store->IndexOf(7), 1);
  EXPECT_EQ(store->IndexOf(4).status().code(), absl::StatusCode::kInvalidArgument);
  const float v[] = {1, 2, 3};
  EXPECT_EQ(store->WriteValues(1, 0, 2, WireDtype::kF32, v).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->WriteValues(0, 1, 2, WireDtype::kF32, v).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->WriteValues(0, -1, 1, WireDtype::kF32, v).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Values(*store, 0), std::vector<float>({0, 0}));  // failed calls changed nothing
  ASSERT_TRUE(store->WriteValues(0, 1, 1, WireDtype::kF32, v).ok());
  EXPECT_EQ(Values(*store, 0), std::vector<float>({0, 1}));
  // Narrow wire types are decoded.
  uint16_t bf16_two = 0x4000;  // 2.0 in bfloat16
  ASSERT_TRUE(store->WriteValues(1, 0, 1, WireDtype::kBF16, &bf16_two).ok());
  EXPECT_EQ(Values(*store, 1), std::vector<float>({2}));
}

// A state slice (BatchNorm running statistics) takes the averaged change as is, whatever the optimizer: no
// learning rate, no slots, no decay; its moving average is its value.
TEST(SliceStoreTest, StateSlicesApplyThePlainChange) {
  OptimizerConfig adam = Sgd(0.5f);
  adam.name = "adam";
  adam.decay_steps = 1;
  adam.decay_rate = 0.5f;
  std::vector<SliceSpec> specs = {{1, "bn.weight", 0, 2}, {2, "bn.running_mean", 2, 2}};
  specs[1].trainable = false;
  std::unique_ptr<SliceStore> store = *SliceStore::Create(specs, adam, 0.9f);
  Set(*store, {{0, {1, 1}}, {1, {4, 8}}});
  const float g1[] = {1, 2}, g2[] = {3, -2};
  const float* grads[] = {g1, g2};
  store->Apply(1, 3, grads, 2, 0.5f, 4);
  EXPECT_EQ(Values(*store, 1), std::vector<float>({2, 8}));  // 4 - (1 + 3) / 2, 8 - 0
  EXPECT_EQ(Values(*store, 1, /*averages=*/true), std::vector<float>({2, 8}));
  EXPECT_EQ(Slot(*store, 1, 0), std::vector<float>({0, 0}));
  EXPECT_EQ(Slot(*store, 1, 1), std::vector<float>({0, 0}));
  // The trainable slice next to it still gets Adam.
  store->Apply(0, 3, grads, 2, 0.5f, 4);
  EXPECT_NE(Values(*store, 0), std::vector<float>({-1, 0}));
  EXPECT_NE(Slot(*store, 0, 0), std::vector<float>({0, 0}));
}

TEST(SliceStoreTest, ExportImportStateRestoresValuesSlotsAndAverages) {
  OptimizerConfig adam = Sgd(0.1f);
  adam.name = "adam";
  std::unique_ptr<SliceStore> a = *SliceStore::Create(TwoSlices(), adam, 0.9f);
  Set(*a, {{0, {1, 2}}, {1, {3}}});
  const float g0[] = {0.5f, -1.f}, g1[] = {2.f};
  for (int step = 0; step < 3; ++step) {
    Apply(*a, 0, step, g0, 1.f);
    Apply(*a, 1, step, g1, 1.f);
  }
  const std::vector<SliceState> state = a->ExportState();
  std::unique_ptr<SliceStore> b = *SliceStore::Create(TwoSlices(), adam, 0.9f);
  ASSERT_TRUE(b->ImportState(state, 3).ok());
  EXPECT_EQ(b->version(0), 3);
  // The same next update gives the same bits on both.
  Apply(*a, 0, 3, g0, 1.f);
  Apply(*b, 0, 3, g0, 1.f);
  EXPECT_EQ(Values(*a, 0), Values(*b, 0));
  EXPECT_EQ(Slot(*a, 0, 0), Slot(*b, 0, 0));
  EXPECT_EQ(Slot(*a, 0, 1), Slot(*b, 0, 1));
  EXPECT_EQ(Values(*a, 0, true), Values(*b, 0, true));
  EXPECT_EQ(Values(*a, 1), Values(*b, 1));

  // A state without averages sets them to the values; wrong specs or slot counts change nothing.
  std::vector<SliceState> no_averages = state;
  for (SliceState& s : no_averages) s.moving_average.clear();
  std::unique_ptr<SliceStore> c = *SliceStore::Create(TwoSlices(), adam, 0.9f);
  ASSERT_TRUE(c->ImportState(no_averages, 3).ok());
  EXPECT_EQ(Values(*c, 1, true), state[1].values);
  std::vector<SliceState> bad = state;
  bad[1].spec.flat_offset = 5;
  std::unique_ptr<SliceStore> d = *SliceStore::Create(TwoSlices(), adam, 0.9f);
  EXPECT_EQ(d->ImportState(bad, 3).code(), absl::StatusCode::kInvalidArgument);
  bad = state;
  bad[0].slots.pop_back();
  EXPECT_EQ(d->ImportState(bad, 3).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(d->ImportState({state[0]}, 3).code(), absl::StatusCode::kInvalidArgument);  // slice 7 missing
  EXPECT_EQ(Values(*d, 0), std::vector<float>({0, 0}));
  EXPECT_EQ(d->version(0), 0);
}

TEST(SliceStoreTest, CreateRejectsDuplicateKeysAndBadOptimizer) {
  EXPECT_EQ(SliceStore::Create({{1, "a", 0, 2}, {1, "b", 2, 2}}, Sgd(0.1f), 0.0f).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SliceStore::Create({{1, "a", 0, 0}}, Sgd(0.1f), 0.0f).status().code(),
            absl::StatusCode::kInvalidArgument);
  OptimizerConfig bad = Sgd(0.1f);
  bad.name = "nope";
  EXPECT_EQ(SliceStore::Create(TwoSlices(), bad, 0.0f).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SliceStore::Create(TwoSlices(), Sgd(0.1f), 1.0f).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(SliceStoreTest, ApplyUsesScaleSumsAndSlots) {
  OptimizerConfig c = Sgd(0.5f);
  c.name = "momentum";
  c.momentum = 0.5f;
  std::unique_ptr<SliceStore> store = *SliceStore::Create(TwoSlices(), c, 0.0f);
  Set(*store, {{0, {1, 2}}, {1, {0}}});
  const float grad[] = {4, -2};
  // grad_scale 0.5: g = {2, -1}; accum = g; var = {1 - 0.5*2, 2 + 0.5*1} = {0, 2.5}
  Apply(*store, 0, 0, grad, 0.5f);
  EXPECT_EQ(Values(*store, 0), std::vector<float>({0.0f, 2.5f}));
  EXPECT_EQ(Slot(*store, 0, 0), std::vector<float>({2.0f, -1.0f}));
  // Two workers' gradients averaged in the same pass: g = 0.5 * ({4,-2} + {0,0}) = {2, -1};
  // accum = 0.5*{2,-1} + {2,-1} = {3, -1.5}; var = {0 - 1.5, 2.5 + 0.75} = {-1.5, 3.25}
  const float zero[] = {0, 0};
  const float* grads[] = {grad, zero};
  store->Apply(0, 1, grads, 2, 0.5f, 2);
  EXPECT_EQ(Values(*store, 0), std::vector<float>({-1.5f, 3.25f}));
  EXPECT_EQ(Values(*store, 1), std::vector<float>({0.0f}));  // other slice untouched
  EXPECT_EQ(store->version(0), 2);
  EXPECT_EQ(store->version(1), 0);
  // Initializing again resets the slots.
  Set(*store, {{0, {1, 2}}, {1, {0}}});
  EXPECT_EQ(Slot(*store, 0, 0), std::vector<float>({0.0f, 0.0f}));
}

TEST(SliceStoreTest, MovingAveragesFollowTheValues) {
  std::unique_ptr<SliceStore> store = *SliceStore::Create(TwoSlices(), Sgd(1.0f), 0.5f);
  ASSERT_TRUE(store->has_moving_averages());
  Set(*store, {{0, {1, 2}}, {1, {10}}});
  EXPECT_EQ(Values(*store, 0, true), std::vector<float>({1, 2}));  // shadows start at the initial values
  const float grad[] = {1, 1};
  // step 0: var = {0, 1}; num_updates 1: decay = min(0.5, 2/11) = 2/11;
  // shadow = {1, 2} - (9/11) * ({1, 2} - {0, 1}) = {2/11, 13/11}
  Apply(*store, 0, 0, grad, 1.0f);
  EXPECT_NEAR(Values(*store, 0, true)[0], 2.0f / 11.0f, 1e-6);
  EXPECT_NEAR(Values(*store, 0, true)[1], 13.0f / 11.0f, 1e-6);
  // step 20: var = {-1, 0}; num_updates 21: decay = min(0.5, 22/31) = 0.5;
  // shadow = {2/11, 13/11} - 0.5 * ({2/11, 13/11} - {-1, 0}) = {(2/11 - 1)/2, 13/22}
  Apply(*store, 0, 20, grad, 1.0f);
  EXPECT_NEAR(Values(*store, 0, true)[0], (2.0f / 11.0f - 1.0f) / 2.0f, 1e-6);
  EXPECT_NEAR(Values(*store, 0, true)[1], 13.0f / 22.0f, 1e-6);
  EXPECT_EQ(Values(*store, 1, true), std::vector<float>({10}));

  std::unique_ptr<SliceStore> plain = *SliceStore::Create(TwoSlices(), Sgd(1.0f), 0.0f);
  EXPECT_FALSE(plain->has_moving_averages());
  EXPECT_TRUE(plain->ExportState()[0].moving_average.empty());
}

TEST(SliceStoreTest, ReadersWaitForTheChunksTheyNeed) {
  const int64_t n = 3 * SliceStore::kChunkFloats;
  std::unique_ptr<SliceStore> store = *SliceStore::Create({{0, "big", 0, n}}, Sgd(1.0f), 0.0f);
  store->ResetSlotsAndAverages(4);
  const absl::Time soon = absl::Now() + absl::Milliseconds(20);
  EXPECT_TRUE(store->WaitReadable(0, n, 4, soon));   // at version 4 already
  EXPECT_FALSE(store->WaitReadable(0, 1, 5, soon));  // nobody applies version 5: times out
  // A reader of version 5 gets the first chunk while the update is still in progress, and the whole slice
  // once it is done; every float it reads then holds the new value.
  std::future<bool> first = std::async(std::launch::async, [&] {
    return store->WaitReadable(0, SliceStore::kChunkFloats, 5, absl::Now() + absl::Seconds(10));
  });
  EXPECT_EQ(first.wait_for(std::chrono::milliseconds(20)), std::future_status::timeout);
  std::vector<float> grad(n, -1.0f);
  Apply(*store, 0, 4, grad.data(), 1.0f);
  EXPECT_TRUE(first.get());
  EXPECT_TRUE(store->WaitReadable(0, n, 5, absl::Now()));
  EXPECT_EQ(store->version(0), 5);
  EXPECT_EQ(Values(*store, 0), std::vector<float>(n, 1.0f));
  // A cancelled wait returns at once.
  Cancellation cancel;
  std::future<bool> cancelled = std::async(std::launch::async, [&] {
    return store->WaitReadable(0, n, 6, absl::Now() + absl::Seconds(30), [&] { return cancel.cancelled(); });
  });
  EXPECT_EQ(cancelled.wait_for(std::chrono::milliseconds(20)), std::future_status::timeout);
  cancel.Cancel();
  store->WakeWaiters();
  ASSERT_EQ(cancelled.wait_for(std::chrono::seconds(5)), std::future_status::ready);
  EXPECT_FALSE(cancelled.get());
}

// ---- tentative updates (the early apply) ------------------------------------------------------------------------

constexpr int64_t kChunk = SliceStore::kChunkFloats;

std::unique_ptr<SliceStore> AdamStore() {
  OptimizerConfig adam;
  adam.name = "adam";
  adam.learning_rate = 0.01f;
  // A large trainable slice (3 chunks and a bit) and a state slice.
  std::vector<SliceSpec> specs = {{0, "w", 0, 3 * kChunk + 7}, {1, "bn/mean", 3 * kChunk + 7, 5}};
  specs[1].trainable = false;
  auto store = *SliceStore::Create(specs, adam, /*moving_average_decay=*/0.99f);
  std::map<int, std::vector<float>> values;
  for (int i = 0; i < 2; ++i) {
    std::vector<float> v(store->spec(i).length);
    for (size_t k = 0; k < v.size(); ++k) v[k] = 0.001f * static_cast<float>((k * 7919) % 1000) - 0.5f;
    values[i] = v;
  }
  Set(*store, values);
  return store;
}

std::vector<float> Gradient(int64_t n, int seed) {
  std::vector<float> g(n);
  for (int64_t k = 0; k < n; ++k) g[k] = 0.01f * static_cast<float>(((k + seed) * 104729) % 2001 - 1000) / 1000.0f;
  return g;
}

void ExpectSameState(const SliceStore& a, const SliceStore& b) {
  const std::vector<SliceState> x = a.ExportState(), y = b.ExportState();
  ASSERT_EQ(x.size(), y.size());
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_EQ(x[i].values, y[i].values) << "slice " << i;  // bit for bit
    EXPECT_EQ(x[i].slots, y[i].slots) << "slice " << i;
    EXPECT_EQ(x[i].moving_average, y[i].moving_average) << "slice " << i;
  }
}

TEST(SliceStoreTest, TentativeUpdatesApplyAsApplyDoesBitForBit) {
  auto applied = AdamStore(), tentative = AdamStore();
  for (int64_t step = 0; step < 3; ++step) {
    for (int i = 0; i < 2; ++i) {
      const std::vector<float> g = Gradient(applied->spec(i).length, static_cast<int>(step * 10 + i));
      Apply(*applied, i, step, g.data(), 1.0f);
      // Pieces of odd sizes: only whole chunks are applied until the slice is whole.
      const int64_t n = tentative->spec(i).length;
      EXPECT_EQ(tentative->ApplyTentative(i, step, g.data(), std::min<int64_t>(n, kChunk + 100), step + 1),
                n > kChunk + 100 ? kChunk : n);
      if (n > kChunk + 100) {
        EXPECT_TRUE(tentative->WaitReadable(i, kChunk, step + 1, absl::InfinitePast()));
        EXPECT_FALSE(tentative->WaitReadable(i, kChunk + 1, step + 1, absl::InfinitePast()));
        EXPECT_EQ(tentative->version(i), step);
        EXPECT_EQ(tentative->ApplyTentative(i, step, g.data(), 2 * kChunk + 5, step + 1), 2 * kChunk);
        EXPECT_EQ(tentative->tentative_floats(i), 2 * kChunk);
        EXPECT_EQ(tentative->ApplyTentative(i, step, g.data(), n, step + 1), n);
      }
      EXPECT_EQ(tentative->version(i), step + 1);
      tentative->ConfirmTentative(i);
      EXPECT_EQ(tentative->tentative_floats(i), 0);
    }
  }
  ExpectSameState(*applied, *tentative);
}

TEST(SliceStoreTest, AnUndoneTentativeUpdateLeavesNoTrace) {
  auto untouched = AdamStore(), store = AdamStore();
  const std::vector<float> g = Gradient(store->spec(0).length, 1);
  ASSERT_EQ(store->ApplyTentative(0, 0, g.data(), 2 * kChunk, 1), 2 * kChunk);
  // Checkpoints never see it: the state exported is what it overwrote.
  ExpectSameState(*untouched, *store);
  EXPECT_NE(Values(*store, 0)[0], Values(*untouched, 0)[0]);  // though readers of version 1 stream it
  std::atomic<bool> undone{false};
  std::future<bool> reader = std::async(std::launch::async, [&] {
    return store->WaitReadable(0, store->spec(0).length, 1, absl::Now() + absl::Seconds(20),
                               [&] { return undone.load(); });
  });
  undone = true;
  store->UndoTentative(0);
  EXPECT_FALSE(reader.get());  // woken, and version 1 is not there any more
  EXPECT_EQ(store->version(0), 0);
  EXPECT_FALSE(store->WaitReadable(0, 1, 1, absl::InfinitePast()));
  EXPECT_EQ(Values(*store, 0), Values(*untouched, 0));
  ExpectSameState(*untouched, *store);
  store->UndoTentative(0);  // nothing in progress: nothing happens
  // The same update applied for real afterwards is the one a store that never saw the tentative one gets.
  Apply(*store, 0, 0, g.data(), 1.0f);
  Apply(*untouched, 0, 0, g.data(), 1.0f);
  ExpectSameState(*untouched, *store);
}

TEST(SliceStoreTest, WaitAnyReadableFindsTheSliceBeingUpdated) {
  auto store = AdamStore();
  ASSERT_EQ(store->num_slices(), 2);
  std::vector<int64_t> sent = {0, 0};
  int64_t end = -1;
  EXPECT_EQ(store->WaitAnyReadable(sent, 1, absl::InfinitePast(), nullptr, &end), -1);
  const std::vector<float> g = Gradient(5, 3);
  std::future<int> waiter = std::async(std::launch::async, [&] {
    int64_t e = -1;
    const int k = store->WaitAnyReadable(sent, 1, absl::Now() + absl::Seconds(20), nullptr, &e);
    return k == 1 && e == 5 ? k : -2;
  });
  ASSERT_EQ(store->ApplyTentative(1, 0, g.data(), 5, 1), 5);
  EXPECT_EQ(waiter.get(), 1);
  sent[1] = 5;  // slice 1 streamed whole: only slice 0 is left, and it has nothing at version 1
  EXPECT_EQ(store->WaitAnyReadable(sent, 1, absl::InfinitePast(), nullptr, &end), -1);
  const std::vector<float> w = Gradient(store->spec(0).length, 4);
  ASSERT_EQ(store->ApplyTentative(0, 0, w.data(), kChunk, 1), kChunk);
  EXPECT_EQ(store->WaitAnyReadable(sent, 1, absl::InfinitePast(), nullptr, &end), 0);
  EXPECT_EQ(end, kChunk);
}

}  // namespace
}  // namespace dtrain::ps
