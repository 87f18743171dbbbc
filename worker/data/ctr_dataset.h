// CTR Datasets (dataset.h) inside the data library: the consistency check, batch assembly for BatchStream and
// EvalBatches, and the TFRecord side (tf.train.Example CTR examples, example_proto.h). Internal: the public API
// is dataset.h's.
//
// Thread-safety: the functions are stateless; each writes only the objects it is given.
#ifndef DTRAIN_WORKER_DATA_CTR_DATASET_H_
#define DTRAIN_WORKER_DATA_CTR_DATASET_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/data/dataset.h"
#include "worker/data/record_io.h"

namespace dtrain::data {

// InvalidArgument("inconsistent CTR Dataset: ...") unless d's vectors have the sizes dataset.h gives for its
// count, num_dense and num_sparse, the offsets rise from 0 to ids.size() and the labels are 0 or 1.
absl::Status CheckCtrDataset(const Dataset& d);

// An empty CTR batch for d's features, with room for `batch` examples.
void StartCtrBatch(const Dataset& d, int batch, Batch* b);
// Appends example e of d (CheckCtrDataset(d) ok) to b: its label, dense features and bags.
void AppendCtrExample(const Dataset& d, int64_t e, Batch* b);

// The CTR examples of `reader`, whose first record (already read) is `first`; `path` names the file in errors.
// Every example must have the first one's number of dense and sparse features. id_offsets stays empty when
// every bag holds one id.
absl::StatusOr<Dataset> ReadCtrRecords(TfRecordReader& reader, const std::string& first, const std::string& path);
absl::Status WriteCtrRecords(const Dataset& d, const std::string& path);

}  // namespace dtrain::data

#endif  // DTRAIN_WORKER_DATA_CTR_DATASET_H_
