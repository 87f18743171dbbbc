#include "ps/rpc/tensor_coding.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "glog/logging.h"

namespace dtrain::ps::coding {
namespace {

constexpr int kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5;

void AppendVarint(std::string* out, uint64_t v) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>(v | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

void AppendTag(std::string* out, int field, int wire_type) {
  AppendVarint(out, (static_cast<uint64_t>(field) << 3) | wire_type);
}

// Reads across the slices of a received message without copying them.
class Reader {
 public:
  explicit Reader(const std::vector<grpc::Slice>& slices) : slices_(slices) {
    for (const grpc::Slice& s : slices) total_ += static_cast<int64_t>(s.size());
    SkipEmpty();
  }
  struct Pos {
    size_t slice = 0, offset = 0;
    int64_t absolute = 0;
  };
  Pos Tell() const { return pos_; }
  void Seek(Pos p) { pos_ = p; }
  int64_t position() const { return pos_.absolute; }
  int64_t remaining() const { return total_ - pos_.absolute; }
  bool at_end() const { return remaining() == 0; }

  bool ReadByte(uint8_t* b) {
    if (at_end()) return false;
    *b = slices_[pos_.slice].begin()[pos_.offset];
    Advance(1);
    return true;
  }
  // Copies the next n bytes (n <= remaining()) to dst, across slices.
  void ReadBytes(void* dst, int64_t n) {
    uint8_t* out = static_cast<uint8_t*>(dst);
    while (n > 0) {
      const int64_t take = std::min<int64_t>(n, Contiguous());
      std::memcpy(out, data(), take);
      Advance(take);
      out += take;
      n -= take;
    }
  }
  bool ReadVarint(uint64_t* v) {
    *v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      uint8_t b;
      if (!ReadByte(&b)) return false;
      *v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if ((b & 0x80) == 0) return true;
    }
    return false;  // more than 10 bytes
  }
  bool Skip(int64_t n) {
    if (n < 0 || n > remaining()) return false;
    while (n > 0) {
      const int64_t step = std::min<int64_t>(n, Contiguous());
      Advance(step);
      n -= step;
    }
    return true;
  }
  // Bytes readable at data() without crossing into the next slice.
  int64_t Contiguous() const {
    return at_end() ? 0 : static_cast<int64_t>(slices_[pos_.slice].size() - pos_.offset);
  }
  const uint8_t* data() const { return slices_[pos_.slice].begin() + pos_.offset; }
  void Advance(int64_t n) {
    pos_.offset += n;
    pos_.absolute += n;
    SkipEmpty();
  }

 private:
  void SkipEmpty() {
    while (pos_.slice < slices_.size() && pos_.offset == slices_[pos_.slice].size()) {
      ++pos_.slice;
      pos_.offset = 0;
    }
  }
  const std::vector<grpc::Slice>& slices_;
  int64_t total_ = 0;
  Pos pos_;
};

absl::Status Malformed(const std::string& what, int64_t at) {
  return absl::DataLossError(absl::StrCat("malformed tensor message: ", what, " at byte ", at));
}

absl::Status SkipField(Reader& r, int wire_type) {
  uint64_t v;
  switch (wire_type) {
    case kVarint:
      if (!r.ReadVarint(&v)) return Malformed("truncated varint", r.position());
      return absl::OkStatus();
    case kFixed64:
      if (!r.Skip(8)) return Malformed("truncated fixed64", r.position());
      return absl::OkStatus();
    case kFixed32:
      if (!r.Skip(4)) return Malformed("truncated fixed32", r.position());
      return absl::OkStatus();
    case kLengthDelimited:
      if (!r.ReadVarint(&v) || !r.Skip(static_cast<int64_t>(v))) {
        return Malformed("truncated length-delimited field", r.position());
      }
      return absl::OkStatus();
    default:
      return Malformed(absl::StrCat("unsupported wire type ", wire_type), r.position());
  }
}

// Hands `len` bytes of chunk data at the reader's position to the handler as runs of whole elements.
absl::Status EmitData(Reader& r, int64_t len, uint32_t key, int64_t offset, WireDtype dtype,
                      ChunkHandler* handler) {
  const int el = DtypeBytes(dtype);
  if (len % el != 0) {
    return Malformed(absl::StrCat("chunk of slice ", key, " has ", len, " data bytes, not a whole number of ",
                                  DtypeName(dtype), " elements"),
                     r.position());
  }
  char carry[8];
  int carried = 0;
  int64_t next = offset;
  while (len > 0) {
    int64_t avail = std::min<int64_t>(len, r.Contiguous());
    const uint8_t* p = r.data();
    if (carried > 0) {  // an element split across two slices
      const int take = static_cast<int>(std::min<int64_t>(el - carried, avail));
      std::memcpy(carry + carried, p, take);
      carried += take;
      r.Advance(take);
      len -= take;
      if (carried == el) {
        RETURN_IF_ERROR(handler->OnData(key, next++, 1, dtype, carry));
        carried = 0;
      }
      continue;
    }
    const int64_t whole = avail / el;
    if (whole > 0) {
      RETURN_IF_ERROR(handler->OnData(key, next, whole, dtype, p));
      next += whole;
      r.Advance(whole * el);
      len -= whole * el;
      avail -= whole * el;
      p += whole * el;
    }
    if (avail > 0 && len > 0) {  // the start of an element whose rest is in the next slice
      std::memcpy(carry, p, avail);
      carried = static_cast<int>(avail);
      r.Advance(avail);
      len -= avail;
    }
  }
  return absl::OkStatus();
}

absl::Status DecodeChunk(Reader& r, int64_t len, ChunkHandler* handler) {
  if (len < 0 || len > r.remaining()) return Malformed("truncated chunk", r.position());
  const int64_t end = r.position() + len;
  uint64_t key = 0, offset = 0, dtype = 0;
  bool have_data = false;
  Reader::Pos data_pos;
  int64_t data_len = 0;
  while (r.position() < end) {
    uint64_t tag;
    if (!r.ReadVarint(&tag)) return Malformed("truncated tag", r.position());
    const int field = static_cast<int>(tag >> 3), wire_type = static_cast<int>(tag & 7);
    if (field >= 1 && field <= 3 && wire_type == kVarint) {
      uint64_t v;
      if (!r.ReadVarint(&v)) return Malformed("truncated varint", r.position());
      (field == 1 ? key : field == 2 ? offset : dtype) = v;
    } else if (field == 4 && wire_type == kLengthDelimited) {
      uint64_t n;
      if (!r.ReadVarint(&n)) return Malformed("truncated length", r.position());
      data_pos = r.Tell();
      data_len = static_cast<int64_t>(n);
      have_data = true;
      if (data_len < 0 || !r.Skip(data_len)) return Malformed("truncated chunk data", r.position());
    } else {
      RETURN_IF_ERROR(SkipField(r, wire_type));
    }
  }
  if (r.position() != end) return Malformed("a field runs past the end of its chunk", r.position());
  if (key > 0xffffffffu) return Malformed(absl::StrCat("slice key ", key, " out of range"), end);
  if (static_cast<int64_t>(offset) < 0) return Malformed("negative chunk offset", end);
  if (dtype > static_cast<uint64_t>(WireDtype::kF16)) return Malformed(absl::StrCat("unknown dtype ", dtype), end);
  if (!have_data || data_len == 0) return absl::OkStatus();
  const Reader::Pos after = r.Tell();
  r.Seek(data_pos);
  RETURN_IF_ERROR(EmitData(r, data_len, static_cast<uint32_t>(key), static_cast<int64_t>(offset),
                           static_cast<WireDtype>(dtype), handler));
  r.Seek(after);
  return absl::OkStatus();
}

// Copies `len` bytes at the reader's position to `out` (the reader moves past them).
void Gather(Reader& r, int64_t len, std::string* out) {
  out->resize(len);
  r.ReadBytes(out->data(), len);
}

// Field 3: a RowChunk (pull: fields first, count, data = 5) or a RowGradientChunk (push: ids, data = 4).
absl::Status DecodeRows(Reader& r, int64_t len, ChunkHandler* handler) {
  if (len < 0 || len > r.remaining()) return Malformed("truncated rows", r.position());
  const int64_t end = r.position() + len;
  uint64_t table = 0, first = 0, dtype = 0, count = 0;
  bool pull_kind = false, have_data = false;
  Reader::Pos data_pos;
  int64_t data_len = 0;
  std::vector<int64_t> ids;
  while (r.position() < end) {
    uint64_t tag;
    if (!r.ReadVarint(&tag)) return Malformed("truncated tag", r.position());
    const int field = static_cast<int>(tag >> 3), wire_type = static_cast<int>(tag & 7);
    uint64_t v;
    if ((field == 1 || field == 3) && wire_type == kVarint) {
      if (!r.ReadVarint(&v)) return Malformed("truncated varint", r.position());
      (field == 1 ? table : dtype) = v;
    } else if ((field == 2 || field == 4) && wire_type == kVarint) {  // a RowChunk's first, count
      if (!r.ReadVarint(&v)) return Malformed("truncated varint", r.position());
      (field == 2 ? first : count) = v;
      pull_kind = true;
    } else if (field == 2 && (wire_type == kLengthDelimited || wire_type == kFixed64)) {  // ids
      uint64_t n = 8;
      if (wire_type == kLengthDelimited && !r.ReadVarint(&n)) return Malformed("truncated length", r.position());
      // (A tag or length read past `end` leaves `left` negative: compared as signed, never as a huge unsigned.)
      const int64_t left = std::min(end, r.position() + r.remaining()) - r.position();
      if (n % 8 != 0 || left < 0 || n > static_cast<uint64_t>(left)) return Malformed("truncated ids", r.position());
      // Packed sfixed64: little-endian int64s, as in memory on the hosts this runs on (x86, arm).
      static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "ids are copied as they are on the wire");
      const size_t at = ids.size();
      ids.resize(at + n / 8);
      r.ReadBytes(ids.data() + at, static_cast<int64_t>(n));
    } else if ((field == 4 || field == 5) && wire_type == kLengthDelimited) {  // data (push: 4, pull: 5)
      if (!r.ReadVarint(&v)) return Malformed("truncated length", r.position());
      data_pos = r.Tell();
      data_len = static_cast<int64_t>(v);
      have_data = true;
      if (field == 5) pull_kind = true;
      if (data_len < 0 || !r.Skip(data_len)) return Malformed("truncated row data", r.position());
    } else {
      RETURN_IF_ERROR(SkipField(r, wire_type));
    }
  }
  if (r.position() != end) return Malformed("a field runs past the end of its rows", r.position());
  if (table > 0xffffffffu) return Malformed(absl::StrCat("table ", table, " out of range"), end);
  if (dtype > static_cast<uint64_t>(WireDtype::kF16)) return Malformed(absl::StrCat("unknown dtype ", dtype), end);
  const int el = DtypeBytes(static_cast<WireDtype>(dtype));
  const int64_t rows = pull_kind ? static_cast<int64_t>(count) : static_cast<int64_t>(ids.size());
  if (pull_kind && (!ids.empty() || static_cast<int64_t>(first) < 0 || rows < 0)) {
    return Malformed("rows with both ids and a first row, or a negative first row or count", end);
  }
  if (!have_data) data_len = 0;
  if (rows == 0) {
    if (data_len != 0) return Malformed("row data without rows", end);
    return absl::OkStatus();
  }
  if (data_len % el != 0 || (data_len / el) % rows != 0 || data_len / el / rows < 1 ||
      data_len / el / rows > kMaxRowDim) {
    return Malformed(absl::StrCat(rows, " rows of table ", table, " with ", data_len, " bytes of ",
                                  DtypeName(static_cast<WireDtype>(dtype)), " data"),
                     end);
  }
  const int dim = static_cast<int>(data_len / el / rows);
  const Reader::Pos after = r.Tell();
  r.Seek(data_pos);
  const void* data = r.data();
  std::string gathered;
  if (r.Contiguous() < data_len) {  // gRPC split it: gather (a megabyte at most)
    Gather(r, data_len, &gathered);
    data = gathered.data();
  }
  r.Seek(after);
  if (pull_kind) {
    return handler->OnRows(static_cast<uint32_t>(table), static_cast<int64_t>(first), rows, dim,
                           static_cast<WireDtype>(dtype), data);
  }
  return handler->OnRowGradients(static_cast<uint32_t>(table), ids.data(), rows, dim, static_cast<WireDtype>(dtype),
                                 data);
}

}  // namespace

