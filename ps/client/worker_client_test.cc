// WorkerClient: the order in which pushes and pulls move slices (layer by layer, last layer first up; forward
// order down, usable before the pull ends), the commit after every other task, retries that never apply twice,
// bf16 with error feedback, and cancellation of what is in flight.
#include "ps/client/worker_client.h"

#include <atomic>
#include <algorithm>
#include <future>
#include <numeric>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/testing/scratch_dir.h"
#include "gtest/gtest.h"
#include "ps/testing/ps_test_util.h"

namespace dtrain::ps {
namespace {

using ::dtrain::ps::testing::MakeConfig;
using ::dtrain::testing::ScratchDir;
using ::dtrain::ps::testing::SimCluster;
using ::dtrain::ps::testing::SimClusterOptions;

// Logs what reaches a task, for checking orders; can hold back pulled slices and fail the first calls.
class ObservedPs : public PsInterface {
 public:
  ObservedPs(PsInterface* target, std::string name, std::vector<std::string>* log, std::mutex* mu)
      : target_(target), name_(std::move(name)), log_(log), mu_(mu) {}

  void HoldSlicesFrom(uint32_t key) { hold_from_ = key; }
  void Release() { release_.Notify(); }
  void FailFirst(int uploads, int pulls) {
    fail_uploads_ = uploads;
    fail_pulls_ = pulls;
  }
  // The next pull takes `d` and then fails, as a call in flight does when its process was stopped (SIGSTOP)
  // for that long.
  void PauseNextPull(absl::Duration d) { pause_ms_ = absl::ToInt64Milliseconds(d); }
  // Calls run inline and uploads split their end (SliceUpload::StartFinish), as over shared memory: the commit
  // reaches the ps when it is sent ("commit sent"), its answer is read later ("commit read"). With
  // `lose_first_answer` the first answer read is Unavailable, as when the lane broke after the ps had applied it.
  void SplitCommits(bool lose_first_answer) {
    split_ = true;
    lose_answers_ = lose_first_answer ? 1 : 0;
  }
  bool PrefersInlineCalls() const override { return split_; }
  // Uploads' Finish (the commit on ps 0) waits until `release` is notified (at most 20 s).
  void HoldFinishes(absl::Notification* release) { finish_release_ = release; }

  absl::StatusOr<RegisterResponse> Register(const RegisterRequest& r) override { return target_->Register(r); }
  absl::StatusOr<std::unique_ptr<SliceUpload>> StartInitialize(int w) override { return target_->StartInitialize(w); }
  absl::StatusOr<std::unique_ptr<SliceUpload>> StartPush(const PushHeader& h) override {
    absl::StatusOr<std::unique_ptr<SliceUpload>> up = target_->StartPush(h);
    if (!up.ok()) return up;
    return std::unique_ptr<SliceUpload>(new Upload(this, *std::move(up), fail_uploads_-- > 0));
  }
  absl::Status Pull(const PullRequest& r, PullReceiver* receiver) override {
    if (fail_pulls_-- > 0) return absl::UnavailableError("injected: task restarting");
    if (const int64_t ms = pause_ms_.exchange(0); ms > 0) {
      absl::SleepFor(absl::Milliseconds(ms));
      return absl::UnavailableError("injected: the connection broke while the process was stopped");
    }
    Gate gate(this, receiver);
    return target_->Pull(r, &gate);
  }
  absl::Status Done(const DoneRequest& request) override {
    return target_->Done(request);
  }
  absl::StatusOr<int64_t> Heartbeat(int w, uint64_t session) override { return target_->Heartbeat(w, session); }
  absl::StatusOr<TrainingStats> GetStats() override { return target_->GetStats(); }
  absl::StatusOr<CheckpointProbe> Probe(const TrainConfig& c) override { return target_->Probe(c); }
  absl::Status Restore(const TrainConfig& c, int w, int64_t step) override {
    Log(absl::StrCat("restore ", step));
    return target_->Restore(c, w, step);
  }

 private:
  void Log(const std::string& s) {
    std::lock_guard<std::mutex> lock(*mu_);
    log_->push_back(absl::StrCat(name_, ":", s));
  }
  class Upload : public SliceUpload {
   public:
    Upload(ObservedPs* ps, std::unique_ptr<SliceUpload> up, bool fail) : ps_(ps), up_(std::move(up)), fail_(fail) {}
    absl::Status Write(uint32_t key, int64_t offset, int64_t n, WireDtype dtype, const void* data) override {
      ps_->Log(absl::StrCat("push ", key));
      if (fail_) return absl::UnavailableError("injected: connection reset");
      return up_->Write(key, offset, n, dtype, data);
    }
    absl::Status WriteSparse(uint32_t table, const int64_t* ids, int64_t n, int dim, WireDtype dtype,
                             const void* rows) override {
      ps_->Log(absl::StrCat("push rows ", table, " x", n));
      if (fail_) return absl::UnavailableError("injected: connection reset");
      return up_->WriteSparse(table, ids, n, dim, dtype, rows);
    }
    bool StartFinish() override {
      if (!ps_->split_) return false;
      ps_->Log("commit sent");
      answer_ = up_->Finish();
      started_ = true;
      return true;
    }
    absl::StatusOr<PushResponse> Finish() override {
      if (!started_) {
        ps_->Log("finish");
        if (absl::Notification* n = ps_->finish_release_.load()) n->WaitForNotificationWithTimeout(absl::Seconds(20));
        return up_->Finish();
      }
      ps_->Log("commit read");
      if (ps_->lose_answers_-- > 0) return absl::UnavailableError("injected: the lane broke before the answer");
      return answer_;
    }

