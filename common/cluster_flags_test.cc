#include "common/cluster_flags.h"

#include <stdlib.h>

#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

ABSL_DECLARE_FLAG(std::string, ps_hosts);
ABSL_DECLARE_FLAG(std::string, worker_hosts);
ABSL_DECLARE_FLAG(std::string, cluster_spec);

namespace dtrain {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

class ClusterFlagsTest : public ::testing::Test {
 protected:
  void SetUp() override { unsetenv("TF_CONFIG"); }
  void TearDown() override { unsetenv("TF_CONFIG"); }
  absl::FlagSaver flags_;  // what a test sets goes back to the defaults after it
};

TEST_F(ClusterFlagsTest, HostsFlagsGiveTheClusterAndThisTask) {
  absl::SetFlag(&FLAGS_ps_hosts, "127.0.0.1:2222,127.0.0.1:2223");
  absl::SetFlag(&FLAGS_worker_hosts, "127.0.0.1:2224");
  absl::StatusOr<ClusterConfig> ps = ClusterOfThisTask("ps", 1, TaskBinary::kPs);
  ASSERT_TRUE(ps.ok()) << ps.status();
  EXPECT_EQ(ps->ps, (std::vector<std::string>{"127.0.0.1:2222", "127.0.0.1:2223"}));
  EXPECT_EQ(ps->worker, std::vector<std::string>{"127.0.0.1:2224"});
  EXPECT_TRUE(ps->is_ps());
  EXPECT_EQ(ps->task_index, 1);
  EXPECT_EQ(ps->address(), "127.0.0.1:2223");

  absl::StatusOr<ClusterConfig> worker = ClusterOfThisTask("worker", 0, TaskBinary::kWorker);
  ASSERT_TRUE(worker.ok()) << worker.status();
  EXPECT_FALSE(worker->is_ps());
  EXPECT_EQ(worker->address(), "127.0.0.1:2224");
}

TEST_F(ClusterFlagsTest, TfConfigIsReadWhenNoFlagNamesTheCluster) {
  setenv("TF_CONFIG",
         R"({"cluster": {"ps": ["10.0.0.1:2222"], "worker": ["10.0.0.2:2222", "10.0.0.3:2222"]},
             "task": {"type": "worker", "index": 1}})",
         1);
  absl::StatusOr<ClusterConfig> c = ClusterOfThisTask("", -1, TaskBinary::kWorker);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_workers(), 2);
  EXPECT_EQ(c->task_index, 1);
  EXPECT_EQ(c->address(), "10.0.0.3:2222");
}

TEST_F(ClusterFlagsTest, ABadSpecSaysSo) {
  absl::StatusOr<ClusterConfig> c = ClusterOfThisTask("worker", 0, TaskBinary::kWorker);  // nothing names it
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(c.status().message()), StartsWith("bad cluster spec: "));

  absl::SetFlag(&FLAGS_cluster_spec, "/nonexistent/cluster.json");
  c = ClusterOfThisTask("ps", 0, TaskBinary::kPs);
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(std::string(c.status().message()), StartsWith("bad cluster spec: "));
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("/nonexistent/cluster.json"));
}

TEST_F(ClusterFlagsTest, ATaskOfTheOtherBinaryIsRefusedNamingTheRightOne) {
  absl::SetFlag(&FLAGS_ps_hosts, "127.0.0.1:2222");
  absl::SetFlag(&FLAGS_worker_hosts, "127.0.0.1:2224");
  absl::StatusOr<ClusterConfig> c = ClusterOfThisTask("worker", 0, TaskBinary::kPs);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(c.status().message()), StartsWith("this task is not a ps task ("));
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("); run dtrain_worker for it"));

  c = ClusterOfThisTask("ps", 0, TaskBinary::kWorker);
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(std::string(c.status().message()), StartsWith("this task is a ps task ("));
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("); run dtrain_ps for it"));

  // local mode is dtrain_worker's
  absl::SetFlag(&FLAGS_ps_hosts, "");
  absl::SetFlag(&FLAGS_worker_hosts, "");
  EXPECT_TRUE(ClusterOfThisTask("local", -1, TaskBinary::kWorker).ok());
  EXPECT_FALSE(ClusterOfThisTask("local", -1, TaskBinary::kPs).ok());
}

}  // namespace
}  // namespace dtrain
