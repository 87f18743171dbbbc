// BatchStream: a worker's shard, reshuffled every epoch, cut into preprocessed batches on a prefetching
// thread. Everything random derives from (seed, shard, epoch) or (seed, shard, batch index), so the
// batches are the same whatever the thread timing or prefetch depth, and a saved batch index (with the
// numbers that define the order) is the whole state of a stream.
#include <algorithm>
#include <cstdint>
#include <deque>
#include <memory>
#include <random>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "worker/data/batch_stream_state.h"
#include "worker/data/ctr_dataset.h"
#include "worker/data/dataset.h"
#include "worker/data/preprocess.h"
#include "worker/data/source_batch_stream.h"
#include "worker/data/stream_rng.h"

namespace dtrain::data {
namespace {

// Thread-safety: Next(), SaveState() and Restore() from one consumer thread. The producer thread takes the
// index of the batch to build (next_batch_) and the generation under mu_, builds it outside the lock from state
// it alone uses (order_, order_epoch_), and queues it only if no Restore() started a new generation meanwhile.
class PrefetchingBatchStream : public BatchStream {
 public:
  PrefetchingBatchStream(const Dataset& data, const BatchStreamOptions& o, ImageShape out_shape)
      : data_(data), o_(o), in_shape_{data.height, data.width, data.channels}, out_shape_(out_shape) {
    for (int64_t i = o.shard_index; i < data.count(); i += o.num_shards) shard_.push_back(i);
    if (o_.prefetch > 0) producer_ = std::thread([this] { ProduceLoop(); });
  }

  ~PrefetchingBatchStream() override {
    if (!producer_.joinable()) return;
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    producer_.join();
  }

  const Batch& Next() override {
    if (o_.prefetch <= 0) {
      current_ = MakeBatch(consumed_++);
      return current_;
    }
    mu_.LockWhen(absl::Condition(
        +[](std::deque<Batch>* q) { return !q->empty(); }, &queue_));
    current_ = std::move(queue_.front());
    queue_.pop_front();
    mu_.Unlock();
    ++consumed_;
    return current_;
  }

  int64_t batches_read() const override { return consumed_; }

  std::string SaveState() const override { return EncodeBatchStreamState(StateAtBatch(Identity(), consumed_)); }

  absl::Status Restore(absl::string_view state) override {
    ASSIGN_OR_RETURN(BatchStreamState s, DecodeBatchStreamState(state));
    RETURN_IF_ERROR(CheckSameStream(s, Identity()));
    consumed_ = s.next_batch;
    if (o_.prefetch > 0) {
      absl::MutexLock lock(&mu_);
      queue_.clear();
      next_batch_ = s.next_batch;
      ++generation_;
    }
    return absl::OkStatus();
  }

  int64_t shard_size() const override { return static_cast<int64_t>(shard_.size()); }

 private:
  void ProduceLoop() {
    while (true) {
      int64_t k;
      uint64_t generation;
      {
        absl::MutexLock lock(&mu_);
        mu_.Await(absl::Condition(this, &PrefetchingBatchStream::ShouldProduceOrStop));
        if (stop_) return;
        k = next_batch_++;
        generation = generation_;
      }
      Batch b = MakeBatch(k);
      absl::MutexLock lock(&mu_);
      if (generation == generation_) queue_.push_back(std::move(b));  // else a Restore() moved the stream
    }
  }

  bool ShouldProduceOrStop() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stop_ || static_cast<int>(queue_.size()) < o_.prefetch;
  }

  // The numbers that define this stream's order, with a zero position.
  BatchStreamState Identity() const {
    return StreamIdentity(o_, shard_size(), static_cast<int>(o_.preprocess));
  }

