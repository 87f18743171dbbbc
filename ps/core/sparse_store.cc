#include "ps/core/sparse_store.h"

#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "glog/logging.h"
#include "ps/core/row_codec.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14
#endif

namespace dtrain::ps {
namespace {

// The hash of an id inside a task: independent of ShardOfId's (another salt). Its high 32 bits pick the
// sub-shard (their top bits) and the tag (their low 8 bits), its low 32 bits the index position.
uint64_t HashId(int64_t id) { return Mix64(static_cast<uint64_t>(id) ^ 0xA0761D6478BD642FULL); }
uint32_t Scale(uint32_t x, uint32_t n) { return static_cast<uint32_t>((static_cast<uint64_t>(x) * n) >> 32); }

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

uint32_t ChunkRowsOf(size_t k) { return k < kGeometricChunks ? kFirstChunkRows << k : kChunkRows; }
size_t Words(uint32_t rows) { return (rows + 63) / 64; }

// Makes [p, p + bytes) resident at once (where the kernel can; otherwise pages fault in as they are touched).
void Populate(void* p, size_t bytes) {
  static bool supported = true;  // a benign race: at worst a few more failing calls
  if (!supported || bytes == 0) return;
  if (madvise(p, bytes, MADV_POPULATE_WRITE) != 0 && (errno == EINVAL || errno == ENOSYS)) supported = false;
}

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

}  // namespace

// One table's shard on this task: kMaxStripes (or fewer) independently locked sub-shards.
//
// A row is [values: dim][slots: num_slots * dim] in the table's row_dtype / slot_dtype (all fp32: the floats
// are computed on in place; otherwise decoded into a scratch row and encoded back). Per row besides: its id, a
// reference bit (CLOCK), with expiry a 32-bit stamp (the step or second it was last touched), with change
// tracking a dirty bit.
class SparseTable {
 public:
  SparseTable(const SparseTableSpec& spec, const SparseOptimizer* optimizer, int64_t max_rows, bool track_changes,
              const SparseStore* store)
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

  const SparseTableSpec& spec() const { return spec_; }
  int64_t max_rows() const { return max_rows_; }

