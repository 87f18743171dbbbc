// Who may talk to a ps task, and how the bytes are protected: a shared cluster token (every RPC carries it) and
// TLS (gRPC's SSL credentials). The flags of every binary map onto SecurityOptions:
//   --auth_token_file=F   the cluster's secret token (one line; at least 16 characters, e.g.
//                         `openssl rand -hex 32 > F`). A call without it, or with another, is refused with
//                         UNAUTHENTICATED before it reaches the ps, so it changes nothing. The token is also the
//                         key that signs the step decisions ps 0 relays through the workers (HMAC-SHA256).
//   --tls_cert=F --tls_key=F  this process's certificate chain and private key (PEM). On a ps task: serve TLS.
//                         On a worker: present them to the ps (mutual TLS, when the ps requires it).
//   --tls_ca=F            the CA that signs the cluster's certificates: a worker trusts a ps only when its
//                         certificate chains to it; a ps given it requires and verifies client certificates.
//   --tls_server_name=N   (workers) the name to expect in the ps certificate instead of the host in the address.
// Without a token, the cluster trusts its network (anyone who reaches the port may call); without TLS, the token
// and the tensors travel in clear text.
//
// Thread-safety: free functions and immutable values.
#ifndef DTRAIN_PS_RPC_GRPC_SECURITY_H_
#define DTRAIN_PS_RPC_GRPC_SECURITY_H_

#include <memory>
#include <string>

#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_context.h>
#include <grpcpp/support/channel_arguments.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace dtrain::ps {

struct SecurityOptions {
  std::string auth_token;  // empty: no authentication
  std::string tls_cert_pem, tls_key_pem, tls_ca_pem;  // empty cert+key: no TLS (a CA alone: a TLS client)
  std::string tls_server_name;  // client: expected name in the server's certificate (empty: the address' host)
  bool tls() const { return !tls_cert_pem.empty() || !tls_ca_pem.empty(); }
};

// Reads the files named by the flags (empty names: not used). InvalidArgument naming the flag and the file:
// unreadable, empty, a token shorter than 16 characters, a certificate without its key (or the reverse), a file
// that is not PEM.
absl::StatusOr<SecurityOptions> LoadSecurityOptions(const std::string& auth_token_file, const std::string& tls_cert,
                                                    const std::string& tls_key, const std::string& tls_ca,
                                                    const std::string& tls_server_name);

// Server side: TLS or insecure credentials; the token check.
std::shared_ptr<grpc::ServerCredentials> ServerCredentials(const SecurityOptions& options);
// UNAUTHENTICATED unless the call carries `token` (compared in constant time); OK when `token` is empty.
grpc::Status CheckCallToken(const grpc::ServerContext& context, const std::string& token);

// Client side: TLS or insecure channel credentials (and the target name override in `args`); the token is
// attached to each call by AttachCallToken.
std::shared_ptr<grpc::ChannelCredentials> ChannelCredentials(const SecurityOptions& options,
                                                             grpc::ChannelArguments* args);
void AttachCallToken(const SecurityOptions& options, grpc::ClientContext* context);

}  // namespace dtrain::ps

#endif  // DTRAIN_PS_RPC_GRPC_SECURITY_H_
