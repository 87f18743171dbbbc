// gRPC adapter exposing a PsInterface (normally a ParameterServer) as the dtrain.wire.ParameterServer service.
// It only converts messages (ps/wire_format.h); all logic stays in the PsInterface.
//
// Thread-safety: gRPC calls the handlers from its own thread pool concurrently; the wrapped PsInterface must be
// thread-safe (ParameterServer is). The PsInterface must outlive the service.
#ifndef DTRAIN_PS_GRPC_PS_SERVICE_H_
#define DTRAIN_PS_GRPC_PS_SERVICE_H_

#include <memory>

#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/service_type.h>

#include "ps/parameter_server.h"

namespace dtrain::ps {

// Returns the gRPC service object to register with a grpc::ServerBuilder.
std::unique_ptr<grpc::Service> NewGrpcPsService(PsInterface* ps);

}  // namespace dtrain::ps

#endif  // DTRAIN_PS_GRPC_PS_SERVICE_H_
