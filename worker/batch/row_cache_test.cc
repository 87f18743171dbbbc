// RowCache: fresh rows served without a pull for K steps, then pulled again; every gradient pushed exactly once
// (gathered while cached, with the pull that refreshes the row, or on its own when the row leaves the cache).
#include "worker/batch/row_cache.h"

#include <cmath>
#include <map>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace dtrain::worker {
namespace {

// The ps side for the test: rows are id + step (a fresh pull shows the step), gradients summed per id.
struct FakePs {
  std::map<int64_t, double> pushed;
  std::vector<float> Pull(const std::vector<int64_t>& ids, int64_t step) {
    std::vector<float> rows;
    for (int64_t id : ids) rows.insert(rows.end(), {static_cast<float>(id), static_cast<float>(step)});
    return rows;
  }
};

TEST(RowCacheTest, ServesFreshRowsForKStepsAndPullsThemAgainAfter) {
  RowCache cache({2}, /*capacity=*/10, /*staleness=*/2);
  FakePs ps;
  const std::vector<int64_t> ids = {7, 8};
  std::vector<float> rows(4);
  for (int64_t step = 0; step < 7; ++step) {
    RowCache::Plan plan;
    cache.Serve(0, step, ids, rows.data(), &plan);
    // Pulled at steps 0, 3, 6: served from the cache at 1, 2 (rows of step 0), 4, 5.
    const bool pulled_now = step % 3 == 0;
    EXPECT_EQ(plan.pull_ids.size(), pulled_now ? 2u : 0u) << step;
    const std::vector<float> pulled = ps.Pull(plan.pull_ids, step);
    cache.Store(0, step, &plan, pulled.data(), rows.data());
    EXPECT_EQ(rows, std::vector<float>({7, static_cast<float>(step / 3 * 3), 8, static_cast<float>(step / 3 * 3)}))
        << step;
    const std::vector<float> grads = {1, 1, 2, 2};
    std::vector<int64_t> push_ids;
    std::vector<float> push_grads;
    cache.Gradients(0, ids, plan, grads.data(), &push_ids, &push_grads);
    if (pulled_now && step > 0) {  // the two gathered steps' gradients with this one
      EXPECT_EQ(push_ids, ids);
      EXPECT_EQ(push_grads, std::vector<float>({3, 3, 6, 6}));
    } else if (pulled_now) {
      EXPECT_EQ(push_grads, grads);
    } else {
      EXPECT_TRUE(push_ids.empty());
    }
  }
  EXPECT_EQ(cache.hits(), 8);
  EXPECT_EQ(cache.misses(), 6);
}

// Random steps of Zipf-like ids through a small cache: the sum of everything pushed, plus what is still gathered,
// equals the sum of every gradient (nothing lost or pushed twice), and ids are never repeated within a push.
TEST(RowCacheTest, EveryGradientIsPushedOnce) {
  RowCache cache({1}, /*capacity=*/20, /*staleness=*/3);
  FakePs ps;
  std::mt19937_64 gen(4);
  std::map<int64_t, double> given, pushed;
  std::vector<float> rows;
  for (int64_t step = 0; step < 200; ++step) {
    std::map<int64_t, int> unique;
    for (int i = 0; i < 15; ++i) unique[static_cast<int64_t>(gen() % (1 + gen() % 60))] = 1;
    std::vector<int64_t> ids;
    for (const auto& [id, one] : unique) ids.push_back(id);
    rows.assign(ids.size(), 0);
    RowCache::Plan plan;
    cache.Serve(0, step, ids, rows.data(), &plan);
    const std::vector<float> pulled = ps.Pull(plan.pull_ids, step);
    std::vector<float> pulled1;
    for (size_t k = 0; k < plan.pull_ids.size(); ++k) pulled1.push_back(pulled[2 * k]);
    cache.Store(0, step, &plan, pulled1.data(), rows.data());
    std::vector<float> grads;
    for (int64_t id : ids) {
      grads.push_back(static_cast<float>(step % 7 + 1));
      given[id] += step % 7 + 1;
    }
    std::vector<int64_t> push_ids;
    std::vector<float> push_grads;
    cache.Gradients(0, ids, plan, grads.data(), &push_ids, &push_grads);
    std::map<int64_t, int> seen;
    for (size_t k = 0; k < push_ids.size(); ++k) {
      ASSERT_EQ(seen[push_ids[k]]++, 0) << "id " << push_ids[k] << " twice in one push";
      pushed[push_ids[k]] += push_grads[k];
    }
  }
  // What is still gathered in the cache leaves with a last step that pulls everything (staleness passed).
  std::vector<int64_t> all;
  for (const auto& [id, g] : given) all.push_back(id);
  rows.assign(all.size(), 0);
  RowCache::Plan plan;
  cache.Serve(0, 1000, all, rows.data(), &plan);
  EXPECT_EQ(plan.pull_ids.size(), all.size());
  std::vector<float> pulled(all.size(), 0), zero(all.size(), 0);
  cache.Store(0, 1000, &plan, pulled.data(), rows.data());
  std::vector<int64_t> push_ids;
  std::vector<float> push_grads;
  cache.Gradients(0, all, plan, zero.data(), &push_ids, &push_grads);
  for (size_t k = 0; k < push_ids.size(); ++k) pushed[push_ids[k]] += push_grads[k];
  EXPECT_EQ(pushed, given);
  EXPECT_GT(cache.hits(), 0);
}

// The worker updates its cached copies itself, at the step size the ps applied to the row's last push: with SGD
// and one worker, a row served from the cache is the row the ps would hold had it seen every gradient at once
// (from the row's second pull on, when that step size is known), so the cache costs no freshness.
void CheckServedRowsCarryTheWorkersOwnUpdates(int64_t capacity, int id_range, int ids_per_step, int steps) {
  constexpr int kDim = 3;
  constexpr float kLr = 0.05f;
  // A ps applying SGD to what it is pushed.
  struct SgdPs {
    std::map<int64_t, std::vector<float>> rows;
    std::vector<float> Pull(const std::vector<int64_t>& ids) {
      std::vector<float> out;
      for (int64_t id : ids) {
        auto [it, fresh] = rows.try_emplace(id, std::vector<float>(kDim, static_cast<float>(id % 13)));
        out.insert(out.end(), it->second.begin(), it->second.end());
      }
      return out;
    }
    void Push(const std::vector<int64_t>& ids, const std::vector<float>& grads) {
      for (size_t k = 0; k < ids.size(); ++k) {
        for (int d = 0; d < kDim; ++d) rows[ids[k]][d] -= kLr * grads[k * kDim + d];
      }
    }
  };
  SgdPs cached_ps, reference;
  RowCache cache({kDim}, capacity, /*staleness=*/3);
  std::mt19937_64 gen(7);
  std::map<int64_t, int> pulls;
  int compared = 0, stale_before = 0;
  for (int64_t step = 0; step < steps; ++step) {
    std::map<int64_t, int> unique;
    for (int i = 0; i < ids_per_step; ++i) unique[static_cast<int64_t>(gen() % (1 + gen() % id_range))] = 1;
    std::vector<int64_t> ids;
    for (const auto& [id, one] : unique) ids.push_back(id);
    std::vector<float> rows(ids.size() * kDim);
    RowCache::Plan plan;
    cache.Serve(0, step, ids, rows.data(), &plan);
    const std::vector<float> pulled = cached_ps.Pull(plan.pull_ids);
    cache.Store(0, step, &plan, pulled.data(), rows.data());
    const std::vector<float> expected = reference.Pull(ids);
    for (size_t i = 0; i < ids.size(); ++i) {
      bool equal = true;
      for (int d = 0; d < kDim; ++d) equal = equal && std::abs(rows[i * kDim + d] - expected[i * kDim + d]) < 1e-4f;
      if (pulls[ids[i]] >= 2) {
        ++compared;
        EXPECT_TRUE(equal) << "step " << step << " id " << ids[i] << " got " << rows[i * kDim] << " want "
                           << expected[i * kDim] << " pulled now " << !plan.cached[i];
      } else if (!equal) {
        ++stale_before;
      }
    }
    for (int64_t id : plan.pull_ids) ++pulls[id];
    std::vector<float> grads;
    for (size_t i = 0; i < ids.size(); ++i) {
      for (int d = 0; d < kDim; ++d) grads.push_back(static_cast<float>((ids[i] * 3 + step + d) % 7) - 2.5f);
    }
    reference.Push(ids, grads);
    std::vector<int64_t> push_ids;
    std::vector<float> push_grads;
    cache.Gradients(0, ids, plan, grads.data(), &push_ids, &push_grads);
    cached_ps.Push(push_ids, push_grads);
  }
  EXPECT_GT(compared, steps * ids_per_step / 8);
  EXPECT_GT(cache.hits(), steps * ids_per_step / 8);
  EXPECT_GT(stale_before, 0);  // before a row's step size is known its copy is stale: the comparison can fail
}

TEST(RowCacheTest, ServedRowsCarryTheWorkersOwnUpdates) {
  CheckServedRowsCarryTheWorkersOwnUpdates(/*capacity=*/100, /*id_range=*/12, /*ids_per_step=*/6, /*steps=*/300);
}

// The same over three blocks of slots (RowCache::kBlockSlots each).
TEST(RowCacheTest, ServedRowsCarryTheWorkersOwnUpdatesAcrossBlocks) {
  CheckServedRowsCarryTheWorkersOwnUpdates(/*capacity=*/9000, /*id_range=*/9000, /*ids_per_step=*/600,
                                           /*steps=*/60);
}

}  // namespace
}  // namespace dtrain::worker