// ---- SendTracker ----------------------------------------------------------------------------------------------

void SendTracker::Acquire() {
  absl::MutexLock lock(&mu_);
  ++outstanding_;
}

void SendTracker::Release(void* tracker) {
  SendTracker* t = static_cast<SendTracker*>(tracker);
  absl::MutexLock lock(&t->mu_);
  --t->outstanding_;
}

bool SendTracker::WaitIdle(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  return mu_.AwaitWithDeadline(
      absl::Condition(+[](int64_t* n) { return *n == 0; }, &outstanding_), deadline);
}

int64_t SendTracker::outstanding() const {
  absl::MutexLock lock(&mu_);
  return outstanding_;
}

// ---- MessageBuilder -------------------------------------------------------------------------------------------

void MessageBuilder::SetHeader(const std::string& serialized_header) {
  AppendTag(&meta_, 1, kLengthDelimited);
  AppendVarint(&meta_, serialized_header.size());
  meta_ += serialized_header;
}

void MessageBuilder::SetTrailer(const std::string& serialized_trailer) {
  AppendTag(&meta_, 4, kLengthDelimited);
  AppendVarint(&meta_, serialized_trailer.size());
  meta_ += serialized_trailer;
}

void MessageBuilder::SetWorkerId(int32_t worker_id) {
  AppendTag(&meta_, 1, kVarint);
  AppendVarint(&meta_, static_cast<uint64_t>(static_cast<int64_t>(worker_id)));
}

