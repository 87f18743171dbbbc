#include "worker/data/source_batch_stream.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "worker/data/batch_stream_state.h"
#include "worker/data/example_source.h"
#include "worker/data/preprocess.h"
#include "worker/data/stream_rng.h"

namespace dtrain::data {
namespace {

// BatchStreamState::preprocess of these streams: apart from Preprocess's values, so that a position saved by an
// in-memory stream does not restore into a source's (or one with augmentation into one without).
constexpr int kSourceStreamCode = 0x40;

struct Config {
  int batch_size = 100;
  int shard_index = 0, num_shards = 1;
  uint64_t seed = 1;
  bool shuffle = true;
  bool augment = true;
  bool eval_pass = false;  // one pass in order, the last batch partial, failed examples left out
  int prefetch = 4;
  int threads = 0;
  BadExamples bad_examples = BadExamples::kSkip;
  Normalization normalize;
  std::shared_ptr<ReportedExamples> reported;  // null: the stream's own
};

// Thread-safety: Next(), SaveState() and Restore() from one consumer thread; the pool threads take work under
// mu_ and write each example into its batch's buffers outside the lock (a batch's buffers stay put while any of
// its examples is being read: a slot is reused only after the consumer took its batch, which needs every example
// in). Restore() pauses the pool and waits for the reads in flight before it moves the stream.
class SourceBatchStream : public BatchStream {
 public:
  SourceBatchStream(const Dataset& data, const Config& c)
      : data_(data),
        c_(c),
        shape_{data.height, data.width, data.channels},
        depth_(std::max(2, c.prefetch)),
        slots_(depth_) {
    if (c_.eval_pass) {
      for (int64_t i = 0; i < data.count(); ++i) shard_.push_back(i);
      num_batches_ = (data.count() + c_.batch_size - 1) / c_.batch_size;
    } else {
      for (int64_t i = c_.shard_index; i < data.count(); i += c_.num_shards) shard_.push_back(i);
    }
    int threads = c_.threads > 0 ? c_.threads : static_cast<int>(std::thread::hardware_concurrency());
    threads = std::max(1, threads);
    for (int t = 0; t < threads; ++t) pool_.emplace_back([this] { WorkLoop(); });
  }

  ~SourceBatchStream() override {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    for (std::thread& t : pool_) t.join();
  }

