// Where a gRPC peer is: whether the address grpc::ServerContext::peer() names is one of this host's (this network
// namespace's) own addresses. The ps uses it to decide what pays for a worker on its own host (the early apply
// only pays across a link: on one host both directions are copies on the same cores).
//
// Thread-safety: thread-safe. Errors: none (an address that cannot be parsed is not this host's).
#ifndef DTRAIN_PS_RPC_PEER_ADDRESS_H_
#define DTRAIN_PS_RPC_PEER_ADDRESS_H_

#include <string>

#include "absl/strings/string_view.h"

namespace dtrain::ps {

// The IP address in a gRPC peer string: "ipv4:10.0.0.2:5000" -> "10.0.0.2", "ipv6:[::1]:5000" -> "::1"
// (also with %25-escaped zone ids dropped); "" for other kinds ("unix:...") and for anything malformed.
std::string PeerIp(absl::string_view peer);

// True for a Unix-socket peer, a loopback address, and any address an interface of this network namespace holds
// (read with getifaddrs once, then cached).
bool PeerOnThisHost(absl::string_view peer);

}  // namespace dtrain::ps

#endif  // DTRAIN_PS_RPC_PEER_ADDRESS_H_
