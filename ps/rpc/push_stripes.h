// Pushes striped over several connections to one ps task (a worker's --channels_per_ps): the main Push stream
// opens the ps core's upload and names a random stripe id and how many PushPart streams carry slices beside it;
// each PushPart stream joins the upload by that id and writes its slices into it. The main stream's client ends
// it only after every part stream has ended, so when it ends every part must have finished: otherwise the push
// fails (and is not applied), as a broken single stream does.
//
// The core's upload belongs to one thread at a time (ps/api/ps_interface.h): a Stripe serializes the writes of
// its streams with its mutex. Their messages are decoded outside it, one thread per connection.
//
// Errors: Open: InvalidArgument for a bad part count or a stripe id in use (or used lately). Join: InvalidArgument
// for a bad part number or a part joined twice, PermissionDenied when the part's worker, session or request id
// differ from the main stream's, FailedPrecondition when the push already ended, Unavailable when its main stream
// did not arrive before the deadline. Writes after the push ended: FailedPrecondition.
//
// Thread-safety: thread-safe.
#ifndef DTRAIN_PS_RPC_PUSH_STRIPES_H_
#define DTRAIN_PS_RPC_PUSH_STRIPES_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "ps/api/ps_interface.h"

namespace dtrain::ps {

inline constexpr int kMaxPushParts = 63;  // part streams beside the main one

// Who a stream claims to be: the main stream's push header, or a part's (part 0 is the main stream).
struct StripeMember {
  int worker_id = 0;
  uint64_t session = 0;
  uint64_t request_id = 0;
  uint64_t stripe_id = 0;
  int part = 0;
};

class PushStripes {
 public:
  class Stripe {
   public:
    absl::Status Write(uint32_t key, int64_t offset, int64_t n, WireDtype dtype, const void* data);
    absl::Status WriteSparse(uint32_t table, const int64_t* ids, int64_t n, int dim, WireDtype dtype,
                             const void* rows);
    absl::Status SetGradientNorm(double norm);
    // A part stream ended: `status` is OK when it ended as its client meant (WritesDone).
    void PartEnded(int part, const absl::Status& status);

   private:
    friend class PushStripes;
    Stripe(const StripeMember& main, int parts, SliceUpload* upload)
        : main_(main), upload_(upload), joined_(parts + 1, 0), ended_(parts + 1, 0) {}
    absl::Status Ended() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

    const StripeMember main_;
    absl::Mutex mu_;
    SliceUpload* upload_ ABSL_GUARDED_BY(mu_);  // null once the main stream ended
    std::vector<char> joined_ ABSL_GUARDED_BY(mu_);
    std::vector<char> ended_ ABSL_GUARDED_BY(mu_);  // [part]: ended OK
    absl::Status part_error_ ABSL_GUARDED_BY(mu_);  // the first part that failed
  };

  // The main stream started `upload` (not owned; it outlives Close) for `main`, with `parts` part streams.
  absl::StatusOr<std::shared_ptr<Stripe>> Open(const StripeMember& main, int parts, SliceUpload* upload);
  // The main stream ended (`finishing`: its client ended it, and it is about to finish the upload) or broke.
  // Detaches the upload from the stripe (later part writes fail) and, when finishing, returns OK only if every
  // part ended OK (else the first part's error, or Unavailable naming the part that never ended).
  absl::Status Close(uint64_t stripe_id, bool finishing);
  // A part stream joins the stripe of `part.stripe_id`, waiting until `deadline` for its main stream, or until
  // `stopped` (may be empty; looked at every 50 ms) says the call or the server ended (Cancelled).
  absl::StatusOr<std::shared_ptr<Stripe>> Join(const StripeMember& part, absl::Time deadline,
                                               const std::function<bool()>& stopped = nullptr);

 private:
  absl::Mutex mu_;
  absl::CondVar opened_;
  absl::flat_hash_map<uint64_t, std::shared_ptr<Stripe>> open_ ABSL_GUARDED_BY(mu_);
  // Recently closed ids, so that a part arriving late fails at once rather than at its deadline.
  absl::flat_hash_set<uint64_t> closed_ ABSL_GUARDED_BY(mu_);
  std::deque<uint64_t> closed_order_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dtrain::ps

#endif  // DTRAIN_PS_RPC_PUSH_STRIPES_H_
