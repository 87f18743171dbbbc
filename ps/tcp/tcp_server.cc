#include "ps/tcp/tcp_server.h"

#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <list>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/denormals.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "ps/shm/lane_threads.h"
#include "ps/shm/shm_frame.h"
#include "ps/shm/shm_offer.h"
#include "ps/tcp/pull_sender.h"
#include "ps/tcp/receive_blocks.h"
#include "ps/tcp/tcp_frame.h"
#include "ps/tcp/tcp_lane.h"

namespace dtrain::ps::tcp {
namespace {

std::string RandomHex(size_t bytes) {
  std::string raw(bytes, '\0');
  size_t got = 0;
  while (got < bytes) {
    const ssize_t n = getrandom(raw.data() + got, bytes - got, 0);
    if (n > 0) got += static_cast<size_t>(n);
  }
  return absl::BytesToHexString(raw);
}

// Sparse rows one push or pull may carry in one frame (the ids and values are copied once; a bound keeps a peer
// from making the ps allocate what it likes).
constexpr int64_t kMaxRowsPerFrame = int64_t{1} << 28;
constexpr int kMaxRowDim = 1 << 20;
// A slice's floats are handed to the upload in pieces of this many as they land (each lent where it lies): a ps
// that applies a push as it arrives (the early apply, in chunks of 64 Ki floats: SliceStore::kChunkFloats) then
// streams the pull behind it while the rest of the slice is still on the wire.
constexpr int64_t kLendFloats = int64_t{1} << 16;

}  // namespace

// One attached worker: its tickets and its two lanes (each served by its own thread).
struct TcpAttachment {
  int worker_id = 0;
  std::string push_ticket, pull_ticket;
  absl::Time expires;
  Cancellation pull_cancel;  // cancelled when the attachment ends: wakes a pull in flight

  absl::Mutex mu;
  bool ended ABSL_GUARDED_BY(mu) = false;
  int active ABSL_GUARDED_BY(mu) = 0;  // lane threads holding it
  TcpLane* push_lane ABSL_GUARDED_BY(mu) = nullptr;  // owned by their threads
  TcpLane* pull_lane ABSL_GUARDED_BY(mu) = nullptr;

  // Ends it: lanes shut, pull cancelled. Idempotent; any thread.
  void End() {
    {
      absl::MutexLock lock(&mu);
      ended = true;
      if (push_lane != nullptr) push_lane->Shutdown();
      if (pull_lane != nullptr) pull_lane->Shutdown();
    }
    pull_cancel.Cancel();
  }
  absl::Status Alive() {
    if (pull_cancel.cancelled()) return absl::CancelledError("the worker's TCP attachment ended");
    return absl::OkStatus();
  }
};

class TcpServer::Impl {
 public:
  Impl(PsInterface* ps, TcpServerOptions options, std::unique_ptr<TcpListener> listener)
      : ps_(ps), options_(std::move(options)), listener_(std::move(listener)), threads_(options_.max_lanes) {}
  ~Impl() { Shutdown(); }

  void StartAccepting() { accept_thread_ = std::thread([this] { AcceptLoop(); }); }
  absl::StatusOr<TcpOffer> Offer(const TcpAttachRequest& request);
  void Shutdown();
  TcpServerCounters counters() const {
    absl::MutexLock lock(&mu_);
    TcpServerCounters c = counters_;
    c.active_attachments = 0;
    for (const auto& a : attachments_) {
      absl::MutexLock al(&a->mu);
      c.active_attachments += a->ended ? 0 : 1;
    }
    c.active_lanes = threads_.active();
    c.lanes_refused += threads_.refused();
    threads_.ForEachServing([&c](const TcpLane& lane) {
      c.bytes_received += lane.bytes_received();
      c.bytes_sent += lane.bytes_sent();
    });
    return c;
  }
  int port() const { return listener_->port(); }