  const Batch& Next() override {
    if (!failed_.ok() || (c_.eval_pass && consumed_ >= num_batches_)) return Empty();
    Slot* slot;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &SourceBatchStream::NextReady));
      slot = &slots_[consumed_ % depth_];
      if (!slot->error.ok()) {
        failed_ = slot->error;
        return Empty();
      }
      std::swap(current_, slot->batch);
      std::swap(current_ok_, slot->ok);
      slot->index = -1;
      ++consumer_next_;
    }
    ++consumed_;
    if (c_.eval_pass) Compact(&current_);
    return current_;
  }

  absl::Status status() const override { return failed_; }
  int64_t batches_read() const override { return consumed_; }
  int64_t shard_size() const override { return static_cast<int64_t>(shard_.size()); }

  std::string SaveState() const override { return EncodeBatchStreamState(StateAtBatch(Identity(), consumed_)); }

  absl::Status Restore(absl::string_view state) override {
    ASSIGN_OR_RETURN(BatchStreamState s, DecodeBatchStreamState(state));
    RETURN_IF_ERROR(CheckSameStream(s, Identity()));
    {
      absl::MutexLock lock(&mu_);
      paused_ = true;
      ++generation_;
      mu_.Await(absl::Condition(
          +[](int* in_flight) { return *in_flight == 0; }, &in_flight_));
      for (Slot& slot : slots_) {
        slot.index = -1;
        slot.error = absl::OkStatus();
      }
      work_batch_ = consumer_next_ = s.next_batch;
      work_item_ = 0;
      paused_ = false;
    }
    consumed_ = s.next_batch;
    failed_ = absl::OkStatus();
    return absl::OkStatus();
  }

 private:
  struct Slot {
    Batch batch;
    std::vector<char> ok;  // eval: whether each example was read (kSkip leaves the others out)
    int64_t index = -1;    // the batch this slot holds (-1: none)
    int remaining = 0;     // its examples not read yet
    absl::Status error;
    int error_item = 0;  // the position in the batch of the example `error` is about
  };

  const Batch& Empty() {
    current_ = Batch();
    return current_;
  }

  BatchStreamState Identity() const {
    return StreamIdentity(c_, shard_size(), kSourceStreamCode | (c_.augment ? 1 : 0));
  }

  bool NextReady() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const Slot& s = slots_[consumer_next_ % depth_];
    return s.index == consumer_next_ && s.remaining == 0;
  }

  bool HasWorkOrStop() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (stop_) return true;
    if (paused_ || work_batch_ >= consumer_next_ + depth_) return false;
    return !c_.eval_pass || work_batch_ < num_batches_;
  }

  // Examples in batch k.
  int BatchLength(int64_t k) const {
    if (!c_.eval_pass) return c_.batch_size;
    return static_cast<int>(std::min<int64_t>(c_.batch_size, data_.count() - k * c_.batch_size));
  }

  void InitSlot(Slot* slot, int64_t k) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const int n = BatchLength(k);
    Batch& b = slot->batch;
    b.batch = n;
    b.height = shape_.height;
    b.width = shape_.width;
    b.channels = shape_.channels;
    b.images.resize(static_cast<size_t>(n * shape_.size()));
    b.labels.resize(n);
    b.epoch = c_.eval_pass ? 0 : k * c_.batch_size / shard_size();
    slot->ok.assign(n, 1);
    slot->index = k;
    slot->remaining = n;
    slot->error = absl::OkStatus();
  }

  void WorkLoop() {
    while (true) {
      int64_t k;
      int i;
      uint64_t generation;
      Slot* slot;
      {
        absl::MutexLock lock(&mu_);
        mu_.Await(absl::Condition(this, &SourceBatchStream::HasWorkOrStop));
        if (stop_) return;
        k = work_batch_;
        i = work_item_;
        slot = &slots_[k % depth_];
        if (i == 0) InitSlot(slot, k);
        if (++work_item_ == slot->batch.batch) {
          ++work_batch_;
          work_item_ = 0;
        }
        generation = generation_;
        ++in_flight_;
      }
      const absl::Status s = ReadInto(k, i, slot);
      absl::MutexLock lock(&mu_);
      --in_flight_;
      if (generation != generation_) continue;  // a Restore() moved the stream meanwhile
      // The error of the batch's first bad example in stream order, whichever thread met it first.
      if (!s.ok() && (slot->error.ok() || i < slot->error_item)) {
        slot->error = s;
        slot->error_item = i;
      }
      --slot->remaining;
    }
  }

  // The epoch's order of the shard (dataset indices), made once per epoch and shared by the pool.
  std::shared_ptr<const std::vector<int64_t>> Order(int64_t epoch) {
    absl::MutexLock lock(&order_mu_);
    auto it = orders_.find(epoch);
    if (it != orders_.end()) return it->second;
    auto order = std::make_shared<std::vector<int64_t>>(shard_);
    std::mt19937_64 rng = SeededRng(c_.seed, static_cast<uint64_t>(epoch), c_.shard_index, kShuffleTag);
    Shuffle(order.get(), &rng);
    orders_[epoch] = order;
    while (orders_.size() > 4) orders_.erase(orders_.begin());  // the pool works on at most two epochs at once
    return order;
  }

  // Reads example i of batch k into the slot's buffers; a failure falls back as the options say.
  absl::Status ReadInto(int64_t k, int i, Slot* slot) {
    float* out = slot->batch.images.data() + i * shape_.size();
    const int64_t p = k * c_.batch_size + i;  // stream position
    const int64_t s = shard_size();
    std::shared_ptr<const std::vector<int64_t>> order;
    if (!c_.eval_pass && c_.shuffle) order = Order(p / s);
    auto example_at = [&](int64_t offset) { return order ? (*order)[offset] : shard_[offset]; };
    const int64_t first = c_.eval_pass ? p : p % s;
    // kSkip: the next examples of the epoch's order stand in, in turn (evaluation: none).
    const int64_t tries = c_.eval_pass || c_.bad_examples == BadExamples::kFail ? 1 : s;
    absl::Status first_error;
    for (int64_t t = 0; t < tries; ++t) {
      const int64_t ex = example_at((first + t) % s);
      std::mt19937_64 rng = SeededRng(c_.seed, static_cast<uint64_t>(p), c_.shard_index, kAugmentTag);
      absl::Status read = data_.source->Read(ex, c_.augment && !c_.eval_pass, &rng, out);
      if (read.ok()) {
        NormalizeImage(c_.normalize, shape_, out);
        slot->batch.labels[i] = static_cast<float>(data_.labels[ex]);
        return absl::OkStatus();
      }
      Report(ex, read);
      if (first_error.ok()) first_error = read;
    }
    if (c_.bad_examples == BadExamples::kFail) return first_error;
    if (c_.eval_pass) {
      slot->ok[i] = 0;
      slot->batch.labels[i] = 0;
      return absl::OkStatus();
    }
    return absl::FailedPreconditionError(absl::StrCat("no example of this worker's ", s, " could be read (",
                                                      first_error.message(), ")"));
  }

  // Logs a failed read once per example (once over the passes that share c_.reported).
  void Report(int64_t ex, const absl::Status& s) {
    size_t count = 0;
    if (!reported_->Add(ex, &count)) return;
    LOG(WARNING) << (c_.bad_examples == BadExamples::kSkip ? "skipping " : "") << "an example that cannot be read: "
                 << s.message() << " (" << count << " so far"
                 << (c_.bad_examples == BadExamples::kSkip ? "; --bad_images=fail stops instead)" : ")");
  }

  // Evaluation: drops the examples that failed (kSkip).
  void Compact(Batch* b) {
    int kept = 0;
    const int64_t size = shape_.size();
    for (int i = 0; i < b->batch; ++i) {
      if (!current_ok_[i]) continue;
      if (kept != i) {
        std::copy_n(b->images.data() + i * size, size, b->images.data() + kept * size);
        b->labels[kept] = b->labels[i];
      }
      ++kept;
    }
    b->batch = kept;
    b->images.resize(static_cast<size_t>(kept * size));
    b->labels.resize(kept);
  }

  const Dataset& data_;
  const Config c_;
  const ImageShape shape_;
  const int depth_;
  std::vector<int64_t> shard_;
  int64_t num_batches_ = 0;  // eval_pass

  absl::Mutex order_mu_;
  std::map<int64_t, std::shared_ptr<const std::vector<int64_t>>> orders_ ABSL_GUARDED_BY(order_mu_);
  const std::shared_ptr<ReportedExamples> reported_ =
      c_.reported != nullptr ? c_.reported : std::make_shared<ReportedExamples>();

  absl::Mutex mu_;
  std::vector<Slot> slots_ ABSL_GUARDED_BY(mu_);  // batch k in slots_[k % depth_]
  int64_t work_batch_ ABSL_GUARDED_BY(mu_) = 0;   // the next example to read: example work_item_ of work_batch_
  int work_item_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t consumer_next_ ABSL_GUARDED_BY(mu_) = 0;  // the batch Next() waits for
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  bool paused_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;

  // Consumer-only.
  Batch current_;
  std::vector<char> current_ok_;
  int64_t consumed_ = 0;
  absl::Status failed_;
  std::vector<std::thread> pool_;
};

}  // namespace

