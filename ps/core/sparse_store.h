// The sparse embedding tables one ps task holds (its shard of each: the ids it owns by ShardOfId), beside the
// dense SliceStore. Rows are created on first touch from the table's deterministic initializer
// (SparseInitialRow), carry their optimizer slots (SparseOptimizer), and are bounded per table by max_rows
// with eviction of the least recently touched, and optionally admitted only after admit_after lookups.
//
// Memory (per table): rows live in chunks of up to 8192 rows (the first chunks are smaller: 16, 32, ... rows,
// so a small table stays small; with max_rows the last one is cut to the rows allowed), each chunk one mapping holding the rows' ids (int64), their floats
// ([values: dim][slots: num_slots * dim], see sparse_optimizer.h) and one reference bit per row. An id finds
// its row through an open-addressing index (linear probing) of 32-bit entries (24 bits of row number, 8 bits
// of the id's hash as a tag, so a probe rarely reads an id) with backward-shift deletion. With max_rows the
// index is made for max_rows / 0.9 entries when a sub-shard gets its first row (4.4 bytes per row allowed), so
// a full table costs 8 (id) + 4 / 0.9 (index) + 1/8 (reference bit) ~ 12.6 bytes per row beyond its floats;
// without max_rows it grows by 1.25x when 90% full, ~13-14 bytes per row (72% to 90% full, and the allocator
// keeps some of the smaller indexes it freed). No per-row allocation;
// evicted rows are reused in place, so rows [0, size) of each sub-shard are all live.
//
// Locking: each table is split into up to 32 sub-shards by a hash of the id (independent of ShardOfId), each
// with its own lock, index, rows, clock hand and admission sketch, so pulls and updates of different workers
// proceed in parallel. A call groups its ids by sub-shard and takes each lock once. max_rows is divided over
// the sub-shards (each holds at most its share, so the table never exceeds max_rows; with max_rows < 32K
// there are fewer sub-shards, one below 2048 rows, and eviction is then exactly CLOCK over the table).
//
// Eviction (max_rows > 0): CLOCK, the second-chance approximation of LRU. A row's reference bit is set when it
// is looked up again after its creation (a pull of a row that exists); a new row in a full sub-shard takes the
// place of the first row the clock hand finds with its bit clear, clearing the bits it passes. So the evicted
// row was not looked up since the hand last passed it: among the least recently touched, not necessarily the
// least recently touched. New rows start with their bit clear (an update does not set it): ids seen in one step
// only are the first to go, which keeps a re-used working set from being swept out by a stream of ids seen
// once (with new rows marked referenced, the hand found every bit set every other revolution and then evicted
// in row order, hot rows included). When every row was looked up since the hand's last pass, CLOCK evicts in
// row order (as FIFO would).
//
// Admission (admit_after > 1): lookups of ids without a row are counted in a count-min sketch with conservative
// update (4 rows of 8-bit saturating counters per sub-shard, width from max_rows: 2^12..2^23 counters per row
// and table, i.e. at most 32 MiB per table, allocated only with admission on); an id's row is created at the
// lookup where its count reaches admit_after (<= 255). The sketch only overestimates (ids that share counters
// with frequent ones are admitted early, never late) and never forgets (an evicted id that comes back is
// admitted at once). Until admitted an id reads as zeros and its gradients are dropped. Counts are not part
// of checkpoints: after a restore, ids without a row start counting again.
//
// Initial values (SparseTableSpec::initial_values: a table from an ONNX file): the chief's Initialize writes
// every row this task owns (WriteRows) before training; such a table is never bounded by max_rows_cap.
//
// Updates: Apply runs the sparse optimizer on each row (a sum over workers and the 1/R scale are the caller's:
// the store knows nothing of the server above it). A gradient for an id without a row is dropped (counted) in a hash table (the id
// was not admitted, or its row was evicted since the worker pulled it); in a fixed-size table ([rows, dim],
// SparseTableSpec::rows > 0) the row is created from its initializer first (if admitted), as if the table had
// been filled from the start.
//
// Versions (sync mode): the store's version is the number of steps applied to the tables; a pull of step s
// waits until version >= s (WaitReadable), like SliceStore's per-slice versions.
//
// Usage:
//   ASSIGN_OR_RETURN(std::unique_ptr<SparseStore> store,
//                    SparseStore::Create(config.tables, config.sparse_optimizer, config.optimizer, {task, num_ps}));
//   RETURN_IF_ERROR(store->CheckIds(table, ids, n));
//   store->Lookup(table, ids, n, WireDtype::kF32, rows);            // n * dim floats
//   store->Apply(table, step, ids, n, grads, 1.0f / num_workers);
//   store->SetVersion(step + 1);
//
// Thread-safety: Lookup, Apply, CheckIds, Stats, ExportState, WaitReadable, SetVersion, SetClock, Expire,
// MaybeExpire and TakeChanges may run concurrently from any threads (a sweep or TakeChanges sees each sub-shard at
// one moment; the ParameterServer calls them between updates, where every sub-shard is at the same step).
// ImportState, Clear, ClearChanges, WriteRows and CheckInitialRows are for set-up and rollback: callers make sure
// no Apply runs meanwhile (lookups are safe: they see rows of either state).
#ifndef DTRAIN_PS_CORE_SPARSE_STORE_H_
#define DTRAIN_PS_CORE_SPARSE_STORE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "ps/api/ps_types.h"
#include "ps/api/slice_io.h"
#include "ps/checkpoint/checkpoint_format.h"
#include "ps/core/sparse_optimizer.h"

