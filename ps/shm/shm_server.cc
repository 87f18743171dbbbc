#include "ps/shm/shm_server.h"

#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <list>
#include <map>
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
#include "ps/shm/shm_frame.h"
#include "ps/shm/lane_threads.h"
#include "ps/shm/shm_lane.h"
#include "ps/shm/shm_segment.h"
#include "ps/shm/shm_server_impl.h"

namespace dtrain::ps::shm {
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

}  // namespace


absl::StatusOr<ShmOffer> ShmServer::Impl::Offer(const ShmAttachRequest& request) {
  ShmOffer offer;
  offer.socket_name = listener_->name();
  offer.boot_id = HostBootId();
  offer.uid = static_cast<uint32_t>(geteuid());
  offer.pid = static_cast<int32_t>(getpid());
  if (request.boot_id.empty() || request.boot_id != offer.boot_id) {
    return absl::FailedPreconditionError(absl::StrCat("the ps task runs on another host (boot id ", offer.boot_id,
                                                      ", the worker's ", request.boot_id, ")"));
  }
  if (request.uid != offer.uid) {
    return absl::FailedPreconditionError(absl::StrCat("the ps task runs as user ", offer.uid, ", the worker as ",
                                                      request.uid, ": shared memory is only for one user"));
  }
  RETURN_IF_ERROR(CheckOfferSession(ps_, request.worker_id, request.session));
  // End the worker's previous attachment, and wait until its lanes have left the ParameterServer (an old pull
  // must not write into buffers after the worker's next pull began).
  std::vector<std::shared_ptr<Attachment>> previous;
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
    const absl::Time give_up = absl::Now() + absl::Seconds(10);
    while (a->active > 0) {
      if (a->mu.AwaitWithDeadline(absl::Condition(
                                      +[](Attachment* x) ABSL_EXCLUSIVE_LOCKS_REQUIRED(x->mu) { return x->active == 0; },
                                      a.get()),
                                  give_up)) {
        break;
      }
      return absl::UnavailableError(absl::StrCat("worker ", request.worker_id,
                                                 "'s previous shared-memory calls have not ended after 10 s"));
    }
  }
  auto a = std::make_shared<Attachment>();
  a->worker_id = request.worker_id;
  a->push_ticket = RandomHex(16);
  a->pull_ticket = RandomHex(16);
  a->expires = absl::Now() + options_.ticket_ttl;
  offer.push_ticket = a->push_ticket;
  offer.pull_ticket = a->pull_ticket;
  absl::MutexLock lock(&mu_);
  if (shut_down_) return absl::UnavailableError("the ps task is shutting down");
  // Attachments that ended (both lanes gone) or whose tickets expired unused are dropped here.
  for (auto it = attachments_.begin(); it != attachments_.end();) {
    absl::MutexLock al(&(*it)->mu);
    const bool unused = (*it)->push_lane == nullptr && (*it)->pull_lane == nullptr && (*it)->active == 0;
    if ((*it)->ended && (*it)->active == 0) {
      it = attachments_.erase(it);
    } else if (unused && (*it)->expires < absl::Now() && !(*it)->push_ticket.empty()) {
      it = attachments_.erase(it);
    } else {
      ++it;
    }
  }
  attachments_.push_back(a);
  FoldEndedLaneBytes();
  lane_bytes_.push_back(a->bytes);
  ++counters_.offers;
  return offer;
}

void ShmServer::Impl::AcceptLoop() {
  const std::string what = absl::StrCat("ps task ", options_.task_index, ": shared-memory socket");
  threads_.AcceptUntilShutdown(listener_.get(), what,
                               [this](int socket, LaneThread* t) { ServeConnection(socket, t); });
}

