#include "ps/shm/shm_ps_client.h"

#include <unistd.h>

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
#include "ps/shm/shm_lane.h"

namespace dtrain::ps::shm {
namespace {

int64_t Align(int64_t x, int64_t a) { return (x + a - 1) / a * a; }

// One lane of an attachment and what it carries: the segments it has shared (numbers are per lane: the push
// lane's odd, the pull lane's even, so the two never clash on the ps) and its staging segment.
class LaneState {
 public:
  LaneState(std::unique_ptr<Lane> lane, uint32_t first_id) : lane_(std::move(lane)), next_id_(first_id) {}
  Lane* lane() { return lane_.get(); }

  // The number of `seg` on this lane, sharing it first if needed.
  absl::StatusOr<uint32_t> Share(const std::shared_ptr<ShmSegment>& seg) {
    auto it = ids_.find(seg.get());
    if (it != ids_.end()) return it->second;
    const uint32_t id = next_id_;
    next_id_ += 2;
    RETURN_IF_ERROR(lane_->Send(FrameType::kSegment, EncodeSegment(SegmentInfo{id, seg->size()}), seg->fd()));
    ids_[seg.get()] = id;
    kept_.push_back(seg);  // alive while the ps may map it
    return id;
  }
  // A staging segment of at least `bytes` (a new, larger one when the current is too small; the old ones stay
  // alive: the ps may still hold them mapped).
  absl::StatusOr<std::pair<ShmSegment*, uint32_t>> Staging(int64_t bytes) {
    if (staging_ == nullptr || staging_->size() < bytes) {
      const int64_t size = std::max<int64_t>(Align(bytes, 1 << 20), staging_ ? 2 * staging_->size() : 1 << 20);
      ASSIGN_OR_RETURN(std::unique_ptr<ShmSegment> seg, ShmSegment::Create(size));
      staging_ = std::shared_ptr<ShmSegment>(std::move(seg));
    }
    ASSIGN_OR_RETURN(uint32_t id, Share(staging_));
    return std::make_pair(staging_.get(), id);
  }

 private:
  std::unique_ptr<Lane> lane_;
  uint32_t next_id_;
  std::map<const ShmSegment*, uint32_t> ids_;
  std::vector<std::shared_ptr<ShmSegment>> kept_;
  std::shared_ptr<ShmSegment> staging_;
};

// One attachment: its two lanes, each used by one call at a time.
struct Connection {
  std::unique_ptr<LaneState> push, pull;
  std::unique_ptr<ShmSegment> doorbells;  // the lanes' LaneDoorbells (kDoorbellSegmentBytes)
  std::atomic<bool> push_busy{false}, pull_busy{false};
  bool dead() const { return push->lane()->dead() || pull->lane()->dead() || push->lane()->PeerClosed(); }
  void Kill() {
    push->lane()->Shutdown();
    pull->lane()->Shutdown();
  }
};

// Marks a lane busy for a scope; the lane is returned by the destructor.
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

}  // namespace

class ShmPsClient final : public PsInterface {
 public:
  ShmPsClient(std::unique_ptr<PsInterface> control, ShmAttachFn attach, ShmClientOptions options)
      : control_(std::move(control)), attach_(std::move(attach)), options_(std::move(options)) {}

