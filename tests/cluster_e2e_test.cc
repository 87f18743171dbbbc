// End to end with real processes on 127.0.0.1: one dtrain_ps and two dtrain_worker processes train the MLP on
// Fashion-MNIST to >= 80% test accuracy in sync and in async mode, and every process exits by itself with 0.
#include <sys/stat.h>

#include <cstdlib>
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "tests/subprocess.h"

namespace dtrain::testing {
namespace {

const char kFashion[] = "/usr/share/datasets/fashion-mnist";

bool HaveFashionMnist() {
  struct stat st;
  return stat(absl::StrCat(kFashion, "/train-images-idx3-ubyte.gz").c_str(), &st) == 0;
}

double ParseAccuracy(const std::string& out) {
  std::smatch m;
  std::regex re("test accuracy = ([0-9.]+) \\(");
  if (std::regex_search(out, m, re)) return std::stod(m[1]);
  return -1;
}

std::string LogPath(const std::string& name) { return absl::StrCat(::testing::TempDir(), "/", name, ".log"); }

struct Cluster {
  std::vector<std::string> ps, worker;
};

Cluster MakeCluster(int num_ps, int num_workers) {
  std::vector<int> ports = FreePorts(num_ps + num_workers);
  Cluster c;
  for (int i = 0; i < num_ps; ++i) c.ps.push_back(absl::StrCat("127.0.0.1:", ports[i]));
  for (int i = 0; i < num_workers; ++i) c.worker.push_back(absl::StrCat("127.0.0.1:", ports[num_ps + i]));
  return c;
}

// Sync mode, cluster from TensorFlow's classic flags, ps started first.
TEST(ClusterEndToEnd, SyncMlpReachesEightyPercent) {
  if (!HaveFashionMnist()) GTEST_SKIP() << "dataset-fashion-mnist not installed (scripts/install_deps.sh)";
  Cluster c = MakeCluster(1, 2);
  const std::vector<std::string> cluster = {absl::StrCat("--ps_hosts=", absl::StrJoin(c.ps, ",")),
                                            absl::StrCat("--worker_hosts=", absl::StrJoin(c.worker, ","))};
  auto args = [&](std::vector<std::string> a) {
    a.insert(a.end(), cluster.begin(), cluster.end());
    return a;
  };
  Subprocess ps(args({BinPath("dtrain_ps"), "--job_name=ps", "--task_index=0"}), LogPath("sync_ps"));
  std::vector<std::unique_ptr<Subprocess>> workers;
  for (int i = 0; i < 2; ++i) {
    workers.push_back(std::make_unique<Subprocess>(
        args({BinPath("dtrain_worker"), "--job_name=worker", absl::StrCat("--task_index=", i), "--mode=sync",
              "--model=mlp", "--train_steps=2000", "--log_every=500"}),
        LogPath(absl::StrCat("sync_worker", i))));
  }
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(workers[i]->Wait(absl::Minutes(5)), 0) << workers[i]->Output();
  }
  EXPECT_EQ(ps.Wait(absl::Seconds(30)), 0) << ps.Output();
  const std::string out = workers[0]->Output();
  EXPECT_NE(out.find("step 500, loss = "), std::string::npos) << out;
  EXPECT_NE(out.find("examples/sec; "), std::string::npos) << out;
  const double acc = ParseAccuracy(out);
  EXPECT_GE(acc, 0.80) << out;
  std::printf("sync: test accuracy %.4f\n", acc);
}

// Async mode, cluster from TF_CONFIG with a "chief" job, workers started before the ps.
TEST(ClusterEndToEnd, AsyncMlpReachesEightyPercentWithTfConfigAndLatePs) {
  if (!HaveFashionMnist()) GTEST_SKIP() << "dataset-fashion-mnist not installed (scripts/install_deps.sh)";
  Cluster c = MakeCluster(1, 2);
  auto tf_config = [&](const std::string& type, int index) {
    return absl::StrCat(R"(TF_CONFIG={"cluster": {"chief": [")", c.worker[0], R"("], "worker": [")", c.worker[1],
                        R"("], "ps": [")", c.ps[0], R"("]}, "task": {"type": ")", type, R"(", "index": )", index,
                        "}}");
  };
  const std::vector<std::string> train = {"--mode=async", "--model=mlp", "--train_steps=3000", "--log_every=500"};
  std::vector<std::string> chief_args = {BinPath("dtrain_worker")};
  chief_args.insert(chief_args.end(), train.begin(), train.end());
  Subprocess chief(chief_args, LogPath("async_chief"), {tf_config("chief", 0)});
  Subprocess worker(chief_args, LogPath("async_worker"), {tf_config("worker", 0)});
  absl::SleepFor(absl::Seconds(1.5));  // the workers wait for the ps with backoff
  Subprocess ps({BinPath("dtrain_ps")}, LogPath("async_ps"), {tf_config("ps", 0)});
  EXPECT_EQ(chief.Wait(absl::Minutes(5)), 0) << chief.Output();
  EXPECT_EQ(worker.Wait(absl::Minutes(1)), 0) << worker.Output();
  EXPECT_EQ(ps.Wait(absl::Seconds(30)), 0) << ps.Output();
  const std::string out = chief.Output();
  EXPECT_NE(out.find("staleness histogram"), std::string::npos) << out;
  const double acc = ParseAccuracy(out);
  EXPECT_GE(acc, 0.80) << out;
  std::printf("async: test accuracy %.4f\n", acc);
}