std::shared_ptr<Attachment> ShmServer::Impl::Admit(Lane* lane, LaneKind* kind) {
  pid_t pid = 0;
  uid_t uid = 0;
  absl::Status refused = lane->PeerCredentials(&pid, &uid);
  if (refused.ok() && uid != geteuid()) {
    refused = absl::PermissionDeniedError(absl::StrCat("process ", pid, " runs as user ", uid));
  }
  // Nothing of another user's process is read, and nothing it sends is mapped: it is refused before its Hello.
  int doorbell_fd = -1;
  absl::StatusOr<Frame> frame = absl::UnavailableError("not read");
  std::shared_ptr<ShmSegment> doorbells;
  if (refused.ok()) {
    frame = lane->Receive(absl::Now() + options_.hello_timeout, &doorbell_fd);
    if (doorbell_fd >= 0) {
      absl::StatusOr<std::unique_ptr<ShmSegment>> mapped = ShmSegment::Map(doorbell_fd, kDoorbellSegmentBytes);
      if (mapped.ok()) doorbells = std::move(*mapped);
    }
  }
  std::shared_ptr<Attachment> found;
  if (!refused.ok()) {
    // (said above)
  } else if (!frame.ok()) {
    refused = frame.status();
  } else if (frame->type != FrameType::kHello) {
    refused = absl::InvalidArgumentError(absl::StrCat("first frame ", FrameTypeName(frame->type), ", not Hello"));
  } else {
    absl::StatusOr<Hello> hello = DecodeHello(frame->payload);
    if (!hello.ok()) {
      refused = hello.status();
    } else {
      absl::MutexLock lock(&mu_);
      for (const auto& a : attachments_) {
        std::string* ticket = hello->lane == LaneKind::kPush ? &a->push_ticket : &a->pull_ticket;
        // Every ticket is compared whole, in constant time, whatever matched before.
        if (ticket->empty() || !TicketsEqual(*ticket, hello->ticket)) continue;
        absl::MutexLock al(&a->mu);
        if (a->worker_id != hello->worker_id || a->ended || a->expires < absl::Now()) break;
        ticket->clear();  // single use
        found = a;
        ++a->active;
        *kind = hello->lane;
        break;
      }
      if (found == nullptr) {
        refused = absl::PermissionDeniedError(absl::StrCat("process ", pid, " presented no valid ticket for worker ",
                                                           hello->worker_id));
      }
    }
  }
  {
    absl::MutexLock lock(&mu_);
    ++(refused.ok() ? counters_.lanes_accepted : counters_.lanes_refused);
  }
  PushResult welcome;
  welcome.status = refused;
  lane->Send(FrameType::kWelcome, EncodePushResult(welcome), -1, absl::Now() + options_.hello_timeout).IgnoreError();
  if (!refused.ok()) {
    LOG(WARNING) << "ps task " << options_.task_index << ": refused a shared-memory connection: " << refused;
    return nullptr;
  }
  if (doorbells != nullptr) {  // from now on each side counts the frames it sends
    auto* bells = reinterpret_cast<LaneDoorbells*>(doorbells->data() + (*kind == LaneKind::kPush ? 0 : 128));
    lane->set_doorbells(&bells->ps_sent, &bells->worker_sent);
    absl::MutexLock al(&found->mu);
    found->doorbells.push_back(std::move(doorbells));
  }
  return found;
}

void ShmServer::Impl::ServeConnection(int fd, LaneThread* t) {
  SetFlushDenormals();  // uploads apply the optimizer on this thread (async; the deciding commit in sync)
  auto lane = std::make_unique<Lane>(fd);
  if (!threads_.Serve(t, lane.get())) return;  // Shutdown can reach it from now on
  LaneKind kind = LaneKind::kPush;
  std::shared_ptr<Attachment> a = Admit(lane.get(), &kind);
  // The thread of the first lane admitted serves the attachment once the second has come; the second's thread
  // hands its lane over and ends.
  bool serve = false;
  if (a != nullptr) {
    lane->set_spin(options_.spin_us);
    absl::MutexLock al(&a->mu);
    if (a->ended) lane->Shutdown();
    (kind == LaneKind::kPush ? a->push_lane : a->pull_lane) = std::move(lane);  // the attachment owns it now
    serve = !a->served;
    a->served = true;
  }
  threads_.Release(t);  // from now on a->End() reaches it
  if (a == nullptr) return;
  if (serve) {
    bool both = false;
    {
      absl::MutexLock al(&a->mu);
      auto complete = [](Attachment* x) ABSL_EXCLUSIVE_LOCKS_REQUIRED(x->mu) {
        return x->ended || (x->push_lane != nullptr && x->pull_lane != nullptr);
      };
      a->mu.AwaitWithTimeout(absl::Condition(+complete, a.get()), 2 * options_.hello_timeout);
      both = !a->ended && a->push_lane != nullptr && a->pull_lane != nullptr;
    }
    if (both) {
      ServeAttachment(a.get());
    } else {
      LOG(WARNING) << "ps task " << options_.task_index << ": worker " << a->worker_id
                   << " opened one shared-memory lane of two: closing it";
    }
    // Either lane closing ends the attachment: the worker is gone, or gave up on a call.
    a->End();
  }
  absl::MutexLock al(&a->mu);
  if (--a->active == 0 && a->ended) {  // nothing reads them any more: unmap the worker's memory, close the lanes
    a->segments.clear();
    a->doorbells.clear();
    a->push_lane.reset();
    a->pull_lane.reset();
  }
}

