#include "ps/rpc/grpc_security.h"

#include <sys/stat.h>

#include <fstream>
#include <sstream>

#include <glog/logging.h>
#include <grpcpp/client_context.h>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/hmac.h"

namespace dtrain::ps {
namespace {

constexpr char kTokenKey[] = "dtrain-auth-token";  // gRPC metadata keys are lower case
constexpr size_t kMinTokenLength = 16;

absl::StatusOr<std::string> ReadFlagFile(const std::string& flag, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(absl::StrCat("--", flag, "=", path, ": cannot read the file"));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (ss.str().empty()) return absl::InvalidArgumentError(absl::StrCat("--", flag, "=", path, ": the file is empty"));
  return ss.str();
}

absl::StatusOr<std::string> ReadPem(const std::string& flag, const std::string& path, const char* kind) {
  absl::StatusOr<std::string> pem = ReadFlagFile(flag, path);
  if (!pem.ok()) return pem;
  if (!absl::StrContains(*pem, "-----BEGIN ")) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, "=", path, ": not a PEM ", kind,
                                                   " (expected a '-----BEGIN ...' block)"));
  }
  return pem;
}

}  // namespace

absl::StatusOr<SecurityOptions> LoadSecurityOptions(const std::string& auth_token_file, const std::string& tls_cert,
                                                    const std::string& tls_key, const std::string& tls_ca,
                                                    const std::string& tls_server_name) {
  SecurityOptions o;
  if (!auth_token_file.empty()) {
    absl::StatusOr<std::string> token = ReadFlagFile("auth_token_file", auth_token_file);
    if (!token.ok()) return token.status();
    o.auth_token = std::string(absl::StripAsciiWhitespace(*token));
    if (o.auth_token.size() < kMinTokenLength || o.auth_token.find_first_of("\r\n") != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--auth_token_file=", auth_token_file, ": the token must be one line of at least ", kMinTokenLength,
          " characters (e.g. `openssl rand -hex 32 > ", auth_token_file, "`)"));
    }
    struct stat st;
    if (stat(auth_token_file.c_str(), &st) == 0 && (st.st_mode & 077) != 0) {
      LOG(WARNING) << "--auth_token_file=" << auth_token_file
                   << " is readable by other users (chmod 600 it): anyone who reads it can join the cluster";
    }
  }
  if (tls_cert.empty() != tls_key.empty()) {
    return absl::InvalidArgumentError("--tls_cert and --tls_key go together: give both or neither");
  }
  if (!tls_cert.empty()) {
    absl::StatusOr<std::string> cert = ReadPem("tls_cert", tls_cert, "certificate");
    if (!cert.ok()) return cert.status();
    absl::StatusOr<std::string> key = ReadPem("tls_key", tls_key, "private key");
    if (!key.ok()) return key.status();
    o.tls_cert_pem = *cert;
    o.tls_key_pem = *key;
  }
  if (!tls_ca.empty()) {
    absl::StatusOr<std::string> ca = ReadPem("tls_ca", tls_ca, "certificate");
    if (!ca.ok()) return ca.status();
    o.tls_ca_pem = *ca;
  }
  o.tls_server_name = tls_server_name;
  return o;
}

std::shared_ptr<grpc::ServerCredentials> ServerCredentials(const SecurityOptions& options) {
  if (options.tls_cert_pem.empty()) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions ssl(options.tls_ca_pem.empty()
                                            ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
                                            : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  ssl.pem_root_certs = options.tls_ca_pem;
  ssl.pem_key_cert_pairs.push_back({options.tls_key_pem, options.tls_cert_pem});
  return grpc::SslServerCredentials(ssl);
}

grpc::Status CheckCallToken(const grpc::ServerContext& context, const std::string& token) {
  if (token.empty()) return grpc::Status::OK;
  const auto& metadata = context.client_metadata();
  auto it = metadata.find(kTokenKey);
  if (it == metadata.end()) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "this ps task requires the cluster's auth token (--auth_token_file) and the call had none");
  }
  if (!ConstantTimeEquals(std::string(it->second.data(), it->second.size()), token)) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "wrong auth token (--auth_token_file differs)");
  }
  return grpc::Status::OK;
}

std::shared_ptr<grpc::ChannelCredentials> ChannelCredentials(const SecurityOptions& options,
                                                             grpc::ChannelArguments* args) {
  if (!options.tls()) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = options.tls_ca_pem;
  ssl.pem_private_key = options.tls_key_pem;
  ssl.pem_cert_chain = options.tls_cert_pem;
  if (!options.tls_server_name.empty()) args->SetSslTargetNameOverride(options.tls_server_name);
  return grpc::SslCredentials(ssl);
}

void AttachCallToken(const SecurityOptions& options, grpc::ClientContext* context) {
  if (!options.auth_token.empty()) context->AddMetadata(kTokenKey, options.auth_token);
}

}  // namespace dtrain::ps
