// What a model reads of a data batch (worker/data/dataset.h): images as they are, or, for click-through-rate data,
// the dense features as a 1x1 image of num_dense channels and the sparse features' ids. The view points into
// the batch, which must outlive it. Used by the training loop and by dtrain_eval.
#ifndef DTRAIN_WORKER_BATCH_BATCH_VIEW_H_
#define DTRAIN_WORKER_BATCH_BATCH_VIEW_H_

#include "worker/data/dataset.h"
#include "worker/models/model.h"

namespace dtrain::worker {

inline models::HostBatch View(const data::Batch& b) {
  if (b.num_dense > 0 || b.num_sparse > 0) {
    models::HostBatch v{b.batch, 1, 1, b.num_dense, b.dense.data(), b.labels.data()};
    v.num_sparse = b.num_sparse;
    v.ids = b.ids.data();
    v.id_offsets = b.id_offsets.data();
    return v;
  }
  return models::HostBatch{b.batch, b.height, b.width, b.channels, b.images.data(), b.labels.data()};
}

}  // namespace dtrain::worker

#endif  // DTRAIN_WORKER_BATCH_BATCH_VIEW_H_