  // Shard-local index of the example at stream position p (positions run across epochs).
  int64_t ExampleAt(int64_t p) {
    const int64_t s = shard_size();
    const int64_t epoch = p / s;
    if (!o_.shuffle) return shard_[p % s];
    if (epoch != order_epoch_) {
      order_.resize(s);
      for (int64_t i = 0; i < s; ++i) order_[i] = shard_[i];
      std::mt19937_64 rng = SeededRng(o_.seed, static_cast<uint64_t>(epoch), o_.shard_index, kShuffleTag);
      Shuffle(&order_, &rng);
      order_epoch_ = epoch;
    }
    return order_[p % s];
  }

  Batch MakeBatch(int64_t k) {
    Batch b;
    if (data_.kind() == DataKind::kCtr) {
      StartCtrBatch(data_, o_.batch_size, &b);
      b.epoch = k * o_.batch_size / shard_size();
      for (int i = 0; i < o_.batch_size; ++i) AppendCtrExample(data_, ExampleAt(k * o_.batch_size + i), &b);
      return b;
    }
    b.batch = o_.batch_size;
    b.height = out_shape_.height;
    b.width = out_shape_.width;
    b.channels = out_shape_.channels;
    b.images.resize(static_cast<size_t>(o_.batch_size * out_shape_.size()));
    b.labels.resize(o_.batch_size);
    const int64_t first = k * o_.batch_size;
    b.epoch = first / shard_size();
    std::mt19937_64 rng = SeededRng(o_.seed, static_cast<uint64_t>(k), o_.shard_index, kDistortTag);
    for (int i = 0; i < o_.batch_size; ++i) {
      const int64_t ex = ExampleAt(first + i);
      PreprocessImage(data_.pixels.data() + ex * data_.image_size(), in_shape_, o_.preprocess, out_shape_, &rng,
                      b.images.data() + i * out_shape_.size());
      NormalizeImage(o_.normalize, out_shape_, b.images.data() + i * out_shape_.size());
      b.labels[i] = static_cast<float>(data_.labels[ex]);
    }
    return b;
  }

  const Dataset& data_;
  const BatchStreamOptions o_;
  const ImageShape in_shape_, out_shape_;
  std::vector<int64_t> shard_;  // dataset indices of this shard, ascending

  // Producer-only state (or consumer-only when prefetch == 0).
  std::vector<int64_t> order_;  // shard_ shuffled for order_epoch_
  int64_t order_epoch_ = -1;

  absl::Mutex mu_;
  std::deque<Batch> queue_ ABSL_GUARDED_BY(mu_);  // batches next_batch_ - queue_.size(), ..., in order
  int64_t next_batch_ ABSL_GUARDED_BY(mu_) = 0;   // the producer's next batch index
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;  // incremented by Restore(): batches built before are dropped
  bool stop_ ABSL_GUARDED_BY(mu_) = false;

