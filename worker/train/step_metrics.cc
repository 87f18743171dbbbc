#include "worker/train/step_metrics.h"

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

namespace dtrain::worker {

namespace {

// From 100 us to about 100 s, 3 buckets per decade (1, 2.5, 5): the steps of every model here, on CPU or GPU.
prometheus::Histogram::BucketBoundaries StepBuckets() {
  prometheus::Histogram::BucketBoundaries b;
  for (double decade = 1e-4; decade < 100; decade *= 10) {
    for (double m : {1.0, 2.5, 5.0}) b.push_back(decade * m);
  }
  return b;
}

}  // namespace

const char* StepMetrics::PartName(Part part) {
  switch (part) {
    case Part::kCompute:
      return "compute";
    case Part::kPull:
      return "pull";
    case Part::kPush:
      return "push";
    case Part::kSyncWait:
      return "sync_wait";
    case Part::kInputWait:
      return "input_wait";
  }
  return "?";
}

StepMetrics::StepMetrics(prometheus::Registry* registry) {
  steps_ = &prometheus::BuildCounter()
                .Name("dtrain_worker_steps_total")
                .Help("Training steps this worker completed (rate(): steps per second).")
                .Register(*registry)
                .Add({});
  examples_ =
      &prometheus::BuildCounter()
           .Name("dtrain_worker_examples_total")
           .Help("Examples this worker trained on (rate(): examples per second, as its progress lines).")
           .Register(*registry)
           .Add({});
  step_ = &prometheus::BuildHistogram()
               .Name("dtrain_worker_step_seconds")
               .Help("A step: from the start of its compute to the next step's parameters announced.")
               .Register(*registry)
               .Add({}, StepBuckets());
  auto& parts =
      prometheus::BuildHistogram()
          .Name("dtrain_worker_step_part_seconds")
          .Help(
              "A step's parts: compute (forward and backward, without the transport's calls), pull "
              "(waiting for parameters), push (handing gradients over, waiting for the previous push), "
              "sync_wait (waiting for the next step: the other workers and the update), input_wait (per "
              "batch).")
          .Register(*registry);
  for (int p = 0; p < kParts; ++p) {
    parts_[p] = &parts.Add({{"part", PartName(static_cast<Part>(p))}}, StepBuckets());
  }
  global_step_ = &prometheus::BuildGauge()
                      .Name("dtrain_worker_global_step")
                      .Help("The global step of this worker's newest parameters.")
                      .Register(*registry)
                      .Add({});
}

void StepMetrics::AddStep(int64_t examples) {
  steps_->Increment();
  examples_->Increment(static_cast<double>(examples));
}

void StepMetrics::ObserveStep(double seconds) { step_->Observe(seconds); }

void StepMetrics::Observe(Part part, double seconds) { parts_[static_cast<int>(part)]->Observe(seconds); }

void StepMetrics::SetGlobalStep(int64_t step) { global_step_->Set(static_cast<double>(step)); }

}  // namespace dtrain::worker
