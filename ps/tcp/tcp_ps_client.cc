#include "ps/tcp/tcp_ps_client.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/cancellation.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "ps/shm/shm_frame.h"
#include "ps/tcp/tcp_frame.h"
#include "ps/tcp/tcp_lane.h"

namespace dtrain::ps::tcp {
namespace {

// One attachment: its two lanes, each used by one call at a time.
struct Connection {
  std::unique_ptr<TcpLane> push, pull;
  std::atomic<bool> push_busy{false}, pull_busy{false};
  int port = 0;  // the ps's data port
  bool dead() const { return push->dead() || pull->dead(); }
  void Kill() {
    push->Shutdown();
    pull->Shutdown();
  }
};

// Marks a lane busy for a scope.
class Busy {
 public:
  explicit Busy(std::atomic<bool>* flag) : flag_(flag) {}
  ~Busy() {
    if (flag_ != nullptr) flag_->store(false, std::memory_order_release);
  }
  static bool TryTake(std::atomic<bool>* flag) {
    bool expected = false;
    return flag->compare_exchange_strong(expected, true, std::memory_order_acq_rel);
  }
  Busy(Busy&& o) noexcept : flag_(o.flag_) { o.flag_ = nullptr; }

 private:
  std::atomic<bool>* flag_;
};

// Whether a failed call's status means that the lane itself failed (and the call may be retried elsewhere).
bool LaneStatus(const absl::Status& s) {
  return s.code() == absl::StatusCode::kUnavailable || s.code() == absl::StatusCode::kDeadlineExceeded ||
         s.code() == absl::StatusCode::kDataLoss;
}

}  // namespace

class TcpPsClient final : public PsInterface {
 public:
  TcpPsClient(std::unique_ptr<PsInterface> control, TcpAttachFn attach, TcpClientOptions options)
      : control_(std::move(control)), attach_(std::move(attach)), options_(std::move(options)) {
    std::string host;
    int port = 0;
    address_ok_ = SplitHostPort(options_.address, &host, &port);
    host_ = host;
  }

  absl::StatusOr<RegisterResponse> Register(const RegisterRequest& request) override {
    ASSIGN_OR_RETURN(RegisterResponse r, control_->Register(request));
    {
      absl::MutexLock lock(&mu_);
      worker_id_ = request.worker_id;
      session_ = r.session;
      table_dims_.clear();
      for (const SparseTableSpec& t : request.config.tables) table_dims_[t.table] = t.dim;
    }
    if (options_.attach_at_register) {
      absl::StatusOr<std::shared_ptr<Connection>> c = Acquire();
      if (!c.ok() && c.status().code() != absl::StatusCode::kUnavailable) return c.status();
    }
    return r;
  }
  absl::StatusOr<std::unique_ptr<SliceUpload>> StartInitialize(int worker_id) override {
    return control_->StartInitialize(worker_id);
  }
  absl::StatusOr<std::unique_ptr<SliceUpload>> StartPush(const PushHeader& header) override;
  absl::Status Pull(const PullRequest& request, PullReceiver* receiver) override;
  absl::Status Done(const DoneRequest& request) override { return control_->Done(request); }
  absl::StatusOr<int64_t> Heartbeat(int worker_id, uint64_t session) override {
    return control_->Heartbeat(worker_id, session);
  }
  absl::StatusOr<TrainingStats> GetStats() override { return control_->GetStats(); }
  absl::StatusOr<CheckpointProbe> Probe(const TrainConfig& config) override { return control_->Probe(config); }
  absl::StatusOr<std::string> Control(const ControlRequest& request) override { return control_->Control(request); }
  absl::Status Restore(const TrainConfig& config, int worker_id, int64_t step) override {
    return control_->Restore(config, worker_id, step);
  }

  // The live attachment; null when data goes to control_ (fallback, not registered yet, or for one call: the ps
  // refused the offer for this session). Attaches when there is none. Unavailable when the ps cannot be reached
  // now; FailedPrecondition (required) when the lanes do not apply.
  absl::StatusOr<std::shared_ptr<Connection>> Acquire();
  // A lane failed: the attachment is dropped (the next call attaches again); the call returns Unavailable.
  absl::Status LaneFailed(const std::shared_ptr<Connection>& c, const absl::Status& why, const char* what);
  std::string Who() const { return absl::StrCat("ps task ", options_.task, " (", options_.address, ")"); }
  const TcpClientOptions& options() const { return options_; }
  void Count(std::atomic<int64_t> TcpCounters::*field, int64_t n = 1) {
    if (options_.counters != nullptr) (options_.counters->*field) += n;
  }
  int TableDim(uint32_t table) {
    absl::MutexLock lock(&mu_);
    auto it = table_dims_.find(table);
    return it == table_dims_.end() ? -1 : it->second;
  }
  PsInterface* control() { return control_.get(); }

