#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/data/batch_stream_state.h"
#include "worker/data/data_test_util.h"
#include "worker/data/dataset.h"

namespace dtrain::data {
namespace {

using namespace test_util;  // NOLINT

// n examples of 1x2x1 whose two pixels encode the example's index, so batches can be decoded back.
Dataset IndexedDataset(int n) {
  Dataset d;
  d.height = 1;
  d.width = 2;
  d.channels = 1;
  for (int i = 0; i < n; ++i) {
    d.pixels.push_back(static_cast<uint8_t>(i >> 8));
    d.pixels.push_back(static_cast<uint8_t>(i & 0xFF));
    d.labels.push_back(i % 10);
  }
  return d;
}

std::vector<int> Indices(const Batch& b) {
  std::vector<int> out;
  for (int i = 0; i < b.batch; ++i) {
    out.push_back(static_cast<int>(std::lround(b.images[2 * i] * 255)) * 256 +
                  static_cast<int>(std::lround(b.images[2 * i + 1] * 255)));
  }
  return out;
}

std::unique_ptr<BatchStream> MustCreate(const Dataset& d, const BatchStreamOptions& o) {
  absl::StatusOr<std::unique_ptr<BatchStream>> s = BatchStream::Create(d, o);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? std::move(*s) : nullptr;
}

// The next n example indices of a stream, over as many batches as needed (n a multiple of the batch).
std::vector<int> Take(BatchStream* s, int n) {
  std::vector<int> out;
  while (static_cast<int>(out.size()) < n) {
    std::vector<int> b = Indices(s->Next());
    out.insert(out.end(), b.begin(), b.end());
  }
  return out;
}

TEST(BatchStreamTest, ShardsAreDisjointAndCoverTheData) {
  const Dataset d = IndexedDataset(103);
  std::vector<int> all;
  for (int shard = 0; shard < 3; ++shard) {
    BatchStreamOptions o;
    o.batch_size = 1;
    o.num_shards = 3;
    o.shard_index = shard;
    o.seed = 11;
    auto s = MustCreate(d, o);
    ASSERT_NE(s, nullptr);
    EXPECT_EQ(s->shard_size(), shard == 0 ? 35 : 34);
    const std::vector<int> epoch = Take(s.get(), static_cast<int>(s->shard_size()));
    for (int i : epoch) EXPECT_EQ(i % 3, shard);
    all.insert(all.end(), epoch.begin(), epoch.end());
  }
  std::sort(all.begin(), all.end());
  std::vector<int> want(103);
  for (int i = 0; i < 103; ++i) want[i] = i;
  EXPECT_EQ(all, want);
}

TEST(BatchStreamTest, ReshufflesEachEpochDeterministicallyInTheSeed) {
  const Dataset d = IndexedDataset(60);
  BatchStreamOptions o;
  o.batch_size = 10;
  o.seed = 5;
  auto a = MustCreate(d, o), b = MustCreate(d, o);
  o.seed = 6;
  auto c = MustCreate(d, o);
  const std::vector<int> a0 = Take(a.get(), 60), a1 = Take(a.get(), 60);
  EXPECT_EQ(Take(b.get(), 120), [&] { auto v = a0; v.insert(v.end(), a1.begin(), a1.end()); return v; }());
  EXPECT_NE(a0, a1);
  EXPECT_NE(Take(c.get(), 60), a0);
  std::vector<int> sorted0 = a0, sorted1 = a1;
  std::sort(sorted0.begin(), sorted0.end());
  std::sort(sorted1.begin(), sorted1.end());
  EXPECT_EQ(sorted0, sorted1);  // each epoch is a permutation of the shard
  EXPECT_EQ(sorted0.front(), 0);
  EXPECT_EQ(sorted0.back(), 59);
}

TEST(BatchStreamTest, UnshuffledBatchesWrapAcrossEpochsInOrder) {
  const Dataset d = IndexedDataset(10);
  BatchStreamOptions o;
  o.batch_size = 4;
  o.shuffle = false;
  auto s = MustCreate(d, o);
  for (int k = 0; k < 8; ++k) {
    const Batch& b = s->Next();
    EXPECT_EQ(b.epoch, (4 * k) / 10) << "batch " << k;
    std::vector<int> want;
    for (int i = 0; i < 4; ++i) want.push_back((4 * k + i) % 10);
    EXPECT_EQ(Indices(b), want) << "batch " << k;
  }
}

// Synchronous data parallelism relies on this: 2 workers with batch b see, at every step, the same
// examples as 1 worker with batch 2b.
TEST(BatchStreamTest, TwoShardsOfBatchBMatchOneShardOfBatch2B) {
  const Dataset d = IndexedDataset(48);
  BatchStreamOptions o;
  o.shuffle = false;
  o.batch_size = 8;
  auto whole = MustCreate(d, o);
  o.batch_size = 4;
  o.num_shards = 2;
  auto s0 = MustCreate(d, o);
  o.shard_index = 1;
  auto s1 = MustCreate(d, o);
  for (int step = 0; step < 20; ++step) {
    std::multiset<int> both;
    for (BatchStream* s : {s0.get(), s1.get()}) {
      for (int i : Indices(s->Next())) both.insert(i);
    }
    const std::vector<int> w = Indices(whole->Next());
    EXPECT_EQ(both, std::multiset<int>(w.begin(), w.end())) << "step " << step;
  }
}

TEST(BatchStreamTest, SameBatchesWithAndWithoutPrefetch) {
  const Dataset d = MakeDataset(50, 32, 32, 3);
  BatchStreamOptions o;
  o.batch_size = 8;
  o.seed = 3;
  o.preprocess = Preprocess::kCifarTrain;
  o.prefetch = 0;
  auto sync = MustCreate(d, o);
  o.prefetch = 3;
  auto prefetched = MustCreate(d, o);
  for (int k = 0; k < 10; ++k) {
    const Batch a = sync->Next();
    const Batch& b = prefetched->Next();
    EXPECT_EQ(a.images, b.images) << "batch " << k;
    EXPECT_EQ(a.labels, b.labels) << "batch " << k;
  }
}

TEST(BatchStreamTest, DestructorDoesNotHangWhenNotDrained) {
  const Dataset d = MakeDataset(200, 32, 32, 3);
  BatchStreamOptions o;
  o.batch_size = 16;
  o.prefetch = 2;
  o.preprocess = Preprocess::kCifarTrain;
  { auto never_read = MustCreate(d, o); }
  {
    auto read_once = MustCreate(d, o);
    EXPECT_EQ(read_once->Next().batch, 16);
  }
  for (int i = 0; i < 20; ++i) {
    auto s = MustCreate(d, o);  // destroyed while the producer may be mid-batch
  }
}

TEST(BatchStreamTest, CifarTrainShapesAndStandardization) {
  const Dataset d = MakeDataset(20, 32, 32, 3);
  BatchStreamOptions o;
  o.batch_size = 10;
  o.preprocess = Preprocess::kCifarTrain;
  auto s = MustCreate(d, o);
  const Batch& b = s->Next();
  EXPECT_EQ(b.batch, 10);
  EXPECT_EQ(b.height, 24);
  EXPECT_EQ(b.width, 24);
  EXPECT_EQ(b.channels, 3);
  ASSERT_EQ(b.images.size(), 10u * 24 * 24 * 3);
  ASSERT_EQ(b.labels.size(), 10u);
  const int n = 24 * 24 * 3;
  for (int i = 0; i < b.batch; ++i) {
    double sum = 0, sq = 0;
    for (int j = 0; j < n; ++j) {
      const double v = b.images[i * n + j];
      sum += v;
      sq += v * v;
    }
    const double mean = sum / n;
    EXPECT_NEAR(mean, 0.0, 1e-4);
    EXPECT_NEAR(std::sqrt(sq / n - mean * mean), 1.0, 1e-3);
  }
}

TEST(BatchStreamTest, ConstantImageStandardizesToZeroWithoutNan) {
  Dataset d = MakeDataset(2, 32, 32, 3);
  std::fill(d.pixels.begin(), d.pixels.end(), 77);
  const std::vector<Batch> b = EvalBatches(d, 2, Preprocess::kCifarEval);
  for (float v : b[0].images) EXPECT_EQ(v, 0.0f);
}

// Standardizes like tf.image.per_image_standardization (reference for the checks below).
std::vector<float> Standardized(std::vector<float> x) {
  double sum = 0, sq = 0;
  for (float v : x) {
    sum += v;
    sq += static_cast<double>(v) * v;
  }
  const double mean = sum / x.size(), sd = std::sqrt(std::max(0.0, sq / x.size() - mean * mean));
  const double scale = 1.0 / std::max(sd, 1.0 / std::sqrt(static_cast<double>(x.size())));
  for (float& v : x) v = static_cast<float>((v - mean) * scale);
  return x;
}

std::vector<float> Window(const Dataset& d, int image, int top, int left, int h, int w, bool flip) {
  std::vector<float> out;
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      const int sx = left + (flip ? w - 1 - x : x);
      out.push_back(d.pixels[image * d.image_size() + (top + y) * d.width + sx]);
    }
  }
  return out;
}

