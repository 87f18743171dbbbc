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
  return absl::InvalidArgumentError(absl::StrCat("--transport must be auto, grpc or shm, not '", name, "'"));
}

absl::string_view TransportName(Transport transport) {
  switch (transport) {
    case Transport::kAuto: return "auto";
    case Transport::kGrpc: return "grpc";
    case Transport::kShm: return "shm";
  }
  return "?";
}

absl::StatusOr<std::unique_ptr<PsInterface>> NewPsClient(const std::string& address, const PsClientOptions& options) {
  ASSIGN_OR_RETURN(std::unique_ptr<PsInterface> grpc, NewGrpcPsClient(address, options.grpc));
  if (options.transport == Transport::kGrpc) {
    LOG(INFO) << "ps task " << options.task << " (" << address << "): data through gRPC (--transport=grpc)"
              << (options.grpc.channels > 1
                      ? absl::StrCat(", striped over ", options.grpc.channels, " connections (--channels_per_ps)")
                      : "");
    return grpc;
  }
  shm::ShmClientOptions so;
  so.required = options.transport == Transport::kShm;
  so.memory = options.memory;
  so.address = address;
  so.task = options.task;
  so.rpc_timeout = options.grpc.rpc_timeout;
  so.counters = options.shm_counters;
  so.spin_us = options.shm_spin_us;
  return shm::NewShmPsClient(std::move(grpc), NewGrpcShmAttach(address, options.grpc), so);
}

}  // namespace dtrain::ps
