// One table's shard on a ps task, the rows of SparseStore (sparse_store.h: its header says how rows are laid
// out, indexed, evicted, admitted and expired). Internal to dtrain_ps_core: SparseStore is its only user.
// Split over sparse_table.cc (reads, updates and the row machinery they share) and sparse_table_state.cc
// (statistics, checkpoints and deltas).
//
// Thread-safety: as SparseStore's header says for the calls of the same names; each sub-shard (Stripe) has
// its own lock, taken once per call.
#ifndef DTRAIN_PS_CORE_SPARSE_TABLE_H_
#define DTRAIN_PS_CORE_SPARSE_TABLE_H_

#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "glog/logging.h"
#include "ps/core/row_codec.h"
#include "ps/core/sparse_optimizer.h"
#include "ps/core/sparse_store.h"

namespace dtrain::ps::sparse_internal {


// The hash of an id inside a task: independent of ShardOfId's (another salt). Its high 32 bits pick the
// sub-shard (their top bits) and the tag (their low 8 bits), its low 32 bits the index position.
inline uint64_t HashId(int64_t id) { return Mix64(static_cast<uint64_t>(id) ^ 0xA0761D6478BD642FULL); }
inline uint32_t Scale(uint32_t x, uint32_t n) { return static_cast<uint32_t>((static_cast<uint64_t>(x) * n) >> 32); }

constexpr int kMaxStripes = 32;
constexpr int64_t kRowsPerStripeForSplit = 1024;  // with max_rows, a sub-shard per this many rows (up to 32)
constexpr uint32_t kRowBits = 24;
constexpr uint32_t kRowMask = (1u << kRowBits) - 1;
constexpr uint32_t kMaxStripeRows = kRowMask - 1;  // row + 1 must fit kRowBits
constexpr double kMaxLoad = 0.9;
constexpr int kSketchDepth = 4;
// Chunks: 16, 32, ..., 8192 rows, then 8192 each (the last one of a sub-shard with max_rows only as large as
// its share needs). Each is its own anonymous mapping: pages are resident once rows reach them, so a chunk
// costs what its rows use (plus a page at most), whatever its size, and chunks never fragment the heap the
// messages' buffers come and go in (with chunks from malloc, RSS grew ~1.4 bytes per row more than the rows).
constexpr uint32_t kFirstChunkRows = 16;
constexpr int kGeometricChunks = 10;  // 16 << 9 == 8192
constexpr uint32_t kChunkRows = kFirstChunkRows << (kGeometricChunks - 1);
constexpr uint32_t kGeometricEnd = kFirstChunkRows * ((1u << (kGeometricChunks - 1)) - 1);  // the last one's start
// The rows' pages are made resident this many bytes at a time (one madvise instead of a page fault per page:
// first touches of fresh pages were a fifth of an insert's time).
constexpr size_t kPopulateBytes = size_t{64} << 10;
// Lookups and updates prefetch the index entry of the id this many ids ahead, and the row of the id half as far.
constexpr int64_t kPrefetchAhead = 16;

inline uint32_t ChunkRowsOf(size_t k) { return k < kGeometricChunks ? kFirstChunkRows << k : kChunkRows; }
inline size_t Words(uint32_t rows) { return (rows + 63) / 64; }

// Makes [p, p + bytes) resident at once (where the kernel can; otherwise pages fault in as they are touched).
void Populate(void* p, size_t bytes);

// Zeroed memory of its own mapping (untouched pages are not resident). Move-only.
class Mapping {
 public:
  Mapping() = default;
  explicit Mapping(int64_t bytes) : bytes_(static_cast<size_t>(bytes)) {
    void* p = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    CHECK(p != MAP_FAILED) << "sparse table: out of memory mapping " << bytes << " bytes for rows";
    data_ = p;
  }
  Mapping(Mapping&& o) noexcept : data_(std::exchange(o.data_, nullptr)), bytes_(o.bytes_) {}
  Mapping& operator=(Mapping&& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  ~Mapping() {
    if (data_ != nullptr) munmap(data_, bytes_);
  }
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// One table's shard on this task: kMaxStripes (or fewer) independently locked sub-shards.
//
// A row is [values: dim][slots: num_slots * dim] in the table's row_dtype / slot_dtype (all fp32: the floats
// are computed on in place; otherwise decoded into a scratch row and encoded back). Per row besides: its id, a
// reference bit (CLOCK), with expiry a 32-bit stamp (the step or second it was last touched), with change
// tracking a dirty bit.
class SparseTable {
 public:
  SparseTable(const SparseTableSpec& spec, const SparseOptimizer* optimizer, int64_t max_rows, bool track_changes,
              const SparseStore* store);

  const SparseTableSpec& spec() const { return spec_; }
  int64_t max_rows() const { return max_rows_; }

  // ---- reads and updates (sparse_table.cc) ----
  void Lookup(const int64_t* ids, int64_t n, WireDtype dtype, void* dst);
  void Peek(const int64_t* ids, int64_t n, WireDtype dtype, void* dst);
  void Apply(const SparseOptimizer::Step& step, int64_t step_number, const int64_t* ids, int64_t n,
             const float* grads, float scale);
  // Sets the rows of ids[0, n) to `src` (n * dim values of `dtype`), creating them, with fresh optimizer slots.
  void Write(const int64_t* ids, int64_t n, WireDtype dtype, const void* src);

  // ---- state: statistics, checkpoints, deltas, expiry (sparse_table_state.cc; Expire and Import in
  // sparse_table.cc, beside the row machinery they use) ----
  SparseTableStats Stats() const;
  // Bytes per row beyond the index: id, row, stamp, bits.
  int64_t PerRowBytes() const { return 8 + row_bytes_ + (ttl_ ? 4 : 0); }
  int64_t MemoryBytes() const;
  SparseTableState Export() const;
  // Deltas: the rows changed since the last call (their values and slots now) and the ids removed meanwhile
  // (with change tracking; else nothing). Clears both.
  void TakeChanges(SparseTableState* changed, std::vector<int64_t>* removed);
  // Forgets the changes so far (after a restore: the state restored is the baseline of the next delta).
  void ClearChanges();
  void Clear();
  // Expiry: removes the rows whose stamp is more than `ttl` behind `now` (stamps as Stamp() makes them).
  // Returns the rows removed.
  int64_t Expire(uint32_t now, uint32_t ttl);
  // Replaces the rows (the state was checked by the caller). Returns the rows evicted on the way.
  int64_t Import(const SparseTableState& state);

 private:
  static constexpr uint32_t kNone = UINT32_MAX;

  struct Chunk {
    Mapping memory;  // ids | reference bits | dirty bits (tracking) | stamps (expiry) | rows
    uint32_t rows = 0;
    int64_t* keys = nullptr;
    uint64_t* ref = nullptr;
    uint64_t* dirty = nullptr;
    uint32_t* stamps = nullptr;
    char* data = nullptr;
    size_t populated = 0;  // bytes from the start made resident
  };
  struct Stripe {
    mutable absl::Mutex mu;
    std::vector<Chunk> chunks ABSL_GUARDED_BY(mu);
    std::vector<uint32_t> index ABSL_GUARDED_BY(mu);  // 0: empty; else tag << 24 | (row + 1)
    std::vector<uint8_t> sketch ABSL_GUARDED_BY(mu);  // [depth][sketch_width] counters, empty without admission
    uint32_t sketch_width = 0;
    uint32_t size ABSL_GUARDED_BY(mu) = 0;      // rows in use: [0, size) are all live
    uint32_t capacity ABSL_GUARDED_BY(mu) = 0;  // rows allocated
    uint32_t cap = 0;                           // most rows (the sub-shard's share of max_rows)
    uint32_t max_index = 0;                     // the index never grows beyond this many entries
    uint32_t hand ABSL_GUARDED_BY(mu) = 0;      // CLOCK
    int64_t created ABSL_GUARDED_BY(mu) = 0, evicted ABSL_GUARDED_BY(mu) = 0, expired ABSL_GUARDED_BY(mu) = 0;
    int64_t not_admitted ABSL_GUARDED_BY(mu) = 0, dropped ABSL_GUARDED_BY(mu) = 0;
    int64_t lookups ABSL_GUARDED_BY(mu) = 0, updates ABSL_GUARDED_BY(mu) = 0;
    std::vector<int64_t> removed ABSL_GUARDED_BY(mu);  // tracking: ids removed since the last TakeChanges
  };

  // The layout of a chunk of `rows` rows: offsets of its parts, and its size.
  struct ChunkLayout {
    size_t ref = 0, dirty = 0, stamps = 0, data = 0, bytes = 0;
  };
  ChunkLayout LayoutOf(uint32_t rows) const {
    ChunkLayout l;
    l.ref = static_cast<size_t>(rows) * 8;
    l.dirty = l.ref + Words(rows) * 8;
    l.stamps = l.dirty + (track_ ? Words(rows) * 8 : 0);
    l.data = l.stamps + (ttl_ ? (static_cast<size_t>(rows) * 4 + 7) / 8 * 8 : 0);
    l.bytes = l.data + static_cast<size_t>(rows) * row_bytes_;
    return l;
  }
  int StripeOf(uint64_t h) const { return static_cast<int>(Scale(static_cast<uint32_t>(h >> 32), stripes_.size())); }
  static uint32_t Tag(uint64_t h) { return static_cast<uint32_t>(h >> 32) & 0xff; }

  // Row r's chunk and position in it.
  static std::pair<uint32_t, uint32_t> Locate(uint32_t r) {
    if (r < kGeometricEnd) {
      const uint32_t k = 31 - __builtin_clz((r / kFirstChunkRows) + 1);
      return {k, r - kFirstChunkRows * ((1u << k) - 1)};
    }
    return {kGeometricChunks - 1 + (r - kGeometricEnd) / kChunkRows, (r - kGeometricEnd) % kChunkRows};
  }
  char* RowBytes(const Stripe& st, uint32_t r) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(st.mu) {
    const auto [k, i] = Locate(r);
    return st.chunks[k].data + static_cast<size_t>(i) * row_bytes_;
  }
  // All-fp32 tables only: the row's floats in place.
  float* RowData(const Stripe& st, uint32_t r) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(st.mu) {
    return reinterpret_cast<float*>(RowBytes(st, r));
  }
  // The row's values and slots as fp32: in place (all-fp32 tables), else decoded into `scratch`.
  float* Floats(const Stripe& st, uint32_t r, float* scratch) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(st.mu) {
    if (fp32_) return RowData(st, r);
    const char* p = RowBytes(st, r);
    DecodeRow(spec_.row_dtype, p, dim_, scratch);
    if (row_floats_ > dim_) DecodeRow(spec_.slot_dtype, p + value_bytes_, row_floats_ - dim_, scratch + dim_);
    return scratch;
  }
  // Writes a row decoded by Floats back (16-bit tables), rounded stochastically with `seed` (0: to nearest).
  void Store(const Stripe& st, uint32_t r, const float* row, uint64_t seed) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(st.mu) {
    char* p = RowBytes(st, r);
    if (seed == 0) {
      EncodeRowNearest(spec_.row_dtype, row, dim_, p);
      if (row_floats_ > dim_) EncodeRowNearest(spec_.slot_dtype, row + dim_, row_floats_ - dim_, p + value_bytes_);
    } else {
      EncodeRowStochastic(spec_.row_dtype, row, dim_, p, seed);
      if (row_floats_ > dim_) {
        EncodeRowStochastic(spec_.slot_dtype, row + dim_, row_floats_ - dim_, p + value_bytes_, Mix64(seed));
      }
    }
  }
  // The row's values as `dtype` at `out` (what a pull sends).
  void ReadValues(const Stripe& st, uint32_t r, WireDtype dtype, char* out) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(st.mu) {
    const char* p = RowBytes(st, r);
    if (spec_.row_dtype == RowDtype::kF32) {
      if (dtype == WireDtype::kF32) {
        // Fixed-size copies (inlined: a call per row cost a tenth of a lookup).
        const int bytes = 4 * dim_;
        int b = 0;
        for (; b + 64 <= bytes; b += 64) std::memcpy(out + b, p + b, 64);
        for (; b < bytes; b += 4) std::memcpy(out + b, p + b, 4);
      } else {
        EncodeFloats(dtype, reinterpret_cast<const float*>(p), dim_, out);
      }
    } else if (WireDtypeOf(spec_.row_dtype) == dtype) {
      std::memcpy(out, p, static_cast<size_t>(value_bytes_));
    } else {
      thread_local std::vector<float> values;
      values.resize(dim_);
      DecodeRow(spec_.row_dtype, p, dim_, values.data());
      EncodeFloats(dtype, values.data(), dim_, out);
    }
  }
  // Stochastic rounding's draws for row `id` updated at `step` (never 0: 0 asks for rounding to nearest).
  static uint64_t RoundingSeed(int64_t id, int64_t step) {
    return Mix64(static_cast<uint64_t>(id) ^ (static_cast<uint64_t>(step) * 0xD1B54A32D192ED03ULL)) | 1;
  }

  void Reserve(SparseTableState* out, int64_t rows) const {
    out->ids.reserve(rows);
    out->values.reserve(rows * dim_);
    for (auto& s : out->slots) s.reserve(rows * dim_);
  }
  // Appends row r (its id, values, slots as fp32) to `out`.
  void AppendRow(const Stripe& st, uint32_t r, SparseTableState* out, float* scratch) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(st.mu) {
    out->ids.push_back(KeyOf(st, r));
    const float* row = Floats(st, r, scratch);
    out->values.insert(out->values.end(), row, row + dim_);
    for (size_t k = 0; k < out->slots.size(); ++k) {
      out->slots[k].insert(out->slots[k].end(), row + dim_ * (1 + k), row + dim_ * (2 + k));
    }
  }

  static int64_t KeyOf(const Stripe& st, uint32_t r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(st.mu) {
    const auto [k, i] = Locate(r);
    return st.chunks[k].keys[i];
  }
  static void SetRef(Stripe& st, uint32_t r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(st.mu) {
    const auto [k, i] = Locate(r);
    st.chunks[k].ref[i / 64] |= uint64_t{1} << (i % 64);
  }
  void MarkDirty(Stripe& st, uint32_t r) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(st.mu) {
    if (!track_) return;
    const auto [k, i] = Locate(r);
    st.chunks[k].dirty[i / 64] |= uint64_t{1} << (i % 64);
  }
  void Touch(Stripe& st, uint32_t r, uint32_t now) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(st.mu) {
    const auto [k, i] = Locate(r);
    st.chunks[k].stamps[i] = now;
  }
  uint32_t StampOf(const Stripe& st, uint32_t r) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(st.mu) {
    const auto [k, i] = Locate(r);
    return st.chunks[k].stamps[i];
  }
  // Clears row r's reference bit; returns whether it was set.
  static bool TestAndClearRef(Stripe& st, uint32_t r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(st.mu) {
    const auto [k, i] = Locate(r);
    uint64_t& word = st.chunks[k].ref[i / 64];
    const uint64_t bit = uint64_t{1} << (i % 64);
    const bool was = (word & bit) != 0;
    word &= ~bit;
    return was;
  }
  // Clears row r's reference and dirty bits (a slot left empty).
  void ClearBits(Stripe& st, uint32_t r) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(st.mu) {
    const auto [k, i] = Locate(r);
    const uint64_t keep = ~(uint64_t{1} << (i % 64));
    st.chunks[k].ref[i / 64] &= keep;
    if (track_) st.chunks[k].dirty[i / 64] &= keep;
  }

  uint32_t Home(const Stripe& st, uint64_t h) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(st.mu) {
    return Scale(static_cast<uint32_t>(h), static_cast<uint32_t>(st.index.size()));
  }
  uint32_t Find(const Stripe& st, int64_t id, uint64_t h) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(st.mu) {
    if (st.index.empty()) return kNone;
    const uint32_t size = static_cast<uint32_t>(st.index.size());
    const uint32_t tag = Tag(h);
    for (uint32_t p = Home(st, h);; p = p + 1 == size ? 0 : p + 1) {
      const uint32_t e = st.index[p];
      if (e == 0) return kNone;
      if ((e >> kRowBits) == tag && KeyOf(st, (e & kRowMask) - 1) == id) return (e & kRowMask) - 1;
    }
  }
  // Prefetches what Find(h) reads first: the index entry at h's home.
  void PrefetchEntry(const Stripe& st, uint64_t h) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(st.mu) {
    if (!st.index.empty()) __builtin_prefetch(&st.index[Home(st, h)]);
  }
  // Prefetches the row Find(h) most likely finds (the first entry with h's tag; its entry is in cache by now):
  // its id, its floats (`whole`: values and slots, else the values) and its stamp.
  void PrefetchRow(const Stripe& st, uint64_t h, bool whole) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(st.mu) {
    if (st.index.empty()) return;
    const uint32_t size = static_cast<uint32_t>(st.index.size());
    const uint32_t tag = Tag(h);
    uint32_t p = Home(st, h);
    for (int probes = 0; probes < 8; ++probes, p = p + 1 == size ? 0 : p + 1) {
      const uint32_t e = st.index[p];
      if (e == 0) return;
      if ((e >> kRowBits) != tag) continue;
      const uint32_t r = (e & kRowMask) - 1;
      if (r >= st.size) return;
      const auto [k, i] = Locate(r);
      const Chunk& c = st.chunks[k];
      __builtin_prefetch(c.keys + i);
      const char* row = c.data + static_cast<size_t>(i) * row_bytes_;
      const int bytes = whole ? row_bytes_ : value_bytes_;
      for (int b = 0; b < bytes; b += 64) __builtin_prefetch(row + b, 1);
      if (ttl_) __builtin_prefetch(c.stamps + i, 1);
      return;
    }
  }

  // ---- the row machinery (sparse_table.cc) ----
  // Moves row `from` (live) to slot `to` (whose row was removed from the index): id, floats, stamp, bits, and
  // its index entry.
  void MoveRow(Stripe& st, uint32_t from, uint32_t to) ABSL_EXCLUSIVE_LOCKS_REQUIRED(st.mu);
  // Puts row `row` of hash h into the index (its id is not there).
  void IndexInsert(Stripe& st, uint64_t h, uint32_t row) ABSL_EXCLUSIVE_LOCKS_REQUIRED(st.mu);
  // Removes row `row` (of hash h) from the index: backward-shift deletion keeps every probe sequence unbroken.
  void IndexErase(Stripe& st, uint64_t h, uint32_t row) ABSL_EXCLUSIVE_LOCKS_REQUIRED(st.mu);
  void Rehash(Stripe& st, uint32_t entries) ABSL_EXCLUSIVE_LOCKS_REQUIRED(st.mu);
  // Count-min sketch with conservative update: counts one lookup of hash h, returns the new estimate.
  int CountLookup(Stripe& st, uint64_t h) ABSL_EXCLUSIVE_LOCKS_REQUIRED(st.mu);
  int EstimateCount(const Stripe& st, uint64_t h) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(st.mu);
  // Probabilistic admission: a draw fixed by (id, the tables' clock), so a lookup of the id by any worker at
  // the same step gets the same answer, and a run is reproducible.
  bool AdmitByChance(int64_t id, int64_t clock) const;
  // A row for `id` (not in the table): a new one, or, in a full sub-shard, the CLOCK victim's. Its floats are
  // left as they were; its reference bit is clear; it counts as changed.
  uint32_t Insert(Stripe& st, int64_t id, uint64_t h) ABSL_EXCLUSIVE_LOCKS_REQUIRED(st.mu);
  // A new row for `id` with its initial values and slots.
  uint32_t CreateRow(Stripe& st, int64_t id, uint64_t h) ABSL_EXCLUSIVE_LOCKS_REQUIRED(st.mu);
  // Calls fn(stripe, i, hash) for every i in [0, n), grouped by sub-shard (each lock taken once), in order
  // within a sub-shard, prefetching the index entries and rows the calls ahead will read (`whole_rows`: the
  // rows' slots too).
  template <typename Fn>
  void ForEachByStripe(const int64_t* ids, int64_t n, bool whole_rows, Fn fn);


  const SparseTableSpec spec_;
  const SparseOptimizer* optimizer_;
  const SparseStore* store_;  // the clock
  const int dim_;
  const int row_floats_;
  const bool fp32_;        // values and slots fp32: rows computed on in place
  const int value_bytes_;  // of a row's values
  const int row_bytes_;    // of a row's values and slots
  const int64_t max_rows_;
  const bool track_;  // change tracking (deltas)
  const bool ttl_;    // expiry: rows carry stamps
  std::vector<std::unique_ptr<Stripe>> stripes_;
};

}  // namespace dtrain::ps::sparse_internal

#endif  // DTRAIN_PS_CORE_SPARSE_TABLE_H_