absl::Status CheckSourceDataset(const Dataset& data) {
  if (data.source == nullptr) return absl::InvalidArgumentError("data set has no example source");
  if (data.source->size() != data.count()) {
    return absl::InvalidArgumentError(absl::StrCat("inconsistent Dataset: a source of ", data.source->size(),
                                                   " examples with ", data.count(), " labels"));
  }
  if (data.height <= 0 || data.width <= 0 || data.channels <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("inconsistent Dataset: examples of ", data.height, "x", data.width,
                                                   "x", data.channels));
  }
  for (int64_t i = 0; i < data.count(); ++i) {
    if (data.labels[i] < 0 || data.labels[i] >= data.num_classes) {
      return absl::InvalidArgumentError(absl::StrCat(data.source->Name(i), ": label ", data.labels[i],
                                                     " is not in [0, ", data.num_classes, ")"));
    }
  }
  return absl::OkStatus();
}

std::unique_ptr<BatchStream> CreateSourceBatchStream(const Dataset& data, const BatchStreamOptions& o) {
  Config c;
  c.batch_size = o.batch_size;
  c.shard_index = o.shard_index;
  c.num_shards = o.num_shards;
  c.seed = o.seed;
  c.shuffle = o.shuffle;
  c.augment = o.augment;
  c.prefetch = o.prefetch;
  c.threads = o.threads;
  c.bad_examples = o.bad_examples;
  c.normalize = o.normalize;
  return std::make_unique<SourceBatchStream>(data, c);
}

bool ReportedExamples::Add(int64_t example, size_t* count) {
  absl::MutexLock lock(&mu_);
  const bool added = examples_.insert(example).second;
  *count = examples_.size();
  return added;
}

std::unique_ptr<BatchStream> CreateSourceEvalStream(const Dataset& data, const EvalBatchOptions& o,
                                                    std::shared_ptr<ReportedExamples> reported) {
  Config c;
  c.reported = std::move(reported);
  c.batch_size = o.batch_size;
  c.shuffle = false;
  c.augment = false;
  c.eval_pass = true;
  c.threads = o.threads;
  c.bad_examples = o.bad_examples;
  c.normalize = o.normalize;
  return std::make_unique<SourceBatchStream>(data, c);
}

}  // namespace dtrain::data
