// The training loop against in-process parameter servers (no sockets): sync equivalence with local mode, async
// accounting with retried pushes, and several ps tasks.
#include "worker/train/trainer.h"
#include "worker/train/trainer_test_util.h"

#include <csignal>
#include <cmath>
#include <filesystem>
#include <unistd.h>
#include <fstream>
#include <memory>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

#include "common/denormals.h"
#include "common/env.h"
#include "common/exit_codes.h"
#include "common/testing/fault_injection_env.h"
#include "common/testing/relative_difference.h"
#include "ps/testing/fault_injecting_ps.h"
#include "ps/core/parameter_server.h"
#include "worker/data/synthetic_data.h"

namespace dtrain::worker {
namespace {

using ::dtrain::testing::RelativeDifference;

// The exit code of a failed run tells what happened, signal or not: a run that failed elsewhere while this worker
// was being stopped is a failure (4), one that ended for the stop is the stop (128 + signal).
TEST(TrainerTest, FailedRunExitCodeKeepsAFailureAFailureUnderASignal) {
  const absl::Status failed_elsewhere = ps::JobEndedError("the chief (worker 0) failed at step 5: out of memory");
  EXPECT_EQ(FailedRunExitCode(failed_elsewhere, SIGTERM), kExitPeerFailed);
  EXPECT_EQ(FailedRunExitCode(failed_elsewhere, 0), kExitPeerFailed);
  EXPECT_EQ(FailedRunExitCode(ps::JobEndedError("ps task 0 was stopped by SIGTERM at step 5"), SIGTERM),
            ExitCodeForSignal(SIGTERM));
  EXPECT_EQ(FailedRunExitCode(ps::JobEndedError("the chief (worker 0) was stopped at step 5: SIGINT"), SIGINT),
            ExitCodeForSignal(SIGINT));
  EXPECT_EQ(FailedRunExitCode(ps::JobEndedError(absl::StrCat(ps::kConfigurationRefused, "worker 1: bad")), SIGTERM),
            kExitConfigRefused);
  EXPECT_EQ(FailedRunExitCode(absl::InvalidArgumentError("--batch_size=0"), 0), kExitConfigRefused);
  EXPECT_EQ(FailedRunExitCode(absl::InternalError("loss is nan"), 0), kExitError);
}

TEST(TrainerTest, LocalModeTrains) {
  const data::DatasetPair data = MakeSyntheticDataset(2000, 500);
  WorkerOptions o = QuietTrainingOptions(&data);
  o.batch_size = 50;
  o.train_steps = 150;
  o.shuffle = true;
  o.evaluate = true;
  o.log_every = 50;
  o.logdir = ::testing::TempDir() + "/trainer_test_events";
  std::filesystem::remove_all(o.logdir);
  absl::StatusOr<TrainingResult> r = RunTraining(o, {});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->global_step, 150);
  EXPECT_EQ(r->local_steps, 150);
  EXPECT_GT(r->test_accuracy, 0.9);
  // The chief wrote TensorBoard events (3 loss points + accuracy, after the file-version record).
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(o.logdir)) {
    EXPECT_EQ(e.path().filename().string().rfind("events.out.tfevents.", 0), 0u);
    EXPECT_GT(std::filesystem::file_size(e.path()), 100u);
    ++files;
  }
  EXPECT_EQ(files, 1);
}

// 1 ps + 2 workers in sync mode, batch b each, equal local mode with batch 2b over the same examples.
// With `shm`, the workers reach the tasks through the shared-memory data plane, their buffers read and written
// in place.
void CheckSyncEquivalence(int num_ps, bool shm = false) {
  const data::DatasetPair data = MakeSyntheticDataset(1000, 100);
  const int b = 20, k = 12;
  WorkerOptions local = QuietTrainingOptions(&data);
  local.batch_size = 2 * b;
  local.train_steps = k;
  absl::StatusOr<TrainingResult> expected = RunTraining(local, {});
  ASSERT_TRUE(expected.ok()) << expected.status();

  PsTasks ps_tasks(num_ps, 2);
  std::vector<std::unique_ptr<ps::ParameterServer>>& servers = ps_tasks.servers;
  const std::vector<ps::PsInterface*>& tasks = ps_tasks.tasks;
  WorkerOptions o = QuietTrainingOptions(&data);
  o.batch_size = b;
  o.train_steps = k;
  o.mode = "sync";
  std::unique_ptr<ShmFront> front = shm ? std::make_unique<ShmFront>(tasks, 2) : nullptr;
  std::vector<TrainingResult> got = RunWorkers(o, 2, tasks, front.get());
  if (shm) {  // every step went through shared memory, in place
    EXPECT_EQ(front->counters.shm_pushes.load(), 2 * k * num_ps);
    EXPECT_EQ(front->counters.control_pushes.load(), 0);
    EXPECT_EQ(front->counters.bytes_staged.load(), 0);
    EXPECT_GT(front->counters.bytes_in_place.load(), 0);
    front.reset();
  }
  ASSERT_EQ(got[0].global_step, k);
  ASSERT_EQ(got[0].parameters.size(), expected->parameters.size());
  const double rel = RelativeDifference(got[0].parameters, expected->parameters);
  EXPECT_LE(rel, 1e-5) << "sync 2 workers vs local differ by " << rel;
  // And training did move the parameters (the comparison is not vacuous).
  WorkerOptions untrained = local;
  untrained.train_steps = 1;
  absl::StatusOr<TrainingResult> one = RunTraining(untrained, {});
  ASSERT_TRUE(one.ok());
  EXPECT_GT(RelativeDifference(one->parameters, expected->parameters), 1e-3);
  for (auto& s : servers) EXPECT_TRUE(s->finished());
}

