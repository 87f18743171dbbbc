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

// A data-plane failure (not the ps's answer): the worker moves to gRPC or fails, see PushResult.
absl::Status TransportError(std::string message) { return absl::FailedPreconditionError(std::move(message)); }

}  // namespace

// Tensor bytes one attachment's lanes read from and wrote to the worker's memory. Only the thread serving the
// attachment adds to them (relaxed), so each worker's counts stay on a cache line of their own; the server sums
// them when asked and folds those of ended attachments into its totals (ShmServer::Impl::counters).
struct LaneBytes {
  std::atomic<int64_t> received{0};
  std::atomic<int64_t> sent{0};
};

// One attached worker: its tickets, its two lanes, the segments it shared.
struct Attachment {
  int worker_id = 0;
  std::shared_ptr<LaneBytes> bytes = std::make_shared<LaneBytes>();  // the server holds it too (counters)
  std::string push_ticket, pull_ticket;
  absl::Time expires;
  // Cancelled when the attachment ends: wakes a pull in flight.
  Cancellation pull_cancel;

  absl::Mutex mu;
  bool ended ABSL_GUARDED_BY(mu) = false;
  int active ABSL_GUARDED_BY(mu) = 0;  // threads holding it (admitting a lane, or serving it)
  // Its lanes once admitted; one thread serves both (ServeAttachment), the one that admitted the second.
  std::unique_ptr<Lane> push_lane ABSL_GUARDED_BY(mu), pull_lane ABSL_GUARDED_BY(mu);
  std::vector<std::shared_ptr<ShmSegment>> doorbells ABSL_GUARDED_BY(mu);  // the lanes' (LaneDoorbells)
  bool served ABSL_GUARDED_BY(mu) = false;
  // Shared, so that what refers to a segment beyond the attachment (a gradient lent to the ps's buffers until its
  // step is applied: SliceUpload::WriteInPlace) keeps it mapped.
  std::map<uint32_t, std::shared_ptr<ShmSegment>> segments ABSL_GUARDED_BY(mu);
  // A segment the worker shared that could not be mapped: every later call fails with it (a transport failure).
  absl::Status segment_error ABSL_GUARDED_BY(mu);

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
  // Where [at, at + bytes) of segment `id` is mapped here; a transport failure when it is not.
  // With `keep`, the segment is held there too.
  absl::StatusOr<char*> Resolve(uint32_t id, int64_t at, int64_t bytes, int64_t align = 1,
                                std::shared_ptr<const void>* keep = nullptr) {
    absl::MutexLock lock(&mu);
    if (!segment_error.ok()) return segment_error;
    auto it = segments.find(id);
    if (it == segments.end()) return TransportError(absl::StrCat("shared memory: segment ", id, " was not shared"));
    const ShmSegment& s = *it->second;
    if (at < 0 || bytes < 0 || at > s.size() || bytes > s.size() - at || at % align != 0) {
      return TransportError(absl::StrCat("shared memory: bytes [", at, ", +", bytes, ") outside segment ", id, " of ",
                                         s.size(), " bytes"));
    }
    if (keep != nullptr) *keep = it->second;
    return s.data() + at;
  }
};

class ShmServer::Impl {
 public:
  Impl(PsInterface* ps, ShmServerOptions options, std::unique_ptr<LaneListener> listener)
      : ps_(ps), options_(std::move(options)), listener_(std::move(listener)), threads_(options_.max_lanes) {}
  ~Impl() { Shutdown(); }

  void StartAccepting() { accept_thread_ = std::thread([this] { AcceptLoop(); }); }