  absl::StatusOr<RegisterResponse> Register(const RegisterRequest& request) override {
    ASSIGN_OR_RETURN(RegisterResponse r, control_->Register(request));
    {
      absl::MutexLock lock(&mu_);
      worker_id_ = request.worker_id;
      session_ = r.session;
      slices_ = request.config.slices;
      table_dims_.clear();
      for (const SparseTableSpec& t : request.config.tables) table_dims_[t.table] = t.dim;
    }
    // Attach now, so that the log says at once which transport this connection uses (and --transport=shm
    // fails at once when it cannot). A ps that is unreachable this instant is attached to by the next call.
    absl::StatusOr<std::shared_ptr<Connection>> c = Acquire();
    if (!c.ok() && c.status().code() != absl::StatusCode::kUnavailable) return c.status();
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
  // Attached: a call costs the ps's own work and a few frames, less than handing it to another thread.
  bool PrefersInlineCalls() const override { return attached_.load(std::memory_order_acquire); }
  absl::StatusOr<CheckpointProbe> Probe(const TrainConfig& config) override { return control_->Probe(config); }
  absl::StatusOr<std::string> Control(const ControlRequest& request) override { return control_->Control(request); }
  absl::Status Restore(const TrainConfig& config, int worker_id, int64_t step) override {
    return control_->Restore(config, worker_id, step);
  }

  // The live attachment; null when data goes to control_ (fallback, not registered yet, or for one call: the ps
  // refused the offer for this session). Attaches when there is none. Unavailable when the ps cannot be reached
  // now; FailedPrecondition (required) when shared memory does not apply.
  absl::StatusOr<std::shared_ptr<Connection>> Acquire();
  // A data call failed on the data plane itself (`why`): fall back to control_, or fail (required).
  absl::Status TransportFailed(const absl::Status& why);
  // A lane failed: the attachment is dropped (the next call attaches again); the call returns Unavailable.
  absl::Status LaneFailed(const std::shared_ptr<Connection>& c, const absl::Status& why, const char* what);
  std::string Who() const { return absl::StrCat("ps task ", options_.task, " (", options_.address, ")"); }
  const ShmClientOptions& options() const { return options_; }
  void Count(std::atomic<int64_t> ShmCounters::*field, int64_t n = 1) {
    if (options_.counters != nullptr) (options_.counters->*field) += n;
  }
  std::vector<SliceSpec> slices() {
    absl::MutexLock lock(&mu_);
    return slices_;
  }
  int TableDim(uint32_t table) {
    absl::MutexLock lock(&mu_);
    auto it = table_dims_.find(table);
    return it == table_dims_.end() ? -1 : it->second;
  }

 private:
  // Connects the two lanes of a fresh offer.
  absl::StatusOr<std::shared_ptr<Connection>> Attach(int worker_id, uint64_t session, std::string* why_not);

  std::unique_ptr<PsInterface> control_;
  const ShmAttachFn attach_;
  const ShmClientOptions options_;
  absl::Mutex attach_mu_;  // one attach at a time
  absl::Mutex mu_;
  int worker_id_ ABSL_GUARDED_BY(mu_) = -1;
  uint64_t session_ ABSL_GUARDED_BY(mu_) = 0;  // this worker's session on the task (the offer asks for it)
  std::vector<SliceSpec> slices_ ABSL_GUARDED_BY(mu_);
  std::map<uint32_t, int> table_dims_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<Connection> connection_ ABSL_GUARDED_BY(mu_);
  bool fallback_ ABSL_GUARDED_BY(mu_) = false;  // data calls go to control_ for good
  absl::Status unusable_ ABSL_GUARDED_BY(mu_);   // required: why shared memory does not apply
  std::atomic<bool> attached_{false};  // connection_ is set (it may have died since)
};

absl::StatusOr<std::shared_ptr<Connection>> ShmPsClient::Attach(int worker_id, uint64_t session,
                                                            std::string* why_not) {
  ShmAttachRequest req;
  req.worker_id = worker_id;
  req.boot_id = HostBootId();
  req.uid = static_cast<uint32_t>(geteuid());
  req.session = session;
  absl::StatusOr<ShmOffer> offer = attach_(req);
  if (!offer.ok()) {
    // PermissionDenied: the ps does not know this session (it restarted, or dropped the worker): Acquire sends this
    // one call through the control plane, whose answer (register again) the worker acts on; the next asks again.
    if (offer.status().code() == absl::StatusCode::kPermissionDenied) return offer.status();
    if (offer.status().code() == absl::StatusCode::kUnavailable ||
        offer.status().code() == absl::StatusCode::kDeadlineExceeded) {
      return absl::UnavailableError(absl::StrCat(Who(), ": asking for shared memory: ", offer.status().message()));
    }
    *why_not = offer.status().code() == absl::StatusCode::kUnimplemented
                   ? "the ps serves gRPC only (its --transport=grpc, or an older dtrain_ps)"
                   : std::string(offer.status().message());
    return nullptr;
  }
  if (offer->boot_id != req.boot_id) {
    *why_not = "the ps task is on another host";
    return nullptr;
  }
  if (offer->uid != req.uid) {
    *why_not = absl::StrCat("the ps task runs as user ", offer->uid, ", this worker as ", req.uid);
    return nullptr;
  }
  auto c = std::make_shared<Connection>();
  ASSIGN_OR_RETURN(c->doorbells, ShmSegment::Create(kDoorbellSegmentBytes));
  for (LaneKind kind : {LaneKind::kPush, LaneKind::kPull}) {
    absl::StatusOr<std::unique_ptr<Lane>> lane = Lane::Connect(offer->socket_name);
    if (!lane.ok()) {
      *why_not = std::string(lane.status().message());
      return nullptr;
    }
    pid_t pid = 0;
    uid_t uid = 0;
    if (absl::Status s = (*lane)->PeerCredentials(&pid, &uid); !s.ok() || uid != req.uid) {
      *why_not = absl::StrCat("the process on the ps's socket runs as user ", uid);
      return nullptr;
    }
    Hello hello;
    hello.lane = kind;
    hello.worker_id = worker_id;
    hello.ticket = kind == LaneKind::kPush ? offer->push_ticket : offer->pull_ticket;
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    RETURN_IF_ERROR((*lane)->Send(FrameType::kHello, EncodeHello(hello), c->doorbells->fd(), deadline));
    absl::StatusOr<Frame> welcome = (*lane)->Receive(deadline);
    if (!welcome.ok() || welcome->type != FrameType::kWelcome) {
      return absl::UnavailableError(absl::StrCat(
          Who(), ": the ps did not welcome the shared-memory lane: ",
          welcome.ok() ? std::string(FrameTypeName(welcome->type)) : std::string(welcome.status().message())));
    }
    ASSIGN_OR_RETURN(PushResult w, DecodePushResult(welcome->payload));
    if (!w.status.ok()) {
      *why_not = absl::StrCat("the ps refused the lane: ", w.status.message());
      return nullptr;
    }
    (*lane)->set_spin(options_.spin_us);
    auto* bells = reinterpret_cast<LaneDoorbells*>(c->doorbells->data() + (kind == LaneKind::kPush ? 0 : 128));
    (*lane)->set_doorbells(&bells->worker_sent, &bells->ps_sent);
    (kind == LaneKind::kPush ? c->push : c->pull) =
        std::make_unique<LaneState>(std::move(*lane), kind == LaneKind::kPush ? 1 : 2);
  }
  Count(&ShmCounters::attaches);
  LOG(INFO) << Who() << ": data through shared memory (same host and user, ps pid " << offer->pid
            << "); gRPC carries the control calls";
  return c;
}

absl::StatusOr<std::shared_ptr<Connection>> ShmPsClient::Acquire() {
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
    attached_ = true;
    return connection_;
  }
  connection_ = nullptr;
  attached_ = false;
  if (options_.required) {
    unusable_ = absl::FailedPreconditionError(
        absl::StrCat("--transport=shm: ", Who(), " cannot be reached through shared memory: ", why_not));
    LOG(ERROR) << unusable_.message();
    return unusable_;
  }
  fallback_ = true;
  LOG(INFO) << Who() << ": data through " << options_.fallback << " (" << why_not << ")";
  return nullptr;
}

absl::Status ShmPsClient::TransportFailed(const absl::Status& why) {
  absl::MutexLock lock(&mu_);
  if (connection_ != nullptr) connection_->Kill();
  connection_ = nullptr;
  attached_ = false;
  if (options_.required) {
    unusable_ = absl::FailedPreconditionError(absl::StrCat("--transport=shm: ", Who(), ": ", why.message()));
    return unusable_;
  }
  fallback_ = true;
  LOG(WARNING) << Who() << ": data through " << options_.fallback << " from now on (" << why.message() << ")";
  return absl::UnavailableError(absl::StrCat(Who(), ": moving to ", options_.fallback, ": ",
                                             why.message()));  // retried there
}

absl::Status ShmPsClient::LaneFailed(const std::shared_ptr<Connection>& c, const absl::Status& why, const char* what) {
  if (why.code() != absl::StatusCode::kCancelled) {
    LOG(WARNING) << Who() << ": the shared-memory " << what << " failed (" << why.message()
                 << "); the next call attaches again";
  }
  c->Kill();
  {
    absl::MutexLock lock(&mu_);
    if (connection_ == c) {
      connection_ = nullptr;
      attached_ = false;
    }
  }
  const absl::StatusCode code =
      why.code() == absl::StatusCode::kCancelled ? absl::StatusCode::kCancelled : absl::StatusCode::kUnavailable;
  return absl::Status(code, absl::StrCat(Who(), ": ", what, " over shared memory: ", why.message()));
}

namespace {

// An upload over the push lane.
class ShmUpload : public SliceUpload {
 public:
  ShmUpload(ShmPsClient* client, std::shared_ptr<Connection> c, Busy busy, Cancellation* cancel)
      : client_(client), c_(std::move(c)), busy_(std::move(busy)), cancel_(cancel) {
    if (cancel_ != nullptr) cancel_id_ = cancel_->Register([this] { c_->push->lane()->Shutdown(); });
  }
  ~ShmUpload() override {
    if (cancel_ != nullptr) cancel_->Deregister(cancel_id_);
    if (finish_sent_ && !answered_ && !c_->push->lane()->dead()) {
      // StartFinish without Finish: the outcome would be read as the next upload's. Read it now.
      absl::StatusOr<Frame> f = c_->push->lane()->Receive(absl::Now() + absl::Seconds(10));
      if (!f.ok() || f->type != FrameType::kPushResult) c_->Kill();
    } else if (open_ && !finished_ && !c_->push->lane()->dead()) {
      // Drop it on the ps, and wait until it has, so the staging segment is free for the next upload.
      const absl::Time deadline = absl::Now() + absl::Seconds(10);
      absl::Status s = c_->push->lane()->Send(FrameType::kPushAbandon, "", -1, deadline);
      absl::StatusOr<Frame> f = s.ok() ? c_->push->lane()->Receive(deadline) : absl::StatusOr<Frame>(s);
      if (!f.ok() || f->type != FrameType::kPushResult) c_->Kill();
    }
  }

