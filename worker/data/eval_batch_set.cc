// EvalBatchSet (dataset.h): an in-memory data set's evaluation batches made once; a source's read per visit.
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/data/ctr_dataset.h"
#include "worker/data/dataset.h"
#include "worker/data/preprocess.h"
#include "worker/data/source_batch_stream.h"

namespace dtrain::data {
namespace {

class InMemoryEvalBatches : public EvalBatchSet {
 public:
  explicit InMemoryEvalBatches(std::vector<Batch> batches) : batches_(std::move(batches)) {}
  absl::Status ForEach(const std::function<absl::Status(const Batch&)>& fn) const override {
    for (const Batch& b : batches_) RETURN_IF_ERROR(fn(b));
    return absl::OkStatus();
  }

 private:
  const std::vector<Batch> batches_;
};

class SourceEvalBatches : public EvalBatchSet {
 public:
  SourceEvalBatches(const Dataset& data, const EvalBatchOptions& o) : data_(data), o_(o) {}
  absl::Status ForEach(const std::function<absl::Status(const Batch&)>& fn) const override {
    std::unique_ptr<BatchStream> stream = CreateSourceEvalStream(data_, o_, reported_);
    while (true) {
      const Batch& b = stream->Next();
      if (b.batch == 0) {
        RETURN_IF_ERROR(stream->status());
        if (stream->batches_read() * static_cast<int64_t>(o_.batch_size) >= data_.count()) return absl::OkStatus();
        continue;  // every example of this batch failed to read (kSkip): the next one
      }
      RETURN_IF_ERROR(fn(b));
    }
  }

 private:
  const Dataset& data_;
  const EvalBatchOptions o_;
  // A bad example is logged at the first visit only (the chief evaluates many times; dtrain_eval twice with
  // --logits_out).
  const std::shared_ptr<ReportedExamples> reported_ = std::make_shared<ReportedExamples>();
};

}  // namespace

absl::StatusOr<std::unique_ptr<EvalBatchSet>> EvalBatchSet::Create(const Dataset& data, const EvalBatchOptions& o) {
  if (o.batch_size <= 0) return absl::InvalidArgumentError(absl::StrCat("batch_size ", o.batch_size, " <= 0"));
  if (data.source != nullptr) {
    RETURN_IF_ERROR(CheckSourceDataset(data));
    RETURN_IF_ERROR(CheckNormalization(o.normalize, data.channels));
    return std::unique_ptr<EvalBatchSet>(new SourceEvalBatches(data, o));
  }
  if (data.kind() == DataKind::kCtr) {
    RETURN_IF_ERROR(CheckCtrDataset(data));
  } else {
    RETURN_IF_ERROR(CheckNormalization(o.normalize, data.channels));
    RETURN_IF_ERROR(PreprocessedShape({data.height, data.width, data.channels}, o.preprocess, o.crop_h, o.crop_w)
                        .status());
  }
  return std::unique_ptr<EvalBatchSet>(
      new InMemoryEvalBatches(EvalBatches(data, o.batch_size, o.preprocess, o.crop_h, o.crop_w, o.normalize)));
}

absl::StatusOr<BadExamples> ParseBadExamples(absl::string_view name) {
  if (name == "skip") return BadExamples::kSkip;
  if (name == "fail") return BadExamples::kFail;
  return absl::InvalidArgumentError(absl::StrCat("unknown bad-image policy \"", name, "\"; expected skip or fail"));
}

absl::StatusOr<ArrayLayout> ParseArrayLayout(absl::string_view name) {
  if (name == "auto") return ArrayLayout::kAuto;
  if (name == "nhwc") return ArrayLayout::kNhwc;
  if (name == "nchw") return ArrayLayout::kNchw;
  return absl::InvalidArgumentError(absl::StrCat("unknown array layout \"", name, "\"; expected auto, nhwc or nchw"));
}

}  // namespace dtrain::data
