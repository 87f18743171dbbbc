// CTR data through the pipeline: BatchStream and EvalBatches batches.
#include "worker/data/ctr_dataset.h"

#include <algorithm>
#include <cmath>
#include <memory>
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

// n examples of 2 dense and 2 sparse features that encode the example's index i: dense = {i, -i}, feature 0's
// bag = {i}, feature 1's bag = {1000 i, 1000 i + 1, ...} of (i + 1) % 3 ids (some empty; example 0 has one id
// in each bag, so a reader meets a bag of another size only at example 1); label i % 2.
Dataset IndexedCtr(int n) {
  Dataset d;
  d.num_classes = 2;
  d.num_dense = 2;
  d.num_sparse = 2;
  d.id_offsets.push_back(0);
  for (int i = 0; i < n; ++i) {
    d.labels.push_back(i % 2);
    d.dense.push_back(static_cast<float>(i));
    d.dense.push_back(static_cast<float>(-i));
    d.ids.push_back(i);
    d.id_offsets.push_back(static_cast<int64_t>(d.ids.size()));
    for (int k = 0; k < (i + 1) % 3; ++k) d.ids.push_back(1000 * i + k);
    d.id_offsets.push_back(static_cast<int64_t>(d.ids.size()));
  }
  return d;
}

// The example indices of a batch, checking that every feature of each example is the one IndexedCtr made.
std::vector<int> Indices(const Batch& b) {
  std::vector<int> out;
  EXPECT_EQ(b.num_dense, 2);
  EXPECT_EQ(b.num_sparse, 2);
  EXPECT_EQ(b.dense.size(), static_cast<size_t>(b.batch) * 2);
  EXPECT_EQ(b.labels.size(), static_cast<size_t>(b.batch));
  EXPECT_EQ(b.id_offsets.size(), static_cast<size_t>(b.batch) * 2 + 1);
  EXPECT_EQ(b.id_offsets.front(), 0);
  EXPECT_EQ(b.id_offsets.back(), static_cast<int32_t>(b.ids.size()));
  EXPECT_TRUE(b.images.empty());
  for (int e = 0; e < b.batch; ++e) {
    const int i = static_cast<int>(b.dense[2 * e]);
    out.push_back(i);
    EXPECT_EQ(b.dense[2 * e + 1], -static_cast<float>(i));
    EXPECT_EQ(b.labels[e], static_cast<float>(i % 2));
    const std::vector<int64_t> bag0(b.ids.begin() + b.id_offsets[2 * e], b.ids.begin() + b.id_offsets[2 * e + 1]);
    const std::vector<int64_t> bag1(b.ids.begin() + b.id_offsets[2 * e + 1], b.ids.begin() + b.id_offsets[2 * e + 2]);
    EXPECT_EQ(bag0, std::vector<int64_t>{i});
    std::vector<int64_t> want1;
    for (int k = 0; k < (i + 1) % 3; ++k) want1.push_back(1000 * i + k);
    EXPECT_EQ(bag1, want1) << "example " << i;
  }
  return out;
}

std::unique_ptr<BatchStream> MustCreate(const Dataset& d, const BatchStreamOptions& o) {
  absl::StatusOr<std::unique_ptr<BatchStream>> s = BatchStream::Create(d, o);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? std::move(*s) : nullptr;
}

std::vector<int> Take(BatchStream* s, int n) {
  std::vector<int> out;
  while (static_cast<int>(out.size()) < n) {
    std::vector<int> b = Indices(s->Next());
    out.insert(out.end(), b.begin(), b.end());
  }
  return out;
}

TEST(CtrBatchStreamTest, ShardsAreDisjointAndCompleteAndEpochsReshuffle) {
  const Dataset d = IndexedCtr(103);
  std::vector<int> all;
  for (int shard = 0; shard < 3; ++shard) {
    BatchStreamOptions o;
    o.batch_size = 1;
    o.num_shards = 3;
    o.shard_index = shard;
    o.seed = 11;
    auto s = MustCreate(d, o);
    ASSERT_NE(s, nullptr);
    const int size = static_cast<int>(s->shard_size());
    EXPECT_EQ(size, shard == 0 ? 35 : 34);
    const std::vector<int> epoch0 = Take(s.get(), size), epoch1 = Take(s.get(), size);
    for (int i : epoch0) EXPECT_EQ(i % 3, shard);
    EXPECT_NE(epoch0, epoch1);
    std::vector<int> a = epoch0, b = epoch1;
    std::sort(a.begin(), a.end());
    std::sort(b.begin(), b.end());
    EXPECT_EQ(a, b);
    all.insert(all.end(), epoch0.begin(), epoch0.end());
  }
  std::sort(all.begin(), all.end());
  std::vector<int> want(103);
  for (int i = 0; i < 103; ++i) want[i] = i;
  EXPECT_EQ(all, want);
}

