// A ps task killed mid-run and started again with the same options: the workers see it unavailable, retry,
// get Aborted (no session), connect again; the chief asks every task what it can restore and rolls them all
// back to the newest step they share; training ends where it would have without the restart (sync: exactly
// the same parameters, since the steps after the checkpoint are computed again from the same values), with a
// sparse embedding table too (its rows and accumulators restored from the checkpoints).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/cancellation.h"
#include "common/status_macros.h"
#include "gtest/gtest.h"
#include "ps/core/parameter_server.h"
#include "ps/client/placement.h"
#include "ps/testing/ps_test_util.h"
#include "ps/client/worker_client.h"

namespace dtrain::ps {
namespace {

using ::dtrain::ps::testing::MakeConfig;
using ::dtrain::ps::testing::TestGradient;

// One ps task that can be killed (its in-memory state is gone; calls in flight and new calls fail Unavailable,
// as over a dropped connection) and started again: a fresh ParameterServer with the same options.
class RestartablePs : public PsInterface {
 public:
  explicit RestartablePs(ParameterServerOptions options) : options_(std::move(options)) { Start(); }

  void Kill() {
    std::shared_ptr<Cancellation> killed;
    {
      absl::MutexLock lock(&mu_);
      ps_.reset();
      killed = std::move(kill_);
      ++generation_;
    }
    if (killed) killed->Cancel();
  }
  void Start() {
    absl::MutexLock lock(&mu_);
    ps_ = std::shared_ptr<ParameterServer>(*ParameterServer::Create(options_));
    kill_ = std::make_shared<Cancellation>();
    ++generation_;
    ++starts_;
  }
  int starts() {
    absl::MutexLock lock(&mu_);
    return starts_;
  }
  int64_t step() {
    absl::MutexLock lock(&mu_);
    return ps_ ? ps_->step() : -1;
  }

  absl::StatusOr<RegisterResponse> Register(const RegisterRequest& r) override {
    ASSIGN_OR_RETURN(Live live, Current());
    return live.ps->Register(r);
  }
  absl::StatusOr<std::unique_ptr<SliceUpload>> StartInitialize(int w) override {
    ASSIGN_OR_RETURN(Live live, Current());
    ASSIGN_OR_RETURN(std::unique_ptr<SliceUpload> up, live.ps->StartInitialize(w));
    return std::unique_ptr<SliceUpload>(new Upload(this, std::move(live), std::move(up)));
  }
  absl::StatusOr<std::unique_ptr<SliceUpload>> StartPush(const PushHeader& h) override {
    ASSIGN_OR_RETURN(Live live, Current());
    ASSIGN_OR_RETURN(std::unique_ptr<SliceUpload> up, live.ps->StartPush(h));
    return std::unique_ptr<SliceUpload>(new Upload(this, std::move(live), std::move(up)));
  }
  absl::Status Pull(const PullRequest& r, PullReceiver* receiver) override {
    ASSIGN_OR_RETURN(Live live, Current());
    // Ends when the caller cancels or the task is killed, whichever comes first.
    Cancellation either;
    PullRequest request = r;
    request.cancel = &either;
    const int64_t by_caller = r.cancel ? r.cancel->Register([&either] { either.Cancel(); }) : 0;
    const int64_t by_kill = live.kill->Register([&either] { either.Cancel(); });
    absl::Status s = live.ps->Pull(request, receiver);
    live.kill->Deregister(by_kill);
    if (r.cancel) r.cancel->Deregister(by_caller);
    if (live.kill->cancelled()) return Down();
    return s;
  }
  absl::Status Done(const DoneRequest& request) override {
    ASSIGN_OR_RETURN(Live live, Current());
    return live.ps->Done(request);
  }
  absl::StatusOr<int64_t> Heartbeat(int w, uint64_t session) override {
    ASSIGN_OR_RETURN(Live live, Current());
    return live.ps->Heartbeat(w, session);
  }
  absl::StatusOr<TrainingStats> GetStats() override {
    ASSIGN_OR_RETURN(Live live, Current());
    return live.ps->GetStats();
  }
  absl::StatusOr<CheckpointProbe> Probe(const TrainConfig& c) override {
    ASSIGN_OR_RETURN(Live live, Current());
    return live.ps->Probe(c);
  }
  absl::Status Restore(const TrainConfig& c, int w, int64_t step) override {
    ASSIGN_OR_RETURN(Live live, Current());
    return live.ps->Restore(c, w, step);
  }

