#include "ps/core/sparse_store.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "glog/logging.h"
#include "ps/core/row_codec.h"
#include "ps/core/sparse_table.h"

namespace dtrain::ps {

using sparse_internal::SparseTable;

// ---- SparseStore ------------------------------------------------------------------------------------------------

absl::Status ValidateSparseTables(const std::vector<SparseTableSpec>& tables) {
  std::set<std::string> names;
  for (size_t i = 0; i < tables.size(); ++i) {
    const SparseTableSpec& t = tables[i];
    const std::string what = absl::StrCat("sparse table ", i, " ('", t.name, "')");
    if (t.table != i) return absl::InvalidArgumentError(absl::StrCat(what, " has index ", t.table, ", expected ", i));
    if (t.name.empty() || !names.insert(t.name).second) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": names must be non-empty and unique"));
    }
    if (t.dim < 1 || t.dim > 65536) return absl::InvalidArgumentError(absl::StrCat(what, ": dim ", t.dim, " not in [1, 65536]"));
    if (t.rows < 0 || t.max_rows < 0) return absl::InvalidArgumentError(absl::StrCat(what, ": negative rows or max_rows"));
    if (!(std::isfinite(t.init_scale) && t.init_scale >= 0.0f)) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": init_scale must be finite and >= 0, got ", t.init_scale));
    }
    if (t.admit_after < 0 || t.admit_after > SparseStore::kMaxAdmitAfter) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": admit_after ", t.admit_after, " not in [0, ", SparseStore::kMaxAdmitAfter, "]"));
    }
    if (!(t.admit_probability > 0.0f && t.admit_probability <= 1.0f)) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": admit_probability ", t.admit_probability, " not in (0, 1] (--admit_probability)"));
    }
    if (t.ttl_steps < 0 || t.ttl_secs < 0 || (t.ttl_steps > 0 && t.ttl_secs > 0) || t.ttl_steps > UINT32_MAX / 2 ||
        t.ttl_secs > UINT32_MAX / 2) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": ttl of ", t.ttl_steps, " steps and ", t.ttl_secs,
                                                     " seconds: give one of them (--row_ttl), >= 0 and < 2^31"));
    }
    const auto known = [](RowDtype d) { return d == RowDtype::kF32 || d == RowDtype::kF16 || d == RowDtype::kBF16; };
    if (!known(t.row_dtype) || !known(t.slot_dtype) || t.slot_dtype == RowDtype::kF16) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": row dtype ", static_cast<int>(t.row_dtype),
                                                     " / slot dtype ", static_cast<int>(t.slot_dtype),
                                                     ": rows fp32, fp16 or bf16 (--row_dtype), slots fp32 or bf16 "
                                                     "(--row_slot_dtype; fp16's range is too small for them)"));
    }
    if (t.initial_values && (t.rows == 0 || t.max_rows > 0 || t.admit_after > 1 || t.admit_probability < 1.0f ||
                             t.ttl_steps > 0 || t.ttl_secs > 0)) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": initial values need a fixed-size table without "
                                                           "max_rows, admission or expiry (every row held from the "
                                                           "start)"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<SparseStore>> SparseStore::Create(std::vector<SparseTableSpec> tables,
                                                                 const SparseOptimizerConfig& optimizer,
                                                                 const OptimizerConfig& decay,
                                                                 SparseStoreOptions options) {
  if (absl::Status s = ValidateSparseTables(tables); !s.ok()) return s;
  absl::StatusOr<SparseOptimizer> opt = SparseOptimizer::Create(optimizer, decay);
  if (!opt.ok()) return opt.status();
  if (options.num_ps < 1 || options.task_index < 0 || options.task_index >= options.num_ps ||
      options.max_rows_cap < 0) {
    return absl::InvalidArgumentError("SparseStore: bad task_index, num_ps or max_rows_cap");
  }
  return std::unique_ptr<SparseStore>(new SparseStore(std::move(tables), *std::move(opt), options));
}

SparseStore::SparseStore(std::vector<SparseTableSpec> specs, SparseOptimizer optimizer, SparseStoreOptions options)
    : specs_(std::move(specs)), optimizer_(std::move(optimizer)), options_(std::move(options)),
      created_(options_.clock ? options_.clock() : absl::Now()),
      last_sweep_(new std::atomic<uint32_t>[specs_.size() + 1]) {
  for (size_t t = 0; t < specs_.size(); ++t) {
    const SparseTableSpec& s = specs_[t];
    int64_t max_rows = s.max_rows;
    // A table with initial values holds every row (an evicted one could not come back with its value).
    if (options_.max_rows_cap > 0 && !s.initial_values) {
      max_rows = max_rows > 0 ? std::min(max_rows, options_.max_rows_cap) : options_.max_rows_cap;
    }
    tables_.push_back(std::make_unique<SparseTable>(s, &optimizer_, max_rows, options_.track_changes, this));
    last_sweep_[t].store(0);
  }
}

SparseStore::~SparseStore() = default;

const SparseTableSpec& SparseStore::spec(int t) const { return specs_[t]; }
int64_t SparseStore::max_rows(int t) const { return tables_[t]->max_rows(); }

