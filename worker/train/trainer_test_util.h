// Test helpers for trainer tests: in-process ps tasks and workers run as threads against them (RunTraining).
// Not thread-safe; for tests only. Failures are reported through gtest's EXPECT.
#ifndef DTRAIN_WORKER_TRAIN_TRAINER_TEST_UTIL_H_
#define DTRAIN_WORKER_TRAIN_TRAINER_TEST_UTIL_H_

#include <memory>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "ps/core/parameter_server.h"
#include "worker/train/trainer.h"

namespace dtrain::worker {

// In-process ps tasks (ps task i of num_ps) for `num_workers` workers, checkpointing as `checkpoint` says.
struct PsTasks {
  PsTasks(int num_ps, int num_workers, const ps::CheckpointOptions& checkpoint = {}) {
    for (int t = 0; t < num_ps; ++t) {
      ps::ParameterServerOptions po;
      po.task_index = t;
      po.num_ps = num_ps;
      po.num_workers = num_workers;
      po.checkpoint = checkpoint;
      servers.push_back(*ps::ParameterServer::Create(po));
      tasks.push_back(servers.back().get());
    }
  }
  std::vector<std::unique_ptr<ps::ParameterServer>> servers;
  std::vector<ps::PsInterface*> tasks;
};

// Runs `num_workers` workers (worker_id 0..num_workers-1, num_ps = tasks.size(), the rest from `base`) as threads
// against `tasks`; returns their results in worker order (an empty TrainingResult, with a test failure, for a
// worker whose RunTraining failed).
inline std::vector<TrainingResult> RunWorkers(const WorkerOptions& base, int num_workers,
                                              const std::vector<ps::PsInterface*>& tasks) {
  std::vector<absl::StatusOr<TrainingResult>> results(num_workers, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int w = 0; w < num_workers; ++w) {
    threads.emplace_back([&, w] {
      WorkerOptions o = base;
      o.worker_id = w;
      o.num_workers = num_workers;
      o.num_ps = static_cast<int>(tasks.size());
      results[w] = RunTraining(o, tasks);
    });
  }
  for (auto& t : threads) t.join();
  std::vector<TrainingResult> out;
  for (int w = 0; w < num_workers; ++w) {
    EXPECT_TRUE(results[w].ok()) << "worker " << w << ": " << results[w].status();
    out.push_back(results[w].ok() ? *std::move(results[w]) : TrainingResult{});
  }
  return out;
}

}  // namespace dtrain::worker

#endif  // DTRAIN_WORKER_TRAIN_TRAINER_TEST_UTIL_H_