bool Near(const float* a, const std::vector<float>& b) {
  for (size_t i = 0; i < b.size(); ++i) {
    if (std::abs(a[i] - b[i]) > 1e-3f) return false;
  }
  return true;
}

// On one channel, brightness and contrast are undone by standardization, so each distorted image must
// equal the standardized crop/flip of some window of its source image.
TEST(BatchStreamTest, CifarTrainCropsAndFlipsWindowsDeterministically) {
  const Dataset d = MakeDataset(40, 12, 10, 1);
  BatchStreamOptions o;
  o.batch_size = 40;
  o.shuffle = false;
  o.preprocess = Preprocess::kCifarTrain;
  o.crop_h = 8;
  o.crop_w = 6;
  o.seed = 21;
  auto s = MustCreate(d, o);
  const Batch b = s->Next();
  std::set<int> tops, lefts;
  int flips = 0;
  for (int i = 0; i < 40; ++i) {
    int matches = 0;
    for (int top = 0; top <= 4; ++top) {
      for (int left = 0; left <= 4; ++left) {
        for (bool flip : {false, true}) {
          if (Near(b.images.data() + i * 48, Standardized(Window(d, i, top, left, 8, 6, flip)))) {
            ++matches;
            tops.insert(top);
            lefts.insert(left);
            flips += flip;
          }
        }
      }
    }
    EXPECT_EQ(matches, 1) << "image " << i;
  }
  EXPECT_GT(tops.size(), 2u);  // the crop position varies ...
  EXPECT_GT(lefts.size(), 2u);
  EXPECT_GT(flips, 5);  // ... and so does the flip
  EXPECT_LT(flips, 35);

  auto again = MustCreate(d, o);
  EXPECT_EQ(again->Next().images, b.images);
  o.seed = 22;
  auto other = MustCreate(d, o);
  EXPECT_NE(other->Next().images, b.images);
}

