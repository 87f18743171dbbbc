// GPU towers with real processes (skipped without a usable CUDA device or without Fashion-MNIST): local
// training on gpu:0 keeps its state on the device and replays the step as a CUDA graph, saves checkpoints
// that dtrain_eval reads to the same accuracy and that a restart resumes from; a GPU worker trains in a
// cluster with a dtrain_ps. Every process exits by itself with 0.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <regex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "kernels/device.h"
#include "tests/subprocess.h"

namespace dtrain::testing {
namespace {

const char kFashion[] = "/usr/share/datasets/fashion-mnist";

std::string SkipReason() {
  if (kernels::CudaDeviceCount() == 0) return "no usable CUDA device";
  struct stat st;
  if (stat(absl::StrCat(kFashion, "/train-images-idx3-ubyte.gz").c_str(), &st) != 0) {
    return "dataset-fashion-mnist not installed (../shared/device/pack.sh --data carries it)";
  }
  return "";
}

double ParseAccuracy(const std::string& out, const std::string& prefix) {
  std::smatch m;
  std::regex re(prefix + "test accuracy = ([0-9.]+)");
  if (std::regex_search(out, m, re)) return std::stod(m[1]);
  return -1;
}

std::string LogPath(const std::string& name) {
  return absl::StrCat(::testing::TempDir(), "/gpu_", name, ".log");
}

TEST(GpuProcessTest, LocalTrainingCheckpointsEvaluatesAndResumes) {
  if (const std::string why = SkipReason(); !why.empty()) GTEST_SKIP() << why;
  const std::string dir = ::testing::TempDir() + "/gpu_process_ckpt";
  std::filesystem::remove_all(dir);
  auto worker = [&](int steps, const std::string& tag) {
    Subprocess w({BinPath("dtrain_worker"), "--job_name=local", "--model=cnn", "--towers=gpu:0",
                  absl::StrCat("--train_steps=", steps), "--log_every=100", "--checkpoint_dir=" + dir,
                  "--save_checkpoint_steps=100"},
                 LogPath(tag));
    EXPECT_EQ(w.Wait(absl::Minutes(5)), 0) << w.Output();
    return w.Output();
  };
  const std::string first = worker(300, "local_a");
  EXPECT_NE(first.find("step 300, loss = "), std::string::npos) << first;
  EXPECT_NE(first.find("the training step is a CUDA graph"), std::string::npos) << first;
  const double acc = ParseAccuracy(first, "step 300: ");
  EXPECT_GE(acc, 0.6) << first;
  EXPECT_TRUE(std::filesystem::exists(dir + "/model.ckpt-300.ps0-of-1"));
  EXPECT_TRUE(std::filesystem::exists(dir + "/model.ckpt-200.ps0-of-1"));

  // The checkpoint holds the parameters the worker evaluated.
  Subprocess eval({BinPath("dtrain_eval"), "--checkpoint=" + dir, "--model=cnn"}, LogPath("eval"));
  EXPECT_EQ(eval.Wait(absl::Minutes(2)), 0) << eval.Output();
  EXPECT_NEAR(ParseAccuracy(eval.Output(), "model.ckpt-300: "), acc, 0.005) << eval.Output();

  const std::string second = worker(400, "local_b");
  EXPECT_NE(second.find("resuming at global step 300"), std::string::npos) << second;
  EXPECT_NE(second.find("step 400, loss = "), std::string::npos) << second;
}

TEST(GpuProcessTest, GpuWorkerInACluster) {
  if (const std::string why = SkipReason(); !why.empty()) GTEST_SKIP() << why;
  const std::vector<int> ports = FreePorts(2);
  const std::vector<std::string> cluster = {absl::StrCat("--ps_hosts=127.0.0.1:", ports[0]),
                                            absl::StrCat("--worker_hosts=127.0.0.1:", ports[1])};
  std::vector<std::string> ps_args = {BinPath("dtrain_ps"), "--job_name=ps", "--task_index=0"};
  ps_args.insert(ps_args.end(), cluster.begin(), cluster.end());
  Subprocess ps(ps_args, LogPath("cluster_ps"));
  std::vector<std::string> worker_args = {
      BinPath("dtrain_worker"), "--job_name=worker", "--task_index=0", "--model=cnn",
      "--towers=gpu:0",         "--train_steps=200", "--log_every=100"};
  worker_args.insert(worker_args.end(), cluster.begin(), cluster.end());
  Subprocess worker(worker_args, LogPath("cluster_worker"));
  EXPECT_EQ(worker.Wait(absl::Minutes(5)), 0) << worker.Output();
  EXPECT_EQ(ps.Wait(absl::Seconds(30)), 0) << ps.Output();
  EXPECT_GE(ParseAccuracy(worker.Output(), "step 200: "), 0.5) << worker.Output();
}

}  // namespace
}  // namespace dtrain::testing
