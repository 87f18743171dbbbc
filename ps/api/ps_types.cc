#include "ps/api/ps_types.h"

#include "absl/strings/str_cat.h"

namespace dtrain::ps {

namespace {

inline uint64_t Mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

}  // namespace

uint64_t Mix64(uint64_t x) { return Mix(x); }

bool OptimizerConfig::operator==(const OptimizerConfig& o) const {
  return name == o.name && learning_rate == o.learning_rate && decay_steps == o.decay_steps &&
         decay_rate == o.decay_rate && staircase == o.staircase && momentum == o.momentum && beta1 == o.beta1 &&
         beta2 == o.beta2 && epsilon == o.epsilon;
}

bool SparseTableSpec::operator==(const SparseTableSpec& o) const {
  return table == o.table && name == o.name && dim == o.dim && rows == o.rows && init_scale == o.init_scale &&
         init_seed == o.init_seed && max_rows == o.max_rows && admit_after == o.admit_after &&
         initial_values == o.initial_values && ttl_steps == o.ttl_steps && ttl_secs == o.ttl_secs &&
         admit_probability == o.admit_probability && row_dtype == o.row_dtype && slot_dtype == o.slot_dtype;
}

absl::StatusOr<RowDtype> ParseRowDtype(absl::string_view name) {
  if (name == "fp32") return RowDtype::kF32;
  if (name == "fp16") return RowDtype::kF16;
  if (name == "bf16") return RowDtype::kBF16;
  return absl::InvalidArgumentError(absl::StrCat("row dtype '", name, "': expected fp32, fp16 or bf16"));
}

const char* RowDtypeName(RowDtype d) {
  switch (d) {
    case RowDtype::kF32:
      return "fp32";
    case RowDtype::kF16:
      return "fp16";
    case RowDtype::kBF16:
      return "bf16";
  }
  return "?";
}

int SparseOptimizerConfig::num_slots() const {
  if (name == "adagrad") return 1;
  if (name == "adam" || name == "ftrl") return 2;
  return 0;
}

bool SparseOptimizerConfig::operator==(const SparseOptimizerConfig& o) const {
  return name == o.name && learning_rate == o.learning_rate && initial_accumulator == o.initial_accumulator &&
         beta1 == o.beta1 && beta2 == o.beta2 && epsilon == o.epsilon && l1 == o.l1 && l2 == o.l2 &&
         lr_power == o.lr_power;
}

int ShardOfId(int64_t id, int num_ps) {
  if (num_ps <= 1) return 0;
  return static_cast<int>(Mix64(static_cast<uint64_t>(id) ^ 0x5D5A0B7E5D5A0B7EULL) % static_cast<uint64_t>(num_ps));
}

void SparseInitialRow(const SparseTableSpec& table, int64_t id, float* row) {
  const uint64_t key = Mix(table.init_seed ^ Mix(static_cast<uint64_t>(table.table) + 1) ^
                           Mix(static_cast<uint64_t>(id) * 0xD6E8FEB86659FD93ULL));
  // Inlined so that the loop vectorizes (a row's creation was mostly this function).
  for (int k = 0; k < table.dim; ++k) {
    const uint64_t bits = Mix(key + static_cast<uint64_t>(k));
    const double u = static_cast<double>(bits >> 11) * 0x1.0p-53;  // [0, 1)
    row[k] = static_cast<float>((2.0 * u - 1.0) * table.init_scale);
  }
}

}  // namespace dtrain::ps
