// The one place where the plain structs of ps/api/ps_types.h meet the generated proto messages of the control
// fields, and where gRPC and absl statuses are converted. Tensor data is coded by ps/rpc/tensor_coding.h. Used
// only by ps/rpc/grpc_ps_service and ps/rpc/grpc_ps_client.
//
// Thread-safety: free functions, no shared state.
#ifndef DTRAIN_PS_RPC_WIRE_FORMAT_H_
#define DTRAIN_PS_RPC_WIRE_FORMAT_H_

#include <cstdint>
#include <vector>

#include <grpcpp/support/status.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "dtrain.pb.h"
#include "ps/api/ps_types.h"
#include "ps/api/slice_io.h"

namespace dtrain::ps::wire {

// Largest payload (bytes of float data) in one streamed message.
inline constexpr int64_t kChunkBytes = 2 << 20;

grpc::Status ToGrpc(const absl::Status& s);
absl::Status FromGrpc(const grpc::Status& s);

void ToProto(const TrainConfig& in, dtrain::wire::TrainConfig* out);
TrainConfig FromProto(const dtrain::wire::TrainConfig& in);
void ToProto(const StepDecision& in, dtrain::wire::StepDecision* out);
StepDecision FromProto(const dtrain::wire::StepDecision& in);
void ToProto(const TrainingStats& in, dtrain::wire::StatsResponse* out);
TrainingStats FromProto(const dtrain::wire::StatsResponse& in);
void ToProto(const DoneRequest& in, dtrain::wire::DoneRequest* out);
DoneRequest FromProto(const dtrain::wire::DoneRequest& in);
// A Leaving from its wire number (an unknown one reads as kFailed: not completed).
Leaving LeavingFromProto(int32_t leaving);
dtrain::wire::PushResponse::Outcome ToProto(PushResponse::Outcome o);
PushResponse::Outcome FromProto(dtrain::wire::PushResponse::Outcome o);
void ToProto(const PushHeader& in, dtrain::wire::PushHeader* out);
PushHeader FromProto(const dtrain::wire::PushHeader& in);
void ToProto(const PullRequest& in, dtrain::wire::PullRequest* out);  // local-only fields are not sent
PullRequest FromProto(const dtrain::wire::PullRequest& in);
void ToProto(const PullHeader& in, dtrain::wire::PullHeader* out);
PullHeader FromProto(const dtrain::wire::PullHeader& in);
// A dtrain_ctl command as the ps takes it: its strings cut to what a command needs (64 characters of command,
// 256 of address, 200 of reason), the reason saying which peer asked.
ControlRequest FromProto(const dtrain::wire::ControlRequest& in, absl::string_view peer);

}  // namespace dtrain::ps::wire

#endif  // DTRAIN_PS_RPC_WIRE_FORMAT_H_

