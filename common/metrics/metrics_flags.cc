#include "common/metrics/metrics_flags.h"

#include <string>

#include "absl/flags/flag.h"

ABSL_FLAG(
    std::string, metrics_bind_address, "127.0.0.1",
    "The address --metrics_port binds (plain HTTP without authentication: loopback by default; 0.0.0.0 for "
    "every interface, with a warning)");

namespace dtrain::metrics {

absl::Status ValidateMetricsEndpointFlags(int port) {
  return ValidateMetricsFlags(port, absl::GetFlag(FLAGS_metrics_bind_address));
}

absl::StatusOr<std::unique_ptr<MetricsExporter>> StartMetricsEndpoint(int port) {
  if (port <= 0) return std::unique_ptr<MetricsExporter>();
  MetricsExporterOptions o;
  o.bind_address = absl::GetFlag(FLAGS_metrics_bind_address);
  o.port = port;
  return MetricsExporter::Start(o);
}

}  // namespace dtrain::metrics
