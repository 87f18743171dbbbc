// Several ps tasks in sync mode with the decision-passing protocol: the result must equal one ps task's.
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "gtest/gtest.h"
#include "ps/checkpoint/checkpoint_test_util.h"
#include "ps/core/parameter_server.h"
#include "ps/testing/ps_test_util.h"

namespace dtrain::ps {
namespace {

using ::dtrain::ps::testing::MakeConfig;
using ::dtrain::ps::testing::Pulled;
using ::dtrain::ps::testing::PullSlices;
using ::dtrain::ps::testing::PushSlices;
using ::dtrain::ps::testing::Slices;
using ::dtrain::ps::testing::SimCluster;
using ::dtrain::ps::testing::SimClusterOptions;
using ::dtrain::ps::testing::SimWorker;
using ::dtrain::ps::testing::TestGradient;

std::vector<VariableInfo> Variables() { return {{"conv/w", 40}, {"conv/b", 4}, {"fc/w", 300}, {"fc/b", 6}}; }

std::vector<float> InitialValues() {
  std::vector<float> v(350);
  for (size_t i = 0; i < v.size(); ++i) v[i] = 0.01f * static_cast<float>(i % 17) - 0.05f;
  return v;
}

constexpr char kClusterToken[] = "a-cluster-token-of-32-characters";

SimClusterOptions Options(int num_ps, int num_workers, int r, const std::string& optimizer) {
  SimClusterOptions o;
  o.variables = Variables();
  o.num_ps = num_ps;
  o.placement.min_slice_bytes = 400;  // fc/w (1200 bytes) is split in 2 or 3
  o.config = MakeConfig("sync", num_workers, r, /*learning_rate=*/0.05f);
  o.config.optimizer.name = optimizer;
  o.config.moving_average_decay = 0.9f;
  o.initial = InitialValues();
  return o;
}

class Recorder {
 public:
  std::function<void(const StepDecision&)> Hook() {
    return [this](const StepDecision& d) {
      std::lock_guard<std::mutex> lock(mu_);
      decisions_.push_back(d);
    };
  }
  std::vector<StepDecision> decisions() {
    std::lock_guard<std::mutex> lock(mu_);
    return decisions_;
  }

