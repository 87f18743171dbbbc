// ParameterServer with checkpoints: saving on schedule, keep-N, restore before Register answers (with the
// fallback past a corrupt file and the refusal of another model's checkpoint), and resume equivalence: training
// k1 steps, destroying the servers and resuming to k2 gives exactly the parameters of an uninterrupted run.
#include <atomic>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/synchronization/notification.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "common/env.h"
#include "common/testing/fault_injection_env.h"
#include "ps/checkpoint/checkpoint_dir.h"
#include "ps/checkpoint/checkpoint_test_util.h"
#include "ps/core/parameter_server.h"
#include "ps/testing/ps_test_util.h"

namespace dtrain::ps {
namespace {

using ::dtrain::ps::testing::LogCapture;
using ::dtrain::ps::testing::MakeConfig;
using ::dtrain::ps::testing::ScratchDir;
using ::dtrain::ps::testing::SimCluster;
using ::dtrain::ps::testing::SimClusterOptions;
using ::dtrain::ps::testing::SimWorker;
using ::dtrain::ps::testing::TestGradient;

constexpr int kWorkers = 2;

SimClusterOptions Options(int num_ps, const std::string& dir, const std::string& optimizer = "adam") {
  SimClusterOptions o;
  o.variables = {{"conv/w", 40}, {"conv/b", 4}, {"fc/w", 300}, {"fc/b", 6}};
  o.num_ps = num_ps;
  o.placement.min_slice_bytes = 400;  // fc/w (1200 bytes) is partitioned over the tasks
  o.config = MakeConfig("sync", kWorkers, kWorkers, /*learning_rate=*/0.05f);
  o.config.optimizer.name = optimizer;
  o.config.optimizer.decay_steps = 7;  // the schedule depends on the restored step
  o.config.optimizer.decay_rate = 0.9f;
  o.config.moving_average_decay = 0.9f;
  o.initial.resize(350);
  for (size_t i = 0; i < o.initial.size(); ++i) o.initial[i] = 0.01f * static_cast<float>(i % 17) - 0.05f;
  o.checkpoint.dir = dir;
  o.checkpoint.save_steps = 5;
  return o;
}

// Sync steps [from, to) in lockstep on one thread: every worker pushes, then every worker pulls. The
// gradients depend only on (worker, step, parameters), so the run is deterministic.
// `after_step` (if set) runs after each step with the new global step.
void RunSteps(SimCluster* cluster, int64_t from, int64_t to,
              const std::function<void(int64_t)>& after_step = nullptr) {
  std::vector<SimWorker> workers;
  std::vector<std::vector<float>> params(kWorkers);
  for (int w = 0; w < kWorkers; ++w) {
    workers.emplace_back(cluster, w);
    absl::StatusOr<int64_t> step = workers[w].Pull(0, 0, &params[w]);
    ASSERT_TRUE(step.ok()) << step.status();
    ASSERT_EQ(*step, from);
  }
  for (int64_t s = from; s < to; ++s) {
    for (int w = 0; w < kWorkers; ++w) {
      absl::StatusOr<PushResponse::Outcome> o = workers[w].Push(s, TestGradient(w, s, params[w]));
      ASSERT_TRUE(o.ok()) << o.status();
      ASSERT_EQ(*o, PushResponse::Outcome::kAccepted);
    }
    for (int w = 0; w < kWorkers; ++w) {
      absl::StatusOr<int64_t> step = workers[w].Pull(s + 1, s, &params[w]);
      ASSERT_TRUE(step.ok()) << step.status();
      ASSERT_EQ(*step, s + 1);
    }
    if (after_step) after_step(s + 1);
  }
}

void FinishTraining(SimCluster* cluster) {
  for (int w = 0; w < kWorkers; ++w) ASSERT_TRUE(SimWorker(cluster, w).Done().ok());
  for (int t = 0; t < cluster->num_ps(); ++t) {
    EXPECT_TRUE(cluster->task(t).finished());
    EXPECT_TRUE(cluster->task(t).final_checkpoint_status().ok()) << cluster->task(t).final_checkpoint_status();
  }
}

// Values (or moving averages) of every task, as a flat buffer.
std::vector<float> Flat(SimCluster* cluster, bool moving_averages) {
  std::vector<float> flat;
  for (int t = 0; t < cluster->num_ps(); ++t) {
    PullRequest request;
    request.session = cluster->Session(t, 0);
    request.moving_averages = moving_averages;
    absl::StatusOr<testing::Pulled> r = testing::PullSlices(cluster->task(t), request);
    EXPECT_TRUE(r.ok()) << r.status();
    if (r.ok()) cluster->Scatter(r->slices, &flat);
  }
  return flat;
}

// Steps of the checkpoint files of each task.
std::map<int, std::set<int64_t>> StepsOnDisk(const std::string& dir) {
  std::map<int, std::set<int64_t>> steps;
  absl::StatusOr<std::vector<CheckpointFile>> files = ListCheckpointFiles(Env::Default(), dir);
  EXPECT_TRUE(files.ok()) << files.status();
  if (files.ok()) {
    for (const CheckpointFile& f : *files) steps[f.task].insert(f.step);
  }
  return steps;
}

class ResumeTest : public ::testing::TestWithParam<int> {};

TEST_P(ResumeTest, ResumedRunEqualsUninterruptedRun) {
  const int num_ps = GetParam();
  constexpr int64_t kStop = 13, kEnd = 24;  // the newest checkpoint before the "crash" is step 10

  ScratchDir reference_dir("resume_ref");
  auto reference = SimCluster::Start(Options(num_ps, reference_dir.path()));
  ASSERT_TRUE(reference.ok()) << reference.status();
  if (num_ps == 2) {
    ASSERT_GT((*reference)->placement().task_slices[1].size(), 0u);
    int fc_parts = 0;
    for (const SliceSpec& s : (*reference)->placement().slices) fc_parts += s.variable == "fc/w";
    ASSERT_GE(fc_parts, 2) << "fc/w should be partitioned";
  }
  RunSteps(reference->get(), 0, kEnd);
  const std::vector<float> want_values = Flat(reference->get(), false);
  const std::vector<float> want_averages = Flat(reference->get(), true);

  ScratchDir dir("resume");
  {
    auto first = SimCluster::Start(Options(num_ps, dir.path()));
    ASSERT_TRUE(first.ok()) << first.status();
    EXPECT_EQ((*first)->restored_step(), -1);
    RunSteps(first->get(), 0, kStop);
    // Destroyed without Done: a crash after step 13, so the newest checkpoint is step 10's.
  }
  for (int t = 0; t < num_ps; ++t) EXPECT_EQ(StepsOnDisk(dir.path())[t], (std::set<int64_t>{5, 10})) << t;

  auto resumed = SimCluster::Start(Options(num_ps, dir.path()));
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  ASSERT_EQ((*resumed)->restored_step(), 10);
  for (int t = 0; t < num_ps; ++t) EXPECT_EQ((*resumed)->task(t).step(), 10);
  RunSteps(resumed->get(), 10, kEnd);
  EXPECT_EQ(Flat(resumed->get(), false), want_values);
  EXPECT_EQ(Flat(resumed->get(), true), want_averages);

  // A clean end saves a final checkpoint at the last step on every task, before finished().
  FinishTraining(resumed->get());
  for (int t = 0; t < num_ps; ++t) EXPECT_TRUE(StepsOnDisk(dir.path())[t].count(kEnd)) << t;
  auto again = SimCluster::Start(Options(num_ps, dir.path()));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ((*again)->restored_step(), kEnd);
  EXPECT_EQ(Flat(again->get(), false), want_values);
}

INSTANTIATE_TEST_SUITE_P(NumPs, ResumeTest, ::testing::Values(1, 2));

// A ps task killed after the last step, while the workers were reporting done, is started again: it has no
// config and no chief will register again. The workers that still had to report do so to the new process; it
// then finishes by itself once they are all done or quiet, and says whether its newest checkpoint holds the end
// (DataLoss when the steps since were lost with the killed process).
class RestartAfterEndTest : public ::testing::TestWithParam<int> {};

TEST_P(RestartAfterEndTest, TheRestartedTaskFinishesOnceTheWorkersReported) {
  const int64_t reported_end = GetParam();  // the step the workers reached: 10 is on disk, 13 is not
  ScratchDir dir("restart_after_end");
  {
    auto first = SimCluster::Start(Options(1, dir.path()));
    ASSERT_TRUE(first.ok()) << first.status();
    RunSteps(first->get(), 0, 10);
    // Killed: worker 0 had reported done to it, worker 1 had not.
  }
  ASSERT_EQ(StepsOnDisk(dir.path())[0], (std::set<int64_t>{5, 10}));

  std::atomic<int64_t> now_ns{absl::ToUnixNanos(absl::FromUnixSeconds(1'000'000))};
  ParameterServerOptions o;
  o.num_workers = kWorkers;
  o.checkpoint.dir = dir.path();
  o.checkpoint.save_steps = 5;
  o.worker_timeout = absl::Seconds(10);
  o.registration_timeout = absl::Seconds(600);
  o.clock = [&now_ns] { return absl::FromUnixNanos(now_ns.load()); };
  auto advance = [&now_ns](absl::Duration d) { now_ns += absl::ToInt64Nanoseconds(d); };
  absl::StatusOr<std::unique_ptr<ParameterServer>> restarted = ParameterServer::Create(o);
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  ParameterServer& ps = **restarted;

  // Worker 1 reports done (it has no session here) at the end of training.
  ASSERT_TRUE(ps.Done(1, /*session=*/0, /*completed=*/true, reported_end).ok());
  advance(absl::Seconds(9));
  ps.CheckLeases();
  EXPECT_FALSE(ps.finished()) << "the others may still report";
  advance(absl::Seconds(1));
  ps.CheckLeases();
  ASSERT_TRUE(ps.WaitUntilFinished(absl::Seconds(10)));
  const TrainingOutcome outcome = ps.outcome();
  EXPECT_TRUE(outcome.succeeded);
  EXPECT_EQ(outcome.global_step, reported_end);
  EXPECT_NE(outcome.message.find(absl::StrCat("training reached step ", reported_end, " while this task was down")),
            std::string::npos)
      << outcome.message;
  if (reported_end == 10) {
    EXPECT_TRUE(ps.final_checkpoint_status().ok()) << ps.final_checkpoint_status();
    EXPECT_NE(outcome.message.find("its newest checkpoint, step 10, holds the end"), std::string::npos)
        << outcome.message;
  } else {
    EXPECT_EQ(ps.final_checkpoint_status().code(), absl::StatusCode::kDataLoss);
    EXPECT_NE(ps.final_checkpoint_status().message().find("its newest checkpoint is step 10"), std::string::npos)
        << ps.final_checkpoint_status();
  }
  // Nothing on disk was touched.
  EXPECT_EQ(StepsOnDisk(dir.path())[0], (std::set<int64_t>{5, 10}));

  // When every worker reports to the new process, it finishes at once.
  absl::StatusOr<std::unique_ptr<ParameterServer>> again = ParameterServer::Create(o);
  ASSERT_TRUE(again.ok()) << again.status();
  ASSERT_TRUE((*again)->Done(0, 0, true, reported_end).ok());
  EXPECT_FALSE((*again)->finished());
  // Worker 1's last call failed with the killed process and it registers again: the chief reported done and will
  // not configure this task, so worker 1 hears at once that the run is over instead of waiting for the chief
  // until its own deadline (while its calls keep this task waiting for it).
  RegisterRequest late;
  late.worker_id = 1;
  late.is_chief = false;
  late.config = MakeConfig("sync", kWorkers, kWorkers);
  const absl::Status heard = (*again)->Register(late).status();
  const std::optional<RunOver> over = ParseRunOver(heard);
  ASSERT_TRUE(over.has_value()) << heard;
  EXPECT_EQ(over->kind, RunOutcome::kComplete);
  EXPECT_EQ(over->global_step, reported_end);
  EXPECT_FALSE((*again)->finished());
  ASSERT_TRUE((*again)->Done(1, 0, true, reported_end).ok());
  EXPECT_TRUE((*again)->finished());
  EXPECT_TRUE((*again)->outcome().succeeded);
  EXPECT_EQ((*again)->final_checkpoint_status().ok(), reported_end == 10);
}

INSTANTIATE_TEST_SUITE_P(ReportedEnd, RestartAfterEndTest, ::testing::Values(10, 13));

// The job's ps set changed while it ran (1 -> 2 tasks) and ps 0, killed after the last step, is started again with
// the spec's set: the complete checkpoint of the end by 2 tasks holds the end; one part of it alone does not.
TEST(RestartAfterEndMovedTest, ACompleteCheckpointOfAnotherNumberOfTasksHoldsTheEnd) {
  for (const bool complete : {true, false}) {
    ScratchDir dir(complete ? "restart_after_end_moved" : "restart_after_end_moved_part");
    // By name only: the restarted task lists the files and reads none of them.
    ASSERT_TRUE(WriteFileAtomically(Env::Default(), dir.path() + "/model.ckpt-5.ps0-of-1", "x").ok());
    ASSERT_TRUE(WriteFileAtomically(Env::Default(), dir.path() + "/model.ckpt-13.ps0-of-2", "x").ok());
    if (complete) ASSERT_TRUE(WriteFileAtomically(Env::Default(), dir.path() + "/model.ckpt-13.ps1-of-2", "x").ok());
    ParameterServerOptions o;
    o.num_workers = 1;
    o.checkpoint.dir = dir.path();
    o.registration_timeout = absl::Seconds(600);
    absl::StatusOr<std::unique_ptr<ParameterServer>> restarted = ParameterServer::Create(o);
    ASSERT_TRUE(restarted.ok()) << restarted.status();
    ParameterServer& ps = **restarted;
    ASSERT_TRUE(ps.Done(0, /*session=*/0, /*completed=*/true, 13).ok());
    ASSERT_TRUE(ps.WaitUntilFinished(absl::Seconds(10)));
    if (complete) {
      EXPECT_TRUE(ps.final_checkpoint_status().ok()) << ps.final_checkpoint_status();
      EXPECT_TRUE(absl::StrContains(ps.outcome().message, "its newest checkpoint, step 13, holds the end"))
          << ps.outcome().message;
    } else {
      EXPECT_EQ(ps.final_checkpoint_status().code(), absl::StatusCode::kDataLoss);
      EXPECT_TRUE(absl::StrContains(ps.final_checkpoint_status().message(), "its newest checkpoint is step 5"))
          << ps.final_checkpoint_status();
    }
  }
}

// The same kill, but the chief had not reported done: it meets the new process, restores the last step there, and
// reports done. Worker 1 had reported done to the killed process and is not heard from again: the new process
// last knew it present at the last step, so when its lease runs out the run is complete, not degraded: no step
// was trained without it. (A worker last present before the end stays degraded: SummarizeRunTest.)
TEST(RestartAfterEndChiefTest, AWorkerThatHadLeftBeforeTheKillDoesNotDegradeTheRun) {
  ScratchDir dir("restart_after_end_chief");
  {
    auto first = SimCluster::Start(Options(1, dir.path()));
    ASSERT_TRUE(first.ok()) << first.status();
    RunSteps(first->get(), 0, 10);
  }
  std::atomic<int64_t> now_ns{absl::ToUnixNanos(absl::FromUnixSeconds(1'000'000))};
  SimClusterOptions o = Options(1, dir.path());
  o.config.train_steps = 10;
  o.clock = [&now_ns] { return absl::FromUnixNanos(now_ns.load()); };
  o.worker_timeout = absl::Seconds(10);
  // The chief connects (every worker registers here too, at the restored step), then reports done.
  auto restarted = SimCluster::Start(o);
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  ASSERT_EQ((*restarted)->restored_step(), 10);
  ParameterServer& ps = (*restarted)->task(0);
  ASSERT_TRUE(SimWorker(restarted->get(), 0).Done().ok());
  EXPECT_FALSE(ps.finished());
  now_ns += absl::ToInt64Nanoseconds(absl::Seconds(11));  // past worker 1's lease
  ps.CheckLeases();
  ASSERT_TRUE(ps.WaitUntilFinished(absl::Seconds(10)));
  const TrainingOutcome outcome = ps.outcome();
  EXPECT_EQ(outcome.kind, RunOutcome::kComplete) << outcome.message;
  EXPECT_EQ(outcome.message,
            "run complete: training reached step 10 of 10; worker 1 not heard from after the last step (no step "
            "was trained without it)");
}

TEST(ParameterServerCheckpointTest, KeepsTheNewestN) {
  ScratchDir dir("keep");
  SimClusterOptions o = Options(2, dir.path(), "momentum");
  o.checkpoint.keep = 2;
  auto cluster = SimCluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  RunSteps(cluster->get(), 0, 27);
  std::map<int, std::set<int64_t>> steps = StepsOnDisk(dir.path());
  EXPECT_EQ(steps[0], (std::set<int64_t>{20, 25}));
  EXPECT_EQ(steps[1], (std::set<int64_t>{20, 25}));
  FinishTraining(cluster->get());
  steps = StepsOnDisk(dir.path());
  EXPECT_EQ(steps[0], (std::set<int64_t>{25, 27}));
  EXPECT_EQ(steps[1], (std::set<int64_t>{25, 27}));
}

TEST(ParameterServerCheckpointTest, TimeBasedSavesInSyncAreTheSameStepsOnEveryTask) {
  ScratchDir dir("secs");
  SimClusterOptions o = Options(2, dir.path(), "sgd");
  o.checkpoint.save_steps = 0;
  o.checkpoint.save_secs = 0.2;
  o.checkpoint.keep = 0;  // keep all
  auto cluster = SimCluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  RunSteps(cluster->get(), 0, 8, [](int64_t step) {
    if (step % 3 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(250));
  });
  std::map<int, std::set<int64_t>> steps = StepsOnDisk(dir.path());
  // Due after the pauses at steps 3 and 6, so saved when steps 4 and 7 are decided.
  EXPECT_TRUE(steps[0].count(4) && steps[0].count(7)) << steps[0].size();
  EXPECT_EQ(steps[0], steps[1]);
}

TEST(ParameterServerCheckpointTest, CorruptNewestFallsBackToThePreviousWithAWarning) {
  ScratchDir dir("corrupt");
  {
    auto cluster = SimCluster::Start(Options(2, dir.path()));
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    RunSteps(cluster->get(), 0, 12);
  }
  // ps 0's step-10 file loses its tail: both tasks must go back to step 5 together.
  const std::string newest = CheckpointPath(dir.path(), 10, 0, 2);
  std::filesystem::resize_file(newest, std::filesystem::file_size(newest) / 2);
  LogCapture log;
  auto resumed = SimCluster::Start(Options(2, dir.path()));
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ((*resumed)->restored_step(), 5);
  EXPECT_EQ((*resumed)->task(1).step(), 5);
  EXPECT_TRUE(log.Contains(absl::StrCat(newest, " is not restorable (skipping it; an older step will be tried)")))
      << log.text();
  EXPECT_TRUE(log.Contains("truncated at byte")) << log.text();
  EXPECT_TRUE(log.Contains("restored the checkpoint of step 5")) << log.text();
}

TEST(ParameterServerCheckpointTest, CorruptFileOfAnotherTaskTakesEveryTaskToTheNewestCommonStep) {
  ScratchDir dir("corrupt_other");
  {
    auto cluster = SimCluster::Start(Options(2, dir.path()));
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    RunSteps(cluster->get(), 0, 10);
  }
  const std::string path = CheckpointPath(dir.path(), 10, 1, 2);
  std::string bytes = *Env::Default()->ReadFile(path);
  bytes[bytes.size() / 3] ^= 0x04;
  ASSERT_TRUE(WriteFileAtomically(Env::Default(), path, bytes).ok());
  LogCapture log;
  auto resumed = SimCluster::Start(Options(2, dir.path()));
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  // Task 0's step-10 file is fine, task 1's is not: both go back to step 5, the newest they can both restore.
  EXPECT_EQ((*resumed)->restored_step(), 5);
  EXPECT_EQ((*resumed)->task(0).step(), 5);
  EXPECT_EQ((*resumed)->task(1).step(), 5);
  EXPECT_TRUE(log.Contains("checksum mismatch")) << log.text();
  EXPECT_TRUE(log.Contains("restored the checkpoint of step 5")) << log.text();
  // And from there training goes on as it did the first time.
  RunSteps(resumed->get(), 5, 8);
}

TEST(ParameterServerCheckpointTest, AnotherModelsCheckpointIsRefused) {
  ScratchDir dir("other_model");
  {
    auto cluster = SimCluster::Start(Options(1, dir.path()));
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    RunSteps(cluster->get(), 0, 5);
  }
  SimClusterOptions o = Options(1, dir.path());
  ParameterServerOptions po;
  po.num_workers = kWorkers;
  po.checkpoint.dir = dir.path();
  std::unique_ptr<ParameterServer> ps = *ParameterServer::Create(po);
  RegisterRequest request;
  request.is_chief = true;
  request.config = o.config;
  request.config.slices = {SliceSpec{0, "conv/w", 0, 40}, SliceSpec{1, "conv/b", 40, 4},
                           SliceSpec{2, "fc/w", 44, 300}, SliceSpec{3, "fc/b", 344, 6}};
  request.config.model_signature = "another-model";
  absl::StatusOr<RegisterResponse> r = ps->Register(request);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(r.status().message(), "checkpoint of another model")) << r.status();
  EXPECT_TRUE(absl::StrContains(r.status().message(), "--checkpoint_dir")) << r.status();
  // The task stays unconfigured: the right chief can still register and gets the restored values.
  request.config.model_signature = o.config.model_signature;
  r = ps->Register(request);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->initialized);
  EXPECT_EQ(r->global_step, 5);
}

