#include "ps/core/sparse_store.h"

#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"

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

uint32_t ChunkRowsOf(size_t k) { return k < kGeometricChunks ? kFirstChunkRows << k : kChunkRows; }

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

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace

// One table's shard on this task: kMaxStripes (or fewer) independently locked sub-shards.
class SparseTable {
 public:
  SparseTable(const SparseTableSpec& spec, const SparseOptimizer* optimizer, int64_t max_rows)
      : spec_(spec), optimizer_(optimizer), dim_(spec.dim),
        row_floats_(spec.dim * (1 + optimizer->num_slots())), max_rows_(max_rows) {
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
    ForEachByStripe(ids, n, [&](Stripe& st, int64_t i, uint64_t h) {
      ++st.lookups;
      char* row_out = out + i * dim_ * bytes;
      uint32_t row = Find(st, ids[i], h);
      if (row == kNone) {
        if (spec_.admit_after > 1 && CountLookup(st, h) < spec_.admit_after) {
          ++st.not_admitted;
          std::memset(row_out, 0, static_cast<size_t>(dim_) * bytes);
          return;
        }
        row = Create(st, ids[i], h);
      } else {
        SetRef(st, row);  // looked up again: a second chance
      }
      EncodeFloats(dtype, RowData(st, row), dim_, row_out);
    });
  }

  void Peek(const int64_t* ids, int64_t n, WireDtype dtype, void* dst) {
    const int bytes = DtypeBytes(dtype);
    char* out = static_cast<char*>(dst);
    std::vector<float> initial(dim_);
    ForEachByStripe(ids, n, [&](Stripe& st, int64_t i, uint64_t h) {
      char* row_out = out + i * dim_ * bytes;
      const uint32_t row = Find(st, ids[i], h);
      if (row != kNone) {
        EncodeFloats(dtype, RowData(st, row), dim_, row_out);
      } else if (spec_.admit_after > 1 && EstimateCount(st, h) + 1 < spec_.admit_after) {
        std::memset(row_out, 0, static_cast<size_t>(dim_) * bytes);  // a lookup now would not admit it
      } else {
        SparseInitialRow(spec_, ids[i], initial.data());
        EncodeFloats(dtype, initial.data(), dim_, row_out);
      }
    });
  }

  void Apply(const SparseOptimizer::Step& step, const int64_t* ids, int64_t n, const float* grads, float scale) {
    const bool fixed = spec_.rows > 0;
    ForEachByStripe(ids, n, [&](Stripe& st, int64_t i, uint64_t h) {
      uint32_t row = Find(st, ids[i], h);
      if (row == kNone) {
        if (!fixed || (spec_.admit_after > 1 && EstimateCount(st, h) < spec_.admit_after)) {
          ++st.dropped;
          return;
        }
        row = Create(st, ids[i], h);
      }
      optimizer_->ApplyRow(step, scale, grads + i * dim_, RowData(st, row), dim_);
      ++st.updates;
    });
  }

