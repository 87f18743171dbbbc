// The methods of the dtrain.wire.ParameterServer service (proto/dtrain.proto), in one list for the client and
// the server. The service is registered by hand (ps/rpc/grpc_ps_service.cc, ps/rpc/grpc_ps_client.cc) because
// the tensor-carrying methods exchange grpc::ByteBuffer messages coded by ps/rpc/tensor_coding.h instead of
// generated protobuf classes.
#ifndef DTRAIN_PS_RPC_GRPC_METHODS_H_
#define DTRAIN_PS_RPC_GRPC_METHODS_H_

namespace dtrain::ps::grpc_methods {

inline constexpr char kRegister[] = "/dtrain.wire.ParameterServer/Register";      // unary, protobuf
inline constexpr char kInitialize[] = "/dtrain.wire.ParameterServer/Initialize";  // client stream of InitializeChunk
inline constexpr char kPush[] = "/dtrain.wire.ParameterServer/Push";              // client stream of PushChunk
// client stream of PushChunk, first message a PushPartHeader: slices of a push striped over several connections
inline constexpr char kPushPart[] = "/dtrain.wire.ParameterServer/PushPart";
inline constexpr char kPull[] = "/dtrain.wire.ParameterServer/Pull";              // server stream of PullChunk
inline constexpr char kDone[] = "/dtrain.wire.ParameterServer/Done";              // unary, protobuf
inline constexpr char kGetStats[] = "/dtrain.wire.ParameterServer/GetStats";      // unary, protobuf
inline constexpr char kHeartbeat[] = "/dtrain.wire.ParameterServer/Heartbeat";    // unary, protobuf
inline constexpr char kProbe[] = "/dtrain.wire.ParameterServer/Probe";            // unary, protobuf
inline constexpr char kRestore[] = "/dtrain.wire.ParameterServer/Restore";        // unary, protobuf
inline constexpr char kAttachShm[] = "/dtrain.wire.ParameterServer/AttachShm";    // unary, protobuf
inline constexpr char kAttachTcp[] = "/dtrain.wire.ParameterServer/AttachTcp";    // unary, protobuf
inline constexpr char kControl[] = "/dtrain.wire.ParameterServer/Control";        // unary, protobuf

}  // namespace dtrain::ps::grpc_methods

#endif  // DTRAIN_PS_RPC_GRPC_METHODS_H_
