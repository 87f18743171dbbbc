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

void PutDecision(Writer& w, const StepDecision& d) {
  w.I64(d.step);
  w.U32(static_cast<uint32_t>(d.workers.size()));
  for (int worker : d.workers) w.I32(worker);
  w.Bool(d.checkpoint);
  w.Bool(d.delta);
  w.Str(d.mac);
}
StepDecision GetDecision(Reader& r) {
  StepDecision d;
  d.step = r.I64();
  const uint32_t n = r.Count(4);
  for (uint32_t i = 0; i < n && r.ok(); ++i) d.workers.push_back(r.I32());
  d.checkpoint = r.Bool();
  d.delta = r.Bool();
  d.mac = r.Str(256);
  return d;
}
void PutDecisions(Writer& w, const std::vector<StepDecision>& ds) {
  w.U32(static_cast<uint32_t>(ds.size()));
  for (const StepDecision& d : ds) PutDecision(w, d);
}
std::vector<StepDecision> GetDecisions(Reader& r) {
  std::vector<StepDecision> ds;
  const uint32_t n = r.Count(18);
  for (uint32_t i = 0; i < n && r.ok(); ++i) ds.push_back(GetDecision(r));
  return ds;
}

template <typename T>
absl::StatusOr<T> Done(Reader& r, T value) {
  absl::Status s = r.Finish();
  if (!s.ok()) return s;
  return value;
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


std::string EncodeSegment(const SegmentInfo& m) {
  Writer w;
  w.U32(m.segment);
  w.I64(m.bytes);
  return w.Take();
}
absl::StatusOr<SegmentInfo> DecodeSegment(absl::string_view payload) {
  Reader r(payload, "Segment");
  SegmentInfo m;
  m.segment = r.U32();
  m.bytes = r.I64();
  if (m.bytes <= 0) r.Fail(absl::StrCat("segment of ", m.bytes, " bytes"));
  return Done(r, m);
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

std::string EncodePushHeader(const PushHeader& m) {
  Writer w;
  w.I32(m.worker_id);
  w.I64(m.step);
  w.U64(m.request_id);
  w.Bool(m.commit);
  w.U64(m.session);
  w.Str(m.input_position);
  w.Bool(m.apply_early);
  return w.Take();
}
absl::StatusOr<PushHeader> DecodePushHeader(absl::string_view payload) {
  Reader r(payload, "PushBegin");
  PushHeader m;
  m.worker_id = r.I32();
  m.step = r.I64();
  m.request_id = r.U64();
  m.commit = r.Bool();
  m.session = r.U64();
  m.input_position = r.Str(64 << 10);
  m.apply_early = r.Bool();
  return Done(r, std::move(m));
}

std::string EncodeDataRef(const DataRef& m) {
  Writer w;
  w.U32(m.key);
  w.I64(m.offset);
  w.I64(m.n);
  w.U8(static_cast<uint8_t>(m.dtype));
  w.U32(m.segment);
  w.I64(m.at);
  w.Bool(m.lent);
  return w.Take();
}
absl::StatusOr<DataRef> DecodeDataRef(absl::string_view payload) {
  Reader r(payload, "PushData");
  DataRef m;
  m.key = r.U32();
  m.offset = r.I64();
  m.n = r.I64();
  m.dtype = r.Dtype();
  m.segment = r.U32();
  m.at = r.I64();
  m.lent = r.Bool();
  return Done(r, m);
}

std::string EncodeRowsRef(const RowsRef& m) {
  Writer w;
  w.U32(m.table);
  w.I64(m.n);
  w.I32(m.dim);
  w.U8(static_cast<uint8_t>(m.dtype));
  w.U32(m.segment);
  w.I64(m.ids_at);
  w.I64(m.rows_at);
  return w.Take();
}
absl::StatusOr<RowsRef> DecodeRowsRef(absl::string_view payload) {
  Reader r(payload, "PushRows");
  RowsRef m;
  m.table = r.U32();
  m.n = r.I64();
  m.dim = r.I32();
  m.dtype = r.Dtype();
  m.segment = r.U32();
  m.ids_at = r.I64();
  m.rows_at = r.I64();
  return Done(r, m);
}

std::string EncodePushResult(const PushResult& m) {
  Writer w;
  PutStatus(w, m.status);
  w.Bool(m.transport_failure);
  w.U8(static_cast<uint8_t>(m.response.outcome));
  w.I64(m.response.global_step);
  return w.Take();
}
absl::StatusOr<PushResult> DecodePushResult(absl::string_view payload) {
  Reader r(payload, "PushResult");
  PushResult m;
  m.status = GetStatus(r);
  m.transport_failure = r.Bool();
  const uint8_t outcome = r.U8();
  if (outcome > static_cast<uint8_t>(PushResponse::Outcome::kSkippedNonFinite)) r.Fail(absl::StrCat("outcome ", outcome));
  m.response.outcome = static_cast<PushResponse::Outcome>(outcome);
  m.response.global_step = r.I64();
  return Done(r, std::move(m));
}

std::string EncodePullOrder(const PullOrder& m) {
  Writer w;
  const PullRequest& q = m.request;
  w.I32(q.worker_id);
  w.U64(q.session);
  w.I64(q.min_step);
  w.I64(q.since_step);
  PutDecisions(w, q.decisions);
  w.I64(q.timeout_ms);
  w.Bool(q.moving_averages);
  w.Bool(q.sparse_read_only);
  w.U64(q.after_push);
  w.U8(static_cast<uint8_t>(q.wire_dtype));
  w.U32(static_cast<uint32_t>(m.destinations.size()));
  for (const Destination& d : m.destinations) {
    w.U32(d.key);
    w.U8(static_cast<uint8_t>(d.kind));
    w.U32(d.segment);
    w.I64(d.at);
    w.I64(d.length);
  }
  w.U32(static_cast<uint32_t>(m.sparse.size()));
  for (const SparseOrder& s : m.sparse) {
    w.U32(s.table);
    w.I64(s.n);
    w.I32(s.dim);
    w.U32(s.segment);
    w.I64(s.ids_at);
    w.I64(s.rows_at);
  }
  return w.Take();
}
absl::StatusOr<PullOrder> DecodePullOrder(absl::string_view payload) {
  Reader r(payload, "PullRequest");
  PullOrder m;
  PullRequest& q = m.request;
  q.worker_id = r.I32();
  q.session = r.U64();
  q.min_step = r.I64();
  q.since_step = r.I64();
  q.decisions = GetDecisions(r);
  q.timeout_ms = r.I64();
  q.moving_averages = r.Bool();
  q.sparse_read_only = r.Bool();
  q.after_push = r.U64();
  q.wire_dtype = r.Dtype();
  const uint32_t nd = r.Count(25);
  for (uint32_t i = 0; i < nd && r.ok(); ++i) {
    Destination d;
    d.key = r.U32();
    const uint8_t kind = r.U8();
    if (kind > static_cast<uint8_t>(Destination::Kind::kStaging)) r.Fail(absl::StrCat("destination kind ", kind));
    d.kind = static_cast<Destination::Kind>(kind);
    d.segment = r.U32();
    d.at = r.I64();
    d.length = r.I64();
    m.destinations.push_back(d);
  }
  const uint32_t ns = r.Count(36);
  for (uint32_t i = 0; i < ns && r.ok(); ++i) {
    SparseOrder s;
    s.table = r.U32();
    s.n = r.I64();
    s.dim = r.I32();
    s.segment = r.U32();
    s.ids_at = r.I64();
    s.rows_at = r.I64();
    m.sparse.push_back(s);
  }
  return Done(r, std::move(m));
}

std::string EncodePullHeader(const PullHeader& m) {
  Writer w;
  w.I64(m.step);
  PutDecisions(w, m.decisions);
  w.Bool(m.training_done);
  w.Bool(m.tentative);
  w.I64(m.elastic.version);
  w.U32(static_cast<uint32_t>(m.elastic.workers.size()));
  for (int x : m.elastic.workers) w.I32(x);
  w.I32(m.elastic.aggregating);
  w.I64(m.elastic.first_batch);
  w.U32(static_cast<uint32_t>(m.elastic.batches.size()));
  for (int64_t b : m.elastic.batches) w.I64(b);
  w.I32(m.elastic.unit);
  w.I64(m.ps_set.version);
  w.I64(m.ps_set.step);
  for (const std::vector<std::string>* list : {&m.ps_set.hosts, &m.ps_set.leaving}) {
    w.U32(static_cast<uint32_t>(list->size()));
    for (const std::string& h : *list) w.Str(h);
  }
  return w.Take();
}
absl::StatusOr<PullHeader> DecodePullHeader(absl::string_view payload) {
  Reader r(payload, "PullHeader");
  PullHeader m;
  m.step = r.I64();
  m.decisions = GetDecisions(r);
  m.training_done = r.Bool();
  m.tentative = r.Bool();
  m.elastic.version = r.I64();
  const uint32_t nw = r.Count(4);
  for (uint32_t i = 0; i < nw && r.ok(); ++i) m.elastic.workers.push_back(r.I32());
  m.elastic.aggregating = r.I32();
  m.elastic.first_batch = r.I64();
  const uint32_t nb = r.Count(8);
  for (uint32_t i = 0; i < nb && r.ok(); ++i) m.elastic.batches.push_back(r.I64());
  m.elastic.unit = r.I32();
  m.ps_set.version = r.I64();
  m.ps_set.step = r.I64();
  for (std::vector<std::string>* list : {&m.ps_set.hosts, &m.ps_set.leaving}) {
    const uint32_t n = r.Count(4);
    for (uint32_t i = 0; i < n && r.ok(); ++i) list->push_back(r.Str(256));  // host:port
  }
  return Done(r, std::move(m));
}

std::string EncodePieces(const PiecesWritten& m) {
  Writer w;
  w.U32(static_cast<uint32_t>(m.slices.size()));
  for (const SlicePiece& p : m.slices) {
    w.U32(p.key);
    w.I64(p.offset);
    w.I64(p.n);
    w.U8(static_cast<uint8_t>(p.dtype));
  }
  w.U32(static_cast<uint32_t>(m.rows.size()));
  for (const RowPiece& p : m.rows) {
    w.U32(p.table);
    w.I64(p.first);
    w.I64(p.n);
    w.U8(static_cast<uint8_t>(p.dtype));
  }
  return w.Take();
}
absl::StatusOr<PiecesWritten> DecodePieces(absl::string_view payload) {
  Reader r(payload, "PullPieces");
  PiecesWritten m;
  const uint32_t ns = r.Count(21);
  for (uint32_t i = 0; i < ns && r.ok(); ++i) {
    SlicePiece p;
    p.key = r.U32();
    p.offset = r.I64();
    p.n = r.I64();
    p.dtype = r.Dtype();
    m.slices.push_back(p);
  }
  const uint32_t nr = r.Count(21);
  for (uint32_t i = 0; i < nr && r.ok(); ++i) {
    RowPiece p;
    p.table = r.U32();
    p.first = r.I64();
    p.n = r.I64();
    p.dtype = r.Dtype();
    m.rows.push_back(p);
  }
  return Done(r, std::move(m));
}

}  // namespace dtrain::ps::shm
