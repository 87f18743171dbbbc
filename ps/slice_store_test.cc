#include "ps/slice_store.h"

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

TEST(SliceStoreTest, SetValuesChecksEverySlice) {
  SliceStore store = *SliceStore::Create(TwoSlices(), Sgd(0.1f), 0.0f);
  EXPECT_EQ(store.total_floats(), 3);
  EXPECT_EQ(*store.IndexOf(7), 1);
  EXPECT_EQ(store.IndexOf(4).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store.SetValues({{3, {1, 2}}}).code(), absl::StatusCode::kInvalidArgument);  // b missing
  EXPECT_EQ(store.SetValues({{3, {1, 2}}, {7, {1, 2}}}).code(), absl::StatusCode::kInvalidArgument);  // length
  EXPECT_EQ(store.SetValues({{3, {1, 2}}, {3, {1, 2}}, {7, {1}}}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store.SetValues({{9, {1}}, {3, {1, 2}}, {7, {1}}}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store.values(0), std::vector<float>({0, 0}));  // failed calls changed nothing
  ASSERT_TRUE(store.SetValues({{7, {5}}, {3, {1, 2}}}).ok());
  EXPECT_EQ(store.values(0), std::vector<float>({1, 2}));
  EXPECT_EQ(store.values(1), std::vector<float>({5}));
  std::vector<SliceData> out;
  store.ReadValues(&out);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].key, 3u);
  EXPECT_EQ(out[1].values, std::vector<float>({5}));
}

