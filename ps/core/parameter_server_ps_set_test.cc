// A change of the job's ps tasks while it runs (ps/core/ps_set_plan.h): ps 0 takes add-ps / remove-ps, fixes the
// step of the move at its next decision (every task saves it) and decides nothing past it, announces the new set
// in the pull headers, and the chief's WorkerClient::MoveTo moves the state (every task restores that checkpoint,
// resharded); a worker still on the old set hears the new one when it registers; the refusals are one line.
#include <unistd.h>

#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/env.h"
#include "common/testing/fault_injection_env.h"
#include "gtest/gtest.h"
#include "ps/api/ps_interface.h"
#include "ps/client/placement.h"
#include "ps/client/worker_client.h"
#include "ps/core/parameter_server.h"
#include "ps/testing/ps_test_util.h"

namespace dtrain::ps {
namespace {

using ::dtrain::ps::testing::MakeConfig;
using Outcome = PushResponse::Outcome;

const std::vector<VariableInfo> kVariables = {{"w", 3}, {"b", 2}, {"v", 3}};

// `save_steps`, `env`: the checkpoint options of a test that needs an earlier checkpoint or a failing disk.
std::unique_ptr<ParameterServer> Task(int index, std::vector<std::string> hosts, const std::string& dir,
                                      int64_t save_steps = 0, Env* env = nullptr, int workers = 1) {
  ParameterServerOptions o;
  o.num_workers = workers;
  o.task_index = index;
  o.num_ps = static_cast<int>(hosts.size());
  o.ps_hosts = std::move(hosts);
  o.checkpoint.dir = dir;
  o.checkpoint.save_steps = save_steps;
  if (env != nullptr) {
    o.checkpoint.env = env;
    o.checkpoint.max_attempts = 1;
  }
  o.journal_applied = !dir.empty();
  absl::StatusOr<std::unique_ptr<ParameterServer>> ps = ParameterServer::Create(o);
  EXPECT_TRUE(ps.ok()) << ps.status();
  return ps.ok() ? *std::move(ps) : nullptr;
}

std::vector<std::vector<SliceSpec>> PlacementFor(int num_ps) {
  absl::StatusOr<Placement> p = PlaceVariables(kVariables, num_ps, {.min_slice_bytes = 0});
  EXPECT_TRUE(p.ok()) << p.status();
  return p->task_slices;
}

WorkerClientOptions Inline() {
  WorkerClientOptions o;
  o.background = false;
  return o;
}

TrainConfig SyncConfig(int num_ps) {
  TrainConfig c = MakeConfig("sync", /*num_workers=*/1, /*replicas_to_aggregate=*/1, /*learning_rate=*/0.5f);
  c.train_steps = 20;
  c.optimizer.name = "adam";  // optimizer slots move with the values
  c.num_ps = num_ps;
  return c;
}

// Trains `steps` steps with gradient (step + 1) * 0.1 in every float; returns the values pulled after them.
std::vector<float> Train(WorkerClient& client, int64_t* step, int steps) {
  std::vector<float> params(8), grads(8);
  for (int i = 0; i < steps; ++i, ++*step) {
    for (float& g : grads) g = 0.1f * static_cast<float>(*step + 1);
    absl::StatusOr<PushResponse> r = client.Push(*step, grads.data());
    EXPECT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(client.Pull(*step + 1, *step, params.data()).ok());
  }
  return params;
}

ControlRequest Change(const std::string& command, const std::string& address, int ps = 0) {
  ControlRequest r;
  r.command = command;
  r.address = address;
  r.ps = ps;
  return r;
}

// Pushes step `step` (Train's gradient) and pulls the next: after a change asked of ps 0, that pull's header
// announces the move at step + 1 (the step its decision ends at).
absl::StatusOr<PullResult> PushAndPull(WorkerClient& c, int64_t step) {
  std::vector<float> params(8), grads(8, 0.1f * static_cast<float>(step + 1));
  absl::StatusOr<PushResponse> pushed = c.Push(step, grads.data());
  if (!pushed.ok()) return pushed.status();
  if (pushed->outcome != Outcome::kAccepted) return absl::InternalError("the push was not accepted");
  return c.Pull(step + 1, step, params.data());
}

TEST(PsSetChangeTest, TheJobMovesOntoAnAddedTaskAndBackWithoutChangingItsArithmetic) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "/ps_set_change_", getpid());
  const std::string straight_dir = dir + "_straight";
  // The straight run: one ps task all along.
  auto straight = Task(0, {"h0:1"}, straight_dir);
  WorkerClient s(std::vector<PsInterface*>{straight.get()}, PlacementFor(1), 0, true, Inline());
  const std::vector<float> initial = {1, 2, 3, 4, 5, 6, 7, 8};
  ASSERT_TRUE(s.Connect(SyncConfig(1), initial.data(), absl::Seconds(5)).ok());
  int64_t straight_step = 0;
  const std::vector<float> expected = Train(s, &straight_step, 12);