TEST(ParameterServerCheckpointTest, PullMovingAverages) {
  SimClusterOptions o = Options(2, "");
  auto cluster = SimCluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  EXPECT_EQ(Flat(cluster->get(), true), o.initial);  // averages start at the values
  RunSteps(cluster->get(), 0, 3);
  const std::vector<float> values = Flat(cluster->get(), false);
  const std::vector<float> averages = Flat(cluster->get(), true);
  ASSERT_EQ(values.size(), averages.size());
  EXPECT_NE(values, averages);
  // With decay min(0.9, (1+n)/(10+n)) the averages lie between the initial values and the current ones.
  for (size_t i = 0; i < values.size(); ++i) {
    EXPECT_LE(averages[i], std::max(values[i], o.initial[i]) + 1e-6f) << i;
    EXPECT_GE(averages[i], std::min(values[i], o.initial[i]) - 1e-6f) << i;
  }

  SimClusterOptions off = Options(1, "");
  off.config.moving_average_decay = 0;
  auto plain = SimCluster::Start(off);
  ASSERT_TRUE(plain.ok());
  PullRequest request;
  request.session = (*plain)->Session(0, 0);
  request.moving_averages = true;
  absl::StatusOr<testing::Pulled> r = testing::PullSlices((*plain)->task(0), request);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
}

