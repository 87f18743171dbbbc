// A worker's figures read at scrape time (dtrain_worker --metrics_port; docs/metrics.md): bytes and calls per
// transport from its clients' counters, the age of local mode's checkpoints, and the process's RSS and CPU.
// The per-step figures are worker/train/step_metrics.h's, kept in a registry as they happen.
//
// Thread-safety: the collector may run on any thread; the counters it reads must outlive it (dtrain_worker
// declares them before its exporter, which is destroyed first).
#ifndef DTRAIN_WORKER_APP_WORKER_METRICS_H_
#define DTRAIN_WORKER_APP_WORKER_METRICS_H_

#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>

#include <memory>
#include <string>
#include <vector>

#include "ps/rpc/grpc_ps_client.h"
#include "ps/shm/shm_ps_client.h"
#include "ps/tcp/tcp_ps_client.h"

namespace dtrain::worker {

// The counters dtrain_worker gives its ps clients (PsClientOptions) when --metrics_port is set.
struct TransportCounters {
  ps::WireCounters grpc;
  ps::shm::ShmCounters shm;
  ps::tcp::TcpCounters tcp;
};

// dtrain_worker_transport_bytes_total{transport,direction},
// dtrain_worker_transport_calls_total{transport,call}, dtrain_worker_checkpoint_age_seconds (local mode with
// `checkpoint_dir`), process_*.
std::vector<prometheus::MetricFamily> CollectWorkerFamilies(const TransportCounters& counters,
                                                            const std::string& checkpoint_dir);
// `counters` not owned.
std::shared_ptr<prometheus::Collectable> NewWorkerCollector(const TransportCounters* counters,
                                                            std::string checkpoint_dir);

}  // namespace dtrain::worker

#endif  // DTRAIN_WORKER_APP_WORKER_METRICS_H_