  absl::StatusOr<ShmOffer> Offer(const ShmAttachRequest& request);
  void Shutdown();
  ShmServerCounters counters() const {
    absl::MutexLock lock(&mu_);
    ShmServerCounters c = counters_;
    c.active_lanes = threads_.active();
    c.lanes_refused += threads_.refused();
    c.active_attachments = 0;
    for (const auto& a : attachments_) {
      absl::MutexLock al(&a->mu);
      c.active_attachments += a->ended ? 0 : 1;
    }
    FoldEndedLaneBytes();
    c.bytes_received = ended_bytes_received_;
    c.bytes_sent = ended_bytes_sent_;
    for (const auto& b : lane_bytes_) {
      c.bytes_received += b->received.load(std::memory_order_relaxed);
      c.bytes_sent += b->sent.load(std::memory_order_relaxed);
    }
    return c;
  }
  const std::string& socket_name() const { return listener_->name(); }

  // Each attachment's byte counts are summed while it may still count (an attachment holds them), then folded
  // into the totals once and dropped: the sums never go down, and the list holds no more than the attachments.
  void FoldEndedLaneBytes() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (auto it = lane_bytes_.begin(); it != lane_bytes_.end();) {
      if (it->use_count() == 1) {
        // The attachment is gone: its serving thread's last adds happened before it let go of it.
        std::atomic_thread_fence(std::memory_order_acquire);
        ended_bytes_received_ += (*it)->received.load(std::memory_order_relaxed);
        ended_bytes_sent_ += (*it)->sent.load(std::memory_order_relaxed);
        it = lane_bytes_.erase(it);
      } else {
        ++it;
      }
    }
  }

 private:
  using LaneThread = LaneThreads<Lane>::Slot;
  void AcceptLoop();
  void ServeConnection(int fd, LaneThread* t);
  // Checks the first frame; returns the attachment the lane belongs to (registered with it), or null.
  std::shared_ptr<Attachment> Admit(Lane* lane, LaneKind* kind);
  // Serves both lanes of an attachment on this thread, until either closes.
  void ServeAttachment(Attachment* a);
  struct UploadState;
  // One frame of the push lane / the pull lane; false: close the attachment.
  bool HandlePush(Lane* lane, Attachment* a, const Frame& frame, int fd, UploadState* st);
  bool HandlePull(Lane* lane, Attachment* a, const Frame& frame, int fd);
  // Before a pull: takes the push lane's frames until the upload the pull follows has ended (see the .cc).
  bool TakePushFirst(Lane* push_lane, Attachment* a, const std::string& pull_payload, UploadState* st);
  // A Segment frame: maps it into the attachment (a failure is kept as the attachment's segment_error).
  void AddSegment(Attachment* a, const Frame& frame, int fd);
  // A frame that does not decode: logged; the caller closes the lane.
  void Malformed(const Attachment* a, const absl::Status& s) const {
    LOG(WARNING) << "ps task " << options_.task_index << ": worker " << a->worker_id << "'s lane: " << s
                 << ": closing it";
  }

  PsInterface* const ps_;
  const ShmServerOptions options_;
  std::unique_ptr<LaneListener> listener_;
  std::thread accept_thread_;

  mutable absl::Mutex mu_;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  std::list<std::shared_ptr<Attachment>> attachments_ ABSL_GUARDED_BY(mu_);
  ShmServerCounters counters_ ABSL_GUARDED_BY(mu_);  // active_lanes: threads_'s
  // Tensor bytes read from and written to the workers' memory: every attachment's own counts (LaneBytes), and
  // the totals of those that ended. Folded by counters(), hence mutable.
  mutable std::vector<std::shared_ptr<LaneBytes>> lane_bytes_ ABSL_GUARDED_BY(mu_);
  mutable int64_t ended_bytes_received_ ABSL_GUARDED_BY(mu_) = 0;
  mutable int64_t ended_bytes_sent_ ABSL_GUARDED_BY(mu_) = 0;
  LaneThreads<Lane> threads_;  // one per connection; a lane marked there while its Hello is read
};

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

namespace {

using DestKind = Destination::Kind;

// Delivers a pull into the worker's memory: slices in place (fp32, straight into its parameter buffer) or into
// its staging area (the pull's wire dtype), sparse rows into the staging area; tells the worker what was
// written at every Flush.
class ShmPullReceiver : public PullReceiver {
 public:
  // What is written to the worker's memory counts in its attachment's LaneBytes.
  ShmPullReceiver(Lane* lane, Attachment* a, const PullOrder& order)
      : lane_(lane), a_(a), order_(order), bytes_sent_(&a->bytes->sent) {}