TEST(ParameterServerCheckpointTest, AsyncTasksSaveUnderTheGlobalStep) {
  ScratchDir dir("async");
  SimClusterOptions o = Options(2, dir.path(), "sgd");
  o.config = MakeConfig("async", 1, 1, 0.05f);
  o.config.moving_average_decay = 0.9f;
  o.checkpoint.save_steps = 4;
  auto cluster = SimCluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  SimWorker w(cluster->get(), 0);
  std::vector<float> params;
  int64_t step = *w.Pull(0, 0, &params);
  while (step < 10) {
    ASSERT_TRUE(w.Push(step, TestGradient(0, step, params)).ok());
    absl::StatusOr<int64_t> next = w.Pull(0, step, &params);
    ASSERT_TRUE(next.ok()) << next.status();
    step = *next;
  }
  ASSERT_TRUE(w.Done().ok());
  std::map<int, std::set<int64_t>> steps = StepsOnDisk(dir.path());
  EXPECT_EQ(steps[0], (std::set<int64_t>{4, 8, 10}));
  EXPECT_EQ(steps[1], (std::set<int64_t>{4, 8, 10}));
  // Resume: both tasks restore step 10 (a single worker keeps them in step).
  auto resumed = SimCluster::Start(o);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ((*resumed)->restored_step(), 10);
  EXPECT_EQ(Flat(resumed->get(), false), params);
}