 private:
  std::mutex mu_;
  std::vector<StepDecision> decisions_;
};

// Trains kSteps on `num_ps` tasks with worker threads; returns the final flat parameters and the decisions.
void RunCluster(int num_ps, int num_workers, int r, const std::string& optimizer, int steps, bool jitter,
                std::vector<float>* final_params, std::vector<StepDecision>* decisions) {
  Recorder recorder;
  SimClusterOptions options = Options(num_ps, num_workers, r, optimizer);
  options.on_step_applied = recorder.Hook();
  options.decision_key = kClusterToken;  // as dtrain_ps with --auth_token_file: ps 0 signs, the others check
  auto cluster = *SimCluster::Start(options);
  // Every worker connects before any trains, the chief first: with R below the number of workers, two workers
  // could otherwise decide step 0 on ps 0 before the chief's connect probes the tasks, and find them at
  // different steps (the other tasks apply a decision when a pull brings it).
  std::vector<std::unique_ptr<SimWorker>> workers;
  for (int id = 0; id < num_workers; ++id) workers.push_back(std::make_unique<SimWorker>(cluster.get(), id));
  std::vector<std::thread> threads;
  for (int id = 0; id < num_workers; ++id) {
    threads.emplace_back([&, id] {
      SimWorker& w = *workers[id];
      std::vector<float> params;
      int64_t step = *w.Pull(0, 0, &params);
      while (step < steps) {
        // Make a different worker the slow one from step to step, so the decided sets vary.
        if (jitter && (step + id) % num_workers == 0) std::this_thread::sleep_for(std::chrono::milliseconds(15));
        ASSERT_TRUE(w.Push(step, TestGradient(id, step, params)).ok());
        absl::StatusOr<int64_t> next = w.Pull(step + 1, step, &params);
        ASSERT_TRUE(next.ok()) << next.status();
        step = *next;
      }
      if (id == 0) *final_params = params;  // its last pull brought the values after the last step
      ASSERT_TRUE(w.Done().ok());
    });
  }
  for (std::thread& t : threads) t.join();
  for (int t = 0; t < num_ps; ++t) EXPECT_TRUE(cluster->task(t).finished()) << "task " << t;
  // Every task has applied every step (the last pull of each worker passed the last decisions on).
  for (int t = 0; t < num_ps; ++t) EXPECT_EQ(cluster->task(t).step(), steps) << "task " << t;
  ASSERT_EQ(final_params->size(), Options(num_ps, num_workers, r, optimizer).initial.size());
  *decisions = recorder.decisions();
}

// Replays `decisions` on one ps task: at each step the decided workers push, in decision order, gradients
// computed on that step's parameters.
std::vector<float> Replay(int num_workers, int r, const std::string& optimizer,
                          const std::vector<StepDecision>& decisions) {
  auto cluster = *SimCluster::Start(Options(1, num_workers, r, optimizer));
  std::vector<SimWorker> workers;
  for (int id = 0; id < num_workers; ++id) workers.emplace_back(cluster.get(), id);
  std::vector<float> params;
  for (const StepDecision& d : decisions) {
    EXPECT_EQ(*workers[0].Pull(d.step, 0, &params), d.step);
    for (int id : d.workers) {
      EXPECT_EQ(*workers[id].Push(d.step, TestGradient(id, d.step, params)), PushResponse::Outcome::kAccepted);
    }
  }
  EXPECT_EQ(*workers[0].Pull(decisions.size(), 0, &params), static_cast<int64_t>(decisions.size()));
  return params;
}

struct Case {
  int num_ps, num_workers, r;
  std::string optimizer;
  bool jitter;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.num_ps << " ps, " << c.num_workers << " workers, R=" << c.r << ", " << c.optimizer
      << (c.jitter ? ", jitter" : "");
}

class MultiPsTest : public ::testing::TestWithParam<Case> {};

TEST_P(MultiPsTest, SameParametersAsOnePsTask) {
  const Case c = GetParam();
  constexpr int kSteps = 12;
  std::vector<float> params;
  std::vector<StepDecision> decisions;
  RunCluster(c.num_ps, c.num_workers, c.r, c.optimizer, kSteps, c.jitter, &params, &decisions);
  ASSERT_EQ(decisions.size(), static_cast<size_t>(kSteps));
  std::set<std::vector<int>> distinct;
  for (const StepDecision& d : decisions) {
    EXPECT_EQ(d.workers.size(), static_cast<size_t>(c.r));
    std::vector<int> sorted = d.workers;
    std::sort(sorted.begin(), sorted.end());
    distinct.insert(sorted);
  }
  if (c.jitter) {
    EXPECT_GE(distinct.size(), 2u) << "the decided sets did not vary";
  }
  const std::vector<float> expected = Replay(c.num_workers, c.r, c.optimizer, decisions);
  ASSERT_EQ(params.size(), expected.size());
  const std::vector<float> initial = InitialValues();
  float max_change = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    ASSERT_NEAR(params[i], expected[i], 1e-6) << "element " << i;
    max_change = std::max(max_change, std::abs(params[i] - initial[i]));
  }
  EXPECT_GT(max_change, 1e-3);  // training moved the parameters
}

INSTANTIATE_TEST_SUITE_P(
    Clusters, MultiPsTest,
    ::testing::Values(Case{2, 2, 2, "sgd", false}, Case{2, 2, 2, "adam", false}, Case{2, 3, 2, "momentum", true},
                      Case{3, 3, 2, "adam", true}, Case{2, 1, 1, "sgd", false}),
    [](const ::testing::TestParamInfo<Case>& info) {
      const Case& c = info.param;
      return absl::StrCat(c.num_ps, "ps_", c.num_workers, "workers_R", c.r, "_", c.optimizer);
    });

TEST(MultiPsProtocolTest, MissingOrUnbufferedDecisionsAreRejected) {
  auto cluster = *SimCluster::Start(Options(2, 2, 2, "sgd"));
  ParameterServer& task1 = cluster->task(1);
  const uint64_t session0 = cluster->Session(1, 0), session1 = cluster->Session(1, 1);
  PullRequest gap;
  gap.worker_id = 0;
  gap.session = session0;
  gap.decisions = {{1, {0, 1}}};  // step 0's decision is missing
  absl::StatusOr<Pulled> r = PullSlices(task1, gap);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("missing decision for step 0"), std::string::npos) << r.status();

