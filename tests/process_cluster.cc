#include "tests/process_cluster.h"

#include <sys/stat.h>

#include <regex>
#include <utility>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "ps/rpc/grpc_ps_client.h"

namespace dtrain::testing {

bool HaveFashionMnist() {
  struct stat st;
  return stat(absl::StrCat(kFashionMnistDir, "/train-images-idx3-ubyte.gz").c_str(), &st) == 0;
}

std::string ClusterLogPath(const std::string& name) { return absl::StrCat(::testing::TempDir(), "/", name, ".log"); }

double ParseAccuracy(const std::string& out) {
  std::smatch m;
  if (std::regex_search(out, m, std::regex("test accuracy = ([0-9.]+) \\("))) return std::stod(m[1]);
  return -1;
}

ProcessCluster::ProcessCluster(int num_ps, int num_workers, std::string tag, std::vector<std::string> ps_flags,
                               std::vector<std::string> worker_flags)
    : tag_(std::move(tag)), ps_flags_(std::move(ps_flags)), worker_flags_(std::move(worker_flags)) {
  const std::vector<int> ports = FreePorts(num_ps + num_workers);
  for (int i = 0; i < num_ps; ++i) ps_.push_back(absl::StrCat("127.0.0.1:", ports[i]));
  for (int i = 0; i < num_workers; ++i) workers_.push_back(absl::StrCat("127.0.0.1:", ports[num_ps + i]));
}

std::vector<std::string> ProcessCluster::ClusterFlags() const {
  return {"--ps_hosts=" + absl::StrJoin(ps_, ","), "--worker_hosts=" + absl::StrJoin(workers_, ",")};
}

std::unique_ptr<Subprocess> ProcessCluster::StartPs(int i, const std::vector<std::string>& extra, int incarnation) {
  std::vector<std::string> argv = {BinPath("dtrain_ps"), "--job_name=ps", absl::StrCat("--task_index=", i)};
  const std::vector<std::string> cluster = ClusterFlags();
  for (const std::vector<std::string>& flags : {ps_flags_, cluster, extra}) {
    argv.insert(argv.end(), flags.begin(), flags.end());
  }
  return std::make_unique<Subprocess>(argv, ClusterLogPath(absl::StrCat(tag_, "_ps", i, "_", incarnation)));
}

std::unique_ptr<Subprocess> ProcessCluster::StartWorker(int i, const std::vector<std::string>& extra,
                                                        int incarnation) {
  std::vector<std::string> argv = {BinPath("dtrain_worker"), "--job_name=worker", absl::StrCat("--task_index=", i)};
  const std::vector<std::string> cluster = ClusterFlags();
  for (const std::vector<std::string>& flags : {worker_flags_, cluster, extra}) {
    argv.insert(argv.end(), flags.begin(), flags.end());
  }
  return std::make_unique<Subprocess>(argv, ClusterLogPath(absl::StrCat(tag_, "_worker", i, "_", incarnation)));
}

std::vector<std::unique_ptr<Subprocess>> ProcessCluster::StartWorkers(const std::vector<std::string>& extra) {
  std::vector<std::unique_ptr<Subprocess>> started;
  for (int i = 0; i < static_cast<int>(workers_.size()); ++i) started.push_back(StartWorker(i, extra));
  return started;
}

std::unique_ptr<ps::PsInterface> ProcessCluster::Monitor() const {
  ps::GrpcClientOptions o;
  o.retry_window = absl::Milliseconds(200);
  o.rpc_timeout = absl::Seconds(2);
  absl::StatusOr<std::unique_ptr<ps::PsInterface>> c = ps::NewGrpcPsClient(ps_[0], o);
  return c.ok() ? std::move(*c) : nullptr;
}

int64_t GlobalStep(ps::PsInterface& monitor) {
  absl::StatusOr<ps::TrainingStats> s = monitor.GetStats();
  return s.ok() ? s->global_step : -1;
}

bool WaitForStep(ps::PsInterface& monitor, int64_t step, absl::Time deadline) {
  while (absl::Now() < deadline) {
    if (GlobalStep(monitor) >= step) return true;
    absl::SleepFor(absl::Milliseconds(50));
  }
  return false;
}

}  // namespace dtrain::testing