  auto ps0 = Task(0, {"h0:1"}, dir);
  WorkerClient c(std::vector<PsInterface*>{ps0.get()}, PlacementFor(1), 0, true, Inline());
  ASSERT_TRUE(c.Connect(SyncConfig(1), initial.data(), absl::Seconds(5)).ok());
  int64_t step = 0;
  Train(c, &step, 4);

  // add-ps: the next decision (of step 4) fixes the move at step 5; nothing is decided past it until the move.
  ControlRequest add;
  add.command = "add-ps";
  add.address = "h1:2";
  absl::StatusOr<std::string> said = ps0->Control(add);
  ASSERT_TRUE(said.ok()) << said.status();
  EXPECT_EQ(*said, "ps task 1 (h1:2) joins at the next step boundary: 2 ps tasks");
  add.address = "h2:3";
  EXPECT_TRUE(absl::StrContains(ps0->Control(add).status().message(), "under way already"));
  std::vector<float> params(8), grads(8, 0.5f);  // step 4's gradient, as Train gives it
  ASSERT_EQ(c.Push(4, grads.data())->outcome, Outcome::kAccepted);
  absl::StatusOr<PullResult> at = c.Pull(5, 4, params.data());
  ASSERT_TRUE(at.ok()) << at.status();
  EXPECT_EQ(at->ps_set.version, 1);
  EXPECT_EQ(at->ps_set.step, 5);
  EXPECT_EQ(at->ps_set.hosts, (std::vector<std::string>{"h0:1", "h1:2"}));
  grads.assign(8, 0.1f * 6.0f);
  ASSERT_EQ(c.Push(5, grads.data())->outcome, Outcome::kAccepted);
  EXPECT_EQ(ps0->step(), 5);  // frozen: the commit waits for the move (and is voided by it)

  // The chief moves: ps 1 (a new process) takes its share of step 5, ps 0 keeps the rest.
  auto ps1 = Task(1, {"h0:1", "h1:2"}, dir);
  ASSERT_TRUE(c.MoveTo({ps0.get(), ps1.get()}, PlacementFor(2), at->ps_set, absl::Seconds(5)).ok());
  EXPECT_EQ(ps0->step(), 5);
  EXPECT_EQ(ps1->step(), 5);
  step = 5;  // the commit of step 5 was of the old epoch: it is trained again
  Train(c, &step, 3);

  // A worker still on the old set hears the new one from ps 0 when it registers.
  RegisterRequest old;
  old.worker_id = 0;
  old.is_chief = false;
  old.config = SyncConfig(1);
  old.config.slices = PlacementFor(1)[0];
  absl::StatusOr<RegisterResponse> refused = ps0->Register(old);
  ASSERT_FALSE(refused.ok());
  std::optional<PsSet> heard = ParsePsSetChanged(refused.status());
  ASSERT_TRUE(heard.has_value()) << refused.status();
  EXPECT_EQ(heard->hosts, (std::vector<std::string>{"h0:1", "h1:2"}));

