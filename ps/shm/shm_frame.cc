#include "ps/shm/shm_frame.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/crc32c.h"

namespace dtrain::ps::shm {
namespace {

// Lists longer than this in one frame are refused (a frame is at most kMaxFramePayload bytes anyway).
constexpr uint32_t kMaxListItems = 1 << 16;

class Writer {
 public:
  void U8(uint8_t v) { out_.push_back(static_cast<char>(v)); }
  void U16(uint16_t v) { Fixed(v); }
  void U32(uint32_t v) { Fixed(v); }
  void I32(int32_t v) { Fixed(static_cast<uint32_t>(v)); }
  void U64(uint64_t v) { Fixed(v); }
  void I64(int64_t v) { Fixed(static_cast<uint64_t>(v)); }
  void Bool(bool v) { U8(v ? 1 : 0); }
  void Str(absl::string_view s) {
    U32(static_cast<uint32_t>(s.size()));
    out_.append(s.data(), s.size());
  }
  // The field calls a message's *Fields function makes (Reader has the same, reading into the fields; the limits
  // are the reader's).
  void Str(absl::string_view s, size_t /*max_bytes*/) { Str(s); }
  void Dtype(WireDtype d) { U8(static_cast<uint8_t>(d)); }
  template <typename E>
  void Enum(E e, E /*max*/, const char* /*what*/) {
    U8(static_cast<uint8_t>(e));
  }
  // A list: its count, then `item(x)` for each x.
  template <typename T, typename Item>
  void List(const std::vector<T>& list, size_t /*min_item_bytes*/, Item item) {
    U32(static_cast<uint32_t>(list.size()));
    for (const T& x : list) item(x);
  }
  std::string Take() { return std::move(out_); }

 private:
  template <typename T>
  void Fixed(T v) {
    char b[sizeof(T)];
    for (size_t i = 0; i < sizeof(T); ++i) b[i] = static_cast<char>((v >> (8 * i)) & 0xff);
    out_.append(b, sizeof(T));
  }
  std::string out_;
};

// Reads fields in order; the first failure sticks (ok() false) and later reads return zeros.
class Reader {
 public:
  Reader(absl::string_view in, const char* what) : in_(in), what_(what) {}
  uint8_t U8() { return static_cast<uint8_t>(Fixed<uint8_t>()); }
  uint16_t U16() { return Fixed<uint16_t>(); }
  uint32_t U32() { return Fixed<uint32_t>(); }
  int32_t I32() { return static_cast<int32_t>(Fixed<uint32_t>()); }
  uint64_t U64() { return Fixed<uint64_t>(); }
  int64_t I64() { return static_cast<int64_t>(Fixed<uint64_t>()); }
  bool Bool() {
    const uint8_t v = U8();
    if (v > 1) Fail("a boolean that is neither 0 nor 1");
    return v == 1;
  }
  std::string Str(size_t max_bytes) {
    const uint32_t n = U32();
    if (!ok_) return {};
    if (n > max_bytes || n > in_.size() - pos_) {
      Fail(absl::StrCat("a string of ", n, " bytes (at most ", std::min(max_bytes, in_.size() - pos_), ")"));
      return {};
    }
    std::string s(in_.data() + pos_, n);
    pos_ += n;
    return s;
  }
  // A list's item count, checked against what the remaining bytes could hold at `min_item_bytes` each.
  uint32_t Count(size_t min_item_bytes) {
    const uint32_t n = U32();
    if (ok_ && (n > kMaxListItems || static_cast<size_t>(n) * min_item_bytes > in_.size() - pos_)) {
      Fail(absl::StrCat("a list of ", n, " items in ", in_.size() - pos_, " bytes"));
      return 0;
    }
    return n;
  }
  WireDtype Dtype() {
    const uint8_t v = U8();
    if (v > static_cast<uint8_t>(WireDtype::kF16)) Fail(absl::StrCat("wire dtype ", v));
    return static_cast<WireDtype>(v <= 2 ? v : 0);
  }
  // The field calls of the *Fields functions (as Writer's): each reads into its field.
  void U8(uint8_t& v) { v = U8(); }
  void U32(uint32_t& v) { v = U32(); }
  void I32(int32_t& v) { v = I32(); }
  void U64(uint64_t& v) { v = U64(); }
  void I64(int64_t& v) { v = I64(); }
  void Bool(bool& v) { v = Bool(); }
  void Str(std::string& v, size_t max_bytes) { v = Str(max_bytes); }
  void Dtype(WireDtype& v) { v = Dtype(); }
  // An enum sent as a u8, at most `max`: "<what> <value>" fails otherwise.
  template <typename E>
  void Enum(E& e, E max, const char* what) {
    const uint8_t v = U8();
    if (v > static_cast<uint8_t>(max)) Fail(absl::StrCat(what, " ", v));
    e = static_cast<E>(v);
  }
  // A list: its count (checked against what the remaining bytes could hold at `min_item_bytes` each), then
  // `item(x)` for each, appended, while every read succeeds.
  template <typename T, typename Item>
  void List(std::vector<T>& list, size_t min_item_bytes, Item item) {
    const uint32_t n = Count(min_item_bytes);
    for (uint32_t i = 0; i < n && ok(); ++i) {
      T x{};
      item(x);
      list.push_back(std::move(x));
    }
  }
  void Fail(const std::string& why) {
    if (ok_) error_ = why;
    ok_ = false;
  }
  // OK when every field decoded and nothing is left over.
  absl::Status Finish() {
    if (ok_ && pos_ != in_.size()) Fail(absl::StrCat(in_.size() - pos_, " bytes left over"));
    if (ok_) return absl::OkStatus();
    return absl::DataLossError(absl::StrCat("shared-memory frame ", what_, ": ", error_));
  }
  bool ok() const { return ok_; }

