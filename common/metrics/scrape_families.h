// Figures read when Prometheus scrapes (from stats a process keeps anyway: a ParameterServer's TrainingStats,
// a client's byte counters, /proc), as prometheus-cpp MetricFamily values, and the Collectable that calls a
// function to make them. The hot path pays nothing for these: they are computed on the exporter's thread,
// once per scrape. Counters and histograms updated per step live in a prometheus::Registry instead
// (prometheus-cpp's Counter is one atomic add; Histogram::Observe one short mutex).
//
// Usage:
//   auto collector = std::make_shared<CallbackCollectable>([&server] {
//     std::vector<prometheus::MetricFamily> out;
//     prometheus::MetricFamily& f = AddFamily(&out, "dtrain_ps_pushes_received_total", "Pushes received",
//                                             prometheus::MetricType::Counter);
//     AddSample(&f, {}, server.accounting().received);
//     return out;
//   });
//   exporter->Register(collector);
//
// Thread-safety: CallbackCollectable::Collect runs on the exporter's request threads (one at a time or
// several at once): the function must be safe to call from any thread. The builders are plain functions.
#ifndef DTRAIN_COMMON_METRICS_SCRAPE_FAMILIES_H_
#define DTRAIN_COMMON_METRICS_SCRAPE_FAMILIES_H_

#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace dtrain::metrics {

using LabelPairs = std::vector<std::pair<std::string, std::string>>;

// An empty family.
prometheus::MetricFamily Family(std::string name, std::string help, prometheus::MetricType type);
// Appends an empty family to `out` and returns it: valid only until `out` grows again (fill it at once, or
// build several with Family and append them when done).
prometheus::MetricFamily& AddFamily(std::vector<prometheus::MetricFamily>* out, std::string name,
                                    std::string help, prometheus::MetricType type);
// One sample of a counter, gauge or untyped family (the value goes where its type reads it).
void AddSample(prometheus::MetricFamily* family, const LabelPairs& labels, double value);

class CallbackCollectable : public prometheus::Collectable {
 public:
  using Fn = std::function<std::vector<prometheus::MetricFamily>()>;
  explicit CallbackCollectable(Fn fn) : fn_(std::move(fn)) {}
  std::vector<prometheus::MetricFamily> Collect() const override { return fn_(); }

 private:
  const Fn fn_;
};

// The process's own figures, under Prometheus' standard names (as client_golang's process collector writes
// them, so that dashboards made for any exporter read them): process_resident_memory_bytes,
// process_virtual_memory_bytes, process_cpu_seconds_total, process_open_fds, process_start_time_seconds,
// process_threads. Read from /proc/self; a file that cannot be read leaves its family out. With glibc also
// dtrain_heap_bytes{state="in_use"|"held"} (mallinfo2): the heap the program uses and what the allocator keeps.
std::vector<prometheus::MetricFamily> ProcessFamilies();
// Whether ProcessFamilies has dtrain_heap_bytes in this build (glibc 2.33 or newer, not under AddressSanitizer).
bool HeapFiguresAvailable();

// Seconds since the newest modification time of the files in `dir` whose names `match` accepts; -1 when there
// is none (or `dir` cannot be read). For checkpoint and delta ages, read at scrape time.
double NewestFileAgeSeconds(const std::string& dir,
                            const std::function<bool(const std::string& name)>& match);

}  // namespace dtrain::metrics

#endif  // DTRAIN_COMMON_METRICS_SCRAPE_FAMILIES_H_