absl::Status SparseStore::CheckIds(uint32_t table, const int64_t* ids, int64_t n) const {
  if (table >= specs_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("sparse table ", table, " does not exist (the config has ",
                                                   specs_.size(), ")"));
  }
  const SparseTableSpec& spec = specs_[table];
  for (int64_t i = 0; i < n; ++i) {
    if (spec.rows > 0 && (ids[i] < 0 || ids[i] >= spec.rows)) {
      return absl::InvalidArgumentError(absl::StrCat("sparse table '", spec.name, "' has rows [0, ", spec.rows,
                                                     "); got id ", ids[i]));
    }
    if (ShardOfId(ids[i], options_.num_ps) != options_.task_index) {
      return absl::InvalidArgumentError(absl::StrCat("id ", ids[i], " of sparse table '", spec.name,
                                                     "' belongs to ps task ", ShardOfId(ids[i], options_.num_ps),
                                                     ", not to ps task ", options_.task_index));
    }
  }
  return absl::OkStatus();
}

void SparseStore::Lookup(int t, const int64_t* ids, int64_t n, WireDtype dtype, void* dst) {
  tables_[t]->Lookup(ids, n, dtype, dst);
}

void SparseStore::Peek(int t, const int64_t* ids, int64_t n, WireDtype dtype, void* dst) {
  tables_[t]->Peek(ids, n, dtype, dst);
}

void SparseStore::Apply(int t, int64_t step, const int64_t* ids, int64_t n, const float* grads, float grad_scale) {
  tables_[t]->Apply(optimizer_.Prepare(step), step, ids, n, grads, grad_scale);
}

void SparseStore::SetClock(int64_t step) { clock_.store(step, std::memory_order_relaxed); }

uint32_t SparseStore::Stamp(const SparseTableSpec& t) const {
  if (t.ttl_secs > 0) {
    const absl::Time now = options_.clock ? options_.clock() : absl::Now();
    return static_cast<uint32_t>(std::max<int64_t>(0, absl::ToInt64Seconds(now - created_)));
  }
  return static_cast<uint32_t>(clock());
}

int64_t SparseStore::Expire() {
  int64_t removed = 0;
  for (size_t t = 0; t < specs_.size(); ++t) {
    const SparseTableSpec& s = specs_[t];
    if (s.ttl_steps <= 0 && s.ttl_secs <= 0) continue;
    const uint32_t now = Stamp(s);
    last_sweep_[t].store(now);
    removed += tables_[t]->Expire(now, static_cast<uint32_t>(s.ttl_steps > 0 ? s.ttl_steps : s.ttl_secs));
  }
  return removed;
}

int64_t SparseStore::MaybeExpire() {
  int64_t removed = 0;
  for (size_t t = 0; t < specs_.size(); ++t) {
    const SparseTableSpec& s = specs_[t];
    if (s.ttl_steps <= 0 && s.ttl_secs <= 0) continue;
    const int64_t ttl = s.ttl_steps > 0 ? s.ttl_steps : s.ttl_secs;
    const uint32_t now = Stamp(s);
    uint32_t last = last_sweep_[t].load();
    if (static_cast<uint32_t>(now - last) < static_cast<uint32_t>(std::max<int64_t>(1, ttl / 8))) continue;
    if (!last_sweep_[t].compare_exchange_strong(last, now)) continue;  // another thread sweeps it
    removed += tables_[t]->Expire(now, static_cast<uint32_t>(ttl));
  }
  return removed;
}

void SparseStore::TakeChanges(std::vector<SparseTableState>* changed, std::vector<std::vector<int64_t>>* removed) {
  // Resized, not reassigned: the caller's vectors keep their capacity from the last delta (DeltaWriter::TakeSpare).
  changed->resize(tables_.size());
  removed->resize(tables_.size());
  for (size_t t = 0; t < tables_.size(); ++t) tables_[t]->TakeChanges(&(*changed)[t], &(*removed)[t]);
}

void SparseStore::ClearChanges() {
  for (auto& t : tables_) t->ClearChanges();
}

absl::Status SparseStore::WriteRows(uint32_t table, const int64_t* ids, int64_t n, int dim, WireDtype dtype,
                                    const void* rows) {
  if (absl::Status s = CheckIds(table, ids, n); !s.ok()) return s;
  const SparseTableSpec& spec = specs_[table];
  if (!spec.initial_values) {
    return absl::InvalidArgumentError(absl::StrCat("sparse table '", spec.name, "' starts from its initializer "
                                                   "(init_scale): the chief uploads rows only for tables with "
                                                   "initial values"));
  }
  if (dim != spec.dim) {
    return absl::InvalidArgumentError(absl::StrCat("initial rows of '", spec.name, "' with ", dim,
                                                   " values a row, the table has ", spec.dim));
  }
  tables_[table]->Write(ids, n, dtype, rows);
  return absl::OkStatus();
}

int64_t SparseStore::OwnedRows(int t) const {
  const SparseTableSpec& spec = specs_[t];
  if (options_.num_ps == 1) return spec.rows;
  int64_t n = 0;
  for (int64_t id = 0; id < spec.rows; ++id) n += ShardOfId(id, options_.num_ps) == options_.task_index ? 1 : 0;
  return n;
}

