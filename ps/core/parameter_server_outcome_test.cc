// ParameterServer: how a run ends (TrainingOutcome and its summary line), and a run that ends early: the
// chief stopped or failed, a refused worker the run cannot do without, EndRun (dtrain_ps on SIGTERM). The ps
// tells waiting workers at once (JobEndedError) and saves its final checkpoint when the run ends.
#include <filesystem>
#include <future>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/env.h"
#include "gtest/gtest.h"
#include "ps/checkpoint/checkpoint_dir.h"
#include "ps/core/parameter_server.h"
#include "ps/testing/ps_test_util.h"

namespace dtrain::ps {
namespace {

using ::dtrain::ps::testing::InitializeSlices;
using ::dtrain::ps::testing::MakeConfig;
using ::dtrain::ps::testing::PullSlices;
using ::dtrain::ps::testing::PushSlices;

// One ps task and its workers, registered by hand (their sessions kept).
class OutcomeTest : public ::testing::Test {
 protected:
  void Start(int num_workers, const std::string& mode, int r, int64_t train_steps,
             std::string checkpoint_dir = "") {
    ParameterServerOptions o;
    o.num_workers = num_workers;
    o.checkpoint.dir = checkpoint_dir;
    absl::StatusOr<std::unique_ptr<ParameterServer>> ps = ParameterServer::Create(o);
    ASSERT_TRUE(ps.ok()) << ps.status();
    ps_ = *std::move(ps);
    config_ = MakeConfig(mode, num_workers, r);
    config_.slices = {{0, "w", 0, 2}};
    config_.train_steps = train_steps;
    config_.model_flags = {"model=mlp", "data_dir=/data"};
    sessions_.assign(num_workers, 0);
  }
  absl::Status Register(int worker) {
    RegisterRequest r;
    r.worker_id = worker;
    r.is_chief = worker == 0;
    r.config = config_;
    absl::StatusOr<RegisterResponse> got = ps_->Register(r);
    if (!got.ok()) return got.status();
    sessions_[worker] = got->session;
    if (worker == 0 && !got->initialized) return InitializeSlices(*ps_, 0, {{0, {1, 2}}});
    return absl::OkStatus();
  }
  absl::Status Push(int worker, int64_t step) {
    return PushSlices(*ps_, PushHeader{worker, step, NextId(), /*commit=*/true, sessions_[worker]},
                      {{0, {0.1f, 0.1f}}})
        .status();
  }
  absl::StatusOr<int64_t> Pull(int worker, int64_t min_step, int64_t timeout_ms = 10000) {
    PullRequest r;
    r.worker_id = worker;
    r.session = sessions_[worker];
    r.min_step = min_step;
    r.timeout_ms = timeout_ms;
    absl::StatusOr<testing::Pulled> p = PullSlices(*ps_, r);
    if (!p.ok()) return p.status();
    return p->header.step;
  }
  absl::Status Leave(int worker, Leaving leaving, int64_t step, std::string reason = "") {
    DoneRequest d;
    d.worker_id = worker;
    d.session = sessions_[worker];
    d.leaving = leaving;
    d.global_step = step;
    d.reason = std::move(reason);
    return ps_->Done(d);
  }
  // Sync steps with every worker in `workers` pushing, from `from` to `to`.
  void Steps(const std::vector<int>& workers, int64_t from, int64_t to) {
    for (int64_t s = from; s < to; ++s) {
      for (int w : workers) ASSERT_TRUE(Push(w, s).ok());
      for (int w : workers) ASSERT_TRUE(Pull(w, s + 1).ok());
    }
  }
  uint64_t NextId() { return ++id_; }
  // Two sync workers train 3 steps and both complete: the task finishes the run.
  void CompleteTwoWorkerRun() {
  Start(2, "sync", 0, 3);
  ASSERT_TRUE(Register(0).ok());
  ASSERT_TRUE(Register(1).ok());
  Steps({0, 1}, 0, 3);
  ASSERT_TRUE(Leave(1, Leaving::kCompleted, 3).ok());
  ASSERT_TRUE(Leave(0, Leaving::kCompleted, 3).ok());
  ASSERT_TRUE(ps_->finished());
  }

