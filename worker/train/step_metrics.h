// StepMetrics: a worker's per-step figures for Prometheus (dtrain_worker --metrics_port; docs/metrics.md),
// kept in a prometheus::Registry that the binary's exporter serves:
//   dtrain_worker_steps_total, dtrain_worker_examples_total     rate() of them: steps/s and examples/s
//   dtrain_worker_step_seconds                                  a step: from its compute to the next step's
//                                                               parameters announced (histogram)
//   dtrain_worker_step_part_seconds{part=...}                   its parts (histograms): compute (forward and
//       backward without the transport's calls), pull (waiting for parameters in the forward pass, finishing
//       the pull, starting the next), push (waiting for the previous push, handing gradients over,
//       finishing), sync_wait (waiting for the next step's answer: the other workers and the ps's update),
//       input_wait (the training loop waiting for a batch, per batch)
//   dtrain_worker_global_step                                   the step of the newest parameters (gauge)
// Reported by the steps that push and pull (worker/train/step_runner.h) and the training loop's input wait;
// the device-resident steps of local mode report none.
//
// Usage:
//   auto registry = std::make_shared<prometheus::Registry>();
//   StepMetrics metrics(registry.get());
//   options.metrics = &metrics;           // WorkerOptions; the registry goes to the exporter
//
// Thread-safety: every method may be called from any thread (prometheus-cpp's counters are atomic, a
// histogram's Observe takes its own short mutex). Cost: one clock read per part and a few atomic adds per
// step.
#ifndef DTRAIN_WORKER_TRAIN_STEP_METRICS_H_
#define DTRAIN_WORKER_TRAIN_STEP_METRICS_H_

#include <chrono>
#include <cstdint>

namespace prometheus {
class Registry;
class Counter;
class Gauge;
class Histogram;
}  // namespace prometheus

namespace dtrain::worker {

class StepMetrics {
 public:
  enum class Part { kCompute = 0, kPull, kPush, kSyncWait, kInputWait };
  static constexpr int kParts = 5;

  // Registers the families in `registry` (not owned; must outlive this object and be served by one exporter).
  explicit StepMetrics(prometheus::Registry* registry);

  // A step done: `examples` trained on.
  void AddStep(int64_t examples);
  void ObserveStep(double seconds);
  void Observe(Part part, double seconds);
  void SetGlobalStep(int64_t step);

  static const char* PartName(Part part);

 private:
  prometheus::Counter* steps_;
  prometheus::Counter* examples_;
  prometheus::Histogram* step_;
  prometheus::Histogram* parts_[kParts];
  prometheus::Gauge* global_step_;
};

// Seconds since `since` on the steady clock; for timing parts.
inline double SecondsSince(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

}  // namespace dtrain::worker

#endif  // DTRAIN_WORKER_TRAIN_STEP_METRICS_H_
