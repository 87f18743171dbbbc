#include "worker/eval/checkpoint_tables.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace dtrain::worker {
namespace {

// "a, b ... z": a list of table names for a message.
template <typename Tables, typename NameOf>
std::string Names(const Tables& tables, NameOf name_of) {
  std::vector<std::string> names;
  for (const auto& t : tables) names.push_back(name_of(t));
  if (names.size() > 4) {
    return absl::StrCat(names.front(), ", ", names[1], " ... ", names.back());
  }
  return absl::StrJoin(names, ", ");
}

// The first field in which the checkpoint's spec and the model's table differ, with the flag that sets it.
std::string Difference(const ps::SparseTableSpec& s, const models::TableInfo& m) {
  auto differs = [](const char* what, const char* flag, auto saved, auto wanted) {
    return absl::StrCat(what, " is ", saved, " in the checkpoint but ", wanted, " for the model (", flag, ")");
  };
  if (s.name != m.name) return absl::StrCat("the checkpoint names it '", s.name, "'");
  if (s.dim != m.dim) return differs("dim", "--embedding_dim", s.dim, m.dim);
  if (s.rows != m.rows) return differs("rows", "--table_rows", s.rows, m.rows);
  if (s.max_rows != m.max_rows) return differs("max_rows", "--max_rows", s.max_rows, m.max_rows);
  if (s.admit_after != m.admit_after) return differs("admit_after", "--admit_after", s.admit_after, m.admit_after);
  return "";
}

}  // namespace

absl::StatusOr<CheckpointTables> CheckpointTables::Create(std::vector<ps::SparseTableRows> tables,
                                                          const std::vector<models::TableInfo>& model_tables) {
  const std::string model_names =
      Names(model_tables, [](const models::TableInfo& t) { return t.name; });
  const std::string saved_names = Names(tables, [](const ps::SparseTableRows& t) { return t.spec.name; });
  const char* hint = ": pass the --model and model flags it was trained with";
  if (tables.empty() && !model_tables.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the checkpoint holds no sparse tables, but the model has ", model_tables.size(), " (",
        model_names, "): it was written by a model without embedding tables (or before checkpoint "
        "format 4)", hint));
  }
  if (tables.size() != model_tables.size()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the checkpoint holds ", tables.size(), " sparse tables (", saved_names, "), the model has ",
        model_tables.size(), model_tables.empty() ? "" : absl::StrCat(" (", model_names, ")"), hint));
  }
  for (size_t t = 0; t < tables.size(); ++t) {
    const std::string difference = Difference(tables[t].spec, model_tables[t]);
    if (!difference.empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat("sparse table ", t, " '", model_tables[t].name, "': ", difference, hint));
    }
  }
  std::vector<std::shared_ptr<const std::vector<float>>> initial;
  for (const models::TableInfo& t : model_tables) initial.push_back(t.initial_values);
  return CheckpointTables(std::move(tables), std::move(initial));
}

CheckpointTables CheckpointTables::FromModel(const std::vector<models::TableInfo>& model_tables) {
  std::vector<ps::SparseTableRows> tables;
  std::vector<std::shared_ptr<const std::vector<float>>> initial;
  for (size_t t = 0; t < model_tables.size(); ++t) {
    const models::TableInfo& m = model_tables[t];
    ps::SparseTableRows r;
    r.spec = TableSpecOf(m, static_cast<uint32_t>(t), /*seed=*/0);  // no checkpoint: the model's own rows
    tables.push_back(std::move(r));
    initial.push_back(m.initial_values);
  }
  return CheckpointTables(std::move(tables), std::move(initial));
}

void CheckpointTables::FillRows(SparseBatch* batch) const {
  for (int t = 0; t < batch->num_tables(); ++t) {
    const ps::SparseTableRows& table = tables_[t];
    const int dim = table.spec.dim;
    const std::vector<int64_t>& ids = batch->unique_ids(t);
    float* rows = batch->rows(t);
    for (size_t i = 0; i < ids.size(); ++i) {
      float* row = rows + i * dim;
      const auto it = std::lower_bound(table.ids.begin(), table.ids.end(), ids[i]);
      if (it != table.ids.end() && *it == ids[i]) {
        std::copy_n(table.values.begin() + (it - table.ids.begin()) * dim, dim, row);
      } else if (initial_[t] != nullptr) {
        std::copy_n(initial_[t]->begin() + ids[i] * dim, dim, row);
      } else {
        ps::SparseInitialRow(table.spec, ids[i], row);
      }
    }
  }
}

std::vector<NpyArray> CheckpointTables::ExportArrays() const {
  std::vector<NpyArray> arrays;
  for (const ps::SparseTableRows& table : tables_) {
    const int64_t n = static_cast<int64_t>(table.ids.size());
    // Named as the dense variables are (NpzNameForVariable: '/' becomes '_'): "embedding_C1_ids".
    arrays.push_back(Int64NpyArray(NpzNameForVariable(table.spec.name + "/ids"), {n}, table.ids));
    arrays.push_back(NpyArray{NpzNameForVariable(table.spec.name + "/values"), {n, table.spec.dim}, table.values});
  }
  return arrays;
}

}  // namespace dtrain::worker
