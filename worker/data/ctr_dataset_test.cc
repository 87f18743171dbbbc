// CTR data through the pipeline: BatchStream and EvalBatches batches, the TFRecord round trip, the
// tf.train.Example CTR codec.
#include "worker/data/ctr_dataset.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/data/criteo.h"
#include "worker/data/data_test_util.h"
#include "worker/data/dataset.h"
#include "worker/data/example_proto.h"
#include "worker/data/record_io.h"

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
  // Another data set size is refused. (The stream keeps a reference to its data set, which its prefetching thread
  // reads: the data set must outlive it, not be a temporary.)
  const Dataset other = IndexedCtr(42);
  auto c = MustCreate(other, o);
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

// ---- TFRecord ----

class CtrTfRecordTest : public ::testing::Test {
 protected:
  void SetUp() override { path_ = MakeTempDir() + "/train.tfrecords"; }
  std::string path_;
};

TEST_F(CtrTfRecordTest, RoundTripWithBags) {
  const Dataset d = IndexedCtr(30);
  ASSERT_TRUE(WriteTfRecordExamples(d, path_).ok());
  absl::StatusOr<Dataset> got = ReadTfRecordExamples(path_);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->kind(), DataKind::kCtr);
  EXPECT_EQ(got->num_classes, 2);
  EXPECT_EQ(got->labels, d.labels);
  EXPECT_EQ(got->dense, d.dense);
  EXPECT_EQ(got->ids, d.ids);
  EXPECT_EQ(got->id_offsets, d.id_offsets);
  absl::StatusOr<Dataset> parsed = ParseTfRecordExamples(ReadFile(path_));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->ids, d.ids);
}

TEST_F(CtrTfRecordTest, CriteoThroughTfRecordIsTheSameDataset) {
  std::string text;
  for (int i = 0; i < 50; ++i) {
    text += absl::StrCat(i % 4 == 0 ? 1 : 0, "\t", i, "\t\t", -i, "\t", absl::Hex(i * 977), "\t\t",
                         absl::Hex(i), "\n");
  }
  absl::StatusOr<Dataset> d = ParseCriteo(text, "t", CriteoLayout{3, 3});
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_TRUE(WriteTfRecordExamples(*d, path_).ok());
  absl::StatusOr<Dataset> got = ReadTfRecordExamples(path_);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->labels, d->labels);
  EXPECT_EQ(got->dense, d->dense);
  EXPECT_EQ(got->ids, d->ids);  // int64 ids, the top bits too
  EXPECT_TRUE(got->id_offsets.empty());  // one id per bag: compact again
  EXPECT_EQ(got->num_dense, 3);
  EXPECT_EQ(got->num_sparse, 3);
}

TEST_F(CtrTfRecordTest, ExamplesMustAgreeInTheirFeatures) {
  TfRecordWriter w;
  ASSERT_TRUE(w.Open(path_).ok());
  CtrExample e;
  e.label = 1;
  e.dense = {1, 2};
  e.ids = {5};
  e.id_offsets = {0, 1};
  ASSERT_TRUE(w.Write(EncodeCtrExample(e)).ok());
  e.dense = {1, 2, 3};
  ASSERT_TRUE(w.Write(EncodeCtrExample(e)).ok());
  ASSERT_TRUE(w.Close().ok());
  absl::Status s = ReadTfRecordExamples(path_).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr(path_ + ": record 1 at byte offset "));
  EXPECT_THAT(s.message(), HasSubstr("3 dense and 1 sparse features, earlier examples have 2 and 1"));
}

// ---- the tf.train.Example CTR codec ----

std::string Bytes(std::initializer_list<int> b) {
  std::string s;
  for (int v : b) s.push_back(static_cast<char>(v));
  return s;
}

// Example{features{feature{key: `key` value: `feature`}}} for one or more (key, serialized Feature) pairs.
std::string ExampleOf(std::initializer_list<std::pair<std::string, std::string>> features) {
  std::string f;
  for (const auto& [key, feature] : features) {
    std::string entry = Bytes({0x0a, static_cast<int>(key.size())}) + key + Bytes({0x12, static_cast<int>(feature.size())}) + feature;
    f += Bytes({0x0a, static_cast<int>(entry.size())}) + entry;
  }
  return Bytes({0x0a, static_cast<int>(f.size())}) + f;
}

std::string FloatBytes(float v) {
  std::string s(4, '\0');
  std::memcpy(s.data(), &v, 4);  // little-endian machines, as the wire format
  return s;
}