  // remove-ps: never ps 0; then back onto one.
  ControlRequest remove;
  remove.command = "remove-ps";
  remove.ps = 0;
  EXPECT_TRUE(absl::StrContains(ps0->Control(remove).status().message(), "ps task 0 holds the global step"));
  remove.ps = 1;
  ASSERT_TRUE(ps0->Control(remove).ok());
  std::vector<float> values(8);
  grads.assign(8, 0.1f * 9.0f);  // step 8 as Train gives it: its decision fixes the move at step 9
  ASSERT_EQ(c.Push(8, grads.data())->outcome, Outcome::kAccepted);
  at = c.Pull(9, 8, values.data());
  ASSERT_TRUE(at.ok()) << at.status();
  step = 9;
  EXPECT_EQ(at->ps_set.version, 2);
  EXPECT_EQ(at->ps_set.leaving, (std::vector<std::string>{"h1:2"}));
  ASSERT_TRUE(c.MoveTo({ps0.get()}, PlacementFor(1), at->ps_set, absl::Seconds(5)).ok());
  ControlRequest retire;
  retire.command = "retire";
  ASSERT_TRUE(ps1->Control(retire).ok());
  EXPECT_TRUE(ps1->finished());
  EXPECT_TRUE(ps1->outcome().succeeded);
  EXPECT_EQ(ps0->step(), 9);
  // Steps 9..11 on one task again: the values equal the straight run's to the last bit (the same arithmetic,
  // Adam's slots moved with the values).
  EXPECT_EQ(Train(c, &step, 3), expected);
}

TEST(PsSetChangeTest, APs0RestartedAfterAMoveAdoptsTheJobsSetFromTheChief) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "/ps_set_restart_", getpid());
  auto ps0 = Task(0, {"h0:1"}, dir);
  WorkerClient c(std::vector<PsInterface*>{ps0.get()}, PlacementFor(1), 0, true, Inline());
  const std::vector<float> initial = {1, 2, 3, 4, 5, 6, 7, 8};
  ASSERT_TRUE(c.Connect(SyncConfig(1), initial.data(), absl::Seconds(5)).ok());
  int64_t step = 0;
  Train(c, &step, 3);
  ASSERT_TRUE(ps0->Control(Change("add-ps", "h1:2")).ok());
  absl::StatusOr<PullResult> at = PushAndPull(c, 3);
  ASSERT_TRUE(at.ok()) << at.status();
  ASSERT_EQ(at->ps_set.step, 4);
  std::vector<float> params(8);
  auto ps1 = Task(1, {"h0:1", "h1:2"}, dir);
  ASSERT_TRUE(c.MoveTo({ps0.get(), ps1.get()}, PlacementFor(2), at->ps_set, absl::Seconds(5)).ok());
  step = 4;
  Train(c, &step, 2);

  // ps 0 dies and is started again with the cluster spec, which names one ps task; the chief, connecting again,
  // brings both tasks back to the newest step they can restore (the move's) and ps 0 takes the set from its config.
  ps0.reset();
  ps0 = Task(0, {"h0:1"}, dir);
  PsSet now = at->ps_set;
  now.step = 0;  // nothing moves: the job runs on these already
  ASSERT_TRUE(c.MoveTo({ps0.get(), ps1.get()}, PlacementFor(2), now, absl::Seconds(5)).ok());
  EXPECT_EQ(ps0->step(), 4);
  EXPECT_EQ(ps1->step(), 4);
  absl::StatusOr<TrainingStats> stats = ps0->GetStats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->ps_hosts, (std::vector<std::string>{"h0:1", "h1:2"}));
  step = 4;
  at = c.Pull(4, 4, params.data());
  ASSERT_TRUE(at.ok()) << at.status();
  EXPECT_EQ(at->ps_set.version, 1);
  EXPECT_EQ(at->ps_set.hosts.size(), 2u);
  Train(c, &step, 2);
  // And it changes that set again: the last task leaves.
  ControlRequest remove;
  remove.command = "remove-ps";
  remove.ps = 1;
  absl::StatusOr<std::string> said = ps0->Control(remove);
  ASSERT_TRUE(said.ok()) << said.status();
  EXPECT_EQ(*said, "ps task 1 (h1:2) leaves at the next step boundary: 1 ps task");
}