TEST(TrainerTest, SyncTwoWorkersEqualsLocalDoubleBatch) { CheckSyncEquivalence(1); }
TEST(TrainerTest, SyncTwoWorkersOverSharedMemoryEqualLocalDoubleBatch) {
  CheckSyncEquivalence(1, /*shm=*/true);
  CheckSyncEquivalence(2, /*shm=*/true);
}

// One worker against a ps task through the overlapped client (transfer threads, the next pull sent right behind
// the commit) trains exactly like local mode: the pull never overtakes the commit it depends on.
TEST(TrainerTest, OneWorkerClusterEqualsLocal) {
  const data::DatasetPair data = MakeSyntheticDataset(1000, 100);
  WorkerOptions o = QuietTrainingOptions(&data);
  o.batch_size = 20;
  o.train_steps = 30;
  absl::StatusOr<TrainingResult> local = RunTraining(o, {});
  ASSERT_TRUE(local.ok()) << local.status();
  for (int ps_tasks : {1, 2}) {
    PsTasks cluster(ps_tasks, 1);
    std::vector<TrainingResult> got = RunWorkers(o, 1, cluster.tasks);
    EXPECT_EQ(got[0].global_step, 30);
    EXPECT_EQ(got[0].local_steps, 30) << "a step was computed twice on stale parameters";
    EXPECT_EQ(got[0].parameters, local->parameters) << ps_tasks << " ps tasks";
  }
}

TEST(TrainerTest, SyncTwoWorkersTwoPsEqualsLocalDoubleBatch) { CheckSyncEquivalence(2); }

// A chief started again after the run was over (its task only lingers before exiting) ends with the run's
// outcome at once, without training (were it to export ONNX, degraded: that file is not made).
TEST(TrainerTest, AChiefThatComesBackAfterTheEndTakesTheRunsOutcome) {
  const data::DatasetPair data = MakeSyntheticDataset(200, 50);
  WorkerOptions o = QuietTrainingOptions(&data);
  o.batch_size = 10;
  o.train_steps = 5;
  PsTasks cluster(1, 1);
  ASSERT_EQ(RunWorkers(o, 1, cluster.tasks)[0].global_step, 5);
  absl::StatusOr<TrainingResult> again = RunTraining(o, cluster.tasks);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->outcome, ps::RunOutcome::kComplete);
  EXPECT_EQ(again->global_step, 5);
  EXPECT_EQ(again->local_steps, 0);
  EXPECT_TRUE(absl::StrContains(again->outcome_line, "came back after the run was over (run complete"))
      << again->outcome_line;
}

// Local mode: a final checkpoint that cannot be written (a full disk, every retry) fails the run, saying so.
TEST(TrainerTest, LocalModeFailsWhenTheFinalCheckpointIsNotSaved) {
  const data::DatasetPair data = MakeSyntheticDataset(200, 50);
  dtrain::testing::FaultInjectionEnv env(Env::Default());
  WorkerOptions o = QuietTrainingOptions(&data);
  o.batch_size = 20;
  o.train_steps = 5;
  o.checkpoint.dir = absl::StrCat(::testing::TempDir(), "/trainer_full_disk_", getpid());
  o.checkpoint.env = &env;
  std::filesystem::remove_all(o.checkpoint.dir);
  env.FailWritesAfter(100);
  absl::StatusOr<TrainingResult> r = RunTraining(o, {});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status();
  EXPECT_NE(r.status().message().find("final checkpoint was not saved"), std::string::npos) << r.status();
  // With room on the disk the same run succeeds.
  env.ClearFaults();
  EXPECT_TRUE(RunTraining(o, {}).ok());
  std::filesystem::remove_all(o.checkpoint.dir);
}