  // Worker 0 pushed step 0 to task 1, worker 1 did not: a decision naming worker 1 cannot be applied.
  const Slices ones = cluster->SlicesFor(1, std::vector<float>(cluster->total_floats(), 1.0f));
  ASSERT_TRUE(PushSlices(task1, PushHeader{0, 0, 1, false, session0}, ones).ok());
  PullRequest unbuffered;
  unbuffered.worker_id = 0;
  unbuffered.session = session0;
  unbuffered.decisions = {{0, {0, 1}}};
  r = PullSlices(task1, unbuffered);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("includes worker 1"), std::string::npos) << r.status();
  EXPECT_EQ(task1.step(), 0);

  // A decision for step 0 with worker 0 only is applied; repeating it later is skipped.
  PullRequest ok;
  ok.worker_id = 0;
  ok.session = session0;
  ok.min_step = 1;
  ok.decisions = {{0, {0}}};
  r = PullSlices(task1, ok);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->header.step, 1);
  r = PullSlices(task1, ok);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->header.step, 1);
  EXPECT_EQ(task1.GetStats()->workers[0].applied, 1);
  // A push for step 0 now is a backup's.
  EXPECT_EQ(PushSlices(task1, PushHeader{1, 0, 1, false, session1}, ones)->outcome,
            PushResponse::Outcome::kDroppedBackup);
}

// A task that rolled back (the chief's restore, as after a ps task restarted) dropped the gradients it held. A
// worker can still bring it a decision made before (ps 0 rolls back after it, say): it is told to register again
// (Aborted, which a worker answers by connecting again), not that the protocol broke (FailedPrecondition).
TEST(MultiPsProtocolTest, ADecisionFromBeforeARollbackAsksTheWorkerToRegisterAgain) {
  testing::ScratchDir dir("decision_rollback");
  SimClusterOptions o = Options(2, 2, 2, "sgd");
  o.checkpoint.dir = dir.path();
  o.checkpoint.save_steps = 1;
  auto cluster = *SimCluster::Start(o);
  SimCluster* c = cluster.get();
  const std::vector<float> ones(c->total_floats(), 1.0f);
  for (int w = 0; w < 2; ++w) {
    ASSERT_TRUE(PushSlices(c->task(1), PushHeader{w, 0, 10u + w, false, c->Session(1, w)}, c->SlicesFor(1, ones)).ok());
    ASSERT_TRUE(PushSlices(c->task(0), PushHeader{w, 0, 10u + w, true, c->Session(0, w)}, c->SlicesFor(0, ones)).ok());
  }
  PullRequest p0;
  p0.worker_id = 0;
  p0.session = c->Session(0, 0);
  p0.min_step = 1;
  absl::StatusOr<Pulled> at0 = PullSlices(c->task(0), p0);
  ASSERT_TRUE(at0.ok()) << at0.status();
  ASSERT_EQ(at0->header.decisions.size(), 1u);
  PullRequest p1 = p0;
  p1.session = c->Session(1, 0);
  p1.decisions = at0->header.decisions;
  ASSERT_TRUE(PullSlices(c->task(1), p1).ok());
  ASSERT_EQ(c->task(1).step(), 1);  // and it saved step 1
  // Both workers push step 1 to task 1; ps 0 decides it (here: a decision naming both).
  for (int w = 0; w < 2; ++w) {
    ASSERT_TRUE(PushSlices(c->task(1), PushHeader{w, 1, 20u + w, false, c->Session(1, w)}, c->SlicesFor(1, ones)).ok());
  }
  StepDecision step1 = at0->header.decisions[0];
  step1.step = 1;
  // Task 1 rolls back to its checkpoint of step 1: the gradients of step 1 go with it.
  TrainConfig config = c->config();
  config.slices = c->placement().task_slices[1];
  ASSERT_TRUE(c->task(1).Restore(config, 0, 1).ok());
  PullRequest late = p1;
  late.session = c->Session(1, 0);  // registered again
  late.min_step = 2;
  late.decisions = {step1};
  absl::StatusOr<Pulled> r = PullSlices(c->task(1), late);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kAborted) << r.status();
  EXPECT_NE(r.status().message().find("register again"), std::string::npos) << r.status();
  EXPECT_EQ(c->task(1).step(), 1);
}