// ps 0 killed in the move itself, before its part of the move's checkpoint was saved: that step cannot be restored,
// so the chief brings the new set to the newest step every task can restore (an earlier checkpoint, resharded) and
// the job trains on from there, its arithmetic unchanged, instead of waiting out its deadline and ending.
TEST(PsSetChangeTest, APs0KilledBeforeSavingTheMovesStepSendsTheNewSetBackToTheNewestCheckpoint) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "/ps_set_killed_", getpid());
  const std::vector<float> initial = {1, 2, 3, 4, 5, 6, 7, 8};
  auto straight = Task(0, {"h0:1"}, dir + "_straight");
  WorkerClient s(std::vector<PsInterface*>{straight.get()}, PlacementFor(1), 0, true, Inline());
  ASSERT_TRUE(s.Connect(SyncConfig(1), initial.data(), absl::Seconds(5)).ok());
  int64_t straight_step = 0;
  const std::vector<float> expected = Train(s, &straight_step, 8);

  ::dtrain::testing::FaultInjectionEnv disk(Env::Default());
  auto ps0 = Task(0, {"h0:1"}, dir, /*save_steps=*/3, &disk);
  WorkerClient c(std::vector<PsInterface*>{ps0.get()}, PlacementFor(1), 0, true, Inline());
  ASSERT_TRUE(c.Connect(SyncConfig(1), initial.data(), absl::Seconds(5)).ok());
  int64_t step = 0;
  Train(c, &step, 3);  // the checkpoint of step 3 is saved
  ASSERT_TRUE(ps0->Control(Change("add-ps", "h1:2")).ok());
  disk.FailRenames(1);  // ps 0's part of the move's checkpoint (step 4) never reaches its name: it "died" first
  absl::StatusOr<PullResult> at = PushAndPull(c, 3);
  ASSERT_TRUE(at.ok()) << at.status();
  ASSERT_EQ(at->ps_set.step, 4);

  // ps 0 comes back, started again with the spec (one ps task), no state; the joining task is up.
  auto restarted = Task(0, {"h0:1"}, dir);
  auto ps1 = Task(1, {"h0:1", "h1:2"}, dir);
  const absl::Time start = absl::Now();
  const absl::Status moved = c.MoveTo({restarted.get(), ps1.get()}, PlacementFor(2), at->ps_set, absl::Seconds(20));
  ASSERT_TRUE(moved.ok()) << moved;
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));  // not the deadline
  EXPECT_EQ(restarted->step(), 3);
  EXPECT_EQ(ps1->step(), 3);
  EXPECT_EQ(c.registered_step(), 3);
  absl::StatusOr<TrainingStats> stats = restarted->GetStats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->ps_hosts, (std::vector<std::string>{"h0:1", "h1:2"}));
  // Steps 3.. again, on two tasks: the values equal those of a run that never moved.
  step = 3;
  EXPECT_EQ(Train(c, &step, 5), expected);
}

// ps 0 killed after it announced a move and before the chief heard of it: the chief restores the job on the set it
// knows (the change died with ps 0), and a worker that heard of the change and moved is told the job's set (version
// 0, the spec's) when it registers, instead of a refusal that ends it.
TEST(PsSetChangeTest, AWorkerThatHeardOfAChangeLostWithPs0GoesBackToTheJobsSet) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "/ps_set_lost_", getpid());
  const std::vector<float> initial = {1, 2, 3, 4, 5, 6, 7, 8};
  auto ps0 = Task(0, {"h0:1"}, dir, /*save_steps=*/3);
  WorkerClient c(std::vector<PsInterface*>{ps0.get()}, PlacementFor(1), 0, true, Inline());
  ASSERT_TRUE(c.Connect(SyncConfig(1), initial.data(), absl::Seconds(5)).ok());
  int64_t step = 0;
  Train(c, &step, 3);
  const ControlRequest add = Change("add-ps", "h1:2");
  ASSERT_TRUE(ps0->Control(add).ok());
  absl::StatusOr<PullResult> at = PushAndPull(c, 3);
  ASSERT_TRUE(at.ok()) << at.status();
  ASSERT_EQ(at->ps_set.version, 1);

  // ps 0 dies; the chief never heard of the move and connects again on one task: the newest checkpoint.
  auto restarted = Task(0, {"h0:1"}, dir, /*save_steps=*/3);
  WorkerClient chief(std::vector<PsInterface*>{restarted.get()}, PlacementFor(1), 0, true, Inline());
  ASSERT_TRUE(chief.Connect(SyncConfig(1), initial.data(), absl::Seconds(5)).ok());
  EXPECT_EQ(restarted->step(), 4);  // the move's step was saved: the checkpoint of step 4

  RegisterRequest moved;
  moved.worker_id = 0;
  moved.is_chief = false;
  moved.config = SyncConfig(2);
  moved.config.ps_version = 1;
  moved.config.ps_hosts = {"h0:1", "h1:2"};
  moved.config.slices = PlacementFor(2)[0];
  absl::StatusOr<RegisterResponse> r = restarted->Register(moved);
  ASSERT_FALSE(r.ok());
  std::optional<PsSet> told = ParsePsSetChanged(r.status());
  ASSERT_TRUE(told.has_value()) << r.status();
  EXPECT_EQ(told->version, 0);
  EXPECT_EQ(told->hosts, (std::vector<std::string>{"h0:1"}));
  // The joiner asks again (as dtrain_ps --join does while it waits): a new change, not "(asked before)".
  absl::StatusOr<std::string> again = restarted->Control(add);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, "ps task 1 (h1:2) joins at the next step boundary: 2 ps tasks");
}

