#include "common/metrics/metrics_exporter.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <glog/logging.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <prometheus/counter.h>
#include <prometheus/registry.h>
#include <prometheus/summary.h>
#include <prometheus/text_serializer.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <mutex>

#include "absl/strings/str_cat.h"

namespace dtrain::metrics {

namespace {

bool IsIpv4(const std::string& a) {
  in_addr x;
  return inet_pton(AF_INET, a.c_str(), &x) == 1;
}
bool IsIpv6(const std::string& a) {
  in6_addr x;
  return inet_pton(AF_INET6, a.c_str(), &x) == 1;
}

// The endpoint's own figures, under the names prometheus-cpp's Exposer gives them (docs/metrics.md).
struct EndpointFamilies {
  std::shared_ptr<prometheus::Registry> registry = std::make_shared<prometheus::Registry>();
  prometheus::Counter& bytes = prometheus::BuildCounter()
                                   .Name("exposer_transferred_bytes_total")
                                   .Help("Transferred bytes to metrics services")
                                   .Register(*registry)
                                   .Add({});
  prometheus::Counter& scrapes = prometheus::BuildCounter()
                                     .Name("exposer_scrapes_total")
                                     .Help("Number of times metrics were scraped")
                                     .Register(*registry)
                                     .Add({});
  prometheus::Summary& latencies =
      prometheus::BuildSummary()
          .Name("exposer_request_latencies")
          .Help("Latencies of serving scrape requests, in microseconds")
          .Register(*registry)
          .Add({}, prometheus::Summary::Quantiles{{0.5, 0.05}, {0.9, 0.01}, {0.99, 0.001}});
};

// A listening TCP socket on address:port (non-blocking, close-on-exec), or -1 with errno set.
int Listen(const std::string& address, int port, int* bound_port) {
  const bool v6 = IsIpv6(address);
  const int fd = socket(v6 ? AF_INET6 : AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return -1;
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_storage addr{};
  socklen_t len = 0;
  if (v6) {
    auto* a = reinterpret_cast<sockaddr_in6*>(&addr);
    a->sin6_family = AF_INET6;
    a->sin6_port = htons(static_cast<uint16_t>(port));
    inet_pton(AF_INET6, address.c_str(), &a->sin6_addr);
    setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
    len = sizeof(*a);
  } else {
    auto* a = reinterpret_cast<sockaddr_in*>(&addr);
    a->sin_family = AF_INET;
    a->sin_port = htons(static_cast<uint16_t>(port));
    inet_pton(AF_INET, address.c_str(), &a->sin_addr);
    len = sizeof(*a);
  }
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0 || listen(fd, 64) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    const int e = errno;
    close(fd);
    errno = e;
    return -1;
  }
  *bound_port = v6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port)
                   : ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  return fd;
}

void LogFromMhd(void* /*cls*/, const char* format, va_list ap) {
  char line[512];
  vsnprintf(line, sizeof(line), format, ap);
  std::string s(line);
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
  VLOG(1) << "metrics endpoint: " << s;
}

}  // namespace

class MetricsExporter::Impl {
 public:
  ~Impl() {
    if (daemon != nullptr) MHD_stop_daemon(daemon);  // joins its threads, closes the listening socket
  }

  // MHD's access handler: called once when a request's headers have arrived (*state == nullptr), then with
  // any body in pieces, then once more with none left: the answer goes out on that last call.
  static MHD_Result Answer(void* cls, MHD_Connection* connection, const char* url, const char* method,
                           const char* /*version*/, const char* /*upload_data*/, size_t* upload_data_size,
                           void** state) {
    static int headers_seen;
    if (*state == nullptr) {
      *state = &headers_seen;
      return MHD_YES;
    }
    if (*upload_data_size != 0) {  // a body nobody asked for: read and dropped (bounded by MHD's memory limit)
      *upload_data_size = 0;
      return MHD_YES;
    }
    auto* self = static_cast<Impl*>(cls);
    const bool get = std::strcmp(method, MHD_HTTP_METHOD_GET) == 0;
    const bool head = std::strcmp(method, MHD_HTTP_METHOD_HEAD) == 0;
    if (!get && !head) return self->Reply(connection, MHD_HTTP_METHOD_NOT_ALLOWED, "only GET /metrics\n");
    if (std::strcmp(url, "/metrics") != 0) return self->Reply(connection, MHD_HTTP_NOT_FOUND, "not found\n");
    const auto start = std::chrono::steady_clock::now();
    const std::string body = self->Scrape();
    const MHD_Result r = self->Reply(connection, MHD_HTTP_OK, body);
    endpoint.bytes.Increment(static_cast<double>(body.size()));
    endpoint.scrapes.Increment();
    endpoint.latencies.Observe(static_cast<double>(
        std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - start)
            .count()));
    return r;
  }

  std::string Scrape() {
    std::vector<std::shared_ptr<prometheus::Collectable>> all;
    {
      std::lock_guard<std::mutex> lock(mu);
      all = held;
    }
    std::vector<prometheus::MetricFamily> families;
    for (const std::shared_ptr<prometheus::Collectable>& c : all) {
      std::vector<prometheus::MetricFamily> f = c->Collect();
      families.insert(families.end(), std::make_move_iterator(f.begin()), std::make_move_iterator(f.end()));
    }
    return prometheus::TextSerializer().Serialize(families);
  }

  MHD_Result Reply(MHD_Connection* connection, unsigned int code, const std::string& body) {
    MHD_Response* response =
        MHD_create_response_from_buffer(body.size(), const_cast<char*>(body.data()), MHD_RESPMEM_MUST_COPY);
    if (response == nullptr) return MHD_NO;
    MHD_add_response_header(response, MHD_HTTP_HEADER_CONTENT_TYPE,
                            code == MHD_HTTP_OK ? "text/plain; version=0.0.4; charset=utf-8"
                                                : "text/plain; charset=utf-8");
    MHD_add_response_header(response, MHD_HTTP_HEADER_CONNECTION, "close");  // no keep-alive
    if (code == MHD_HTTP_METHOD_NOT_ALLOWED) MHD_add_response_header(response, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
    const MHD_Result r = MHD_queue_response(connection, code, response);
    MHD_destroy_response(response);
    return r;
  }

  MHD_Daemon* daemon = nullptr;
  std::mutex mu;
  std::vector<std::shared_ptr<prometheus::Collectable>> held;  // guarded by mu
  static EndpointFamilies endpoint;  // per process, like prometheus-cpp's (one exporter per binary)
};

