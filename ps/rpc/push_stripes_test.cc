// Pushes striped over several streams (ps/rpc/push_stripes.h), as the ps's gRPC service feeds them
// (ps/rpc/upload_feeder.h): the parts of a push make one upload of the ps core, applied only when every part
// arrived whole; a part cannot join another worker's push, a push twice, or a push that ended; the writes of the
// streams never overlap.
#include "ps/rpc/push_stripes.h"

#include <atomic>
#include <thread>
#include <vector>

#include "absl/time/time.h"
#include "dtrain.pb.h"
#include "gtest/gtest.h"
#include "ps/rpc/tensor_coding.h"
#include "ps/rpc/upload_feeder.h"
#include "ps/rpc/wire_format.h"
#include "ps/testing/ps_test_util.h"

namespace dtrain::ps {
namespace {

using ::dtrain::ps::testing::MakeConfig;
using ::dtrain::ps::testing::SimCluster;
using ::dtrain::ps::testing::SimClusterOptions;

// Counts writes and fails the test when two overlap.
class CountingUpload : public SliceUpload {
 public:
  absl::Status Write(uint32_t, int64_t, int64_t n, WireDtype, const void*) override {
    EXPECT_EQ(inside_.fetch_add(1), 0) << "two streams wrote at once";
    std::this_thread::yield();
    floats_ += n;
    inside_.fetch_sub(1);
    return absl::OkStatus();
  }
  absl::Status WriteSparse(uint32_t, const int64_t*, int64_t, int, WireDtype, const void*) override {
    return absl::OkStatus();
  }
  absl::Status SetGradientNorm(double) override { return absl::OkStatus(); }
  absl::StatusOr<PushResponse> Finish() override { return PushResponse{}; }
  int64_t floats() const { return floats_; }

