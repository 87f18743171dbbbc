// BatchStream over a Dataset whose examples come from an ExampleSource (example_source.h): a pool of threads
// reads the examples of the next `prefetch` batches, all of them at once (a slow file holds back one example,
// not a thread per batch), into the batches' own buffers; Next() hands out each batch when its last example is
// in. Internal to the data library: BatchStream::Create and EvalBatchSet make these.
//
// Order, sharding and positions are BatchStream's (dataset.h). Each example's augmentation draws from an RNG
// seeded by (seed, shard, stream position), so the batches do not depend on the threads. A failed read is
// logged (once per example) and, with BadExamples::kSkip, replaced by the next readable example of the same
// epoch's order (evaluation: left out).
//
// Thread-safety: as BatchStream; the pool's threads are owned and joined by the destructor.
#ifndef DTRAIN_WORKER_DATA_SOURCE_BATCH_STREAM_H_
#define DTRAIN_WORKER_DATA_SOURCE_BATCH_STREAM_H_

#include <cstdint>
#include <memory>
#include <set>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "worker/data/dataset.h"

namespace dtrain::data {

// InvalidArgument unless data.source is set with as many examples as labels, labels in [0, num_classes) and a
// positive shape.
absl::Status CheckSourceDataset(const Dataset& data);

// Preconditions: CheckSourceDataset(data); o is valid (BatchStream::Create checks it).
std::unique_ptr<BatchStream> CreateSourceBatchStream(const Dataset& data, const BatchStreamOptions& o);

// The examples of a data set whose read failed and were logged (kSkip), shared by the passes over it, so that an
// evaluation set visited again logs each bad example once. Thread-safe.
class ReportedExamples {
 public:
  // True the first time `example` is added: then log it. `count`: how many have been added, this one included.
  bool Add(int64_t example, size_t* count);

 private:
  absl::Mutex mu_;
  std::set<int64_t> examples_ ABSL_GUARDED_BY(mu_);
};

// One pass over the whole set in order, without augmentation: batches of batch_size (the last smaller, batches
// smaller still by the examples that failed with kSkip); then Next() returns an empty batch with status() OK.
// `reported` (null: the stream's own) holds the failed examples already logged by earlier passes.
std::unique_ptr<BatchStream> CreateSourceEvalStream(const Dataset& data, const EvalBatchOptions& o,
                                                    std::shared_ptr<ReportedExamples> reported = nullptr);

}  // namespace dtrain::data

#endif  // DTRAIN_WORKER_DATA_SOURCE_BATCH_STREAM_H_