namespace dtrain::ps {

struct SparseStoreOptions {
  int task_index = 0;  // this task holds the ids with ShardOfId(id, num_ps) == task_index
  int num_ps = 1;
  // A ps-side bound on every table's rows on this task (0: none): the effective max_rows of a table is the
  // smaller of this and its SparseTableSpec::max_rows (when that is set). Not for tables with initial values.
  int64_t max_rows_cap = 0;
  // Remember which rows changed and which were removed (TakeChanges: the ps's deltas).
  bool track_changes = false;
  // Time source of ttl_secs (default absl::Now); tests inject a fake clock.
  std::function<absl::Time()> clock;
};

namespace sparse_internal {
class SparseTable;  // sparse_table.h
}  // namespace sparse_internal

class SparseStore {
 public:
  // The largest admit_after the sketch counts to.
  static constexpr int kMaxAdmitAfter = 255;

  // InvalidArgument for a bad optimizer or table spec (tables[i].table must be i).
  static absl::StatusOr<std::unique_ptr<SparseStore>> Create(std::vector<SparseTableSpec> tables,
                                                             const SparseOptimizerConfig& optimizer,
                                                             const OptimizerConfig& decay,
                                                             SparseStoreOptions options = {});
  ~SparseStore();

  int num_tables() const { return static_cast<int>(tables_.size()); }
  const SparseTableSpec& spec(int t) const;
  const SparseOptimizer& optimizer() const { return optimizer_; }
  // The rows one table may hold on this task (0: no bound).
  int64_t max_rows(int t) const;

  // InvalidArgument naming the table and id: an unknown table, an id this task does not own (ShardOfId), or in
  // a fixed-size table an id outside [0, rows).
  absl::Status CheckIds(uint32_t table, const int64_t* ids, int64_t n) const;

  // Writes the rows of ids[0, n) (checked with CheckIds) as n * dim values of `dtype` at `dst`, in order,
  // creating rows of admitted ids; ids not admitted read as zeros.
  void Lookup(int t, const int64_t* ids, int64_t n, WireDtype dtype, void* dst);
  // As Lookup, but changes nothing (evaluation, export: PullRequest::sparse_read_only): an id without a row
  // reads as the row Lookup would create for it (SparseInitialRow), or zeros while admission would not admit
  // it yet; no row is created, no lookup counted, no reference bit set.
  void Peek(int t, const int64_t* ids, int64_t n, WireDtype dtype, void* dst);
  // Applies the sparse optimizer at `step` to the rows of ids[0, n) (checked, no repeats) with gradients
  // grad_scale * grads[i * dim, (i + 1) * dim).
  void Apply(int t, int64_t step, const int64_t* ids, int64_t n, const float* grads, float grad_scale);

  // Probabilistic admission (admit_probability < 1, beside admit_after or alone): an id without a row (that passed
// the count filter) is given one at a lookup with that probability, a draw fixed by (id, the clock's step, the
// table's seed); refused lookups count in not_admitted like the count filter's.
//
// Expiry (ttl_steps or ttl_secs): every row carries a 32-bit stamp, the clock's step (SetClock: the global step)
// or the seconds since the store was made, set whenever the row is looked up, updated, written or restored; a
// sweep (Expire, or MaybeExpire once an eighth of the ttl has passed since the last sweep) removes the rows whose
// stamp is more than the ttl behind (counted in `expired`), moving the last row of the sub-shard into each hole,
// and unmaps the chunks no row reaches any more. An expired id that comes back is a new row (its initializer).
//
// Row types (row_dtype, slot_dtype; ps/core/row_codec.h): 16-bit rows are decoded to fp32 for each update and
// written back with stochastic rounding; lookups send the stored values (converted to the pull's wire type),
// checkpoints and deltas hold them as fp32 (exactly). A row of dim 16 with adagrad takes 128 bytes in fp32, 96
// with fp16 values, 64 with bf16 slots too (plus ~12.4 bytes of id and index, and 4 with expiry).
//
// Changes (SparseStoreOptions::track_changes, for the ps's deltas): a dirty bit per row, set when the row is
// created, updated, written; and the ids of the rows removed (evicted, expired) since the last TakeChanges.
//
// Initial values (SparseTableSpec::initial_values): sets the rows of ids[0, n) to `rows` (n * dim values of
  // `dtype`), creating them, their optimizer slots at their initial value; a row written again is overwritten.
  // InvalidArgument as CheckIds, for a table without initial values or another dim. CheckInitialRows then says
  // whether every such table holds all the rows this task owns (InvalidArgument naming the first that does not).
  absl::Status WriteRows(uint32_t table, const int64_t* ids, int64_t n, int dim, WireDtype dtype, const void* rows);
  absl::Status CheckInitialRows() const;
  // The ids of fixed-size table t this task owns (ShardOfId over [0, rows)).
  int64_t OwnedRows(int t) const;