 private:
  std::atomic<int> inside_{0};
  int64_t floats_ = 0;
};

StripeMember Member(uint64_t stripe, int part, int worker = 1) { return StripeMember{worker, 7, 99, stripe, part}; }

TEST(PushStripesTest, PartsJoinWaitingForTheMainStreamAndWriteOneAtATime) {
  PushStripes stripes;
  CountingUpload upload;
  constexpr int kParts = 3;
  std::vector<std::thread> parts;
  std::atomic<int> joined{0};
  for (int p = 1; p <= kParts; ++p) {
    // Started before the main stream opens the stripe: they wait for it.
    parts.emplace_back([&, p] {
      absl::StatusOr<std::shared_ptr<PushStripes::Stripe>> s =
          stripes.Join(Member(5, p), absl::Now() + absl::Seconds(20));
      ASSERT_TRUE(s.ok()) << s.status();
      ++joined;
      const float data[4] = {1, 2, 3, 4};
      for (int i = 0; i < 1000; ++i) ASSERT_TRUE((*s)->Write(p, 0, 4, WireDtype::kF32, data).ok());
      (*s)->PartEnded(p, absl::OkStatus());
    });
  }
  absl::SleepFor(absl::Milliseconds(20));
  absl::StatusOr<std::shared_ptr<PushStripes::Stripe>> main = stripes.Open(Member(5, 0), kParts, &upload);
  ASSERT_TRUE(main.ok()) << main.status();
  const float data[2] = {1, 2};
  for (int i = 0; i < 1000; ++i) ASSERT_TRUE((*main)->Write(0, 0, 2, WireDtype::kF32, data).ok());
  for (std::thread& t : parts) t.join();
  EXPECT_EQ(joined.load(), kParts);
  EXPECT_TRUE(stripes.Close(5, /*finishing=*/true).ok());
  EXPECT_EQ(upload.floats(), 1000 * (2 + 4 * kParts));
  // Ended: a late write or a late part fails at once.
  EXPECT_EQ((*main)->Write(0, 0, 2, WireDtype::kF32, data).code(), absl::StatusCode::kFailedPrecondition);
  absl::StatusOr<std::shared_ptr<PushStripes::Stripe>> late = stripes.Join(Member(5, 1), absl::InfiniteFuture());
  EXPECT_EQ(late.status().code(), absl::StatusCode::kFailedPrecondition) << late.status();
}

TEST(PushStripesTest, APushFinishesOnlyWhenEveryPartEndedWhole) {
  PushStripes stripes;
  CountingUpload upload;
  ASSERT_TRUE(stripes.Open(Member(1, 0), 2, &upload).ok());
  absl::StatusOr<std::shared_ptr<PushStripes::Stripe>> p1 = stripes.Join(Member(1, 1), absl::Now());
  ASSERT_TRUE(p1.ok()) << p1.status();
  (*p1)->PartEnded(1, absl::OkStatus());
  // Part 2 never came.
  absl::Status closed = stripes.Close(1, /*finishing=*/true);
  EXPECT_EQ(closed.code(), absl::StatusCode::kUnavailable) << closed;
  EXPECT_NE(closed.message().find("part 2 of 2"), std::string::npos) << closed;

  ASSERT_TRUE(stripes.Open(Member(2, 0), 1, &upload).ok());
  absl::StatusOr<std::shared_ptr<PushStripes::Stripe>> broken = stripes.Join(Member(2, 1), absl::Now());
  ASSERT_TRUE(broken.ok());
  (*broken)->PartEnded(1, absl::AbortedError("the part stream broke"));
  closed = stripes.Close(2, /*finishing=*/true);
  EXPECT_EQ(closed.code(), absl::StatusCode::kAborted) << closed;
}

TEST(PushStripesTest, StrangersAndRepeatsAreRefused) {
  PushStripes stripes;
  CountingUpload upload;
  ASSERT_TRUE(stripes.Open(Member(3, 0), 2, &upload).ok());
  EXPECT_EQ(stripes.Open(Member(3, 0), 2, &upload).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(stripes.Open(Member(4, 0), 0, &upload).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(stripes.Open(Member(4, 0), kMaxPushParts + 1, &upload).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Another worker, session or request cannot write into this push.
  EXPECT_EQ(stripes.Join(Member(3, 1, /*worker=*/2), absl::Now()).status().code(),
            absl::StatusCode::kPermissionDenied);
  StripeMember other_session = Member(3, 1);
  other_session.session = 8;
  EXPECT_EQ(stripes.Join(other_session, absl::Now()).status().code(), absl::StatusCode::kPermissionDenied);
  // Parts are 1..2, each once.
  EXPECT_EQ(stripes.Join(Member(3, 0), absl::Now()).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(stripes.Join(Member(3, 3), absl::Now()).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(stripes.Join(Member(3, 2), absl::Now()).ok());
  EXPECT_EQ(stripes.Join(Member(3, 2), absl::Now()).status().code(), absl::StatusCode::kInvalidArgument);
  // A push that never comes: the part gives up at its deadline.
  const absl::Time start = absl::Now();
  EXPECT_EQ(stripes.Join(Member(77, 1), absl::Now() + absl::Milliseconds(50)).status().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(45));
  // A call or server that ends stops the wait at once.
  std::atomic<bool> stop{false};
  std::thread stopper([&] {
    absl::SleepFor(absl::Milliseconds(30));
    stop = true;
  });
  const absl::Time stopped_at = absl::Now();
  EXPECT_EQ(stripes.Join(Member(78, 1), absl::Now() + absl::Seconds(30), [&] { return stop.load(); }).status().code(),
            absl::StatusCode::kCancelled);
  EXPECT_LT(absl::Now() - stopped_at, absl::Seconds(5));
  stopper.join();
  EXPECT_TRUE(stripes.Close(3, /*finishing=*/false).ok());
}

// Through the feeders, into a ps core: the main stream with one part. The push counts only when the part arrived
// whole; a main stream that ends first leaves the step where it was.
grpc::ByteBuffer HeaderMessage(const PushHeader& h, uint64_t stripe, uint32_t parts) {
  ::dtrain::wire::PushHeader p;
  wire::ToProto(h, &p);
  p.set_stripe_id(stripe);
  p.set_stripe_parts(parts);
  coding::MessageBuilder b;
  b.SetHeader(p.SerializeAsString());
  return b.Build();
}
grpc::ByteBuffer PartHeaderMessage(const PushHeader& h, uint64_t stripe, uint32_t part) {
  ::dtrain::wire::PushPartHeader p;
  p.set_worker_id(h.worker_id);
  p.set_session(h.session);
  p.set_request_id(h.request_id);
  p.set_stripe_id(stripe);
  p.set_part(part);
  coding::MessageBuilder b;
  b.SetHeader(p.SerializeAsString());
  return b.Build();
}
grpc::ByteBuffer DataMessage(uint32_t key, const std::vector<float>& values) {
  coding::MessageBuilder b;
  float* dst = static_cast<float*>(b.AddChunkOwned(key, 0, WireDtype::kF32, static_cast<int64_t>(values.size())));
  std::copy(values.begin(), values.end(), dst);
  return b.Build();
}

TEST(PushStripesTest, FeedersMergeTheStreamsOfAPushIntoOneUpload) {
  SimClusterOptions o;
  o.variables = {{"a", 3}, {"b", 2}};
  o.placement.min_slice_bytes = 0;
  o.config = MakeConfig("sync", 1, 1, 1.0f);
  o.initial = std::vector<float>(5, 1.0f);
  absl::StatusOr<std::unique_ptr<SimCluster>> cluster = SimCluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  ParameterServer& ps = (*cluster)->task(0);
  PushStripes stripes;
  const PushHeader header{0, 0, 1234, /*commit=*/true, (*cluster)->Session(0, 0)};

  {  // The main stream ends without its part: refused, nothing applied.
    UploadFeeder main(&ps, false, &stripes);
    ASSERT_TRUE(main.Feed(HeaderMessage(header, 11, 1)).ok());
    ASSERT_TRUE(main.Feed(DataMessage(0, {1, 1, 1})).ok());
    absl::StatusOr<PushResponse> finished = main.Finish();
    EXPECT_EQ(finished.status().code(), absl::StatusCode::kUnavailable) << finished.status();
    EXPECT_EQ(ps.step(), 0);
  }
  {  // A part in a stream that is not a part: refused; rows and trailers in a part: refused.
    UploadFeeder not_a_part(&ps, false, nullptr);
    EXPECT_EQ(not_a_part.Feed(HeaderMessage(header, 12, 1)).code(), absl::StatusCode::kInvalidArgument);
  }
  // Both streams: applied once, as one push (a = 1 - 1, b = 1 - 2).
  PushHeader retry = header;
  retry.request_id = 1235;
  UploadFeeder main(&ps, false, &stripes);
  ASSERT_TRUE(main.Feed(HeaderMessage(retry, 13, 1)).ok());
  UploadFeeder part(&ps, false, &stripes, /*part=*/true, absl::Now() + absl::Seconds(5));
  ASSERT_TRUE(part.Feed(PartHeaderMessage(retry, 13, 1)).ok());
  ASSERT_TRUE(part.Feed(DataMessage(1, {2, 2})).ok());
  ASSERT_TRUE(main.Feed(DataMessage(0, {1, 1, 1})).ok());
  coding::MessageBuilder trailer;
  trailer.SetTrailer("");
  EXPECT_EQ(part.Feed(trailer.Build()).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(part.Finish().ok());
  absl::StatusOr<PushResponse> finished = main.Finish();
  ASSERT_TRUE(finished.ok()) << finished.status();
  EXPECT_EQ(finished->global_step, 1);
  EXPECT_EQ(ps.step(), 1);
}

}  // namespace
}  // namespace dtrain::ps
