// How a worker and a ps task agree, over the authenticated gRPC channel, to move data through shared memory
// (ps/shm/README.md): the worker asks (ShmAttachRequest), the ps offers (ShmOffer) a socket to connect its two
// lanes to, and one single-use ticket for each. Only a process that passed the gRPC handshake (the cluster's
// token, TLS) ever sees a ticket, and a lane without a valid ticket is closed before it can do anything; the
// worker's memory is handed over only on a lane that presented one. An offer ends the worker's attachment in
// place, so it is made only to the process registered as that worker: the request carries its session
// (CheckOfferSession), which the token alone does not give.
#ifndef DTRAIN_PS_SHM_SHM_OFFER_H_
#define DTRAIN_PS_SHM_SHM_OFFER_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ps/api/ps_interface.h"

namespace dtrain::ps::shm {

struct ShmAttachRequest {
  int worker_id = 0;
  std::string boot_id;  // the worker's host (HostBootId)
  uint32_t uid = 0;     // the worker's effective user id
  uint64_t session = 0;  // the worker's session on this task (RegisterResponse::session)
};

struct ShmOffer {
  std::string socket_name;  // an abstract Unix socket (no file), in the ps's network namespace
  std::string push_ticket, pull_ticket;  // one per lane, single use, valid for a few seconds
  std::string boot_id;  // the ps's host
  uint32_t uid = 0;     // the ps's effective user id
  int32_t pid = 0;      // the ps process, for logs
};

// Asks one ps task for an offer (ps/rpc/grpc_ps_client.h makes one over gRPC; tests call ShmServer::Offer).
// Errors: Unavailable when the ps cannot be reached now (retry later), Unimplemented or FailedPrecondition
// when it offers no shared memory, others as the ps says.
using ShmAttachFn = std::function<absl::StatusOr<ShmOffer>(const ShmAttachRequest&)>;

// This host's boot id (/proc/sys/kernel/random/boot_id): equal for processes on one machine (any container or
// network namespace of it), different across machines. Empty when unreadable.
std::string HostBootId();

// Whether two tickets are equal, in time that does not depend on where they differ (a peer probing tickets
// learns nothing from the answer's timing). The shm and TCP servers compare every ticket so.
bool TicketsEqual(absl::string_view a, absl::string_view b);

// OK when `session` is worker `worker_id`'s live session on `ps` (PsInterface::Heartbeat, which also renews its
// lease); else PermissionDenied naming the worker and why, before anything of its attachment changes. The shm and
// TCP servers check every offer so: a caller with the token but without the session cannot cut a worker off.
absl::Status CheckOfferSession(PsInterface* ps, int worker_id, uint64_t session);

}  // namespace dtrain::ps::shm

#endif  // DTRAIN_PS_SHM_SHM_OFFER_H_
