// gRPC adapter exposing a PsInterface (normally a ParameterServer) as the dtrain.wire.ParameterServer service.
// It only converts (ps/rpc/wire_format.h for control messages, ps/rpc/tensor_coding.h for tensor data) and keeps
// no per-request state beyond the call in progress; all logic stays in the PsInterface.
//
// Thread-safety: gRPC calls the handlers from its own thread pool concurrently; the wrapped PsInterface must be
// thread-safe (ParameterServer is). The PsInterface and `shutdown` must outlive the service.
#ifndef DTRAIN_PS_RPC_GRPC_PS_SERVICE_H_
#define DTRAIN_PS_RPC_GRPC_PS_SERVICE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/service_type.h>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/cancellation.h"
#include "ps/api/ps_interface.h"
#include "ps/shm/shm_server.h"
#include "ps/tcp/tcp_server.h"

namespace dtrain::ps {

// Returns the gRPC service object to register with a grpc::ServerBuilder. Cancelling `shutdown` (may be null)
// ends every pull that is waiting, so the server can shut down at once. A non-empty `token` is required on
// every call (ps/rpc/grpc_security.h): a call without it gets UNAUTHENTICATED before it reaches `ps`. With
// `shm` (may be null; must outlive the service), AttachShm hands out its offers to workers that passed that
// check; without, AttachShm answers UNIMPLEMENTED (the ps serves gRPC only). The same for `tcp` and AttachTcp (the
// TCP lanes); `tcp_refusal`, when not OK, is AttachTcp's answer instead (e.g. TLS keeps the data on gRPC).
// The early apply (ps/core/parameter_server.h) a push may ask for (PushHeader::apply_early): kAuto grants it to
// workers on other hosts only (on the ps's own host both directions of a step are copies on the same cores: it
// measured slower there), kOn to every worker that asks, kOff to none (--apply_early on dtrain_ps).
enum class ApplyEarly { kAuto, kOn, kOff };
// "auto" | "on" | "off"; InvalidArgument naming the flag otherwise.
absl::StatusOr<ApplyEarly> ParseApplyEarly(absl::string_view name);

// The bytes of the tensor streams (Initialize, Push, PushPart and Pull: their serialized messages, framing
// included; the control calls' small protobufs are not counted) the service received and sent. Thread-safe
// (relaxed atomics, one add per message).
struct GrpcStreamCounters {
  std::atomic<int64_t> bytes_received{0};
  std::atomic<int64_t> bytes_sent{0};
};

// `counters` (may be null; must outlive the service) counts the tensor streams' bytes.
std::unique_ptr<grpc::Service> NewGrpcPsService(PsInterface* ps, Cancellation* shutdown = nullptr,
                                                const std::string& token = "", shm::ShmServer* shm = nullptr,
                                                ApplyEarly apply_early = ApplyEarly::kAuto,
                                                tcp::TcpServer* tcp = nullptr,
                                                absl::Status tcp_refusal = absl::OkStatus(),
                                                GrpcStreamCounters* counters = nullptr);

}  // namespace dtrain::ps

#endif  // DTRAIN_PS_RPC_GRPC_PS_SERVICE_H_
