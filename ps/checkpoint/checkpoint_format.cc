#include "ps/checkpoint/checkpoint_format.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "common/status_macros.h"
#include "glog/logging.h"

namespace dtrain::ps {
namespace {

static_assert(sizeof(float) == 4, "float32 expected");
constexpr char kTrailerMagic[] = "DTRNTAIL";
constexpr size_t kMagicLen = 8;
constexpr size_t kTrailerLen = kMagicLen + 8 + 4;
// Sanity bounds, so a corrupted length cannot make the reader allocate gigabytes before the CRC check.
constexpr uint32_t kMaxStringLen = 1 << 20;
constexpr uint32_t kMaxSparseDim = 65536;

bool HostIsLittleEndian() {
  const uint32_t one = 1;
  unsigned char b;
  std::memcpy(&b, &one, 1);
  return b == 1;
}

// ---- encoding ----
void PutU32(std::string* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void PutU64(std::string* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void PutStr(std::string* out, const std::string& s) {
  PutU32(out, static_cast<uint32_t>(s.size()));
  out->append(s);
}
void PutFloats(std::string* out, const std::vector<float>& v) {
  out->append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}
void PutFloatRange(std::string* out, const float* v, int64_t n) {
  out->append(reinterpret_cast<const char*>(v), n * sizeof(float));
}
void PutF32(std::string* out, float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  PutU32(out, bits);
}
void PutCrc(std::string* out, size_t from) {
  PutU32(out, crc32c::Mask(crc32c::Value(out->data() + from, out->size() - from)));
}

// ---- decoding: a cursor over the whole file; every error names the file and the byte ----
class Reader {
 public:
  Reader(absl::string_view bytes, const std::string& name) : bytes_(bytes), name_(name) {}

  size_t pos() const { return pos_; }
  void Skip(size_t n) { pos_ += n; }
  size_t size() const { return bytes_.size(); }
  const char* at(size_t p) const { return bytes_.data() + p; }

  absl::Status DataLoss(absl::string_view what) const { return absl::DataLossError(absl::StrCat(name_, ": ", what)); }

  absl::Status Need(size_t n, absl::string_view what) const {
    if (bytes_.size() - pos_ < n) {
      return DataLoss(absl::StrCat("truncated at byte ", bytes_.size(), " while reading ", what, " (needs ", n,
                                   " bytes at offset ", pos_, ")"));
    }
    return absl::OkStatus();
  }
  absl::StatusOr<uint32_t> U32(absl::string_view what) {
    RETURN_IF_ERROR(Need(4, what));
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<unsigned char>(bytes_[pos_ + i])) << (8 * i);
    pos_ += 4;
    return v;
  }
  absl::StatusOr<uint8_t> U8(absl::string_view what) {
    RETURN_IF_ERROR(Need(1, what));
    return static_cast<uint8_t>(bytes_[pos_++]);
  }
  absl::StatusOr<uint64_t> U64(absl::string_view what) {
    RETURN_IF_ERROR(Need(8, what));
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(static_cast<unsigned char>(bytes_[pos_ + i])) << (8 * i);
    pos_ += 8;
    return v;
  }
  absl::StatusOr<std::string> Str(absl::string_view what) {
    ASSIGN_OR_RETURN(uint32_t n, U32(what));
    if (n > kMaxStringLen) return DataLoss(absl::StrCat(what, " has implausible length ", n));
    RETURN_IF_ERROR(Need(n, what));
    std::string s(bytes_.substr(pos_, n));
    pos_ += n;
    return s;
  }
  absl::StatusOr<float> F32(absl::string_view what) {
    ASSIGN_OR_RETURN(uint32_t bits, U32(what));
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
  }
  // Appends n values (int64s or floats) to `out`.
  template <typename T>
  absl::Status Append(int64_t n, std::vector<T>* out, absl::string_view what) {
    // Compared by division: n * sizeof(T) could wrap around for a hostile n.
    if (n < 0 || static_cast<uint64_t>(n) > (bytes_.size() - pos_) / sizeof(T)) {
      return DataLoss(absl::StrCat("truncated at byte ", bytes_.size(), " while reading ", what, " (", n,
                                   " values at offset ", pos_, ")"));
    }
    const size_t old = out->size();
    out->resize(old + n);
    std::memcpy(out->data() + old, bytes_.data() + pos_, n * sizeof(T));
    pos_ += n * sizeof(T);
    return absl::OkStatus();
  }
  absl::Status Floats(int64_t n, std::vector<float>* out, absl::string_view what) {
    out->clear();
    return Append(n, out, what);
  }
  // A section: u32 body_len | body | u32 masked CRC32C(body_len + body). Checks the CRC before any field of it is
  // trusted and returns where the body ends (its CRC follows).
  absl::StatusOr<size_t> Section(const std::string& section) {
    const size_t start = pos_;
    ASSIGN_OR_RETURN(uint32_t body_len, U32(absl::StrCat("the length of ", section)));
    RETURN_IF_ERROR(Need(static_cast<size_t>(body_len) + 4, section));
    const size_t end = pos_ + body_len;
    Reader crc_reader(bytes_, name_);
    crc_reader.Skip(end);
    RETURN_IF_ERROR(crc_reader.Crc(start, end, section));
    return end;
  }
  // Reads a stored masked CRC and compares it with the CRC of bytes [from, from_end).
  absl::Status Crc(size_t from, size_t end, absl::string_view section) {
    ASSIGN_OR_RETURN(uint32_t stored, U32(absl::StrCat("the checksum of ", section)));
    if (crc32c::Unmask(stored) != crc32c::Value(bytes_.data() + from, end - from) &&
        !crc32c::kAcceptMismatchForFuzzing) {
      return DataLoss(absl::StrCat("checksum mismatch in ", section));
    }
    return absl::OkStatus();
  }

 private:
  absl::string_view bytes_;
  const std::string& name_;
  size_t pos_ = 0;
};

// Version 4: the sparse tables (see the header).
absl::Status ParseTables(Reader& r, CheckpointData* d) {
  {
    const std::string section = "the sparse tables";
    ASSIGN_OR_RETURN(const size_t end, r.Section(section));
    ASSIGN_OR_RETURN(d->sparse_optimizer, r.Str("the sparse optimizer name"));
    ASSIGN_OR_RETURN(uint32_t slots, r.U32("the number of sparse slots"));
    ASSIGN_OR_RETURN(uint32_t num_tables, r.U32("the number of sparse tables"));
    if (r.pos() != end || slots > 2 || num_tables > (1u << 16)) {
      return r.DataLoss(absl::StrCat(section, ": implausible header (", slots, " slots, ", num_tables, " tables)"));
    }
    r.Skip(4);
    d->sparse_num_slots = static_cast<int>(slots);
    d->tables.resize(num_tables);
  }
  const uint64_t slots = d->sparse_num_slots;
  for (size_t t = 0; t < d->tables.size(); ++t) {
    SparseTableState& table = d->tables[t];
    const std::string section = absl::StrCat("sparse table ", t);
    ASSIGN_OR_RETURN(const size_t end, r.Section(section));
    ASSIGN_OR_RETURN(table.spec.table, r.U32("a table index"));
    ASSIGN_OR_RETURN(table.spec.name, r.Str("a table name"));
    ASSIGN_OR_RETURN(uint32_t dim, r.U32("a table's dim"));
    ASSIGN_OR_RETURN(uint64_t rows, r.U64("a table's rows"));
    ASSIGN_OR_RETURN(table.spec.init_scale, r.F32("a table's init_scale"));
    ASSIGN_OR_RETURN(table.spec.init_seed, r.U64("a table's init_seed"));
    ASSIGN_OR_RETURN(uint64_t max_rows, r.U64("a table's max_rows"));
    ASSIGN_OR_RETURN(uint32_t admit_after, r.U32("a table's admit_after"));
    ASSIGN_OR_RETURN(uint64_t num_rows, r.U64("a table's number of rows"));
    ASSIGN_OR_RETURN(uint32_t num_blocks, r.U32("a table's number of blocks"));
    table.spec.dim = static_cast<int>(dim);
    table.spec.rows = static_cast<int64_t>(rows);
    table.spec.max_rows = static_cast<int64_t>(max_rows);
    table.spec.admit_after = static_cast<int>(admit_after);
    const uint64_t row_bytes = 8 + uint64_t{dim} * 4 * (1 + slots);
    // Every row takes row_bytes of the file: a count beyond what is left cannot be true (and is not allocated).
    if (r.pos() != end || table.spec.table != t || dim < 1 || dim > kMaxSparseDim ||
        !(std::isfinite(table.spec.init_scale) && table.spec.init_scale >= 0.0f) ||
        static_cast<int64_t>(rows) < 0 || static_cast<int64_t>(max_rows) < 0 || admit_after > 255 ||
        num_rows > (r.size() - r.pos()) / row_bytes || num_blocks > num_rows + 1) {
      return r.DataLoss(absl::StrCat(section, " ('", table.spec.name, "'): implausible spec (table ",
                                     table.spec.table, ", dim ", dim, ", ", num_rows, " rows in ", num_blocks,
                                     " blocks)"));
    }
    r.Skip(4);
    const int64_t n = static_cast<int64_t>(num_rows);
    table.ids.reserve(n);
    table.values.reserve(n * dim);
    table.slots.resize(slots);
    for (auto& s : table.slots) s.reserve(n * dim);
    int64_t read = 0;
    for (uint32_t b = 0; b < num_blocks; ++b) {
      const std::string block = absl::StrCat(section, " block ", b);
      ASSIGN_OR_RETURN(const size_t block_end, r.Section(block));
      ASSIGN_OR_RETURN(uint32_t index, r.U32("a block's table index"));
      ASSIGN_OR_RETURN(uint64_t count, r.U64("a block's row count"));
      const uint64_t left = r.pos() <= block_end ? block_end - r.pos() : 0;
      if (index != t || r.pos() > block_end || count > static_cast<uint64_t>(n - read) ||
          count > left / row_bytes || count * row_bytes != left) {
        return r.DataLoss(absl::StrCat(block, ": ", count, " rows do not match the section or the table"));
      }
      const int64_t m = static_cast<int64_t>(count);
      RETURN_IF_ERROR(r.Append(m, &table.ids, "ids"));
      RETURN_IF_ERROR(r.Append(m * dim, &table.values, "row values"));
      for (auto& s : table.slots) RETURN_IF_ERROR(r.Append(m * dim, &s, "row slots"));
      r.Skip(4);
      read += m;
    }
    if (read != n) {
      return r.DataLoss(absl::StrCat(section, " ('", table.spec.name, "'): its blocks hold ", read, " of ", n, " rows"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::string DescribeSlice(const SliceSpec& s) {
  return absl::StrCat("key ", s.key, " '", s.variable, "' [", s.flat_offset, ", +", s.length, ")");
}

std::string SerializeCheckpoint(const CheckpointData& data, uint32_t version, int64_t sparse_block_bytes) {
  std::string out;
  AppendCheckpoint(data, &out, version, sparse_block_bytes);
  return out;
}

void AppendCheckpoint(const CheckpointData& data, std::string* to, uint32_t version, int64_t sparse_block_bytes) {
  CHECK(HostIsLittleEndian()) << "checkpoints are written on little-endian hosts only";
  CHECK(version >= 1 && version <= kCheckpointFormatVersion) << version;
  const bool flags = version >= 3;
  std::string& out = *to;
  const size_t base = out.size();  // where this checkpoint starts in `out`
  int64_t floats = 0;
  for (const SliceState& s : data.slices) floats += s.spec.length * (2 + data.num_slots);
  for (const SparseTableState& t : data.tables) floats += t.values.size() * (1 + data.sparse_num_slots) + 2 * t.ids.size();
  out.reserve(base + 256 + data.slices.size() * 64 + floats * sizeof(float));

  out.append(kCheckpointMagic, kMagicLen);
  PutU32(&out, version);
  std::string body;
  PutU32(&body, static_cast<uint32_t>(data.task_index));
  PutU32(&body, static_cast<uint32_t>(data.num_ps));
  PutU64(&body, static_cast<uint64_t>(data.global_step));
  PutU64(&body, static_cast<uint64_t>(data.task_step));
  PutStr(&body, data.model_signature);
  PutStr(&body, data.optimizer);
  PutU32(&body, static_cast<uint32_t>(data.num_slots));
  body.push_back(data.has_moving_averages ? 1 : 0);
  if (version >= 5) {
    PutU32(&body, static_cast<uint32_t>(data.model_flags.size()));
    for (const std::string& f : data.model_flags) PutStr(&body, f);
  }
  PutU32(&body, static_cast<uint32_t>(data.slices.size()));
  PutU32(&out, static_cast<uint32_t>(body.size()));
  out.append(body);
  PutCrc(&out, base);

  for (const SliceState& s : data.slices) {
    CHECK_EQ(static_cast<int64_t>(s.values.size()), s.spec.length) << DescribeSlice(s.spec);
    CHECK_EQ(static_cast<int>(s.slots.size()), data.num_slots) << DescribeSlice(s.spec);
    CHECK_EQ(static_cast<int64_t>(s.moving_average.size()), data.has_moving_averages ? s.spec.length : 0);
    const size_t start = out.size();
    CHECK(flags || s.spec.trainable) << "format version " << version << " has no state slices";
    const uint64_t body_len = 4 + 4 + s.spec.variable.size() + 8 + 8 + (flags ? 1 : 0) +
                              static_cast<uint64_t>(s.spec.length) * sizeof(float) *
                                  (1 + data.num_slots + (data.has_moving_averages ? 1 : 0));
    CHECK_LT(body_len, uint64_t{1} << 32) << "slice too large for one section: " << DescribeSlice(s.spec);
    PutU32(&out, static_cast<uint32_t>(body_len));
    PutU32(&out, s.spec.key);
    PutStr(&out, s.spec.variable);
    PutU64(&out, static_cast<uint64_t>(s.spec.flat_offset));
    PutU64(&out, static_cast<uint64_t>(s.spec.length));
    if (flags) out.push_back(s.spec.trainable ? 0 : 1);
    PutFloats(&out, s.values);
    for (const std::vector<float>& slot : s.slots) {
      CHECK_EQ(static_cast<int64_t>(slot.size()), s.spec.length);
      PutFloats(&out, slot);
    }
    if (data.has_moving_averages) PutFloats(&out, s.moving_average);
    CHECK_EQ(out.size() - start, body_len + 4);
    PutCrc(&out, start);
  }

  if (version >= 2) {
    const size_t start = out.size();
    std::string body;
    PutU32(&body, static_cast<uint32_t>(data.input_positions.size()));
    for (const auto& [worker, position] : data.input_positions) {
      CHECK_GE(worker, 0);
      CHECK_LE(position.size(), kMaxInputPositionBytes);
      PutU32(&body, static_cast<uint32_t>(worker));
      PutStr(&body, position);
    }
    PutU32(&out, static_cast<uint32_t>(body.size()));
    out.append(body);
    PutCrc(&out, start);
  }

  CHECK(version >= 4 || data.tables.empty()) << "format version " << version << " has no sparse tables";
  if (version >= 4) {
    size_t start = out.size();
    std::string body;
    PutStr(&body, data.sparse_optimizer);
    PutU32(&body, static_cast<uint32_t>(data.sparse_num_slots));
    PutU32(&body, static_cast<uint32_t>(data.tables.size()));
    PutU32(&out, static_cast<uint32_t>(body.size()));
    out.append(body);
    PutCrc(&out, start);
    for (const SparseTableState& t : data.tables) {
      const int64_t n = static_cast<int64_t>(t.ids.size());
      const int64_t dim = t.spec.dim;
      CHECK_EQ(static_cast<int64_t>(t.values.size()), n * dim) << t.spec.name;
      CHECK_EQ(static_cast<int>(t.slots.size()), data.sparse_num_slots) << t.spec.name;
      for (const std::vector<float>& slot : t.slots) CHECK_EQ(static_cast<int64_t>(slot.size()), n * dim);
      const int64_t row_bytes = 8 + dim * 4 * (1 + data.sparse_num_slots);
      const int64_t per_block = std::max<int64_t>(1, sparse_block_bytes / row_bytes);
      const int64_t blocks = (n + per_block - 1) / per_block;
      start = out.size();
      body.clear();
      PutU32(&body, t.spec.table);
      PutStr(&body, t.spec.name);
      PutU32(&body, static_cast<uint32_t>(t.spec.dim));
      PutU64(&body, static_cast<uint64_t>(t.spec.rows));
      PutF32(&body, t.spec.init_scale);
      PutU64(&body, t.spec.init_seed);
      PutU64(&body, static_cast<uint64_t>(t.spec.max_rows));
      PutU32(&body, static_cast<uint32_t>(t.spec.admit_after));
      PutU64(&body, static_cast<uint64_t>(n));
      PutU32(&body, static_cast<uint32_t>(blocks));
      PutU32(&out, static_cast<uint32_t>(body.size()));
      out.append(body);
      PutCrc(&out, start);
      for (int64_t first = 0; first < n; first += per_block) {
        const int64_t count = std::min(per_block, n - first);
        start = out.size();
        PutU32(&out, static_cast<uint32_t>(4 + 8 + count * row_bytes));
        PutU32(&out, t.spec.table);
        PutU64(&out, static_cast<uint64_t>(count));
        out.append(reinterpret_cast<const char*>(t.ids.data() + first), count * sizeof(int64_t));
        PutFloatRange(&out, t.values.data() + first * dim, count * dim);
        for (const std::vector<float>& slot : t.slots) PutFloatRange(&out, slot.data() + first * dim, count * dim);
        CHECK_EQ(out.size() - start, static_cast<size_t>(4 + 4 + 8 + count * row_bytes));
        PutCrc(&out, start);
      }
    }
  }

  const uint64_t before_trailer = out.size() - base;
  const uint32_t whole = crc32c::Value(out.data() + base, before_trailer);
  out.append(kTrailerMagic, kMagicLen);
  PutU64(&out, before_trailer);
  PutU32(&out, crc32c::Mask(whole));
}

absl::StatusOr<CheckpointData> ParseCheckpoint(absl::string_view bytes, const std::string& name) {
  if (!HostIsLittleEndian()) return absl::UnimplementedError("checkpoints are read on little-endian hosts only");
  Reader r(bytes, name);
  RETURN_IF_ERROR(r.Need(kMagicLen, "the magic number"));
  if (std::memcmp(r.at(0), kCheckpointMagic, kMagicLen) != 0) {
    return r.DataLoss("bad magic: not a dtrain checkpoint");
  }
  r.Skip(kMagicLen);
  ASSIGN_OR_RETURN(uint32_t version, r.U32("the format version"));
  if (version == 0 || version > kCheckpointFormatVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat(name, ": checkpoint format version ", version, ", this build reads versions 1 to ",
                     kCheckpointFormatVersion, " (written by a newer dtrain? read it with that version)"));
  }
  ASSIGN_OR_RETURN(uint32_t header_len, r.U32("the header length"));
  RETURN_IF_ERROR(r.Need(static_cast<size_t>(header_len) + 4, "the header"));
  const size_t header_start = r.pos();
  {
    Reader crc_reader(bytes, name);
    crc_reader.Skip(header_start + header_len);
    RETURN_IF_ERROR(crc_reader.Crc(0, header_start + header_len, "header"));
  }
  CheckpointData d;
  ASSIGN_OR_RETURN(uint32_t task, r.U32("the task index"));
  ASSIGN_OR_RETURN(uint32_t num_ps, r.U32("num_ps"));
  ASSIGN_OR_RETURN(uint64_t global_step, r.U64("the global step"));
  ASSIGN_OR_RETURN(uint64_t task_step, r.U64("the task step"));
  ASSIGN_OR_RETURN(d.model_signature, r.Str("the model signature"));
  ASSIGN_OR_RETURN(d.optimizer, r.Str("the optimizer name"));
  ASSIGN_OR_RETURN(uint32_t num_slots, r.U32("the number of optimizer slots"));
  ASSIGN_OR_RETURN(uint8_t has_averages, r.U8("the moving-average flag"));
  if (version >= 5) {
    ASSIGN_OR_RETURN(uint32_t num_flags, r.U32("the number of model flags"));
    if (num_flags > header_len) return r.DataLoss(absl::StrCat("implausible count of ", num_flags, " model flags"));
    for (uint32_t i = 0; i < num_flags; ++i) {
      ASSIGN_OR_RETURN(std::string flag, r.Str("a model flag"));
      d.model_flags.push_back(std::move(flag));
    }
  }
  ASSIGN_OR_RETURN(uint32_t num_slices, r.U32("the number of slices"));
  if (r.pos() - header_start != header_len) {
    return r.DataLoss(absl::StrCat("checksum mismatch in header (its length field says ", header_len,
                                   " bytes, its fields take ", r.pos() - header_start, ")"));
  }
  r.Skip(4);  // the header's CRC, checked above
  if (num_ps < 1 || task >= num_ps || num_slots > kMaxCheckpointSlots || has_averages > 1 ||
      static_cast<int64_t>(global_step) < 0 || static_cast<int64_t>(task_step) < 0) {
    return r.DataLoss(absl::StrCat("implausible header (task ", task, " of ", num_ps, ", steps ",
                                   static_cast<int64_t>(global_step), "/", static_cast<int64_t>(task_step),
                                   ", ", num_slots, " slots)"));
  }
  d.task_index = static_cast<int>(task);
  d.num_ps = static_cast<int>(num_ps);
  d.global_step = static_cast<int64_t>(global_step);
  d.task_step = static_cast<int64_t>(task_step);
  d.num_slots = static_cast<int>(num_slots);
  d.has_moving_averages = has_averages != 0;

  for (uint32_t i = 0; i < num_slices; ++i) {
    const std::string section = absl::StrCat("slice ", i);
    ASSIGN_OR_RETURN(const size_t end, r.Section(section));
    SliceState s;
    ASSIGN_OR_RETURN(s.spec.key, r.U32("a slice key"));
    ASSIGN_OR_RETURN(s.spec.variable, r.Str("a variable name"));
    ASSIGN_OR_RETURN(uint64_t offset, r.U64("a flat offset"));
    ASSIGN_OR_RETURN(uint64_t length, r.U64("a slice length"));
    s.spec.flat_offset = static_cast<int64_t>(offset);
    s.spec.length = static_cast<int64_t>(length);
    if (version >= 3) {
      ASSIGN_OR_RETURN(uint8_t flags, r.U8("the slice flags"));
      if (flags > 1) return r.DataLoss(absl::StrCat(section, " has unknown flags ", int{flags}));
      s.spec.trainable = (flags & 1) == 0;
    }
    const uint64_t arrays = 1 + num_slots + (d.has_moving_averages ? 1 : 0);
    // The length must fill the rest of the section exactly. Checked by division first: a hostile length times
    // 4 * arrays could wrap around to the section's size.
    const uint64_t left = r.pos() <= end ? end - r.pos() : 0;
    if (s.spec.flat_offset < 0 || s.spec.length <= 0 || r.pos() > end ||
        static_cast<uint64_t>(s.spec.length) > left / (sizeof(float) * arrays) ||
        static_cast<uint64_t>(s.spec.length) * sizeof(float) * arrays != left) {
      return r.DataLoss(absl::StrCat(section, " (", DescribeSlice(s.spec), ") has a length that does not match "
                                     "its section"));
    }
    RETURN_IF_ERROR(r.Floats(s.spec.length, &s.values, "slice values"));
    s.slots.resize(num_slots);
    for (uint32_t k = 0; k < num_slots; ++k) RETURN_IF_ERROR(r.Floats(s.spec.length, &s.slots[k], "a slot"));
    if (d.has_moving_averages) RETURN_IF_ERROR(r.Floats(s.spec.length, &s.moving_average, "a moving average"));
    r.Skip(4);  // the CRC, checked above
    d.slices.push_back(std::move(s));
  }

  if (version >= 2) {
    const std::string section = "the input positions";
    ASSIGN_OR_RETURN(const size_t end, r.Section(section));
    ASSIGN_OR_RETURN(uint32_t count, r.U32("the number of input positions"));
    for (uint32_t i = 0; i < count; ++i) {
      ASSIGN_OR_RETURN(uint32_t worker, r.U32("a worker id"));
      ASSIGN_OR_RETURN(std::string position, r.Str("an input position"));
      if (worker > (1u << 20) || position.size() > kMaxInputPositionBytes ||
          !d.input_positions.emplace(static_cast<int>(worker), std::move(position)).second) {
        return r.DataLoss(absl::StrCat(section, ": implausible entry for worker ", worker));
      }
      if (r.pos() > end) return r.DataLoss(absl::StrCat(section, " run past their section"));
    }
    if (r.pos() != end) return r.DataLoss(absl::StrCat(section, ": length field does not match the entries"));
    r.Skip(4);  // the CRC, checked above
  }

  if (version >= 4) RETURN_IF_ERROR(ParseTables(r, &d));

  const size_t before_trailer = r.pos();
  RETURN_IF_ERROR(r.Need(kTrailerLen, "the trailer"));
  if (std::memcmp(r.at(r.pos()), kTrailerMagic, kMagicLen) != 0) {
    return r.DataLoss(absl::StrCat("no trailer at byte ", r.pos(), " (bad trailer magic)"));
  }
  r.Skip(kMagicLen);
  ASSIGN_OR_RETURN(uint64_t stated, r.U64("the trailer"));
  if (stated != before_trailer) {
    return r.DataLoss(absl::StrCat("the trailer says ", stated, " bytes precede it, found ", before_trailer));
  }
  RETURN_IF_ERROR(r.Crc(0, before_trailer, "trailer (whole-file checksum)"));
  if (r.pos() != r.size()) {
    return r.DataLoss(absl::StrCat(r.size() - r.pos(), " unexpected bytes after the trailer at byte ", r.pos()));
  }
  return d;
}

}  // namespace dtrain::ps
