// The gRPC adapter end to end on 127.0.0.1 (port 0): large tensors are chunked below gRPC's 4 MB limit,
// statuses survive the trip, retried pushes are not applied twice, and the server stops by itself.
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <numeric>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "ps/grpc_ps_client.h"
#include "ps/server.h"
#include "ps/wire_format.h"

namespace dtrain::ps {
namespace {

constexpr int64_t kBig = 3'000'000;  // 12 MB: three times gRPC's default message limit

TrainConfig Config() {
  TrainConfig c;
  c.model_signature = "test/v1";
  c.mode = "sync";
  c.num_workers = 1;
  c.optimizer.name = "sgd";
  c.optimizer.learning_rate = 0.5f;
  c.slices = {SliceSpec{0, "big", 0, kBig}, SliceSpec{1, "small", kBig, 3}};
  return c;
}

TEST(GrpcPsTest, RoundTripLargeTensorsAndRetriedPush) {
  PsServerOptions so;
  so.listen_address = "127.0.0.1:0";
  so.ps.num_workers = 1;
  so.linger = absl::ZeroDuration();
  absl::StatusOr<std::unique_ptr<PsServer>> server = PsServer::Start(so);
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_GT((*server)->port(), 0);
  absl::StatusOr<std::unique_ptr<PsInterface>> client = NewGrpcPsClient((*server)->address(), {});
  ASSERT_TRUE(client.ok());
  PsInterface& ps = **client;

  absl::StatusOr<RegisterResponse> reg = ps.Register(RegisterRequest{0, true, Config()});
  ASSERT_TRUE(reg.ok()) << reg.status();
  EXPECT_FALSE(reg->initialized);

  InitializeRequest init;
  init.worker_id = 0;
  init.slices = {SliceData{0, std::vector<float>(kBig)}, SliceData{1, {1.f, 2.f, 3.f}}};
  std::iota(init.slices[0].values.begin(), init.slices[0].values.end(), 0.f);
  ASSERT_TRUE(ps.Initialize(init).ok());

  PushRequest push;
  push.worker_id = 0;
  push.step = 0;
  push.request_id = 42;
  push.commit = true;
  push.gradients = {SliceData{0, std::vector<float>(kBig, 2.f)}, SliceData{1, {2.f, 4.f, 6.f}}};
  absl::StatusOr<PushResponse> pushed = ps.Push(push);
  ASSERT_TRUE(pushed.ok()) << pushed.status();
  EXPECT_EQ(pushed->outcome, PushResponse::Outcome::kAccepted);
  EXPECT_EQ(pushed->global_step, 1);
  // The same push again (a retry after a lost reply) is recognized and not applied.
  absl::StatusOr<PushResponse> again = ps.Push(push);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->outcome, PushResponse::Outcome::kDuplicate);

  PullRequest pull;
  pull.worker_id = 0;
  pull.min_step = 1;
  absl::StatusOr<PullResponse> pulled = ps.Pull(pull);
  ASSERT_TRUE(pulled.ok()) << pulled.status();
  EXPECT_EQ(pulled->step, 1);
  ASSERT_EQ(pulled->slices.size(), 2u);
  ASSERT_EQ(pulled->slices[0].values.size(), static_cast<size_t>(kBig));
  // var -= 0.5 * 2 exactly once.
  EXPECT_FLOAT_EQ(pulled->slices[0].values[0], -1.f);
  EXPECT_FLOAT_EQ(pulled->slices[0].values[kBig - 1], static_cast<float>(kBig - 1) - 1.f);
  EXPECT_FLOAT_EQ(pulled->slices[1].values[2], 0.f);