// A run stopped at step 17 and started again from its checkpoint equals one that never stopped: the checkpoint
// holds each worker's input position (epoch, offset; shuffled, across epoch boundaries) and dropout's masks
// follow the step. Local mode (host and device-resident steps) and a 2-worker, 2-ps sync cluster.
TEST(TrainerTest, StopAndResumeEqualsUninterrupted) {
  const data::DatasetPair data = MakeSyntheticDataset(200, 50);
  struct Case {
    const char* name;
    int workers;  // 0: local mode
    bool in_place;
  };
  for (const Case& c : {Case{"local", 0, true}, Case{"local, device-resident steps", 0, false},
                        Case{"sync cluster", 2, true}}) {
    SCOPED_TRACE(c.name);
    const std::string dir = absl::StrCat(::testing::TempDir(), "/trainer_resume_", getpid());
    auto run = [&](const std::string& ckpt, int64_t steps) -> TrainingResult {
      WorkerOptions o = QuietTrainingOptions(&data);
      o.model = "cnn";  // dropout
      o.batch_size = 8;
      o.shuffle = true;
      o.train_steps = steps;
      o.cpu_towers_in_place = c.in_place;
      if (c.workers == 0) {
        o.checkpoint.dir = ckpt;
        o.checkpoint.save_steps = 5;
        absl::StatusOr<TrainingResult> r = RunTraining(o, {});
        EXPECT_TRUE(r.ok()) << r.status();
        return r.ok() ? *r : TrainingResult{};
      }
      // A fresh set of ps tasks over the same directory: a restarted cluster.
      ps::CheckpointOptions checkpoint;
      checkpoint.dir = ckpt;
      checkpoint.save_steps = 5;
      PsTasks cluster(2, c.workers, checkpoint);
      return RunWorkers(o, c.workers, cluster.tasks)[0];
    };
    std::filesystem::remove_all(dir);
    const TrainingResult uninterrupted = run(dir + "/a", 30);
    const TrainingResult first = run(dir + "/b", 17);
    EXPECT_EQ(first.global_step, 17);
    const TrainingResult resumed = run(dir + "/b", 30);
    EXPECT_EQ(resumed.first_step, 17);
    EXPECT_EQ(resumed.global_step, 30);
    ASSERT_EQ(uninterrupted.parameters.size(), resumed.parameters.size());
    EXPECT_EQ(resumed.parameters, uninterrupted.parameters);
    // Not vacuous: the steps after 17 moved the parameters.
    EXPECT_NE(first.parameters, uninterrupted.parameters);
    std::filesystem::remove_all(dir);
  }
}

// A ps task that is killed and started again (a fresh ParameterServer over the same checkpoint directory) when
// the chief asks for the newest parameters after the last step: the new instance has no config and answers
// Aborted.
class RestartsAtTheFinalPull : public ps::PsInterface {
 public:
  RestartsAtTheFinalPull(ps::ParameterServerOptions options, int64_t last_step)
      : options_(std::move(options)), last_step_(last_step), ps_(*ps::ParameterServer::Create(options_)) {}
  bool restarted() {
    absl::MutexLock lock(&mu_);
    return restarted_;
  }
  std::shared_ptr<ps::ParameterServer> current() {
    absl::MutexLock lock(&mu_);
    return ps_;
  }

  absl::StatusOr<ps::RegisterResponse> Register(const ps::RegisterRequest& r) override {
    return current()->Register(r);
  }
  absl::StatusOr<std::unique_ptr<ps::SliceUpload>> StartInitialize(int w) override {
    return current()->StartInitialize(w);
  }
  absl::StatusOr<std::unique_ptr<ps::SliceUpload>> StartPush(const ps::PushHeader& h) override {
    return current()->StartPush(h);
  }
  absl::Status Pull(const ps::PullRequest& r, ps::PullReceiver* receiver) override {
    {
      absl::MutexLock lock(&mu_);
      // The chief's final pull (StepRunner::PullNewest): no step to wait for, decisions since the last one.
      if (!restarted_ && r.min_step == 0 && r.since_step >= last_step_) {
        ps_ = *ps::ParameterServer::Create(options_);
        restarted_ = true;
      }
    }
    return current()->Pull(r, receiver);
  }
  absl::Status Done(const ps::DoneRequest& request) override {
    return current()->Done(request);
  }
  absl::StatusOr<int64_t> Heartbeat(int w, uint64_t session) override { return current()->Heartbeat(w, session); }
  absl::StatusOr<ps::TrainingStats> GetStats() override { return current()->GetStats(); }
  absl::StatusOr<ps::CheckpointProbe> Probe(const ps::TrainConfig& c) override { return current()->Probe(c); }
  absl::Status Restore(const ps::TrainConfig& c, int w, int64_t step) override {
    return current()->Restore(c, w, step);
  }

