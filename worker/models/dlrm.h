// DLRM (Naumov et al., 2019) for click-through-rate data: the dense features through a bottom MLP, one embedding
// table per categorical feature, the pairwise dot products of the bottom output and the embeddings, a top MLP
// and one logit trained with sigmoid cross-entropy (metrics: log loss, AUC). The tables live on the ps tasks
// (sparse: only the rows a batch touches move).
//
//   dense (num_dense) -> Gemm+ReLU ... -> b (dim)           embedding_f(id_f) (dim), f < num_sparse
//   z = stack(b, e_0, ..., e_{F-1}) (F+1, dim) -> pairwise dots (F+1 choose 2) -> concat with b -> top MLP -> logit
//
// Thread-safety: plain functions.
#ifndef DTRAIN_WORKER_MODELS_DLRM_H_
#define DTRAIN_WORKER_MODELS_DLRM_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/models/graph.h"

namespace dtrain::models {

struct DlrmConfig {
  int embedding_dim = 16;
  std::vector<int> bottom = {64};      // hidden widths of the bottom MLP (its last layer is embedding_dim wide)
  std::vector<int> top = {128, 64};    // hidden widths of the top MLP (then one logit)
  // Rows per table: 0 = hash tables keyed by the id (rows created on first touch); > 0 = [rows, dim] tables
  // indexed by id modulo rows.
  int64_t table_rows = 0;
  int64_t max_rows = 0;    // per table and ps task (0: no bound)
  int admit_after = 0;     // admission filter (0: every id gets a row at once)
};

// The config from the command line's words: widths as comma-separated lists ("64" or "128,64"; "" for none).
// InvalidArgument naming the flag for a value that is not a positive number.
absl::StatusOr<DlrmConfig> ParseDlrmConfig(int embedding_dim, const std::string& bottom, const std::string& top,
                                           int64_t table_rows, int64_t max_rows, int admit_after);

// The graph for num_dense dense and num_sparse categorical features. InvalidArgument for a bad config.
absl::StatusOr<Graph> DlrmGraph(const DlrmConfig& config, int num_dense, int num_sparse);

}  // namespace dtrain::models

#endif  // DTRAIN_WORKER_MODELS_DLRM_H_
