// ParameterServer's early apply (parameter_server.h): with one worker and one ps task in sync mode, a push that
// asks for it is applied as it arrives, the pull behind it streams the new values before the push has finished,
// and a push that does not become its step is taken back without a trace.
#include <atomic>
#include <cmath>
#include <future>
#include <limits>
#include <memory>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "gtest/gtest.h"
#include "ps/core/parameter_server.h"
#include "ps/core/slice_store.h"
#include "ps/testing/ps_test_util.h"

namespace dtrain::ps {
namespace {

using ::dtrain::ps::testing::MakeConfig;
using ::dtrain::ps::testing::SimCluster;
using ::dtrain::ps::testing::SimClusterOptions;

constexpr int64_t kChunk = SliceStore::kChunkFloats;
constexpr int64_t kWeights = 3 * kChunk + 11;  // several chunks, the last one short
constexpr int64_t kBiases = 9;

std::unique_ptr<SimCluster> StartCluster(int num_workers = 1) {
  SimClusterOptions o;
  o.variables = {{"w", kWeights}, {"b", kBiases}};
  o.config = MakeConfig("sync", num_workers, num_workers);
  o.config.optimizer.name = "adam";
  o.config.optimizer.learning_rate = 0.01f;
  o.config.moving_average_decay = 0.99f;
  o.initial.resize(kWeights + kBiases);
  for (size_t k = 0; k < o.initial.size(); ++k) o.initial[k] = 0.001f * static_cast<float>((k * 7919) % 1000) - 0.5f;
  absl::StatusOr<std::unique_ptr<SimCluster>> cluster = SimCluster::Start(o);
  CHECK(cluster.ok()) << cluster.status();
  return *std::move(cluster);
}

std::vector<float> Gradient(int64_t step) {
  std::vector<float> g(kWeights + kBiases);
  for (size_t k = 0; k < g.size(); ++k) {
    g[k] = 0.01f * static_cast<float>(((k + 31 * step) * 104729) % 2001 - 1000) / 1000.0f;
  }
  return g;
}

// Collects a pull into a flat buffer, in whatever order the slices come; counts the floats that arrived and lets a
// test wait until some have.
class Collector : public PullReceiver {
 public:
  explicit Collector(const SimCluster& cluster) : cluster_(cluster), flat_(cluster.total_floats(), 0.0f) {}

  absl::Status OnHeader(const PullHeader& header) override {
    absl::MutexLock lock(&mu_);
    header_ = header;
    return absl::OkStatus();
  }
  absl::StatusOr<Buffer> Destination(uint32_t key, int64_t offset, int64_t n) override {
    for (const SliceSpec& s : cluster_.placement().slices) {
      if (s.key == key) return Buffer{flat_.data() + s.flat_offset + offset, WireDtype::kF32};
    }
    return absl::DataLossError("unknown slice");
  }
  absl::Status Written(uint32_t key, int64_t offset, int64_t n) override {
    absl::MutexLock lock(&mu_);
    floats_ += n;
    return absl::OkStatus();
  }
  // Waits (at most 20 s) until at least `n` floats arrived; returns whether they did.
  bool WaitFor(int64_t n) {
    absl::MutexLock lock(&mu_);
    auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return floats_ >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&ready), absl::Seconds(20));
  }
  PullHeader header() {
    absl::MutexLock lock(&mu_);
    return header_;
  }
  const std::vector<float>& flat() const { return flat_; }

 private:
  const SimCluster& cluster_;
  std::vector<float> flat_;
  absl::Mutex mu_;
  PullHeader header_ ABSL_GUARDED_BY(mu_);
  int64_t floats_ ABSL_GUARDED_BY(mu_) = 0;
};

// Worker 0 speaking to ps 0 directly, so that a test can stop a push half-way.
class Worker {
 public:
  explicit Worker(SimCluster* cluster) : cluster_(cluster), session_(cluster->Session(0, 0)) {}