 private:
  const ps::ParameterServerOptions options_;
  const int64_t last_step_;
  absl::Mutex mu_;
  bool restarted_ ABSL_GUARDED_BY(mu_) = false;
  std::shared_ptr<ps::ParameterServer> ps_ ABSL_GUARDED_BY(mu_);
};

// The ps task dies after the last step, before the chief has pulled the final parameters: the chief connects
// again, restores the newest checkpoint on the new process (the last step's) and ends with the parameters of a
// run without the restart; the new process finishes with a successful outcome.
TEST(TrainerTest, ChiefRecoversFromAPsRestartAfterTheLastStep) {
  const data::DatasetPair data = MakeSyntheticDataset(200, 50);
  WorkerOptions o = QuietTrainingOptions(&data);
  o.batch_size = 10;
  o.train_steps = 20;
  const std::string dir = absl::StrCat(::testing::TempDir(), "/trainer_final_pull_", getpid());
  std::filesystem::remove_all(dir);
  ps::ParameterServerOptions po;
  po.checkpoint.dir = dir;
  po.checkpoint.save_steps = 10;
  RestartsAtTheFinalPull flaky(po, o.train_steps);
  const TrainingResult got = RunWorkers(o, 1, {&flaky})[0];
  EXPECT_TRUE(flaky.restarted());
  EXPECT_EQ(got.global_step, 20);
  std::shared_ptr<ps::ParameterServer> now = flaky.current();
  EXPECT_TRUE(now->finished());
  EXPECT_TRUE(now->outcome().succeeded) << now->outcome().message;
  EXPECT_TRUE(now->final_checkpoint_status().ok()) << now->final_checkpoint_status();

  PsTasks plain(1, 1);
  const TrainingResult want = RunWorkers(o, 1, plain.tasks)[0];
  ASSERT_EQ(want.global_step, 20);
  EXPECT_EQ(got.parameters, want.parameters);
  EXPECT_EQ(got.first_step, 0);
  std::filesystem::remove_all(dir);
}

// The GPU worker's cluster step (models owning their buffers: each layer's parameters uploaded as the pull
// brings them, each layer's averaged gradients downloaded and pushed as soon as they are final), run here on
// CPU towers against ps tasks behind the overlapped client's transfer threads, trains exactly like the
// host-resident towers, for one and two towers and one and two ps tasks.
TEST(TrainerTest, ClusterWorkerWithDeviceOwnedTowersEqualsHostResident) {
  const data::DatasetPair data = MakeSyntheticDataset(1000, 100);
  for (int towers : {1, 2}) {
    for (int ps_tasks : {1, 2}) {
      SCOPED_TRACE(::testing::Message() << towers << " towers, " << ps_tasks << " ps tasks");
      auto run = [&](bool in_place) {
        PsTasks cluster(ps_tasks, 1);
        WorkerOptions o = QuietTrainingOptions(&data);
        o.model = "cnn";
        o.batch_size = 8;
        o.train_steps = 12;
        o.towers = std::to_string(towers);
        o.threads = towers;
        o.cpu_towers_in_place = in_place;
        return RunWorkers(o, 1, cluster.tasks)[0];
      };
      const TrainingResult host = run(true);
      const TrainingResult device = run(false);
      EXPECT_EQ(device.global_step, 12);
      EXPECT_EQ(device.losses, host.losses);
      EXPECT_EQ(device.parameters, host.parameters);
    }
  }
}

TEST(TrainerTest, AsyncGlobalStepCountsAppliedPushesEvenWithRetries) {
  const data::DatasetPair data = MakeSyntheticDataset(1000, 100);
  ps::ParameterServerOptions po;
  po.num_workers = 2;
  std::unique_ptr<ps::ParameterServer> server = *ps::ParameterServer::Create(po);
  ps::FaultInjectingPs::Faults faults;
  faults.duplicate_pushes = true;  // every push arrives twice
  ps::FaultInjectingPs flaky(server.get(), faults);
  WorkerOptions o = QuietTrainingOptions(&data);
  o.batch_size = 20;
  o.train_steps = 40;
  o.mode = "async";
  std::vector<TrainingResult> got = RunWorkers(o, 2, {&flaky});
  absl::StatusOr<ps::TrainingStats> stats = server->GetStats();
  ASSERT_TRUE(stats.ok());
  int64_t applied = 0, duplicates = 0;
  for (const auto& w : stats->workers) {
    applied += w.applied;
    duplicates += w.duplicates;
  }
  EXPECT_EQ(stats->global_step, applied);
  // Every local step's push was applied once, except that async ends at train_steps exactly: one worker's last
  // push may come after the end and be refused.
  EXPECT_LE(applied, got[0].local_steps + got[1].local_steps);
  EXPECT_GE(applied + 1, got[0].local_steps + got[1].local_steps);
  EXPECT_EQ(duplicates, flaky.pushes());  // every second delivery was recognized
  EXPECT_GE(stats->global_step, 40);
  EXPECT_LE(stats->global_step, 41);  // each worker may finish one push past the target
}