   private:
    ObservedPs* ps_;
    std::unique_ptr<SliceUpload> up_;
    bool fail_;
    bool started_ = false;
    absl::StatusOr<PushResponse> answer_ = absl::UnknownError("no answer");
  };
  class Gate : public PullReceiver {
   public:
    Gate(ObservedPs* ps, PullReceiver* r) : ps_(ps), r_(r) {}
    absl::Status OnHeader(const PullHeader& h) override { return r_->OnHeader(h); }
    absl::StatusOr<Buffer> Destination(uint32_t key, int64_t offset, int64_t n) override {
      if (key >= ps_->hold_from_) ps_->release_.WaitForNotificationWithTimeout(absl::Seconds(20));
      ps_->Log(absl::StrCat("pull ", key));
      return r_->Destination(key, offset, n);
    }
    absl::Status Written(uint32_t key, int64_t offset, int64_t n) override { return r_->Written(key, offset, n); }
    absl::StatusOr<Buffer> SparseDestination(uint32_t table, int64_t first, int64_t n, int dim) override {
      ps_->Log(absl::StrCat("pull rows ", table, " x", n));
      return r_->SparseDestination(table, first, n, dim);
    }
    absl::Status SparseWritten(uint32_t table, int64_t first, int64_t n) override {
      return r_->SparseWritten(table, first, n);
    }

   private:
    ObservedPs* ps_;
    PullReceiver* r_;
  };