  PushHeader Header(int64_t step, uint64_t request_id, bool apply_early) const {
    PushHeader h;
    h.worker_id = 0;
    h.step = step;
    h.request_id = request_id;
    h.commit = true;
    h.session = session_;
    h.apply_early = apply_early;
    return h;
  }
  absl::StatusOr<std::unique_ptr<SliceUpload>> Start(int64_t step, uint64_t request_id, bool apply_early = true) {
    return cluster_->task(0).StartPush(Header(step, request_id, apply_early));
  }
  // Writes floats [from, to) of the flat gradient (slice by slice, pieces of a 1 MiB message's floats).
  absl::Status Write(SliceUpload& upload, const std::vector<float>& g, int64_t from, int64_t to) {
    for (const SliceSpec& s : cluster_->placement().slices) {
      const int64_t begin = std::max(from, s.flat_offset), end = std::min(to, s.flat_offset + s.length);
      for (int64_t at = begin; at < end; at += 262144) {
        const int64_t n = std::min<int64_t>(262144, end - at);
        RETURN_IF_ERROR(upload.Write(s.key, at - s.flat_offset, n, WireDtype::kF32, g.data() + at));
      }
    }
    return absl::OkStatus();
  }
  absl::Status Pull(int64_t min_step, uint64_t after_push, Collector* into) {
    PullRequest request;
    request.worker_id = 0;
    request.session = session_;
    request.min_step = min_step;
    request.since_step = min_step - 1;
    request.after_push = after_push;
    request.timeout_ms = 20000;
    return cluster_->task(0).Pull(request, into);
  }
  // A whole step the plain way: push every slice, then pull.
  std::vector<float> Step(int64_t step, uint64_t request_id, const std::vector<float>& g, bool apply_early) {
    std::unique_ptr<SliceUpload> upload = *Start(step, request_id, apply_early);
    CHECK(Write(*upload, g, 0, static_cast<int64_t>(g.size())).ok());
    CHECK(upload->Finish().ok());
    upload.reset();
    Collector pulled(*cluster_);
    CHECK(Pull(step + 1, 0, &pulled).ok());
    return pulled.flat();
  }

 private:
  SimCluster* cluster_;
  uint64_t session_;
};

void ExpectSameState(ParameterServer& a, ParameterServer& b) {
  absl::StatusOr<CheckpointData> x = a.ExportState(), y = b.ExportState();
  ASSERT_TRUE(x.ok() && y.ok());
  EXPECT_EQ(x->global_step, y->global_step);
  ASSERT_EQ(x->slices.size(), y->slices.size());
  for (size_t i = 0; i < x->slices.size(); ++i) {
    EXPECT_EQ(x->slices[i].values, y->slices[i].values) << "slice " << i;  // bit for bit
    EXPECT_EQ(x->slices[i].slots, y->slices[i].slots) << "slice " << i;
    EXPECT_EQ(x->slices[i].moving_average, y->slices[i].moving_average) << "slice " << i;
  }
}

TEST(EarlyApplyTest, ThePullStreamsThePushAsItArrivesAndTheStepIsTheUsualOne) {
  auto early = StartCluster(), plain = StartCluster();
  Worker we(early.get()), wp(plain.get());
  for (int64_t step = 0; step < 3; ++step) {
    const std::vector<float> g = Gradient(step);
    const uint64_t id = 100 + step;
    std::unique_ptr<SliceUpload> upload = *we.Start(step, id);
    Collector pulled(*early);
    std::future<absl::Status> pull = std::async(std::launch::async, [&] { return we.Pull(step + 1, id, &pulled); });
    // Half the weights: the pull already streams their update, while the push is still open.
    ASSERT_TRUE(we.Write(*upload, g, 0, 2 * kChunk).ok());
    ASSERT_TRUE(pulled.WaitFor(2 * kChunk)) << "nothing streamed before the push finished";
    EXPECT_TRUE(pulled.header().tentative);
    EXPECT_EQ(pulled.header().step, step + 1);
    EXPECT_EQ(early->task(0).step(), step);  // not decided yet
    ASSERT_TRUE(we.Write(*upload, g, 2 * kChunk, static_cast<int64_t>(g.size())).ok());
    absl::StatusOr<PushResponse> pushed = upload->Finish();
    ASSERT_TRUE(pushed.ok()) << pushed.status();
    EXPECT_EQ(pushed->outcome, PushResponse::Outcome::kAccepted);
    upload.reset();
    ASSERT_TRUE(pull.get().ok());
    // The values pulled and the whole state (slots, moving averages) are those of the push applied when whole.
    EXPECT_EQ(pulled.flat(), wp.Step(step, id, g, /*apply_early=*/false));
    ExpectSameState(early->task(0), plain->task(0));
  }
  const PushAccounting a = early->task(0).accounting();
  EXPECT_TRUE(a.Balanced()) << a.DebugString();
  EXPECT_EQ(a.applied, 3);
}