TEST(BatchStreamTest, EvalBatchesCoverTheSetInOrder) {
  const Dataset d = MakeDataset(25, 12, 10, 1);
  const std::vector<Batch> scaled = EvalBatches(d, 10, Preprocess::kScale01);
  ASSERT_EQ(scaled.size(), 3u);
  EXPECT_EQ(scaled[2].batch, 5);
  EXPECT_EQ(scaled[2].labels.size(), 5u);
  EXPECT_EQ(scaled[1].labels[3], static_cast<float>(d.labels[13]));
  EXPECT_FLOAT_EQ(scaled[2].images[4 * 120 + 17], d.pixels[24 * 120 + 17] / 255.0f);

  const std::vector<Batch> central = EvalBatches(d, 10, Preprocess::kCifarEval, 8, 6);
  ASSERT_EQ(central.size(), 3u);
  EXPECT_EQ(central[0].height, 8);
  EXPECT_EQ(central[0].width, 6);
  EXPECT_TRUE(Near(central[2].images.data() + 3 * 48, Standardized(Window(d, 23, 2, 2, 8, 6, false))));
}

// --input_mean/--input_std: per channel, after scaling to [0, 1], the same in training and evaluation.
TEST(BatchStreamTest, NormalizesEachChannelInTrainingAndEvaluation) {
  const Dataset d = MakeDataset(6, 4, 5, 3);
  absl::StatusOr<Normalization> n = ParseNormalization("0.5,0.25,0", "0.5, 2,4");
  ASSERT_TRUE(n.ok()) << n.status();
  BatchStreamOptions o;
  o.batch_size = 6;
  o.shuffle = false;
  o.normalize = *n;
  auto stream = BatchStream::Create(d, o);
  ASSERT_TRUE(stream.ok()) << stream.status();
  const Batch& b = (*stream)->Next();
  const std::vector<Batch> eval = EvalBatches(d, 6, Preprocess::kScale01, 24, 24, *n);
  const float mean[3] = {0.5f, 0.25f, 0.0f}, inv[3] = {2.0f, 0.5f, 0.25f};
  for (int64_t i = 0; i < 6 * 60; ++i) {
    const int ch = static_cast<int>(i % 3);
    const float want = (d.pixels[i] * (1.0f / 255.0f) - mean[ch]) * inv[ch];
    ASSERT_FLOAT_EQ(b.images[i], want) << i;
    ASSERT_FLOAT_EQ(eval[0].images[i], want) << i;
  }
  // One value for every channel.
  n = ParseNormalization("0.5", "");
  ASSERT_TRUE(n.ok());
  EXPECT_FLOAT_EQ(EvalBatches(d, 6, Preprocess::kScale01, 24, 24, *n)[0].images[4], d.pixels[4] / 255.0f - 0.5f);
}