// Whether any temporary file of an unfinished write is left in `dir`.
bool HasTemporaryFiles(const std::string& dir) {
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (IsTemporaryFileName(e.path().filename().string())) return true;
  }
  return false;
}

// A full disk during a periodic save: the save is retried, then reported; training goes on; the previous
// checkpoint stays restorable and no temporary file is left; the next save after the disk recovers works.
TEST(ParameterServerCheckpointTest, FailedPeriodicSaveIsReportedAndTrainingGoesOn) {
  ScratchDir dir("full_disk");
  ::dtrain::testing::FaultInjectionEnv env(Env::Default());
  SimClusterOptions o = Options(1, dir.path(), "sgd");
  o.checkpoint.env = &env;
  auto cluster = SimCluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  // One run of steps (the simulated workers' request ids must not start over): the disk is full from step 7
  // to step 12, across the step-10 save.
  LogCapture log;
  RunSteps(cluster->get(), 0, 16, [&](int64_t step) {
    if (step == 7) {
      EXPECT_EQ(StepsOnDisk(dir.path())[0], (std::set<int64_t>{5}));
      env.FailWritesAfter(100);  // less than one checkpoint
    }
    if (step != 12) return;
    EXPECT_TRUE(log.Contains("ERROR: ps task 0: cannot save checkpoint " + CheckpointPath(dir.path(), 10, 0, 1) +
                             " after 3 attempts"))
        << log.text();
    EXPECT_TRUE(log.Contains("No space left on device")) << log.text();
    EXPECT_EQ(env.sleeps().size(), 2u);  // backoff between the three attempts
    EXPECT_EQ(StepsOnDisk(dir.path())[0], (std::set<int64_t>{5}));
    EXPECT_FALSE(HasTemporaryFiles(dir.path()));
    {
      // Another cluster started on the directory restores step 5 (it trains nothing, so it saves nothing).
      auto probe = SimCluster::Start(Options(1, dir.path(), "sgd"));
      ASSERT_TRUE(probe.ok()) << probe.status();
      EXPECT_EQ((*probe)->restored_step(), 5);
    }
    env.ClearFaults();
  });
  EXPECT_EQ((*cluster)->task(0).step(), 16);
  EXPECT_EQ(StepsOnDisk(dir.path())[0], (std::set<int64_t>{5, 15}));
  FinishTraining(cluster->get());
  EXPECT_EQ(StepsOnDisk(dir.path())[0], (std::set<int64_t>{5, 15, 16}));
}