 private:
  template <typename T>
  T Fixed() {
    if (!ok_) return 0;
    if (in_.size() - pos_ < sizeof(T)) {
      Fail("truncated");
      return 0;
    }
    T v = 0;
    for (size_t i = 0; i < sizeof(T); ++i) v |= static_cast<T>(static_cast<uint8_t>(in_[pos_ + i])) << (8 * i);
    pos_ += sizeof(T);
    return v;
  }
  absl::string_view in_;
  const char* what_;
  size_t pos_ = 0;
  bool ok_ = true;
  std::string error_;
};

void PutStatus(Writer& w, const absl::Status& s) {
  w.I32(static_cast<int32_t>(s.code()));
  w.Str(s.message().substr(0, 4096));
}
absl::Status GetStatus(Reader& r) {
  const int32_t code = r.I32();
  std::string message = r.Str(4096);
  if (code < 0 || code > static_cast<int32_t>(absl::StatusCode::kUnauthenticated)) {
    r.Fail(absl::StrCat("status code ", code));
    return absl::OkStatus();
  }
  return absl::Status(static_cast<absl::StatusCode>(code), message);
}

// Each message's fields, in order, once for both directions: Io is a Writer (M const) or a Reader.
void StatusField(Writer& w, const absl::Status& s) { PutStatus(w, s); }
void StatusField(Reader& r, absl::Status& s) { s = GetStatus(r); }

template <typename Io, typename D>
void DecisionFields(Io& io, D& d) {
  io.I64(d.step);
  io.List(d.workers, 4, [&io](auto& worker) { io.I32(worker); });
  io.Bool(d.checkpoint);
  io.Bool(d.delta);
  io.Str(d.mac, 256);
}
template <typename Io, typename Ds>
void DecisionsFields(Io& io, Ds& ds) {
  io.List(ds, 18, [&io](auto& d) { DecisionFields(io, d); });
}

template <typename Io, typename M>
void SegmentFields(Io& io, M& m) {
  io.U32(m.segment);
  io.I64(m.bytes);
}
template <typename Io, typename M>
void PushHeaderFields(Io& io, M& m) {
  io.I32(m.worker_id);
  io.I64(m.step);
  io.U64(m.request_id);
  io.Bool(m.commit);
  io.U64(m.session);
  io.Str(m.input_position, 64 << 10);
  io.Bool(m.apply_early);
}
template <typename Io, typename M>
void DataRefFields(Io& io, M& m) {
  io.U32(m.key);
  io.I64(m.offset);
  io.I64(m.n);
  io.Dtype(m.dtype);
  io.U32(m.segment);
  io.I64(m.at);
  io.Bool(m.lent);
}
template <typename Io, typename M>
void RowsRefFields(Io& io, M& m) {
  io.U32(m.table);
  io.I64(m.n);
  io.I32(m.dim);
  io.Dtype(m.dtype);
  io.U32(m.segment);
  io.I64(m.ids_at);
  io.I64(m.rows_at);
}
template <typename Io, typename M>
void PushResultFields(Io& io, M& m) {
  StatusField(io, m.status);
  io.Bool(m.transport_failure);
  io.Enum(m.response.outcome, PushResponse::Outcome::kSkippedNonFinite, "outcome");
  io.I64(m.response.global_step);
}
template <typename Io, typename M>
void PullOrderFields(Io& io, M& m) {
  auto& q = m.request;
  io.I32(q.worker_id);
  io.U64(q.session);
  io.I64(q.min_step);
  io.I64(q.since_step);
  DecisionsFields(io, q.decisions);
  io.I64(q.timeout_ms);
  io.Bool(q.moving_averages);
  io.Bool(q.sparse_read_only);
  io.U64(q.after_push);
  io.Dtype(q.wire_dtype);
  io.I64(q.elastic_read_ahead);
  io.List(m.destinations, 25, [&io](auto& d) {
    io.U32(d.key);
    io.Enum(d.kind, Destination::Kind::kStaging, "destination kind");
    io.U32(d.segment);
    io.I64(d.at);
    io.I64(d.length);
  });
  io.List(m.sparse, 36, [&io](auto& s) {
    io.U32(s.table);
    io.I64(s.n);
    io.I32(s.dim);
    io.U32(s.segment);
    io.I64(s.ids_at);
    io.I64(s.rows_at);
  });
}
template <typename Io, typename M>
void PullHeaderFields(Io& io, M& m) {
  io.I64(m.step);
  DecisionsFields(io, m.decisions);
  io.Bool(m.training_done);
  io.Bool(m.tentative);
  io.I64(m.elastic.version);
  io.List(m.elastic.workers, 4, [&io](auto& worker) { io.I32(worker); });
  io.I32(m.elastic.aggregating);
  io.I64(m.elastic.first_batch);
  io.List(m.elastic.batches, 8, [&io](auto& batch) { io.I64(batch); });
  io.I32(m.elastic.unit);
  io.I64(m.elastic.next_batch);
  io.I64(m.ps_set.version);
  io.I64(m.ps_set.step);
  io.List(m.ps_set.hosts, 4, [&io](auto& host) { io.Str(host, 256); });  // host:port
  io.List(m.ps_set.leaving, 4, [&io](auto& host) { io.Str(host, 256); });
}
template <typename Io, typename M>
void PiecesFields(Io& io, M& m) {
  io.List(m.slices, 21, [&io](auto& p) {
    io.U32(p.key);
    io.I64(p.offset);
    io.I64(p.n);
    io.Dtype(p.dtype);
  });
  io.List(m.rows, 21, [&io](auto& p) {
    io.U32(p.table);
    io.I64(p.first);
    io.I64(p.n);
    io.Dtype(p.dtype);
  });
}


template <typename T>
absl::StatusOr<T> Done(Reader& r, T value) {
  absl::Status s = r.Finish();
  if (!s.ok()) return s;
  return value;
}

// A message encoded and decoded by its *Fields function.
template <typename M>
std::string Encode(const M& m, void (*fields)(Writer&, const M&)) {
  Writer w;
  fields(w, m);
  return w.Take();
}
template <typename M>
absl::StatusOr<M> Decode(absl::string_view payload, const char* what, void (*fields)(Reader&, M&)) {
  Reader r(payload, what);
  M m;
  fields(r, m);
  return Done(r, std::move(m));
}

}  // namespace

absl::string_view FrameTypeName(FrameType type) {
  switch (type) {
    case FrameType::kHello: return "Hello";
    case FrameType::kWelcome: return "Welcome";
    case FrameType::kSegment: return "Segment";
    case FrameType::kPushBegin: return "PushBegin";
    case FrameType::kPushData: return "PushData";
    case FrameType::kPushRows: return "PushRows";
    case FrameType::kPushFinish: return "PushFinish";
    case FrameType::kPushAbandon: return "PushAbandon";
    case FrameType::kPushResult: return "PushResult";
    case FrameType::kPullRequest: return "PullRequest";
    case FrameType::kPullHeader: return "PullHeader";
    case FrameType::kPullPieces: return "PullPieces";
    case FrameType::kPullEnd: return "PullEnd";
    case FrameType::kPushNorm: return "PushNorm";
  }
  return "unknown";
}

std::string EncodeFrame(FrameType type, absl::string_view payload) {
  Writer w;
  w.U32(kShmFrameMagic);
  w.U16(kShmFrameVersion);
  w.U16(static_cast<uint16_t>(type));
  w.U32(static_cast<uint32_t>(payload.size()));
  w.U32(crc32c::Value(payload.data(), payload.size()));
  std::string out = w.Take();
  out.append(payload.data(), payload.size());
  return out;
}

absl::StatusOr<Frame> DecodeFrame(absl::string_view bytes) {
  if (bytes.size() < kFrameHeaderBytes) {
    return absl::DataLossError(absl::StrCat("shared-memory frame of ", bytes.size(), " bytes, shorter than its ",
                                            kFrameHeaderBytes, "-byte header"));
  }
  Reader r(bytes.substr(0, kFrameHeaderBytes), "header");
  const uint32_t magic = r.U32();
  const uint16_t version = r.U16();
  const uint16_t type = r.U16();
  const uint32_t length = r.U32();
  const uint32_t crc = r.U32();
  if (magic != kShmFrameMagic) {
    return absl::DataLossError(absl::StrCat("shared-memory frame with magic 0x", absl::Hex(magic),
                                            ", not a dtrain lane (0x", absl::Hex(kShmFrameMagic), ")"));
  }
  if (version != kShmFrameVersion) {
    return absl::DataLossError(absl::StrCat("shared-memory frame version ", version, ", this build speaks ",
                                            kShmFrameVersion, ": run the same dtrain on the worker and the ps"));
  }
  if (type < static_cast<uint16_t>(FrameType::kHello) || type > static_cast<uint16_t>(FrameType::kPushNorm)) {
    return absl::DataLossError(absl::StrCat("shared-memory frame of unknown type ", type));
  }
  if (length > kMaxFramePayload || length != bytes.size() - kFrameHeaderBytes) {
    return absl::DataLossError(absl::StrCat("shared-memory frame says ", length, " payload bytes, carries ",
                                            bytes.size() - kFrameHeaderBytes));
  }
  const absl::string_view payload = bytes.substr(kFrameHeaderBytes);
  if (crc32c::Value(payload.data(), payload.size()) != crc) {
    return absl::DataLossError(absl::StrCat("shared-memory frame ", FrameTypeName(static_cast<FrameType>(type)),
                                            ": payload checksum mismatch"));
  }
  return Frame{static_cast<FrameType>(type), std::string(payload)};
}

std::string EncodeHello(const Hello& m) {
  Writer w;
  w.U8(static_cast<uint8_t>(m.lane));
  w.I32(m.worker_id);
  w.Str(m.ticket);
  return w.Take();
}
absl::StatusOr<Hello> DecodeHello(absl::string_view payload) {
  Reader r(payload, "Hello");
  Hello m;
  const uint8_t lane = r.U8();
  if (lane != static_cast<uint8_t>(LaneKind::kPush) && lane != static_cast<uint8_t>(LaneKind::kPull)) {
    r.Fail(absl::StrCat("lane kind ", lane));
  }
  m.lane = static_cast<LaneKind>(lane);
  m.worker_id = r.I32();
  m.ticket = r.Str(64);
  return Done(r, std::move(m));
}


std::string EncodeSegment(const SegmentInfo& m) { return Encode(m, SegmentFields<Writer, const SegmentInfo>); }
absl::StatusOr<SegmentInfo> DecodeSegment(absl::string_view payload) {
  Reader r(payload, "Segment");
  SegmentInfo m;
  SegmentFields(r, m);
  if (m.bytes <= 0) r.Fail(absl::StrCat("segment of ", m.bytes, " bytes"));
  return Done(r, std::move(m));
}

std::string EncodeNorm(double norm) {
  uint64_t bits;
  std::memcpy(&bits, &norm, 8);
  Writer w;
  w.U64(bits);
  return w.Take();
}
absl::StatusOr<double> DecodeNorm(absl::string_view payload) {
  Reader r(payload, "PushNorm");
  const uint64_t bits = r.U64();
  double norm;
  std::memcpy(&norm, &bits, 8);
  return Done(r, norm);
}

std::string EncodePushHeader(const PushHeader& m) { return Encode(m, PushHeaderFields<Writer, const PushHeader>); }
absl::StatusOr<PushHeader> DecodePushHeader(absl::string_view payload) {
  return Decode<PushHeader>(payload, "PushBegin", PushHeaderFields<Reader, PushHeader>);
}

std::string EncodeDataRef(const DataRef& m) { return Encode(m, DataRefFields<Writer, const DataRef>); }
absl::StatusOr<DataRef> DecodeDataRef(absl::string_view payload) {
  return Decode<DataRef>(payload, "PushData", DataRefFields<Reader, DataRef>);
}

std::string EncodeRowsRef(const RowsRef& m) { return Encode(m, RowsRefFields<Writer, const RowsRef>); }
absl::StatusOr<RowsRef> DecodeRowsRef(absl::string_view payload) {
  return Decode<RowsRef>(payload, "PushRows", RowsRefFields<Reader, RowsRef>);
}

std::string EncodePushResult(const PushResult& m) { return Encode(m, PushResultFields<Writer, const PushResult>); }
absl::StatusOr<PushResult> DecodePushResult(absl::string_view payload) {
  return Decode<PushResult>(payload, "PushResult", PushResultFields<Reader, PushResult>);
}

std::string EncodePullOrder(const PullOrder& m) { return Encode(m, PullOrderFields<Writer, const PullOrder>); }
absl::StatusOr<PullOrder> DecodePullOrder(absl::string_view payload) {
  return Decode<PullOrder>(payload, "PullRequest", PullOrderFields<Reader, PullOrder>);
}

std::string EncodePullHeader(const PullHeader& m) { return Encode(m, PullHeaderFields<Writer, const PullHeader>); }
absl::StatusOr<PullHeader> DecodePullHeader(absl::string_view payload) {
  return Decode<PullHeader>(payload, "PullHeader", PullHeaderFields<Reader, PullHeader>);
}

std::string EncodePieces(const PiecesWritten& m) { return Encode(m, PiecesFields<Writer, const PiecesWritten>); }
absl::StatusOr<PiecesWritten> DecodePieces(absl::string_view payload) {
  return Decode<PiecesWritten>(payload, "PullPieces", PiecesFields<Reader, PiecesWritten>);
}

}  // namespace dtrain::ps::shm