  ASSERT_TRUE(ps.Done(0).ok());
  EXPECT_TRUE((*server)->Wait(absl::Seconds(10)));
}

TEST(GrpcPsTest, ErrorsKeepTheirCodeAndMessage) {
  PsServerOptions so;
  so.listen_address = "127.0.0.1:0";
  so.ps.num_workers = 2;
  absl::StatusOr<std::unique_ptr<PsServer>> server = PsServer::Start(so);
  ASSERT_TRUE(server.ok());
  GrpcClientOptions co;
  co.retry_window = absl::Milliseconds(300);
  auto client = NewGrpcPsClient((*server)->address(), co);
  ASSERT_TRUE(client.ok());
  // A non-chief before the chief: Unavailable (the worker waits and retries).
  TrainConfig c = Config();
  c.num_workers = 2;
  absl::StatusOr<RegisterResponse> early = (*client)->Register(RegisterRequest{1, false, c});
  EXPECT_EQ(early.status().code(), absl::StatusCode::kUnavailable) << early.status();
  ASSERT_TRUE((*client)->Register(RegisterRequest{0, true, c}).ok());
  // A worker built for another model is refused with a message naming the mismatch.
  TrainConfig other = c;
  other.model_signature = "other/v1";
  absl::StatusOr<RegisterResponse> bad = (*client)->Register(RegisterRequest{1, false, other});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(bad.status().message().find("model_signature"), std::string::npos) << bad.status();
  // A stranger's worker id.
  EXPECT_FALSE((*client)->Done(7).ok());
  (*server)->Shutdown();
}

TEST(GrpcPsTest, UnreachableServerIsUnavailableAfterRetryWindow) {
  GrpcClientOptions co;
  co.retry_window = absl::Milliseconds(300);
  co.rpc_timeout = absl::Seconds(1);
  auto client = NewGrpcPsClient("127.0.0.1:1", co);
  ASSERT_TRUE(client.ok());
  absl::StatusOr<TrainingStats> s = (*client)->GetStats();
  EXPECT_EQ(s.status().code(), absl::StatusCode::kUnavailable) << s.status();
  EXPECT_NE(s.status().message().find("127.0.0.1:1"), std::string::npos);
}

// The checkpoint-related fields: restore_step (unset = newest, kRestoreNone, a step), the decisions'
// checkpoint flag, and pulling moving averages.
TEST(GrpcPsTest, CheckpointFieldsCrossTheWire) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "dtrain_grpc_ckpt_", getpid());
  std::filesystem::remove_all(dir);
  TrainConfig c = Config();
  c.slices = {SliceSpec{0, "w", 0, 4}};
  c.moving_average_decay = 0.5f;
  auto start = [&](int64_t save_steps) {
    PsServerOptions so;
    so.listen_address = "127.0.0.1:0";
    so.ps.num_workers = 1;
    so.ps.checkpoint.dir = dir;
    so.ps.checkpoint.save_steps = save_steps;
    so.linger = absl::ZeroDuration();
    return PsServer::Start(so);
  };
  {
    auto server = start(1);
    ASSERT_TRUE(server.ok()) << server.status();
    auto client = NewGrpcPsClient((*server)->address(), {});
    ASSERT_TRUE(client.ok());
    ASSERT_FALSE((*client)->Register(RegisterRequest{0, true, c})->initialized);
    ASSERT_TRUE((*client)->Initialize(InitializeRequest{0, {SliceData{0, {1.f, 2.f, 3.f, 4.f}}}}).ok());
    ASSERT_TRUE((*client)->Push(PushRequest{0, 0, 1, true, {SliceData{0, {1.f, 1.f, 1.f, 1.f}}}}).ok());
    PullRequest pull;
    pull.min_step = 1;
    absl::StatusOr<PullResponse> values = (*client)->Pull(pull);
    ASSERT_TRUE(values.ok()) << values.status();
    ASSERT_EQ(values->decisions.size(), 1u);
    EXPECT_TRUE(values->decisions[0].checkpoint);  // ps 0 saved step 1
    pull.moving_averages = true;
    absl::StatusOr<PullResponse> averages = (*client)->Pull(pull);
    ASSERT_TRUE(averages.ok()) << averages.status();
    EXPECT_EQ(values->slices[0].values, (std::vector<float>{0.5f, 1.5f, 2.5f, 3.5f}));
    // decay min(0.5, 2/11): shadow = 1 - (1 - 2/11) * 0.5 for the first element.
    EXPECT_FLOAT_EQ(averages->slices[0].values[0], 1.f - (1.f - 2.f / 11.f) * 0.5f);
  }
  for (int64_t restore : {kRestoreNone, int64_t{1}, kRestoreNewest}) {
    auto server = start(0);
    ASSERT_TRUE(server.ok()) << server.status();
    auto client = NewGrpcPsClient((*server)->address(), {});
    ASSERT_TRUE(client.ok());
    RegisterRequest reg{0, true, c};
    reg.restore_step = restore;
    absl::StatusOr<RegisterResponse> r = (*client)->Register(reg);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->initialized, restore != kRestoreNone) << restore;
    EXPECT_EQ(r->global_step, restore != kRestoreNone ? 1 : 0) << restore;
  }
  std::filesystem::remove_all(dir);
}

