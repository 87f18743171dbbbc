// PsInterface for a ps task on the worker's own host: the data plane through shared memory, the control plane
// on another PsInterface (the gRPC client, ps/rpc/grpc_ps_client.h). See ps/shm/README.md for the design.
//
// Uploads (StartPush) and pulls (Pull) go over the shared-memory lanes when they can:
// - Gradients that lie in the worker's shared buffers (SharedHostMemory: the towers' flat gradient buffer when
//   --transport is auto or shm) are not copied at all: the ps task reads them in place. Anything else (narrow
//   wire types, sparse rows, buffers from elsewhere) is copied once into a staging segment.
// - A pull writes each slice straight into the worker's shared parameter buffer (fp32), or into the staging
//   segment (narrow wire types, other buffers) from which it is copied once; sparse rows go through staging.
// Everything else (Register, Initialize, Done, Heartbeat, GetStats, Probe, Restore) goes to `control`.
//
// Attaching: after a successful Register the client asks the ps for an offer (`attach`, over the authenticated
// control channel) and connects its two lanes; one log line says which transport this connection uses and
// why. When shared memory does not apply (another host, another user, another network namespace, a ps that
// offers none, a segment the ps cannot map), the client logs the reason and moves every data call to `control`
// (options.required = false: --transport=auto), or fails those calls with FailedPrecondition naming the
// reason (required: --transport=shm). A lane that dies (the ps exited or restarted) makes the call fail with
// Unavailable, which WorkerClient retries: the next call attaches again.
//
// Thread-safety: all methods may be called concurrently; one upload and one pull use the lanes at a time, a
// second concurrent one goes to `control`.
#ifndef DTRAIN_PS_SHM_SHM_PS_CLIENT_H_
#define DTRAIN_PS_SHM_SHM_PS_CLIENT_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/time/time.h"
#include "ps/api/ps_interface.h"
#include "ps/shm/shm_offer.h"
#include "ps/shm/shm_segment.h"

namespace dtrain::ps::shm {

// What the data calls of a client did (any thread; several clients may share one).
struct ShmCounters {
  std::atomic<int64_t> shm_pushes{0}, shm_pulls{0};    // over the lanes
  std::atomic<int64_t> control_pushes{0}, control_pulls{0};  // on the control PsInterface (gRPC)
  std::atomic<int64_t> bytes_in_place{0};  // read or written in the worker's own buffers
  std::atomic<int64_t> bytes_staged{0};    // copied through a staging segment
  // The same bytes by direction (in place or staged): pushes' gradients and rows, pulls' values and rows.
  std::atomic<int64_t> bytes_pushed{0}, bytes_pulled{0};
  std::atomic<int64_t> attaches{0};
};

struct ShmClientOptions {
  // true (--transport=shm): no fallback; data calls fail when shared memory does not apply.
  bool required = false;
  // The buffers the ps may read and write in place (null: everything is staged).
  SharedHostMemory* memory = SharedHostMemory::Default();
  std::string address;  // the ps task's, for logs and errors
  int task = 0;         // the ps task's index, for logs and errors
  absl::Duration rpc_timeout = absl::Seconds(60);  // an upload's Finish; a pull's wait beyond its own timeout
  ShmCounters* counters = nullptr;  // not owned
  // A lane looks for the ps's answer this long before its thread sleeps (Lane::set_spin).
  int spin_us = 20;
  // Longer for a pull (when spin_us > 0): its parameters come once the ps has applied the step, usually within a
  // few hundred microseconds, and the worker has nothing else to do meanwhile. Past 20 µs the spin yields its core
  // to any thread that has work (the ps applying the step, another worker).
  int pull_spin_us = 500;
  // What takes the data when shared memory does not apply (`control`), for the log line that says so.
  std::string fallback = "gRPC";
};

std::unique_ptr<PsInterface> NewShmPsClient(std::unique_ptr<PsInterface> control, ShmAttachFn attach,
                                            ShmClientOptions options);

}  // namespace dtrain::ps::shm

#endif  // DTRAIN_PS_SHM_SHM_PS_CLIENT_H_
