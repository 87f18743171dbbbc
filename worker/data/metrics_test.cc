#include "worker/data/metrics.h"

#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace dtrain::data {
namespace {

TEST(MeanLogLossTest, HandComputedCases) {
  EXPECT_DOUBLE_EQ(MeanLogLoss({0.0f}, {1.0f}), std::log(2.0));
  EXPECT_DOUBLE_EQ(MeanLogLoss({0.0f}, {0.0f}), std::log(2.0));
  // -log(sigmoid(2)) and -log(1 - sigmoid(-1)).
  EXPECT_NEAR(MeanLogLoss({2.0f, -1.0f}, {1.0f, 0.0f}),
              (-std::log(1 / (1 + std::exp(-2.0))) - std::log(1 - 1 / (1 + std::exp(1.0)))) / 2, 1e-12);
  EXPECT_EQ(MeanLogLoss({}, {}), 0.0);
}

TEST(MeanLogLossTest, StableForLargeLogits) {
  EXPECT_NEAR(MeanLogLoss({100.0f}, {0.0f}), 100.0, 1e-9);   // log(1 + e^100) without overflow
  EXPECT_NEAR(MeanLogLoss({-100.0f}, {1.0f}), 100.0, 1e-9);
  EXPECT_NEAR(MeanLogLoss({100.0f}, {1.0f}), std::exp(-100.0), 1e-40);
  EXPECT_NEAR(MeanLogLoss({-1e30f}, {0.0f}), 0.0, 1e-12);
  EXPECT_TRUE(std::isnan(MeanLogLoss({NAN}, {1.0f})));
}

TEST(RocAucTest, HandComputedCases) {
  EXPECT_DOUBLE_EQ(RocAuc({0.1f, 0.4f, 0.35f, 0.8f}, {0, 0, 1, 1}), 0.75);  // 3 of the 4 pairs ordered
  EXPECT_DOUBLE_EQ(RocAuc({1, 2, 3, 4}, {0, 0, 1, 1}), 1.0);
  EXPECT_DOUBLE_EQ(RocAuc({4, 3, 2, 1}, {0, 0, 1, 1}), 0.0);
  EXPECT_DOUBLE_EQ(RocAuc({5, 5, 5, 5}, {0, 1, 0, 1}), 0.5);  // all tied
  EXPECT_DOUBLE_EQ(RocAuc({1, 1, 2}, {0, 1, 1}), 0.75);       // a tie counts one half
  EXPECT_DOUBLE_EQ(RocAuc({-3, 7}, {0, 1}), RocAuc({0.01f, 0.99f}, {0, 1}));
}

TEST(RocAucTest, UndefinedCasesAreNan) {
  EXPECT_TRUE(std::isnan(RocAuc({1, 2}, {1, 1})));
  EXPECT_TRUE(std::isnan(RocAuc({1, 2}, {0, 0})));
  EXPECT_TRUE(std::isnan(RocAuc({}, {})));
  EXPECT_TRUE(std::isnan(RocAuc({1, NAN, 2}, {0, 1, 1})));
}

TEST(RocAucTest, MatchesABruteForcePairCount) {
  std::mt19937_64 rng(5);
  for (int trial = 0; trial < 20; ++trial) {
    const int n = 50 + trial * 37;
    std::vector<float> scores(n), labels(n);
    for (int i = 0; i < n; ++i) {
      labels[i] = static_cast<float>(rng() % 3 == 0);
      // Few distinct values (many ties), shifted for positives so the AUC is not ~0.5.
      scores[i] = static_cast<float>(rng() % 8) + (labels[i] > 0 ? 1.5f : 0.0f) * (trial % 2);
    }
    double wins = 0, pairs = 0;
    for (int i = 0; i < n; ++i) {
      for (int j = 0; j < n; ++j) {
        if (labels[i] != 1 || labels[j] != 0) continue;
        pairs += 1;
        wins += scores[i] > scores[j] ? 1.0 : scores[i] == scores[j] ? 0.5 : 0.0;
      }
    }
    EXPECT_NEAR(RocAuc(scores, labels), wins / pairs, 1e-12) << "trial " << trial;
  }
}

TEST(BinaryMetricsTest, AccumulatesBatches) {
  BinaryMetrics m;
  m.Add({0.1f, 0.4f}, {0, 0});
  m.Add({0.35f, 0.8f}, {1, 1});
  EXPECT_EQ(m.count(), 4);
  EXPECT_DOUBLE_EQ(m.auc(), 0.75);
  EXPECT_DOUBLE_EQ(m.positive_rate(), 0.5);
  EXPECT_DOUBLE_EQ(m.log_loss(), MeanLogLoss({0.1f, 0.4f, 0.35f, 0.8f}, {0, 0, 1, 1}));
  m.Clear();
  EXPECT_EQ(m.count(), 0);
}

}  // namespace
}  // namespace dtrain::data