TEST(SliceStoreTest, ExportImportStateRestoresValuesSlotsAndAverages) {
  OptimizerConfig adam = Sgd(0.1f);
  adam.name = "adam";
  SliceStore a = *SliceStore::Create(TwoSlices(), adam, 0.9f);
  ASSERT_TRUE(a.SetValues({{3, {1, 2}}, {7, {3}}}).ok());
  const float g0[] = {0.5f, -1.f}, g1[] = {2.f};
  for (int step = 0; step < 3; ++step) {
    a.ApplyGradient(0, step, g0, 1.f);
    a.ApplyGradient(1, step, g1, 1.f);
  }
  const std::vector<SliceState> state = a.ExportState();
  SliceStore b = *SliceStore::Create(TwoSlices(), adam, 0.9f);
  ASSERT_TRUE(b.ImportState(state).ok());
  // The same next update gives the same bits on both.
  a.ApplyGradient(0, 3, g0, 1.f);
  b.ApplyGradient(0, 3, g0, 1.f);
  EXPECT_EQ(a.values(0), b.values(0));
  EXPECT_EQ(a.slot(0, 0), b.slot(0, 0));
  EXPECT_EQ(a.slot(0, 1), b.slot(0, 1));
  EXPECT_EQ(a.moving_average(0), b.moving_average(0));
  EXPECT_EQ(a.values(1), b.values(1));

  // A state without averages sets them to the values; wrong specs or slot counts change nothing.
  std::vector<SliceState> no_averages = state;
  for (SliceState& s : no_averages) s.moving_average.clear();
  SliceStore c = *SliceStore::Create(TwoSlices(), adam, 0.9f);
  ASSERT_TRUE(c.ImportState(no_averages).ok());
  EXPECT_EQ(c.moving_average(1), state[1].values);
  std::vector<SliceState> bad = state;
  bad[1].spec.flat_offset = 5;
  SliceStore d = *SliceStore::Create(TwoSlices(), adam, 0.9f);
  EXPECT_EQ(d.ImportState(bad).code(), absl::StatusCode::kInvalidArgument);
  bad = state;
  bad[0].slots.pop_back();
  EXPECT_EQ(d.ImportState(bad).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(d.ImportState({state[0]}).code(), absl::StatusCode::kInvalidArgument);  // slice 7 missing
  EXPECT_EQ(d.values(0), std::vector<float>({0, 0}));
}

TEST(SliceStoreTest, CreateRejectsDuplicateKeysAndBadOptimizer) {
  EXPECT_EQ(SliceStore::Create({{1, "a", 0, 2}, {1, "b", 2, 2}}, Sgd(0.1f), 0.0f).status().code(),
            absl::StatusCode::kInvalidArgument);
  OptimizerConfig bad = Sgd(0.1f);
  bad.name = "nope";
  EXPECT_EQ(SliceStore::Create(TwoSlices(), bad, 0.0f).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(SliceStoreTest, ApplyUsesScaleAndSlots) {
  OptimizerConfig c = Sgd(0.5f);
  c.name = "momentum";
  c.momentum = 0.5f;
  SliceStore store = *SliceStore::Create(TwoSlices(), c, 0.0f);
  ASSERT_TRUE(store.SetValues({{3, {1, 2}}, {7, {0}}}).ok());
  const float grad[] = {4, -2};
  // grad_scale 0.5: g = {2, -1}; accum = g; var = {1 - 0.5*2, 2 + 0.5*1} = {0, 2.5}
  store.ApplyGradient(0, 0, grad, 0.5f);
  EXPECT_EQ(store.values(0), std::vector<float>({0.0f, 2.5f}));
  EXPECT_EQ(store.slot(0, 0), std::vector<float>({2.0f, -1.0f}));
  // accum = 0.5*{2,-1} + {2,-1} = {3, -1.5}; var = {0 - 1.5, 2.5 + 0.75} = {-1.5, 3.25}
  store.ApplyGradient(0, 1, grad, 0.5f);
  EXPECT_EQ(store.values(0), std::vector<float>({-1.5f, 3.25f}));
  EXPECT_EQ(store.values(1), std::vector<float>({0.0f}));  // other slice untouched
  // SetValues resets the slots.
  ASSERT_TRUE(store.SetValues({{3, {1, 2}}, {7, {0}}}).ok());
  EXPECT_EQ(store.slot(0, 0), std::vector<float>({0.0f, 0.0f}));
}

TEST(SliceStoreTest, MovingAveragesFollowTheValues) {
  SliceStore store = *SliceStore::Create(TwoSlices(), Sgd(1.0f), 0.5f);
  ASSERT_TRUE(store.has_moving_averages());
  ASSERT_TRUE(store.SetValues({{3, {1, 2}}, {7, {10}}}).ok());
  EXPECT_EQ(store.moving_average(0), std::vector<float>({1, 2}));  // shadows start at the initial values
  const float grad[] = {1, 1};
  // step 0: var = {0, 1}; num_updates 1: decay = min(0.5, 2/11) = 2/11;
  // shadow = {1, 2} - (9/11) * ({1, 2} - {0, 1}) = {2/11, 13/11}
  store.ApplyGradient(0, 0, grad, 1.0f);
  EXPECT_NEAR(store.moving_average(0)[0], 2.0f / 11.0f, 1e-6);
  EXPECT_NEAR(store.moving_average(0)[1], 13.0f / 11.0f, 1e-6);
  // step 20: var = {-1, 0}; num_updates 21: decay = min(0.5, 22/31) = 0.5;
  // shadow = {2/11, 13/11} - 0.5 * ({2/11, 13/11} - {-1, 0}) = {(2/11 - 1)/2, 13/22}
  store.ApplyGradient(0, 20, grad, 1.0f);
  EXPECT_NEAR(store.moving_average(0)[0], (2.0f / 11.0f - 1.0f) / 2.0f, 1e-6);
  EXPECT_NEAR(store.moving_average(0)[1], 13.0f / 22.0f, 1e-6);
  EXPECT_EQ(store.moving_average(1), std::vector<float>({10}));

  SliceStore plain = *SliceStore::Create(TwoSlices(), Sgd(1.0f), 0.0f);
  EXPECT_FALSE(plain.has_moving_averages());
  EXPECT_TRUE(plain.moving_average(0).empty());
}

}  // namespace
}  // namespace dtrain::ps