// The final save failing (every rename) is kept for the binary's exit code; the server still finishes.
TEST(ParameterServerCheckpointTest, FailedFinalSaveIsReported) {
  ScratchDir dir("final_fails");
  ::dtrain::testing::FaultInjectionEnv env(Env::Default());
  SimClusterOptions o = Options(1, dir.path(), "sgd");
  o.checkpoint.env = &env;
  auto cluster = SimCluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  RunSteps(cluster->get(), 0, 7);
  env.FailRenames(1000);
  for (int w = 0; w < kWorkers; ++w) ASSERT_TRUE(SimWorker(cluster->get(), w).Done().ok());
  ParameterServer& ps = (*cluster)->task(0);
  EXPECT_TRUE(ps.finished());
  const absl::Status s = ps.final_checkpoint_status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "cannot save checkpoint " + CheckpointPath(dir.path(), 7, 0, 1)))
      << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "cannot rename")) << s;
  EXPECT_EQ(StepsOnDisk(dir.path())[0], (std::set<int64_t>{5}));
  EXPECT_FALSE(HasTemporaryFiles(dir.path()));
}

// An Env whose file creations wait while it is closed: a checkpoint that takes its time.
class GatedEnv : public ::dtrain::testing::FaultInjectionEnv {
 public:
  using FaultInjectionEnv::FaultInjectionEnv;
  void Close() { closed_ = true; }
  void Open() { release_.Notify(); }
  bool entered() const { return entered_.load(); }
  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override {
    if (closed_.load()) {
      entered_ = true;
      release_.WaitForNotification();
    }
    return FaultInjectionEnv::NewWritableFile(path);
  }

