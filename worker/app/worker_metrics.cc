#include "worker/app/worker_metrics.h"

#include <utility>

#include "absl/strings/match.h"
#include "common/metrics/scrape_families.h"

namespace dtrain::worker {

using metrics::AddFamily;
using metrics::AddSample;
using prometheus::MetricType;

std::vector<prometheus::MetricFamily> CollectWorkerFamilies(const TransportCounters& c,
                                                            const std::string& checkpoint_dir) {
  std::vector<prometheus::MetricFamily> out;
  prometheus::MetricFamily bytes = metrics::Family(
      "dtrain_worker_transport_bytes_total",
      "Bytes this worker moved to (out) and from (in) its ps tasks, by transport: grpc (the protobuf "
      "messages of "
      "every call, control calls included), shm (tensor data through shared memory, in place or staged), tcp "
      "(tensor data over the TCP lanes).",
      MetricType::Counter);
  AddSample(&bytes, {{"transport", "grpc"}, {"direction", "out"}}, c.grpc.sent.load());
  AddSample(&bytes, {{"transport", "grpc"}, {"direction", "in"}}, c.grpc.received.load());
  AddSample(&bytes, {{"transport", "shm"}, {"direction", "out"}}, c.shm.bytes_pushed.load());
  AddSample(&bytes, {{"transport", "shm"}, {"direction", "in"}}, c.shm.bytes_pulled.load());
  AddSample(&bytes, {{"transport", "tcp"}, {"direction", "out"}}, c.tcp.bytes_sent.load());
  AddSample(&bytes, {{"transport", "tcp"}, {"direction", "in"}}, c.tcp.bytes_received.load());
  out.push_back(std::move(bytes));
  prometheus::MetricFamily calls = metrics::Family("dtrain_worker_transport_calls_total",
                                                   "Pushes and pulls over each data plane (shm, tcp), and "
                                                   "those that went to gRPC instead (grpc_fallback).",
                                                   MetricType::Counter);
  AddSample(&calls, {{"transport", "shm"}, {"call", "push"}}, c.shm.shm_pushes.load());
  AddSample(&calls, {{"transport", "shm"}, {"call", "pull"}}, c.shm.shm_pulls.load());
  AddSample(&calls, {{"transport", "tcp"}, {"call", "push"}}, c.tcp.tcp_pushes.load());
  AddSample(&calls, {{"transport", "tcp"}, {"call", "pull"}}, c.tcp.tcp_pulls.load());
  AddSample(&calls, {{"transport", "grpc_fallback"}, {"call", "push"}},
            c.shm.control_pushes.load() + c.tcp.control_pushes.load());
  AddSample(&calls, {{"transport", "grpc_fallback"}, {"call", "pull"}},
            c.shm.control_pulls.load() + c.tcp.control_pulls.load());
  out.push_back(std::move(calls));
  const double age = metrics::NewestFileAgeSeconds(
      checkpoint_dir, [](const std::string& n) { return absl::StartsWith(n, "model.ckpt-"); });
  if (age >= 0) {
    AddSample(
        &AddFamily(&out, "dtrain_worker_checkpoint_age_seconds",
                   "Local mode: seconds since the newest checkpoint file was written.", MetricType::Gauge),
        {}, age);
  }
  for (prometheus::MetricFamily& f : metrics::ProcessFamilies()) out.push_back(std::move(f));
  return out;
}

std::shared_ptr<prometheus::Collectable> NewWorkerCollector(const TransportCounters* counters,
                                                            std::string checkpoint_dir) {
  return std::make_shared<metrics::CallbackCollectable>(
      [counters, dir = std::move(checkpoint_dir)] { return CollectWorkerFamilies(*counters, dir); });
}

}  // namespace dtrain::worker
