// PsInterface over gRPC: a worker's connection to one ps task.
//
// Every call has a deadline. Unary calls failing with Unavailable (ps not up yet, connection reset) are retried
// with exponential backoff until `retry_window` has passed; uploads and pulls are retried by their caller
// (ps/client/worker_client.h), which can send a whole upload again. Other errors are returned as they are (codes
// from ps/api/ps_interface.h). Tensor data goes out without a copy (see ps/rpc/tensor_coding.h): an upload
// references the caller's memory until its Finish returns.
//
// Reconnection: a call on a channel that is not connected (the task died, restarted or is not up yet) first
// waits up to about 1 s for the connection attempt in progress (never past a retried call's retry window, and
// not after an upload's or pull's Cancellation fires), so a restarted task is reached within about a second of
// its return. A connected channel costs one state read per call.
//
// Thread-safety: all methods may be called concurrently (gRPC channels are thread-safe).
//
// Example:
//   ASSIGN_OR_RETURN(std::unique_ptr<PsInterface> ps0, NewGrpcPsClient("127.0.0.1:2222", {}));
//   ASSIGN_OR_RETURN(RegisterResponse r, ps0->Register(request));
#ifndef DTRAIN_PS_RPC_GRPC_PS_CLIENT_H_
#define DTRAIN_PS_RPC_GRPC_PS_CLIENT_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "ps/rpc/grpc_security.h"
#include "ps/api/ps_interface.h"
#include "ps/shm/shm_offer.h"
#include "ps/tcp/tcp_offer.h"

namespace dtrain::ps {

// The bytes of the messages a client sent and received (their protobuf encoding; gRPC's and HTTP/2's framing
// not counted): what the data path costs on the wire. Any thread; several clients may share one.
struct WireCounters {
  std::atomic<int64_t> sent{0};
  std::atomic<int64_t> received{0};
};

struct GrpcClientOptions {
  absl::Duration rpc_timeout = absl::Seconds(60);   // per attempt, for everything but Pull
  absl::Duration retry_window = absl::Seconds(30);  // keep retrying Unavailable this long
  absl::Duration initial_backoff = absl::Milliseconds(50);
  absl::Duration max_backoff = absl::Seconds(2);
  SecurityOptions security;  // token and TLS (ps/rpc/grpc_security.h)
  WireCounters* counters = nullptr;  // not owned; when set, counts every message of this client
  // Connections to the ps task (--channels_per_ps; 1 to 64). With N > 1 a push is striped by slice over N
  // streams, one per connection (slice key k on connection k mod N: a main Push stream and N - 1 PushPart
  // streams that the ps merges into one upload), and a pull over N pulls, each for the slices of one residue of
  // their order on the task (PullRequest::part), the sparse rows on the first, which waits for the step (the
  // others start once its header arrived). The control calls use the first connection. With N = 1, a pull that
  // streams beside a push (PullRequest::beside_push) gets a second connection, opened on its first use.
  int channels = 1;
  // Channels of equal arguments share one connection (gRPC's subchannel pool), so several clients of one
  // process to the same task share it, and its limit of concurrent streams (32 on a ps task): many workers'
  // pulls waiting there for their step would leave no stream for the pushes that step needs. A process that
  // holds several workers' clients (dtrain_bench_ps_load) gives each its own group, so each has connections of
  // its own, as separate worker processes do. 0: the default group.
  int connection_group = 0;
};

absl::StatusOr<std::unique_ptr<PsInterface>> NewGrpcPsClient(const std::string& address,
                                                             const GrpcClientOptions& options);

// Asks the ps task at `address` for a shared-memory offer (the AttachShm call, with the token and TLS of
// `options`; one attempt), for ps/shm/shm_ps_client.h. UNIMPLEMENTED from a ps that serves gRPC only.
shm::ShmAttachFn NewGrpcShmAttach(const std::string& address, const GrpcClientOptions& options);
// The same for TCP lanes (the AttachTcp call), for ps/tcp/tcp_ps_client.h. UNIMPLEMENTED from a ps that offers
// none, FAILED_PRECONDITION when it will not (the message says why).
tcp::TcpAttachFn NewGrpcTcpAttach(const std::string& address, const GrpcClientOptions& options);

}  // namespace dtrain::ps

#endif  // DTRAIN_PS_RPC_GRPC_PS_CLIENT_H_