EndpointFamilies MetricsExporter::Impl::endpoint;

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
  int port = 0;
  const int fd = Listen(options.bind_address, options.port, &port);
  if (fd < 0) {
    const int e = errno;
    const char* hint = e == EADDRINUSE      ? "is the port in use by another process? Pick another with "
                       : e == EADDRNOTAVAIL ? "does this host have that address? Pick another with "
                                            : "pick another with ";
    return absl::UnavailableError(absl::StrCat(options.port_flag, "=", options.port,
                                               ": cannot serve /metrics on ", listen, " (", std::strerror(e),
                                               "): ", hint, options.port_flag, " (or ", options.bind_flag,
                                               ")"));
  }
  std::unique_ptr<MetricsExporter> e(new MetricsExporter());
  e->impl_ = std::make_unique<Impl>();
  {
    std::lock_guard<std::mutex> lock(e->impl_->mu);
    e->impl_->held.push_back(Impl::endpoint.registry);
  }
  // A pool of request threads of the default stack size (not a fixed small one: a process linking CUDA's
  // libraries holds >100 KiB of static TLS per thread, which a server with 100 KiB stacks cannot start threads
  // with), each request cut off after request_timeout_ms (MHD counts whole seconds), bounded connections and
  // request memory.
  const unsigned timeout_s = static_cast<unsigned>((options.request_timeout_ms + 999) / 1000);
  e->impl_->daemon = MHD_start_daemon(
      MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_USE_ITC |
          (IsIpv6(options.bind_address) ? MHD_USE_IPv6 : 0) | MHD_USE_ERROR_LOG,
      static_cast<uint16_t>(port), nullptr, nullptr, &Impl::Answer, e->impl_.get(), MHD_OPTION_LISTEN_SOCKET,
      fd, MHD_OPTION_THREAD_POOL_SIZE, static_cast<unsigned>(options.threads), MHD_OPTION_CONNECTION_TIMEOUT,
      timeout_s, MHD_OPTION_CONNECTION_LIMIT, 64u, MHD_OPTION_PER_IP_CONNECTION_LIMIT, 16u,
      MHD_OPTION_CONNECTION_MEMORY_LIMIT, static_cast<size_t>(32 << 10), MHD_OPTION_EXTERNAL_LOGGER,
      &LogFromMhd, nullptr, MHD_OPTION_END);
  if (e->impl_->daemon == nullptr) {
    // Not closed here: past its checks of the options (fixed above, valid), libmicrohttpd closes the listening
    // socket it was given when it fails (seen with Debian's 0.9.75 when it cannot start its threads), and
    // closing the number again could close a descriptor another thread has opened since.
    return absl::UnavailableError(absl::StrCat(options.port_flag, "=", options.port,
                                               ": cannot serve /metrics on ", listen,
                                               " (libmicrohttpd did not start its request threads: see "
                                               "the log with -v=1)"));
  }
  e->port_ = port;
  e->bind_address_ = options.bind_address;
  if (!IsLoopbackAddress(options.bind_address)) {
    LOG(WARNING)
        << options.bind_flag << "=" << options.bind_address << ": /metrics is plain HTTP without "
        << "authentication; whoever reaches " << listen << " can read this process's figures (never "
        << "change anything). Keep it behind a firewall, or bind 127.0.0.1 and scrape through a proxy";
  }
  return e;
}

MetricsExporter::~MetricsExporter() = default;

void MetricsExporter::Register(std::shared_ptr<prometheus::Collectable> collectable) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->held.push_back(std::move(collectable));
}

std::string MetricsExporter::url() const {
  return IsIpv6(bind_address_) ? absl::StrCat("http://[", bind_address_, "]:", port_, "/metrics")
                               : absl::StrCat("http://", bind_address_, ":", port_, "/metrics");
}

}  // namespace dtrain::metrics