 private:
  std::atomic<bool> closed_{false}, entered_{false};
  absl::Notification release_;
};

// The final checkpoint written on another thread (the last worker's Done here; the lease thread or a signal's in
// dtrain_ps) is not "saved" until it is on disk: a binary that asks meanwhile hears Unavailable, and waits for it.
TEST(ParameterServerCheckpointTest, AFinalSaveInProgressIsNotReportedAsSaved) {
  ScratchDir dir("final_in_progress");
  GatedEnv env(Env::Default());
  SimClusterOptions o = Options(1, dir.path(), "sgd");
  o.checkpoint.env = &env;
  auto cluster = SimCluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  RunSteps(cluster->get(), 0, 7);
  env.Close();
  for (int w = 0; w + 1 < kWorkers; ++w) ASSERT_TRUE(SimWorker(cluster->get(), w).Done().ok());
  std::thread last([&] { EXPECT_TRUE(SimWorker(cluster->get(), kWorkers - 1).Done().ok()); });
  for (int i = 0; i < 1000 && !env.entered(); ++i) absl::SleepFor(absl::Milliseconds(10));
  ASSERT_TRUE(env.entered());
  ParameterServer& ps = (*cluster)->task(0);
  absl::Status s = ps.final_checkpoint_status();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "still being written")) << s;
  s = ps.WaitFinalCheckpoint(absl::Milliseconds(50));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  env.Open();
  s = ps.WaitFinalCheckpoint(absl::Seconds(30));
  EXPECT_TRUE(s.ok()) << s;
  last.join();
  EXPECT_TRUE(ps.finished());
  EXPECT_EQ(StepsOnDisk(dir.path())[0].count(7), 1u);
}