TEST(EarlyApplyTest, APushAbandonedHalfWayIsTakenBackAndItsPullFails) {
  auto early = StartCluster(), plain = StartCluster();
  Worker we(early.get()), wp(plain.get());
  const std::vector<float> g = Gradient(0);
  std::unique_ptr<SliceUpload> upload = *we.Start(0, 7);
  Collector pulled(*early);
  std::future<absl::Status> pull = std::async(std::launch::async, [&] { return we.Pull(1, 7, &pulled); });
  ASSERT_TRUE(we.Write(*upload, g, 0, 2 * kChunk).ok());
  ASSERT_TRUE(pulled.WaitFor(kChunk));
  // A checkpoint now holds none of it.
  ExpectSameState(early->task(0), plain->task(0));
  upload.reset();  // the worker died, or its stream broke
  const absl::Status status = pull.get();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_NE(status.message().find("took back"), std::string::npos) << status;
  EXPECT_EQ(early->task(0).step(), 0);
  ExpectSameState(early->task(0), plain->task(0));
  // The retry (same request id) and its pull give what one push gives.
  const std::vector<float> expected = wp.Step(0, 7, g, /*apply_early=*/false);
  EXPECT_EQ(we.Step(0, 7, g, /*apply_early=*/true), expected);
  ExpectSameState(early->task(0), plain->task(0));
  const PushAccounting a = early->task(0).accounting();
  EXPECT_TRUE(a.Balanced()) << a.DebugString();
  EXPECT_EQ(a.abandoned, 1);
  EXPECT_EQ(a.applied, 1);
}

TEST(EarlyApplyTest, ARejectedPushIsTakenBack) {
  auto early = StartCluster(), plain = StartCluster();
  Worker we(early.get());
  std::vector<float> g = Gradient(0);
  g.back() = std::numeric_limits<float>::quiet_NaN();  // in the biases, written after the weights were applied
  std::unique_ptr<SliceUpload> upload = *we.Start(0, 9);
  Collector pulled(*early);
  std::future<absl::Status> pull = std::async(std::launch::async, [&] { return we.Pull(1, 9, &pulled); });
  ASSERT_TRUE(we.Write(*upload, g, 0, static_cast<int64_t>(g.size())).ok());
  ASSERT_TRUE(pulled.WaitFor(kWeights));
  EXPECT_EQ(upload->Finish().status().code(), absl::StatusCode::kInvalidArgument);
  upload.reset();
  EXPECT_EQ(pull.get().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(early->task(0).step(), 0);
  ExpectSameState(early->task(0), plain->task(0));
}

TEST(EarlyApplyTest, ARetryThatOvertakesTheFirstUploadWins) {
  auto early = StartCluster(), plain = StartCluster();
  Worker we(early.get()), wp(plain.get());
  const std::vector<float> g = Gradient(0);
  std::unique_ptr<SliceUpload> first = *we.Start(0, 5);
  ASSERT_TRUE(we.Write(*first, g, 0, 2 * kChunk).ok());
  // The worker gave up on the first stream and retried on a new one while the first is still open.
  std::unique_ptr<SliceUpload> retry = *we.Start(0, 5);
  ASSERT_TRUE(we.Write(*retry, g, 0, static_cast<int64_t>(g.size())).ok());
  // The first one's late pieces are refused (the slice arrived whole already) and change nothing.
  EXPECT_FALSE(we.Write(*first, g, 2 * kChunk, 3 * kChunk).ok());
  ASSERT_TRUE(retry->Finish().ok());
  retry.reset();
  first.reset();
  Collector pulled(*early);
  ASSERT_TRUE(we.Pull(1, 0, &pulled).ok());
  EXPECT_FALSE(pulled.header().tentative);
  EXPECT_EQ(pulled.flat(), wp.Step(0, 5, g, /*apply_early=*/false));
  ExpectSameState(early->task(0), plain->task(0));
}

TEST(EarlyApplyTest, OnlyWhereTheStepCanOnlyBeThisPush) {
  // Two workers: the step is decided by both, so nothing is applied before it (the pull waits as usual).
  auto cluster = StartCluster(/*num_workers=*/2);
  Worker w(cluster.get());
  std::unique_ptr<SliceUpload> upload = *w.Start(0, 3);
  ASSERT_TRUE(w.Write(*upload, Gradient(0), 0, kWeights + kBiases).ok());
  Collector pulled(*cluster);
  std::future<absl::Status> pull = std::async(std::launch::async, [&] { return w.Pull(1, 3, &pulled); });
  EXPECT_EQ(pull.wait_for(std::chrono::milliseconds(100)), std::future_status::timeout);
  EXPECT_FALSE(pulled.header().tentative);
  ASSERT_TRUE(upload->Finish().ok());
  upload.reset();
  EXPECT_EQ(cluster->task(0).step(), 0);  // worker 1 has not pushed
  cluster->task(0).EndRun("test over");
  EXPECT_FALSE(pull.get().ok());
}

}  // namespace
}  // namespace dtrain::ps