void ShmServer::Impl::AddSegment(Attachment* a, const Frame& frame, int fd) {
  absl::StatusOr<SegmentInfo> info = DecodeSegment(frame.payload);
  absl::Status s = info.status();
  std::unique_ptr<ShmSegment> seg;
  if (s.ok() && fd < 0) s = absl::InvalidArgumentError("a Segment frame without a descriptor");
  if (s.ok()) {
    absl::StatusOr<std::unique_ptr<ShmSegment>> mapped = ShmSegment::Map(fd, info->bytes);
    fd = -1;  // taken over
    s = mapped.status();
    if (s.ok()) seg = std::move(*mapped);
  }
  if (fd >= 0) close(fd);
  absl::MutexLock lock(&a->mu);
  // A segment number is never reused: the other lane may be reading the one it names.
  if (s.ok() && a->segments.count(info->segment) != 0) {
    s = absl::InvalidArgumentError(absl::StrCat("segment ", info->segment, " shared twice"));
  }
  if (s.ok() && static_cast<int>(a->segments.size()) >= options_.max_segments) {
    s = absl::ResourceExhaustedError(absl::StrCat("more than ", options_.max_segments, " segments"));
  }
  if (!s.ok()) {
    LOG(WARNING) << "ps task " << options_.task_index << ": worker " << a->worker_id
                 << "'s shared segment cannot be used: " << s;
    if (a->segment_error.ok()) {
      a->segment_error = TransportError(absl::StrCat("shared memory: the ps cannot use a segment: ", s.message()));
    }
    return;
  }
  a->segments[info->segment] = std::move(seg);
}

// An upload in progress on an attachment's push lane.
struct ShmServer::Impl::UploadState {
  std::unique_ptr<SliceUpload> upload;
  bool open = false;
  absl::Status error;      // the upload's first error (it is then unusable)
  bool transport = false;  // that error is the data plane's
  uint64_t request_id = 0;    // of the open upload
  uint64_t last_request = 0;  // of the last upload that ended (finished or abandoned)
  bool answered_commit = false;  // the last frame handled was a commit, answered

  void Fail(absl::Status s, bool of_transport) {
    if (error.ok()) {
      error = std::move(s);
      transport = of_transport;
    }
    upload.reset();
  }
};

void ShmServer::Impl::ServeAttachment(Attachment* a) {
  Lane* lanes[2];
  {
    absl::MutexLock al(&a->mu);
    lanes[0] = a->push_lane.get();
    lanes[1] = a->pull_lane.get();
  }
  UploadState st;
  while (true) {
    // While an upload is open only its lane is read: a pull right behind a commit waits for that commit, which
    // this same thread must take first. Otherwise whichever lane has a frame, the push lane first.
    int which = 0;
    absl::Time deadline = absl::InfiniteFuture();
    if (st.open) {
      deadline = absl::Now() + options_.upload_timeout;
    } else {
      const int spin = st.answered_commit && options_.spin_us > 0
                           ? std::max(options_.spin_us, options_.spin_after_commit_us)
                           : options_.spin_us;
      st.answered_commit = false;
      absl::StatusOr<int> ready = Lane::WaitAny(lanes, 2, absl::InfiniteFuture(), spin);
      if (!ready.ok()) break;
      which = *ready;
    }
    int fd = -1;
    absl::StatusOr<Frame> frame = lanes[which]->Receive(
        deadline, &fd, st.open && options_.spin_us > 0 ? std::max(options_.spin_us, options_.spin_in_upload_us) : -1);
    if (!frame.ok()) {
      if (st.open && frame.status().code() == absl::StatusCode::kDeadlineExceeded) {
        LOG(WARNING) << "ps task " << options_.task_index << ": worker " << a->worker_id << "'s upload was silent for "
                     << absl::FormatDuration(options_.upload_timeout) << ": dropped unfinished";
      } else if (frame.status().code() == absl::StatusCode::kDataLoss) {
        Malformed(a, frame.status());
      }
      break;  // an open upload is dropped unfinished: nothing of it is committed
    }
    if (which == 1 && frame->type == FrameType::kPullRequest && !TakePushFirst(lanes[0], a, frame->payload, &st)) {
      break;
    }
    const bool keep = which == 0 ? HandlePush(lanes[0], a, *frame, fd, &st) : HandlePull(lanes[1], a, *frame, fd);
    if (!keep) break;
  }
  if (st.open) {
    LOG(WARNING) << "ps task " << options_.task_index << ": worker " << a->worker_id << "'s upload (request "
                 << st.request_id << ") ended unfinished with its lane: dropped, nothing of it applied";
    absl::MutexLock lock(&mu_);
    ++counters_.uploads_cut_off;
  }
}

