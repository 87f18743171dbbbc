// A model's embedding table (models::TableInfo) as the ps tasks describe it (ps::SparseTableSpec): what the chief
// registers with the ps, and what dtrain_eval matches a checkpoint's tables against. Thread-compatible.
#ifndef DTRAIN_WORKER_BATCH_TABLE_SPEC_H_
#define DTRAIN_WORKER_BATCH_TABLE_SPEC_H_

#include <cstdint>

#include "ps/api/ps_types.h"
#include "worker/models/graph.h"

namespace dtrain::worker {

// Table number `index` of the model, its rows initialized from `seed` (unless the model gives them).
inline ps::SparseTableSpec TableSpecOf(const models::TableInfo& t, uint32_t index, uint64_t seed) {
  ps::SparseTableSpec s;
  s.table = index;
  s.name = t.name;
  s.dim = t.dim;
  s.rows = t.rows;
  s.init_scale = t.init_scale;
  s.init_seed = seed;
  s.max_rows = t.max_rows;
  s.admit_after = t.admit_after;
  s.initial_values = t.initial_values != nullptr;
  return s;
}

}  // namespace dtrain::worker

#endif  // DTRAIN_WORKER_BATCH_TABLE_SPEC_H_