  std::unique_ptr<ParameterServer> ps_;
  TrainConfig config_;
  std::vector<uint64_t> sessions_;
  uint64_t id_ = 1000;
};

TEST_F(OutcomeTest, EveryWorkerCompletedIsComplete) {
  CompleteTwoWorkerRun();
  if (HasFatalFailure()) return;
  const TrainingOutcome o = ps_->outcome();
  EXPECT_EQ(o.kind, RunOutcome::kComplete);
  EXPECT_TRUE(o.succeeded);
  EXPECT_EQ(o.message, "run complete: training reached step 3 of 3; all 2 workers completed");
}

// A worker (here the chief, restarted after it was lost) that registers once the task has finished the run,
// while it lingers before exiting, is not taken back: it hears the run's outcome (RunOverError), and so does a
// chief's probe. tests/chaos.sh once caught a restarted chief registering 20 ms after the end, then retrying
// against the exited task until the trial's deadline.
TEST_F(OutcomeTest, ARegistrationAfterTheEndHearsTheOutcome) {
  CompleteTwoWorkerRun();
  if (HasFatalFailure()) return;
  for (int w : {0, 1}) {
    const absl::Status late = Register(w);
    EXPECT_EQ(late.code(), absl::StatusCode::kOutOfRange) << late;
    const std::optional<RunOver> over = ParseRunOver(late);
    ASSERT_TRUE(over.has_value()) << late;
    EXPECT_EQ(over->kind, RunOutcome::kComplete);
    EXPECT_EQ(over->global_step, 3);
    EXPECT_EQ(over->line, "run complete: training reached step 3 of 3; all 2 workers completed");
    EXPECT_FALSE(IsJobEnded(late));
  }
  const absl::Status probed = ps_->Probe(config_).status();
  ASSERT_TRUE(ParseRunOver(probed).has_value()) << probed;
  EXPECT_EQ(ps_->outcome().kind, RunOutcome::kComplete);  // unchanged by the late calls
}

TEST(RunOverTest, TheOutcomeCrossesATransportsPrefix) {
  for (RunOutcome kind : {RunOutcome::kComplete, RunOutcome::kDegraded, RunOutcome::kRefused, RunOutcome::kEndedEarly}) {
    const absl::Status s = RunOverError(kind, 120, "run ended early at step 120 of 300: the chief (worker 0) failed");
    const absl::Status wrapped(s.code(), absl::StrCat("ps task 1 (127.0.0.1:5000): ", s.message()));
    const std::optional<RunOver> over = ParseRunOver(wrapped);
    ASSERT_TRUE(over.has_value()) << wrapped;
    EXPECT_EQ(over->kind, kind);
    EXPECT_EQ(over->global_step, 120);
    EXPECT_EQ(over->line, "run ended early at step 120 of 300: the chief (worker 0) failed");
  }
  EXPECT_FALSE(ParseRunOver(JobEndedError("the chief failed")).has_value());
  EXPECT_FALSE(ParseRunOver(absl::OutOfRangeError("the run is over (sideways at step 3): x")).has_value());
  EXPECT_FALSE(ParseRunOver(absl::UnavailableError("the run is over (complete at step 3): x")).has_value());
}

// A worker stopped by a signal leaves at once: the sync steps after it need only the others (no lease to wait
// out), and the end is degraded, naming it, the step and the reason.
TEST_F(OutcomeTest, AStoppedWorkerLeavesAtOnceAndTheEndIsDegraded) {
  Start(3, "sync", 0, 4);
  for (int w = 0; w < 3; ++w) ASSERT_TRUE(Register(w).ok());
  Steps({0, 1, 2}, 0, 2);
  ASSERT_TRUE(Push(0, 2).ok());
  ASSERT_TRUE(Push(1, 2).ok());
  ASSERT_TRUE(Leave(2, Leaving::kStopped, 2, "SIGTERM at step 2").ok());  // decides step 2 without it
  const absl::StatusOr<int64_t> next = Pull(0, 3, /*timeout_ms=*/1000);
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(*next, 3);
  ASSERT_TRUE(Pull(1, 3).ok());
  Steps({0, 1}, 3, 4);
  ASSERT_TRUE(Leave(0, Leaving::kCompleted, 4).ok());
  ASSERT_TRUE(Leave(1, Leaving::kCompleted, 4).ok());
  const TrainingOutcome o = ps_->outcome();
  EXPECT_EQ(o.kind, RunOutcome::kDegraded);
  EXPECT_TRUE(o.succeeded);
  EXPECT_EQ(
      o.message,
      "run degraded: training reached step 4 of 4 without worker 2 (stopped at step 2: SIGTERM at step 2)");
  absl::StatusOr<TrainingStats> stats = ps_->GetStats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->workers[2].leaving, Leaving::kStopped);
  EXPECT_EQ(stats->workers[2].left_at_step, 2);
  EXPECT_TRUE(stats->job_ended.empty());
}

// The chief stopped (SIGTERM, after evaluating): the run ends there. A worker waiting for the next step hears
// it at once, every later call too, and the task saves its final checkpoint (holding the chief's model flags)
// before the others have left.
TEST_F(OutcomeTest, TheChiefStoppedEndsTheRunAndWakesTheWaitingWorker) {
  const std::string dir = ::testing::TempDir() + "/outcome_chief_stopped";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  Start(2, "sync", 0, 100, dir);
  ASSERT_TRUE(Register(0).ok());
  ASSERT_TRUE(Register(1).ok());
  Steps({0, 1}, 0, 2);
  ASSERT_TRUE(Push(1, 2).ok());
  std::future<absl::StatusOr<int64_t>> waiting =
      std::async(std::launch::async, [&] { return Pull(1, 3, 30000); });
  absl::SleepFor(absl::Milliseconds(100));
  const absl::Time stopped = absl::Now();
  ASSERT_TRUE(Leave(0, Leaving::kStopped, 2, "SIGTERM at step 2").ok());
  const absl::StatusOr<int64_t> heard = waiting.get();
  EXPECT_LT(absl::Now() - stopped, absl::Seconds(5));
  ASSERT_FALSE(heard.ok());
  EXPECT_TRUE(IsJobEnded(heard.status())) << heard.status();
  EXPECT_EQ(JobEndedReason(heard.status()), "the chief (worker 0) was stopped at step 2: SIGTERM at step 2");
  EXPECT_TRUE(IsJobEnded(Push(1, 2)));
  EXPECT_TRUE(IsJobEnded(ps_->Heartbeat(1, sessions_[1]).status()));
  EXPECT_FALSE(ps_->finished());  // worker 1 has not left yet
  // Step 2 was not decided: worker 1's commit alone would have made it (R shrank), but the run had ended.
  absl::StatusOr<std::vector<CheckpointFile>> files = ListCheckpointFiles(Env::Default(), dir);
  ASSERT_TRUE(files.ok());
  ASSERT_EQ(files->size(), 1u);
  EXPECT_EQ((*files)[0].step, 2);
  absl::StatusOr<CheckpointData> saved = ReadCheckpoint(Env::Default(), (*files)[0].path);
  ASSERT_TRUE(saved.ok());
  EXPECT_EQ(saved->model_flags, config_.model_flags);
  ASSERT_TRUE(Leave(1, Leaving::kPeerFailed, 2, JobEndedReason(heard.status())).ok());
  ASSERT_TRUE(ps_->finished());
  EXPECT_TRUE(ps_->final_checkpoint_status().ok());
  const TrainingOutcome o = ps_->outcome();
  EXPECT_EQ(o.kind, RunOutcome::kEndedEarly);
  EXPECT_EQ(
      o.message,
      "run ended early at step 2 of 100: the chief (worker 0) was stopped at step 2: SIGTERM at step 2");
}

// A worker refused for its configuration in sync mode with every worker aggregated: the run cannot complete,
// so it ends, as refused (every process exits 2).
TEST_F(OutcomeTest, ARefusedWorkerEndsASyncRunThatNeedsEveryWorker) {
  Start(2, "sync", 0, 10);
  ASSERT_TRUE(Register(0).ok());
  TrainConfig wrong = config_;
  wrong.optimizer.learning_rate = 0.25f;
  RegisterRequest r{1, false, wrong};
  const absl::Status refused = ps_->Register(r).status();
  ASSERT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  ASSERT_TRUE(Leave(1, Leaving::kRefused, 0, std::string(refused.message())).ok());
  const absl::StatusOr<int64_t> chief = Pull(0, 1, 30000);
  ASSERT_TRUE(IsJobEnded(chief.status())) << chief.status();
  EXPECT_TRUE(EndedByRefusal(JobEndedReason(chief.status())));
  EXPECT_TRUE(absl::StrContains(JobEndedReason(chief.status()), "learning_rate")) << chief.status();
  ASSERT_TRUE(Leave(0, Leaving::kPeerFailed, 0, JobEndedReason(chief.status())).ok());
  EXPECT_EQ(ps_->outcome().kind, RunOutcome::kRefused);
}

// The same refusal with R < all workers (or in async mode) only degrades the run: it goes on without the
// worker.
TEST_F(OutcomeTest, ARefusedWorkerOnlyDegradesARunThatCanGoOn) {
  Start(2, "async", 0, 2);
  ASSERT_TRUE(Register(0).ok());
  ASSERT_TRUE(Leave(1, Leaving::kRefused, 0, "num_workers mismatch").ok());
  for (int64_t s = 0; s < 2; ++s) {
    ASSERT_TRUE(Push(0, s).ok());
    ASSERT_TRUE(Pull(0, 0).ok());
  }
  ASSERT_TRUE(Leave(0, Leaving::kCompleted, 2).ok());
  const TrainingOutcome o = ps_->outcome();
  EXPECT_EQ(o.kind, RunOutcome::kDegraded);
  EXPECT_EQ(o.message,
            "run degraded: training reached step 2 of 2 without worker 1 (refused at step 0: num_workers "
            "mismatch)");
}

// The chief failed before it registered: a worker waiting for it hears so at once instead of waiting out
// --startup_wait_secs, and the task finishes once it left.
TEST_F(OutcomeTest, AWorkerWaitingForAChiefThatFailedHearsItAtOnce) {
  Start(2, "sync", 0, 10);
  RegisterRequest r{1, false, config_};
  EXPECT_EQ(ps_->Register(r).status().code(), absl::StatusCode::kUnavailable);  // waiting for the chief
  ASSERT_TRUE(Leave(0, Leaving::kFailed, 0, "cannot read /data: no such directory").ok());
  const absl::Status heard = ps_->Register(r).status();
  ASSERT_TRUE(IsJobEnded(heard)) << heard;
  EXPECT_EQ(JobEndedReason(heard),
            "the chief (worker 0) failed at step 0: cannot read /data: no such directory");
  ASSERT_TRUE(Leave(1, Leaving::kPeerFailed, 0, JobEndedReason(heard)).ok());
  ASSERT_TRUE(ps_->finished());
  EXPECT_EQ(ps_->outcome().kind, RunOutcome::kEndedEarly);
}

// dtrain_ps on SIGTERM: EndRun saves the final checkpoint before it returns and tells every worker.
TEST_F(OutcomeTest, EndRunSavesAndTellsTheWorkers) {
  const std::string dir = ::testing::TempDir() + "/outcome_end_run";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  Start(1, "sync", 0, 100, dir);
  ASSERT_TRUE(Register(0).ok());
  Steps({0}, 0, 3);
  ps_->EndRun("ps task 0 was stopped by SIGTERM at step 3");
  absl::StatusOr<std::vector<CheckpointFile>> files = ListCheckpointFiles(Env::Default(), dir);
  ASSERT_TRUE(files.ok());
  ASSERT_EQ(files->size(), 1u);
  EXPECT_EQ((*files)[0].step, 3);
  EXPECT_TRUE(IsJobEnded(Pull(0, 3).status()));
  ASSERT_TRUE(Leave(0, Leaving::kPeerFailed, 3, "ps task 0 was stopped by SIGTERM at step 3").ok());
  EXPECT_EQ(ps_->outcome().message,
            "run ended early at step 3 of 100: ps task 0 was stopped by SIGTERM at step 3");
}

// Async: pushes that arrive once the global step reached train_steps are too late; the run ends at exactly
// train_steps ("reached step 300 of 300", never 301), and the push accounting still balances.
TEST_F(OutcomeTest, AsyncStopsAtTrainStepsExactly) {
  Start(2, "async", 0, 3);
  ASSERT_TRUE(Register(0).ok());
  ASSERT_TRUE(Register(1).ok());
  for (int64_t s = 0; s < 2; ++s) ASSERT_TRUE(Push(0, s).ok());
  // Both workers computed at step 2; the second push would be step 4 of 3.
  ASSERT_TRUE(Push(0, 2).ok());
  ASSERT_TRUE(Push(1, 2).ok());
  EXPECT_EQ(ps_->step(), 3);
  ASSERT_TRUE(Leave(0, Leaving::kCompleted, 3).ok());
  ASSERT_TRUE(Leave(1, Leaving::kCompleted, 3).ok());
  EXPECT_EQ(ps_->outcome().message, "run complete: training reached step 3 of 3; all 2 workers completed");
  const PushAccounting a = ps_->accounting();
  EXPECT_EQ(a.dropped_stale, 1);
  EXPECT_TRUE(a.Balanced()) << a.DebugString();
}

TEST(SummarizeRunTest, LinesAndKinds) {
  std::vector<WorkerStats> w(3);
  for (int i = 0; i < 3; ++i) {
    w[i].worker_id = i;
    w[i].done = true;
  }
  std::string line;
  EXPECT_EQ(SummarizeRun(w, 300, 300, "", &line), RunOutcome::kComplete);
  EXPECT_EQ(line, "run complete: training reached step 300 of 300; all 3 workers completed");
  w[1].done = false;
  w[1].lost = true;
  w[1].left_at_step = 120;
  w[1].reason = "no contact for 20s";
  EXPECT_EQ(SummarizeRun(w, 300, 300, "", &line), RunOutcome::kDegraded);
  EXPECT_EQ(line,
            "run degraded: training reached step 300 of 300 without worker 1 (lost at step 120: no contact "
            "for 20s)");
  // Lost once step 300 was reached, but last present at step 120 (its lease ran out late): still degraded.
  w[1].present_at_step = 120;
  w[1].left_at_step = 300;
  EXPECT_EQ(SummarizeRun(w, 300, 300, "", &line), RunOutcome::kDegraded);
  // Last present at step 300 (a ps task restarted after the end, never heard its done): complete.
  w[1].present_at_step = 300;
  EXPECT_EQ(SummarizeRun(w, 300, 300, "", &line), RunOutcome::kComplete);
  EXPECT_EQ(line,
            "run complete: training reached step 300 of 300; worker 1 not heard from after the last step (no "
            "step was trained without it)");
  w[2].done = false;
  w[2].lost = true;
  w[2].left_at_step = 200;
  EXPECT_EQ(SummarizeRun(w, 300, 300, "", &line), RunOutcome::kDegraded);
  EXPECT_EQ(line, "run degraded: training reached step 300 of 300 without worker 2 (lost at step 200)");
  w[2].done = true;
  w[2].lost = false;
  w[2].left_at_step = -1;
  w[1].left_at_step = 120;
  w[1].present_at_step = -1;
  EXPECT_EQ(SummarizeRun(w, 120, 300, "the chief (worker 0) failed at step 120: disk full", &line),
            RunOutcome::kEndedEarly);
  EXPECT_EQ(line, "run ended early at step 120 of 300: the chief (worker 0) failed at step 120: disk full");
  EXPECT_EQ(SummarizeRun(w, 0, 300, std::string(kConfigurationRefused) + "worker 1: mismatch", &line),
            RunOutcome::kRefused);
  for (WorkerStats& s : w) {
    s.done = true;
    s.failed = true;
    s.lost = false;
  }
  EXPECT_EQ(SummarizeRun(w, 50, 300, "", &line), RunOutcome::kEndedEarly);
  EXPECT_TRUE(absl::StartsWith(line, "run ended early at step 50 of 300: no worker is left to complete it"))
      << line;
}

}  // namespace
}  // namespace dtrain::ps
