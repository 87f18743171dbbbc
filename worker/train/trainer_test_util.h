// Test helpers for trainer tests: in-process ps tasks and workers run as threads against them (RunTraining).
// Not thread-safe; for tests only. Failures are reported through gtest's EXPECT.
#ifndef DTRAIN_WORKER_TRAIN_TRAINER_TEST_UTIL_H_
#define DTRAIN_WORKER_TRAIN_TRAINER_TEST_UTIL_H_

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "ps/core/parameter_server.h"
#include "ps/shm/shm_ps_client.h"
#include "ps/shm/shm_server.h"
#include "ps/testing/fault_injecting_ps.h"
#include "worker/train/trainer.h"

namespace dtrain::worker {

// The options the trainer tests start from: `model` over `data` in order, plain SGD at 0.1, quiet, without the
// chief's evaluation at the end; 30 s to wait for the ps tasks (a loaded CI machine).
inline WorkerOptions QuietTrainingOptions(const data::DatasetPair* data, const std::string& model = "mlp") {
  WorkerOptions o;
  o.model = model;
  o.dataset = data;
  o.shuffle = false;
  o.optimizer = "sgd";
  o.learning_rate = 0.1f;
  o.quiet = true;
  o.evaluate = false;
  o.startup_wait_secs = 30;
  return o;
}

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

// `tasks` behind the shared-memory data plane (ps/shm/), as dtrain_ps and dtrain_worker use it on one host: a
// ShmServer per task and, for each worker, its own shm clients (shared memory required; the control calls go to
// the task directly instead of over gRPC). Build it after the tasks, destroy it before them.
struct ShmFront {
  ShmFront(const std::vector<ps::PsInterface*>& tasks, int num_workers) {
    for (size_t t = 0; t < tasks.size(); ++t) {
      ps::shm::ShmServerOptions so;
      so.task_index = static_cast<int>(t);
      absl::StatusOr<std::unique_ptr<ps::shm::ShmServer>> server = ps::shm::ShmServer::Start(tasks[t], so);
      EXPECT_TRUE(server.ok()) << server.status();
      servers.push_back(server.ok() ? std::move(*server) : nullptr);
    }
    tasks_of_worker.resize(num_workers);
    for (int w = 0; w < num_workers; ++w) {
      for (size_t t = 0; t < tasks.size(); ++t) {
        ps::shm::ShmClientOptions co;
        co.required = true;
        co.task = static_cast<int>(t);
        co.address = "in-process";
        co.counters = &counters;
        ps::shm::ShmServer* server = servers[t].get();
        clients.push_back(ps::shm::NewShmPsClient(
            std::make_unique<ps::FaultInjectingPs>(tasks[t], ps::FaultInjectingPs::Faults{}),
            [server](const ps::shm::ShmAttachRequest& r) { return server->Offer(r); }, co));
        tasks_of_worker[w].push_back(clients.back().get());
      }
    }
  }
  std::vector<std::unique_ptr<ps::shm::ShmServer>> servers;
  std::vector<std::unique_ptr<ps::PsInterface>> clients;
  std::vector<std::vector<ps::PsInterface*>> tasks_of_worker;
  ps::shm::ShmCounters counters;
};

// Runs `num_workers` workers (worker_id 0..num_workers-1, num_ps = tasks.size(), the rest from `base`) as threads
// against `tasks` (through `shm` when given, their buffers in shared memory); returns their results in worker
// order (an empty TrainingResult, with a test failure, for a worker whose RunTraining failed).
inline std::vector<TrainingResult> RunWorkers(const WorkerOptions& base, int num_workers,
                                              const std::vector<ps::PsInterface*>& tasks,
                                              ShmFront* shm = nullptr) {
  std::vector<absl::StatusOr<TrainingResult>> results(num_workers, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int w = 0; w < num_workers; ++w) {
    threads.emplace_back([&, w] {
      WorkerOptions o = base;
      o.worker_id = w;
      o.num_workers = num_workers;
      o.num_ps = static_cast<int>(tasks.size());
      if (shm != nullptr) o.host_memory = ps::shm::SharedHostMemory::Default();
      results[w] = RunTraining(o, shm != nullptr ? shm->tasks_of_worker[w] : tasks);
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