void MessageBuilder::AddChunkFields(uint32_t key, int64_t offset, WireDtype dtype, int64_t bytes) {
  std::string fields;
  AppendTag(&fields, 1, kVarint);
  AppendVarint(&fields, key);
  AppendTag(&fields, 2, kVarint);
  AppendVarint(&fields, static_cast<uint64_t>(offset));
  AppendTag(&fields, 3, kVarint);
  AppendVarint(&fields, static_cast<uint64_t>(dtype));
  AppendTag(&fields, 4, kLengthDelimited);
  AppendVarint(&fields, static_cast<uint64_t>(bytes));
  AppendTag(&meta_, 2, kLengthDelimited);
  AppendVarint(&meta_, fields.size() + bytes);
  meta_ += fields;
  data_bytes_ += bytes;
}

void MessageBuilder::FlushMeta() {
  if (meta_.empty()) return;
  slices_.emplace_back(meta_);
  meta_.clear();
}

void MessageBuilder::AddRef(const void* data, int64_t bytes, SendTracker* tracker) {
  if (bytes == 0) return;
  FlushMeta();
  tracker->Acquire();
  slices_.emplace_back(const_cast<void*>(data), static_cast<size_t>(bytes), &SendTracker::Release, tracker);
}

void MessageBuilder::AddChunkRef(uint32_t key, int64_t offset, WireDtype dtype, const void* data, int64_t n,
                                 SendTracker* tracker) {
  const int64_t bytes = n * DtypeBytes(dtype);
  AddChunkFields(key, offset, dtype, bytes);
  AddRef(data, bytes, tracker);
}