TEST(WireFormatTest, ChunksStayBelowLimitAndReassemble) {
  std::vector<SliceData> slices = {SliceData{3, std::vector<float>(1'500'000, 1.f)}, SliceData{5, {7.f}},
                                   SliceData{9, std::vector<float>(600'000, 2.f)}};
  wire::SliceAssembler a;
  int messages = 0;
  ASSERT_TRUE(wire::ForEachChunkGroup(slices, [&](std::vector<dtrain::wire::SliceChunk>&& group) {
    int64_t bytes = 0;
    for (const auto& c : group) {
      bytes += c.data().size();
      EXPECT_TRUE(a.Add(c).ok());
    }
    EXPECT_LE(bytes, wire::kChunkBytes);
    ++messages;
    return true;
  }));
  EXPECT_GE(messages, 4);
  std::vector<SliceData> back = a.Take();
  ASSERT_EQ(back.size(), 3u);
  EXPECT_EQ(back[0].key, 3u);
  EXPECT_EQ(back[0].values, slices[0].values);
  EXPECT_EQ(back[1].values, slices[1].values);
  EXPECT_EQ(back[2].values, slices[2].values);
}

TEST(WireFormatTest, FlatChunksLandAtTheirOffsets) {
  const std::vector<SliceSpec> slices = {SliceSpec{4, "a", 10, 700'000}, SliceSpec{7, "b", 2, 3}};
  std::vector<float> src(700'010, 0.f), dst(700'010, -1.f);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<float>(i);
  wire::FlatAssembler a(slices, dst.data());
  ASSERT_TRUE(wire::ForEachChunkGroup(wire::Views(slices, src.data()),
                                      [&](std::vector<dtrain::wire::SliceChunk>&& group) {
                                        for (const auto& c : group) EXPECT_TRUE(a.Add(c).ok());
                                        return true;
                                      }));
  ASSERT_TRUE(a.Finish().ok());
  EXPECT_EQ(dst[0], -1.f);  // not part of any slice
  EXPECT_EQ(dst[2], 2.f);
  EXPECT_EQ(dst[4], 4.f);
  EXPECT_EQ(dst[10], 10.f);
  EXPECT_EQ(dst[700'009], 700'009.f);

  wire::FlatAssembler missing(slices, dst.data());
  EXPECT_EQ(missing.Finish().code(), absl::StatusCode::kDataLoss);
  dtrain::wire::SliceChunk stranger;
  stranger.set_key(99);
  stranger.set_data(std::string(4, '\0'));
  EXPECT_EQ(missing.Add(stranger).code(), absl::StatusCode::kDataLoss);
  dtrain::wire::SliceChunk overflow;
  overflow.set_key(7);
  overflow.set_data(std::string(16, '\0'));  // 4 floats into a 3-float slice
  EXPECT_EQ(missing.Add(overflow).code(), absl::StatusCode::kDataLoss);
}

TEST(WireFormatTest, GapsAreRejected) {
  wire::SliceAssembler a;
  dtrain::wire::SliceChunk c;
  c.set_key(1);
  c.set_offset(4);
  c.set_data(std::string(8, '\0'));
  EXPECT_EQ(a.Add(c).code(), absl::StatusCode::kInvalidArgument);
  c.set_offset(0);
  c.set_data(std::string(7, '\0'));
  EXPECT_EQ(a.Add(c).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dtrain::ps
