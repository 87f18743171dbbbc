// A worker's cache of embedding rows between steps (--row_cache_rows, --row_cache_staleness=K; HET's bounded
// staleness): a row pulled with the parameters of step p serves every step up to p + K without being pulled again
// (hot ids then cross the wire once every K + 1 steps instead of every step). The gradients of the steps a cached
// row served are summed on the worker and pushed with the step that pulls the row again, or, when the row leaves
// the cache, with the next push: every gradient reaches the ps, at most K steps late (summed: an optimizer with
// state, adagrad say, then sees one gradient for those steps). Meanwhile the worker updates its own copy (HET's
// local updates): each gradient is applied to the cached row at the step size the ps applied to the row's last
// push, fitted per row from the two pulls around that push (exact for SGD with one worker; adagrad's mean step
// over the row; with several workers the fit includes their updates). So a cached row lags the ps by the other
// workers' updates at most, not by this worker's own. Until a row has been pulled twice it is served as pulled.
//
// One step of table t (ids: the step's unique ids; rows: their rows, ids.size() * dim floats):
//   RowCache::Plan plan;
//   cache.Serve(t, step, ids, rows, &plan);          // fills the rows of cached ids; plan.pull_ids: the others
//   ... pull plan.pull_ids into `pulled` (plan.pull_ids.size() * dim floats) ...
//   cache.Store(t, step, &plan, pulled, rows);       // scatters them into rows and keeps them
//   ... the step's gradients per unique id ...
//   cache.Gradients(t, ids, plan, grads, &push_ids, &push_grads);  // what to push now
// Capacity: up to `capacity` rows per table; a new row in a full table takes the place of a row not served since
// the hand last passed (CLOCK).
//
// Thread-safety: one thread (the training loop) uses a RowCache.
#ifndef DTRAIN_WORKER_BATCH_ROW_CACHE_H_
#define DTRAIN_WORKER_BATCH_ROW_CACHE_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"

namespace dtrain::worker {

class RowCache {
 public:
  // dims[t]: floats per row of table t. Preconditions (CHECKed): capacity > 0, staleness >= 0.
  RowCache(std::vector<int> dims, int64_t capacity, int staleness);

  struct Plan {
    std::vector<int64_t> pull_ids;  // the ids to pull, in the order of first appearance
    std::vector<int32_t> pull_pos;  // their positions in the step's ids
    std::vector<char> cached;       // per position in the step's ids: served from the cache
    std::vector<int32_t> slot;      // per position in the step's ids: its cache slot when last seen (-1: none)
  };
  // The rows of the step at `step` (the step of the parameters the next pull brings): fresh cached rows
  // (pulled at step p >= step - K) are copied into `rows`; the rest go to plan->pull_ids.
  void Serve(int t, int64_t step, const std::vector<int64_t>& ids, float* rows, Plan* plan);
  // After the pull that brought `pulled` (the rows of plan.pull_ids) with the parameters of `step`.
  void Store(int t, int64_t step, Plan* plan, const float* pulled, float* rows);
  // The step's gradients (grads: ids.size() * dim) become what to push now (*push_ids, *push_grads, replaced):
  // each pulled id's gradient plus what its row had gathered while cached, and the gatherings of rows that left the
  // cache; the gradients of ids served from the cache are gathered instead.
  void Gradients(int t, const std::vector<int64_t>& ids, const Plan& plan, const float* grads,
                 std::vector<int64_t>* push_ids, std::vector<float>* push_grads);

  int64_t hits() const { return hits_; }      // ids served from the cache
  int64_t misses() const { return misses_; }  // ids pulled
  int64_t rows(int t) const { return static_cast<int64_t>(tables_[t].slot_of.size()); }

 private:
  // A slot's floats, 4 * dim of them side by side (one slot: neighbouring cache lines and one page): the row with
  // the worker's own updates since its pull, the row as pulled, the gradients gathered since, and the gradient
  // pushed with its last pull.
  enum Part { kValues = 0, kBase = 1, kGathered = 2, kLastPush = 3 };
  static constexpr int32_t kBlockSlots = 4096;  // slots a block of memory holds (allocated as the table grows)
  struct Table {
    int dim = 0;
    absl::flat_hash_map<int64_t, int32_t> slot_of;
    std::vector<int64_t> id;        // per slot
    std::vector<int64_t> pulled;    // per slot: the step of its values
    std::vector<float> rate;        // per slot: the step size the ps applied to it (0: not known yet)
    std::vector<char> has_gathered, has_last_push, referenced;
    std::vector<std::unique_ptr<float[]>> blocks;  // kBlockSlots slots each, uninitialized until used
    int32_t hand = 0;
    // Gradients of rows that left the cache, pushed with the next step.
    absl::flat_hash_map<int64_t, std::vector<float>> orphans;
    float* part(int32_t s, Part p) {
      return blocks[s / kBlockSlots].get() + (static_cast<size_t>(s % kBlockSlots) * 4 + p) * dim;
    }
  };
  // A slot for `id` (not cached): a free one, or the CLOCK victim's (its gathered gradients become orphans).
  int32_t Take(Table& tab, int64_t id);
  // Starts fetching slot s (-1: none) and its id for an access soon.
  static void Prefetch(Table& tab, int32_t s);
  static constexpr size_t kAhead = 8;  // ids ahead that Serve, Store and Gradients prefetch
  // id's slot (-1: not cached), from the slot the plan saw it in (`hint`) unless that slot has changed hands since.
  static int32_t SlotOf(const Table& tab, int32_t hint, int64_t id);

  std::vector<Table> tables_;
  const int64_t capacity_;
  const int staleness_;
  int64_t hits_ = 0, misses_ = 0;
};

}  // namespace dtrain::worker

#endif  // DTRAIN_WORKER_BATCH_ROW_CACHE_H_
