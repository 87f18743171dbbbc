// ParameterServer: registration, initialization, request validation, timeouts and Done.
#include "ps/core/parameter_server.h"

#include <atomic>
#include <cmath>
#include <future>
#include <limits>
#include <map>
#include <thread>

#include "gtest/gtest.h"
#include "ps/testing/ps_test_util.h"
#include "common/cancellation.h"
#include "glog/logging.h"

namespace dtrain::ps {
namespace {

using ::dtrain::ps::testing::InitializeSlices;
using ::dtrain::ps::testing::MakeConfig;
using ::dtrain::ps::testing::Pulled;
using ::dtrain::ps::testing::PullSlices;
using ::dtrain::ps::testing::PushSlices;
using ::dtrain::ps::testing::Slices;

ParameterServerOptions Options(int num_workers, int task_index = 0, int num_ps = 1) {
  ParameterServerOptions o;
  o.task_index = task_index;
  o.num_ps = num_ps;
  o.num_workers = num_workers;
  return o;
}

std::unique_ptr<ParameterServer> MakePs(int num_workers, int task_index = 0, int num_ps = 1) {
  absl::StatusOr<std::unique_ptr<ParameterServer>> ps = ParameterServer::Create(Options(num_workers, task_index, num_ps));
  CHECK(ps.ok()) << ps.status();
  return *std::move(ps);
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

absl::Status Init(ParameterServer& ps, int worker, Slices values = {{0, {1, 2, 3}}, {1, {4}}}) {
  return InitializeSlices(ps, worker, values);
}

// Sessions of the workers registered through Register below (per ParameterServer, per worker).
std::map<std::pair<const ParameterServer*, int>, uint64_t>& Sessions() {
  static auto* sessions = new std::map<std::pair<const ParameterServer*, int>, uint64_t>;
  return *sessions;
}
uint64_t SessionOf(const ParameterServer& ps, int worker) {
  auto it = Sessions().find({&ps, worker});
  return it == Sessions().end() ? 0 : it->second;
}
absl::StatusOr<RegisterResponse> Register(ParameterServer& ps, const RegisterRequest& request) {
  absl::StatusOr<RegisterResponse> r = ps.Register(request);
  if (r.ok()) Sessions()[{&ps, request.worker_id}] = r->session;
  return r;
}

absl::StatusOr<PushResponse> Push(ParameterServer& ps, int worker, int64_t step, uint64_t id, std::vector<float> w,
                                  std::vector<float> b) {
  return PushSlices(ps, PushHeader{worker, step, id, /*commit=*/true, SessionOf(ps, worker)},
                    {{0, std::move(w)}, {1, std::move(b)}});
}

absl::StatusOr<Pulled> Pull(ParameterServer& ps, int worker, int64_t min_step, int64_t timeout_ms = 10000) {
  PullRequest r;
  r.worker_id = worker;
  r.session = SessionOf(ps, worker);
  r.min_step = min_step;
  r.timeout_ms = timeout_ms;
  return PullSlices(ps, r);
}

absl::Status Done(ParameterServer& ps, int worker) { return ps.Done(worker, SessionOf(ps, worker), true, 0); }

TEST(ParameterServerTest, CreateRejectsBadOptions) {
  ParameterServerOptions o = Options(2, /*task_index=*/2, /*num_ps=*/2);
  absl::StatusOr<std::unique_ptr<ParameterServer>> ps = ParameterServer::Create(o);
  EXPECT_EQ(ps.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(ps.status().message().find("task_index 2"), std::string::npos) << ps.status();
  EXPECT_EQ(ParameterServer::Create(Options(0)).status().code(), absl::StatusCode::kInvalidArgument);
  o = Options(1);
  o.checkpoint.save_steps = -1;
  EXPECT_EQ(ParameterServer::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ParameterServerTest, NonChiefBeforeChiefIsUnavailable) {
  auto ps = MakePs(2);
  absl::StatusOr<RegisterResponse> r = Register(*ps, Reg(1, false, Config(2, 2)));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(r.status().message().find("waiting for the chief"), std::string::npos);
  // Nothing works before the config arrives. Pushes and pulls need a session first: register (Aborted), which
  // is also what a worker of a task that restarted hears.
  EXPECT_EQ(Init(*ps, 0).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(Pull(*ps, 0, 0).status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(ps->StartPush(PushHeader{0, 0, 1, true}).status().code(), absl::StatusCode::kAborted);
}

TEST(ParameterServerTest, ChiefConfigIsAdoptedAndOthersMustMatch) {
  auto ps = MakePs(2);
  absl::StatusOr<RegisterResponse> chief = Register(*ps, Reg(0, true, Config(2, 2)));
  ASSERT_TRUE(chief.ok()) << chief.status();
  EXPECT_FALSE(chief->initialized);
  EXPECT_EQ(chief->global_step, 0);

  TrainConfig other = Config(2, 2);
  other.model_signature = "other-model";
  absl::StatusOr<RegisterResponse> r = Register(*ps, Reg(1, false, other));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(r.status().message(), "model_signature mismatch: ps has 'test-model', worker 1 has 'other-model'");

  other = Config(2, 1);
  r = Register(*ps, Reg(1, false, other));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("replicas_to_aggregate"), std::string::npos);

  EXPECT_TRUE(Register(*ps, Reg(1, false, Config(2, 2))).ok());
  // A second "chief" is refused.
  EXPECT_EQ(Register(*ps, Reg(1, true, Config(2, 2))).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(ParameterServerTest, InvalidChiefConfigIsRejected) {
  auto ps = MakePs(2);
  TrainConfig c = Config(2, 2);
  c.mode = "lockstep";
  EXPECT_EQ(Register(*ps, Reg(0, true, c)).status().code(), absl::StatusCode::kInvalidArgument);
  c = Config(3, 2);  // the cluster spec says 2 workers
  EXPECT_EQ(Register(*ps, Reg(0, true, c)).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Register(*ps, Reg(2, true, Config(2, 2))).status().code(), absl::StatusCode::kInvalidArgument);
  // After the failures the ps still has no config.
  EXPECT_EQ(Register(*ps, Reg(1, false, Config(2, 2))).status().code(), absl::StatusCode::kUnavailable);
}

TEST(ParameterServerTest, InitializeIsChiefOnlyAndIdempotent) {
  auto ps = MakePs(2);
  ASSERT_TRUE(Register(*ps, Reg(0, true, Config(2, 1))).ok());
  absl::Status s = Init(*ps, 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("chief"), std::string::npos);

  s = Init(*ps, 0, {{0, {1, 2}}, {1, {4}}});  // 'w' short by one value
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("'w'): 2 of 3"), std::string::npos) << s;
  EXPECT_EQ(Init(*ps, 0, {{0, {1, 2, 3, 4}}, {1, {4}}}).code(), absl::StatusCode::kInvalidArgument);  // too long
  EXPECT_EQ(Push(*ps, 0, 0, 1, {1, 1, 1}, {1}).status().code(), absl::StatusCode::kUnavailable);

  ASSERT_TRUE(Init(*ps, 0).ok());
  EXPECT_TRUE(Register(*ps, Reg(1, false, Config(2, 1)))->initialized);
  ASSERT_TRUE(Push(*ps, 0, 0, 1, {2, 2, 2}, {2}).ok());  // R=1: step 0 applied at once (lr 0.5)

  // A restarted chief registers and initializes again: ignored, the trained values stay.
  absl::StatusOr<RegisterResponse> again = Register(*ps, Reg(0, true, Config(2, 1)));
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(again->initialized);
  EXPECT_EQ(again->global_step, 1);
  ASSERT_TRUE(Init(*ps, 0, {{0, {9, 9, 9}}, {1, {4}}}).ok());
  absl::StatusOr<Pulled> pulled = Pull(*ps, 0, 1);
  ASSERT_TRUE(pulled.ok()) << pulled.status();
  EXPECT_EQ(pulled->slices[0], std::vector<float>({0, 1, 2}));
  EXPECT_EQ(pulled->slices[1], std::vector<float>({3}));
}

class ReadyServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(Register(*ps_, Reg(0, true, Config(2, 2))).ok());
    ASSERT_TRUE(Register(*ps_, Reg(1, false, Config(2, 2))).ok());
    ASSERT_TRUE(Init(*ps_, 0).ok());
  }
  std::unique_ptr<ParameterServer> ps_ = MakePs(2);
};

TEST_F(ReadyServerTest, MalformedPushesAreInvalidArgument) {
  absl::StatusOr<PushResponse> r =
      PushSlices(*ps_, PushHeader{0, 0, 1, true, SessionOf(*ps_, 0)}, {{0, {1, 1, 1}}, {9, {1}}});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("key 9"), std::string::npos) << r.status();

  r = Push(*ps_, 0, 0, 2, {1, 1, 1, 1}, {1});  // 4 values for a slice of 3
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("outside its 3 values"), std::string::npos) << r.status();

  EXPECT_EQ(Push(*ps_, 2, 0, 3, {1, 1, 1}, {1}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Push(*ps_, -1, 0, 3, {1, 1, 1}, {1}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Pull(*ps_, 5, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ps_->Done(7, 0, true, 0).code(), absl::StatusCode::kInvalidArgument);

  // Pieces of a slice come in order.
  absl::StatusOr<std::unique_ptr<SliceUpload>> upload = ps_->StartPush(PushHeader{0, 0, 4, true, SessionOf(*ps_, 0)});
  ASSERT_TRUE(upload.ok());
  const float one = 1;
  EXPECT_EQ((*upload)->Write(0, 2, 1, WireDtype::kF32, &one).code(), absl::StatusCode::kInvalidArgument);

  // A commit must carry every slice of the task, whole.
  r = Push(*ps_, 0, 0, 5, {1, 1}, {1});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("'w' (2 of 3 floats)"), std::string::npos) << r.status();
  r = PushSlices(*ps_, PushHeader{0, 0, 6, true, SessionOf(*ps_, 0)}, {{0, {1, 1, 1}}});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("'b' (0 of 1 floats)"), std::string::npos) << r.status();

  // None of it changed anything.
  EXPECT_EQ(ps_->step(), 0);
  TrainingStats stats = *ps_->GetStats();
  EXPECT_EQ(stats.workers[0].applied + stats.workers[0].duplicates + stats.workers[0].dropped_stale, 0);
  // A failed upload is not remembered: its request id can be used again.
  EXPECT_EQ(Push(*ps_, 0, 0, 5, {1, 1, 1}, {1})->outcome, PushResponse::Outcome::kAccepted);
}

TEST_F(ReadyServerTest, PushForAFutureStepIsFailedPrecondition) {
  absl::StatusOr<PushResponse> r = Push(*ps_, 0, 3, 1, {1, 1, 1}, {1});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("step 3"), std::string::npos) << r.status();
}

TEST_F(ReadyServerTest, PullTimesOut) {
  ASSERT_TRUE(Push(*ps_, 0, 0, 1, {1, 1, 1}, {1}).ok());  // R=2: step 0 waits for worker 1
  const absl::Time start = absl::Now();
  absl::StatusOr<Pulled> r = Pull(*ps_, 0, 1, /*timeout_ms=*/50);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(r.status().message().find("step >= 1"), std::string::npos) << r.status();
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(45));
  EXPECT_GT(ps_->GetStats()->workers[0].wait_seconds, 0.04);
}

TEST_F(ReadyServerTest, CancelledPullEndsAtOnce) {
  ASSERT_TRUE(Push(*ps_, 0, 0, 1, {1, 1, 1}, {1}).ok());  // step 0 waits for worker 1
  Cancellation cancel;
  PullRequest request;
  request.worker_id = 0;
  request.session = SessionOf(*ps_, 0);
  request.min_step = 1;
  request.timeout_ms = 60000;
  request.cancel = &cancel;
  std::future<absl::StatusOr<Pulled>> pull = std::async(std::launch::async, [&] { return PullSlices(*ps_, request); });
  EXPECT_EQ(pull.wait_for(std::chrono::milliseconds(30)), std::future_status::timeout);
  cancel.Cancel();
  ASSERT_EQ(pull.wait_for(std::chrono::seconds(5)), std::future_status::ready);
  EXPECT_EQ(pull.get().status().code(), absl::StatusCode::kCancelled);
}

TEST_F(ReadyServerTest, DoneReleasesAPullWaitingForADoneWorker) {
  ASSERT_TRUE(Push(*ps_, 0, 0, 1, {2, 2, 2}, {2}).ok());
  std::future<absl::StatusOr<Pulled>> pull = std::async(std::launch::async, [&] { return Pull(*ps_, 0, 1); });
  EXPECT_EQ(pull.wait_for(std::chrono::milliseconds(50)), std::future_status::timeout);  // blocked on worker 1
  ASSERT_TRUE(Done(*ps_, 1).ok());  // R becomes min(2, 1): step 0 is decided with worker 0 alone
  ASSERT_EQ(pull.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  absl::StatusOr<Pulled> r = pull.get();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->header.step, 1);
  EXPECT_FALSE(r->header.training_done);
  EXPECT_EQ(r->slices[0], std::vector<float>({0, 1, 2}));  // 1,2,3 - 0.5*2
  ASSERT_EQ(r->header.decisions.size(), 1u);
  EXPECT_EQ(r->header.decisions[0].workers, std::vector<int>({0}));

  // The only active worker waiting for a step it has not pushed does not hang either.
  absl::StatusOr<Pulled> hopeless = Pull(*ps_, 0, 5);
  ASSERT_TRUE(hopeless.ok()) << hopeless.status();
  EXPECT_EQ(hopeless->header.step, 1);

  EXPECT_FALSE(ps_->finished());
  ASSERT_TRUE(Done(*ps_, 0).ok());
  EXPECT_TRUE(ps_->finished());
  EXPECT_TRUE(ps_->WaitUntilFinished(absl::ZeroDuration()));
  absl::StatusOr<Pulled> after = Pull(*ps_, 0, 2);
  ASSERT_TRUE(after.ok());
  EXPECT_TRUE(after->header.training_done);
  TrainingStats stats = *ps_->GetStats();
  EXPECT_TRUE(stats.workers[0].done);
  EXPECT_TRUE(stats.workers[1].done);
}

TEST(ParameterServerTest, FinishReleasesEveryBlockedPull) {
  auto ps3 = MakePs(3);
  ASSERT_TRUE(Register(*ps3, Reg(0, true, Config(3, 3))).ok());
  ASSERT_TRUE(Register(*ps3, Reg(1, false, Config(3, 3))).ok());
  ASSERT_TRUE(Register(*ps3, Reg(2, false, Config(3, 3))).ok());
  ASSERT_TRUE(Init(*ps3, 0).ok());
  ASSERT_TRUE(Push(*ps3, 0, 0, 1, {1, 1, 1}, {1}).ok());
  ASSERT_TRUE(Push(*ps3, 1, 0, 1, {1, 1, 1}, {1}).ok());
  auto pull0 = std::async(std::launch::async, [&] { return Pull(*ps3, 0, 1); });
  auto pull1 = std::async(std::launch::async, [&] { return Pull(*ps3, 1, 1); });
  EXPECT_EQ(pull0.wait_for(std::chrono::milliseconds(30)), std::future_status::timeout);
  ASSERT_TRUE(Done(*ps3, 2).ok());  // R = min(3, 2) = 2: the pending step is decided
  ASSERT_EQ(pull0.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  ASSERT_EQ(pull1.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  EXPECT_EQ(pull0.get()->header.step, 1);
  EXPECT_EQ(pull1.get()->header.step, 1);
  std::thread waiter([&] { EXPECT_TRUE(ps3->WaitUntilFinished(absl::Seconds(10))); });
  ASSERT_TRUE(Done(*ps3, 0).ok());
  ASSERT_TRUE(Done(*ps3, 1).ok());
  waiter.join();
}

TEST_F(ReadyServerTest, BytesAreCounted) {
  ASSERT_TRUE(Push(*ps_, 0, 0, 1, {1, 1, 1}, {1}).ok());
  ASSERT_TRUE(Push(*ps_, 1, 0, 1, {1, 1, 1}, {1}).ok());
  ASSERT_TRUE(Pull(*ps_, 0, 1).ok());
  TrainingStats stats = *ps_->GetStats();
  EXPECT_EQ(stats.bytes_received, 4 * 4 * 3);  // Initialize + two pushes of 4 floats
  EXPECT_EQ(stats.bytes_sent, 4 * 4);
  EXPECT_EQ(stats.global_step, 1);
}

TEST(ParameterServerTest, CommitOnlyOnTaskZero) {
  auto ps1 = MakePs(1, /*task_index=*/1, /*num_ps=*/2);
  ASSERT_TRUE(Register(*ps1, Reg(0, true, Config(1, 1))).ok());
  ASSERT_TRUE(Init(*ps1, 0).ok());
  EXPECT_EQ(Push(*ps1, 0, 0, 1, {1, 1, 1}, {1}).status().code(), absl::StatusCode::kInvalidArgument);
}


// ---- membership: sessions, leases, the end ------------------------------------------------------------------

// A clock tests move by hand (read by the ps's lease thread too, hence atomic).
class FakeClock {
 public:
  absl::Time Now() const { return absl::FromUnixNanos(nanos_.load()); }
  void Advance(absl::Duration d) { nanos_ += absl::ToInt64Nanoseconds(d); }
  std::function<absl::Time()> AsFunction() {
    return [this] { return Now(); };
  }

 private:
  std::atomic<int64_t> nanos_{absl::ToUnixNanos(absl::FromUnixSeconds(1'000'000))};
};

std::unique_ptr<ParameterServer> MakeLeasedPs(int num_workers, FakeClock* clock, absl::Duration lease) {
  ParameterServerOptions o = Options(num_workers);
  o.worker_timeout = lease;
  o.clock = clock->AsFunction();
  return *ParameterServer::Create(o);
}

// No chief ever registers (the workers never came, or training had ended before the task was started again):
// the task gives up after registration_timeout with a failed outcome that says so. Calls of non-chief workers
// in the meantime do not extend it.
TEST(MembershipTest, AnUnconfiguredTaskGivesUpAfterTheRegistrationTimeout) {
  FakeClock clock;
  ParameterServerOptions o = Options(2);
  o.worker_timeout = absl::Seconds(10);
  o.registration_timeout = absl::Seconds(60);
  o.clock = clock.AsFunction();
  auto ps = *ParameterServer::Create(o);
  clock.Advance(absl::Seconds(59));
  EXPECT_EQ(Register(*ps, Reg(1, false, Config(2, 2))).status().code(), absl::StatusCode::kUnavailable);
  ps->CheckLeases();
  EXPECT_FALSE(ps->finished());
  clock.Advance(absl::Seconds(1));
  ps->CheckLeases();
  ASSERT_TRUE(ps->WaitUntilFinished(absl::Seconds(10)));
  EXPECT_FALSE(ps->outcome().succeeded);
  EXPECT_NE(ps->outcome().message.find("no chief worker registered within 1m"), std::string::npos)
      << ps->outcome().message;
  EXPECT_TRUE(ps->final_checkpoint_status().ok());

  // Registered in time, the deadline no longer applies; without one (the default) there is none at all.
  FakeClock clock2;
  o.clock = clock2.AsFunction();
  auto registered = *ParameterServer::Create(o);
  ASSERT_TRUE(Register(*registered, Reg(0, true, Config(2, 2))).ok());
  ASSERT_TRUE(Register(*registered, Reg(1, false, Config(2, 2))).ok());
  for (int i = 0; i < 20; ++i) {
    clock2.Advance(absl::Seconds(5));
    ASSERT_TRUE(registered->Heartbeat(0, SessionOf(*registered, 0)).ok());
    ASSERT_TRUE(registered->Heartbeat(1, SessionOf(*registered, 1)).ok());
    registered->CheckLeases();
  }
  EXPECT_FALSE(registered->finished());
  auto patient = MakeLeasedPs(2, &clock2, absl::Seconds(10));
  clock2.Advance(absl::Hours(24));
  patient->CheckLeases();
  EXPECT_FALSE(patient->finished());
}


// (R shrinks), its old session is refused, and once it registers again it counts for R again.
TEST(MembershipTest, ALostWorkerNoLongerHoldsUpTheStepAndComesBackByRegistering) {
  FakeClock clock;
  auto ps = MakeLeasedPs(2, &clock, absl::Seconds(10));
  ASSERT_TRUE(Register(*ps, Reg(0, true, Config(2, 2))).ok());
  ASSERT_TRUE(Register(*ps, Reg(1, false, Config(2, 2))).ok());
  ASSERT_TRUE(Init(*ps, 0).ok());
  const uint64_t old_session = SessionOf(*ps, 1);
  ASSERT_TRUE(Push(*ps, 0, 0, 1, {2, 2, 2}, {2}).ok());
  std::future<absl::StatusOr<Pulled>> waiting = std::async(std::launch::async, [&] { return Pull(*ps, 0, 1); });
  EXPECT_EQ(waiting.wait_for(std::chrono::milliseconds(50)), std::future_status::timeout);  // R=2: waits for 1

  clock.Advance(absl::Seconds(6));
  ASSERT_TRUE(ps->Heartbeat(0, SessionOf(*ps, 0)).ok());  // worker 0 stays in touch, worker 1 does not
  ps->CheckLeases();
  EXPECT_FALSE(ps->GetStats()->workers[1].lost) << "within its lease";
  clock.Advance(absl::Seconds(5));
  ps->CheckLeases();
  TrainingStats stats = *ps->GetStats();
  EXPECT_TRUE(stats.workers[1].lost);
  EXPECT_EQ(stats.workers[1].times_lost, 1);
  EXPECT_FALSE(stats.workers[0].lost);

  // Step 0 is decided with worker 0 alone.
  ASSERT_EQ(waiting.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  absl::StatusOr<Pulled> pulled = waiting.get();
  ASSERT_TRUE(pulled.ok()) << pulled.status();
  EXPECT_EQ(pulled->header.step, 1);
  ASSERT_EQ(pulled->header.decisions.size(), 1u);
  EXPECT_EQ(pulled->header.decisions[0].workers, std::vector<int>({0}));
  EXPECT_FALSE(ps->finished());

  // The lost worker's calls with its old session: register again.
  absl::StatusOr<PushResponse> late = Push(*ps, 1, 0, 1, {5, 5, 5}, {5});
  EXPECT_EQ(late.status().code(), absl::StatusCode::kAborted) << late.status();
  EXPECT_NE(late.status().message().find("declared lost"), std::string::npos) << late.status();
  EXPECT_EQ(ps->Heartbeat(1, old_session).status().code(), absl::StatusCode::kAborted);

  // It comes back: a new session, and step 1 needs both workers again.
  absl::StatusOr<RegisterResponse> back = Register(*ps, Reg(1, false, Config(2, 2)));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_NE(back->session, old_session);
  EXPECT_EQ(back->global_step, 1);
  EXPECT_EQ(back->lease_ms, 10'000);
  EXPECT_FALSE(ps->GetStats()->workers[1].lost);
  ASSERT_TRUE(Push(*ps, 0, 1, 2, {1, 1, 1}, {1}).ok());
  EXPECT_EQ(Pull(*ps, 0, 2, /*timeout_ms=*/50).status().code(), absl::StatusCode::kDeadlineExceeded);
  ASSERT_TRUE(Push(*ps, 1, 1, 2, {1, 1, 1}, {1}).ok());
  pulled = Pull(*ps, 0, 2);
  ASSERT_TRUE(pulled.ok()) << pulled.status();
  EXPECT_EQ(pulled->header.decisions.back().workers, std::vector<int>({0, 1}));

  // Both finish: training completed although a worker was lost on the way.
  ASSERT_TRUE(Done(*ps, 0).ok());
  ASSERT_TRUE(Done(*ps, 1).ok());
  ASSERT_TRUE(ps->finished());
  EXPECT_TRUE(ps->outcome().succeeded);
  EXPECT_EQ(ps->outcome().global_step, 2);
}

// Nobody left: the ps finishes by itself, and its outcome says training did not complete and who was lost.
TEST(MembershipTest, EveryWorkerLostEndsTheServerWithAFailedOutcome) {
  FakeClock clock;
  auto ps = MakeLeasedPs(3, &clock, absl::Seconds(10));
  TrainConfig c = Config(3, 3);
  c.train_steps = 100;
  ASSERT_TRUE(Register(*ps, Reg(0, true, c)).ok());
  ASSERT_TRUE(Register(*ps, Reg(1, false, c)).ok());
  ASSERT_TRUE(Init(*ps, 0).ok());
  // Worker 2 never registers; worker 1 stops on an error and says so.
  ASSERT_TRUE(ps->Done(1, SessionOf(*ps, 1), /*completed=*/false, 0).ok());
  clock.Advance(absl::Seconds(11));
  ps->CheckLeases();
  ASSERT_TRUE(ps->WaitUntilFinished(absl::Seconds(10)));
  const TrainingOutcome outcome = ps->outcome();
  EXPECT_FALSE(outcome.succeeded);
  EXPECT_EQ(outcome.lost_workers, std::vector<int>({0, 2}));
  EXPECT_EQ(outcome.failed_workers, std::vector<int>({1}));
  EXPECT_EQ(outcome.kind, RunOutcome::kEndedEarly);
  EXPECT_EQ(outcome.message, "run ended early at step 0 of 100: no worker is left to complete it (worker 0 (lost at "
                             "step 0: no contact for 10s); worker 1 (failed at step 0); worker 2 (lost at step 0: no "
                             "contact for 10s))");
}

// The lease thread runs by itself: with a short real lease a silent worker is declared lost without help.
TEST(MembershipTest, TheLeaseThreadDeclaresSilentWorkersLost) {
  ParameterServerOptions o = Options(2);
  o.worker_timeout = absl::Milliseconds(200);
  auto ps = *ParameterServer::Create(o);
  ASSERT_TRUE(Register(*ps, Reg(0, true, Config(2, 2))).ok());
  ASSERT_TRUE(Register(*ps, Reg(1, false, Config(2, 2))).ok());
  ASSERT_TRUE(Init(*ps, 0).ok());
  ASSERT_TRUE(Push(*ps, 0, 0, 1, {2, 2, 2}, {2}).ok());
  // Worker 0 waits in a pull and heartbeats meanwhile (as WorkerClient's heartbeat thread does); worker 1 is
  // silent.
  std::atomic<bool> pulling{true};
  std::thread heartbeat([&] {
    while (pulling) {
      EXPECT_TRUE(ps->Heartbeat(0, SessionOf(*ps, 0)).ok());
      std::this_thread::sleep_for(std::chrono::milliseconds(40));
    }
  });
  absl::StatusOr<Pulled> pulled = Pull(*ps, 0, 1, /*timeout_ms=*/20'000);
  pulling = false;
  heartbeat.join();
  ASSERT_TRUE(pulled.ok()) << pulled.status();
  EXPECT_EQ(pulled->header.decisions[0].workers, std::vector<int>({0}));
  EXPECT_TRUE(ps->GetStats()->workers[1].lost);
  EXPECT_FALSE(ps->GetStats()->workers[0].lost);
}

// Done is accepted only from the worker it names: with that worker's session, or, from a worker that has none
// here (refused at registration, say), without one.
TEST(MembershipTest, DoneNeedsTheWorkersOwnSession) {
  auto ps = MakePs(3);
  ASSERT_TRUE(Register(*ps, Reg(0, true, Config(3, 3))).ok());
  ASSERT_TRUE(Register(*ps, Reg(1, false, Config(3, 3))).ok());
  ASSERT_TRUE(Init(*ps, 0).ok());
  absl::Status s = ps->Done(1, SessionOf(*ps, 0), true, 0);
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_NE(s.message().find("cannot report it done"), std::string::npos) << s;
  EXPECT_EQ(ps->Done(1, 0, true, 0).code(), absl::StatusCode::kPermissionDenied);
  EXPECT_FALSE(ps->GetStats()->workers[1].done);
  // Worker 2 never got a session (say its config was refused): it may leave.
  EXPECT_EQ(Register(*ps, Reg(2, false, MakeConfig("async", 3, 3))).status().code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(ps->Done(2, 0, /*completed=*/false, 0).ok());
  TrainingStats stats = *ps->GetStats();
  EXPECT_TRUE(stats.workers[2].done);
  EXPECT_TRUE(stats.workers[2].failed);
  ASSERT_TRUE(Done(*ps, 1).ok());
  EXPECT_TRUE(ps->GetStats()->workers[1].done);
  EXPECT_FALSE(ps->GetStats()->workers[1].failed);
}

// ---- hostile input --------------------------------------------------------------------------------------------

// Async under --nonfinite=apply applies each slice as it arrives whole (the apply overlaps the upload): an upload
// cut off after one of its two slices leaves that one applied. Not hidden: counted (partly_applied), and the
// accounting still balances.
TEST(ParameterServerTest, AnAsyncUploadCutOffUnderApplyIsCountedPartlyApplied) {
  ParameterServerOptions o = Options(1);
  o.nonfinite = ParameterServerOptions::NonFinite::kApply;
  auto ps = *ParameterServer::Create(o);
  TrainConfig c = Config(1, 1);
  c.mode = "async";
  ASSERT_TRUE(Register(*ps, Reg(0, true, c)).ok());
  ASSERT_TRUE(Init(*ps, 0).ok());
  {
    absl::StatusOr<std::unique_ptr<SliceUpload>> up =
        ps->StartPush(PushHeader{0, 0, 7, /*commit=*/true, SessionOf(*ps, 0)});
    ASSERT_TRUE(up.ok()) << up.status();
    const float w[3] = {1, 1, 1};
    ASSERT_TRUE((*up)->Write(0, 0, 3, WireDtype::kF32, w).ok());
  }  // cut off before "b" and Finish
  const PushAccounting a = ps->accounting();
  EXPECT_EQ(a.abandoned, 1);
  EXPECT_EQ(a.partly_applied, 1);
  EXPECT_TRUE(a.Balanced()) << a.DebugString();
  // An upload cut off before any slice was whole applied nothing.
  {
    absl::StatusOr<std::unique_ptr<SliceUpload>> up =
        ps->StartPush(PushHeader{0, 0, 8, /*commit=*/true, SessionOf(*ps, 0)});
    const float w[2] = {1, 1};
    ASSERT_TRUE((*up)->Write(0, 0, 2, WireDtype::kF32, w).ok());
  }
  EXPECT_EQ(ps->accounting().partly_applied, 1);
}

struct NonFiniteCase {
  ParameterServerOptions::NonFinite policy;
  const char* name;
};

class NonFiniteTest : public ::testing::TestWithParam<NonFiniteCase> {};

// NaN or Inf in a gradient: reject refuses the push and applies nothing; skip counts it and leaves it out of the
// step (which goes on with the other workers' gradients), both count it; apply applies it without looking.
TEST_P(NonFiniteTest, PolicyDecidesWhatHappens) {
  const NonFiniteCase& c = GetParam();
  ParameterServerOptions o = Options(2);
  o.nonfinite = c.policy;
  auto ps = *ParameterServer::Create(o);
  ASSERT_TRUE(Register(*ps, Reg(0, true, Config(2, 2))).ok());
  ASSERT_TRUE(Register(*ps, Reg(1, false, Config(2, 2))).ok());
  ASSERT_TRUE(Init(*ps, 0).ok());
  const float nan = std::numeric_limits<float>::quiet_NaN();
  absl::StatusOr<PushResponse> bad = Push(*ps, 0, 0, 1, {1, nan, 1}, {std::numeric_limits<float>::infinity()});
  ASSERT_TRUE(Push(*ps, 1, 0, 1, {2, 2, 2}, {2}).ok());
  TrainingStats stats = *ps->GetStats();
  // Counted unless applied regardless (apply does not look: it is the policy that costs nothing).
  EXPECT_EQ(stats.workers[0].nonfinite, c.policy == ParameterServerOptions::NonFinite::kApply ? 0 : 1);
  EXPECT_EQ(stats.workers[1].nonfinite, 0);
  switch (c.policy) {
    case ParameterServerOptions::NonFinite::kReject: {
      EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << bad.status();
      EXPECT_NE(bad.status().message().find("NaN or Inf in 'w'"), std::string::npos) << bad.status();
      EXPECT_NE(bad.status().message().find("--nonfinite=reject"), std::string::npos) << bad.status();
      EXPECT_EQ(ps->step(), 0) << "worker 0's commit was refused: step 0 still waits for it";
      ASSERT_TRUE(Done(*ps, 0).ok());  // it leaves: step 0 is decided with worker 1 alone
      absl::StatusOr<Pulled> r = Pull(*ps, 1, 1);
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_EQ(r->slices[0], std::vector<float>({0, 1, 2}));  // 1,2,3 - 0.5*2: worker 1's gradient only
      break;
    }
    case ParameterServerOptions::NonFinite::kSkip: {
      ASSERT_TRUE(bad.ok()) << bad.status();
      EXPECT_EQ(bad->outcome, PushResponse::Outcome::kSkippedNonFinite);
      absl::StatusOr<Pulled> r = Pull(*ps, 1, 1);
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_EQ(r->header.step, 1) << "the step went on";
      EXPECT_EQ(r->slices[0], std::vector<float>({0, 1, 2})) << "averaged over the finite gradients only";
      EXPECT_EQ(r->slices[1], std::vector<float>({3}));
      break;
    }
    case ParameterServerOptions::NonFinite::kApply: {
      ASSERT_TRUE(bad.ok()) << bad.status();
      EXPECT_EQ(bad->outcome, PushResponse::Outcome::kAccepted);
      absl::StatusOr<Pulled> r = Pull(*ps, 1, 1);
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_TRUE(std::isnan(r->slices[0][1]));
      EXPECT_TRUE(std::isinf(r->slices[1][0]));
      break;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Policies, NonFiniteTest,
                         ::testing::Values(NonFiniteCase{ParameterServerOptions::NonFinite::kReject, "reject"},
                                           NonFiniteCase{ParameterServerOptions::NonFinite::kSkip, "skip"},
                                           NonFiniteCase{ParameterServerOptions::NonFinite::kApply, "apply"}),
                         [](const ::testing::TestParamInfo<NonFiniteCase>& info) { return info.param.name; });

TEST(HostileInputTest, NonFinitePolicyFlagIsParsed) {
  EXPECT_EQ(*ParseNonFinitePolicy("skip"), ParameterServerOptions::NonFinite::kSkip);
  absl::StatusOr<ParameterServerOptions::NonFinite> bad = ParseNonFinitePolicy("ignore");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("--nonfinite=ignore"), std::string::npos) << bad.status();
}

// A chief whose model would not fit is refused before anything is allocated, with the limit named.
TEST(HostileInputTest, RegisterIsBoundedByMaxModelBytes) {
  ParameterServerOptions o = Options(1);
  o.max_model_bytes = 12;  // 3 floats; the config holds 4
  auto ps = *ParameterServer::Create(o);
  absl::StatusOr<RegisterResponse> r = Register(*ps, Reg(0, true, Config(1, 1)));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status();
  EXPECT_NE(r.status().message().find("16 bytes, more than --max_model_bytes=12"), std::string::npos) << r.status();
  // Nothing was adopted: a chief with a model that fits is welcome.
  TrainConfig small = Config(1, 1);
  small.slices = {{0, "w", 0, 3}};
  EXPECT_TRUE(Register(*ps, Reg(0, true, small)).ok());
}

// Only a registered worker may push or pull: without a session (or with another's) nothing is accepted.
TEST(HostileInputTest, OnlyRegisteredWorkersPushOrPull) {
  auto ps = MakePs(2);
  ASSERT_TRUE(Register(*ps, Reg(0, true, Config(2, 2))).ok());
  ASSERT_TRUE(Init(*ps, 0).ok());
  absl::StatusOr<PushResponse> r = PushSlices(*ps, PushHeader{1, 0, 1, true, 0}, {{0, {9, 9, 9}}, {1, {9}}});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kAborted) << r.status();
  r = PushSlices(*ps, PushHeader{1, 0, 1, true, SessionOf(*ps, 0)}, {{0, {9, 9, 9}}, {1, {9}}});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kAborted) << r.status();
  r = PushSlices(*ps, PushHeader{0, 0, 1, true, SessionOf(*ps, 0) + 1}, {{0, {9, 9, 9}}, {1, {9}}});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kPermissionDenied) << r.status();
  EXPECT_EQ(Pull(*ps, 1, 0).status().code(), absl::StatusCode::kAborted);
  // A commit's input position is bounded.
  PushHeader big{0, 0, 2, true, SessionOf(*ps, 0)};
  big.input_position.assign(kMaxInputPositionBytes + 1, 'x');
  r = PushSlices(*ps, big, {{0, {9, 9, 9}}, {1, {9}}});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_NE(r.status().message().find("input position"), std::string::npos) << r.status();
  TrainingStats stats = *ps->GetStats();
  EXPECT_EQ(stats.workers[0].applied + stats.workers[1].applied, 0);
  EXPECT_EQ(ps->step(), 0);
}

}  // namespace
}  // namespace dtrain::ps
