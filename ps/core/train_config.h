// Checks on the TrainConfig a worker registers with (ps/api/ps_types.h): validation of the chief's config and
// the field-by-field comparison of every other worker's against it.
//
// Thread-safety: free functions over values; safe to call concurrently.
#ifndef DTRAIN_PS_CORE_TRAIN_CONFIG_H_
#define DTRAIN_PS_CORE_TRAIN_CONFIG_H_

#include "absl/status/status.h"
#include "ps/api/ps_types.h"

namespace dtrain::ps {

// R and T with their 0 defaults resolved to num_workers.
int ResolvedReplicasToAggregate(const TrainConfig& config);
int ResolvedTotalNumReplicas(const TrainConfig& config);

// InvalidArgument naming the bad field: mode not "sync"/"async", num_workers < 1 or != cluster_num_workers
// (when cluster_num_workers > 0), not 1 <= R <= T <= num_workers, max_staleness < -1, a bad optimizer,
// moving_average_decay outside [0, 1), slices that are empty-length, repeat a key or overlap, sparse tables that
// ValidateSparseTables refuses (ps/core/sparse_store.h), or (with tables) a bad sparse_optimizer.
absl::Status ValidateTrainConfig(const TrainConfig& config, int cluster_num_workers);

// OK when `worker_config` (registered by worker `worker_id`) matches the adopted `ps_config` in every field,
// slices and sparse tables included (the sparse optimizer when there are tables); else FailedPrecondition naming the first differing field and both values, e.g.
// "model_signature mismatch: ps has 'a', worker 3 has 'b'".
// An elastic job's settings (TrainConfig::elastic_batch, batch_unit) on a task that keeps `max_workers` workers:
// InvalidArgument for a bad value, FailedPrecondition when the task takes more workers than the spec's without an
// elastic input (each message names the flag).
absl::Status CheckElasticConfig(const TrainConfig& config, int max_workers);
absl::Status CompareTrainConfigs(const TrainConfig& ps_config, const TrainConfig& worker_config, int worker_id);

}  // namespace dtrain::ps

#endif  // DTRAIN_PS_CORE_TRAIN_CONFIG_H_