TEST(BatchStreamTest, NormalizationErrorsNameTheFlag) {
  EXPECT_THAT(ParseNormalization("0.5,x", "").status().message(), ::testing::HasSubstr("--input_mean: 'x'"));
  EXPECT_THAT(ParseNormalization("", "0.5,0").status().message(), ::testing::HasSubstr("--input_std: 0 is not"));
  EXPECT_THAT(ParseNormalization("1,2", "1,2,3").status().message(), ::testing::HasSubstr("2 values"));
  const Dataset d = MakeDataset(4, 4, 4, 1);
  BatchStreamOptions o;
  o.normalize = *ParseNormalization("0.1,0.2,0.3", "");
  absl::Status s = BatchStream::Create(d, o).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), ::testing::HasSubstr("--input_mean has 3 values but the images have 1 channel(s)"));
}

TEST(BatchStreamTest, CreateRejectsBadOptions) {
  const Dataset d = MakeDataset(4, 32, 32, 3);
  BatchStreamOptions o;
  o.batch_size = 0;
  EXPECT_EQ(BatchStream::Create(d, o).status().code(), absl::StatusCode::kInvalidArgument);
  o = {};
  o.shard_index = 2;
  o.num_shards = 2;
  EXPECT_EQ(BatchStream::Create(d, o).status().code(), absl::StatusCode::kInvalidArgument);
  o = {};
  o.num_shards = 5;
  EXPECT_EQ(BatchStream::Create(d, o).status().code(), absl::StatusCode::kInvalidArgument);
  o = {};
  o.preprocess = Preprocess::kCifarEval;
  o.crop_h = 33;
  absl::Status s = BatchStream::Create(d, o).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), ::testing::HasSubstr("33x24"));
}

// ---- Saved positions (SaveState / Restore) ----

void ExpectSameBatch(const Batch& a, const Batch& b, const std::string& where) {
  EXPECT_EQ(a.images, b.images) << where;
  EXPECT_EQ(a.labels, b.labels) << where;
  EXPECT_EQ(a.epoch, b.epoch) << where;
}

// A stream restored from a saved position, in a new stream or the same one, returns exactly the batches the
// original returns next: across epoch boundaries, with shuffling and distortions, on every shard, with and
// without the prefetch thread.
TEST(BatchStreamStateTest, RestoredStreamContinuesWithTheSameBatches) {
  const Dataset d = MakeDataset(101, 32, 32, 3, /*seed=*/4);
  for (int prefetch : {0, 3}) {
    for (int shard = 0; shard < 3; ++shard) {
      BatchStreamOptions o;
      o.batch_size = 7;  // shard of 33 or 34 examples: batches straddle the epochs
      o.num_shards = 3;
      o.shard_index = shard;
      o.seed = 29;
      o.preprocess = Preprocess::kCifarTrain;
      o.prefetch = prefetch;
      auto original = MustCreate(d, o);
      ASSERT_NE(original, nullptr);
      std::vector<std::string> states;
      std::vector<Batch> batches;
      for (int k = 0; k < 14; ++k) {  // about 3 epochs
        states.push_back(original->SaveState());
        batches.push_back(original->Next());
      }
      for (int k : {0, 4, 5, 9, 13}) {
        const std::string where = absl::StrCat("prefetch ", prefetch, " shard ", shard, " saved before batch ", k);
        auto resumed = MustCreate(d, o);
        ASSERT_NE(resumed, nullptr);
        ASSERT_TRUE(resumed->Restore(states[k]).ok()) << where;
        EXPECT_EQ(resumed->batches_read(), k) << where;
        for (int j = k; j < 14; ++j) ExpectSameBatch(resumed->Next(), batches[j], absl::StrCat(where, ", batch ", j));
        EXPECT_EQ(resumed->SaveState(), original->SaveState()) << where;
      }
      // The same stream, moved back while its producer has batches queued ahead.
      ASSERT_TRUE(original->Restore(states[3]).ok());
      for (int j = 3; j < 8; ++j) ExpectSameBatch(original->Next(), batches[j], absl::StrCat("back to 3, ", j));
      ASSERT_TRUE(original->Restore(states[12]).ok());  // and forward
      ExpectSameBatch(original->Next(), batches[12], "forward to 12");
    }
  }
}