// The training loop's thread computes with flush-to-zero and denormals-are-zero (RunTraining sets them).
TEST(TrainerTest, TrainingLoopThreadFlushesDenormals) {
  const data::DatasetPair data = MakeSyntheticDataset(200, 100);
  WorkerOptions o = QuietTrainingOptions(&data);
  o.batch_size = 20;
  o.train_steps = 2;
  std::thread t([&] {
    ClearFlushDenormals();  // inherited from a thread that ran training before
    ASSERT_FALSE(FlushDenormalsEnabled());
    absl::StatusOr<TrainingResult> r = RunTraining(o, {});
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(FlushDenormalsEnabled());
  });
  t.join();
}

// Mean of losses[begin, end).
double MeanLoss(const std::vector<float>& l, size_t begin, size_t end) {
  double sum = 0;
  for (size_t i = begin; i < end; ++i) sum += l[i];
  return sum / (end - begin);
}

// The conv net trains with falling loss (local mode, synthetic MNIST-shaped data).
TEST(TrainerTest, ConvnetLossFalls) {
  const data::DatasetPair data = MakeSyntheticDataset(400, 50);
  WorkerOptions o = QuietTrainingOptions(&data);
  o.model = "convnet";
  o.optimizer = "";  // the model's default (Adam 1e-3)
  o.learning_rate = 0;
  o.batch_size = 16;
  o.train_steps = 24;
  o.shuffle = true;
  absl::StatusOr<TrainingResult> r = RunTraining(o, {});
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->losses.size(), 24u);
  EXPECT_LT(MeanLoss(r->losses, 16, 24), 0.7 * MeanLoss(r->losses, 0, 8));
}

// The CIFAR-10 net reads CIFAR-10 binary files (generated here in the real format), trains on distorted
// 24x24 crops with falling loss, and evaluates on central crops.
TEST(TrainerTest, Cifar10FromBinaryFilesLossFalls) {
  const std::string dir = ::testing::TempDir() + "/trainer_test_cifar";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const data::DatasetPair synth = MakeSyntheticDataset(600, 100, 11, 32, 32, 3);
  auto write = [](const std::string& path, const data::Dataset& d) {
    std::string bytes;
    for (int64_t i = 0; i < d.count(); ++i) {
      bytes.push_back(static_cast<char>(d.labels[i]));
      const uint8_t* img = d.pixels.data() + i * d.image_size();
      for (int c = 0; c < 3; ++c) {
        for (int p = 0; p < 32 * 32; ++p) bytes.push_back(static_cast<char>(img[p * 3 + c]));
      }
    }
    std::ofstream(path, std::ios::binary) << bytes;
  };
  write(dir + "/data_batch_1.bin", synth.train);
  write(dir + "/test_batch.bin", synth.test);

  WorkerOptions o = QuietTrainingOptions(nullptr);
  o.dataset = nullptr;
  o.data_dir = dir;
  o.model = "cifar10";
  o.optimizer = "";
  o.learning_rate = 0;
  o.batch_size = 32;
  o.train_steps = 150;
  o.shuffle = true;
  o.evaluate = true;
  absl::StatusOr<TrainingResult> r = RunTraining(o, {});
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->losses.size(), 150u);
  // The tutorial's loss (cross-entropy + weight decay) starts near 4.7 and falls slowly at lr 0.1.
  EXPECT_LT(MeanLoss(r->losses, 125, 150), 0.95 * MeanLoss(r->losses, 0, 25));
  // 10 classes: chance is 0.1, and a guesser reaches 0.2 of these 100 test images with probability ~0.2%. (The
  // trajectory depends on the ISA oneDNN's kernels use: 0.27 on an AVX2-only AMD EPYC, above 0.3 on AVX-512 Xeons.)
  EXPECT_GT(r->test_accuracy, 0.2);
}

}  // namespace
}  // namespace dtrain::worker
