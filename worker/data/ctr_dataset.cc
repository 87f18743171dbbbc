// CTR Datasets: consistency and batches (ctr_dataset.h).
#include "worker/data/ctr_dataset.h"

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "glog/logging.h"

namespace dtrain::data {
namespace {

absl::Status Inconsistent(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("inconsistent CTR Dataset: ", what));
}

}  // namespace

absl::Status CheckCtrDataset(const Dataset& d) {
  const int64_t n = d.count();
  if (d.num_dense < 0 || d.num_sparse < 0 || d.num_dense + d.num_sparse == 0) {
    return Inconsistent(absl::StrCat(d.num_dense, " dense and ", d.num_sparse, " sparse features"));
  }
  if (static_cast<int64_t>(d.dense.size()) != n * d.num_dense) {
    return Inconsistent(absl::StrCat(d.dense.size(), " dense values for ", n, " examples of ", d.num_dense));
  }
  const int64_t bags = n * d.num_sparse;
  if (d.id_offsets.empty()) {
    if (static_cast<int64_t>(d.ids.size()) != bags) {
      return Inconsistent(absl::StrCat(d.ids.size(), " ids and no offsets for ", n, " examples of ", d.num_sparse,
                                       " sparse features (one id each)"));
    }
  } else {
    if (static_cast<int64_t>(d.id_offsets.size()) != bags + 1) {
      return Inconsistent(absl::StrCat(d.id_offsets.size(), " id offsets for ", n, " examples of ", d.num_sparse,
                                       " sparse features (want ", bags + 1, ")"));
    }
    if (d.id_offsets.front() != 0 || d.id_offsets.back() != static_cast<int64_t>(d.ids.size())) {
      return Inconsistent(absl::StrCat("id offsets run from ", d.id_offsets.front(), " to ", d.id_offsets.back(),
                                       ", not from 0 to ", d.ids.size()));
    }
    for (int64_t i = 0; i < bags; ++i) {
      if (d.id_offsets[i + 1] < d.id_offsets[i]) return Inconsistent(absl::StrCat("id offset ", i + 1, " decreases"));
    }
  }
  for (int64_t e = 0; e < n; ++e) {
    if (d.labels[e] != 0 && d.labels[e] != 1) {
      return Inconsistent(absl::StrCat("label ", d.labels[e], " of example ", e, " is not 0 or 1"));
    }
  }
  return absl::OkStatus();
}

void StartCtrBatch(const Dataset& d, int batch, Batch* b) {
  b->batch = 0;
  b->height = b->width = b->channels = 0;
  b->images.clear();
  b->num_dense = d.num_dense;
  b->num_sparse = d.num_sparse;
  b->labels.clear();
  b->labels.reserve(batch);
  b->dense.clear();
  b->dense.reserve(static_cast<size_t>(batch) * d.num_dense);
  b->ids.clear();
  b->ids.reserve(static_cast<size_t>(batch) * d.num_sparse);
  b->id_offsets.assign(1, 0);
  b->id_offsets.reserve(static_cast<size_t>(batch) * d.num_sparse + 1);
}

void AppendCtrExample(const Dataset& d, int64_t e, Batch* b) {
  b->labels.push_back(static_cast<float>(d.labels[e]));
  const float* dense = d.dense.data() + e * d.num_dense;
  b->dense.insert(b->dense.end(), dense, dense + d.num_dense);
  for (int f = 0; f < d.num_sparse; ++f) {
    const absl::Span<const int64_t> bag = d.Bag(e, f);
    b->ids.insert(b->ids.end(), bag.begin(), bag.end());
    CHECK_LE(b->ids.size(), static_cast<size_t>(std::numeric_limits<int32_t>::max()))
        << "a batch of more than 2^31 ids";
    b->id_offsets.push_back(static_cast<int32_t>(b->ids.size()));
  }
  ++b->batch;
}

}  // namespace dtrain::data