  // Versions: SetVersion publishes (wakes waiters); WaitReadable waits until version() >= `version`, `deadline`
  // or `stop` (checked whenever the waiter wakes) and returns whether it is.
  void SetVersion(int64_t version);
  int64_t version() const;
  bool WaitReadable(int64_t version, absl::Time deadline, const std::function<bool()>& stop = nullptr) const;
  void WakeWaiters() const;

  // The expiry clock: the global step rows are stamped with (ttl_steps) and admission draws are keyed on.
  void SetClock(int64_t step);
  int64_t clock() const { return clock_.load(std::memory_order_relaxed); }
  // A row's stamp now under table t's ttl: the clock's step, or seconds since the store was made (ttl_secs).
  uint32_t Stamp(const SparseTableSpec& t) const;
  // Removes the rows whose ttl has passed (every table with one); returns how many. MaybeExpire sweeps a table
  // only when an eighth of its ttl (at least 1 step or second) has passed since its last sweep.
  int64_t Expire();
  int64_t MaybeExpire();

  // Changes since the last call (track_changes; else every table's lists are empty): per table, the rows created
  // or updated with their values and slots now (`changed`, one state per table, in table order) and the ids of
  // the rows removed (`removed`), replacing what both held (their vectors keep their capacity: the ps reuses the
  // buffers of the last delta). Forgets them. ClearChanges forgets them without reading (after a restore).
  void TakeChanges(std::vector<SparseTableState>* changed, std::vector<std::vector<int64_t>>* removed);
  void ClearChanges();

  std::vector<SparseTableStats> Stats() const;
  // Bytes the tables take now (rows, ids, reference bits, index, sketches).
  int64_t MemoryBytes() const;

  // Checkpoints: every table's rows (its shard on this task), in table order.
  std::vector<SparseTableState> ExportState() const;
  // Replaces every table's rows with `tables` (one state per table, in any order, matching name, dim, rows and
  // the optimizer's slots; ids owned by this task, valid and not repeated) and sets the version; else
  // InvalidArgument and nothing changes. Rows beyond a table's max_rows are evicted as they come in.
  absl::Status ImportState(const std::vector<SparseTableState>& tables, int64_t version);
  // ImportState in two halves, for a caller that must check everything before it changes anything: CheckState
  // makes ImportState's checks (nothing changes) and gives each table's state (pointers into `tables`, which
  // must outlive them); ImportChecked then imports them.
  using CheckedState = std::vector<const SparseTableState*>;
  absl::StatusOr<CheckedState> CheckState(const std::vector<SparseTableState>& tables) const;
  void ImportChecked(const CheckedState& by_table, int64_t version);
  // Drops every row (and admission count) and sets the version.
  void Clear(int64_t version);

 private:
  SparseStore(std::vector<SparseTableSpec> specs, SparseOptimizer optimizer, SparseStoreOptions options);

  std::vector<SparseTableSpec> specs_;
  SparseOptimizer optimizer_;
  SparseStoreOptions options_;
  std::vector<std::unique_ptr<sparse_internal::SparseTable>> tables_;

  std::atomic<int64_t> clock_{0};
  const absl::Time created_;
  // Per table: the stamp of its last sweep (MaybeExpire).
  std::unique_ptr<std::atomic<uint32_t>[]> last_sweep_;

  mutable absl::Mutex version_mu_;
  mutable absl::CondVar version_cv_;
  int64_t version_ ABSL_GUARDED_BY(version_mu_) = 0;
};

// Checks a table spec list as TrainConfig::tables (table indices 0.., names unique and non-empty, dim in
// [1, 65536], rows, max_rows >= 0, init_scale finite >= 0, admit_after in [0, 255], admit_probability in (0, 1],
// ttl_steps and ttl_secs >= 0 and not both, known row and slot dtypes (slots fp32 or bf16), initial values only on
// a fixed-size table without max_rows, admission or expiry); InvalidArgument naming it.
absl::Status ValidateSparseTables(const std::vector<SparseTableSpec>& tables);

}  // namespace dtrain::ps

#endif  // DTRAIN_PS_CORE_SPARSE_STORE_H_