bool ShmServer::Impl::TakePushFirst(Lane* push_lane, Attachment* a, const std::string& pull_payload,
                                     UploadState* st) {
  // A worker sends its pull right behind the commit it follows (PullRequest::after_push), on the other lane:
  // the pull may be read first. The ps's Pull would wait for that commit, which only this thread can take:
  // take the push lane's frames first, until that upload has ended. A commit that went another way (an earlier
  // attachment, gRPC) never comes here: then the pull goes ahead after a short while (the ps's Pull itself
  // waits for the commit wherever it was made).
  absl::StatusOr<PullOrder> order = DecodePullOrder(pull_payload);
  if (!order.ok() || order->request.after_push == 0) return true;
  const uint64_t after = order->request.after_push;
  const absl::Time give_up = absl::Now() + absl::Milliseconds(200);
  while (st->last_request != after) {
    const absl::Time deadline = st->open ? absl::Now() + options_.upload_timeout : give_up;
    int fd = -1;
    absl::StatusOr<Frame> frame = push_lane->Receive(deadline, &fd);
    if (!frame.ok()) return frame.status().code() == absl::StatusCode::kDeadlineExceeded && !st->open;
    if (!HandlePush(push_lane, a, *frame, fd, st)) return false;
  }
  return true;
}

bool ShmServer::Impl::HandlePush(Lane* lane, Attachment* a, const Frame& frame, int fd, UploadState* st) {
  switch (frame.type) {
    case FrameType::kSegment:
      AddSegment(a, frame, fd);
      return true;
    case FrameType::kPushBegin: {
      if (st->open) return false;  // protocol error: close the lane
      absl::StatusOr<PushHeader> header = DecodePushHeader(frame.payload);
      if (!header.ok()) return Malformed(a, header.status()), false;
      st->open = true;
      st->error = absl::OkStatus();
      st->transport = false;
      st->request_id = header->request_id;
      if (header->worker_id != a->worker_id) {
        st->Fail(absl::PermissionDeniedError(absl::StrCat("a push for worker ", header->worker_id, " on worker ",
                                                          a->worker_id, "'s lane")),
                 false);
        return true;
      }
      // This thread takes the pull behind a push only once the push has ended (TakePushFirst): there is nothing
      // to stream early, and applying early would only add its saved copies.
      header->apply_early = false;
      absl::StatusOr<std::unique_ptr<SliceUpload>> u = ps_->StartPush(*header);
      if (u.ok()) {
        st->upload = std::move(*u);
      } else {
        st->Fail(u.status(), false);
      }
      return true;
    }
    case FrameType::kPushData: {
      if (!st->open) return false;
      absl::StatusOr<DataRef> ref = DecodeDataRef(frame.payload);
      if (!ref.ok()) return Malformed(a, ref.status()), false;
      if (!st->error.ok()) return true;
      if (ref->n < 0 || ref->n > (int64_t{1} << 40)) {
        st->Fail(TransportError(absl::StrCat("shared memory: a piece of ", ref->n, " values")), true);
        return true;
      }
      // fp32 floats the worker lends are read where they lie (it leaves them until the step is applied): no copy.
      const bool in_place = ref->lent && ref->dtype == WireDtype::kF32 && ref->at % 4 == 0;
      std::shared_ptr<const void> keep;
      absl::StatusOr<char*> data = a->Resolve(ref->segment, ref->at, ref->n * DtypeBytes(ref->dtype),
                                              in_place ? 4 : 1, in_place ? &keep : nullptr);
      if (!data.ok()) {
        st->Fail(data.status(), true);
        return true;
      }
      absl::Status s =
          in_place ? st->upload->WriteInPlace(ref->key, ref->offset, ref->n, reinterpret_cast<const float*>(*data),
                                              std::move(keep))
                   : st->upload->Write(ref->key, ref->offset, ref->n, ref->dtype, *data);
      if (!s.ok()) st->Fail(s, false);
      a->bytes->received.fetch_add(ref->n * DtypeBytes(ref->dtype), std::memory_order_relaxed);
      return true;
    }
    case FrameType::kPushRows: {
      if (!st->open) return false;
      absl::StatusOr<RowsRef> ref = DecodeRowsRef(frame.payload);
      if (!ref.ok()) return Malformed(a, ref.status()), false;
      if (!st->error.ok()) return true;
      if (ref->n < 0 || ref->n > (int64_t{1} << 32) || ref->dim < 1 || ref->dim > (1 << 20)) {
        st->Fail(TransportError(absl::StrCat("shared memory: ", ref->n, " rows of ", ref->dim, " values")), true);
        return true;
      }
      absl::StatusOr<char*> ids = a->Resolve(ref->segment, ref->ids_at, ref->n * 8, /*align=*/8);
      absl::StatusOr<char*> rows = a->Resolve(ref->segment, ref->rows_at, ref->n * ref->dim * DtypeBytes(ref->dtype));
      if (!ids.ok() || !rows.ok()) {
        st->Fail(!ids.ok() ? ids.status() : rows.status(), true);
        return true;
      }
      absl::Status s = st->upload->WriteSparse(ref->table, reinterpret_cast<const int64_t*>(*ids), ref->n, ref->dim,
                                               ref->dtype, *rows);
      if (!s.ok()) st->Fail(s, false);
      a->bytes->received.fetch_add(ref->n * (8 + ref->dim * DtypeBytes(ref->dtype)), std::memory_order_relaxed);
      return true;
    }
    case FrameType::kPushNorm: {
      if (!st->open) return false;
      if (!st->error.ok()) return true;  // the upload failed already: its error comes with the result
      absl::StatusOr<double> norm = DecodeNorm(frame.payload);
      if (!norm.ok()) {
        st->Fail(TransportError(absl::StrCat("shared memory: ", norm.status().message())), true);
        return true;
      }
      absl::Status s = st->upload->SetGradientNorm(*norm);
      if (!s.ok()) st->Fail(s, false);
      return true;
    }
    case FrameType::kPushFinish: {
      if (!st->open) return false;
      PushResult result;
      if (st->error.ok()) {
        absl::StatusOr<PushResponse> r = st->upload->Finish();
        result.status = r.status();
        if (r.ok()) result.response = *r;
      } else {
        result.status = st->error;
        result.transport_failure = st->transport;
      }
      st->upload.reset();
      st->open = false;
      st->last_request = st->request_id;
      st->answered_commit = true;
      return lane->Send(FrameType::kPushResult, EncodePushResult(result)).ok();
    }
    case FrameType::kPushAbandon: {
      st->upload.reset();  // unfinished: nothing of it is committed
      st->open = false;
      st->last_request = st->request_id;
      PushResult result;
      result.status = absl::CancelledError("upload abandoned by the worker");
      return lane->Send(FrameType::kPushResult, EncodePushResult(result)).ok();
    }
    default:
      LOG(WARNING) << "ps task " << options_.task_index << ": worker " << a->worker_id << "'s upload lane sent "
                   << FrameTypeName(frame.type) << ": closing it";
      if (fd >= 0) close(fd);
      return false;
  }
}