  absl::Status Begin(const PushHeader& header) {
    RETURN_IF_ERROR(Check(c_->push->lane()->Send(FrameType::kPushBegin, EncodePushHeader(header))));
    open_ = true;
    return absl::OkStatus();
  }

  absl::Status Write(uint32_t key, int64_t offset, int64_t n, WireDtype dtype, const void* data) override {
    if (n < 0) return absl::InvalidArgumentError(absl::StrCat("a piece of ", n, " values"));
    const int64_t bytes = n * DtypeBytes(dtype);
    DataRef ref{key, offset, n, dtype, 0, 0};
    int64_t at = 0;
    std::shared_ptr<ShmSegment> seg =
        client_->options().memory != nullptr ? client_->options().memory->Find(data, bytes, &at) : nullptr;
    if (seg != nullptr) {  // in place: the ps reads the worker's buffer
      ASSIGN_OR_RETURN(ref.segment, Check(c_->push->Share(seg)));
      ref.at = at;
      ref.lent = true;  // host_grads: the next backward pass, which writes them again, follows the step's pull
      client_->Count(&ShmCounters::bytes_in_place, bytes);
      client_->Count(&ShmCounters::bytes_pushed, bytes);
    } else {
      ASSIGN_OR_RETURN(auto staged, Stage(data, bytes, 1));
      ref.segment = staged.first;
      ref.at = staged.second;
    }
    return Check(c_->push->lane()->Send(FrameType::kPushData, EncodeDataRef(ref)));
  }