// Task 1 applies only decisions ps 0 signed with the cluster's token: a decision a worker forged or altered, or
// one without a signature, is refused (PermissionDenied) and nothing is applied.
TEST(MultiPsProtocolTest, OnlyDecisionsSignedByPsZeroAreApplied) {
  SimClusterOptions options = Options(2, 2, 2, "sgd");
  options.decision_key = kClusterToken;
  auto cluster = *SimCluster::Start(options);
  ParameterServer& task0 = cluster->task(0);
  ParameterServer& task1 = cluster->task(1);
  const uint64_t s00 = cluster->Session(0, 0), s01 = cluster->Session(0, 1);
  const uint64_t s10 = cluster->Session(1, 0), s11 = cluster->Session(1, 1);
  const std::vector<float> ones(cluster->total_floats(), 1.0f);
  // Both workers push step 0 to both tasks (committing on ps 0, which decides and signs step 0).
  ASSERT_TRUE(PushSlices(task1, PushHeader{0, 0, 1, false, s10}, cluster->SlicesFor(1, ones)).ok());
  ASSERT_TRUE(PushSlices(task1, PushHeader{1, 0, 1, false, s11}, cluster->SlicesFor(1, ones)).ok());
  ASSERT_TRUE(PushSlices(task0, PushHeader{0, 0, 1, true, s00}, cluster->SlicesFor(0, ones)).ok());
  ASSERT_TRUE(PushSlices(task0, PushHeader{1, 0, 1, true, s01}, cluster->SlicesFor(0, ones)).ok());
  PullRequest from0;
  from0.worker_id = 0;
  from0.session = s00;
  from0.min_step = 1;
  absl::StatusOr<Pulled> pulled0 = PullSlices(task0, from0);
  ASSERT_TRUE(pulled0.ok()) << pulled0.status();
  ASSERT_EQ(pulled0->header.decisions.size(), 1u);
  const StepDecision genuine = pulled0->header.decisions[0];
  EXPECT_EQ(genuine.mac.size(), 32u) << "ps 0 signs its decisions (HMAC-SHA256)";

  auto relay = [&](const StepDecision& d) {
    PullRequest r;
    r.worker_id = 0;
    r.session = s10;
    r.decisions = {d};
    return PullSlices(task1, r).status();
  };
  StepDecision altered = genuine;
  altered.workers = {0};  // as if worker 1's gradient were to be left out
  StepDecision unsigned_decision = genuine;
  unsigned_decision.mac.clear();
  StepDecision forged = altered;
  forged.mac = std::string(32, 'x');
  for (const StepDecision& bad : {altered, unsigned_decision, forged}) {
    absl::Status s = relay(bad);
    EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
    EXPECT_NE(s.message().find("not signed by ps task 0"), std::string::npos) << s;
  }
  EXPECT_EQ(task1.step(), 0) << "nothing applied";
  ASSERT_TRUE(relay(genuine).ok());
  EXPECT_EQ(task1.step(), 1);
}

}  // namespace
}  // namespace dtrain::ps
