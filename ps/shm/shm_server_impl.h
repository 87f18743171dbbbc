// ShmServer's insides, shared by its files: shm_server.cc (offers, admission of lanes, the attachments' loop,
// pushes) and shm_server_pull.cc (pulls written into the worker's memory). Not part of the room's interface.
//
// Thread-safety: an Attachment's lanes and segments are guarded by its own mu; one thread serves both of its
// lanes (ServeAttachment), and only that thread adds to its LaneBytes. The server's list of attachments, its
// counters and the byte totals are guarded by Impl::mu_.
#ifndef DTRAIN_PS_SHM_SHM_SERVER_IMPL_H_
#define DTRAIN_PS_SHM_SHM_SERVER_IMPL_H_

#include <atomic>
#include <list>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "glog/logging.h"
#include "ps/shm/lane_threads.h"
#include "ps/shm/shm_frame.h"
#include "ps/shm/shm_lane.h"
#include "ps/shm/shm_segment.h"
#include "ps/shm/shm_server.h"

namespace dtrain::ps::shm {

// A data-plane failure (not the ps's answer): the worker moves to gRPC or fails, see PushResult.
inline absl::Status TransportError(std::string message) { return absl::FailedPreconditionError(std::move(message)); }

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

}  // namespace dtrain::ps::shm

#endif  // DTRAIN_PS_SHM_SHM_SERVER_IMPL_H_
