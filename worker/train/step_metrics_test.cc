// --metrics_port's step figures as a training run reports them: steps and examples, a step's time and its
// parts, the global step; and the shared-memory client's bytes by direction.
#include "worker/train/step_metrics.h"

#include <prometheus/registry.h>

#include <map>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/data/synthetic_data.h"
#include "worker/train/trainer.h"
#include "worker/train/trainer_test_util.h"

namespace dtrain::worker {
namespace {

struct Histogram {
  uint64_t count = 0;
  double sum = 0;
};

// The registry's counters and gauges by name, histograms by name{part}.
struct Collected {
  std::map<std::string, double> values;
  std::map<std::string, Histogram> histograms;
};
Collected Collect(prometheus::Registry& registry) {
  Collected c;
  for (const prometheus::MetricFamily& f : registry.Collect()) {
    for (const prometheus::ClientMetric& m : f.metric) {
      std::string key = f.name;
      for (const auto& l : m.label) key += "{" + l.value + "}";
      switch (f.type) {
        case prometheus::MetricType::Counter:
          c.values[key] = m.counter.value;
          break;
        case prometheus::MetricType::Gauge:
          c.values[key] = m.gauge.value;
          break;
        case prometheus::MetricType::Histogram:
          c.histograms[key] = {m.histogram.sample_count, m.histogram.sample_sum};
          break;
        default:
          break;
      }
    }
  }
  return c;
}

WorkerOptions Options(const data::DatasetPair* data) {
  WorkerOptions o = QuietTrainingOptions(data);
  o.batch_size = 25;
  o.train_steps = 12;
  return o;
}

void ExpectStepFigures(prometheus::Registry& registry, int steps, int batch, double wall_seconds) {
  const Collected c = Collect(registry);
  EXPECT_EQ(c.values.at("dtrain_worker_steps_total"), steps);
  EXPECT_EQ(c.values.at("dtrain_worker_examples_total"), steps * batch);
  EXPECT_EQ(c.values.at("dtrain_worker_global_step"), steps);
  const Histogram step = c.histograms.at("dtrain_worker_step_seconds");
  EXPECT_EQ(step.count, static_cast<uint64_t>(steps));
  EXPECT_GT(step.sum, 0);
  EXPECT_LT(step.sum, wall_seconds);
  double parts = 0;
  for (const char* part : {"compute", "pull", "push", "sync_wait"}) {
    const Histogram h = c.histograms.at(std::string("dtrain_worker_step_part_seconds{") + part + "}");
    EXPECT_EQ(h.count, static_cast<uint64_t>(steps)) << part;
    EXPECT_GE(h.sum, 0) << part;
    parts += h.sum;
  }
  EXPECT_GT(c.histograms.at("dtrain_worker_step_part_seconds{compute}").sum, 0);
  // The parts tile the step (the time between them is a few clock reads).
  EXPECT_LE(parts, step.sum * 1.001 + 1e-3);
  EXPECT_GE(parts, step.sum * 0.8);
  EXPECT_GE(c.histograms.at("dtrain_worker_step_part_seconds{input_wait}").count,
            static_cast<uint64_t>(steps));
}

TEST(StepMetricsTest, LocalModeCountsEveryStep) {
  const data::DatasetPair data = MakeSyntheticDataset(1000, 100);
  prometheus::Registry registry;
  StepMetrics metrics(&registry);
  WorkerOptions o = Options(&data);
  o.metrics = &metrics;
  const absl::Time start = absl::Now();
  absl::StatusOr<TrainingResult> r = RunTraining(o, {});
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->local_steps, 12);
  ExpectStepFigures(registry, 12, 25, absl::ToDoubleSeconds(absl::Now() - start));
}

TEST(StepMetricsTest, SyncWorkerOverSharedMemoryCountsStepsAndBytes) {
  const data::DatasetPair data = MakeSyntheticDataset(1000, 100);
  PsTasks ps_tasks(1, 1);
  prometheus::Registry registry;
  StepMetrics metrics(&registry);
  WorkerOptions o = Options(&data);
  o.mode = "sync";
  o.metrics = &metrics;
  auto front = std::make_unique<ShmFront>(ps_tasks.tasks, 1);
  const absl::Time start = absl::Now();
  std::vector<TrainingResult> got = RunWorkers(o, 1, ps_tasks.tasks, front.get());
  ASSERT_EQ(got[0].global_step, 12);
  ExpectStepFigures(registry, 12, 25, absl::ToDoubleSeconds(absl::Now() - start));
  // The client's bytes by direction add up to its bytes by kind, and both directions moved the model each
  // step.
  const ps::shm::ShmCounters& c = front->counters;
  EXPECT_EQ(c.bytes_pushed.load() + c.bytes_pulled.load(), c.bytes_in_place.load() + c.bytes_staged.load());
  const ps::TrainingStats stats = *ps_tasks.servers[0]->GetStats();
  // The task received the chief's initial values (a control call) and 12 pushes of the same size through shm.
  EXPECT_EQ(c.bytes_pushed.load() * 13, stats.bytes_received * 12);
  EXPECT_GE(c.bytes_pulled.load(), c.bytes_pushed.load());  // a pull per step, and the first
}

}  // namespace
}  // namespace dtrain::worker