void* MessageBuilder::AddRowsOwned(uint32_t table, int64_t first, int64_t count, int dim, WireDtype dtype) {
  const int64_t bytes = count * dim * DtypeBytes(dtype);
  std::string fields;
  AppendTag(&fields, 1, kVarint);
  AppendVarint(&fields, table);
  AppendTag(&fields, 2, kVarint);
  AppendVarint(&fields, static_cast<uint64_t>(first));
  AppendTag(&fields, 3, kVarint);
  AppendVarint(&fields, static_cast<uint64_t>(dtype));
  AppendTag(&fields, 4, kVarint);
  AppendVarint(&fields, static_cast<uint64_t>(count));
  AppendTag(&fields, 5, kLengthDelimited);
  AppendVarint(&fields, static_cast<uint64_t>(bytes));
  AppendTag(&meta_, 3, kLengthDelimited);
  AppendVarint(&meta_, fields.size() + bytes);
  meta_ += fields;
  data_bytes_ += bytes;
  return OwnedData(bytes);
}

void MessageBuilder::AddRowGradientsRef(uint32_t table, const int64_t* ids, int64_t count, int dim, WireDtype dtype,
                                        const void* data, SendTracker* tracker) {
  static_assert(sizeof(int64_t) == 8, "sfixed64");
  const int64_t id_bytes = count * 8;  // packed sfixed64: the host's int64s, little-endian (x86, arm)
  const int64_t bytes = count * dim * DtypeBytes(dtype);
  std::string head;
  AppendTag(&head, 1, kVarint);
  AppendVarint(&head, table);
  AppendTag(&head, 2, kLengthDelimited);
  AppendVarint(&head, static_cast<uint64_t>(id_bytes));
  std::string tail;
  AppendTag(&tail, 3, kVarint);
  AppendVarint(&tail, static_cast<uint64_t>(dtype));
  AppendTag(&tail, 4, kLengthDelimited);
  AppendVarint(&tail, static_cast<uint64_t>(bytes));
  AppendTag(&meta_, 3, kLengthDelimited);
  AppendVarint(&meta_, head.size() + id_bytes + tail.size() + bytes);
  meta_ += head;
  AddRef(ids, id_bytes, tracker);
  meta_ += tail;
  AddRef(data, bytes, tracker);
  data_bytes_ += id_bytes + bytes;
}