  // Resolves every destination; a transport failure when one lies outside what the worker shared.
  absl::Status Prepare() {
    const int el = DtypeBytes(order_.request.wire_dtype);
    for (const shm::Destination& d : order_.destinations) {
      if (d.length < 0 || d.length > (int64_t{1} << 40)) {
        return TransportError(absl::StrCat("shared memory: slice ", d.key, " of ", d.length, " floats"));
      }
      Target t;
      t.kind = d.kind;
      t.length = d.length;
      if (d.kind == DestKind::kInPlace) {
        ASSIGN_OR_RETURN(t.base, a_->Resolve(d.segment, d.at, d.length * 4, /*align=*/4));
        t.dtype = WireDtype::kF32;
      } else if (d.kind == DestKind::kStaging) {
        ASSIGN_OR_RETURN(t.base, a_->Resolve(d.segment, d.at, d.length * el));
        t.dtype = order_.request.wire_dtype;
      }
      targets_[d.key] = t;
    }
    for (const SparseOrder& s : order_.sparse) {
      if (s.n < 0 || s.n > (int64_t{1} << 32) || s.dim < 1 || s.dim > (1 << 20)) {
        return TransportError(absl::StrCat("shared memory: ", s.n, " rows of ", s.dim, " values"));
      }
      RowsTarget r;
      r.dim = s.dim;
      r.n = s.n;
      ASSIGN_OR_RETURN(r.base, a_->Resolve(s.segment, s.rows_at, s.n * s.dim * el));
      rows_[s.table] = r;
    }
    return absl::OkStatus();
  }

  absl::Status OnHeader(const PullHeader& header) override {
    return lane_->Send(FrameType::kPullHeader, EncodePullHeader(header));
  }
  absl::StatusOr<Buffer> Destination(uint32_t key, int64_t offset, int64_t n) override {
    RETURN_IF_ERROR(Alive());
    auto it = targets_.find(key);
    if (it == targets_.end()) {
      return absl::InvalidArgumentError(absl::StrCat("the worker's pull names no destination for slice key ", key,
                                                     ": its placement differs from this ps task's"));
    }
    const Target& t = it->second;
    if (!RangeWithin(offset, n, t.length)) {
      return absl::InvalidArgumentError(absl::StrCat("slice key ", key, ": ", n, " floats from ", offset,
                                                     " beyond the worker's ", t.length));
    }
    if (t.kind == DestKind::kSkip) return Buffer{};
    return Buffer{t.base + offset * DtypeBytes(t.dtype), t.dtype};
  }
  absl::Status Written(uint32_t key, int64_t offset, int64_t n) override {
    const Target& t = targets_[key];
    if (t.kind == DestKind::kSkip) return absl::OkStatus();
    bytes_sent_->fetch_add(n * DtypeBytes(t.dtype), std::memory_order_relaxed);
    pieces_.slices.push_back(SlicePiece{key, offset, n, t.dtype});
    return pieces_.slices.size() >= 1024 ? Flush() : absl::OkStatus();
  }
  absl::StatusOr<Buffer> SparseDestination(uint32_t table, int64_t first, int64_t n, int dim) override {
    RETURN_IF_ERROR(Alive());
    auto it = rows_.find(table);
    if (it == rows_.end() || it->second.dim != dim || !RangeWithin(first, n, it->second.n)) {
      return absl::InvalidArgumentError(absl::StrCat(n, " rows from row ", first, " of table ", table, " (dim ",
                                                     dim, ") beyond the worker's pull"));
    }
    const int el = DtypeBytes(order_.request.wire_dtype);
    return Buffer{it->second.base + first * dim * el, order_.request.wire_dtype};
  }
  absl::Status SparseWritten(uint32_t table, int64_t first, int64_t n) override {
    bytes_sent_->fetch_add(n * rows_[table].dim * DtypeBytes(order_.request.wire_dtype), std::memory_order_relaxed);
    pieces_.rows.push_back(RowPiece{table, first, n, order_.request.wire_dtype});
    return pieces_.rows.size() >= 1024 ? Flush() : absl::OkStatus();
  }
  absl::Status Flush() override {
    if (pieces_.slices.empty() && pieces_.rows.empty()) return absl::OkStatus();
    absl::Status s = lane_->Send(FrameType::kPullPieces, EncodePieces(pieces_));
    pieces_ = PiecesWritten();
    return s;
  }

