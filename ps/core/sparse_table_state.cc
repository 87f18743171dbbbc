#include "ps/core/sparse_table.h"

#include <algorithm>
#include <vector>

// A table's state as the store reports, saves and sends it: statistics, memory, the whole state (checkpoints),
// the changes since the last delta, and clearing.
namespace dtrain::ps::sparse_internal {

SparseTableStats SparseTable::Stats() const {
  SparseTableStats s;
  s.name = spec_.name;
  s.bytes = MemoryBytes();
  for (const auto& st : stripes_) {
    absl::MutexLock lock(&st->mu);
    s.rows += st->size;
    s.created += st->created;
    s.evicted += st->evicted;
    s.expired += st->expired;
    s.not_admitted += st->not_admitted;
    s.dropped_gradients += st->dropped;
    s.lookups += st->lookups;
    s.updates += st->updates;
  }
  return s;
}

int64_t SparseTable::MemoryBytes() const {
  int64_t bytes = 0;
  for (const auto& st : stripes_) {
    absl::MutexLock lock(&st->mu);
    // The rows' pages are resident as rows reach them (Mapping): count what the rows use.
    bytes += static_cast<int64_t>(st->size) * PerRowBytes() + (st->size + 7) / 8 * (track_ ? 2 : 1);
    bytes += static_cast<int64_t>(st->index.size()) * 4 + static_cast<int64_t>(st->sketch.size());
  }
  return bytes;
}

SparseTableState SparseTable::Export() const {
  SparseTableState out;
  out.spec = spec_;
  out.slots.resize(optimizer_->num_slots());
  int64_t total = 0;
  for (const auto& st : stripes_) {
    absl::MutexLock lock(&st->mu);
    total += st->size;
  }
  Reserve(&out, total);
  std::vector<float> scratch(row_floats_);
  for (const auto& st : stripes_) {
    absl::MutexLock lock(&st->mu);
    for (uint32_t r = 0; r < st->size; ++r) AppendRow(*st, r, &out, scratch.data());
  }
  return out;
}

// Deltas: the rows changed since the last call (their values and slots now) and the ids removed meanwhile
// (with change tracking; else nothing). Clears both.
void SparseTable::TakeChanges(SparseTableState* changed, std::vector<int64_t>* removed) {
  changed->spec = spec_;
  changed->ids.clear();
  changed->values.clear();
  changed->slots.resize(optimizer_->num_slots());
  for (std::vector<float>& slot : changed->slots) slot.clear();
  removed->clear();
  std::vector<float> scratch(row_floats_);
  for (auto& st : stripes_) {
    absl::MutexLock lock(&st->mu);
    removed->insert(removed->end(), st->removed.begin(), st->removed.end());
    st->removed.clear();
    if (!track_) continue;
    for (size_t k = 0; k < st->chunks.size(); ++k) {
      Chunk& c = st->chunks[k];
      const uint32_t first = k < kGeometricChunks ? kFirstChunkRows * ((1u << k) - 1)
                                                  : kGeometricEnd + (static_cast<uint32_t>(k) - kGeometricChunks + 1) * kChunkRows;
      for (size_t w = 0; w < Words(c.rows); ++w) {
        uint64_t bits = c.dirty[w];
        c.dirty[w] = 0;
        while (bits != 0) {
          const uint32_t r = first + static_cast<uint32_t>(w * 64 + __builtin_ctzll(bits));
          bits &= bits - 1;
          if (r < st->size) AppendRow(*st, r, changed, scratch.data());
        }
      }
    }
  }
}

// Forgets the changes so far (after a restore: the state restored is the baseline of the next delta).
void SparseTable::ClearChanges() {
  for (auto& st : stripes_) {
    absl::MutexLock lock(&st->mu);
    st->removed.clear();
    for (Chunk& c : st->chunks) {
      if (c.dirty != nullptr) std::fill(c.dirty, c.dirty + Words(c.rows), 0);
    }
  }
}

void SparseTable::Clear() {
  for (auto& st : stripes_) {
    absl::MutexLock lock(&st->mu);
    st->chunks.clear();
    st->chunks.shrink_to_fit();
    std::vector<uint32_t>().swap(st->index);
    std::fill(st->sketch.begin(), st->sketch.end(), 0);
    st->size = st->capacity = st->hand = 0;
    st->created = st->evicted = st->expired = st->not_admitted = st->dropped = st->lookups = st->updates = 0;
    st->removed.clear();
  }
}

}  // namespace dtrain::ps::sparse_internal