 private:
  // Connects the two lanes of a fresh offer; null with `why_not` when the lanes do not apply.
  absl::StatusOr<std::shared_ptr<Connection>> Attach(int worker_id, uint64_t session, std::string* why_not);

  std::unique_ptr<PsInterface> control_;
  const TcpAttachFn attach_;
  const TcpClientOptions options_;
  absl::Status address_ok_;
  std::string host_;
  absl::Mutex attach_mu_;  // one attach at a time
  absl::Mutex mu_;
  int worker_id_ ABSL_GUARDED_BY(mu_) = -1;
  uint64_t session_ ABSL_GUARDED_BY(mu_) = 0;  // this worker's session on the task (the offer asks for it)
  std::map<uint32_t, int> table_dims_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<Connection> connection_ ABSL_GUARDED_BY(mu_);
  bool fallback_ ABSL_GUARDED_BY(mu_) = false;  // data calls go to control_ for good
  absl::Status unusable_ ABSL_GUARDED_BY(mu_);   // required: why the lanes do not apply
  bool logged_ ABSL_GUARDED_BY(mu_) = false;     // the transport line was written
};

absl::StatusOr<std::shared_ptr<Connection>> TcpPsClient::Attach(int worker_id, uint64_t session,
                                                            std::string* why_not) {
  if (!options_.disabled_because.empty()) {
    *why_not = options_.disabled_because;
    return nullptr;
  }
  if (!address_ok_.ok()) {
    *why_not = std::string(address_ok_.message());
    return nullptr;
  }
  absl::StatusOr<TcpOffer> offer = attach_(TcpAttachRequest{worker_id, session});
  if (!offer.ok()) {
    // PermissionDenied: the ps does not know this session (it restarted, or dropped the worker): Acquire sends this
    // one call through the control plane, whose answer (register again) the worker acts on; the next asks again.
    if (offer.status().code() == absl::StatusCode::kPermissionDenied) return offer.status();
    if (offer.status().code() == absl::StatusCode::kUnavailable ||
        offer.status().code() == absl::StatusCode::kDeadlineExceeded) {
      return absl::UnavailableError(absl::StrCat(Who(), ": asking for TCP lanes: ", offer.status().message()));
    }
    *why_not = offer.status().code() == absl::StatusCode::kUnimplemented
                   ? "the ps offers no TCP lanes (its --transport is grpc or shm, or an older dtrain_ps)"
                   : std::string(offer.status().message());
    return nullptr;
  }
  auto c = std::make_shared<Connection>();
  const absl::Time deadline = absl::Now() + options_.connect_timeout;
  for (shm::LaneKind kind : {shm::LaneKind::kPush, shm::LaneKind::kPull}) {
    absl::StatusOr<std::unique_ptr<TcpLane>> lane = TcpLane::Connect(host_, offer->port, deadline);
    if (!lane.ok()) {
      // The ps answered on gRPC but its data port cannot be reached (a firewall, another network): not a
      // passing failure.
      *why_not = absl::StrCat("its TCP data port cannot be reached: ", lane.status().message());
      return nullptr;
    }
    shm::Hello hello;
    hello.lane = kind;
    hello.worker_id = worker_id;
    hello.ticket = kind == shm::LaneKind::kPush ? offer->push_ticket : offer->pull_ticket;
    RETURN_IF_ERROR((*lane)->Send(TcpFrameType::kHello, shm::EncodeHello(hello), nullptr, 0, deadline));
    absl::StatusOr<TcpLane::Frame> welcome = (*lane)->Receive(deadline);
    if (!welcome.ok() || welcome->type != TcpFrameType::kWelcome) {
      return absl::UnavailableError(absl::StrCat(
          Who(), ": the ps did not welcome the TCP lane: ",
          welcome.ok() ? std::string(TcpFrameTypeName(welcome->type)) : std::string(welcome.status().message())));
    }
    ASSIGN_OR_RETURN(shm::PushResult w, shm::DecodePushResult(welcome->payload));
    if (!w.status.ok()) {
      // A ticket refused: the offer expired or another attach took over; try again later.
      return absl::UnavailableError(absl::StrCat(Who(), ": the ps refused the TCP lane: ", w.status.message()));
    }
    (kind == shm::LaneKind::kPush ? c->push : c->pull) = std::move(*lane);
  }
  c->port = offer->port;
  Count(&TcpCounters::attaches);
  return c;
}

absl::StatusOr<std::shared_ptr<Connection>> TcpPsClient::Acquire() {
  int worker_id;
  uint64_t session;
  {
    absl::MutexLock lock(&mu_);
    if (!unusable_.ok()) return unusable_;
    if (fallback_) return nullptr;
    if (connection_ != nullptr && !connection_->dead()) return connection_;
    if (worker_id_ < 0) return nullptr;  // not registered yet: nothing to attach as
    worker_id = worker_id_;
    session = session_;
  }
  absl::MutexLock attach_lock(&attach_mu_);
  {
    absl::MutexLock lock(&mu_);  // another thread may have attached meanwhile
    if (connection_ != nullptr && !connection_->dead()) return connection_;
    if (fallback_) return nullptr;
  }
  std::string why_not;
  absl::StatusOr<std::shared_ptr<Connection>> c = Attach(worker_id, session, &why_not);
  if (!c.ok() && c.status().code() == absl::StatusCode::kPermissionDenied) return nullptr;  // this call only
  if (!c.ok()) return c.status();
  absl::MutexLock lock(&mu_);
  if (*c != nullptr) {
    connection_ = *c;
    if (!logged_) {
      logged_ = true;
      LOG(INFO) << Who() << ": data over TCP lanes (2 connections to port " << connection_->port
                << ": sent from the gradient buffers, received into the parameters); gRPC carries the control calls";
    }
    return connection_;
  }
  connection_ = nullptr;
  if (options_.required) {
    unusable_ =
        absl::FailedPreconditionError(absl::StrCat("--transport=tcp: ", Who(), " cannot be reached over TCP lanes: ",
                                                   why_not));
    LOG(ERROR) << unusable_.message();
    return unusable_;
  }
  fallback_ = true;
  LOG(INFO) << Who() << ": data through gRPC (" << why_not << ")";
  return nullptr;
}

absl::Status TcpPsClient::LaneFailed(const std::shared_ptr<Connection>& c, const absl::Status& why, const char* what) {
  if (why.code() != absl::StatusCode::kCancelled) {
    LOG(WARNING) << Who() << ": the TCP " << what << " failed (" << why.message() << "); the next call attaches again";
  }
  c->Kill();
  {
    absl::MutexLock lock(&mu_);
    if (connection_ == c) connection_ = nullptr;
  }
  const absl::StatusCode code =
      why.code() == absl::StatusCode::kCancelled ? absl::StatusCode::kCancelled : absl::StatusCode::kUnavailable;
  return absl::Status(code, absl::StrCat(Who(), ": ", what, " over TCP: ", why.message()));
}

namespace {

// An upload over the push lane.
class TcpUpload : public SliceUpload {
 public:
  TcpUpload(TcpPsClient* client, std::shared_ptr<Connection> c, Busy busy, Cancellation* cancel)
      : client_(client), c_(std::move(c)), busy_(std::move(busy)), cancel_(cancel) {
    if (cancel_ != nullptr) cancel_id_ = cancel_->Register([this] { c_->push->Shutdown(); });
  }
  ~TcpUpload() override {
    if (cancel_ != nullptr) cancel_->Deregister(cancel_id_);
    TcpLane* lane = c_->push.get();
    if (finish_sent_ && !answered_ && !lane->dead()) {
      // StartFinish without Finish: the outcome would be read as the next upload's. Read it now.
      absl::StatusOr<TcpLane::Frame> f = lane->Receive(absl::Now() + absl::Seconds(10));
      if (!f.ok() || f->type != TcpFrameType::kPushResult || f->bulk_bytes != 0) c_->Kill();
    } else if (open_ && !finished_ && !lane->dead()) {
      // Drop it on the ps, and wait until it has, so that the lane is clean for the next upload.
      const absl::Time deadline = absl::Now() + absl::Seconds(10);
      absl::Status s = lane->Send(TcpFrameType::kPushAbandon, "", nullptr, 0, deadline);
      absl::StatusOr<TcpLane::Frame> f = s.ok() ? lane->Receive(deadline) : absl::StatusOr<TcpLane::Frame>(s);
      if (!f.ok() || f->type != TcpFrameType::kPushResult || f->bulk_bytes != 0) c_->Kill();
    }
  }