absl::Status SparseStore::CheckInitialRows() const {
  for (size_t t = 0; t < specs_.size(); ++t) {
    if (!specs_[t].initial_values) continue;
    const int64_t held = tables_[t]->Stats().rows, owned = OwnedRows(static_cast<int>(t));
    if (held != owned) {
      return absl::InvalidArgumentError(absl::StrCat("no complete initial rows for sparse table '", specs_[t].name,
                                                     "': ", held, " of the ", owned, " rows this task holds"));
    }
  }
  return absl::OkStatus();
}

void SparseStore::SetVersion(int64_t version) {
  absl::MutexLock lock(&version_mu_);
  version_ = version;
  version_cv_.SignalAll();
}

int64_t SparseStore::version() const {
  absl::MutexLock lock(&version_mu_);
  return version_;
}

bool SparseStore::WaitReadable(int64_t version, absl::Time deadline, const std::function<bool()>& stop) const {
  absl::MutexLock lock(&version_mu_);
  while (version_ < version) {
    if (stop && stop()) return false;
    if (version_cv_.WaitWithDeadline(&version_mu_, deadline)) return version_ >= version;
  }
  return true;
}

void SparseStore::WakeWaiters() const {
  absl::MutexLock lock(&version_mu_);
  version_cv_.SignalAll();
}

std::vector<SparseTableStats> SparseStore::Stats() const {
  std::vector<SparseTableStats> out;
  for (const auto& t : tables_) out.push_back(t->Stats());
  return out;
}

int64_t SparseStore::MemoryBytes() const {
  int64_t bytes = 0;
  for (const auto& t : tables_) bytes += t->MemoryBytes();
  return bytes;
}

std::vector<SparseTableState> SparseStore::ExportState() const {
  std::vector<SparseTableState> out;
  for (const auto& t : tables_) out.push_back(t->Export());
  return out;
}

absl::StatusOr<SparseStore::CheckedState> SparseStore::CheckState(
    const std::vector<SparseTableState>& tables) const {
  std::vector<const SparseTableState*> by_table(specs_.size(), nullptr);
  const int slots = optimizer_.num_slots();
  for (const SparseTableState& s : tables) {
    if (s.spec.table >= specs_.size() || by_table[s.spec.table] != nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("sparse table ", s.spec.table, " ('", s.spec.name,
                                                     "') unknown or given twice"));
    }
    const SparseTableSpec& spec = specs_[s.spec.table];
    if (s.spec.name != spec.name || s.spec.dim != spec.dim || s.spec.rows != spec.rows) {
      return absl::InvalidArgumentError(absl::StrCat("sparse table ", spec.table, ": state for '", s.spec.name,
                                                     "' [", s.spec.rows, ", ", s.spec.dim, "], this store holds '",
                                                     spec.name, "' [", spec.rows, ", ", spec.dim, "]"));
    }
    const int64_t n = static_cast<int64_t>(s.ids.size());
    bool ok = static_cast<int64_t>(s.values.size()) == n * spec.dim && static_cast<int>(s.slots.size()) == slots;
    for (const std::vector<float>& slot : s.slots) ok = ok && static_cast<int64_t>(slot.size()) == n * spec.dim;
    if (!ok) {
      return absl::InvalidArgumentError(absl::StrCat("sparse table '", spec.name,
                                                     "': wrong number of values or optimizer slots"));
    }
    if (absl::Status c = CheckIds(spec.table, s.ids.data(), n); !c.ok()) return c;
    std::vector<int64_t> sorted = s.ids;
    std::sort(sorted.begin(), sorted.end());
    if (auto dup = std::adjacent_find(sorted.begin(), sorted.end()); dup != sorted.end()) {
      return absl::InvalidArgumentError(absl::StrCat("sparse table '", spec.name, "': id ", *dup, " given twice"));
    }
    by_table[s.spec.table] = &s;
  }
  for (size_t t = 0; t < specs_.size(); ++t) {
    if (by_table[t] == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("no state for sparse table ", t, " ('", specs_[t].name, "')"));
    }
  }
  return by_table;
}

absl::Status SparseStore::ImportState(const std::vector<SparseTableState>& tables, int64_t version) {
  absl::StatusOr<CheckedState> checked = CheckState(tables);
  if (!checked.ok()) return checked.status();
  ImportChecked(*checked, version);
  return absl::OkStatus();
}

void SparseStore::ImportChecked(const CheckedState& by_table, int64_t version) {
  for (size_t t = 0; t < specs_.size(); ++t) {
    const int64_t evicted = tables_[t]->Import(*by_table[t]);
    if (evicted > 0) {
      LOG(WARNING) << "sparse table '" << specs_[t].name << "': " << evicted << " of " << by_table[t]->ids.size()
                   << " restored rows did not fit its max_rows of " << tables_[t]->max_rows() << " (evicted)";
    }
  }
  SetVersion(version);
}

void SparseStore::Clear(int64_t version) {
  for (auto& t : tables_) t->Clear();
  SetVersion(version);
}

}  // namespace dtrain::ps
