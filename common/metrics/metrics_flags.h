// The metrics endpoint of dtrain_ps and dtrain_worker (docs/metrics.md): --metrics_bind_address, which both
// binaries define alike (defined here, once), and the exporter that it and the binary's --metrics_port give.
// --metrics_port stays in each binary's main.cc (its help lists that binary's figures); the caller passes its
// value. Link this library only into binaries that define no flag of this name.
//
// Usage, in main() once the command line is parsed:
//   const int port = absl::GetFlag(FLAGS_metrics_port);
//   if (absl::Status s = dtrain::metrics::ValidateMetricsEndpointFlags(port); !s.ok()) ... exit 2
//   absl::StatusOr<std::unique_ptr<MetricsExporter>> exporter = dtrain::metrics::StartMetricsEndpoint(port);
//   if (!exporter.ok()) ... exit 1;  // null with port 0: metrics are off
//
// Thread-safety: both read a flag; call them from main() once the command line is parsed.
#ifndef DTRAIN_COMMON_METRICS_METRICS_FLAGS_H_
#define DTRAIN_COMMON_METRICS_METRICS_FLAGS_H_

#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/metrics/metrics_exporter.h"

namespace dtrain::metrics {

// Checks `port` (--metrics_port) and --metrics_bind_address: ValidateMetricsFlags (metrics_exporter.h),
// InvalidArgument naming the flag that is wrong.
absl::Status ValidateMetricsEndpointFlags(int port);

// The exporter serving http://<--metrics_bind_address>:<port>/metrics, started (its socket bound) here; null
// when `port` is 0 (metrics off). Errors: MetricsExporter::Start's (the port in use, an address not of this
// host).
absl::StatusOr<std::unique_ptr<MetricsExporter>> StartMetricsEndpoint(int port);

}  // namespace dtrain::metrics

#endif  // DTRAIN_COMMON_METRICS_METRICS_FLAGS_H_