 private:
  struct Live {
    std::shared_ptr<ParameterServer> ps;
    std::shared_ptr<Cancellation> kill;
  };
  absl::Status Down() const {
    return absl::UnavailableError(absl::StrCat("ps task ", options_.task_index, " is down (killed)"));
  }
  absl::StatusOr<Live> Current() {
    absl::MutexLock lock(&mu_);
    if (!ps_) return Down();
    return Live{ps_, kill_};
  }
  // An upload to the instance it started on: once that one is killed, what is left fails Unavailable.
  class Upload : public SliceUpload {
   public:
    Upload(RestartablePs* owner, Live live, std::unique_ptr<SliceUpload> up)
        : owner_(owner), live_(std::move(live)), up_(std::move(up)) {}
    absl::Status Write(uint32_t key, int64_t offset, int64_t n, WireDtype dtype, const void* data) override {
      if (live_.kill->cancelled()) return owner_->Down();
      return up_->Write(key, offset, n, dtype, data);
    }
    absl::Status WriteSparse(uint32_t table, const int64_t* ids, int64_t n, int dim, WireDtype dtype,
                             const void* rows) override {
      if (live_.kill->cancelled()) return owner_->Down();
      return up_->WriteSparse(table, ids, n, dim, dtype, rows);
    }
    absl::StatusOr<PushResponse> Finish() override {
      if (live_.kill->cancelled()) return owner_->Down();
      return up_->Finish();
    }

   private:
    RestartablePs* owner_;
    Live live_;
    std::unique_ptr<SliceUpload> up_;
  };