// A periodic save of the last step that failed is not mistaken for "that step is saved already": the final
// save writes it.
TEST(ParameterServerCheckpointTest, FinalSaveRewritesAStepWhoseSaveFailed) {
  ScratchDir dir("final_after_failure");
  ::dtrain::testing::FaultInjectionEnv env(Env::Default());
  SimClusterOptions o = Options(1, dir.path(), "sgd");
  o.checkpoint.env = &env;
  o.checkpoint.max_attempts = 1;
  auto cluster = SimCluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  env.FailSyncs(1);
  RunSteps(cluster->get(), 0, 5);  // the step-5 save fails
  EXPECT_TRUE(StepsOnDisk(dir.path()).empty());
  FinishTraining(cluster->get());   // at step 5
  EXPECT_EQ(StepsOnDisk(dir.path())[0], (std::set<int64_t>{5}));
}

// Commits carry each worker's input position; ps 0's checkpoint of step k holds each worker's position after
// the batches of step k-1, and after a restore a worker registering learns its position (until it commits).
TEST(ParameterServerCheckpointTest, InputPositionsAreCheckpointedAndHandedBack) {
  ScratchDir dir("positions");
  auto position = [](int w, int64_t s) { return absl::StrCat("worker ", w, " after step ", s); };
  {
    auto cluster = SimCluster::Start(Options(2, dir.path()));
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    std::vector<SimWorker> workers;
    std::vector<std::vector<float>> params(kWorkers);
    for (int w = 0; w < kWorkers; ++w) {
      workers.emplace_back(cluster->get(), w);
      ASSERT_TRUE(workers[w].Pull(0, 0, &params[w]).ok());
    }
    for (int64_t s = 0; s < 12; ++s) {
      for (int w = 0; w < kWorkers; ++w) {
        workers[w].client().SetInputPosition(position(w, s));
        ASSERT_TRUE(workers[w].Push(s, TestGradient(w, s, params[w])).ok());
      }
      for (int w = 0; w < kWorkers; ++w) ASSERT_TRUE(workers[w].Pull(s + 1, s, &params[w]).ok());
    }
  }
  for (int64_t k : {5, 10}) {
    absl::StatusOr<CheckpointData> ps0 = ReadCheckpoint(Env::Default(), CheckpointPath(dir.path(), k, 0, 2));
    ASSERT_TRUE(ps0.ok()) << ps0.status();
    EXPECT_EQ(ps0->input_positions, (std::map<int, std::string>{{0, position(0, k - 1)}, {1, position(1, k - 1)}}));
    absl::StatusOr<CheckpointData> ps1 = ReadCheckpoint(Env::Default(), CheckpointPath(dir.path(), k, 1, 2));
    ASSERT_TRUE(ps1.ok()) << ps1.status();
    EXPECT_TRUE(ps1->input_positions.empty()) << "only ps 0 keeps them";
  }
  auto resumed = SimCluster::Start(Options(2, dir.path()));
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  ASSERT_EQ((*resumed)->restored_step(), 10);
  SimWorker w1(resumed->get(), 1);
  EXPECT_EQ(w1.client().restored_input_position(), position(1, 9));
  std::vector<float> params;
  ASSERT_EQ(*w1.Pull(0, 0, &params), 10);
  w1.client().SetInputPosition(position(1, 10));
  ASSERT_TRUE(w1.Push(10, TestGradient(1, 10, params)).ok());
  // Committed since: registering again (a restarted worker process) reads on after that commit's batches; worker 0
  // still has its restored position.
  EXPECT_EQ(SimWorker(resumed->get(), 1).client().restored_input_position(), position(1, 10));
  EXPECT_EQ(SimWorker(resumed->get(), 0).client().restored_input_position(), position(0, 9));
}

}  // namespace
}  // namespace dtrain::ps