  void Lookup(const int64_t* ids, int64_t n, WireDtype dtype, void* dst) {
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
        row = Create(st, ids[i], h);
      } else {
        SetRef(st, row);  // looked up again: a second chance
      }
      if (ttl_) Touch(st, row, now);
      ReadValues(st, row, dtype, row_out);
    });
  }

  void Peek(const int64_t* ids, int64_t n, WireDtype dtype, void* dst) {
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

  void Apply(const SparseOptimizer::Step& step, int64_t step_number, const int64_t* ids, int64_t n,
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
        row = Create(st, ids[i], h);
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
  void Write(const int64_t* ids, int64_t n, WireDtype dtype, const void* src) {
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

  SparseTableStats Stats() const {
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

  // Bytes per row beyond the index: id, row, stamp, bits.
  int64_t PerRowBytes() const { return 8 + row_bytes_ + (ttl_ ? 4 : 0); }

  int64_t MemoryBytes() const {
    int64_t bytes = 0;
    for (const auto& st : stripes_) {
      absl::MutexLock lock(&st->mu);
      // The rows' pages are resident as rows reach them (Mapping): count what the rows use.
      bytes += static_cast<int64_t>(st->size) * PerRowBytes() + (st->size + 7) / 8 * (track_ ? 2 : 1);
      bytes += static_cast<int64_t>(st->index.size()) * 4 + static_cast<int64_t>(st->sketch.size());
    }
    return bytes;
  }

  SparseTableState Export() const {
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
  void TakeChanges(SparseTableState* changed, std::vector<int64_t>* removed) {
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
  void ClearChanges() {
    for (auto& st : stripes_) {
      absl::MutexLock lock(&st->mu);
      st->removed.clear();
      for (Chunk& c : st->chunks) {
        if (c.dirty != nullptr) std::fill(c.dirty, c.dirty + Words(c.rows), 0);
      }
    }
  }

  // Expiry: removes the rows whose stamp is more than `ttl` behind `now` (stamps as Stamp() makes them).
  // Returns the rows removed.
  int64_t Expire(uint32_t now, uint32_t ttl) {
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
  int64_t Import(const SparseTableState& state) {
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

  void Clear() {
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
  // Moves row `from` (live) to slot `to` (whose row was removed from the index): id, floats, stamp, bits, and
  // its index entry.
  void MoveRow(Stripe& st, uint32_t from, uint32_t to) ABSL_EXCLUSIVE_LOCKS_REQUIRED(st.mu) {
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
  // Puts row `row` of hash h into the index (its id is not there).
  void IndexInsert(Stripe& st, uint64_t h, uint32_t row) ABSL_EXCLUSIVE_LOCKS_REQUIRED(st.mu) {
    const uint32_t size = static_cast<uint32_t>(st.index.size());
    uint32_t p = Home(st, h);
    while (st.index[p] != 0) p = p + 1 == size ? 0 : p + 1;
    st.index[p] = (Tag(h) << kRowBits) | (row + 1);
  }
  // Removes row `row` (of hash h) from the index: backward-shift deletion keeps every probe sequence unbroken.
  void IndexErase(Stripe& st, uint64_t h, uint32_t row) ABSL_EXCLUSIVE_LOCKS_REQUIRED(st.mu) {
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
  void Rehash(Stripe& st, uint32_t entries) ABSL_EXCLUSIVE_LOCKS_REQUIRED(st.mu) {
    st.index.assign(entries, 0);
    st.index.shrink_to_fit();
    for (uint32_t r = 0; r < st.size; ++r) IndexInsert(st, HashId(KeyOf(st, r)), r);
  }

  // Count-min sketch with conservative update: counts one lookup of hash h, returns the new estimate.
  int CountLookup(Stripe& st, uint64_t h) ABSL_EXCLUSIVE_LOCKS_REQUIRED(st.mu) {
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
  int EstimateCount(const Stripe& st, uint64_t h) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(st.mu) {
    uint8_t low = 255;
    for (int d = 0; d < kSketchDepth; ++d) {
      const uint32_t x = static_cast<uint32_t>(Mix64(h + 0x632BE59BD9B4E019ULL * (d + 1)));
      low = std::min(low, st.sketch[static_cast<size_t>(d) * st.sketch_width + Scale(x, st.sketch_width)]);
    }
    return low;
  }
  // Probabilistic admission: a draw fixed by (id, the tables' clock), so a lookup of the id by any worker at
  // the same step gets the same answer, and a run is reproducible.
  bool AdmitByChance(int64_t id, int64_t clock) const {
    if (spec_.admit_probability >= 1.0f) return true;
    const uint64_t x = Mix64(static_cast<uint64_t>(id) ^ (spec_.init_seed * 0x9E3779B97F4A7C15ULL) ^
                             (static_cast<uint64_t>(clock) * 0xC2B2AE3D27D4EB4FULL) ^ 0x61646D6974ULL);  // "admit"
    return static_cast<double>(x >> 11) * 0x1.0p-53 < spec_.admit_probability;
  }

  // A row for `id` (not in the table): a new one, or, in a full sub-shard, the CLOCK victim's. Its floats are
  // left as they were; its reference bit is clear; it counts as changed.
  uint32_t Insert(Stripe& st, int64_t id, uint64_t h) ABSL_EXCLUSIVE_LOCKS_REQUIRED(st.mu) {
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
  uint32_t Create(Stripe& st, int64_t id, uint64_t h) ABSL_EXCLUSIVE_LOCKS_REQUIRED(st.mu) {
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
  void ForEachByStripe(const int64_t* ids, int64_t n, bool whole_rows, Fn fn) {
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