void* MessageBuilder::AddChunkOwned(uint32_t key, int64_t offset, WireDtype dtype, int64_t n) {
  const int64_t bytes = n * DtypeBytes(dtype);
  AddChunkFields(key, offset, dtype, bytes);
  return OwnedData(bytes);
}

void* MessageBuilder::OwnedData(int64_t bytes) {
  if (bytes == 0) return nullptr;
  FlushMeta();
  // Heap memory of our own: a small grpc::Slice keeps its bytes inline in the handle, which moves with the
  // vector of slices.
  void* data = std::malloc(static_cast<size_t>(bytes));
  CHECK(data != nullptr) << "out of memory for a " << bytes << "-byte message";
  slices_.emplace_back(data, static_cast<size_t>(bytes), &std::free);
  return data;
}

grpc::ByteBuffer MessageBuilder::Build() {
  FlushMeta();
  grpc::ByteBuffer out(slices_.data(), slices_.size());
  slices_.clear();
  data_bytes_ = 0;
  return out;
}

// ---- decoding -------------------------------------------------------------------------------------------------

absl::Status DecodeMessage(const grpc::ByteBuffer& buffer, ChunkHandler* handler) {
  std::vector<grpc::Slice> slices;
  if (buffer.Valid()) {
    grpc::Status s = buffer.Dump(&slices);
    if (!s.ok()) return absl::DataLossError(absl::StrCat("cannot read a received message: ", s.error_message()));
  }
  Reader r(slices);
  while (!r.at_end()) {
    uint64_t tag;
    if (!r.ReadVarint(&tag)) return Malformed("truncated tag", r.position());
    const int field = static_cast<int>(tag >> 3), wire_type = static_cast<int>(tag & 7);
    if ((field == 1 || field == 4) && wire_type == kLengthDelimited) {  // the header, or a push's trailer
      uint64_t n;
      if (!r.ReadVarint(&n) || n > static_cast<uint64_t>(r.remaining())) {  // unsigned: a huge n is no negative
        return Malformed(field == 1 ? "truncated header" : "truncated trailer", r.position());
      }
      std::string bytes;
      bytes.reserve(n);
      while (bytes.size() < n) {
        const int64_t take = std::min<int64_t>(n - bytes.size(), r.Contiguous());
        bytes.append(reinterpret_cast<const char*>(r.data()), take);
        r.Advance(take);
      }
      RETURN_IF_ERROR(field == 1 ? handler->OnHeader(bytes) : handler->OnTrailer(bytes));
    } else if (field == 1 && wire_type == kVarint) {
      uint64_t v;
      if (!r.ReadVarint(&v)) return Malformed("truncated varint", r.position());
      RETURN_IF_ERROR(handler->OnWorkerId(static_cast<int64_t>(v)));
    } else if (field == 2 && wire_type == kLengthDelimited) {
      uint64_t n;
      if (!r.ReadVarint(&n)) return Malformed("truncated chunk length", r.position());
      RETURN_IF_ERROR(DecodeChunk(r, static_cast<int64_t>(n), handler));
    } else if (field == 3 && wire_type == kLengthDelimited) {
      uint64_t n;
      if (!r.ReadVarint(&n) || n > static_cast<uint64_t>(r.remaining())) {
        return Malformed("truncated rows length", r.position());
      }
      RETURN_IF_ERROR(DecodeRows(r, static_cast<int64_t>(n), handler));
    } else {
      RETURN_IF_ERROR(SkipField(r, wire_type));
    }
  }
  return absl::OkStatus();
}

}  // namespace dtrain::ps::coding
