// ParameterServer: registration, initialization, request validation, timeouts and Done.
#include "ps/parameter_server.h"

#include <future>
#include <thread>

#include "gtest/gtest.h"
#include "ps/ps_test_util.h"

namespace dtrain::ps {
namespace {

using ::dtrain::ps::testing::MakeConfig;

ParameterServerOptions Options(int num_workers, int task_index = 0, int num_ps = 1) {
  ParameterServerOptions o;
  o.task_index = task_index;
  o.num_ps = num_ps;
  o.num_workers = num_workers;
  return o;
}

TrainConfig Config(int num_workers, int r) {
  TrainConfig c = MakeConfig("sync", num_workers, r);
  c.slices = {{0, "w", 0, 3}, {1, "b", 3, 1}};
  return c;
}

RegisterRequest Reg(int worker, bool chief, const TrainConfig& config) {
  RegisterRequest r;
  r.worker_id = worker;
  r.is_chief = chief;
  r.config = config;
  return r;
}

InitializeRequest Init(int worker) {
  InitializeRequest r;
  r.worker_id = worker;
  r.slices = {{0, {1, 2, 3}}, {1, {4}}};
  return r;
}

PushRequest Push(int worker, int64_t step, uint64_t id, std::vector<float> w, std::vector<float> b) {
  PushRequest r;
  r.worker_id = worker;
  r.step = step;
  r.request_id = id;
  r.commit = true;
  r.gradients = {{0, std::move(w)}, {1, std::move(b)}};
  return r;
}

PullRequest Pull(int worker, int64_t min_step, int64_t timeout_ms = 10000) {
  PullRequest r;
  r.worker_id = worker;
  r.min_step = min_step;
  r.timeout_ms = timeout_ms;
  return r;
}

TEST(ParameterServerTest, NonChiefBeforeChiefIsUnavailable) {
  ParameterServer ps(Options(2));
  absl::StatusOr<RegisterResponse> r = ps.Register(Reg(1, false, Config(2, 2)));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(r.status().message().find("waiting for the chief"), std::string::npos);
  // Nothing works before the config arrives.
  EXPECT_EQ(ps.Pull(Pull(0, 0)).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(ps.Initialize(Init(0)).code(), absl::StatusCode::kUnavailable);
}

TEST(ParameterServerTest, ChiefConfigIsAdoptedAndOthersMustMatch) {
  ParameterServer ps(Options(2));
  absl::StatusOr<RegisterResponse> chief = ps.Register(Reg(0, true, Config(2, 2)));
  ASSERT_TRUE(chief.ok()) << chief.status();
  EXPECT_FALSE(chief->initialized);
  EXPECT_EQ(chief->global_step, 0);

  TrainConfig other = Config(2, 2);
  other.model_signature = "other-model";
  absl::StatusOr<RegisterResponse> r = ps.Register(Reg(1, false, other));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(r.status().message(), "model_signature mismatch: ps has 'test-model', worker 1 has 'other-model'");

  other = Config(2, 1);
  r = ps.Register(Reg(1, false, other));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("replicas_to_aggregate"), std::string::npos);

  EXPECT_TRUE(ps.Register(Reg(1, false, Config(2, 2))).ok());
  // A second "chief" is refused.
  EXPECT_EQ(ps.Register(Reg(1, true, Config(2, 2))).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(ParameterServerTest, InvalidChiefConfigIsRejected) {
  ParameterServer ps(Options(2));
  TrainConfig c = Config(2, 2);
  c.mode = "lockstep";
  EXPECT_EQ(ps.Register(Reg(0, true, c)).status().code(), absl::StatusCode::kInvalidArgument);
  c = Config(3, 2);  // the cluster spec says 2 workers
  EXPECT_EQ(ps.Register(Reg(0, true, c)).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ps.Register(Reg(2, true, Config(2, 2))).status().code(), absl::StatusCode::kInvalidArgument);
  // After the failures the ps still has no config.
  EXPECT_EQ(ps.Register(Reg(1, false, Config(2, 2))).status().code(), absl::StatusCode::kUnavailable);
}

TEST(ParameterServerTest, InitializeIsChiefOnlyAndIdempotent) {
  ParameterServer ps(Options(2));
  ASSERT_TRUE(ps.Register(Reg(0, true, Config(2, 1))).ok());
  absl::Status s = ps.Initialize(Init(1));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("chief"), std::string::npos);

  InitializeRequest short_init = Init(0);
  short_init.slices[0].values.pop_back();
  EXPECT_EQ(ps.Initialize(short_init).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ps.Push(Push(0, 0, 1, {1, 1, 1}, {1})).status().code(), absl::StatusCode::kUnavailable);

  ASSERT_TRUE(ps.Initialize(Init(0)).ok());
  EXPECT_TRUE(ps.Register(Reg(1, false, Config(2, 1)))->initialized);
  ASSERT_TRUE(ps.Push(Push(0, 0, 1, {2, 2, 2}, {2})).ok());  // R=1: step 0 applied at once (lr 0.5)

  // A restarted chief registers and initializes again: ignored, the trained values stay.
  absl::StatusOr<RegisterResponse> again = ps.Register(Reg(0, true, Config(2, 1)));
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(again->initialized);
  EXPECT_EQ(again->global_step, 1);
  InitializeRequest other_values = Init(0);
  other_values.slices[0].values = {9, 9, 9};
  ASSERT_TRUE(ps.Initialize(other_values).ok());
  absl::StatusOr<PullResponse> pulled = ps.Pull(Pull(0, 1));
  ASSERT_TRUE(pulled.ok());
  EXPECT_EQ(pulled->slices[0].values, std::vector<float>({0, 1, 2}));
  EXPECT_EQ(pulled->slices[1].values, std::vector<float>({3}));
}

class ReadyServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(ps_.Register(Reg(0, true, Config(2, 2))).ok());
    ASSERT_TRUE(ps_.Initialize(Init(0)).ok());
  }
  ParameterServer ps_{Options(2)};
};

TEST_F(ReadyServerTest, MalformedPushesAreInvalidArgument) {
  PushRequest unknown = Push(0, 0, 1, {1, 1, 1}, {1});
  unknown.gradients[1].key = 9;
  absl::StatusOr<PushResponse> r = ps_.Push(unknown);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("key 9"), std::string::npos) << r.status();