 private:
  struct Target {
    DestKind kind = DestKind::kSkip;
    char* base = nullptr;
    int64_t length = 0;
    WireDtype dtype = WireDtype::kF32;
  };
  struct RowsTarget {
    char* base = nullptr;
    int64_t n = 0;
    int dim = 0;
  };
  // The worker's memory is written only while its attachment lives.
  absl::Status Alive() const {
    if (lane_->dead() || a_->pull_cancel.cancelled()) {
      return absl::CancelledError("the worker's shared-memory attachment ended");
    }
    return absl::OkStatus();
  }

  Lane* lane_;
  Attachment* a_;
  const PullOrder& order_;
  std::atomic<int64_t>* const bytes_sent_;
  std::map<uint32_t, Target> targets_;
  std::map<uint32_t, RowsTarget> rows_;
  PiecesWritten pieces_;
};

}  // namespace

bool ShmServer::Impl::HandlePull(Lane* lane, Attachment* a, const Frame& frame, int fd) {
  if (frame.type == FrameType::kSegment) {
    AddSegment(a, frame, fd);
    return true;
  }
  if (fd >= 0) close(fd);
  if (frame.type != FrameType::kPullRequest) {
    LOG(WARNING) << "ps task " << options_.task_index << ": worker " << a->worker_id << "'s pull lane sent "
                 << FrameTypeName(frame.type) << ": closing it";
    return false;
  }
  absl::StatusOr<PullOrder> order = DecodePullOrder(frame.payload);
  if (!order.ok()) return Malformed(a, order.status()), false;
  PushResult end;
  ShmPullReceiver receiver(lane, a, *order);
  PullRequest request = order->request;
  if (request.worker_id != a->worker_id) {
    end.status = absl::PermissionDeniedError(
        absl::StrCat("a pull for worker ", request.worker_id, " on worker ", a->worker_id, "'s lane"));
  } else if (absl::Status s = receiver.Prepare(); !s.ok()) {
    end.status = s;
    end.transport_failure = true;
  } else {
    for (const SparseOrder& so : order->sparse) {
      if (absl::Status limit = CheckPullRows(options_.max_pull_rows, a->worker_id, options_.task_index, so.table, so.n);
          !limit.ok()) {
        end.status = limit;
        break;
      }
      absl::StatusOr<char*> ids = a->Resolve(so.segment, so.ids_at, so.n * 8, /*align=*/8);
      if (!ids.ok()) {
        end.status = ids.status();
        end.transport_failure = true;
        break;
      }
      const int64_t* p = reinterpret_cast<const int64_t*>(*ids);
      request.sparse.push_back(SparseIds{so.table, std::vector<int64_t>(p, p + so.n)});
    }
  }
  if (end.status.ok()) {
    // Both the attachment's end and the server's shutdown wake a pull that waits.
    Cancellation cancel;
    const int64_t id1 = a->pull_cancel.Register([&cancel] { cancel.Cancel(); });
    const int64_t id2 = options_.shutdown != nullptr ? options_.shutdown->Register([&cancel] { cancel.Cancel(); }) : 0;
    request.cancel = &cancel;
    end.status = ps_->Pull(request, &receiver);
    a->pull_cancel.Deregister(id1);
    if (options_.shutdown != nullptr) options_.shutdown->Deregister(id2);
    if (end.status.ok()) end.status = receiver.Flush();
  }
  return lane->Send(FrameType::kPullEnd, EncodePushResult(end)).ok();
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
