// A cluster of real dtrain_ps and dtrain_worker processes on 127.0.0.1 for the multi-process tests: free ports,
// one log file per process (and per incarnation of a restarted one), a monitoring client of ps task 0, and the
// helpers those tests share (the global step, the chief's test accuracy, whether Fashion-MNIST is installed).
//
//   ProcessCluster c(/*num_ps=*/1, /*num_workers=*/2, "tag", {"--worker_timeout_secs=3"}, {"--model=mlp"});
//   auto ps = c.StartPs(0, {"--checkpoint_dir=..."});
//   auto workers = c.StartWorkers({"--mode=sync", "--train_steps=300"});
//   auto monitor = c.Monitor();
//   WaitForStep(*monitor, 100, absl::Now() + absl::Minutes(1));
//
// Thread-safety: one thread uses a ProcessCluster and its Subprocesses.
#ifndef DTRAIN_TESTS_PROCESS_CLUSTER_H_
#define DTRAIN_TESTS_PROCESS_CLUSTER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "ps/api/ps_interface.h"
#include "tests/subprocess.h"

namespace dtrain::testing {

inline constexpr char kFashionMnistDir[] = "/usr/share/datasets/fashion-mnist";
bool HaveFashionMnist();

// <test temp dir>/<name>.log
std::string ClusterLogPath(const std::string& name);

// The chief's final "test accuracy = A (" figure; -1 when it printed none.
double ParseAccuracy(const std::string& out);

class ProcessCluster {
 public:
  // `ps_flags` and `worker_flags` go to every ps task and worker before the flags of each Start call (a later
  // flag overrides an earlier one).
  ProcessCluster(int num_ps, int num_workers, std::string tag, std::vector<std::string> ps_flags = {},
                 std::vector<std::string> worker_flags = {});
  std::vector<std::string> ClusterFlags() const;
  // `incarnation` tells the logs of a restarted task apart: <tag>_ps<i>_<incarnation>.log.
  std::unique_ptr<Subprocess> StartPs(int i, const std::vector<std::string>& extra, int incarnation = 0);
  std::unique_ptr<Subprocess> StartWorker(int i, const std::vector<std::string>& extra, int incarnation = 0);
  // Every worker, with the same flags.
  std::vector<std::unique_ptr<Subprocess>> StartWorkers(const std::vector<std::string>& extra);
  // A monitoring client of ps task 0 (short retries: a dead task answers Unavailable soon); null if it cannot be
  // made.
  std::unique_ptr<ps::PsInterface> Monitor() const;

 private:
  std::string tag_;
  std::vector<std::string> ps_, workers_;
  std::vector<std::string> ps_flags_, worker_flags_;
};

// ps task 0's global step, -1 when it cannot be asked.
int64_t GlobalStep(ps::PsInterface& monitor);
// Waits until ps task 0's global step is >= `step`; false at `deadline`.
bool WaitForStep(ps::PsInterface& monitor, int64_t step, absl::Time deadline);

}  // namespace dtrain::testing

#endif  // DTRAIN_TESTS_PROCESS_CLUSTER_H_
