// CTR Datasets (dataset.h) inside the data library: the consistency check and batch assembly for BatchStream
// and EvalBatches. Internal: the public API is dataset.h's.
//
// Thread-safety: the functions are stateless; each writes only the objects it is given.
#ifndef DTRAIN_WORKER_DATA_CTR_DATASET_H_
#define DTRAIN_WORKER_DATA_CTR_DATASET_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/data/dataset.h"

namespace dtrain::data {

// InvalidArgument("inconsistent CTR Dataset: ...") unless d's vectors have the sizes dataset.h gives for its
// count, num_dense and num_sparse, the offsets rise from 0 to ids.size() and the labels are 0 or 1.
absl::Status CheckCtrDataset(const Dataset& d);

// An empty CTR batch for d's features, with room for `batch` examples.
void StartCtrBatch(const Dataset& d, int batch, Batch* b);
// Appends example e of d (CheckCtrDataset(d) ok) to b: its label, dense features and bags.
void AppendCtrExample(const Dataset& d, int64_t e, Batch* b);

}  // namespace dtrain::data

#endif  // DTRAIN_WORKER_DATA_CTR_DATASET_H_