// A task other than the last leaves: the last one takes its index (it finds it by its address in the chief's
// config), restores that index's share, and every value of the job equals a run that never moved.
TEST(PsSetChangeTest, ATaskInTheMiddleLeavesAndTheLastTakesItsPlace) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "/ps_set_middle_", getpid());
  const std::vector<float> initial = {1, 2, 3, 4, 5, 6, 7, 8};
  auto straight = Task(0, {"h0:1"}, dir + "_straight");
  WorkerClient s(std::vector<PsInterface*>{straight.get()}, PlacementFor(1), 0, true, Inline());
  ASSERT_TRUE(s.Connect(SyncConfig(1), initial.data(), absl::Seconds(5)).ok());
  int64_t straight_step = 0;
  const std::vector<float> expected = Train(s, &straight_step, 10);

  const std::vector<std::string> hosts = {"h0:1", "h1:2", "h2:3"};
  auto ps0 = Task(0, hosts, dir);
  auto ps1 = Task(1, hosts, dir);
  auto ps2 = Task(2, hosts, dir);
  WorkerClient c(std::vector<PsInterface*>{ps0.get(), ps1.get(), ps2.get()}, PlacementFor(3), 0, true, Inline());
  ASSERT_TRUE(c.Connect(SyncConfig(3), initial.data(), absl::Seconds(5)).ok());
  int64_t step = 0;
  Train(c, &step, 3);
  const ControlRequest remove = Change("remove-ps", "", 1);
  absl::StatusOr<std::string> said = ps0->Control(remove);
  ASSERT_TRUE(said.ok()) << said.status();
  EXPECT_EQ(*said, "ps task 1 (h1:2) leaves at the next step boundary: 2 ps tasks; ps task 2 (h2:3) becomes ps task 1");
  absl::StatusOr<PullResult> at = PushAndPull(c, 3);
  ASSERT_TRUE(at.ok()) << at.status();
  ASSERT_EQ(at->ps_set.step, 4);
  EXPECT_EQ(at->ps_set.hosts, (std::vector<std::string>{"h0:1", "h2:3"}));
  EXPECT_EQ(at->ps_set.leaving, (std::vector<std::string>{"h1:2"}));
  ASSERT_TRUE(c.MoveTo({ps0.get(), ps2.get()}, PlacementFor(2), at->ps_set, absl::Seconds(5)).ok());
  ControlRequest retire;
  retire.command = "retire";
  ASSERT_TRUE(ps1->Control(retire).ok());
  EXPECT_TRUE(ps1->finished());
  EXPECT_EQ(ps2->step(), 4);
  step = 4;
  Train(c, &step, 3);
  EXPECT_TRUE(Env::Default()->FileExists(absl::StrCat(dir, "/model.ckpt-4.ps2-of-3")));  // the move's, as ps 2
  // The renumbered task dies and its scheduler starts it again with its first flags (task 2 of the spec's 3): the
  // chief, connecting again, finds it by its address as task 1 and brings both tasks to the newest step they can
  // restore (the move's checkpoint of 3 tasks, resharded); steps 4.. are trained again.
  ps2.reset();
  ps2 = Task(2, hosts, dir);
  PsSet now = at->ps_set;
  now.step = 0;  // nothing moves: the job runs on these already
  ASSERT_TRUE(c.MoveTo({ps0.get(), ps2.get()}, PlacementFor(2), now, absl::Seconds(5)).ok());
  EXPECT_EQ(ps0->step(), 4);
  EXPECT_EQ(ps2->step(), 4);
  step = 4;
  Train(c, &step, 3);
  // Again, the last task (the renumbered one) leaves: back onto one task.
  said = ps0->Control(remove);
  ASSERT_TRUE(said.ok()) << said.status();
  EXPECT_EQ(*said, "ps task 1 (h2:3) leaves at the next step boundary: 1 ps task");
  at = PushAndPull(c, 7);
  ASSERT_TRUE(at.ok()) << at.status();
  ASSERT_EQ(at->ps_set.step, 8);
  ASSERT_TRUE(c.MoveTo({ps0.get()}, PlacementFor(1), at->ps_set, absl::Seconds(5)).ok());
  EXPECT_TRUE(Env::Default()->FileExists(absl::StrCat(dir, "/model.ckpt-8.ps1-of-2")));  // written as ps task 1
  ASSERT_TRUE(ps2->Control(retire).ok());
  step = 8;
  EXPECT_EQ(Train(c, &step, 2), expected);
}