  absl::Status WriteSparse(uint32_t table, const int64_t* ids, int64_t n, int dim, WireDtype dtype,
                           const void* rows) override {
    if (dim < 1 || n < 0) return absl::InvalidArgumentError(absl::StrCat("sparse rows of width ", dim));
    RowsRef ref{table, n, dim, dtype, 0, 0, 0};
    ASSIGN_OR_RETURN(auto id_place, Stage(ids, n * 8, 8));
    ASSIGN_OR_RETURN(auto row_place, Stage(rows, n * dim * DtypeBytes(dtype), 1));
    if (id_place.first != row_place.first) {  // the staging segment grew in between: ids again, beside the rows
      ASSIGN_OR_RETURN(id_place, Stage(ids, n * 8, 8));
    }
    ref.segment = row_place.first;
    ref.ids_at = id_place.second;
    ref.rows_at = row_place.second;
    return Check(c_->push->lane()->Send(FrameType::kPushRows, EncodeRowsRef(ref)));
  }

  absl::Status SetGradientNorm(double norm) override {
    return Check(c_->push->lane()->Send(FrameType::kPushNorm, EncodeNorm(norm)));
  }

  bool StartFinish() override {
    if (finish_sent_ || !send_status_.ok()) return false;
    finished_ = true;
    send_status_ = Check(c_->push->lane()->Send(FrameType::kPushFinish, ""));
    finish_sent_ = send_status_.ok();
    return finish_sent_;
  }