  r = ps_.Push(Push(0, 0, 2, {1, 1}, {1}));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("has 2 values, expected 3"), std::string::npos) << r.status();

  EXPECT_EQ(ps_.Push(Push(2, 0, 3, {1, 1, 1}, {1})).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ps_.Push(Push(-1, 0, 3, {1, 1, 1}, {1})).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ps_.Pull(Pull(5, 0)).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ps_.Done(7).code(), absl::StatusCode::kInvalidArgument);

  PushRequest twice = Push(0, 0, 4, {1, 1, 1}, {1});
  twice.gradients.push_back(twice.gradients[0]);
  EXPECT_EQ(ps_.Push(twice).status().code(), absl::StatusCode::kInvalidArgument);

  // A commit must carry (or have buffered) every slice of the task.
  PushRequest partial = Push(0, 0, 5, {1, 1, 1}, {1});
  partial.gradients.pop_back();
  EXPECT_EQ(ps_.Push(partial).status().code(), absl::StatusCode::kFailedPrecondition);

  // None of it changed anything.
  EXPECT_EQ(ps_.step(), 0);
  TrainingStats stats = *ps_.GetStats();
  EXPECT_EQ(stats.workers[0].applied + stats.workers[0].duplicates + stats.workers[0].dropped_stale, 0);
}

TEST_F(ReadyServerTest, PushForAFutureStepIsFailedPrecondition) {
  absl::StatusOr<PushResponse> r = ps_.Push(Push(0, 3, 1, {1, 1, 1}, {1}));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("step 3"), std::string::npos) << r.status();
}

TEST_F(ReadyServerTest, PullTimesOut) {
  ASSERT_TRUE(ps_.Push(Push(0, 0, 1, {1, 1, 1}, {1})).ok());  // R=2: step 0 waits for worker 1
  const absl::Time start = absl::Now();
  absl::StatusOr<PullResponse> r = ps_.Pull(Pull(0, 1, /*timeout_ms=*/50));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(r.status().message().find("step >= 1"), std::string::npos) << r.status();
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(45));
  EXPECT_GT(ps_.GetStats()->workers[0].wait_seconds, 0.04);
}