void ShmServer::Impl::Shutdown() {
  std::vector<std::shared_ptr<Attachment>> attachments;
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
  // Every lane still in its Hello is shut until all threads are done (an attachment made meanwhile is ended as its
  // lanes are handed to it: a->ended).
  threads_.StopAll();
}

absl::StatusOr<std::unique_ptr<ShmServer>> ShmServer::Start(PsInterface* ps, ShmServerOptions options) {
  const std::string name = absl::StrCat("dtrain-ps", options.task_index, "-", getpid(), "-", RandomHex(8));
  ASSIGN_OR_RETURN(std::unique_ptr<LaneListener> listener, LaneListener::Listen(name));
  auto impl = std::make_unique<Impl>(ps, std::move(options), std::move(listener));
  impl->StartAccepting();
  return std::unique_ptr<ShmServer>(new ShmServer(std::move(impl)));
}

ShmServer::ShmServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ShmServer::~ShmServer() { impl_->Shutdown(); }
absl::StatusOr<ShmOffer> ShmServer::Offer(const ShmAttachRequest& request) { return impl_->Offer(request); }
void ShmServer::Shutdown() { impl_->Shutdown(); }
ShmServerCounters ShmServer::counters() const { return impl_->counters(); }
const std::string& ShmServer::socket_name() const { return impl_->socket_name(); }

}  // namespace dtrain::ps::shm