  absl::StatusOr<PushResponse> Finish() override {
    Lane* lane = c_->push->lane();
    RETURN_IF_ERROR(send_status_);  // StartFinish's send failed
    if (!finish_sent_) {
      finished_ = true;
      RETURN_IF_ERROR(Check(lane->Send(FrameType::kPushFinish, "")));
      finish_sent_ = true;
    }
    answered_ = true;
    absl::StatusOr<Frame> f = lane->Receive(absl::Now() + client_->options().rpc_timeout);
    if (!f.ok()) return Check(f.status());
    if (f->type != FrameType::kPushResult) {
      return Check(absl::DataLossError(absl::StrCat("answered a push with ", FrameTypeName(f->type))));
    }
    absl::StatusOr<PushResult> r = DecodePushResult(f->payload);
    if (!r.ok()) return Check(r.status());
    if (r->transport_failure) return client_->TransportFailed(r->status);
    if (!r->status.ok()) return r->status;
    client_->Count(&ShmCounters::shm_pushes);
    return r->response;
  }

 private:
  // `bytes` at `data` copied into the staging segment at a multiple of `align`: (segment number, offset).
  absl::StatusOr<std::pair<uint32_t, int64_t>> Stage(const void* data, int64_t bytes, int64_t align) {
    const int64_t at = Align(used_, align);
    ASSIGN_OR_RETURN(auto staging, Check(c_->push->Staging(at + bytes)));
    if (staging.second != staging_id_) {  // a new, larger segment: start at its beginning
      staging_id_ = staging.second;
      used_ = 0;
      return Stage(data, bytes, align);
    }
    std::memcpy(staging.first->data() + at, data, static_cast<size_t>(bytes));
    used_ = at + bytes;
    client_->Count(&ShmCounters::bytes_staged, bytes);
    client_->Count(&ShmCounters::bytes_pushed, bytes);
    return std::make_pair(staging.second, at);
  }
  template <typename T>
  T Check(T r) {
    const absl::Status& s = StatusOf(r);
    if (!s.ok() && (s.code() == absl::StatusCode::kUnavailable || s.code() == absl::StatusCode::kDeadlineExceeded ||
                    s.code() == absl::StatusCode::kDataLoss)) {
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

  ShmPsClient* client_;
  std::shared_ptr<Connection> c_;
  Busy busy_;
  Cancellation* cancel_;
  int64_t cancel_id_ = 0;
  bool open_ = false, finished_ = false;
  bool finish_sent_ = false;  // the PushFinish frame is on the lane (by StartFinish or Finish)
  bool answered_ = false;     // Finish has read (or tried to read) its answer
  absl::Status send_status_;  // StartFinish's failed send, for Finish
  uint32_t staging_id_ = 0;
  int64_t used_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<SliceUpload>> ShmPsClient::StartPush(const PushHeader& header) {
  ASSIGN_OR_RETURN(std::shared_ptr<Connection> c, Acquire());
  if (c == nullptr || !Busy::TryTake(&c->push_busy)) {
    Count(&ShmCounters::control_pushes);
    return control_->StartPush(header);
  }
  auto upload = std::make_unique<ShmUpload>(this, c, Busy(&c->push_busy), header.cancel);
  RETURN_IF_ERROR(upload->Begin(header));
  return std::unique_ptr<SliceUpload>(std::move(upload));
}

absl::Status ShmPsClient::Pull(const PullRequest& request, PullReceiver* receiver) {
  ASSIGN_OR_RETURN(std::shared_ptr<Connection> c, Acquire());
  if (c == nullptr || !Busy::TryTake(&c->pull_busy)) {
    Count(&ShmCounters::control_pulls);
    return control_->Pull(request, receiver);
  }
  Busy busy(&c->pull_busy);
  LaneState* ls = c->pull.get();
  Lane* lane = ls->lane();
  auto lane_failed = [&](const absl::Status& s) {
    const bool cancelled = request.cancel != nullptr && request.cancel->cancelled();
    return LaneFailed(c, cancelled ? absl::CancelledError("cancelled") : s, "pull");
  };
  const WireDtype wire = request.wire_dtype;
  const int el = DtypeBytes(wire);
  // Where each slice goes: asked of the receiver up front, each slice as one piece.
  struct Slot {
    SliceSpec spec;
    PullReceiver::Buffer dst;
    Destination dest;
    int64_t received = 0;
  };
  std::vector<Slot> slots;
  PullOrder order;
  order.request = request;
  order.request.sparse.clear();
  order.request.cancel = nullptr;
  int64_t staging_bytes = 0;
  for (const SliceSpec& spec : slices()) {
    Slot slot;
    slot.spec = spec;
    ASSIGN_OR_RETURN(slot.dst, receiver->Destination(spec.key, 0, spec.length));
    slot.dest.key = spec.key;
    slot.dest.length = spec.length;
    int64_t at = 0;
    std::shared_ptr<ShmSegment> seg =
        slot.dst.data != nullptr && wire == WireDtype::kF32 && slot.dst.dtype == WireDtype::kF32 &&
                options_.memory != nullptr
            ? options_.memory->Find(slot.dst.data, spec.length * 4, &at)
            : nullptr;
    if (slot.dst.data == nullptr) {
      slot.dest.kind = Destination::Kind::kSkip;
    } else if (seg != nullptr) {
      slot.dest.kind = Destination::Kind::kInPlace;
      absl::StatusOr<uint32_t> id = ls->Share(seg);
      if (!id.ok()) return lane_failed(id.status());
      slot.dest.segment = *id;
      slot.dest.at = at;
    } else {
      slot.dest.kind = Destination::Kind::kStaging;
      slot.dest.at = staging_bytes;  // segment set below
      staging_bytes = Align(staging_bytes + spec.length * el, 64);
    }
    slots.push_back(slot);
  }
  // Sparse: the ids, then room for their rows.
  struct RowsSlot {
    int64_t n = 0;
    int dim = 0;
  };
  std::map<uint32_t, RowsSlot> rows_slots;
  int64_t ids_bytes = 0;
  for (const SparseIds& e : request.sparse) {
    const int dim = TableDim(e.table);
    if (dim < 1) return absl::InvalidArgumentError(absl::StrCat("pull of rows of unknown table ", e.table));
    SparseOrder so;
    so.table = e.table;
    so.n = static_cast<int64_t>(e.ids.size());
    so.dim = dim;
    so.ids_at = ids_bytes;
    ids_bytes = Align(ids_bytes + so.n * 8, 64);
    order.sparse.push_back(so);
    rows_slots[e.table] = RowsSlot{so.n, dim};
  }
  for (SparseOrder& so : order.sparse) {
    so.rows_at = ids_bytes + staging_bytes;
    staging_bytes = Align(staging_bytes + so.n * so.dim * el, 64);
  }
  char* staging = nullptr;
  if (ids_bytes + staging_bytes > 0) {
    absl::StatusOr<std::pair<ShmSegment*, uint32_t>> st = ls->Staging(ids_bytes + staging_bytes);
    if (!st.ok()) return lane_failed(st.status());
    staging = st->first->data();
    for (Slot& slot : slots) {
      if (slot.dest.kind != Destination::Kind::kStaging) continue;
      slot.dest.segment = st->second;
      slot.dest.at += ids_bytes;
    }
    for (size_t i = 0; i < order.sparse.size(); ++i) {
      SparseOrder& so = order.sparse[i];
      so.segment = st->second;
      std::memcpy(staging + so.ids_at, request.sparse[i].ids.data(), static_cast<size_t>(so.n * 8));
    }
  }
  std::map<uint32_t, size_t> slot_of_key;
  for (size_t i = 0; i < slots.size(); ++i) {
    order.destinations.push_back(slots[i].dest);
    slot_of_key[slots[i].spec.key] = i;
  }
  std::map<uint32_t, const SparseOrder*> sparse_of_table;
  for (const SparseOrder& so : order.sparse) sparse_of_table[so.table] = &so;

  // A cancelled pull shuts the lane (the attachment is dropped; the next call attaches again).
  const int64_t cancel_id =
      request.cancel != nullptr ? request.cancel->Register([lane] { lane->Shutdown(); }) : 0;
  auto deregister = absl::MakeCleanup([&] {
    if (request.cancel != nullptr) request.cancel->Deregister(cancel_id);
  });
  if (absl::Status s = lane->Send(FrameType::kPullRequest, EncodePullOrder(order)); !s.ok()) return lane_failed(s);
  // Until the ps's PullEnd has been read, the lane is in the middle of this pull: leaving early (the receiver
  // refused something, a malformed frame) drops the attachment, so no later call reads this pull's frames.
  bool ended = false;
  auto drop_unless_ended = absl::MakeCleanup([&] {
    if (!ended) LaneFailed(c, absl::CancelledError("pull left early"), "pull").IgnoreError();
  });
  const absl::Time deadline =
      absl::Now() + absl::Milliseconds(std::max<int64_t>(0, request.timeout_ms)) + options_.rpc_timeout;
  const int spin = options_.spin_us > 0 ? std::max(options_.spin_us, options_.pull_spin_us) : 0;
  while (true) {
    absl::StatusOr<Frame> f = lane->Receive(deadline, nullptr, spin);
    if (!f.ok()) return lane_failed(f.status());
    switch (f->type) {
      case FrameType::kPullHeader: {
        absl::StatusOr<PullHeader> h = DecodePullHeader(f->payload);
        if (!h.ok()) return lane_failed(h.status());
        RETURN_IF_ERROR(receiver->OnHeader(*h));
        continue;
      }
      case FrameType::kPullPieces: {
        absl::StatusOr<PiecesWritten> p = DecodePieces(f->payload);
        if (!p.ok()) return lane_failed(p.status());
        for (const SlicePiece& piece : p->slices) {
          auto it = slot_of_key.find(piece.key);
          if (it == slot_of_key.end()) {
            return absl::DataLossError(absl::StrCat(Who(), " sent slice key ", piece.key, ", which it does not hold"));
          }
          Slot& slot = slots[it->second];
          if (piece.offset != slot.received || !RangeWithin(piece.offset, piece.n, slot.spec.length) ||
              slot.dest.kind == Destination::Kind::kSkip) {
            return absl::DataLossError(absl::StrCat(Who(), " wrote ", piece.n, " floats from ", piece.offset, " of '",
                                                    slot.spec.variable, "' after ", slot.received));
          }
          if (slot.dest.kind == Destination::Kind::kStaging) {
            const char* src = staging + slot.dest.at + piece.offset * el;
            const int dst_el = DtypeBytes(slot.dst.dtype);
            char* dst = static_cast<char*>(slot.dst.data) + piece.offset * dst_el;
            if (slot.dst.dtype == WireDtype::kF32) {
              DecodeFloats(wire, src, piece.n, reinterpret_cast<float*>(dst));
            } else if (slot.dst.dtype == wire) {
              std::memcpy(dst, src, static_cast<size_t>(piece.n * el));
            } else {
              return absl::InternalError("Pull: a receiver asked for a narrow dtype the pull does not carry");
            }
            Count(&ShmCounters::bytes_staged, piece.n * el);
            Count(&ShmCounters::bytes_pulled, piece.n * el);
          } else {
            Count(&ShmCounters::bytes_in_place, piece.n * 4);
            Count(&ShmCounters::bytes_pulled, piece.n * 4);
          }
          slot.received += piece.n;
          if (slot.received == slot.spec.length) {
            RETURN_IF_ERROR(receiver->Written(slot.spec.key, 0, slot.spec.length));
          }
        }
        for (const RowPiece& piece : p->rows) {
          auto it = sparse_of_table.find(piece.table);
          if (it == sparse_of_table.end() || !RangeWithin(piece.first, piece.n, it->second->n)) {
            return absl::DataLossError(absl::StrCat(Who(), " wrote ", piece.n, " rows from row ", piece.first,
                                                    " of table ", piece.table, ", which it was not asked for"));
          }
          const SparseOrder& so = *it->second;
          ASSIGN_OR_RETURN(PullReceiver::Buffer dst, receiver->SparseDestination(so.table, piece.first, piece.n, so.dim));
          if (dst.data != nullptr) {
            const char* src = staging + so.rows_at + piece.first * so.dim * el;
            if (dst.dtype == WireDtype::kF32) {
              DecodeFloats(wire, src, piece.n * so.dim, static_cast<float*>(dst.data));
            } else if (dst.dtype == wire) {
              std::memcpy(dst.data, src, static_cast<size_t>(piece.n * so.dim * el));
            } else {
              return absl::InternalError("Pull: a receiver asked for a narrow dtype the pull does not carry");
            }
          }
          Count(&ShmCounters::bytes_staged, piece.n * so.dim * el);
          Count(&ShmCounters::bytes_pulled, piece.n * so.dim * el);
          RETURN_IF_ERROR(receiver->SparseWritten(so.table, piece.first, piece.n));
        }
        continue;
      }
      case FrameType::kPullEnd: {
        absl::StatusOr<PushResult> end = DecodePushResult(f->payload);
        if (!end.ok()) return lane_failed(end.status());
        ended = true;
        if (end->transport_failure) return TransportFailed(end->status);
        if (end->status.ok()) Count(&ShmCounters::shm_pulls);
        if (!end->status.ok()) {
          return absl::Status(end->status.code(), absl::StrCat("ps ", options_.address, ": Pull: ", end->status.message()));
        }
        return absl::OkStatus();
      }
      default:
        return lane_failed(absl::DataLossError(absl::StrCat("answered a pull with ", FrameTypeName(f->type))));
    }
  }
}

std::unique_ptr<PsInterface> NewShmPsClient(std::unique_ptr<PsInterface> control, ShmAttachFn attach,
                                            ShmClientOptions options) {
  return std::make_unique<ShmPsClient>(std::move(control), std::move(attach), std::move(options));
}

}  // namespace dtrain::ps::shm
