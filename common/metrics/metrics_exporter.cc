#include "common/metrics/metrics_exporter.h"

#include <arpa/inet.h>
#include <glog/logging.h>
#include <netinet/in.h>
#include <prometheus/exposer.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <exception>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"

namespace dtrain::metrics {

class MetricsExporter::Impl {
 public:
  std::unique_ptr<prometheus::Exposer> exposer;
  std::mutex mu;
  std::vector<std::shared_ptr<prometheus::Collectable>> held;  // the Exposer keeps weak pointers only
};

namespace {

bool IsIpv4(const std::string& a) {
  in_addr x;
  return inet_pton(AF_INET, a.c_str(), &x) == 1;
}
bool IsIpv6(const std::string& a) {
  in6_addr x;
  return inet_pton(AF_INET6, a.c_str(), &x) == 1;
}

}  // namespace

bool IsLoopbackAddress(const std::string& address) {
  in_addr v4;
  if (inet_pton(AF_INET, address.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6;
  if (inet_pton(AF_INET6, address.c_str(), &v6) == 1) return IN6_IS_ADDR_LOOPBACK(&v6);
  return false;
}

absl::Status ValidateMetricsFlags(int port, const std::string& bind_address,
                                  const MetricsExporterOptions& names) {
  if (port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat(names.port_flag, "=", port, ": a port in [1, 65535] serves /metrics there (0: off)"));
  }
  if (!IsIpv4(bind_address) && !IsIpv6(bind_address)) {
    return absl::InvalidArgumentError(
        absl::StrCat(names.bind_flag, "=", bind_address,
                     ": expected an IP address (127.0.0.1, the default; 0.0.0.0 for every interface; ::1)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<MetricsExporter>> MetricsExporter::Start(
    const MetricsExporterOptions& options) {
  if (absl::Status s = ValidateMetricsFlags(options.port, options.bind_address, options); !s.ok()) return s;
  if (options.threads < 1 || options.request_timeout_ms < 1) {
    return absl::InvalidArgumentError("metrics exporter: threads and request_timeout_ms must be >= 1");
  }
  const std::string listen = IsIpv6(options.bind_address)
                                 ? absl::StrCat("[", options.bind_address, "]:", options.port)
                                 : absl::StrCat(options.bind_address, ":", options.port);
  std::vector<std::string> civet = {
      "listening_ports",    listen,
      "num_threads",        std::to_string(options.threads),
      "request_timeout_ms", std::to_string(options.request_timeout_ms),
      "enable_keep_alive",  "no",
  };
  std::unique_ptr<MetricsExporter> e(new MetricsExporter());
  e->impl_ = std::make_unique<Impl>();
  try {
    e->impl_->exposer = std::make_unique<prometheus::Exposer>(civet);
  } catch (const std::exception& ex) {
    return absl::UnavailableError(absl::StrCat(options.port_flag, "=", options.port,
                                               ": cannot serve /metrics on ", listen, " (", ex.what(),
                                               "): is the port in use by another process? Pick another with ",
                                               options.port_flag, " (or ", options.bind_flag, ")"));
  }
  const std::vector<int> ports = e->impl_->exposer->GetListeningPorts();
  e->port_ = ports.empty() ? options.port : ports[0];
  e->bind_address_ = options.bind_address;
  if (!IsLoopbackAddress(options.bind_address)) {
    LOG(WARNING)
        << options.bind_flag << "=" << options.bind_address << ": /metrics is plain HTTP without "
        << "authentication; whoever reaches " << listen << " can read this process's figures (never "
        << "change anything). Keep it behind a firewall, or bind 127.0.0.1 and scrape through a proxy";
  }
  return e;
}

MetricsExporter::~MetricsExporter() {
  if (impl_ == nullptr || impl_->exposer == nullptr) return;
  // CivetWeb's listener notices the stop only when its poll returns, up to 2 s later
  // (SOCKET_TIMEOUT_QUANTUM): knock on the port meanwhile so that the process exits at once.
  std::atomic<bool> stopped{false};
  std::thread knock([this, &stopped] {
    const bool v6 = IsIpv6(bind_address_);
    const std::string target = bind_address_ == "0.0.0.0" ? "127.0.0.1"
                               : bind_address_ == "::"    ? "::1"
                                                          : bind_address_;
    while (!stopped.load()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      const int fd = socket(v6 ? AF_INET6 : AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (fd < 0) continue;
      sockaddr_storage addr{};
      socklen_t len = 0;
      if (v6) {
        auto* a = reinterpret_cast<sockaddr_in6*>(&addr);
        a->sin6_family = AF_INET6;
        a->sin6_port = htons(static_cast<uint16_t>(port_));
        inet_pton(AF_INET6, target.c_str(), &a->sin6_addr);
        len = sizeof(*a);
      } else {
        auto* a = reinterpret_cast<sockaddr_in*>(&addr);
        a->sin_family = AF_INET;
        a->sin_port = htons(static_cast<uint16_t>(port_));
        inet_pton(AF_INET, target.c_str(), &a->sin_addr);
        len = sizeof(*a);
      }
      connect(fd, reinterpret_cast<sockaddr*>(&addr), len);  // refused once the listener is closed: fine
      close(fd);
    }
  });
  impl_->exposer.reset();  // stops CivetWeb and joins its threads
  stopped = true;
  knock.join();
}

void MetricsExporter::Register(std::shared_ptr<prometheus::Collectable> collectable) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->exposer->RegisterCollectable(collectable);
  impl_->held.push_back(std::move(collectable));
}

std::string MetricsExporter::url() const {
  return IsIpv6(bind_address_) ? absl::StrCat("http://[", bind_address_, "]:", port_, "/metrics")
                               : absl::StrCat("http://", bind_address_, ":", port_, "/metrics");
}

}  // namespace dtrain::metrics
