// The sparse side of one step of a model with embedding tables (models::Graph::tables): the ids of every
// table over all the towers' batches, deduplicated — exactly the rows the step pulls from the ps tasks and
// pushes gradients for — and, for each tower, the row index of each of its ids into those rows.
//
//   SparseBatch sb(graph);
//   RETURN_IF_ERROR(sb.Prepare(batches));                    // one HostBatch per tower
//   for (int t = 0; t < sb.num_tables(); ++t) pull sb.unique_ids(t) into sb.rows(t)   // ps::WorkerClient
//   for (int k = 0; k < towers; ++k) RETURN_IF_ERROR(model_k->SetSparseInputs(sb.inputs(k)));
//   ... train step ...
//   RETURN_IF_ERROR(sb.AverageGradients(models));            // sb.grads(t): per unique id, averaged over towers
//   push sb.unique_ids(t), sb.grads(t)
//
// Fixed-size tables take ids modulo their row count (TableInfo::RowId) before deduplication. A feature read by
// a one-id embedding node must hold exactly one id per example.
//
// Thread-safety: one thread (the training loop) uses a SparseBatch.
#ifndef DTRAIN_WORKER_BATCH_SPARSE_BATCH_H_
#define DTRAIN_WORKER_BATCH_SPARSE_BATCH_H_

#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "worker/models/graph.h"
#include "worker/models/model.h"

namespace dtrain::worker {

class SparseBatch {
 public:
  explicit SparseBatch(const models::Graph& graph);

  int num_tables() const { return static_cast<int>(tables_.size()); }
  const models::TableInfo& table(int t) const { return tables_[t]; }
  // Gathers the ids of `batches` (one per tower). InvalidArgument naming the feature and example for a batch
  // without the model's sparse features or a one-id feature with another number of ids.
  absl::Status Prepare(const std::vector<models::HostBatch>& batches);
  // Table t's row ids, each once, in order of first appearance (tower 0 first).
  const std::vector<int64_t>& unique_ids(int t) const { return tables_state_[t].ids; }
  // Room for their rows (unique_ids(t).size() * dim floats), filled by the pull.
  float* rows(int t) { return tables_state_[t].rows.data(); }
  // What tower k's model reads (pointing into rows() and this batch's indices).
  models::SparseInputs inputs(int k) const;
  // Table t's row gradients averaged over `models` (the towers, after their step): unique_ids(t).size() * dim
  // floats. Device errors as the devices report them.
  absl::Status AverageGradients(const std::vector<models::Model*>& models);
  // A step over several rounds of the towers (one SparseBatch prepared with every round's batches): adds the
  // row gradients of `models` (one round) to grads(t) (`first`: replaces them), and multiplies them by `scale`.
  absl::Status AddGradients(const std::vector<models::Model*>& models, bool first);
  void ScaleGradients(float scale);
  const float* grads(int t) const { return tables_state_[t].grads.data(); }
  // Unique ids over all tables this step.
  int64_t total_unique() const;

 private:
  struct TableState {
    absl::flat_hash_map<int64_t, int32_t> index;
    std::vector<int64_t> ids;
    std::vector<float> rows, grads, scratch;
  };
  struct FeatureState {
    std::vector<int32_t> indices;
    std::vector<int32_t> offsets;  // bag features only
  };
  std::vector<models::TableInfo> tables_;
  std::vector<int> table_of_feature_;  // -1: not read
  std::vector<bool> bag_;              // per feature
  std::vector<TableState> tables_state_;
  std::vector<std::vector<FeatureState>> towers_;  // [tower][feature]
  std::vector<int> batch_sizes_;
};

}  // namespace dtrain::worker

#endif  // DTRAIN_WORKER_BATCH_SPARSE_BATCH_H_
