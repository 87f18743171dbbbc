#include "ps/core/sparse_table.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14
#endif

namespace dtrain::ps::sparse_internal {

// Makes [p, p + bytes) resident at once (where the kernel can; otherwise pages fault in as they are touched).
void Populate(void* p, size_t bytes) {
  static bool supported = true;  // a benign race: at worst a few more failing calls
  if (!supported || bytes == 0) return;
  if (madvise(p, bytes, MADV_POPULATE_WRITE) != 0 && (errno == EINVAL || errno == ENOSYS)) supported = false;
}

SparseTable::SparseTable(const SparseTableSpec& spec, const SparseOptimizer* optimizer, int64_t max_rows,
                         bool track_changes, const SparseStore* store)
    : spec_(spec), optimizer_(optimizer), store_(store), dim_(spec.dim),
      row_floats_(spec.dim * (1 + optimizer->num_slots())),
      fp32_(spec.row_dtype == RowDtype::kF32 && (optimizer->num_slots() == 0 || spec.slot_dtype == RowDtype::kF32)),
      value_bytes_(spec.dim * RowDtypeBytes(spec.row_dtype)),
      row_bytes_(spec.dim * RowDtypeBytes(spec.row_dtype) +
                 spec.dim * optimizer->num_slots() * RowDtypeBytes(spec.slot_dtype)),
      max_rows_(max_rows), track_(track_changes), ttl_(spec.ttl_steps > 0 || spec.ttl_secs > 0) {
  const int stripes = max_rows > 0 ? static_cast<int>(std::clamp<int64_t>(max_rows / kRowsPerStripeForSplit, 1,
                                                                           kMaxStripes))
                                   : kMaxStripes;
  int64_t sketch_width = 0;
  if (spec.admit_after > 1) {
    int64_t want = max_rows > 0 ? max_rows : (int64_t{1} << 20);
    int64_t w = 1;
    while (w < want) w <<= 1;
    sketch_width = std::clamp<int64_t>(w, int64_t{1} << 12, int64_t{1} << 23) / stripes;
  }
  for (int s = 0; s < stripes; ++s) {
    auto stripe = std::make_unique<Stripe>();
    if (max_rows > 0) {
      const int64_t share = max_rows / stripes + (s < max_rows % stripes ? 1 : 0);
      stripe->cap = static_cast<uint32_t>(std::min<int64_t>(share, kMaxStripeRows));
      stripe->max_index = static_cast<uint32_t>(std::ceil(stripe->cap / kMaxLoad)) + 1;
    } else {
      stripe->cap = kMaxStripeRows;
      stripe->max_index = UINT32_MAX;
    }
    if (sketch_width > 0) {
      stripe->sketch_width = static_cast<uint32_t>(std::max<int64_t>(64, sketch_width));
      stripe->sketch.assign(static_cast<size_t>(kSketchDepth) * stripe->sketch_width, 0);
    }
    stripes_.push_back(std::move(stripe));
  }
}

// ---- the row machinery: the index, eviction, admission, new rows ----

// Moves row `from` (live) to slot `to` (whose row was removed from the index): id, floats, stamp, bits, and
// its index entry.
inline void SparseTable::MoveRow(Stripe& st, uint32_t from, uint32_t to) {
  const auto [kf, f] = Locate(from);
  const auto [kt, t] = Locate(to);
  Chunk& a = st.chunks[kf];
  Chunk& b = st.chunks[kt];
  const int64_t id = a.keys[f];
  b.keys[t] = id;
  std::memcpy(b.data + static_cast<size_t>(t) * row_bytes_, a.data + static_cast<size_t>(f) * row_bytes_,
              static_cast<size_t>(row_bytes_));
  if (ttl_) b.stamps[t] = a.stamps[f];
  // (f and t passed, not captured: a lambda may not capture structured bindings in C++17.)
  auto move_bit = [](uint64_t* src, uint64_t* dst, auto f, auto t) {
    const bool set = (src[f / 64] >> (f % 64)) & 1;
    dst[t / 64] = (dst[t / 64] & ~(uint64_t{1} << (t % 64))) | (uint64_t{set} << (t % 64));
  };
  move_bit(a.ref, b.ref, f, t);
  if (track_) move_bit(a.dirty, b.dirty, f, t);
  // Its index entry now names `to`.
  const uint64_t h = HashId(id);
  const uint32_t size = static_cast<uint32_t>(st.index.size());
  uint32_t p = Home(st, h);
  while ((st.index[p] & kRowMask) != from + 1) p = p + 1 == size ? 0 : p + 1;
  st.index[p] = (Tag(h) << kRowBits) | (to + 1);
}

// Puts row `row` of hash h into the index (its id is not there).
inline void SparseTable::IndexInsert(Stripe& st, uint64_t h, uint32_t row) {
  const uint32_t size = static_cast<uint32_t>(st.index.size());
  uint32_t p = Home(st, h);
  while (st.index[p] != 0) p = p + 1 == size ? 0 : p + 1;
  st.index[p] = (Tag(h) << kRowBits) | (row + 1);
}

// Removes row `row` (of hash h) from the index: backward-shift deletion keeps every probe sequence unbroken.
inline void SparseTable::IndexErase(Stripe& st, uint64_t h, uint32_t row) {
  const uint32_t size = static_cast<uint32_t>(st.index.size());
  uint32_t i = Home(st, h);
  while ((st.index[i] & kRowMask) != row + 1) i = i + 1 == size ? 0 : i + 1;
  for (uint32_t j = i + 1 == size ? 0 : i + 1;; j = j + 1 == size ? 0 : j + 1) {
    const uint32_t e = st.index[j];
    if (e == 0) break;
    const uint32_t home = Home(st, HashId(KeyOf(st, (e & kRowMask) - 1)));
    // The entry at j may move to i unless its home lies cyclically in (i, j].
    const uint32_t dist_home = (j + size - home) % size, dist_i = (j + size - i) % size;
    if (dist_home >= dist_i) {
      st.index[i] = e;
      i = j;
    }
  }
  st.index[i] = 0;
}

inline void SparseTable::Rehash(Stripe& st, uint32_t entries) {
  st.index.assign(entries, 0);
  st.index.shrink_to_fit();
  for (uint32_t r = 0; r < st.size; ++r) IndexInsert(st, HashId(KeyOf(st, r)), r);
}

// Count-min sketch with conservative update: counts one lookup of hash h, returns the new estimate.
inline int SparseTable::CountLookup(Stripe& st, uint64_t h) {
  uint8_t* c[kSketchDepth];
  uint8_t low = 255;
  for (int d = 0; d < kSketchDepth; ++d) {
    const uint32_t x = static_cast<uint32_t>(Mix64(h + 0x632BE59BD9B4E019ULL * (d + 1)));
    c[d] = &st.sketch[static_cast<size_t>(d) * st.sketch_width + Scale(x, st.sketch_width)];
    low = std::min(low, *c[d]);
  }
  const uint8_t next = low == 255 ? 255 : low + 1;
  for (int d = 0; d < kSketchDepth; ++d) *c[d] = std::max(*c[d], next);
  return next;
}

inline int SparseTable::EstimateCount(const Stripe& st, uint64_t h) const {
  uint8_t low = 255;
  for (int d = 0; d < kSketchDepth; ++d) {
    const uint32_t x = static_cast<uint32_t>(Mix64(h + 0x632BE59BD9B4E019ULL * (d + 1)));
    low = std::min(low, st.sketch[static_cast<size_t>(d) * st.sketch_width + Scale(x, st.sketch_width)]);
  }
  return low;
}

// Probabilistic admission: a draw fixed by (id, the tables' clock), so a lookup of the id by any worker at
// the same step gets the same answer, and a run is reproducible.
inline bool SparseTable::AdmitByChance(int64_t id, int64_t clock) const {
  if (spec_.admit_probability >= 1.0f) return true;
  const uint64_t x = Mix64(static_cast<uint64_t>(id) ^ (spec_.init_seed * 0x9E3779B97F4A7C15ULL) ^
                           (static_cast<uint64_t>(clock) * 0xC2B2AE3D27D4EB4FULL) ^ 0x61646D6974ULL);  // "admit"
  return static_cast<double>(x >> 11) * 0x1.0p-53 < spec_.admit_probability;
}

// A row for `id` (not in the table): a new one, or, in a full sub-shard, the CLOCK victim's. Its floats are
// left as they were; its reference bit is clear; it counts as changed.
inline uint32_t SparseTable::Insert(Stripe& st, int64_t id, uint64_t h) {
  uint32_t row;
  if (st.size < st.cap) {
    if (st.size + 1 > kMaxLoad * st.index.size()) {
      // With max_rows, the index is made at its final size at once: growing it step by step left the freed
      // smaller ones behind in the allocator (measured: ~2 bytes of RSS per row).
      const uint64_t grown = st.max_index != UINT32_MAX
                                 ? st.max_index
                                 : std::max<uint64_t>(16, static_cast<uint64_t>(st.index.size() * 1.25) + 1);
      Rehash(st, static_cast<uint32_t>(std::min<uint64_t>(grown, st.max_index)));
    }
    row = st.size;
    if (row == st.capacity) {
      const uint32_t rows = std::min(ChunkRowsOf(st.chunks.size()), st.cap - st.capacity);
      const ChunkLayout l = LayoutOf(rows);
      Chunk c;
      c.memory = Mapping(static_cast<int64_t>(l.bytes));
      char* base = static_cast<char*>(c.memory.data());
      c.rows = rows;
      c.keys = reinterpret_cast<int64_t*>(base);
      c.ref = reinterpret_cast<uint64_t*>(base + l.ref);  // zero: fresh pages
      c.dirty = track_ ? reinterpret_cast<uint64_t*>(base + l.dirty) : nullptr;
      c.stamps = ttl_ ? reinterpret_cast<uint32_t*>(base + l.stamps) : nullptr;
      c.data = base + l.data;
      st.chunks.push_back(std::move(c));
      st.capacity += rows;
    }
    ++st.size;
    // The pages of the new row (and those after it, kPopulateBytes at a time) made resident in one call.
    const auto [k, i] = Locate(row);
    Chunk& c = st.chunks[k];
    const size_t end = static_cast<size_t>(c.data - static_cast<char*>(c.memory.data())) +
                       static_cast<size_t>(i + 1) * row_bytes_;
    if (end > c.populated) {
      const size_t upto = std::min(c.memory.bytes(), (end + kPopulateBytes) / 4096 * 4096);
      const size_t from = c.populated / 4096 * 4096;
      Populate(static_cast<char*>(c.memory.data()) + from, upto - from);
      c.populated = upto;
    }
  } else {
    // CLOCK: the first row whose reference bit is clear, clearing the bits on the way (ends within a sweep).
    while (TestAndClearRef(st, st.hand)) st.hand = st.hand + 1 == st.size ? 0 : st.hand + 1;
    row = st.hand;
    st.hand = st.hand + 1 == st.size ? 0 : st.hand + 1;
    const int64_t victim = KeyOf(st, row);
    IndexErase(st, HashId(victim), row);
    if (track_) st.removed.push_back(victim);
    ++st.evicted;
  }
  const auto [k, i] = Locate(row);
  st.chunks[k].keys[i] = id;
  IndexInsert(st, h, row);
  MarkDirty(st, row);
  return row;
}

// A new row for `id` with its initial values and slots.
inline uint32_t SparseTable::CreateRow(Stripe& st, int64_t id, uint64_t h) {
  const uint32_t row = Insert(st, id, h);
  if (fp32_) {
    float* data = RowData(st, row);
    SparseInitialRow(spec_, id, data);
    optimizer_->InitSlots(data + dim_, dim_);
  } else {
    thread_local std::vector<float> scratch;
    scratch.resize(row_floats_);
    SparseInitialRow(spec_, id, scratch.data());
    optimizer_->InitSlots(scratch.data() + dim_, dim_);
    Store(st, row, scratch.data(), 0);
  }
  ++st.created;
  return row;
}

// Calls fn(stripe, i, hash) for every i in [0, n), grouped by sub-shard (each lock taken once), in order
// within a sub-shard, prefetching the index entries and rows the calls ahead will read (`whole_rows`: the
// rows' slots too).
template <typename Fn>
inline void SparseTable::ForEachByStripe(const int64_t* ids, int64_t n, bool whole_rows, Fn fn) {
  const int stripes = static_cast<int>(stripes_.size());
  if (n == 1) {
    const uint64_t h = HashId(ids[0]);
    Stripe& st = *stripes_[StripeOf(h)];
    absl::MutexLock lock(&st.mu);
    fn(st, 0, h);
    return;
  }
  thread_local std::vector<uint64_t> hashes;
  thread_local std::vector<uint32_t> order;
  int64_t start[kMaxStripes + 1] = {};
  hashes.resize(n);
  order.resize(n);
  for (int64_t i = 0; i < n; ++i) {
    hashes[i] = HashId(ids[i]);
    ++start[StripeOf(hashes[i]) + 1];
  }
  if (stripes == 1) {
    for (int64_t i = 0; i < n; ++i) order[i] = static_cast<uint32_t>(i);
  } else {
    for (int s = 0; s < stripes; ++s) start[s + 1] += start[s];
    int64_t next[kMaxStripes];
    std::copy(start, start + stripes, next);
    for (int64_t i = 0; i < n; ++i) order[next[StripeOf(hashes[i])]++] = static_cast<uint32_t>(i);
  }
  for (int s = 0; s < stripes; ++s) {
    if (start[s] == start[s + 1]) continue;
    Stripe& st = *stripes_[s];
    absl::MutexLock lock(&st.mu);
    const int64_t end = start[s + 1];
    for (int64_t k = start[s]; k < end && k < start[s] + kPrefetchAhead; ++k) PrefetchEntry(st, hashes[order[k]]);
    for (int64_t k = start[s]; k < end && k < start[s] + kPrefetchAhead / 2; ++k) {
      PrefetchRow(st, hashes[order[k]], whole_rows);
    }
    for (int64_t k = start[s]; k < end; ++k) {
      if (k + kPrefetchAhead < end) PrefetchEntry(st, hashes[order[k + kPrefetchAhead]]);
      if (k + kPrefetchAhead / 2 < end) PrefetchRow(st, hashes[order[k + kPrefetchAhead / 2]], whole_rows);
      fn(st, order[k], hashes[order[k]]);
    }
  }
}

// ---- reads and updates ----

void SparseTable::Lookup(const int64_t* ids, int64_t n, WireDtype dtype, void* dst) {
  const int bytes = DtypeBytes(dtype);
  char* out = static_cast<char*>(dst);
  const uint32_t now = ttl_ ? store_->Stamp(spec_) : 0;
  const int64_t clock = store_->clock();
  ForEachByStripe(ids, n, /*whole_rows=*/false, [&](Stripe& st, int64_t i, uint64_t h) {
    ++st.lookups;
    char* row_out = out + i * dim_ * bytes;
    uint32_t row = Find(st, ids[i], h);
    if (row == kNone) {
      if ((spec_.admit_after > 1 && CountLookup(st, h) < spec_.admit_after) || !AdmitByChance(ids[i], clock)) {
        ++st.not_admitted;
        std::memset(row_out, 0, static_cast<size_t>(dim_) * bytes);
        return;
      }
      row = CreateRow(st, ids[i], h);
    } else {
      SetRef(st, row);  // looked up again: a second chance
    }
    if (ttl_) Touch(st, row, now);
    ReadValues(st, row, dtype, row_out);
  });
}

void SparseTable::Peek(const int64_t* ids, int64_t n, WireDtype dtype, void* dst) {
  const int bytes = DtypeBytes(dtype);
  char* out = static_cast<char*>(dst);
  std::vector<float> initial(dim_);
  const int64_t clock = store_->clock();
  ForEachByStripe(ids, n, /*whole_rows=*/false, [&](Stripe& st, int64_t i, uint64_t h) {
    char* row_out = out + i * dim_ * bytes;
    const uint32_t row = Find(st, ids[i], h);
    if (row != kNone) {
      ReadValues(st, row, dtype, row_out);
    } else if ((spec_.admit_after > 1 && EstimateCount(st, h) + 1 < spec_.admit_after) ||
               !AdmitByChance(ids[i], clock)) {
      std::memset(row_out, 0, static_cast<size_t>(dim_) * bytes);  // a lookup now would not admit it
    } else {
      SparseInitialRow(spec_, ids[i], initial.data());
      EncodeFloats(dtype, initial.data(), dim_, row_out);
    }
  });
}

void SparseTable::Apply(const SparseOptimizer::Step& step, int64_t step_number, const int64_t* ids, int64_t n,
                        const float* grads, float scale) {
  const bool fixed = spec_.rows > 0;
  const uint32_t now = ttl_ ? store_->Stamp(spec_) : 0;
  thread_local std::vector<float> scratch;
  scratch.resize(row_floats_);
  ForEachByStripe(ids, n, /*whole_rows=*/true, [&](Stripe& st, int64_t i, uint64_t h) {
    uint32_t row = Find(st, ids[i], h);
    if (row == kNone) {
      if (!fixed || (spec_.admit_after > 1 && EstimateCount(st, h) < spec_.admit_after)) {
        ++st.dropped;
        return;
      }
      row = CreateRow(st, ids[i], h);
    }
    float* data = Floats(st, row, scratch.data());
    optimizer_->ApplyRow(step, scale, grads + i * dim_, data, dim_);
    if (!fp32_) Store(st, row, data, RoundingSeed(ids[i], step_number));
    if (ttl_) Touch(st, row, now);
    MarkDirty(st, row);
    ++st.updates;
  });
}

// Sets the rows of ids[0, n) to `src` (n * dim values of `dtype`), creating them, with fresh optimizer slots.
void SparseTable::Write(const int64_t* ids, int64_t n, WireDtype dtype, const void* src) {
  const char* in = static_cast<const char*>(src);
  const int64_t row_bytes = int64_t{dim_} * DtypeBytes(dtype);
  thread_local std::vector<float> scratch;
  scratch.resize(row_floats_);
  const uint32_t now = ttl_ ? store_->Stamp(spec_) : 0;
  ForEachByStripe(ids, n, /*whole_rows=*/true, [&](Stripe& st, int64_t i, uint64_t h) {
    uint32_t row = Find(st, ids[i], h);
    if (row == kNone) {
      row = Insert(st, ids[i], h);
      ++st.created;
    }
    float* data = fp32_ ? RowData(st, row) : scratch.data();
    DecodeFloats(dtype, in + i * row_bytes, dim_, data);
    optimizer_->InitSlots(data + dim_, dim_);
    if (!fp32_) Store(st, row, data, 0);
    if (ttl_) Touch(st, row, now);
    MarkDirty(st, row);
  });
}

// ---- expiry and restore ----

// Expiry: removes the rows whose stamp is more than `ttl` behind `now` (stamps as Stamp() makes them).
// Returns the rows removed.
int64_t SparseTable::Expire(uint32_t now, uint32_t ttl) {
  int64_t removed = 0;
  for (auto& stp : stripes_) {
    Stripe& st = *stp;
    absl::MutexLock lock(&st.mu);
    for (uint32_t r = 0; r < st.size;) {
      if (static_cast<uint32_t>(now - StampOf(st, r)) <= ttl) {
        ++r;
        continue;
      }
      const int64_t id = KeyOf(st, r);
      IndexErase(st, HashId(id), r);
      if (track_) st.removed.push_back(id);
      const uint32_t last = st.size - 1;
      if (r != last) MoveRow(st, last, r);  // rows [0, size) stay the live ones; r is looked at again
      ClearBits(st, last);
      --st.size;
      ++st.expired;
      ++removed;
    }
    if (st.hand >= st.size) st.hand = 0;
    // Chunks no row reaches any more go back to the system (RSS falls with the rows held).
    while (!st.chunks.empty() && st.capacity - st.chunks.back().rows >= st.size) {
      st.capacity -= st.chunks.back().rows;
      st.chunks.pop_back();
    }
  }
  return removed;
}

// Replaces the rows (the state was checked by the caller). Returns the rows evicted on the way.
int64_t SparseTable::Import(const SparseTableState& state) {
  Clear();
  const int slots = optimizer_->num_slots();
  int64_t evicted = 0;
  std::vector<float> scratch(row_floats_);
  const uint32_t now = ttl_ ? store_->Stamp(spec_) : 0;
  for (size_t i = 0; i < state.ids.size(); ++i) {
    const uint64_t h = HashId(state.ids[i]);
    Stripe& st = *stripes_[StripeOf(h)];
    absl::MutexLock lock(&st.mu);
    const int64_t before = st.evicted;
    // A lookup running meanwhile (allowed: see the header) may have made this id's row since Clear: reuse it,
    // never index an id twice.
    uint32_t row = Find(st, state.ids[i], h);
    if (row == kNone) row = Insert(st, state.ids[i], h);
    evicted += st.evicted - before;
    float* data = fp32_ ? RowData(st, row) : scratch.data();
    std::memcpy(data, state.values.data() + i * dim_, sizeof(float) * dim_);
    for (int k = 0; k < slots; ++k) {
      std::memcpy(data + dim_ * (1 + k), state.slots[k].data() + i * dim_, sizeof(float) * dim_);
    }
    if (!fp32_) Store(st, row, data, 0);
    // Restored rows count as touched now: an expiry clock starts afresh with the restore.
    if (ttl_) Touch(st, row, now);
  }
  // Restored rows are not "created" by this run's training.
  for (auto& st : stripes_) {
    absl::MutexLock lock(&st->mu);
    st->evicted = 0;
  }
  ClearChanges();
  return evicted;
}

}  // namespace dtrain::ps::sparse_internal