  // Consumer-only.
  Batch current_;
  int64_t consumed_ = 0;  // batches returned by Next() (or set by Restore)
  std::thread producer_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<BatchStream>> BatchStream::Create(const Dataset& data, const BatchStreamOptions& o) {
  if (o.batch_size <= 0) return absl::InvalidArgumentError(absl::StrCat("batch_size ", o.batch_size, " <= 0"));
  if (o.num_shards <= 0 || o.shard_index < 0 || o.shard_index >= o.num_shards) {
    return absl::InvalidArgumentError(
        absl::StrCat("shard_index ", o.shard_index, " is not in [0, num_shards=", o.num_shards, ")"));
  }
  if (data.count() < o.num_shards) {
    return absl::InvalidArgumentError(absl::StrCat("data set of ", data.count(), " examples cannot be split into ",
                                                   o.num_shards, " non-empty shards"));
  }
  if (data.kind() == DataKind::kCtr) {
    RETURN_IF_ERROR(CheckCtrDataset(data));
    return std::unique_ptr<BatchStream>(new PrefetchingBatchStream(data, o, ImageShape{}));
  }
  if (data.source != nullptr) {
    RETURN_IF_ERROR(CheckSourceDataset(data));
    RETURN_IF_ERROR(CheckNormalization(o.normalize, data.channels));
    if (o.threads < 0) return absl::InvalidArgumentError(absl::StrCat("threads ", o.threads, " < 0"));
    return CreateSourceBatchStream(data, o);
  }
  if (data.height <= 0 || data.width <= 0 || data.channels <= 0 ||
      static_cast<int64_t>(data.pixels.size()) != data.count() * data.image_size()) {
    return absl::InvalidArgumentError(absl::StrCat("inconsistent Dataset: ", data.pixels.size(), " pixel bytes for ",
                                                   data.count(), " images of ", data.height, "x", data.width, "x",
                                                   data.channels));
  }
  RETURN_IF_ERROR(CheckNormalization(o.normalize, data.channels));
  ASSIGN_OR_RETURN(ImageShape out, PreprocessedShape({data.height, data.width, data.channels}, o.preprocess,
                                                     o.crop_h, o.crop_w));
  return std::unique_ptr<BatchStream>(new PrefetchingBatchStream(data, o, out));
}

std::vector<Batch> EvalBatches(const Dataset& data, int batch_size, Preprocess preprocess, int crop_h, int crop_w,
                               const Normalization& normalize) {
  CHECK_GT(batch_size, 0) << "EvalBatches: batch_size";
  if (data.source != nullptr) {
    const absl::Status ok = CheckSourceDataset(data);
    CHECK(ok.ok()) << "EvalBatches: " << ok;
    EvalBatchOptions eo;
    eo.batch_size = batch_size;
    eo.normalize = normalize;
    std::unique_ptr<BatchStream> stream = CreateSourceEvalStream(data, eo);
    std::vector<Batch> batches;
    for (int64_t first = 0; first < data.count(); first += batch_size) {
      const Batch& b = stream->Next();
      if (b.batch > 0) batches.push_back(b);
    }
    return batches;
  }
  if (data.kind() == DataKind::kCtr) {
    const absl::Status ok = CheckCtrDataset(data);
    CHECK(ok.ok()) << "EvalBatches: " << ok;
    std::vector<Batch> batches;
    for (int64_t first = 0; first < data.count(); first += batch_size) {
      const int n = static_cast<int>(std::min<int64_t>(batch_size, data.count() - first));
      Batch& b = batches.emplace_back();
      StartCtrBatch(data, n, &b);
      for (int i = 0; i < n; ++i) AppendCtrExample(data, first + i, &b);
    }
    return batches;
  }
  const absl::Status normalization = CheckNormalization(normalize, data.channels);
  CHECK(normalization.ok()) << "EvalBatches: " << normalization;
  const ImageShape in{data.height, data.width, data.channels};
  absl::StatusOr<ImageShape> out = PreprocessedShape(in, preprocess, crop_h, crop_w);
  CHECK(out.ok()) << "EvalBatches: " << out.status();
  std::mt19937_64 rng = SeededRng(0, 0, 0, kDistortTag);  // only kCifarTrain draws; fixed for repeatability
  std::vector<Batch> batches;
  for (int64_t first = 0; first < data.count(); first += batch_size) {
    Batch b;
    b.batch = static_cast<int>(std::min<int64_t>(batch_size, data.count() - first));
    b.height = out->height;
    b.width = out->width;
    b.channels = out->channels;
    b.images.resize(static_cast<size_t>(b.batch * out->size()));
    b.labels.resize(b.batch);
    for (int i = 0; i < b.batch; ++i) {
      PreprocessImage(data.pixels.data() + (first + i) * data.image_size(), in, preprocess, *out, &rng,
                      b.images.data() + i * out->size());
      NormalizeImage(normalize, *out, b.images.data() + i * out->size());
      b.labels[i] = static_cast<float>(data.labels[first + i]);
    }
    batches.push_back(std::move(b));
  }
  return batches;
}

}  // namespace dtrain::data
