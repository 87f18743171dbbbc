#include "worker/batch/sparse_batch.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace dtrain::worker {

SparseBatch::SparseBatch(const models::Graph& graph)
    : tables_(graph.tables),
      table_of_feature_(graph.table_of_feature()),
      bag_(graph.num_sparse_features, false),
      tables_state_(graph.tables.size()) {
  for (const models::Node& n : graph.nodes) {
    if (n.op == models::Op::kEmbedding) bag_[n.embedding.feature] = n.embedding.bag;
  }
}

absl::Status SparseBatch::Prepare(const std::vector<models::HostBatch>& batches) {
  const int features = static_cast<int>(table_of_feature_.size());
  for (TableState& t : tables_state_) {
    t.index.clear();
    t.ids.clear();
  }
  towers_.resize(batches.size());
  batch_sizes_.assign(batches.size(), 0);
  for (size_t k = 0; k < batches.size(); ++k) {
    const models::HostBatch& b = batches[k];
    if (b.num_sparse != features || (b.batch > 0 && (b.ids == nullptr || b.id_offsets == nullptr))) {
      return absl::InvalidArgumentError(absl::StrCat("the model reads ", features,
                                                     " sparse features per example; tower ", k, "'s batch has ",
                                                     b.num_sparse));
    }
    batch_sizes_[k] = b.batch;
    towers_[k].resize(features);
    for (int f = 0; f < features; ++f) {
      FeatureState& fs = towers_[k][f];
      fs.indices.clear();
      fs.offsets.clear();
      const int t = table_of_feature_[f];
      if (t < 0) continue;
      TableState& ts = tables_state_[t];
      const models::TableInfo& info = tables_[t];
      if (bag_[f]) fs.offsets.push_back(0);
      for (int e = 0; e < b.batch; ++e) {
        const int32_t begin = b.id_offsets[e * features + f], end = b.id_offsets[e * features + f + 1];
        if (!bag_[f] && end - begin != 1) {
          return absl::InvalidArgumentError(absl::StrCat("sparse feature ", f, " of example ", e, " has ",
                                                         end - begin, " ids; its embedding takes exactly one"));
        }
        for (int32_t j = begin; j < end; ++j) {
          const int64_t id = info.RowId(b.ids[j]);
          auto [it, inserted] = ts.index.try_emplace(id, static_cast<int32_t>(ts.ids.size()));
          if (inserted) ts.ids.push_back(id);
          fs.indices.push_back(it->second);
        }
        if (bag_[f]) fs.offsets.push_back(static_cast<int32_t>(fs.indices.size()));
      }
    }
  }
  for (size_t t = 0; t < tables_state_.size(); ++t) {
    TableState& ts = tables_state_[t];
    ts.rows.resize(std::max<size_t>(ts.ids.size(), 1) * tables_[t].dim);
  }
  return absl::OkStatus();
}

models::SparseInputs SparseBatch::inputs(int k) const {
  models::SparseInputs in;
  in.batch = batch_sizes_[k];
  for (size_t t = 0; t < tables_state_.size(); ++t) {
    in.tables.push_back({tables_state_[t].rows.data(), static_cast<int64_t>(tables_state_[t].ids.size())});
  }
  for (size_t f = 0; f < towers_[k].size(); ++f) {
    const FeatureState& fs = towers_[k][f];
    in.features.push_back({fs.indices.data(), static_cast<int64_t>(fs.indices.size()),
                           bag_[f] ? fs.offsets.data() : nullptr});
  }
  return in;
}

absl::Status SparseBatch::AverageGradients(const std::vector<models::Model*>& models) {
  RETURN_IF_ERROR(AddGradients(models, /*first=*/true));
  if (models.size() > 1) ScaleGradients(1.0f / static_cast<float>(models.size()));
  return absl::OkStatus();
}

absl::Status SparseBatch::AddGradients(const std::vector<models::Model*>& models, bool first) {
  for (size_t t = 0; t < tables_state_.size(); ++t) {
    TableState& ts = tables_state_[t];
    const int64_t n = static_cast<int64_t>(ts.ids.size()) * tables_[t].dim;
    if (first) ts.grads.resize(std::max<int64_t>(n, 1));
    if (n == 0) continue;
    for (size_t k = 0; k < models.size(); ++k) {
      const bool overwrite = first && k == 0;
      float* dst = overwrite ? ts.grads.data() : nullptr;
      if (!overwrite) {
        ts.scratch.resize(n);
        dst = ts.scratch.data();
      }
      RETURN_IF_ERROR(models[k]->device()->CopyToHost(models[k]->device_sparse_gradients(static_cast<int>(t)), dst, n));
      if (!overwrite) {
        for (int64_t i = 0; i < n; ++i) ts.grads[i] += ts.scratch[i];
      }
    }
  }
  return absl::OkStatus();
}

void SparseBatch::ScaleGradients(float scale) {
  for (size_t t = 0; t < tables_state_.size(); ++t) {
    TableState& ts = tables_state_[t];
    const int64_t n = static_cast<int64_t>(ts.ids.size()) * tables_[t].dim;
    for (int64_t i = 0; i < n; ++i) ts.grads[i] *= scale;
  }
}

int64_t SparseBatch::total_unique() const {
  int64_t n = 0;
  for (const TableState& t : tables_state_) n += static_cast<int64_t>(t.ids.size());
  return n;
}

}  // namespace dtrain::worker