TEST(CtrExampleTest, RoundTripAndKind) {
  CtrExample e;
  e.label = 1;
  e.dense = {0.5f, -2.0f, 1e30f};
  e.ids = {7, -3, (int64_t{1} << 62) + 5, 9};
  e.id_offsets = {0, 3, 3, 4};  // bags of 3, 0 and 1 ids
  const std::string bytes = EncodeCtrExample(e);
  EXPECT_TRUE(IsCtrExample(bytes));
  CtrExample got;
  got.ids = {1, 2, 3};  // reused: cleared first
  ASSERT_TRUE(DecodeCtrExample(bytes, &got).ok());
  EXPECT_EQ(got.label, 1);
  EXPECT_EQ(got.dense, e.dense);
  EXPECT_EQ(got.ids, e.ids);
  EXPECT_EQ(got.id_offsets, e.id_offsets);
  EXPECT_EQ(got.num_sparse(), 3);

  ImageExample image;
  image.label = 1;
  image.image_raw = "xy";
  EXPECT_FALSE(IsCtrExample(EncodeImageExample(image)));
  EXPECT_FALSE(IsCtrExample("\xff\xff"));
}

TEST(CtrExampleTest, FloatLabelsUnpackedListsAndAnyKeyOrder) {
  // label: float_list{1.0}; sparse_1 before sparse_0, unpacked int64s; dense: unpacked floats.
  const std::string label = Bytes({0x12, 0x05, 0x0d}) + FloatBytes(1.0f);
  const std::string sparse1 = Bytes({0x1a, 0x04, 0x08, 0x05, 0x08, 0x06});
  const std::string sparse0 = Bytes({0x1a, 0x00});  // an empty bag
  const std::string dense = Bytes({0x12, 0x0a, 0x0d}) + FloatBytes(2.5f) + Bytes({0x0d}) + FloatBytes(-1.0f);
  CtrExample e;
  absl::Status s = DecodeCtrExample(
      ExampleOf({{"sparse_1", sparse1}, {"label", label}, {"other", label}, {"sparse_0", sparse0}, {"dense", dense}}), &e);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(e.label, 1);
  EXPECT_EQ(e.dense, (std::vector<float>{2.5f, -1.0f}));
  EXPECT_EQ(e.ids, (std::vector<int64_t>{5, 6}));
  EXPECT_EQ(e.id_offsets, (std::vector<int64_t>{0, 0, 2}));
}

TEST(CtrExampleTest, Errors) {
  const std::string int_label = Bytes({0x1a, 0x03, 0x0a, 0x01, 0x01});
  const std::string bag = Bytes({0x1a, 0x03, 0x0a, 0x01, 0x07});
  CtrExample e;
  EXPECT_EQ(DecodeCtrExample(ExampleOf({{"sparse_0", bag}}), &e).message(),
            "tf.train.Example has no \"label\" feature");
  EXPECT_EQ(DecodeCtrExample(ExampleOf({{"label", int_label}, {"sparse_2", bag}, {"sparse_0", bag}}), &e).message(),
            "tf.train.Example has \"sparse_2\" but no \"sparse_1\"");
  EXPECT_EQ(DecodeCtrExample(ExampleOf({{"label", Bytes({0x1a, 0x03, 0x0a, 0x01, 0x02})}, {"sparse_0", bag}}), &e)
                .message(),
            "feature \"label\": 2 is not 0 or 1");
  EXPECT_EQ(DecodeCtrExample(ExampleOf({{"label", int_label}, {"dense", bag}}), &e).message(),
            "feature \"dense\": expected a float_list");
  EXPECT_EQ(DecodeCtrExample(ExampleOf({{"label", int_label}, {"sparse_0", Bytes({0x12, 0x00})}}), &e).message(),
            "feature \"sparse_0\": expected an int64_list");
  EXPECT_THAT(DecodeCtrExample(ExampleOf({{"label", int_label}, {"dense", Bytes({0x12, 0x03, 0x0a, 0x01, 0x00})}}), &e)
                  .message(),
              HasSubstr("packed float_list of a partial float"));
  EXPECT_THAT(DecodeCtrExample(ExampleOf({{"label", int_label}, {"sparse_99999999", bag}}), &e).message(),
              HasSubstr("more than 10000 sparse features"));
  EXPECT_EQ(DecodeCtrExample(Bytes({0x0a, 0x05, 0x01}), &e).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dtrain::data