TEST_F(ReadyServerTest, DoneReleasesAPullWaitingForADoneWorker) {
  ASSERT_TRUE(ps_.Push(Push(0, 0, 1, {2, 2, 2}, {2})).ok());
  std::future<absl::StatusOr<PullResponse>> pull =
      std::async(std::launch::async, [&] { return ps_.Pull(Pull(0, 1)); });
  EXPECT_EQ(pull.wait_for(std::chrono::milliseconds(50)), std::future_status::timeout);  // blocked on worker 1
  ASSERT_TRUE(ps_.Done(1).ok());  // R becomes min(2, 1): step 0 is decided with worker 0 alone
  ASSERT_EQ(pull.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  absl::StatusOr<PullResponse> r = pull.get();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->step, 1);
  EXPECT_FALSE(r->training_done);
  EXPECT_EQ(r->slices[0].values, std::vector<float>({0, 1, 2}));  // 1,2,3 - 0.5*2
  ASSERT_EQ(r->decisions.size(), 1u);
  EXPECT_EQ(r->decisions[0].workers, std::vector<int>({0}));

  // The only active worker waiting for a step it has not pushed does not hang either.
  absl::StatusOr<PullResponse> hopeless = ps_.Pull(Pull(0, 5));
  ASSERT_TRUE(hopeless.ok()) << hopeless.status();
  EXPECT_EQ(hopeless->step, 1);

  EXPECT_FALSE(ps_.finished());
  ASSERT_TRUE(ps_.Done(0).ok());
  EXPECT_TRUE(ps_.finished());
  EXPECT_TRUE(ps_.WaitUntilFinished(absl::ZeroDuration()));
  absl::StatusOr<PullResponse> after = ps_.Pull(Pull(0, 2));
  ASSERT_TRUE(after.ok());
  EXPECT_TRUE(after->training_done);
  TrainingStats stats = *ps_.GetStats();
  EXPECT_TRUE(stats.workers[0].done);
  EXPECT_TRUE(stats.workers[1].done);
}

TEST(ParameterServerTest, FinishReleasesEveryBlockedPull) {
  ParameterServer ps3(Options(3));
  ASSERT_TRUE(ps3.Register(Reg(0, true, Config(3, 3))).ok());
  ASSERT_TRUE(ps3.Initialize(Init(0)).ok());
  ASSERT_TRUE(ps3.Push(Push(0, 0, 1, {1, 1, 1}, {1})).ok());
  ASSERT_TRUE(ps3.Push(Push(1, 0, 1, {1, 1, 1}, {1})).ok());
  auto pull0 = std::async(std::launch::async, [&] { return ps3.Pull(Pull(0, 1)); });
  auto pull1 = std::async(std::launch::async, [&] { return ps3.Pull(Pull(1, 1)); });
  EXPECT_EQ(pull0.wait_for(std::chrono::milliseconds(30)), std::future_status::timeout);
  ASSERT_TRUE(ps3.Done(2).ok());  // R = min(3, 2) = 2: the pending step is decided
  ASSERT_EQ(pull0.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  ASSERT_EQ(pull1.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  EXPECT_EQ(pull0.get()->step, 1);
  EXPECT_EQ(pull1.get()->step, 1);
  std::thread waiter([&] { EXPECT_TRUE(ps3.WaitUntilFinished(absl::Seconds(10))); });
  ASSERT_TRUE(ps3.Done(0).ok());
  ASSERT_TRUE(ps3.Done(1).ok());
  waiter.join();
}

TEST_F(ReadyServerTest, BytesAreCounted) {
  ASSERT_TRUE(ps_.Push(Push(0, 0, 1, {1, 1, 1}, {1})).ok());
  ASSERT_TRUE(ps_.Push(Push(1, 0, 1, {1, 1, 1}, {1})).ok());
  ASSERT_TRUE(ps_.Pull(Pull(0, 1)).ok());
  TrainingStats stats = *ps_.GetStats();
  EXPECT_EQ(stats.bytes_received, 4 * 4 * 3);  // Initialize + two pushes of 4 floats
  EXPECT_EQ(stats.bytes_sent, 4 * 4);
  EXPECT_EQ(stats.global_step, 1);
}

TEST(ParameterServerTest, CommitOnlyOnTaskZero) {
  ParameterServer ps1(Options(1, /*task_index=*/1, /*num_ps=*/2));
  ASSERT_TRUE(ps1.Register(Reg(0, true, Config(1, 1))).ok());
  ASSERT_TRUE(ps1.Initialize(Init(0)).ok());
  EXPECT_EQ(ps1.Push(Push(0, 0, 1, {1, 1, 1}, {1})).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dtrain::ps