  const ParameterServerOptions options_;
  absl::Mutex mu_;
  std::shared_ptr<ParameterServer> ps_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<Cancellation> kill_ ABSL_GUARDED_BY(mu_);
  int64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  int starts_ ABSL_GUARDED_BY(mu_) = 0;
};

struct Case {
  std::string mode;
  int victim;           // the ps task that is killed and started again; -1: none
  bool sparse = false;  // the model has an embedding table too (its rows are checkpointed and restored)
};

// With Case::sparse: a hash table of dim 4 (adagrad); worker w pulls and pushes ids kIds[w] every step (both
// touch 3 and 40, each id held by either task).
constexpr int kDim = 4;
const std::vector<int64_t> kIds[2] = {{1, 3, 17, 40, 99}, {3, 8, 40, 64, 1000003}};

std::vector<float> RowGradient(int worker, int64_t step, const std::vector<float>& rows) {
  std::vector<float> g(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) g[i] = 0.5f * rows[i] + 0.02f * (worker + 1) - 0.001f * step;
  return g;
}

constexpr int kNumPs = 2, kNumWorkers = 2, kSteps = 30, kKillAt = 13, kSaveEvery = 5;

// Trains kSteps with kNumWorkers threads through WorkerClients; kills ps task `victim` when worker 0 reaches
// step kKillAt and starts it again 30 ms later. Returns the final parameters (pulled by the chief at the end).
std::vector<float> Train(const Case& c, const std::string& dir, int* reconnects) {
  const std::vector<VariableInfo> vars = {{"a/w", 60}, {"a/b", 5}, {"b/w", 90}, {"b/b", 7}};
  PlacementOptions po;
  po.min_slice_bytes = 0;
  Placement placement = *PlaceVariables(vars, kNumPs, po);
  TrainConfig config = MakeConfig(c.mode, kNumWorkers, kNumWorkers, /*learning_rate=*/0.05f);
  config.optimizer.name = "momentum";
  config.optimizer.momentum = 0.9f;
  config.train_steps = kSteps;
  if (c.sparse) {
    SparseTableSpec t;
    t.name = "emb";
    t.dim = kDim;
    t.init_scale = 0.1f;
    config.tables = {t};
    config.sparse_optimizer.name = "adagrad";
    config.sparse_optimizer.learning_rate = 0.1f;
  }
  int64_t total = 0;
  for (const VariableInfo& v : vars) total += v.size;
  std::vector<float> initial(total);
  for (int64_t i = 0; i < total; ++i) initial[i] = 0.01f * static_cast<float>(i % 13) - 0.06f;

  std::vector<std::unique_ptr<RestartablePs>> tasks;
  std::vector<PsInterface*> task_ptrs;
  for (int t = 0; t < kNumPs; ++t) {
    ParameterServerOptions o;
    o.task_index = t;
    o.num_ps = kNumPs;
    o.num_workers = kNumWorkers;
    o.checkpoint.dir = dir;
    o.checkpoint.save_steps = kSaveEvery;
    o.checkpoint.keep = 0;
    tasks.push_back(std::make_unique<RestartablePs>(o));
    task_ptrs.push_back(tasks.back().get());
  }
  std::atomic<int> total_reconnects{0};
  std::vector<float> final_params;
  auto worker = [&](int id) {
    WorkerClientOptions wo;
    wo.background = id != 0;  // one worker inline, one with transfer threads
    wo.initial_backoff = absl::Milliseconds(5);
    wo.max_backoff = absl::Milliseconds(100);
    wo.step_timeout = absl::Seconds(20);
    WorkerClient client(task_ptrs, placement.task_slices, id, id == 0, wo);
    ASSERT_TRUE(client.Connect(config, initial.data(), absl::Seconds(20)).ok());
    std::vector<float> params(total);
    const std::vector<int64_t>& ids = kIds[id];
    std::vector<float> rows(ids.size() * kDim);
    // Every pull brings the rows of this worker's ids (with a table), every push their gradients.
    auto pull = [&](int64_t min_step, int64_t since_step) {
      if (c.sparse) {
        const absl::Status s = client.SetSparsePull({{0, ids.data(), static_cast<int64_t>(ids.size()), rows.data()}});
        if (!s.ok()) return absl::StatusOr<PullResult>(s);
      }
      return client.Pull(min_step, since_step, params.data());
    };
    auto push = [&](int64_t step, const std::vector<float>& grad) {
      if (!c.sparse) return client.Push(step, grad.data());
      const std::vector<float> row_grads = RowGradient(id, step, rows);
      return client.Push(step, grad.data(), {{0, ids.data(), static_cast<int64_t>(ids.size()), row_grads.data()}});
    };
    absl::StatusOr<PullResult> at = pull(0, 0);
    // Async: worker 0 does not wait for worker 1, and may have killed and restarted a task before this first
    // pull (a slow thread start, e.g. under ASan): connect again, as after any restart.
    while (!at.ok() && at.status().code() == absl::StatusCode::kAborted) {
      ASSERT_LT(++total_reconnects, 40) << "reconnecting for ever";
      ASSERT_TRUE(client.Reconnect(absl::Seconds(20)).ok());
      at = pull(0, 0);
    }
    ASSERT_TRUE(at.ok()) << at.status();
    bool killed = false;
    while (at->step < kSteps && !at->training_done) {
      const int64_t step = at->step;
      if (id == 0 && c.victim >= 0 && step >= kKillAt && !killed) {  // async: the step may jump past it
        killed = true;
        tasks[c.victim]->Kill();
        std::this_thread::sleep_for(std::chrono::milliseconds(30));
        tasks[c.victim]->Start();
      }
      const std::vector<float> grad = TestGradient(id, step, params);
      absl::StatusOr<PushResponse> pushed = push(step, grad);
      at = pushed.ok() ? pull(step + 1, step) : absl::StatusOr<PullResult>(pushed.status());
      if (!at.ok()) {
        // Only Aborted is expected: Unavailable while the task is down is retried inside the client.
        ASSERT_EQ(at.status().code(), absl::StatusCode::kAborted) << "worker " << id << ": " << at.status();
        // Connecting again may race with the chief's rollback (which voids the sessions just made): then the
        // first pull is Aborted too, and the worker connects once more (as the trainer does).
        do {
          ASSERT_LT(++total_reconnects, 40) << "reconnecting for ever";
          ASSERT_TRUE(client.Reconnect(absl::Seconds(20)).ok());
          at = pull(0, 0);
        } while (!at.ok() && at.status().code() == absl::StatusCode::kAborted);
        ASSERT_TRUE(at.ok()) << at.status();
      }
    }
    if (id == 0) {
      // The final state: the dense parameters and (with a table) every row both workers trained.
      std::vector<int64_t> all = kIds[0];
      all.insert(all.end(), {8, 64, 1000003});
      std::vector<float> all_rows(all.size() * kDim);
      if (c.sparse) {
        ASSERT_TRUE(client.SetSparsePull({{0, all.data(), static_cast<int64_t>(all.size()), all_rows.data()}}).ok());
      }
      absl::StatusOr<PullResult> newest = client.Pull(kSteps, 0, params.data());
      ASSERT_TRUE(newest.ok()) << newest.status();
      // Async: both workers may push at the last step.
      if (c.mode == "sync") {
        EXPECT_EQ(newest->step, kSteps);
      }
      EXPECT_GE(newest->step, kSteps);
      final_params = params;
      if (c.sparse) final_params.insert(final_params.end(), all_rows.begin(), all_rows.end());
    }
    EXPECT_TRUE(client.Done().ok());
  };
  std::thread w1(worker, 1);
  worker(0);
  w1.join();
  if (c.victim >= 0) {
    EXPECT_EQ(tasks[c.victim]->starts(), 2);
  }
  if (c.mode == "sync") {
    for (int t = 0; t < kNumPs; ++t) EXPECT_EQ(tasks[t]->step(), kSteps) << "task " << t;
  }
  *reconnects = total_reconnects;
  return final_params;
}

class PsRestartTest : public ::testing::TestWithParam<Case> {};

TEST_P(PsRestartTest, TheClusterRollsBackToTheNewestCommonCheckpointAndFinishes) {
  const Case& c = GetParam();
  const std::string base =
      absl::StrCat(::testing::TempDir(), "/dtrain_restart_", getpid(), "_", c.mode, "_", c.victim, c.sparse ? "_s" : "");
  std::filesystem::remove_all(base);
  int reconnects = 0;
  const std::vector<float> uninterrupted = Train(Case{c.mode, -1, c.sparse}, base + "/a", &reconnects);
  EXPECT_EQ(reconnects, 0);
  const std::vector<float> restarted = Train(c, base + "/b", &reconnects);
  EXPECT_GT(reconnects, 0) << "the workers noticed the restart";
  ASSERT_EQ(restarted.size(), uninterrupted.size());
  if (c.mode == "sync") {
    // Rolled back to step 10 (the checkpoint before step 13) and computed steps 10..12 again from the same
    // values: the same parameters as without the restart.
    EXPECT_EQ(restarted, uninterrupted);
  } else {
    // Async: the order of updates differs from run to run (each gradient is computed on whatever version the
    // worker pulled), and the two workers' last pushes may overshoot the last step by one; each update moves a
    // value by about 0.05 here. So: finite, and within several updates of the uninterrupted run (a task left
    // behind would be tens of updates away). 0.2 was too tight: under ASan on a loaded CI machine the ordering
    // alone once gave 0.257. The rollback itself is checked exactly in sync mode (above).
    double worst = 0;
    for (size_t i = 0; i < restarted.size(); ++i) {
      ASSERT_TRUE(std::isfinite(restarted[i])) << i;
      worst = std::max(worst, std::abs(static_cast<double>(restarted[i]) - uninterrupted[i]));
    }
    EXPECT_LT(worst, 0.4);
  }
  std::filesystem::remove_all(base);
}

INSTANTIATE_TEST_SUITE_P(Victims, PsRestartTest,
                         ::testing::Values(Case{"sync", 0}, Case{"sync", 1}, Case{"async", 0}, Case{"async", 1},
                                           Case{"sync", 0, true}, Case{"sync", 1, true}, Case{"async", 1, true}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return absl::StrCat(info.param.mode, "_ps", info.param.victim,
                                               info.param.sparse ? "_sparse" : "");
                         });

}  // namespace
}  // namespace dtrain::ps
