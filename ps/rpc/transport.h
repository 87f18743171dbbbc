// Which transport a worker's connection to a ps task uses (--transport on dtrain_worker and dtrain_ps):
//   grpc  every call over gRPC;
//   shm   data through shared memory (ps/shm/), gRPC for the control calls; a ps task that cannot be reached
//         that way (another host, user or network namespace; a gRPC-only ps) fails the worker with the reason;
//   tcp   data over TCP lanes (ps/tcp/), gRPC for the control calls; a ps task that offers none (or --tls, whose
//         data stays on gRPC) fails the worker with the reason;
//   auto  shared memory where it applies (one host), TCP lanes elsewhere (across hosts, unless --tls), gRPC where
//         neither does (the default). One log line per connection says which and why.
// On the ps, grpc offers neither data plane; shm offers shared memory, tcp the TCP lanes, auto both.
//
// Thread-safety: free functions.
#ifndef DTRAIN_PS_RPC_TRANSPORT_H_
#define DTRAIN_PS_RPC_TRANSPORT_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ps/api/ps_interface.h"
#include "ps/rpc/grpc_ps_client.h"
#include "ps/shm/shm_ps_client.h"
#include "ps/tcp/tcp_ps_client.h"

namespace dtrain::ps {

enum class Transport { kAuto, kGrpc, kShm, kTcp };

// "auto" | "grpc" | "shm" | "tcp"; InvalidArgument naming the flag otherwise.
absl::StatusOr<Transport> ParseTransport(absl::string_view name);
absl::string_view TransportName(Transport transport);

struct PsClientOptions {
  Transport transport = Transport::kAuto;
  GrpcClientOptions grpc;
  int task = 0;  // the ps task's index, for logs
  // Shared memory: the buffers the ps may use in place (the worker's towers allocate from it) and counters.
  shm::SharedHostMemory* memory = shm::SharedHostMemory::Default();
  shm::ShmCounters* shm_counters = nullptr;
  tcp::TcpCounters* tcp_counters = nullptr;
  int shm_spin_us = 20;  // a lane looks for the ps's answer this long before its thread sleeps
};

// The PsInterface a worker uses for the ps task at `address`. InvalidArgument for --transport=tcp with TLS.
absl::StatusOr<std::unique_ptr<PsInterface>> NewPsClient(const std::string& address, const PsClientOptions& options);

}  // namespace dtrain::ps

#endif  // DTRAIN_PS_RPC_TRANSPORT_H_
