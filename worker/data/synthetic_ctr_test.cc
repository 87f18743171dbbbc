#include "worker/data/synthetic_ctr.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/data/criteo.h"
#include "worker/data/data_test_util.h"
#include "worker/data/dataset.h"

namespace dtrain::data {
namespace {

using ::testing::HasSubstr;
using namespace test_util;  // NOLINT

// Within `sigmas` standard deviations of a binomial frequency.
void ExpectFrequency(int64_t count, int64_t n, double p, double sigmas, const std::string& what) {
  const double sd = std::sqrt(p * (1 - p) / static_cast<double>(n));
  EXPECT_NEAR(static_cast<double>(count) / static_cast<double>(n), p, sigmas * sd) << what;
}

TEST(ZipfSamplerTest, FrequenciesFollowTheLaw) {
  std::mt19937_64 rng(1);
  auto uniform = [&rng] { return static_cast<double>(rng() >> 11) * 0x1.0p-53; };
  for (double s : {1.05, 1.0, 0.5, 2.0}) {
    const ZipfSampler zipf(1000, s);
    constexpr int kDraws = 300000;
    std::vector<int64_t> counts(1001);
    for (int i = 0; i < kDraws; ++i) {
      const int64_t k = zipf.Sample(uniform);
      ASSERT_GE(k, 1);
      ASSERT_LE(k, 1000);
      ++counts[k];
    }
    for (int k : {1, 2, 3, 5, 10, 100}) {
      ExpectFrequency(counts[k], kDraws, zipf.Probability(k), 5, "s=" + std::to_string(s) + " k=" + std::to_string(k));
    }
    int64_t tail = 0;
    double p_tail = 0;
    for (int k = 501; k <= 1000; ++k) {
      tail += counts[k];
      p_tail += zipf.Probability(k);
    }
    ExpectFrequency(tail, kDraws, p_tail, 5, "s=" + std::to_string(s) + " ranks 501..1000");
  }
  const ZipfSampler one(1, 1.05);
  EXPECT_EQ(one.Sample(uniform), 1);
  EXPECT_DOUBLE_EQ(one.Probability(1), 1.0);
  const ZipfSampler huge(int64_t{1} << 31, 1.05);  // O(1) whatever the vocabulary
  for (int i = 0; i < 1000; ++i) EXPECT_LE(huge.Sample(uniform), int64_t{1} << 31);
}

TEST(SyntheticCtrTest, DefaultVocabulary) {
  const std::vector<int64_t> v = DefaultCtrVocab(26);
  ASSERT_EQ(v.size(), 26u);
  EXPECT_EQ(v.front(), 10);
  EXPECT_EQ(v[5], 100);
  EXPECT_EQ(v.back(), 1000000);
  EXPECT_EQ(DefaultCtrVocab(1), std::vector<int64_t>{1000});
}

TEST(SyntheticCtrTest, DeterministicInTheSeed) {
  const std::string dir = MakeTempDir();
  SyntheticCtrOptions o;
  o.examples = 3000;
  o.seed = 7;
  ASSERT_TRUE(WriteSyntheticCtr(o, dir + "/a").ok());
  ASSERT_TRUE(WriteSyntheticCtr(o, dir + "/b").ok());
  o.seed = 8;
  ASSERT_TRUE(WriteSyntheticCtr(o, dir + "/c").ok());
  const std::string a = ReadFile(dir + "/a/train.txt");
  EXPECT_EQ(a, ReadFile(dir + "/b/train.txt"));
  EXPECT_EQ(ReadFile(dir + "/a/test.txt"), ReadFile(dir + "/b/test.txt"));
  EXPECT_NE(a, ReadFile(dir + "/c/train.txt"));
  EXPECT_NE(ReadFile(dir + "/a/test.txt"), a.substr(0, ReadFile(dir + "/a/test.txt").size()));  // another stream
  EXPECT_EQ(std::count(a.begin(), a.end(), '\n'), 3000);
}

TEST(SyntheticCtrTest, ReadsBackWithEmptyFieldsZipfIdsAndAPlantedSignal) {
  const std::string dir = MakeTempDir();
  SyntheticCtrOptions o;
  o.examples = 40000;
  o.test_examples = 20000;
  o.vocab = {1000};
  absl::StatusOr<SyntheticCtrReport> r = WriteSyntheticCtr(o, dir);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->vocab, std::vector<int64_t>(26, 1000));
  absl::StatusOr<DatasetPair> p = LoadDataset(dir);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->format, "criteo");
  const Dataset& d = p->train;
  ASSERT_EQ(d.count(), 40000);
  EXPECT_EQ(p->test.count(), 20000);
  EXPECT_EQ(d.num_dense, 13);
  EXPECT_EQ(d.num_sparse, 26);

  int64_t clicks = 0;
  for (int32_t y : d.labels) clicks += y;
  EXPECT_NEAR(static_cast<double>(clicks) / d.count(), r->train_ctr, 1e-12);
  EXPECT_GT(r->train_ctr, 0.1);
  EXPECT_LT(r->train_ctr, 0.5);

  // Feature 5 is empty 30% of the time; integer feature 0 is empty 30% of the time (and then 0).
  int64_t missing5 = 0, zero0 = 0;
  for (int64_t e = 0; e < d.count(); ++e) {
    missing5 += d.Bag(e, 5)[0] == CriteoMissingId(5);
    zero0 += d.dense[e * 13] == 0.0f;
  }
  ExpectFrequency(missing5, d.count(), 0.3, 5, "empty C6");
  EXPECT_GT(zero0, d.count() * 0.3);

