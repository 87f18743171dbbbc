#include "ps/metrics/ps_metrics.h"

#include <prometheus/text_serializer.h>

#include <cmath>
#include <fstream>
#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ps/testing/ps_test_util.h"

namespace dtrain::ps {
namespace {

using ::dtrain::ps::testing::MakeConfig;
using ::dtrain::ps::testing::SimCluster;
using ::dtrain::ps::testing::SimClusterOptions;
using ::dtrain::ps::testing::SimWorker;
using ::testing::HasSubstr;
using Outcome = PushResponse::Outcome;

// name{labels} -> value, labels as "k=v,k=v" in the order written ("" without labels).
std::map<std::string, double> Samples(const std::vector<prometheus::MetricFamily>& families) {
  std::map<std::string, double> out;
  for (const prometheus::MetricFamily& f : families) {
    for (const prometheus::ClientMetric& m : f.metric) {
      std::string key = f.name;
      std::string labels;
      for (const auto& l : m.label) labels += (labels.empty() ? "" : ",") + l.name + "=" + l.value;
      if (!labels.empty()) key += "{" + labels + "}";
      out[key] = f.type == prometheus::MetricType::Counter ? m.counter.value : m.gauge.value;
    }
  }
  return out;
}

// The value of `key`, or a failure naming it (and NaN).
double At(const std::map<std::string, double>& samples, const std::string& key) {
  auto it = samples.find(key);
  if (it == samples.end()) {
    std::string all;
    for (const auto& [k, v] : samples) all += k + "\n";
    ADD_FAILURE() << "no sample " << key << " in\n" << all;
    return std::nan("");
  }
  return it->second;
}

TEST(PsMetricsTest, FiguresFollowTheTasksStatsAndAccounting) {
  SimClusterOptions o;
  o.variables = {{"w", 3}, {"b", 1}};
  o.config = MakeConfig("sync", 3, 2, /*learning_rate=*/0.5f);  // R=2 of 3: one backup worker
  o.initial = {0, 0, 0, 0};
  auto cluster = *SimCluster::Start(o);
  SimWorker w0(cluster.get(), 0), w1(cluster.get(), 1), w2(cluster.get(), 2);
  const std::vector<float> g = {1, 1, 1, 1};
  ASSERT_EQ(*w1.Push(0, g), Outcome::kAccepted);
  ASSERT_EQ(*w0.Push(0, g), Outcome::kAccepted);
  ASSERT_EQ(*w2.Push(0, g), Outcome::kDroppedBackup);

  const std::string dir = ::testing::TempDir() + "/ps_metrics_test";
  ASSERT_EQ(system(("rm -rf " + dir + " && mkdir -p " + dir).c_str()), 0);
  std::ofstream(dir + "/model.ckpt-1.ps0-of-1") << "x";
  std::ofstream(dir + "/model.ckpt-1.ps1-of-2") << "x";  // another task's: not this one's age
  PsMetricsSources src;
  src.ps = &cluster->task(0);
  src.checkpoint_dir = dir;
  src.tcp = [] {
    tcp::TcpServerCounters c;
    c.bytes_received = 1000;
    c.bytes_sent = 2000;
    c.active_lanes = 3;
    return c;
  };
  src.grpc_bytes = [] { return std::make_pair(int64_t{300}, int64_t{400}); };
  const std::vector<prometheus::MetricFamily> families = CollectPsFamilies(src);
  const std::map<std::string, double> s = Samples(families);
  const PushAccounting a = cluster->task(0).accounting();
  EXPECT_EQ(At(s, "dtrain_ps_global_step"), 1);
  EXPECT_EQ(At(s, "dtrain_ps_configured"), 1);
  EXPECT_EQ(At(s, "dtrain_ps_pushes_received_total"), a.received);
  EXPECT_EQ(At(s, "dtrain_ps_pushes_received_total"), 3);
  EXPECT_EQ(At(s, "dtrain_ps_pushes_applied_total"), 2);
  EXPECT_EQ(At(s, "dtrain_ps_pushes_dropped_total{reason=backup}"), 1);
  EXPECT_EQ(At(s, "dtrain_ps_pushes_dropped_total{reason=stale}"), 0);
  EXPECT_EQ(At(s, "dtrain_ps_worker_pushes_dropped_total{worker=2,reason=backup}"), 1);
  EXPECT_EQ(At(s, "dtrain_ps_worker_pushes_applied_total{worker=0}"), 1);
  EXPECT_EQ(At(s, "dtrain_ps_workers{state=live}"), 3);
  EXPECT_EQ(At(s, "dtrain_ps_workers{state=lost}"), 0);
  EXPECT_GT(At(s, "dtrain_ps_payload_bytes_total{direction=in}"), 0);
  EXPECT_EQ(At(s, "dtrain_ps_transport_bytes_total{transport=tcp,direction=in}"), 1000);
  EXPECT_EQ(At(s, "dtrain_ps_transport_bytes_total{transport=tcp,direction=out}"), 2000);
  EXPECT_EQ(At(s, "dtrain_ps_transport_bytes_total{transport=grpc,direction=in}"), 300);
  EXPECT_EQ(At(s, "dtrain_ps_transport_bytes_total{transport=grpc,direction=out}"), 400);
  EXPECT_EQ(s.count("dtrain_ps_transport_bytes_total{transport=shm,direction=in}"), 0u);  // not offered
  EXPECT_EQ(At(s, "dtrain_ps_transport_lanes{transport=tcp}"), 3);
  EXPECT_EQ(s.count("dtrain_ps_transport_lanes{transport=shm}"), 0u);  // not offered
  EXPECT_GE(At(s, "dtrain_ps_checkpoint_age_seconds"), 0);
  EXPECT_LT(At(s, "dtrain_ps_checkpoint_age_seconds"), 60);
  EXPECT_EQ(s.count("dtrain_ps_delta_age_seconds"), 0u);  // no delta dir
  EXPECT_GT(At(s, "process_resident_memory_bytes"), 0);

  ASSERT_TRUE(w0.Done().ok());
  const std::map<std::string, double> after = Samples(CollectPsFamilies(src));
  EXPECT_EQ(At(after, "dtrain_ps_workers{state=live}"), 2);
  EXPECT_EQ(At(after, "dtrain_ps_workers{state=done}"), 1);
  // Every family serializes (names and labels valid for the text format).
  const std::string text = prometheus::TextSerializer().Serialize(families);
  EXPECT_THAT(text, HasSubstr("# TYPE dtrain_ps_pushes_dropped_total counter\n"));
  EXPECT_THAT(text, HasSubstr("dtrain_ps_pushes_dropped_total{reason=\"backup\"} 1\n"));
}

TEST(PsMetricsTest, SparseTablesHaveRowFigures) {
  SimClusterOptions o;
  o.variables = {{"w", 4}};
  o.config = MakeConfig("sync", 1, 1, 0.5f);
  SparseTableSpec t;
  t.name = "emb";
  t.dim = 2;
  o.config.tables = {t};
  o.initial = {0, 0, 0, 0};
  auto cluster = *SimCluster::Start(o);
  PsMetricsSources src;
  src.ps = &cluster->task(0);
  std::vector<prometheus::MetricFamily> families = CollectPsFamilies(src);
  const std::map<std::string, double> s = Samples(families);
  EXPECT_EQ(At(s, "dtrain_ps_sparse_rows{table=emb}"), 0);
  EXPECT_EQ(At(s, "dtrain_ps_sparse_rows_created_total{table=emb}"), 0);
  EXPECT_EQ(s.count("dtrain_ps_sparse_rows_removed_total{table=emb,reason=expired}"), 1u);
}

}  // namespace
}  // namespace dtrain::ps