  absl::Status Begin(const PushHeader& header) {
    RETURN_IF_ERROR(Check(c_->push->Send(TcpFrameType::kPushBegin, shm::EncodePushHeader(header))));
    open_ = true;
    return absl::OkStatus();
  }

  absl::Status Write(uint32_t key, int64_t offset, int64_t n, WireDtype dtype, const void* data) override {
    const Piece piece{key, offset, n, dtype, 0};
    ASSIGN_OR_RETURN(const uint64_t bytes, PieceBulkBytes(piece, false));
    const TcpLane::Bulk bulk{data, static_cast<size_t>(bytes)};  // sent from the caller's buffer
    RETURN_IF_ERROR(Check(c_->push->Send(TcpFrameType::kPushData, EncodeSlicePiece(piece), &bulk, 1, Deadline())));
    client_->Count(&TcpCounters::bytes_sent, static_cast<int64_t>(bytes));
    return absl::OkStatus();
  }

  absl::Status WriteSparse(uint32_t table, const int64_t* ids, int64_t n, int dim, WireDtype dtype,
                           const void* rows) override {
    if (dim < 1 || n < 0) return absl::InvalidArgumentError(absl::StrCat(n, " sparse rows of width ", dim));
    shm::RowsRef ref{table, n, dim, dtype, 0, 0, 0};
    const TcpLane::Bulk bulk[2] = {{ids, static_cast<size_t>(n) * 8},
                                   {rows, static_cast<size_t>(n) * dim * DtypeBytes(dtype)}};
    RETURN_IF_ERROR(Check(c_->push->Send(TcpFrameType::kPushRows, shm::EncodeRowsRef(ref), bulk, 2, Deadline())));
    client_->Count(&TcpCounters::bytes_sent, static_cast<int64_t>(bulk[0].bytes + bulk[1].bytes));
    return absl::OkStatus();
  }

