// Runs a ParameterServer behind a gRPC server: what `dtrain_ps` does, and what tests start in-process.
//
// Thread-safety: PsServer's methods may be called from any thread.
//
// Example:
//   PsServerOptions o; o.listen_address = "127.0.0.1:0"; o.ps.num_workers = 2;
//   ASSIGN_OR_RETURN(std::unique_ptr<PsServer> server, PsServer::Start(o));
//   std::string address = server->address();   // with the port actually bound
//   server->Wait();                             // returns once every worker has reported done
#ifndef DTRAIN_PS_RPC_SERVER_H_
#define DTRAIN_PS_RPC_SERVER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "ps/rpc/grpc_ps_service.h"
#include "ps/rpc/grpc_security.h"
#include "ps/core/parameter_server.h"
#include "ps/shm/shm_server.h"
#include "ps/tcp/tcp_server.h"

namespace dtrain::ps {

struct PsServerOptions {
  std::string listen_address;  // "host:port"; port 0 picks a free one
  ParameterServerOptions ps;
  SecurityOptions security;    // token and TLS (ps/rpc/grpc_security.h)
  // Once every worker has left (the ParameterServer finished), Wait() serves on until no worker needs this task
  // any more, at most this long: until ps task 0 has told each worker that completed how the run ended (each asks
  // it once, TrainingStats showing every worker gone: trainer.cc's AwaitRunOutcome), and while a worker is lost
  // (it may still be alive, and hear RunOverError when it registers again). Calls still in flight then get
  // gRPC's shutdown grace (2 s). Zero: shut down at once.
  absl::Duration linger = absl::Milliseconds(500);
  // gRPC's resource quota for this server: the memory its connections and messages in flight may take.
  int64_t max_inflight_bytes = int64_t{1} << 30;
  // Offer workers on this host the shared-memory data plane (ps/shm/; --transport auto or shm). false: gRPC only.
  bool offer_shm = true;
  int shm_spin_us = 20;  // a shared-memory lane looks for the worker's next frame this long before sleeping
  // Offer workers on other hosts the TCP data plane (ps/tcp/; --transport auto or tcp), on a port of the listen
  // address' host (tcp_port; 0: any free one, which the offers name). Not with TLS: the lanes are not encrypted,
  // so the data stays on gRPC (AttachTcp says so).
  bool offer_tcp = true;
  int tcp_port = 0;
  ApplyEarly apply_early = ApplyEarly::kAuto;  // which workers' pushes may be applied as they arrive
};

class PsServer {
 public:
  // Unavailable if the address cannot be bound (in use, bad host); InvalidArgument for bad ps options.
  static absl::StatusOr<std::unique_ptr<PsServer>> Start(const PsServerOptions& options);
  ~PsServer();  // shuts the server down

  std::string address() const;  // host:bound_port
  int port() const;
  ParameterServer* parameter_server();
  // The shared-memory server (null when options.offer_shm was false).
  shm::ShmServer* shm_server();
  // The TCP data plane's server (null when it is not offered).
  tcp::TcpServer* tcp_server();
  // The bytes of tensor data that came and went over gRPC's streams (grpc_ps_service.h), so far.
  struct GrpcBytes {
    int64_t received = 0, sent = 0;
  };
  GrpcBytes grpc_bytes() const;

  // Blocks until no worker is left (every one done or lost; see parameter_server()->outcome()) or `timeout`, then
  // shuts down once no worker needs this task (options.linger). Returns false on timeout.
  bool Wait(absl::Duration timeout = absl::InfiniteDuration());
  void Shutdown();

 private:
  PsServer() = default;
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace dtrain::ps

#endif  // DTRAIN_PS_RPC_SERVER_H_