TrainConfig AsyncConfig(int num_ps) {
  TrainConfig c = MakeConfig("async", /*num_workers=*/2, /*replicas_to_aggregate=*/0, /*learning_rate=*/0.5f);
  c.optimizer.name = "adam";
  c.num_ps = num_ps;
  return c;
}

// One async step of worker `c`: the gradient (k + 1) * 0.1 (k: the worker's `*k`-th step) at the step it pulled
// last (`*at`), then the pull of the next; returns the pull.
absl::StatusOr<PullResult> AsyncStep(WorkerClient& c, int64_t* at, int* k, std::vector<float>* params) {
  std::vector<float> grads(8, 0.1f * static_cast<float>(++*k));
  absl::StatusOr<PushResponse> pushed = c.Push(*at, grads.data());
  if (!pushed.ok()) return pushed.status();
  if (pushed->outcome != Outcome::kAccepted) return absl::InternalError("the push was not accepted");
  absl::StatusOr<PullResult> pulled = c.Pull(0, *at, params->data());
  if (pulled.ok()) *at = pulled->step;
  return pulled;
}

// An async job moves at a cut: every worker's push in flight lands and it stops pushing (stop-for-move); ps 0 cuts
// the job only once every active worker has, and then takes no push; every old task saves its part of that step;
// the new set restores it. Two workers pushing in turn (inline: one order) train exactly as a job that never moved.
TEST(PsSetChangeTest, AnAsyncJobMovesAtACutWhereEveryWorkerStoppedAndLosesNoPush) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "/ps_set_async_", getpid());
  const std::vector<float> initial = {1, 2, 3, 4, 5, 6, 7, 8};
  // The straight run: both workers on one task, the same pushes in the same order.
  std::vector<float> expected(8);
  {
    auto ps = Task(0, {"h0:1"}, dir + "_straight", 0, nullptr, 2);
    WorkerClient w0(std::vector<PsInterface*>{ps.get()}, PlacementFor(1), 0, true, Inline());
    WorkerClient w1(std::vector<PsInterface*>{ps.get()}, PlacementFor(1), 1, false, Inline());
    { absl::Status s = w0.Connect(AsyncConfig(1), initial.data(), absl::Seconds(5)); ASSERT_TRUE(s.ok()) << s; }
    ASSERT_TRUE(w1.Connect(AsyncConfig(1), nullptr, absl::Seconds(5)).ok());
    std::vector<float> params(8);
    int64_t a0 = w0.Pull(0, 0, params.data())->step, a1 = w1.Pull(0, 0, params.data())->step;
    int k0 = 0, k1 = 0;
    for (int i = 0; i < 6; ++i) {
      ASSERT_TRUE(AsyncStep(w0, &a0, &k0, &params).ok());
      ASSERT_TRUE(AsyncStep(w1, &a1, &k1, &params).ok());
    }
    ASSERT_TRUE(AsyncStep(w1, &a1, &k1, &params).ok());
    for (int i = 0; i < 4; ++i) {
      ASSERT_TRUE(AsyncStep(w0, &a0, &k0, &params).ok());
      ASSERT_TRUE(AsyncStep(w1, &a1, &k1, &params).ok());
    }
    ASSERT_TRUE(w0.Pull(0, a0, expected.data()).ok());
  }

  auto ps0 = Task(0, {"h0:1"}, dir, 0, nullptr, 2);
  WorkerClient w0(std::vector<PsInterface*>{ps0.get()}, PlacementFor(1), 0, true, Inline());
  WorkerClient w1(std::vector<PsInterface*>{ps0.get()}, PlacementFor(1), 1, false, Inline());
  ASSERT_TRUE(w0.Connect(AsyncConfig(1), initial.data(), absl::Seconds(5)).ok());
  ASSERT_TRUE(w1.Connect(AsyncConfig(1), nullptr, absl::Seconds(5)).ok());
  std::vector<float> params(8);
  int64_t a0 = w0.Pull(0, 0, params.data())->step, a1 = w1.Pull(0, 0, params.data())->step;
  int k0 = 0, k1 = 0;
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(AsyncStep(w0, &a0, &k0, &params).ok());
    ASSERT_TRUE(AsyncStep(w1, &a1, &k1, &params).ok());
  }
  ASSERT_TRUE(ps0->Control(Change("add-ps", "h1:2")).ok());
  // The pulls announce the move from now on; a worker that has not heard yet still pushes (its push is in the cut).
  absl::StatusOr<PullResult> at0 = AsyncStep(w0, &a0, &k0, &params);
  ASSERT_TRUE(at0.ok()) << at0.status();
  EXPECT_EQ(at0->ps_set.version, 1);
  EXPECT_EQ(at0->ps_set.hosts, (std::vector<std::string>{"h0:1", "h1:2"}));
  // The chief stops; ps 0 does not cut while worker 1 has not: the move waits for it, up to its deadline.
  auto ps1 = Task(1, {"h0:1", "h1:2"}, dir, 0, nullptr, 2);
  absl::Status early = w0.MoveTo({ps0.get(), ps1.get()}, PlacementFor(2), at0->ps_set, absl::Milliseconds(300));
  EXPECT_EQ(early.code(), absl::StatusCode::kDeadlineExceeded) << early;
  EXPECT_TRUE(absl::StrContains(early.message(), "waits for worker 1 to stop pushing")) << early;
  ASSERT_TRUE(AsyncStep(w1, &a1, &k1, &params).ok());
  absl::StatusOr<PullResult> at1 = AsyncStep(w1, &a1, &k1, &params);
  ASSERT_TRUE(at1.ok()) << at1.status();
  EXPECT_EQ(at1->ps_set.version, 1);
  const int64_t cut_at = ps0->step();
  // Worker 1 stops and waits for the move; the chief cuts the job there and moves it.
  absl::Status moved1;
  std::thread other([&] {
    moved1 = w1.MoveTo({ps0.get(), ps1.get()}, PlacementFor(2), at1->ps_set, absl::Seconds(10));
  });
  ASSERT_TRUE(w0.MoveTo({ps0.get(), ps1.get()}, PlacementFor(2), at0->ps_set, absl::Seconds(10)).ok());
  other.join();
  ASSERT_TRUE(moved1.ok()) << moved1;
  EXPECT_EQ(ps0->step(), cut_at);
  EXPECT_TRUE(Env::Default()->FileExists(absl::StrCat(dir, "/model.ckpt-", cut_at, ".ps0-of-1")));
  // A push that reached an old task after its cut would be lost with the move: refused (here: ps 0 before the
  // move is gone; checked through the Control steps' refusals on the moved job instead).
  ControlRequest cut;
  cut.command = "cut";
  EXPECT_TRUE(absl::StrContains(ps0->Control(cut).status().message(), "no change of the ps tasks is under way"));
  // Both go on on two tasks from where they were: the same values as the job that never moved.
  a0 = w0.Pull(0, 0, params.data())->step;
  a1 = w1.Pull(0, 0, params.data())->step;
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(AsyncStep(w0, &a0, &k0, &params).ok());
    ASSERT_TRUE(AsyncStep(w1, &a1, &k1, &params).ok());
  }
  std::vector<float> got(8);
  ASSERT_TRUE(w0.Pull(0, a0, got.data()).ok());
  EXPECT_EQ(got, expected);

  // Once cut, a task takes no push (it would be lost with the move), and a worker still on the old set that
  // registers hears the new one.
  ASSERT_TRUE(ps0->Control(Change("remove-ps", "", 1)).ok());
  ASSERT_TRUE(AsyncStep(w1, &a1, &k1, &params).ok());
  ControlRequest stop;
  stop.command = "stop-for-move";
  for (int w : {0, 1}) {
    stop.worker = w;
    ASSERT_TRUE(ps0->Control(stop).ok());
  }
  absl::StatusOr<std::string> said = ps0->Control(cut);
  ASSERT_TRUE(said.ok()) << said.status();
  EXPECT_EQ(*said, absl::StrCat("ps task 0: saved step ", ps0->step(), " for the move"));
  std::vector<float> grads(8, 0.1f);
  absl::StatusOr<PushResponse> late = w1.Push(a1, grads.data());
  EXPECT_EQ(late.status().code(), absl::StatusCode::kAborted) << late.status();
  EXPECT_TRUE(absl::StrContains(late.status().message(), "saved its state for a move")) << late.status();
}