  absl::Status SetGradientNorm(double norm) override {
    return Check(c_->push->Send(TcpFrameType::kPushNorm, shm::EncodeNorm(norm), nullptr, 0, Deadline()));
  }

  bool StartFinish() override {
    if (finish_sent_ || !send_status_.ok()) return false;
    finished_ = true;
    send_status_ = Check(c_->push->Send(TcpFrameType::kPushFinish, "", nullptr, 0, Deadline()));
    finish_sent_ = send_status_.ok();
    return finish_sent_;
  }

  absl::StatusOr<PushResponse> Finish() override {
    TcpLane* lane = c_->push.get();
    RETURN_IF_ERROR(send_status_);  // StartFinish's send failed
    if (!finish_sent_) {
      finished_ = true;
      RETURN_IF_ERROR(Check(lane->Send(TcpFrameType::kPushFinish, "", nullptr, 0, Deadline())));
      finish_sent_ = true;
    }
    answered_ = true;
    absl::StatusOr<TcpLane::Frame> f = lane->Receive(Deadline());
    if (!f.ok()) return Check(f.status());
    if (f->type != TcpFrameType::kPushResult || f->bulk_bytes != 0) {
      return Check(absl::DataLossError(absl::StrCat("answered a push with ", TcpFrameTypeName(f->type))));
    }
    absl::StatusOr<shm::PushResult> r = shm::DecodePushResult(f->payload);
    if (!r.ok()) return Check(r.status());
    if (!r->status.ok()) return r->status;
    client_->Count(&TcpCounters::tcp_pushes);
    return r->response;
  }

 private:
  absl::Time Deadline() const { return absl::Now() + client_->options().rpc_timeout; }
  template <typename T>
  T Check(T r) {
    const absl::Status& s = StatusOf(r);
    if (!s.ok() && LaneStatus(s)) {
      finished_ = true;
      const bool cancelled = cancel_ != nullptr && cancel_->cancelled();
      return T(client_->LaneFailed(c_, cancelled ? absl::CancelledError("cancelled") : s, "push"));
    }
    return r;
  }
  static const absl::Status& StatusOf(const absl::Status& s) { return s; }
  template <typename V>
  static const absl::Status& StatusOf(const absl::StatusOr<V>& r) {
    return r.status();
  }

