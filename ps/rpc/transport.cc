#include "ps/rpc/transport.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "glog/logging.h"

namespace dtrain::ps {

absl::StatusOr<Transport> ParseTransport(absl::string_view name) {
  if (name == "auto") return Transport::kAuto;
  if (name == "grpc") return Transport::kGrpc;
  if (name == "shm") return Transport::kShm;
  if (name == "tcp") return Transport::kTcp;
  return absl::InvalidArgumentError(absl::StrCat("--transport must be auto, grpc, shm or tcp, not '", name, "'"));
}

absl::string_view TransportName(Transport transport) {
  switch (transport) {
    case Transport::kAuto: return "auto";
    case Transport::kGrpc: return "grpc";
    case Transport::kShm: return "shm";
    case Transport::kTcp: return "tcp";
  }
  return "?";
}

absl::StatusOr<std::unique_ptr<PsInterface>> NewPsClient(const std::string& address, const PsClientOptions& options) {
  if (options.transport == Transport::kTcp && options.grpc.security.tls()) {
    return absl::InvalidArgumentError(
        "--transport=tcp with --tls: the TCP lanes are not encrypted; use --transport=auto or grpc (the data then "
        "stays on gRPC, under TLS)");
  }
  ASSIGN_OR_RETURN(std::unique_ptr<PsInterface> grpc, NewGrpcPsClient(address, options.grpc));
  if (options.transport == Transport::kGrpc) {
    LOG(INFO) << "ps task " << options.task << " (" << address << "): data through gRPC (--transport=grpc)"
              << (options.grpc.channels > 1
                      ? absl::StrCat(", striped over ", options.grpc.channels, " connections (--channels_per_ps)")
                      : "");
    return grpc;
  }
  std::unique_ptr<PsInterface> control = std::move(grpc);
  if (options.transport == Transport::kTcp || options.transport == Transport::kAuto) {
    tcp::TcpClientOptions to;
    to.required = options.transport == Transport::kTcp;
    // Behind shared memory (auto) the lanes attach only when data comes their way: when shared memory does not
    // apply (another host or network namespace).
    to.attach_at_register = options.transport == Transport::kTcp;
    if (options.grpc.security.tls()) to.disabled_because = "--tls: the TCP lanes are not encrypted";
    if (options.grpc.channels > 1) {
      to.disabled_because = absl::StrCat("--channels_per_ps=", options.grpc.channels, " stripes the data over gRPC");
    }
    to.address = address;
    to.task = options.task;
    to.rpc_timeout = options.grpc.rpc_timeout;
    to.counters = options.tcp_counters;
    control = tcp::NewTcpPsClient(std::move(control), NewGrpcTcpAttach(address, options.grpc), to);
    if (options.transport == Transport::kTcp) return control;
  }
  shm::ShmClientOptions so;
  so.required = options.transport == Transport::kShm;
  so.memory = options.memory;
  so.address = address;
  so.task = options.task;
  so.rpc_timeout = options.grpc.rpc_timeout;
  so.counters = options.shm_counters;
  so.spin_us = options.shm_spin_us;
  if (options.transport == Transport::kAuto) so.fallback = "TCP lanes or gRPC";
  return shm::NewShmPsClient(std::move(control), NewGrpcShmAttach(address, options.grpc), so);
}

}  // namespace dtrain::ps