TEST(PsSetChangeTest, RefusalsAreOneLine) {
  {  // an async move's steps: asked of ps 0, with a change under way, in an async job
    auto ps = Task(0, {"h0:1"}, "");
    WorkerClient c(std::vector<PsInterface*>{ps.get()}, PlacementFor(1), 0, true, Inline());
    ASSERT_TRUE(c.Connect(SyncConfig(1), std::vector<float>(8, 1.0f).data(), absl::Seconds(5)).ok());
    ControlRequest cut;
    cut.command = "cut";
    EXPECT_TRUE(absl::StrContains(ps->Control(cut).status().message(), "the job trains in sync")) << ps->Control(cut).status();
    auto ps1 = Task(1, {"h0:1", "h1:2"}, "");
    EXPECT_TRUE(absl::StrContains(ps1->Control(cut).status().message(), "ask ps task 0"));
  }
  {  // no checkpoints
    auto ps = Task(0, {"h0:1"}, "");
    WorkerClient c(std::vector<PsInterface*>{ps.get()}, PlacementFor(1), 0, true, Inline());
    const std::vector<float> initial(8, 1.0f);
    ASSERT_TRUE(c.Connect(SyncConfig(1), initial.data(), absl::Seconds(5)).ok());
    ControlRequest add;
    add.command = "add-ps";
    add.address = "h1:2";
    EXPECT_TRUE(absl::StrContains(ps->Control(add).status().message(), "keeps no checkpoints"));
  }
  {  // another task than ps 0, and before any job
    auto ps = Task(1, {"h0:1", "h1:2"}, "");
    ControlRequest add;
    add.command = "add-ps";
    add.address = "h2:3";
    EXPECT_TRUE(absl::StrContains(ps->Control(add).status().message(), "ask ps task 0"));
    auto ps0 = Task(0, {"h0:1"}, "");
    EXPECT_TRUE(absl::StrContains(ps0->Control(add).status().message(), "no job is running yet"));
  }
}

// A ps task started with a spec that lists more (or fewer) ps tasks than the workers' is a mistake no move will
// settle: the worker hears it at once, naming the flag, instead of waiting out its deadline.
TEST(PsSetChangeTest, ATaskWhoseSpecListsOtherTasksThanTheWorkersRefusesAtOnce) {
  auto ps0 = Task(0, {"h0:1", "h1:2"}, "");
  auto ps1 = Task(1, {"h0:1", "h1:2", "h2:3"}, "");  // its --ps_hosts lists a third task
  WorkerClient c(std::vector<PsInterface*>{ps0.get(), ps1.get()}, PlacementFor(2), 0, true, Inline());
  const std::vector<float> initial(8, 1.0f);
  const absl::Time start = absl::Now();
  const absl::Status s = c.Connect(SyncConfig(2), initial.data(), absl::Seconds(20));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "ps task 1 was started among 3")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "--ps_hosts must list the same tasks")) << s;
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

}  // namespace
}  // namespace dtrain::ps