 private:
  using LaneThread = shm::LaneThreads<TcpLane>::Slot;
  void AcceptLoop();
  void ServeConnection(int fd, LaneThread* t);
  // Checks the first frame; returns the attachment the lane belongs to (counted active), or null.
  std::shared_ptr<TcpAttachment> Admit(TcpLane* lane, shm::LaneKind* kind);
  void ServePushes(TcpLane* lane, TcpAttachment* a);
  void ServePulls(TcpLane* lane, TcpAttachment* a);
  bool MayApplyEarly(const TcpLane& lane) const {
    const bool local = options_.is_local_ip != nullptr && options_.is_local_ip(lane.peer_ip());
    return local ? options_.apply_early_local : options_.apply_early_remote;
  }
  void Malformed(const TcpAttachment* a, const absl::Status& s) const {
    LOG(WARNING) << "ps task " << options_.task_index << ": worker " << a->worker_id << "'s TCP lane: " << s
                 << ": closing it";
  }

  PsInterface* const ps_;
  const TcpServerOptions options_;
  std::unique_ptr<TcpListener> listener_;
  std::thread accept_thread_;

  mutable absl::Mutex mu_;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  std::list<std::shared_ptr<TcpAttachment>> attachments_ ABSL_GUARDED_BY(mu_);
  // active_lanes: threads_'s; bytes: of the lanes that ended (counters() adds those of the lanes marked in threads_)
  TcpServerCounters counters_ ABSL_GUARDED_BY(mu_);
  shm::LaneThreads<TcpLane> threads_;  // one per connection, its lane marked while it lives
};

absl::StatusOr<TcpOffer> TcpServer::Impl::Offer(const TcpAttachRequest& request) {
  RETURN_IF_ERROR(shm::CheckOfferSession(ps_, request.worker_id, request.session));
  // End the worker's previous attachment and wait until its lanes have left the ParameterServer (an old upload
  // must not be taken after the new one began).
  std::vector<std::shared_ptr<TcpAttachment>> previous;
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return absl::UnavailableError("the ps task is shutting down");
    for (auto it = attachments_.begin(); it != attachments_.end();) {
      if ((*it)->worker_id == request.worker_id) {
        previous.push_back(*it);
        it = attachments_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (const auto& a : previous) {
    a->End();
    absl::MutexLock lock(&a->mu);
    auto idle = [](TcpAttachment* x) ABSL_EXCLUSIVE_LOCKS_REQUIRED(x->mu) { return x->active == 0; };
    if (!a->mu.AwaitWithTimeout(absl::Condition(+idle, a.get()), absl::Seconds(10))) {
      return absl::UnavailableError(
          absl::StrCat("worker ", request.worker_id, "'s previous TCP lanes have not ended after 10 s"));
    }
  }
  auto a = std::make_shared<TcpAttachment>();
  a->worker_id = request.worker_id;
  a->push_ticket = RandomHex(16);
  a->pull_ticket = RandomHex(16);
  a->expires = absl::Now() + options_.ticket_ttl;
  TcpOffer offer;
  offer.port = listener_->port();
  offer.push_ticket = a->push_ticket;
  offer.pull_ticket = a->pull_ticket;
  offer.pid = static_cast<int32_t>(getpid());
  absl::MutexLock lock(&mu_);
  if (shut_down_) return absl::UnavailableError("the ps task is shutting down");
  // Attachments that ended, or whose tickets expired unused, are dropped here.
  for (auto it = attachments_.begin(); it != attachments_.end();) {
    absl::MutexLock al(&(*it)->mu);
    const bool unused = (*it)->active == 0 && (*it)->push_lane == nullptr && (*it)->pull_lane == nullptr;
    if (((*it)->ended && (*it)->active == 0) || (unused && (*it)->expires < absl::Now())) {
      it = attachments_.erase(it);
    } else {
      ++it;
    }
  }
  attachments_.push_back(a);
  ++counters_.offers;
  return offer;
}

void TcpServer::Impl::AcceptLoop() {
  threads_.AcceptUntilShutdown(listener_.get(), absl::StrCat("ps task ", options_.task_index, ": TCP data port"),
                               [this](int socket, LaneThread* t) { ServeConnection(socket, t); });
}

std::shared_ptr<TcpAttachment> TcpServer::Impl::Admit(TcpLane* lane, shm::LaneKind* kind) {
  absl::StatusOr<TcpLane::Frame> frame = lane->Receive(absl::Now() + options_.hello_timeout);
  absl::Status refused;
  std::shared_ptr<TcpAttachment> found;
  if (!frame.ok()) {
    refused = frame.status();
  } else if (frame->type != TcpFrameType::kHello) {
    refused = absl::InvalidArgumentError(absl::StrCat("first frame ", TcpFrameTypeName(frame->type), ", not Hello"));
  } else {
    absl::StatusOr<shm::Hello> hello = shm::DecodeHello(frame->payload);
    if (!hello.ok()) {
      refused = hello.status();
    } else {
      absl::MutexLock lock(&mu_);
      for (const auto& a : attachments_) {
        std::string* ticket = hello->lane == shm::LaneKind::kPush ? &a->push_ticket : &a->pull_ticket;
        // Every ticket is compared whole, in constant time, whatever matched before.
        if (ticket->empty() || !shm::TicketsEqual(*ticket, hello->ticket)) continue;
        absl::MutexLock al(&a->mu);
        if (a->worker_id != hello->worker_id || a->ended || a->expires < absl::Now()) break;
        ticket->clear();  // single use
        found = a;
        ++a->active;
        *kind = hello->lane;
        break;
      }
      if (found == nullptr) {
        refused = absl::PermissionDeniedError(
            absl::StrCat(lane->peer_ip(), " presented no valid ticket for worker ", hello->worker_id));
      }
    }
  }
  {
    absl::MutexLock lock(&mu_);
    ++(refused.ok() ? counters_.lanes_accepted : counters_.lanes_refused);
  }
  shm::PushResult welcome;
  welcome.status = refused;
  lane->Send(TcpFrameType::kWelcome, shm::EncodePushResult(welcome), nullptr, 0,
             absl::Now() + options_.hello_timeout)
      .IgnoreError();
  if (!refused.ok()) {
    LOG(WARNING) << "ps task " << options_.task_index << ": refused a TCP data connection from " << lane->peer_ip()
                 << ": " << refused;
    return nullptr;
  }
  return found;
}

void TcpServer::Impl::ServeConnection(int fd, LaneThread* t) {
  SetFlushDenormals();  // uploads apply the optimizer on this thread (async; the deciding commit in sync)
  TcpLane lane(fd);
  if (!threads_.Serve(t, &lane)) return;  // Shutdown can reach it from now on
  shm::LaneKind kind = shm::LaneKind::kPush;
  std::shared_ptr<TcpAttachment> a = Admit(&lane, &kind);
  if (a != nullptr) {
    {
      absl::MutexLock al(&a->mu);
      if (a->ended) lane.Shutdown();
      (kind == shm::LaneKind::kPush ? a->push_lane : a->pull_lane) = &lane;
    }
    if (kind == shm::LaneKind::kPush) {
      ServePushes(&lane, a.get());
    } else {
      ServePulls(&lane, a.get());
    }
    a->End();  // either lane closing ends the attachment: the worker is gone, or gave up on a call
    absl::MutexLock al(&a->mu);
    (kind == shm::LaneKind::kPush ? a->push_lane : a->pull_lane) = nullptr;
    --a->active;
  }
  absl::MutexLock lock(&mu_);  // counters() sees the lane's bytes once: marked or added, not both
  counters_.bytes_received += lane.bytes_received();
  counters_.bytes_sent += lane.bytes_sent();
  threads_.Release(t);
}

namespace {

// An upload in progress on a push lane.
struct UploadState {
  std::unique_ptr<SliceUpload> upload;
  bool open = false;
  absl::Status error;  // the upload's first error (it is then unusable; its data is read and dropped)
  uint64_t request_id = 0;
  void Fail(absl::Status s) {
    if (error.ok()) error = std::move(s);
    upload.reset();
  }
};

}  // namespace

void TcpServer::Impl::ServePushes(TcpLane* lane, TcpAttachment* a) {
  UploadState st;
  ReceiveBlocks blocks(options_.max_receive_bytes);
  std::vector<char> scratch;  // narrow floats and sparse rows, decoded from here by the upload
  std::vector<int64_t> ids;
  const bool may_apply_early = MayApplyEarly(*lane);
  while (true) {
    const absl::Time deadline = st.open ? absl::Now() + options_.upload_timeout : absl::InfiniteFuture();
    absl::StatusOr<TcpLane::Frame> frame = lane->Receive(deadline);
    if (!frame.ok()) {
      if (st.open && frame.status().code() == absl::StatusCode::kDeadlineExceeded) {
        LOG(WARNING) << "ps task " << options_.task_index << ": worker " << a->worker_id << "'s upload was silent for "
                     << absl::FormatDuration(options_.upload_timeout) << ": dropped unfinished";
      } else if (frame.status().code() == absl::StatusCode::kDataLoss) {
        Malformed(a, frame.status());
      }
      break;
    }
    const absl::Time bulk_deadline = absl::Now() + options_.upload_timeout;
    absl::Status lane_error;  // a failure of the lane itself (it closes)
    switch (frame->type) {
      case TcpFrameType::kPushBegin: {
        absl::StatusOr<PushHeader> header = shm::DecodePushHeader(frame->payload);
        if (st.open || !header.ok()) {
          lane_error = st.open ? absl::DataLossError("PushBegin inside an open upload") : header.status();
          break;
        }
        st = UploadState();
        st.open = true;
        st.request_id = header->request_id;
        blocks.BeginUpload();
        if (header->worker_id != a->worker_id) {
          st.Fail(absl::PermissionDeniedError(
              absl::StrCat("a push for worker ", header->worker_id, " on worker ", a->worker_id, "'s lane")));
          break;
        }
        header->apply_early = header->apply_early && may_apply_early;
        header->cancel = nullptr;
        absl::StatusOr<std::unique_ptr<SliceUpload>> u = ps_->StartPush(*header);
        if (u.ok()) {
          st.upload = std::move(*u);
        } else {
          st.Fail(u.status());
        }
        break;
      }
      case TcpFrameType::kPushData: {
        absl::StatusOr<Piece> piece = DecodeSlicePiece(frame->payload);
        absl::StatusOr<uint64_t> bytes = piece.ok() ? PieceBulkBytes(*piece, false) : piece.status();
        if (!st.open || !bytes.ok() || *bytes != frame->bulk_bytes) {
          lane_error = !st.open ? absl::DataLossError("PushData outside an upload")
                       : !bytes.ok() ? bytes.status()
                                     : absl::DataLossError(absl::StrCat("PushData of ", piece->n, " values with ",
                                                                        frame->bulk_bytes, " bytes"));
          break;
        }
        if (!st.error.ok()) {
          lane_error = lane->SkipBulk(bulk_deadline);
          break;
        }
        if (piece->dtype == WireDtype::kF32) {
          // Straight into a receive block, lent to the upload where it lies.
          absl::StatusOr<ReceiveBlocks::Room> room = blocks.Take(static_cast<int64_t>(*bytes), "max_receive_bytes");
          if (!room.ok()) {
            st.Fail(room.status());
            lane_error = lane->SkipBulk(bulk_deadline);
            break;
          }
          const float* floats = reinterpret_cast<const float*>(room->data);
          for (int64_t done = 0; done < piece->n && st.error.ok();) {
            const int64_t k = std::min(kLendFloats, piece->n - done);
            lane_error = lane->ReadBulk(room->data + done * 4, static_cast<uint64_t>(k) * 4, bulk_deadline);
            if (!lane_error.ok()) break;
            absl::Status s = st.upload->WriteInPlace(piece->key, piece->offset + done, k, floats + done, room->keep);
            if (!s.ok()) st.Fail(s);
            done += k;
          }
          if (lane_error.ok() && !st.error.ok()) lane_error = lane->SkipBulk(bulk_deadline);
        } else {
          scratch.resize(*bytes);
          lane_error = lane->ReadBulk(scratch.data(), *bytes, bulk_deadline);
          if (!lane_error.ok()) break;
          absl::Status s = st.upload->Write(piece->key, piece->offset, piece->n, piece->dtype, scratch.data());
          if (!s.ok()) st.Fail(s);
        }
        break;
      }
      case TcpFrameType::kPushRows: {
        absl::StatusOr<shm::RowsRef> ref = shm::DecodeRowsRef(frame->payload);
        if (!st.open || !ref.ok()) {
          lane_error = !st.open ? absl::DataLossError("PushRows outside an upload") : ref.status();
          break;
        }
        if (ref->n < 0 || ref->n > kMaxRowsPerFrame || ref->dim < 1 || ref->dim > kMaxRowDim ||
            static_cast<uint64_t>(ref->n) * (8 + static_cast<uint64_t>(ref->dim) * DtypeBytes(ref->dtype)) !=
                frame->bulk_bytes) {
          lane_error = absl::DataLossError(absl::StrCat("PushRows of ", ref->n, " rows of ", ref->dim, " values with ",
                                                        frame->bulk_bytes, " bytes (at most ", kMaxRowsPerFrame,
                                                        " rows of ", kMaxRowDim, ")"));
          break;
        }
        if (st.error.ok() && (ref->n > options_.max_push_rows ||
                              static_cast<int64_t>(frame->bulk_bytes) > options_.max_receive_bytes)) {
          // Refused before anything is allocated for it; its bytes are read past, and the upload fails by name.
          st.Fail(absl::ResourceExhaustedError(absl::StrCat(
              "worker ", a->worker_id, "'s push carries ", ref->n, " rows of sparse table ", ref->table, " in ",
              frame->bulk_bytes, " bytes to ps task ", options_.task_index, ": more than ",
              ref->n > options_.max_push_rows ? absl::StrCat(options_.max_push_rows, " rows (--max_push_rows)")
                                              : absl::StrCat(options_.max_receive_bytes, " bytes (the lane's receive "
                                                             "limit, twice --max_model_bytes)"))));
        }
        if (!st.error.ok()) {
          lane_error = lane->SkipBulk(bulk_deadline);
          break;
        }
        ids.resize(ref->n);
        scratch.resize(frame->bulk_bytes - ref->n * 8);
        lane_error = lane->ReadBulk(ids.data(), ref->n * 8, bulk_deadline);
        if (lane_error.ok()) lane_error = lane->ReadBulk(scratch.data(), scratch.size(), bulk_deadline);
        if (!lane_error.ok()) break;
        // The ids are the ps's own copy: what it checks is what it applies.
        absl::Status s = st.upload->WriteSparse(ref->table, ids.data(), ref->n, ref->dim, ref->dtype, scratch.data());
        if (!s.ok()) st.Fail(s);
        break;
      }
      case TcpFrameType::kPushNorm: {
        absl::StatusOr<double> norm = shm::DecodeNorm(frame->payload);
        if (!st.open || !norm.ok()) {
          lane_error = !st.open ? absl::DataLossError("PushNorm outside an upload") : norm.status();
          break;
        }
        if (st.error.ok()) {
          absl::Status s = st.upload->SetGradientNorm(*norm);
          if (!s.ok()) st.Fail(s);
        }
        break;
      }
      case TcpFrameType::kPushFinish: {
        if (!st.open) {
          lane_error = absl::DataLossError("PushFinish outside an upload");
          break;
        }
        shm::PushResult result;
        if (st.error.ok()) {
          absl::StatusOr<PushResponse> r = st.upload->Finish();
          result.status = r.status();
          if (r.ok()) result.response = *r;
        } else {
          result.status = st.error;
        }
        st = UploadState();
        lane_error = lane->Send(TcpFrameType::kPushResult, shm::EncodePushResult(result));
        break;
      }
      case TcpFrameType::kPushAbandon: {
        st = UploadState();  // unfinished: nothing of it is committed
        shm::PushResult result;
        result.status = absl::CancelledError("upload abandoned by the worker");
        lane_error = lane->Send(TcpFrameType::kPushResult, shm::EncodePushResult(result));
        break;
      }
      default:
        lane_error = absl::DataLossError(absl::StrCat("the upload lane sent ", TcpFrameTypeName(frame->type)));
        break;
    }
    if (!lane_error.ok()) {
      if (lane_error.code() == absl::StatusCode::kDataLoss) Malformed(a, lane_error);
      break;
    }
  }
  if (st.open) {
    LOG(WARNING) << "ps task " << options_.task_index << ": worker " << a->worker_id << "'s upload (request "
                 << st.request_id << ") ended unfinished with its TCP lane: dropped, nothing of it applied";
    absl::MutexLock lock(&mu_);
    ++counters_.uploads_cut_off;
  }
}

void TcpServer::Impl::ServePulls(TcpLane* lane, TcpAttachment* a) {
  while (true) {
    absl::StatusOr<TcpLane::Frame> frame = lane->Receive(absl::InfiniteFuture());
    if (!frame.ok()) {
      if (frame.status().code() == absl::StatusCode::kDataLoss) Malformed(a, frame.status());
      return;
    }
    if (frame->type != TcpFrameType::kPullRequest) {
      Malformed(a, absl::DataLossError(absl::StrCat("the pull lane sent ", TcpFrameTypeName(frame->type))));
      return;
    }
    absl::StatusOr<shm::PullOrder> order = shm::DecodePullOrder(frame->payload);
    if (!order.ok()) return Malformed(a, order.status());
    PullRequest request = order->request;
    uint64_t id_bytes = 0;
    for (const shm::SparseOrder& so : order->sparse) {
      if (absl::Status limit = CheckPullRows(options_.max_pull_rows, a->worker_id, options_.task_index, so.table, so.n);
          !limit.ok()) {
        // Its ids are still on the wire and are not read: the refusal is the pull's end, then the lane closes.
        Malformed(a, limit);
        shm::PushResult refused;
        refused.status = limit;
        lane->Send(TcpFrameType::kPullEnd, shm::EncodePushResult(refused)).IgnoreError();
        return;
      }
      id_bytes += static_cast<uint64_t>(so.n) * 8;
    }
    if (id_bytes != frame->bulk_bytes) {
      return Malformed(a, absl::DataLossError(absl::StrCat("a pull's ids in ", frame->bulk_bytes, " bytes, not ",
                                                           id_bytes)));
    }
    const absl::Time bulk_deadline = absl::Now() + options_.upload_timeout;
    for (const shm::SparseOrder& so : order->sparse) {
      SparseIds e;
      e.table = so.table;
      e.ids.resize(so.n);
      if (!lane->ReadBulk(e.ids.data(), so.n * 8, bulk_deadline).ok()) return;
      request.sparse.push_back(std::move(e));
    }
    shm::PushResult end;
    PullSender sender(lane, request.wire_dtype, [a] { return a->Alive(); });
    if (request.worker_id != a->worker_id) {
      end.status = absl::PermissionDeniedError(
          absl::StrCat("a pull for worker ", request.worker_id, " on worker ", a->worker_id, "'s lane"));
    } else {
      // Both the attachment's end and the server's shutdown wake a pull that waits.
      Cancellation cancel;
      const int64_t id1 = a->pull_cancel.Register([&cancel] { cancel.Cancel(); });
      const int64_t id2 =
          options_.shutdown != nullptr ? options_.shutdown->Register([&cancel] { cancel.Cancel(); }) : 0;
      request.cancel = &cancel;
      end.status = ps_->Pull(request, &sender);
      a->pull_cancel.Deregister(id1);
      if (options_.shutdown != nullptr) options_.shutdown->Deregister(id2);
      if (end.status.ok()) end.status = sender.Flush();
    }
    if (lane->dead()) return;
    if (!end.status.ok()) sender.Drop();  // pieces of a failed pull are not sent
    if (!lane->Send(TcpFrameType::kPullEnd, shm::EncodePushResult(end)).ok()) return;
  }
}

void TcpServer::Impl::Shutdown() {
  std::vector<std::shared_ptr<TcpAttachment>> attachments;
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return;
    shut_down_ = true;
    attachments.assign(attachments_.begin(), attachments_.end());
    attachments_.clear();
  }
  listener_->Shutdown();
  for (const auto& a : attachments) a->End();
  if (accept_thread_.joinable()) accept_thread_.join();
  // Every lane still open (in its Hello, or of an attachment made meanwhile) is shut until all threads are done.
  threads_.StopAll();
}

absl::StatusOr<std::unique_ptr<TcpServer>> TcpServer::Start(PsInterface* ps, TcpServerOptions options) {
  std::string host = options.host;
  if (host == "0.0.0.0" || host == "[::]" || host == "::") host.clear();  // every address
  ASSIGN_OR_RETURN(std::unique_ptr<TcpListener> listener, TcpListener::Listen(host, options.port));
  auto impl = std::make_unique<Impl>(ps, std::move(options), std::move(listener));
  impl->StartAccepting();
  return std::unique_ptr<TcpServer>(new TcpServer(std::move(impl)));
}

TcpServer::TcpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TcpServer::~TcpServer() { impl_->Shutdown(); }
absl::StatusOr<TcpOffer> TcpServer::Offer(const TcpAttachRequest& request) { return impl_->Offer(request); }
void TcpServer::Shutdown() { impl_->Shutdown(); }
TcpServerCounters TcpServer::counters() const { return impl_->counters(); }
int TcpServer::port() const { return impl_->port(); }

}  // namespace dtrain::ps::tcp