TEST(BatchStreamStateTest, PositionIsEpochAndOffset) {
  const Dataset d = IndexedDataset(10);
  BatchStreamOptions o;
  o.batch_size = 4;
  o.seed = 8;
  auto s = MustCreate(d, o);
  ASSERT_NE(s, nullptr);
  for (int i = 0; i < 3; ++i) s->Next();  // 12 examples: epoch 1, offset 2
  absl::StatusOr<BatchStreamState> state = DecodeBatchStreamState(s->SaveState());
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_EQ(state->epoch, 1);
  EXPECT_EQ(state->offset, 2);
  EXPECT_EQ(state->next_batch, 3);
  EXPECT_EQ(state->seed, 8u);
  EXPECT_EQ(state->shard_size, 10);
  EXPECT_EQ(s->SaveState().size(), 74u);
  EXPECT_EQ(s->SaveState().substr(0, 8), "DTRNBPOS");
}

TEST(BatchStreamStateTest, BadStatesAreRejectedAndChangeNothing) {
  const Dataset d = IndexedDataset(30);
  BatchStreamOptions o;
  o.batch_size = 4;
  o.seed = 5;
  o.prefetch = 2;
  auto s = MustCreate(d, o);
  ASSERT_NE(s, nullptr);
  s->Next();
  const std::string good = s->SaveState();
  s->Next();
  const std::string here = s->SaveState();

  for (size_t n = 0; n < good.size(); ++n) {
    const absl::Status st = s->Restore(good.substr(0, n));
    EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << n << ": " << st;
  }
  for (size_t i = 0; i < good.size(); ++i) {
    std::string bad = good;
    bad[i] ^= 0x04;
    const absl::Status st = s->Restore(bad);
    ASSERT_FALSE(st.ok()) << "accepted a state with byte " << i << " flipped";
    EXPECT_EQ(st.code(), i >= 8 && i < 12 ? absl::StatusCode::kFailedPrecondition : absl::StatusCode::kDataLoss)
        << i << ": " << st;
    EXPECT_TRUE(absl::StartsWith(st.message(), "input position: ")) << st;
  }
  EXPECT_EQ(s->Restore(good + "x").code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(s->Restore("").code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(s->SaveState(), here);  // nothing changed
  auto reference = MustCreate(d, o);  // where the stream must still be: at its third batch
  reference->Next();
  reference->Next();
  EXPECT_EQ(Indices(s->Next()), Indices(reference->Next()));

  // Another stream's position: refused, naming what differs.
  for (auto change : std::vector<std::function<void(BatchStreamOptions*)>>{
           [](BatchStreamOptions* x) { x->seed = 6; }, [](BatchStreamOptions* x) { x->batch_size = 5; },
           [](BatchStreamOptions* x) { x->num_shards = 2; }, [](BatchStreamOptions* x) { x->shuffle = false; }}) {
    BatchStreamOptions other = o;
    change(&other);
    auto t = MustCreate(d, other);
    ASSERT_NE(t, nullptr);
    const absl::Status st = t->Restore(good);
    EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
    EXPECT_TRUE(absl::StrContains(st.message(), "saved by another input stream")) << st;
    EXPECT_TRUE(absl::StrContains(st.message(), "start the input afresh")) << st;
  }
  BatchStreamOptions other = o;
  other.seed = 6;
  EXPECT_TRUE(absl::StrContains(MustCreate(d, other)->Restore(good).message(), "seed 5 (this stream: 6)"));
  // The same options over a data set of another size.
  EXPECT_TRUE(absl::StrContains(MustCreate(IndexedDataset(31), o)->Restore(good).message(),
                                "shard size 30 (this stream: 31)"));
}

// A state whose fields disagree with each other (valid checksum) is refused too.
TEST(BatchStreamStateTest, InconsistentPositionIsDataLoss) {
  BatchStreamState s;
  s.shard_size = 10;
  s.batch_size = 4;
  s.epoch = 1;
  s.offset = 2;
  s.next_batch = 3;
  EXPECT_TRUE(DecodeBatchStreamState(EncodeBatchStreamState(s)).ok());
  s.offset = 3;
  absl::Status st = DecodeBatchStreamState(EncodeBatchStreamState(s)).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(absl::StrContains(st.message(), "inconsistent position")) << st;
  s.offset = 12;
  EXPECT_EQ(DecodeBatchStreamState(EncodeBatchStreamState(s)).status().code(), absl::StatusCode::kDataLoss);
  s.offset = 2;
  s.next_batch = std::numeric_limits<int64_t>::max();  // * batch_size overflows
  EXPECT_EQ(DecodeBatchStreamState(EncodeBatchStreamState(s)).status().code(), absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace dtrain::data
