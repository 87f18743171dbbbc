// How a worker and a ps task agree, over the authenticated gRPC channel, to move data over TCP lanes
// (ps/README.md, "the TCP lanes"): the worker asks (TcpAttachRequest), the ps offers (TcpOffer) the port of its lanes and one
// single-use ticket for each of the two. Only a process that passed the gRPC handshake (the cluster's token)
// ever sees a ticket, and a lane without a valid one is closed before the ps reads anything else from it.
#ifndef DTRAIN_PS_TCP_TCP_OFFER_H_
#define DTRAIN_PS_TCP_TCP_OFFER_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dtrain::ps::tcp {

struct TcpAttachRequest {
  int worker_id = 0;
  uint64_t session = 0;  // the worker's session on this task (checked: shm::CheckOfferSession)
};

struct TcpOffer {
  int port = 0;  // on the host the worker reached the ps's gRPC server at
  std::string push_ticket, pull_ticket;  // one per lane, single use, valid for a few seconds
  int32_t pid = 0;  // the ps process, for logs
};

// Asks one ps task for an offer (ps/rpc/grpc_ps_client.h makes one over gRPC; tests call TcpServer::Offer).
// Errors: Unavailable when the ps cannot be reached now (retry later), Unimplemented or FailedPrecondition when
// it offers no TCP lanes (the message says why), others as the ps says.
using TcpAttachFn = std::function<absl::StatusOr<TcpOffer>(const TcpAttachRequest&)>;

}  // namespace dtrain::ps::tcp

#endif  // DTRAIN_PS_TCP_TCP_OFFER_H_