TEST(ClusterEndToEnd, BadClusterSpecsExitTwoWithOneClearLine) {
  struct Case {
    std::vector<std::string> args;
    std::vector<std::string> env;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {{"--job_name=worker", "--task_index=0", "--ps_hosts=127.0.0.1", "--worker_hosts=127.0.0.1:5"}, {}, "port"},
      // A worker past the spec's list can only join an elastic job (dtrain_ps --max_workers).
      {{"--job_name=worker", "--task_index=2", "--ps_hosts=127.0.0.1:4", "--worker_hosts=127.0.0.1:5"}, {},
       "is past the cluster spec's 1 workers"},
      {{"--job_name=worker", "--task_index=0", "--ps_hosts=127.0.0.1:4", "--worker_hosts=127.0.0.1:4"}, {},
       "duplicate"},
      {{}, {"TF_CONFIG={\"cluster\": {\"ps\": [\"a:1\"], \"worker\": [\"b:2\"]}, \"task\": {\"type\": \"evaluater\""
            ", \"index\": 0}}"},
       "evaluater"},
      {{}, {"TF_CONFIG={not json"}, "JSON"},
      {{"--job_name=local", "--model=resnet"}, {}, "resnet"},
      // A GPU index no machine has: unusable with or without a GPU (and in a CPU-only build), so the
      // expectation holds on every machine (gpu:0 would start training where a GPU exists).
      {{"--job_name=local", "--towers=gpu:4096"}, {}, "no CUDA device available"},
  };
  int i = 0;
  for (const Case& k : cases) {
    std::vector<std::string> argv = {BinPath("dtrain_worker")};
    argv.insert(argv.end(), k.args.begin(), k.args.end());
    Subprocess p(argv, LogPath(absl::StrCat("bad", i++)), k.env);
    EXPECT_EQ(p.Wait(absl::Seconds(30)), 2) << p.Output();
    EXPECT_NE(p.Output().find(k.expect), std::string::npos) << "expected '" << k.expect << "' in: " << p.Output();
  }
  Subprocess ps({BinPath("dtrain_ps"), "--job_name=worker", "--task_index=0", "--ps_hosts=127.0.0.1:4",
                 "--worker_hosts=127.0.0.1:5"},
                LogPath("bad_ps"));
  EXPECT_EQ(ps.Wait(absl::Seconds(30)), 2) << ps.Output();
}

}  // namespace
}  // namespace dtrain::testing