TEST(CtrBatchStreamTest, SameOrderAsImagesOfTheSameCount) {
  // The order is a function of (seed, shard, count) alone: CTR and image data shuffle alike.
  const Dataset ctr = IndexedCtr(50);
  Dataset images;  // 1x1x1 images whose pixel is the index
  images.height = images.width = images.channels = 1;
  for (int i = 0; i < 50; ++i) {
    images.pixels.push_back(static_cast<uint8_t>(i));
    images.labels.push_back(i % 10);
  }
  BatchStreamOptions o;
  o.batch_size = 7;
  o.seed = 3;
  auto a = MustCreate(ctr, o);
  auto b = MustCreate(images, o);
  for (int k = 0; k < 20; ++k) {
    const Batch& x = a->Next();
    const Batch& y = b->Next();
    EXPECT_EQ(x.epoch, y.epoch);
    std::vector<int> from_images;
    for (float v : y.images) from_images.push_back(static_cast<int>(std::lround(v * 255)));
    EXPECT_EQ(Indices(x), from_images) << "batch " << k;
  }
}

TEST(CtrBatchStreamTest, RestoreContinuesWhereTheSavedStreamWas) {
  const Dataset d = IndexedCtr(40);
  BatchStreamOptions o;
  o.batch_size = 6;  // batches straddle epochs
  o.num_shards = 2;
  o.shard_index = 1;
  o.seed = 9;
  auto a = MustCreate(d, o);
  Take(a.get(), 6 * 5);
  const std::string state = a->SaveState();
  const std::vector<int> next = Take(a.get(), 6 * 7);
  for (int prefetch : {0, 4}) {
    o.prefetch = prefetch;
    auto b = MustCreate(d, o);
    Take(b.get(), 6 * 2);  // elsewhere first
    ASSERT_TRUE(b->Restore(state).ok());
    EXPECT_EQ(b->batches_read(), 5);
    EXPECT_EQ(Take(b.get(), 6 * 7), next) << "prefetch " << prefetch;
  }
  // Another data set size is refused.
  auto c = MustCreate(IndexedCtr(42), o);
  EXPECT_EQ(c->Restore(state).code(), absl::StatusCode::kFailedPrecondition);
}

TEST(CtrBatchStreamTest, CompactDatasetsGiveExplicitBatchOffsets) {
  absl::StatusOr<Dataset> d = ParseCriteo("1\t3\tab\tcd\n0\t\t\t1\n1\t1\t2\t3\n", "t", CriteoLayout{1, 2});
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_TRUE(d->id_offsets.empty());
  BatchStreamOptions o;
  o.batch_size = 3;
  o.shuffle = false;
  auto s = MustCreate(*d, o);
  const Batch& b = s->Next();
  EXPECT_EQ(b.batch, 3);
  EXPECT_EQ(b.labels, (std::vector<float>{1, 0, 1}));
  EXPECT_EQ(b.id_offsets, (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(b.ids, d->ids);
  EXPECT_EQ(b.dense, d->dense);
}

TEST(CtrBatchStreamTest, EvalBatchesCoverTheSetInOrder) {
  const Dataset d = IndexedCtr(23);
  const std::vector<Batch> batches = EvalBatches(d, 10, Preprocess::kScale01);
  ASSERT_EQ(batches.size(), 3u);
  EXPECT_EQ(batches[2].batch, 3);
  std::vector<int> all;
  for (const Batch& b : batches) {
    std::vector<int> i = Indices(b);
    all.insert(all.end(), i.begin(), i.end());
  }
  for (int i = 0; i < 23; ++i) EXPECT_EQ(all[i], i);
}

TEST(CtrBatchStreamTest, InconsistentDatasetsAreRefused) {
  Dataset d = IndexedCtr(10);
  d.id_offsets[5] = 100;
  EXPECT_THAT(BatchStream::Create(d, {}).status().message(), HasSubstr("inconsistent CTR Dataset: id offset"));
  d = IndexedCtr(10);
  d.dense.pop_back();
  EXPECT_EQ(BatchStream::Create(d, {}).status().code(), absl::StatusCode::kInvalidArgument);
  d = IndexedCtr(10);
  d.labels[3] = 2;
  EXPECT_THAT(CheckCtrDataset(d).message(), HasSubstr("label 2 of example 3 is not 0 or 1"));
  d = IndexedCtr(10);
  d.id_offsets.clear();  // compact: needs one id per bag
  d.ids.push_back(1);
  EXPECT_THAT(CheckCtrDataset(d).message(), HasSubstr("ids and no offsets"));
}

}  // namespace
}  // namespace dtrain::data
