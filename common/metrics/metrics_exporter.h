// MetricsExporter: serves a process's figures to Prometheus over HTTP (GET or HEAD /metrics, the text
// exposition format written by prometheus-cpp's TextSerializer; every other path answers 404, other methods 405)
// through libmicrohttpd (Debian's libmicrohttpd-dev). The binaries start one for --metrics_port=N (dtrain_ps,
// dtrain_worker; docs/metrics.md); the libraries only keep counters and stats and never see HTTP.
// (Not prometheus-cpp's own Exposer: its CivetWeb starts request threads with fixed 100 KiB stacks, and a
// process that links CUDA's libraries needs more than that for their static thread-local storage alone, so
// pthread_create fails with EINVAL; libmicrohttpd's threads get the default stack size.)
//
// Bounds: a fixed pool of `threads` request threads (a scrape is one short GET), `request_timeout_ms` (in
// whole seconds, rounded up) for an idle or slow connection, 32 KiB of memory per request, at most 64
// connections (16 from one address), no files served, no keep-alive.
// The endpoint is plain HTTP without authentication: it binds 127.0.0.1 unless told otherwise
// (--metrics_bind_address; a non-loopback address is accepted with a warning, since anyone who can reach it
// may read the figures, never change anything). Its own figures (exposer_scrapes_total,
// exposer_transferred_bytes_total, exposer_request_latencies) keep prometheus-cpp's names.
//
// Usage:
//   MetricsExporterOptions o;
//   o.port = 9100;  // 0: any free port (tests)
//   ASSIGN_OR_RETURN(std::unique_ptr<MetricsExporter> exporter, MetricsExporter::Start(o));
//   auto registry = std::make_shared<prometheus::Registry>();
//   exporter->Register(registry);            // counters and histograms updated as things happen
//   exporter->Register(my_scrape_collector); // figures read from stats at each scrape (scrape_families.h)
//
// Thread-safety: Register and port may be called from any thread. Collectables are called on the request
// threads (possibly several at once). The destructor stops the server at once and joins its threads (a
// request in progress completes first); collectables registered stay alive until then (the exporter holds them).
#ifndef DTRAIN_COMMON_METRICS_METRICS_EXPORTER_H_
#define DTRAIN_COMMON_METRICS_METRICS_EXPORTER_H_

#include <prometheus/collectable.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace dtrain::metrics {

struct MetricsExporterOptions {
  std::string bind_address =
      "127.0.0.1";  // an IPv4 or IPv6 literal (no host names: what is bound is explicit)
  int port = 0;     // 0: any free port
  int threads = 2;  // request threads
  int request_timeout_ms = 10000;
  // Named in errors (the binaries' flags).
  std::string port_flag = "--metrics_port";
  std::string bind_flag = "--metrics_bind_address";
};

// Checks the binaries' flags: port in [0, 65535] and the bind address an IP literal. InvalidArgument naming
// the flag otherwise.
absl::Status ValidateMetricsFlags(int port, const std::string& bind_address,
                                  const MetricsExporterOptions& names = MetricsExporterOptions());
// 127.0.0.0/8 and ::1.
bool IsLoopbackAddress(const std::string& address);

class MetricsExporter {
 public:
  // Listens on options.bind_address:options.port. InvalidArgument for bad options (naming the flag);
  // Unavailable when the port cannot be bound (in use, an address this host does not have), naming the flag
  // and the address.
  static absl::StatusOr<std::unique_ptr<MetricsExporter>> Start(const MetricsExporterOptions& options);
  ~MetricsExporter();
  MetricsExporter(const MetricsExporter&) = delete;
  MetricsExporter& operator=(const MetricsExporter&) = delete;

  // Serves `collectable`'s families at /metrics from now on (the exporter keeps it alive).
  void Register(std::shared_ptr<prometheus::Collectable> collectable);
  int port() const { return port_; }
  // "http://ADDRESS:PORT/metrics", for logs.
  std::string url() const;

  class Impl;

 private:
  MetricsExporter() = default;
  std::unique_ptr<Impl> impl_;
  int port_ = 0;
  std::string bind_address_;
};

}  // namespace dtrain::metrics

#endif  // DTRAIN_COMMON_METRICS_METRICS_EXPORTER_H_