  // Sets the rows of ids[0, n) to `src` (n * dim values of `dtype`), creating them, with fresh optimizer slots.
  void Write(const int64_t* ids, int64_t n, WireDtype dtype, const void* src) {
    const char* in = static_cast<const char*>(src);
    const int64_t row_bytes = int64_t{dim_} * DtypeBytes(dtype);
    ForEachByStripe(ids, n, [&](Stripe& st, int64_t i, uint64_t h) {
      uint32_t row = Find(st, ids[i], h);
      if (row == kNone) {
        row = Insert(st, ids[i], h);
        ++st.created;
      }
      float* data = RowData(st, row);
      DecodeFloats(dtype, in + i * row_bytes, dim_, data);
      optimizer_->InitSlots(data + dim_, dim_);
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
      s.not_admitted += st->not_admitted;
      s.dropped_gradients += st->dropped;
      s.lookups += st->lookups;
      s.updates += st->updates;
    }
    return s;
  }

  int64_t MemoryBytes() const {
    int64_t bytes = 0;
    for (const auto& st : stripes_) {
      absl::MutexLock lock(&st->mu);
      // The rows' pages are resident as rows reach them (Mapping): count what the rows use.
      bytes += static_cast<int64_t>(st->size) * (8 + int64_t{4} * row_floats_) + (st->size + 7) / 8;
      bytes += static_cast<int64_t>(st->index.size()) * 4 + static_cast<int64_t>(st->sketch.size());
    }
    return bytes;
  }

  SparseTableState Export() const {
    SparseTableState out;
    out.spec = spec_;
    const int slots = optimizer_->num_slots();
    out.slots.resize(slots);
    int64_t total = 0;
    for (const auto& st : stripes_) {
      absl::MutexLock lock(&st->mu);
      total += st->size;
    }
    out.ids.reserve(total);
    out.values.reserve(total * dim_);
    for (auto& s : out.slots) s.reserve(total * dim_);
    for (const auto& st : stripes_) {
      absl::MutexLock lock(&st->mu);
      for (uint32_t r = 0; r < st->size; ++r) {
        out.ids.push_back(KeyOf(*st, r));
        const float* row = RowData(*st, r);
        out.values.insert(out.values.end(), row, row + dim_);
        for (int k = 0; k < slots; ++k) {
          out.slots[k].insert(out.slots[k].end(), row + dim_ * (1 + k), row + dim_ * (2 + k));
        }
      }
    }
    return out;
  }

  // Replaces the rows (the state was checked by the caller). Returns the rows evicted on the way.
  int64_t Import(const SparseTableState& state) {
    Clear();
    const int slots = optimizer_->num_slots();
    int64_t evicted = 0;
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
      float* data = RowData(st, row);
      std::memcpy(data, state.values.data() + i * dim_, sizeof(float) * dim_);
      for (int k = 0; k < slots; ++k) {
        std::memcpy(data + dim_ * (1 + k), state.slots[k].data() + i * dim_, sizeof(float) * dim_);
      }
    }
    // Restored rows are not "created" by this run's training.
    for (auto& st : stripes_) {
      absl::MutexLock lock(&st->mu);
      st->evicted = 0;
    }
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
      st->created = st->evicted = st->not_admitted = st->dropped = st->lookups = st->updates = 0;
    }
  }

 private:
  static constexpr uint32_t kNone = UINT32_MAX;

  struct Chunk {
    Mapping memory;  // ids | reference bits | floats
    int64_t* keys = nullptr;
    uint64_t* ref = nullptr;
    float* data = nullptr;
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
    int64_t created ABSL_GUARDED_BY(mu) = 0, evicted ABSL_GUARDED_BY(mu) = 0;
    int64_t not_admitted ABSL_GUARDED_BY(mu) = 0, dropped ABSL_GUARDED_BY(mu) = 0;
    int64_t lookups ABSL_GUARDED_BY(mu) = 0, updates ABSL_GUARDED_BY(mu) = 0;
  };

  int64_t ChunkBytes(uint32_t rows) const {
    return static_cast<int64_t>(rows) * 8 + (rows + 63) / 64 * 8 + static_cast<int64_t>(rows) * row_floats_ * 4;
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
  float* RowData(const Stripe& st, uint32_t r) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(st.mu) {
    const auto [k, i] = Locate(r);
    return st.chunks[k].data + static_cast<int64_t>(i) * row_floats_;
  }
  static int64_t KeyOf(const Stripe& st, uint32_t r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(st.mu) {
    const auto [k, i] = Locate(r);
    return st.chunks[k].keys[i];
  }
  static void SetRef(Stripe& st, uint32_t r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(st.mu) {
    const auto [k, i] = Locate(r);
    st.chunks[k].ref[i / 64] |= uint64_t{1} << (i % 64);
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

  // A row for `id` (not in the table): a new one, or, in a full sub-shard, the CLOCK victim's. Its floats are
  // left as they were; its reference bit is clear.
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
        Chunk c;
        c.memory = Mapping(ChunkBytes(rows));
        c.keys = static_cast<int64_t*>(c.memory.data());
        c.ref = reinterpret_cast<uint64_t*>(c.keys + rows);  // zero: fresh pages
        c.data = reinterpret_cast<float*>(c.ref + (rows + 63) / 64);
        st.chunks.push_back(std::move(c));
        st.capacity += rows;
      }
      ++st.size;
    } else {
      // CLOCK: the first row whose reference bit is clear, clearing the bits on the way (ends within a sweep).
      while (TestAndClearRef(st, st.hand)) st.hand = st.hand + 1 == st.size ? 0 : st.hand + 1;
      row = st.hand;
      st.hand = st.hand + 1 == st.size ? 0 : st.hand + 1;
      IndexErase(st, HashId(KeyOf(st, row)), row);
      ++st.evicted;
    }
    const auto [k, i] = Locate(row);
    st.chunks[k].keys[i] = id;
    IndexInsert(st, h, row);
    return row;
  }
  // A new row for `id` with its initial values and slots.
  uint32_t Create(Stripe& st, int64_t id, uint64_t h) ABSL_EXCLUSIVE_LOCKS_REQUIRED(st.mu) {
    const uint32_t row = Insert(st, id, h);
    float* data = RowData(st, row);
    SparseInitialRow(spec_, id, data);
    optimizer_->InitSlots(data + dim_, dim_);
    ++st.created;
    return row;
  }

  // Calls fn(stripe, i, hash) for every i in [0, n), grouped by sub-shard (each lock taken once), in order
  // within a sub-shard.
  template <typename Fn>
  void ForEachByStripe(const int64_t* ids, int64_t n, Fn fn) {
    const int stripes = static_cast<int>(stripes_.size());
    if (stripes == 1) {  // one lock for all
      Stripe& st = *stripes_[0];
      absl::MutexLock lock(&st.mu);
      for (int64_t i = 0; i < n; ++i) fn(st, i, HashId(ids[i]));
      return;
    }
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
    for (int s = 0; s < stripes; ++s) start[s + 1] += start[s];
    int64_t next[kMaxStripes];
    std::copy(start, start + stripes, next);
    for (int64_t i = 0; i < n; ++i) order[next[StripeOf(hashes[i])]++] = static_cast<uint32_t>(i);
    for (int s = 0; s < stripes; ++s) {
      if (start[s] == start[s + 1]) continue;
      Stripe& st = *stripes_[s];
      absl::MutexLock lock(&st.mu);
      for (int64_t k = start[s]; k < start[s + 1]; ++k) fn(st, order[k], hashes[order[k]]);
    }
  }

  const SparseTableSpec spec_;
  const SparseOptimizer* optimizer_;
  const int dim_;
  const int row_floats_;
  const int64_t max_rows_;
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
    if (t.initial_values && (t.rows == 0 || t.max_rows > 0 || t.admit_after > 1)) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": initial values need a fixed-size table without "
                                                           "max_rows or admit_after (every row held from the start)"));
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
    : specs_(std::move(specs)), optimizer_(std::move(optimizer)), options_(options) {
  for (const SparseTableSpec& s : specs_) {
    int64_t max_rows = s.max_rows;
    // A table with initial values holds every row (an evicted one could not come back with its value).
    if (options_.max_rows_cap > 0 && !s.initial_values) {
      max_rows = max_rows > 0 ? std::min(max_rows, options_.max_rows_cap) : options_.max_rows_cap;
    }
    tables_.push_back(std::make_unique<SparseTable>(s, &optimizer_, max_rows));
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
  tables_[t]->Apply(optimizer_.Prepare(step), ids, n, grads, grad_scale);
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
