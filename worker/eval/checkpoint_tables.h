// A checkpoint's sparse embedding tables as dtrain_eval uses them: checked against the tables of the model the
// flags describe, the rows of each evaluation batch's ids filled in as the ps tasks would serve them, and the
// rows the checkpoint holds exported as NumPy arrays.
//
//   ASSIGN_OR_RETURN(std::vector<ps::SparseTableRows> rows, ps::ReadSparseTables(parts));
//   ASSIGN_OR_RETURN(CheckpointTables tables, CheckpointTables::Create(std::move(rows), graph.tables));
//   SparseBatch sb(graph);
//   RETURN_IF_ERROR(sb.Prepare({view}));
//   tables.FillRows(&sb);                                  // then model->SetSparseInputs(sb.inputs(0))
//   std::vector<NpyArray> arrays = tables.ExportArrays();  // <table>/ids (int64), <table>/values ([n, dim])
//
// An id the checkpoint holds no row for reads as its initializer (ps::SparseInitialRow with the checkpoint's
// spec): the row the ps would create at its first lookup; in a table with initial values (TableInfo::
// initial_values: an ONNX file's), as that row of them. (With admit_after, a ps reads an id it has not
// admitted yet as zeros; admission counts are not checkpointed, so evaluation takes the initializer.)
//
// Thread-safety: immutable after Create; FillRows may be called from several threads on distinct batches.
#ifndef DTRAIN_WORKER_EVAL_CHECKPOINT_TABLES_H_
#define DTRAIN_WORKER_EVAL_CHECKPOINT_TABLES_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "ps/checkpoint/checkpoint_set.h"
#include "worker/models/graph.h"
#include "worker/eval/npz_writer.h"
#include "worker/batch/sparse_batch.h"
#include "worker/batch/table_spec.h"

namespace dtrain::worker {

class CheckpointTables {
 public:
  // `tables`: ReadSparseTables' answer; `model_tables`: the tables of the model the flags describe (Graph::tables).
  // FailedPrecondition naming what differs: a checkpoint without tables for a model with tables (or the
  // reverse), another number of tables, or a table whose name, dim, rows, max_rows or admit_after differ (with
  // the dtrain_worker flag that sets it).
  static absl::StatusOr<CheckpointTables> Create(std::vector<ps::SparseTableRows> tables,
                                                 const std::vector<models::TableInfo>& model_tables);
  // Without a checkpoint: no rows held, every row read from the table's initial values (an ONNX file's own
  // rows) or its initializer.
  static CheckpointTables FromModel(const std::vector<models::TableInfo>& model_tables);

  int num_tables() const { return static_cast<int>(tables_.size()); }
  const ps::SparseTableRows& table(int t) const { return tables_[t]; }
  // Fills batch->rows(t) for every table t: each unique id's row from the checkpoint, or its initializer.
  // Precondition: batch->Prepare() succeeded, for a graph with these tables.
  void FillRows(SparseBatch* batch) const;
  // Per table, "<name>/ids" (int64, [n], ascending) and "<name>/values" (float32, [n, dim]): the rows it holds.
  std::vector<NpyArray> ExportArrays() const;

 private:
  CheckpointTables(std::vector<ps::SparseTableRows> tables,
                   std::vector<std::shared_ptr<const std::vector<float>>> initial)
      : tables_(std::move(tables)), initial_(std::move(initial)) {}
  std::vector<ps::SparseTableRows> tables_;
  std::vector<std::shared_ptr<const std::vector<float>>> initial_;  // per table: TableInfo::initial_values
};

}  // namespace dtrain::worker

#endif  // DTRAIN_WORKER_EVAL_CHECKPOINT_TABLES_H_