  // The ids of feature 0 (never empty) follow Zipf(1000, 1.05): the most frequent ids have the head's
  // frequencies.
  std::map<int64_t, int64_t> counts;
  for (int64_t e = 0; e < d.count(); ++e) ++counts[d.Bag(e, 0)[0]];
  std::vector<int64_t> by_count;
  for (const auto& [id, c] : counts) by_count.push_back(c);
  std::sort(by_count.rbegin(), by_count.rend());
  const ZipfSampler law(1000, 1.05);
  for (int k = 1; k <= 3; ++k) ExpectFrequency(by_count[k - 1], d.count(), law.Probability(k), 5, "rank " + std::to_string(k));
  EXPECT_GT(counts.size(), 500u);

  // The planted model is learnable: well above chance, and the ids carry much of it.
  EXPECT_GT(r->bayes_auc, 0.75);
  EXPECT_GT(r->dense_only_auc, 0.55);
  EXPECT_GT(r->bayes_auc, r->dense_only_auc + 0.08);
  EXPECT_LT(r->bayes_log_loss, r->constant_log_loss - 0.05);
}

TEST(SyntheticCtrTest, OtherLayoutsLoadThroughTheLayoutFile) {
  const std::string dir = MakeTempDir();
  SyntheticCtrOptions o;
  o.examples = 500;
  o.test_examples = 50;
  o.num_dense = 2;
  o.num_sparse = 3;
  o.vocab = {5, 50, 500};
  ASSERT_TRUE(WriteSyntheticCtr(o, dir).ok());
  EXPECT_EQ(ReadFile(dir + "/criteo_layout.txt"), "num_dense=2 num_sparse=3\n");
  absl::StatusOr<DatasetPair> p = LoadDataset(dir);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->train.num_dense, 2);
  EXPECT_EQ(p->train.num_sparse, 3);
  std::map<int64_t, int> ids0;
  for (int64_t e = 0; e < p->train.count(); ++e) ++ids0[p->train.Bag(e, 0)[0]];
  EXPECT_EQ(ids0.size(), 5u);  // a vocabulary of 5, all drawn
}

// A stream in parts with drift: the parts cut the examples in time order, and the ids of the end (the test set)
// are mostly new to the first part with drift 1, mostly known without drift.
TEST(SyntheticCtrTest, StreamPartsDriftTowardsNewIds) {
  const std::string dir = MakeTempDir();
  SyntheticCtrOptions o;
  o.examples = 4000;
  o.test_examples = 1000;
  o.num_dense = 1;
  o.num_sparse = 2;
  o.vocab = {200};
  o.stream_parts = 4;
  // The share of the test set's ids (feature 0) that the first part holds too.
  auto known_share = [&](double drift, const std::string& sub) {
    o.drift = drift;
    absl::StatusOr<SyntheticCtrReport> r = WriteSyntheticCtr(o, dir + sub);
    EXPECT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->parts.size(), 4u);
    absl::StatusOr<Dataset> first = ReadCriteo(dir + sub + "/stream/part-00000.txt", CriteoLayout{1, 2});
    absl::StatusOr<Dataset> test = ReadCriteo(dir + sub + "/test.txt", CriteoLayout{1, 2});
    EXPECT_TRUE(first.ok() && test.ok());
    EXPECT_EQ(first->count(), 1000);
    int64_t lines = 0;
    for (int p = 0; p < 4; ++p) {
      const std::string text = ReadFile(r->parts[p]);
      lines += std::count(text.begin(), text.end(), '\n');
    }
    EXPECT_EQ(lines, 4000);
    EXPECT_EQ(ReadFile(dir + sub + "/stream/criteo_layout.txt"), "num_dense=1 num_sparse=2\n");
    std::set<int64_t> seen;
    for (int64_t e = 0; e < first->count(); ++e) seen.insert(first->Bag(e, 0)[0]);
    int64_t known = 0;
    for (int64_t e = 0; e < test->count(); ++e) known += seen.count(test->Bag(e, 0)[0]);
    return static_cast<double>(known) / static_cast<double>(test->count());
  };
  EXPECT_GT(known_share(0.0, "/still"), 0.9);
  EXPECT_LT(known_share(2.0, "/drifting"), 0.1);  // the end: items 2V + k, the first part: up to 1.5 V
  o.drift = 0;
  o.stream_parts = 5000;  // more parts than examples
  EXPECT_THAT(WriteSyntheticCtr(o, dir + "/bad").status().message(), HasSubstr("--stream_parts=5000"));
  o.stream_parts = 2;
  o.drift = -1;
  EXPECT_THAT(WriteSyntheticCtr(o, dir + "/bad").status().message(), HasSubstr("--drift=-1"));
}

TEST(SyntheticCtrTest, BadOptions) {
  const std::string dir = MakeTempDir();
  SyntheticCtrOptions o;
  o.examples = 0;
  EXPECT_THAT(WriteSyntheticCtr(o, dir).status().message(), HasSubstr("--examples=0 must be at least 1"));
  o = {};
  o.vocab = {1, 2};
  EXPECT_THAT(WriteSyntheticCtr(o, dir).status().message(), HasSubstr("--vocab has 2 sizes for 26 sparse features"));
  o = {};
  o.zipf_exponent = 0;
  EXPECT_EQ(WriteSyntheticCtr(o, dir).status().code(), absl::StatusCode::kInvalidArgument);
  o = {};
  o.vocab = {0};
  EXPECT_THAT(WriteSyntheticCtr(o, dir).status().message(), HasSubstr("vocabulary size 0"));
}

}  // namespace
}  // namespace dtrain::data
