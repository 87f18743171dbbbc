// The ps task's side of the shared-memory data plane (ps/shm/README.md): serves the uploads and pulls of
// workers on the same host over lanes (ps/shm/shm_lane.h) to a PsInterface (the task's ParameterServer), with
// the tensor data read from and written into the workers' shared segments. Everything else (Register,
// Initialize, heartbeats, Done, statistics, checkpoints' Probe and Restore) stays on gRPC, which also hands out
// the offers (Offer) that let a worker in.
//
// Per attached worker: an attachment with two lanes, one for its uploads and one for its pulls, each served by
// its own thread, and the segments the worker shared (mapped read-write). A worker that attaches again ends its
// previous attachment first (its calls return before the new one is offered, so an old pull can never write
// into buffers a new one fills). When either lane of an attachment closes (the worker exited, was killed, or
// gave up on a call) the attachment ends: an upload in progress is dropped unfinished (nothing of it is
// committed: a half-written upload is never applied, except async under --nonfinite=apply, whose slices are
// applied as each arrives whole: PushAccounting::partly_applied counts those), a pull in progress is cancelled,
// and the segments are unmapped.
//
// A connection must present a valid ticket of an offer in its first frame within `hello_timeout` and come
// from a process of the ps's own user (SO_PEERCRED), or it is closed; nothing else is read from it.
//
// Thread-safety: Offer and Shutdown may be called from any thread.
#ifndef DTRAIN_PS_SHM_SHM_SERVER_H_
#define DTRAIN_PS_SHM_SHM_SERVER_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/cancellation.h"
#include "ps/api/ps_interface.h"
#include "ps/shm/shm_offer.h"

namespace dtrain::ps::shm {

struct ShmServerOptions {
  int task_index = 0;  // for logs
  // Cancelled when the ps shuts down: pulls in flight end at once (may be null).
  Cancellation* shutdown = nullptr;
  int max_lanes = 256;  // connections served at once; more are closed at once
  absl::Duration hello_timeout = absl::Seconds(2);
  absl::Duration ticket_ttl = absl::Seconds(30);
  // An upload silent for longer is dropped unfinished and its lane closed.
  absl::Duration upload_timeout = absl::Seconds(120);
  int max_segments = 64;  // per attachment
  // The most rows of one table a pull may ask for (ParameterServerOptions::max_pull_rows), checked before its
  // ids are copied out of the worker's memory.
  int64_t max_pull_rows = int64_t{1} << 22;
  // A lane looks for the worker's next frame this long before its thread sleeps (Lane::set_spin).
  int spin_us = 20;
  // Longer right after answering a commit (when spin_us > 0): the worker's pull follows within microseconds, once
  // the worker has woken to the answer, and a thread that slept meanwhile costs that pull a wake-up of an idle
  // core (tens of microseconds, more under a hypervisor). The wait ends as soon as the pull comes.
  int spin_after_commit_us = 300;
  // While an upload is open (when spin_us > 0): the worker is in its backward pass and its next piece, and then its
  // commit, follow within tens of microseconds. A thread that slept between pieces would wake to the commit late
  // by a wake-up; awake, it wakes only to the first piece, while the worker still computes. Past 20 µs the spin
  // yields its core to any thread that has work (a worker computing beside it), so it costs a core only while
  // that core would be idle.
  int spin_in_upload_us = 500;
};

struct ShmServerCounters {
  int64_t offers = 0;
  int64_t lanes_accepted = 0;
  int64_t lanes_refused = 0;  // no valid ticket, another user, too many, malformed Hello
  int64_t active_lanes = 0;
  int64_t active_attachments = 0;
  // Open when their lane closed or fell silent: dropped, never acknowledged; nothing of them applied, except under
  // async --nonfinite=apply, whose slices are applied as each arrives whole (PushAccounting::partly_applied).
  int64_t uploads_cut_off = 0;
  // Tensor data read from the workers' memory (pushes: values at their wire size, sparse rows with their ids) and
  // written to it (pulls), by every lane so far.
  int64_t bytes_received = 0;
  int64_t bytes_sent = 0;
};

class ShmServer {
 public:
  // Listens on a fresh abstract socket. `ps` must outlive the server. Unavailable when it cannot listen.
  static absl::StatusOr<std::unique_ptr<ShmServer>> Start(PsInterface* ps, ShmServerOptions options);
  ~ShmServer();  // Shutdown()

  // An offer for worker `request.worker_id` (called for an authenticated gRPC request). Ends the worker's
  // previous attachment first. FailedPrecondition when the worker is on another host or runs as another user
  // (the message says which), Unavailable after Shutdown.
  absl::StatusOr<ShmOffer> Offer(const ShmAttachRequest& request);
  // Closes the socket and every lane, cancels pulls in flight, waits for the lanes' threads.
  void Shutdown();
  ShmServerCounters counters() const;
  const std::string& socket_name() const;

  class Impl;

 private:
  explicit ShmServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace dtrain::ps::shm

#endif  // DTRAIN_PS_SHM_SHM_SERVER_H_