  TcpPsClient* client_;
  std::shared_ptr<Connection> c_;
  Busy busy_;
  Cancellation* cancel_;
  int64_t cancel_id_ = 0;
  bool open_ = false, finished_ = false;
  bool finish_sent_ = false;  // the PushFinish frame is on the lane (by StartFinish or Finish)
  bool answered_ = false;     // Finish has read (or tried to read) its answer
  absl::Status send_status_;  // StartFinish's failed send, for Finish
};

// Reads `bytes` of a frame's bulk of `src_dtype` values into a receiver's buffer: straight in when the types
// agree, through `scratch` otherwise.
absl::Status ReadInto(TcpLane* lane, const PullReceiver::Buffer& dst, WireDtype src_dtype, int64_t values,
                      uint64_t bytes, std::vector<char>* scratch, absl::Time deadline) {
  if (dst.data == nullptr) return lane->SkipBulk(deadline);
  if (dst.dtype == src_dtype) return lane->ReadBulk(dst.data, bytes, deadline);
  if (dst.dtype != WireDtype::kF32) {
    return absl::InternalError("Pull: a receiver asked for a narrow dtype the pull does not carry");
  }
  scratch->resize(bytes);
  RETURN_IF_ERROR(lane->ReadBulk(scratch->data(), bytes, deadline));
  DecodeFloats(src_dtype, scratch->data(), values, static_cast<float*>(dst.data));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<SliceUpload>> TcpPsClient::StartPush(const PushHeader& header) {
  ASSIGN_OR_RETURN(std::shared_ptr<Connection> c, Acquire());
  if (c == nullptr || !Busy::TryTake(&c->push_busy)) {
    Count(&TcpCounters::control_pushes);
    return control_->StartPush(header);
  }
  auto upload = std::make_unique<TcpUpload>(this, c, Busy(&c->push_busy), header.cancel);
  RETURN_IF_ERROR(upload->Begin(header));
  return std::unique_ptr<SliceUpload>(std::move(upload));
}

absl::Status TcpPsClient::Pull(const PullRequest& request, PullReceiver* receiver) {
  ASSIGN_OR_RETURN(std::shared_ptr<Connection> c, Acquire());
  if (c == nullptr || !Busy::TryTake(&c->pull_busy)) {
    Count(&TcpCounters::control_pulls);
    return control_->Pull(request, receiver);
  }
  Busy busy(&c->pull_busy);
  TcpLane* lane = c->pull.get();
  auto lane_failed = [&](const absl::Status& s) {
    const bool cancelled = request.cancel != nullptr && request.cancel->cancelled();
    return LaneFailed(c, cancelled ? absl::CancelledError("cancelled") : s, "pull");
  };
  shm::PullOrder order;
  order.request = request;
  order.request.sparse.clear();
  order.request.cancel = nullptr;
  std::vector<TcpLane::Bulk> ids;
  std::map<uint32_t, std::pair<int64_t, int>> asked;  // table -> (rows, dim)
  for (const SparseIds& e : request.sparse) {
    const int dim = TableDim(e.table);
    if (dim < 1) return absl::InvalidArgumentError(absl::StrCat("pull of rows of unknown table ", e.table));
    shm::SparseOrder so;
    so.table = e.table;
    so.n = static_cast<int64_t>(e.ids.size());
    so.dim = dim;
    order.sparse.push_back(so);
    ids.push_back({e.ids.data(), e.ids.size() * 8});
    asked[e.table] = {so.n, dim};
  }
  // A cancelled pull shuts the lane (the attachment is dropped; the next call attaches again).
  const int64_t cancel_id = request.cancel != nullptr ? request.cancel->Register([lane] { lane->Shutdown(); }) : 0;
  auto deregister = absl::MakeCleanup([&] {
    if (request.cancel != nullptr) request.cancel->Deregister(cancel_id);
  });
  const absl::Time deadline =
      absl::Now() + absl::Milliseconds(std::max<int64_t>(0, request.timeout_ms)) + options_.rpc_timeout;
  if (absl::Status s = lane->Send(TcpFrameType::kPullRequest, shm::EncodePullOrder(order), ids.data(),
                                  static_cast<int>(ids.size()), deadline);
      !s.ok()) {
    return lane_failed(s);
  }
  // Until the ps's PullEnd has been read the lane is in the middle of this pull: leaving early (the receiver
  // refused something, a malformed frame) drops the attachment, so no later call reads this pull's frames.
  bool ended = false;
  auto drop_unless_ended = absl::MakeCleanup([&] {
    if (!ended) LaneFailed(c, absl::CancelledError("pull left early"), "pull").IgnoreError();
  });
  std::vector<char> scratch;
  while (true) {
    absl::StatusOr<TcpLane::Frame> f = lane->Receive(deadline);
    if (!f.ok()) return lane_failed(f.status());
    switch (f->type) {
      case TcpFrameType::kPullHeader: {
        absl::StatusOr<PullHeader> h = shm::DecodePullHeader(f->payload);
        if (!h.ok() || f->bulk_bytes != 0) return lane_failed(h.ok() ? absl::DataLossError("a header with data") : h.status());
        RETURN_IF_ERROR(receiver->OnHeader(*h));
        continue;
      }
      case TcpFrameType::kPullData: {
        absl::StatusOr<Piece> p = DecodeSlicePiece(f->payload);
        absl::StatusOr<uint64_t> bytes = p.ok() ? PieceBulkBytes(*p, false) : p.status();
        if (!bytes.ok() || *bytes != f->bulk_bytes) {
          return lane_failed(!bytes.ok() ? bytes.status()
                                         : absl::DataLossError(absl::StrCat(Who(), " sent ", p->n, " values in ",
                                                                            f->bulk_bytes, " bytes")));
        }
        // The receiver checks the key and the range (and may wait: a pull beside a push holds its values until
        // backward is over; the data waits in the socket meanwhile).
        ASSIGN_OR_RETURN(PullReceiver::Buffer dst, receiver->Destination(p->key, p->offset, p->n));
        if (absl::Status s = ReadInto(lane, dst, p->dtype, p->n, *bytes, &scratch, deadline); !s.ok()) {
          return LaneStatus(s) ? lane_failed(s) : s;
        }
        Count(&TcpCounters::bytes_received, static_cast<int64_t>(*bytes));
        RETURN_IF_ERROR(receiver->Written(p->key, p->offset, p->n));
        continue;
      }
      case TcpFrameType::kPullRows: {
        absl::StatusOr<Piece> p = DecodeRowPiece(f->payload);
        absl::StatusOr<uint64_t> bytes = p.ok() ? PieceBulkBytes(*p, true) : p.status();
        if (!bytes.ok() || *bytes != f->bulk_bytes) {
          return lane_failed(!bytes.ok() ? bytes.status() : absl::DataLossError("rows of another size than sent"));
        }
        auto it = asked.find(p->key);
        if (it == asked.end() || p->dim != it->second.second || !RangeWithin(p->offset, p->n, it->second.first)) {
          return absl::DataLossError(absl::StrCat(Who(), " sent ", p->n, " rows from row ", p->offset, " of table ",
                                                  p->key, ", which it was not asked for"));
        }
        ASSIGN_OR_RETURN(PullReceiver::Buffer dst, receiver->SparseDestination(p->key, p->offset, p->n, p->dim));
        if (absl::Status s = ReadInto(lane, dst, p->dtype, p->n * p->dim, *bytes, &scratch, deadline); !s.ok()) {
          return LaneStatus(s) ? lane_failed(s) : s;
        }
        Count(&TcpCounters::bytes_received, static_cast<int64_t>(*bytes));
        RETURN_IF_ERROR(receiver->SparseWritten(p->key, p->offset, p->n));
        continue;
      }
      case TcpFrameType::kPullEnd: {
        absl::StatusOr<shm::PushResult> end = shm::DecodePushResult(f->payload);
        if (!end.ok()) return lane_failed(end.status());
        ended = true;
        if (!end->status.ok()) {
          return absl::Status(end->status.code(),
                              absl::StrCat("ps ", options_.address, ": Pull: ", end->status.message()));
        }
        Count(&TcpCounters::tcp_pulls);
        return absl::OkStatus();
      }
      default:
        return lane_failed(absl::DataLossError(absl::StrCat("answered a pull with ", TcpFrameTypeName(f->type))));
    }
  }
}

std::unique_ptr<PsInterface> NewTcpPsClient(std::unique_ptr<PsInterface> control, TcpAttachFn attach,
                                            TcpClientOptions options) {
  return std::make_unique<TcpPsClient>(std::move(control), std::move(attach), std::move(options));
}

}  // namespace dtrain::ps::tcp