  PsInterface* target_;
  const std::string name_;
  std::vector<std::string>* log_;
  std::mutex* mu_;
  std::atomic<uint32_t> hold_from_{~0u};
  absl::Notification release_;
  std::atomic<int> fail_uploads_{0}, fail_pulls_{0};
  std::atomic<int64_t> pause_ms_{0};
  std::atomic<bool> split_{false};
  std::atomic<int> lose_answers_{0};
  std::atomic<absl::Notification*> finish_release_{nullptr};
};

// Four "layers" of one variable each, spread over two ps tasks.
SimClusterOptions Layers(int num_ps, const std::string& mode = "sync", float lr = 0.5f) {
  SimClusterOptions o;
  o.variables = {{"l0", 3}, {"l1", 5}, {"l2", 4}, {"l3", 2}};
  o.num_ps = num_ps;
  o.placement.min_slice_bytes = 0;  // keep each variable whole
  o.config = MakeConfig(mode, 1, 1, lr);
  o.initial = std::vector<float>(14, 1.0f);
  return o;
}

struct Fixture {
  explicit Fixture(SimClusterOptions o, WorkerClientOptions wo = {}) {
    cluster = *SimCluster::Start(o);
    for (int t = 0; t < cluster->num_ps(); ++t) {
      observed.push_back(std::make_unique<ObservedPs>(&cluster->task(t), absl::StrCat("ps", t), &log, &mu));
      tasks.push_back(observed.back().get());
    }
    wo.initial_backoff = absl::Milliseconds(5);
    client = std::make_unique<WorkerClient>(tasks, cluster->placement().task_slices, 0, true, wo);
    EXPECT_TRUE(client->Connect(cluster->config(), cluster->initial().data(), absl::Seconds(5)).ok());
  }
  std::vector<std::string> Log() {
    std::lock_guard<std::mutex> lock(mu);
    return log;
  }
  std::unique_ptr<SimCluster> cluster;
  std::mutex mu;
  std::vector<std::string> log;
  std::vector<std::unique_ptr<ObservedPs>> observed;
  std::vector<PsInterface*> tasks;
  std::unique_ptr<WorkerClient> client;
};

TEST(WorkerClientTest, PushesEachLayerAsItIsReadyAndCommitsLast) {
  Fixture f(Layers(2));
  const std::vector<float> grads(14, 1.0f);
  ASSERT_TRUE(f.client->BeginPush(0, grads.data()).ok());
  // Backward: last layer first.
  f.client->PushRange(12, 14);
  f.client->PushRange(8, 12);
  f.client->PushRange(3, 8);
  f.client->PushRange(0, 3);
  f.client->FinishPush();
  absl::StatusOr<PushResponse> r = f.client->WaitPush();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->outcome, PushResponse::Outcome::kAccepted);
  // Per task, slices go out in the order they became ready; ps 0's upload (the commit) finishes last.
  std::vector<std::string> per_task[2];
  int finished = 0;
  for (const std::string& e : f.Log()) {
    per_task[e[2] - '0'].push_back(e.substr(4));
    if (e.find("finish") != std::string::npos) {
      EXPECT_EQ(e, finished == 0 ? "ps1:finish" : "ps0:finish");
      ++finished;
    }
  }
  EXPECT_EQ(finished, 2);
  const Placement& p = f.cluster->placement();
  for (int t = 0; t < 2; ++t) {
    std::vector<std::string> want;
    for (int key = 3; key >= 0; --key) {
      if (p.task_of_slice[key] == t) want.push_back(absl::StrCat("push ", key));
    }
    want.push_back("finish");
    EXPECT_EQ(per_task[t], want) << "task " << t;
  }
  EXPECT_EQ(f.cluster->task(0).step(), 1);
}

TEST(WorkerClientTest, PullsInForwardOrderAndEachLayerIsUsableBeforeThePullEnds) {
  Fixture f(Layers(1));
  std::vector<float> params(14, 0.0f);
  f.observed[0]->HoldSlicesFrom(2);  // the ps "is still updating" layers 2 and 3
  f.client->StartPull(0, 0, params.data());
  absl::StatusOr<PullResult> header = f.client->WaitPullHeader();
  ASSERT_TRUE(header.ok()) << header.status();
  EXPECT_EQ(header->step, 0);
  ASSERT_TRUE(f.client->WaitForRange(0, 8).ok());  // layers 0 and 1 are there
  EXPECT_EQ(params[0], 1.0f);
  EXPECT_EQ(params[7], 1.0f);
  std::future<absl::Status> later =
      std::async(std::launch::async, [&] { return f.client->WaitForRange(8, 14); });
  EXPECT_EQ(later.wait_for(std::chrono::milliseconds(50)), std::future_status::timeout);
  EXPECT_EQ(params[8], 0.0f);
  f.observed[0]->Release();
  ASSERT_EQ(later.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  EXPECT_TRUE(later.get().ok());
  ASSERT_TRUE(f.client->FinishPull().ok());
  EXPECT_EQ(params, std::vector<float>(14, 1.0f));
  std::vector<std::string> want = {"ps0:pull 0", "ps0:pull 1", "ps0:pull 2", "ps0:pull 3"};
  EXPECT_EQ(f.Log(), want);
}

// One step against a task whose uploads split their end (SliceUpload::StartFinish; shared memory): the
// commit, the pull and the commit's answer, each task's log in order.
std::vector<std::string> SplitStep(Fixture& f, std::vector<float>* params) {
  const std::vector<float> grads(14, 1.0f);
  EXPECT_TRUE(f.client->BeginPush(0, grads.data()).ok());
  f.client->PushRange(0, 14);
  f.client->FinishPush();
  f.client->StartPull(1, 0, params->data());
  absl::StatusOr<PullResult> pulled = f.client->FinishPull();
  EXPECT_TRUE(pulled.ok()) << pulled.status();
  if (pulled.ok()) {
    EXPECT_EQ(pulled->step, 1);
  }
  absl::StatusOr<PushResponse> pushed = f.client->WaitPush();
  EXPECT_TRUE(pushed.ok()) << pushed.status();
  std::vector<std::string> events;
  for (const std::string& e : f.Log()) {
    if (e.find("commit") != std::string::npos || e.find("finish") != std::string::npos || e == "ps0:pull 0") {
      events.push_back(e);
    }
  }
  return events;
}

TEST(WorkerClientTest, ACommitOverSharedMemoryIsSentBeforeThePullAndItsAnswerReadAfter) {
  Fixture f(Layers(1));
  f.observed[0]->SplitCommits(/*lose_first_answer=*/false);
  std::vector<float> params(14, 0.0f);
  // The pull goes right behind the commit; the answer, there by then, is read once the pull has ended, so the
  // step sleeps once.
  std::vector<std::string> want = {"ps0:commit sent", "ps0:pull 0", "ps0:commit read"};
  EXPECT_EQ(SplitStep(f, &params), want);
  EXPECT_EQ(params, std::vector<float>(14, 0.5f));  // 1 - 0.5 * 1
  EXPECT_EQ(f.cluster->task(0).step(), 1);
  // A push with no pull behind it reads its answer in WaitPush.
  const std::vector<float> grads(14, 1.0f);
  ASSERT_TRUE(f.client->Push(1, grads.data()).ok());
  EXPECT_EQ(f.Log().back(), "ps0:commit read");
  EXPECT_EQ(f.cluster->task(0).step(), 2);
}

TEST(WorkerClientTest, ACommitWhoseAnswerIsLostIsRetriedOnceThePullHasEndedAndAppliedOnce) {
  Fixture f(Layers(1));
  f.observed[0]->SplitCommits(/*lose_first_answer=*/true);
  std::vector<float> params(14, 0.0f);
  // The retry (a new upload with every slice again, ended by Finish) comes after the pull and before any retry
  // of it; the ps knows the request and applies it once.
  std::vector<std::string> want = {"ps0:commit sent", "ps0:pull 0", "ps0:commit read", "ps0:finish"};
  EXPECT_EQ(SplitStep(f, &params), want);
  EXPECT_EQ(params, std::vector<float>(14, 0.5f));
  EXPECT_EQ(f.cluster->task(0).step(), 1);
}

// With the early apply granted (one worker, one ps task, sync), the next pull goes out beside the push
// (StartPullBesidePush) and streams while it uploads, but writes nothing until backward is over (FinishPush):
// backward still reads the parameters.
TEST(WorkerClientTest, APullBesideThePushWritesNothingBeforeFinishPush) {
  WorkerClientOptions wo;
  wo.apply_early = true;
  Fixture f(Layers(1), wo);
  std::vector<float> params(14, 0.0f);
  const std::vector<float> grads(14, 1.0f);
  // Step 0: no pull streamed behind a push yet, so none goes beside it.
  ASSERT_TRUE(f.client->BeginPush(0, grads.data()).ok());
  absl::StatusOr<bool> early = f.client->StartPullBesidePush(1, 0, params.data());
  ASSERT_TRUE(early.ok()) << early.status();
  EXPECT_FALSE(*early);
  f.client->PushRange(0, 14);
  absl::Notification commit;
  f.observed[0]->HoldFinishes(&commit);  // the push is still open when the pull arrives: ps 0 streams it
  f.client->FinishPush();
  f.client->StartPull(1, 0, params.data());
  ASSERT_TRUE(f.client->WaitPullHeader().ok());
  commit.Notify();
  ASSERT_TRUE(f.client->FinishPull().ok());
  ASSERT_TRUE(f.client->WaitPush().ok());
  EXPECT_EQ(params, std::vector<float>(14, 0.5f));  // 1 - 0.5 * 1
  // Step 1: the pull goes out before any gradient, and streams the update as the push arrives.
  ASSERT_TRUE(f.client->BeginPush(1, grads.data()).ok());
  early = f.client->StartPullBesidePush(2, 1, params.data());
  ASSERT_TRUE(early.ok()) << early.status();
  ASSERT_TRUE(*early);
  f.client->PushRange(0, 14);
  absl::StatusOr<PullResult> header = f.client->WaitPullHeader();
  ASSERT_TRUE(header.ok()) << header.status();
  EXPECT_EQ(header->step, 2);
  std::future<absl::Status> layer0 = std::async(std::launch::async, [&] { return f.client->WaitForRange(0, 3); });
  EXPECT_EQ(layer0.wait_for(std::chrono::milliseconds(200)), std::future_status::timeout);
  EXPECT_EQ(params, std::vector<float>(14, 0.5f)) << "values written while backward could still read them";
  f.client->FinishPush();
  ASSERT_EQ(layer0.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  EXPECT_TRUE(layer0.get().ok());
  absl::StatusOr<PullResult> pulled = f.client->FinishPull();
  ASSERT_TRUE(pulled.ok()) << pulled.status();
  EXPECT_EQ(pulled->step, 2);
  ASSERT_TRUE(f.client->WaitPush().ok());
  EXPECT_EQ(params, std::vector<float>(14, 0.0f));
  EXPECT_EQ(f.cluster->task(0).step(), 2);
  // Without the early apply asked, nothing goes beside the push.
  f.client->set_apply_early(false);
  ASSERT_TRUE(f.client->BeginPush(2, grads.data()).ok());
  early = f.client->StartPullBesidePush(3, 2, params.data());
  ASSERT_TRUE(early.ok());
  EXPECT_FALSE(*early);
  f.client->AbandonPush(absl::CancelledError("test over"));
  EXPECT_FALSE(f.client->WaitPush().ok());
}

TEST(WorkerClientTest, RetriesUnavailableWithoutApplyingTwice) {
  Fixture f(Layers(2, "async", 1.0f));
  f.observed[1]->FailFirst(/*uploads=*/1, /*pulls=*/2);
  f.observed[0]->FailFirst(/*uploads=*/1, /*pulls=*/1);
  const std::vector<float> grads(14, 0.25f);
  absl::StatusOr<PushResponse> r = f.client->Push(0, grads.data());
  ASSERT_TRUE(r.ok()) << r.status();
  std::vector<float> params(14, 0.0f);
  absl::StatusOr<PullResult> pulled = f.client->Pull(0, 0, params.data());
  ASSERT_TRUE(pulled.ok()) << pulled.status();
  EXPECT_EQ(pulled->step, 1);
  EXPECT_EQ(params, std::vector<float>(14, 0.75f));  // applied exactly once on both tasks
  EXPECT_EQ(f.cluster->task(1).step(), 1);
}

// A worker stopped (SIGSTOP) for longer than its retry window during a call tries once more when it wakes,
// instead of failing on the clock alone.
TEST(WorkerClientTest, AProcessPausedPastItsRetryWindowTriesOnceMore) {
  WorkerClientOptions wo;
  wo.retry_window = absl::Milliseconds(300);
  Fixture f(Layers(1, "async", 1.0f), wo);
  const std::vector<float> grads(14, 0.25f);
  ASSERT_TRUE(f.client->Push(0, grads.data()).ok());
  f.observed[0]->PauseNextPull(absl::Milliseconds(900));
  std::vector<float> params(14, 0.0f);
  absl::StatusOr<PullResult> pulled = f.client->Pull(0, 0, params.data());
  ASSERT_TRUE(pulled.ok()) << pulled.status();
  EXPECT_EQ(pulled->step, 1);
  // Still a window: a task that stays unreachable fails the pull once the window is spent.
  f.observed[0]->FailFirst(/*uploads=*/0, /*pulls=*/1000);
  const absl::Time start = absl::Now();
  EXPECT_EQ(f.client->Pull(0, 0, params.data()).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

TEST(WorkerClientTest, NarrowWireTypesKeepTheRoundingErrorForTheNextStep) {
  WorkerClientOptions wo;
  wo.wire_dtype = WireDtype::kBF16;
  Fixture f(Layers(1, "sync", 1.0f), wo);
  // 1.001 is not a bf16 number: rounded alone it would be 1.0 every step.
  const std::vector<float> grads(14, 1.001f);
  std::vector<float> params(14);
  constexpr int kSteps = 100;
  for (int s = 0; s < kSteps; ++s) {
    ASSERT_TRUE(f.client->Push(s, grads.data()).ok());
    ASSERT_TRUE(f.client->Pull(s + 1, s, params.data()).ok());
  }
  // Sum of what was sent = 100 * 1.001 minus the last residual (under one bf16 rounding of ~1.0).
  for (float v : params) EXPECT_NEAR(v, 1.0f - kSteps * 1.001f, 0.005f);
}

// Local mode: the chief keeps no copy of its initial values. It reads the caller's buffer during Connect (the
// tasks hold those values after it, whatever the buffer holds later) and, with nothing kept, a Reconnect that
// finds every task fresh is refused saying so.
TEST(WorkerClientTest, WithoutKeepingInitialValuesTheChiefInitializesFromTheCallersBuffer) {
  const SimClusterOptions o = Layers(2);
  const absl::StatusOr<Placement> placed = PlaceVariables(o.variables, 2, o.placement);
  ASSERT_TRUE(placed.ok()) << placed.status();
  const Placement& placement = *placed;
  // Two fresh tasks, nothing saved (what a restart without checkpoints also gives).
  std::vector<std::unique_ptr<ParameterServer>> servers(2);
  auto start_tasks = [&] {
    for (int t = 0; t < 2; ++t) {
      ParameterServerOptions po;
      po.task_index = t;
      po.num_ps = 2;
      po.num_workers = 1;
      absl::StatusOr<std::unique_ptr<ParameterServer>> ps = ParameterServer::Create(po);
      ASSERT_TRUE(ps.ok()) << ps.status();
      servers[t] = *std::move(ps);
    }
  };
  start_tasks();
  std::vector<PsInterface*> tasks = {servers[0].get(), servers[1].get()};
  WorkerClientOptions wo;
  wo.background = false;
  wo.keep_initial_values = false;
  WorkerClient client(tasks, placement.task_slices, 0, true, wo);
  std::vector<float> buffer(14);
  std::iota(buffer.begin(), buffer.end(), 1.0f);
  const std::vector<float> initial = buffer;
  ASSERT_TRUE(client.Connect(o.config, buffer.data(), absl::Seconds(5)).ok());
  std::fill(buffer.begin(), buffer.end(), -7.0f);  // the caller's buffer is its own again
  std::vector<float> pulled(14, 0.0f);
  const absl::StatusOr<PullResult> at = client.Pull(0, 0, pulled.data());
  ASSERT_TRUE(at.ok()) << at.status();
  EXPECT_EQ(at->step, 0);
  EXPECT_EQ(pulled, initial);

  // Both tasks restart with nothing saved: a fresh start needs initial values the client no longer has.
  start_tasks();
  WorkerClient again({servers[0].get(), servers[1].get()}, placement.task_slices, 0, true, wo);
  const absl::Status refused = again.Connect(o.config, nullptr, absl::Seconds(1));
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_NE(refused.message().find("no initial values"), std::string::npos) << refused;
}

TEST(WorkerClientTest, DestroyingTheClientEndsAWaitingPull) {
  SimClusterOptions o = Layers(1);
  o.config = MakeConfig("sync", 2, 2);  // step 1 needs a second worker that never comes
  std::unique_ptr<SimCluster> cluster = *SimCluster::Start(o);
  std::vector<PsInterface*> tasks = {&cluster->task(0)};
  auto client = std::make_unique<WorkerClient>(tasks, cluster->placement().task_slices, 0, true);
  ASSERT_TRUE(client->Connect(cluster->config(), cluster->initial().data(), absl::Seconds(5)).ok());
  std::vector<float> grads(14, 1.0f), params(14);
  ASSERT_TRUE(client->Push(0, grads.data()).ok());
  client->StartPull(1, 0, params.data());
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const absl::Time start = absl::Now();
  client.reset();
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
}

// Layers(num_ps) with a hash table of dim 3 (rows from the initializer, sgd at learning rate 1).
SimClusterOptions WithTable(int num_ps, const std::string& mode = "sync") {
  SimClusterOptions o = Layers(num_ps, mode);
  SparseTableSpec t;
  t.name = "emb";
  t.dim = 3;
  t.init_scale = 0.5f;
  t.init_seed = 11;
  o.config.tables = {t};
  o.config.sparse_optimizer.name = "sgd";
  o.config.sparse_optimizer.learning_rate = 1.0f;
  return o;
}

std::vector<float> InitialRows(const SparseTableSpec& t, const std::vector<int64_t>& ids) {
  std::vector<float> rows(ids.size() * t.dim);
  for (size_t i = 0; i < ids.size(); ++i) SparseInitialRow(t, ids[i], rows.data() + i * t.dim);
  return rows;
}

TEST(WorkerClientTest, SparseRowsAreSplitByTaskAndComeBackInTheCallersOrder) {
  Fixture f(WithTable(2));
  const SparseTableSpec& table = f.cluster->config().tables[0];
  const std::vector<int64_t> ids = {901, -5, 17, 4, 123456789012345, 0, 33, 8, 1 << 20};
  int on_task[2] = {0, 0};
  for (int64_t id : ids) ++on_task[ShardOfId(id, 2)];
  ASSERT_GT(on_task[0], 0);
  ASSERT_GT(on_task[1], 0);
  std::vector<float> params(14), rows(ids.size() * 3, -1.0f);
  ASSERT_TRUE(f.client->SetSparsePull({{0, ids.data(), static_cast<int64_t>(ids.size()), rows.data()}}).ok());
  f.client->StartPull(0, 0, params.data());
  ASSERT_TRUE(f.client->WaitForSparse(0).ok());
  EXPECT_EQ(rows, InitialRows(table, ids));
  ASSERT_TRUE(f.client->FinishPull().ok());
  // One request per task with its ids only, after its slices.
  for (int t = 0; t < 2; ++t) {
    EXPECT_EQ(f.cluster->task(t).GetStats()->tables[0].lookups, on_task[t]);
    const std::vector<std::string> log = f.Log();
    EXPECT_EQ(std::count(log.begin(), log.end(), absl::StrCat("ps", t, ":pull rows 0 x", on_task[t])), 1);
  }

  // A push brings each task the gradients of its ids; the next pull sees them applied (sync, one worker).
  std::vector<float> grads(14, 0.0f), row_grads(ids.size() * 3);
  for (size_t i = 0; i < row_grads.size(); ++i) row_grads[i] = 0.125f * static_cast<float>(i);
  ASSERT_TRUE(f.client->BeginPush(0, grads.data()).ok());
  ASSERT_TRUE(f.client->PushSparse(0, ids.data(), static_cast<int64_t>(ids.size()), row_grads.data()).ok());
  f.client->FinishPush();
  ASSERT_TRUE(f.client->WaitPush().ok());
  std::vector<float> after(ids.size() * 3);
  const std::vector<int64_t> reversed(ids.rbegin(), ids.rend());
  ASSERT_TRUE(f.client->Pull(1, 0, params.data(), {{0, reversed.data(), 9, after.data()}}).ok());
  const std::vector<float> initial = InitialRows(table, reversed);
  for (size_t i = 0; i < reversed.size(); ++i) {
    for (int k = 0; k < 3; ++k) {
      const size_t j = ids.size() - 1 - i;  // reversed[i] == ids[j]
      EXPECT_EQ(after[i * 3 + k], initial[i * 3 + k] - row_grads[j * 3 + k]) << reversed[i];
    }
  }
  // The pull after that brings no rows unless asked again.
  ASSERT_TRUE(f.client->Pull(1, 1, params.data()).ok());
  EXPECT_EQ(f.cluster->task(0).GetStats()->tables[0].lookups, 2 * on_task[0]);
}

TEST(WorkerClientTest, SparseRetriesApplyOnce) {
  Fixture f(WithTable(2, "async"));
  const SparseTableSpec& table = f.cluster->config().tables[0];
  std::vector<int64_t> ids(40);
  std::iota(ids.begin(), ids.end(), 100);
  std::vector<float> params(14), rows(ids.size() * 3);
  ASSERT_TRUE(f.client->Pull(0, 0, params.data(), {{0, ids.data(), 40, rows.data()}}).ok());
  f.observed[0]->FailFirst(/*uploads=*/1, /*pulls=*/1);
  f.observed[1]->FailFirst(/*uploads=*/1, /*pulls=*/2);
  const std::vector<float> grads(14, 0.0f), row_grads(ids.size() * 3, 0.5f);
  absl::StatusOr<PushResponse> pushed = f.client->Push(0, grads.data(), {{0, ids.data(), 40, row_grads.data()}});
  ASSERT_TRUE(pushed.ok()) << pushed.status();
  ASSERT_TRUE(f.client->Pull(0, 0, params.data(), {{0, ids.data(), 40, rows.data()}}).ok());
  std::vector<float> want = InitialRows(table, ids);
  for (float& x : want) x -= 0.5f;
  EXPECT_EQ(rows, want);
}

TEST(WorkerClientTest, SparseMisuseIsRefused) {
  Fixture f(WithTable(1));
  std::vector<float> grads(14), rows(3);
  const int64_t id = 1;
  EXPECT_EQ(f.client->PushSparse(0, &id, 1, rows.data()).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(f.client->SetSparsePull({{1, &id, 1, rows.data()}}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(f.client->SetSparsePull({{0, &id, 1, rows.data()}, {0, &id, 1, rows.data()}}).code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(f.client->BeginPush(0, grads.data()).ok());
  EXPECT_EQ(f.client->PushSparse(2, &id, 1, rows.data()).code(), absl::StatusCode::kInvalidArgument);
  f.client->FinishPush();
  EXPECT_EQ(f.client->PushSparse(0, &id, 1, rows.data()).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(f.client->WaitPush().ok());
  EXPECT_TRUE(f.client->WaitForSparse(0).ok());  // no pull asked for it: at once
}

// A push that failed with the old sessions (a ps task restarted) is over once Reconnect returns: the next
// step's rows, which a sparse step waits for before it begins its push, and WaitPush do not report it again.
TEST(WorkerClientTest, APushThatFailedBeforeReconnectingDoesNotFailTheNextStep) {
  Fixture f(WithTable(2));
  std::vector<float> params(14), grads(14, 0.0f), rows(3, -1.0f);
  const int64_t id = 7;
  ASSERT_TRUE(f.client->Pull(0, 0, params.data()).ok());
  ASSERT_TRUE(f.client->BeginPush(0, grads.data()).ok());
  f.client->AbandonPush(absl::CancelledError("push cancelled"));
  EXPECT_EQ(f.client->WaitPush().status().code(), absl::StatusCode::kCancelled);
  ASSERT_TRUE(f.client->Reconnect(absl::Seconds(5)).ok());
  ASSERT_TRUE(f.client->SetSparsePull({{0, &id, 1, rows.data()}}).ok());
  f.client->StartPull(0, 0, params.data());
  const absl::Status arrived = f.client->WaitForSparse(0);
  EXPECT_TRUE(arrived.ok()) << arrived;
  EXPECT_EQ(rows, InitialRows(f.cluster->config().tables[0], {id}));
  EXPECT_TRUE(f.client->FinishPull().ok());
  const absl::Status pushed = f.client->WaitPush().status();
  EXPECT_TRUE(pushed.ok()) << pushed;
}

// (In process the pulled rows come as fp32, as the slices do: the gRPC service rounds them, see grpc_ps_test.)
TEST(WorkerClientTest, NarrowWireTypesRoundSparseGradientsWithoutErrorFeedback) {
  WorkerClientOptions wo;
  wo.wire_dtype = WireDtype::kBF16;
  Fixture f(WithTable(1), wo);
  const SparseTableSpec& table = f.cluster->config().tables[0];
  const std::vector<int64_t> ids = {3, 4};
  std::vector<float> params(14), rows(6);
  ASSERT_TRUE(f.client->Pull(0, 0, params.data(), {{0, ids.data(), 2, rows.data()}}).ok());
  const std::vector<float> initial = InitialRows(table, ids);
  EXPECT_EQ(rows, initial);
  const std::vector<float> grads(14, 0.0f), row_grads(6, 1.001f);  // 1.0 in bf16, every time
  for (int s = 0; s < 3; ++s) {
    ASSERT_TRUE(f.client->Push(s, grads.data(), {{0, ids.data(), 2, row_grads.data()}}).ok());
    ASSERT_TRUE(f.client->Pull(s + 1, s, params.data(), {{0, ids.data(), 2, rows.data()}}).ok());
  }
  for (size_t i = 0; i < rows.size(); ++i) EXPECT_EQ(rows[i], initial[i] - 1.0f - 1.0f - 1.0f);
}

// A chief killed after ps 0 decided its step, before its pull carried the decision to the other tasks, comes back
// to tasks at different steps (ps 0 at 1, ps 1 at 0). The task behind is not a lost state to restore from a
// checkpoint: it catches up from the decisions ps 0 logged, which the new chief's first pull relays.
// Step 0's push of every layer (14 floats), waited for.
void PushAllLayers(WorkerClient* client, const std::vector<float>& grads) {
  ASSERT_TRUE(client->BeginPush(0, grads.data()).ok());
  client->PushRange(0, 14);
  client->FinishPush();
  ASSERT_TRUE(client->WaitPush().ok());
}

TEST(WorkerClientTest, AChiefBackFromAKillFindsATaskBehindPs0AndBringsItAlong) {
  SimClusterOptions o = Layers(2);
  o.config = MakeConfig("sync", 2, 1, 0.5f);  // R = 1 of 2 workers: the chief alone decides a step
  Fixture f(o);
  const std::vector<float> grads(14, 1.0f);
  PushAllLayers(f.client.get(), grads);
  ASSERT_EQ(f.cluster->task(0).step(), 1);
  ASSERT_EQ(f.cluster->task(1).step(), 0);
  f.client.reset();  // killed before its pull

  WorkerClientOptions wo;
  wo.initial_backoff = absl::Milliseconds(5);
  WorkerClient chief(f.tasks, f.cluster->placement().task_slices, 0, true, wo);
  const absl::Status connected = chief.Connect(f.cluster->config(), f.cluster->initial().data(), absl::Seconds(5));
  ASSERT_TRUE(connected.ok()) << connected;
  std::vector<float> params(14);
  absl::StatusOr<PullResult> pulled = chief.Pull(0, 0, params.data());
  ASSERT_TRUE(pulled.ok()) << pulled.status();
  EXPECT_EQ(pulled->step, 1);
  EXPECT_EQ(f.cluster->task(1).step(), 1);
  EXPECT_EQ(params, std::vector<float>(14, 0.5f));  // 1 - 0.5 x 1 on both tasks' slices
}

// A chief that brings the tasks back to a checkpoint restores ps 0 last. Restored first, ps 0 would run the new
// epoch while another task still held the old one: a worker registering again in that window could upload a step
// to that task, have the task's rollback void it, and still commit it to ps 0, which would then decide a step that
// task can never apply (ps_restart_test met this once under ASan: "does not hold its gradients for that step").
TEST(WorkerClientTest, TheChiefRestoresPs0AfterEveryOtherTask) {
  ScratchDir dir("restore_order");
  SimClusterOptions o = Layers(3);
  o.checkpoint.dir = dir.path();
  o.checkpoint.save_steps = 1;
  {
    Fixture f(o);
    const std::vector<float> grads(14, 1.0f);
    PushAllLayers(f.client.get(), grads);
    std::vector<float> params(14);
    absl::StatusOr<PullResult> pulled = f.client->Pull(1, 0, params.data());
    ASSERT_TRUE(pulled.ok()) << pulled.status();
    ASSERT_EQ(pulled->step, 1);
  }  // every task killed after saving step 1

  std::mutex mu;
  std::vector<std::string> log;
  std::vector<std::unique_ptr<ParameterServer>> restarted;
  std::vector<std::unique_ptr<ObservedPs>> observed;
  std::vector<PsInterface*> tasks;
  const Placement placement = *PlaceVariables(o.variables, 3, o.placement);
  for (int t = 0; t < 3; ++t) {
    ParameterServerOptions po;
    po.task_index = t;
    po.num_ps = 3;
    po.num_workers = 1;
    po.checkpoint = o.checkpoint;
    absl::StatusOr<std::unique_ptr<ParameterServer>> ps = ParameterServer::Create(po);
    ASSERT_TRUE(ps.ok()) << ps.status();
    restarted.push_back(*std::move(ps));
    observed.push_back(std::make_unique<ObservedPs>(restarted.back().get(), absl::StrCat("ps", t), &log, &mu));
    tasks.push_back(observed.back().get());
  }
  WorkerClientOptions wo;
  wo.initial_backoff = absl::Milliseconds(5);
  WorkerClient chief(tasks, placement.task_slices, 0, true, wo);
  const std::vector<float> initial(14, 1.0f);
  const absl::Status connected = chief.Connect(o.config, initial.data(), absl::Seconds(5));
  ASSERT_TRUE(connected.ok()) << connected;
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_EQ(log, (std::vector<std::string>{"ps1:restore 1", "ps2:restore 1", "ps0:restore 1"}));
  for (int t = 0; t < 3; ++t) EXPECT_EQ(restarted[t]->step(), 1) << "ps task " << t;
}

}  // namespace
}  // namespace dtrain::ps
