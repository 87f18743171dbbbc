// A ps task's figures for Prometheus (dtrain_ps --metrics_port; docs/metrics.md lists every one), read at
// each scrape from what the task keeps anyway: ParameterServer::GetStats() and accounting(), the shm and TCP
// servers' counters, the newest checkpoint and delta files, /proc/self. Nothing is added to the push and pull
// paths.
//
// Knows no gRPC and no HTTP: dtrain_ps (ps/main.cc) fills PsMetricsSources from its PsServer and registers
// the collector with its MetricsExporter (common/metrics/metrics_exporter.h).
//
// Usage:
//   PsMetricsSources src;
//   src.ps = server->parameter_server();
//   src.tcp = [s = server.get()] { return s->tcp_server()->counters(); };
//   exporter->Register(NewPsCollector(src));
//
// Thread-safety: the collector's Collect may run on any thread, several at once; the sources must stay valid
// while the collector is registered (the exporter is destroyed before the server in dtrain_ps).
#ifndef DTRAIN_PS_METRICS_PS_METRICS_H_
#define DTRAIN_PS_METRICS_PS_METRICS_H_

#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ps/core/parameter_server.h"
#include "ps/shm/shm_server.h"
#include "ps/tcp/tcp_server.h"

namespace dtrain::ps {

struct PsMetricsSources {
  ParameterServer* ps = nullptr;  // not owned, not null
  // The data planes' counters; null: not offered.
  std::function<shm::ShmServerCounters()> shm;
  std::function<tcp::TcpServerCounters()> tcp;
  // The tensor bytes gRPC's streams received and sent (ps/rpc/grpc_ps_service.h); null: not counted.
  std::function<std::pair<int64_t, int64_t>()> grpc_bytes;
  // Where this task's checkpoints and deltas are written (empty: none): their ages are read from the newest
  // file of this task (model.ckpt-*.ps<task>-of-<num_ps>, model.delta-*.ps<task>-of-<num_ps>).
  std::string checkpoint_dir, delta_dir;
  int task = 0, num_ps = 1;
};

// Every family, once (the collector calls this).
std::vector<prometheus::MetricFamily> CollectPsFamilies(const PsMetricsSources& sources);
std::shared_ptr<prometheus::Collectable> NewPsCollector(PsMetricsSources sources);

}  // namespace dtrain::ps

#endif  // DTRAIN_PS_METRICS_PS_METRICS_H_
