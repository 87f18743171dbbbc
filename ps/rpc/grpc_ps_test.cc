// The gRPC adapter end to end on 127.0.0.1 (port 0): large tensors (up to 100 MB, fp32 and bf16) are chunked
// below gRPC's 4 MB limit, statuses survive the trip, retried pushes are not applied twice, the server stops by
// itself, and a shutdown ends a waiting pull at once.
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <cstdlib>
#include <fstream>
#include <atomic>
#include <future>
#include <numeric>
#include <random>
#include <set>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/cancellation.h"
#include "common/denormals.h"
#include "ps/client/placement.h"
#include "ps/client/worker_client.h"
#include "ps/core/optimizer.h"
#include "ps/core/slice_store.h"
#include "ps/rpc/grpc_ps_client.h"
#include "ps/rpc/transport.h"
#include "ps/rpc/server.h"
#include "ps/rpc/wire_format.h"
#include "ps/testing/ps_test_util.h"

namespace dtrain::ps {
namespace {

using ::dtrain::ps::testing::InitializeSlices;
using ::dtrain::ps::testing::Pulled;
using ::dtrain::ps::testing::PullSlices;
using ::dtrain::ps::testing::PushSlices;
using ::dtrain::ps::testing::Slices;

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

absl::StatusOr<std::unique_ptr<PsServer>> StartServer(int num_workers = 1) {
  PsServerOptions so;
  so.listen_address = "127.0.0.1:0";
  so.ps.num_workers = num_workers;
  so.linger = absl::ZeroDuration();
  return PsServer::Start(so);
}

TEST(GrpcPsTest, RoundTripLargeTensorsAndRetriedPush) {
  absl::StatusOr<std::unique_ptr<PsServer>> server = StartServer();
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_GT((*server)->port(), 0);
  absl::StatusOr<std::unique_ptr<PsInterface>> client = NewGrpcPsClient((*server)->address(), {});
  ASSERT_TRUE(client.ok());
  PsInterface& ps = **client;

  absl::StatusOr<RegisterResponse> reg = ps.Register(RegisterRequest{0, true, Config()});
  ASSERT_TRUE(reg.ok()) << reg.status();
  EXPECT_FALSE(reg->initialized);

  std::vector<float> initial(kBig);
  std::iota(initial.begin(), initial.end(), 0.f);
  ASSERT_TRUE(InitializeSlices(ps, 0, {{0, initial}, {1, {1.f, 2.f, 3.f}}}).ok());

  const PushHeader header{0, 0, 42, /*commit=*/true, reg->session};
  const Slices grads = {{0, std::vector<float>(kBig, 2.f)}, {1, {2.f, 4.f, 6.f}}};
  absl::StatusOr<PushResponse> pushed = PushSlices(ps, header, grads);
  ASSERT_TRUE(pushed.ok()) << pushed.status();
  EXPECT_EQ(pushed->outcome, PushResponse::Outcome::kAccepted);
  EXPECT_EQ(pushed->global_step, 1);
  // A retry of the same push (same request id) is recognised and not applied again.
  absl::StatusOr<PushResponse> again = PushSlices(ps, header, grads);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->outcome, PushResponse::Outcome::kDuplicate);

  PullRequest pull;
  pull.worker_id = 0;
  pull.session = reg->session;
  pull.min_step = 1;
  absl::StatusOr<Pulled> pulled = PullSlices(ps, pull);
  ASSERT_TRUE(pulled.ok()) << pulled.status();
  EXPECT_EQ(pulled->header.step, 1);
  ASSERT_EQ(pulled->slices[0].size(), static_cast<size_t>(kBig));
  for (int64_t i = 0; i < kBig; i += 99'991) EXPECT_EQ(pulled->slices[0][i], static_cast<float>(i) - 1.f) << i;
  EXPECT_EQ(pulled->slices[0][kBig - 1], static_cast<float>(kBig - 1) - 1.f);
  EXPECT_EQ(pulled->slices[1], std::vector<float>({0.f, 0.f, 0.f}));
  absl::StatusOr<TrainingStats> stats = ps.GetStats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->workers[0].duplicates, 1);
  EXPECT_EQ(stats->workers[0].applied, 1);

  ASSERT_TRUE(ps.Done(0, reg->session, true, 0).ok());
  EXPECT_TRUE((*server)->Wait(absl::Seconds(10)));  // finished: every worker is done
}

// A FlatPullReceiver that counts the floats as they arrive and keeps whether the header said tentative.
class CountingReceiver : public FlatPullReceiver {
 public:
  using FlatPullReceiver::FlatPullReceiver;
  absl::Status OnHeader(const PullHeader& header) override {
    tentative = header.tentative;
    return FlatPullReceiver::OnHeader(header);
  }
  absl::Status Written(uint32_t key, int64_t offset, int64_t n) override {
    floats += n;
    return FlatPullReceiver::Written(key, offset, n);
  }
  std::atomic<int64_t> floats{0};
  std::atomic<bool> tentative{false};
};

// Established TCP connections whose local end has `port` (the server's ends of its clients' connections; a
// dual-stack listener's appear in tcp6, as IPv4-mapped addresses).
int ConnectionsTo(int port) {
  int n = 0;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream tcp(table);
    std::string line;
    std::getline(tcp, line);  // the column names
    while (std::getline(tcp, line)) {
      std::istringstream fields(line);
      std::string slot, local, remote, state;
      fields >> slot >> local >> remote >> state;
      const size_t colon = local.rfind(':');
      if (state == "01" && colon != std::string::npos && std::stoi(local.substr(colon + 1), nullptr, 16) == port) {
        ++n;
      }
    }
  }
  return n;
}

// The early apply over gRPC (ps/core/parameter_server.h): granted to a worker on the ps's own host only when the
// ps says on (auto keeps it for workers on other hosts). Granted, the pull streams the push's update before the
// push has ended, and its values are the step's; not granted, the pull waits for the push as before. A pull
// marked beside_push (the worker asked for the early apply) takes a connection of its own, made on first use.
TEST(GrpcPsTest, EarlyApplyStreamsThePullBehindThePushWhereGranted) {
  for (ApplyEarly mode : {ApplyEarly::kOn, ApplyEarly::kAuto}) {
    SCOPED_TRACE(mode == ApplyEarly::kOn ? "on" : "auto");
    PsServerOptions so;
    so.listen_address = "127.0.0.1:0";
    so.linger = absl::ZeroDuration();
    so.apply_early = mode;
    absl::StatusOr<std::unique_ptr<PsServer>> server = PsServer::Start(so);
    ASSERT_TRUE(server.ok()) << server.status();
    absl::StatusOr<std::unique_ptr<PsInterface>> client = NewGrpcPsClient((*server)->address(), {});
    ASSERT_TRUE(client.ok());
    TrainConfig c = Config();
    c.optimizer.learning_rate = 1.0f;
    absl::StatusOr<RegisterResponse> reg = (*client)->Register(RegisterRequest{0, true, c});
    ASSERT_TRUE(reg.ok()) << reg.status();
    std::vector<float> values(kBig);
    for (int64_t i = 0; i < kBig; ++i) values[i] = static_cast<float>(i % 1000) * 0.25f;
    ASSERT_TRUE(InitializeSlices(**client, 0, {{0, values}, {1, {1.f, 2.f, 3.f}}}).ok());
    PushHeader h{0, 0, 1, true, reg->session};
    h.apply_early = true;
    absl::StatusOr<std::unique_ptr<SliceUpload>> upload = (*client)->StartPush(h);
    ASSERT_TRUE(upload.ok()) << upload.status();
    const std::vector<float> ones(kBig, 1.0f);
    ASSERT_TRUE((*upload)->Write(0, 0, kBig / 2, WireDtype::kF32, ones.data()).ok());
    PullRequest pull;
    pull.session = reg->session;
    pull.min_step = 1;
    pull.after_push = 1;
    pull.beside_push = mode == ApplyEarly::kOn;
    EXPECT_EQ(ConnectionsTo((*server)->port()), 1);
    std::vector<float> out(kBig + 3, -7.f);
    const std::vector<SliceSpec> slices = c.slices;
    CountingReceiver receiver(&slices, out.data());
    std::future<absl::Status> pulled = std::async(std::launch::async, [&] { return (*client)->Pull(pull, &receiver); });
    if (mode == ApplyEarly::kOn) {
      const absl::Time give_up = absl::Now() + absl::Seconds(20);
      while (receiver.floats.load() < SliceStore::kChunkFloats && absl::Now() < give_up) {
        absl::SleepFor(absl::Milliseconds(1));
      }
      EXPECT_GE(receiver.floats.load(), SliceStore::kChunkFloats) << "nothing streamed before the push ended";
      EXPECT_TRUE(receiver.tentative.load());
    } else {
      absl::SleepFor(absl::Milliseconds(200));
      EXPECT_EQ(receiver.floats.load(), 0) << "a worker on the ps's host got the early apply under auto";
    }
    ASSERT_TRUE((*upload)->Write(0, kBig / 2, kBig - kBig / 2, WireDtype::kF32, ones.data() + kBig / 2).ok());
    ASSERT_TRUE((*upload)->Write(1, 0, 3, WireDtype::kF32, ones.data()).ok());
    ASSERT_TRUE((*upload)->Finish().ok());
    ASSERT_TRUE(pulled.get().ok());
    ASSERT_TRUE(receiver.Finish().ok());
    for (int64_t i = 0; i < kBig; i += 99'991) EXPECT_EQ(out[i], values[i] - 1.f) << i;
    EXPECT_EQ(out[kBig - 1], values[kBig - 1] - 1.f);
    EXPECT_EQ(std::vector<float>(out.begin() + kBig, out.end()), std::vector<float>({0.f, 1.f, 2.f}));
    EXPECT_EQ(receiver.tentative.load(), mode == ApplyEarly::kOn);
    EXPECT_EQ(ConnectionsTo((*server)->port()), mode == ApplyEarly::kOn ? 2 : 1);
  }
}

TEST(GrpcPsTest, HundredMegabytesInNarrowAndWideTypes) {
  constexpr int64_t kHuge = 25'000'000;  // 100 MB of floats
  absl::StatusOr<std::unique_ptr<PsServer>> server = StartServer();
  ASSERT_TRUE(server.ok()) << server.status();
  absl::StatusOr<std::unique_ptr<PsInterface>> client = NewGrpcPsClient((*server)->address(), {});
  ASSERT_TRUE(client.ok());
  TrainConfig c = Config();
  c.optimizer.learning_rate = 1.0f;
  c.slices = {SliceSpec{0, "huge", 0, kHuge}};
  absl::StatusOr<RegisterResponse> reg = (*client)->Register(RegisterRequest{0, true, c});
  ASSERT_TRUE(reg.ok()) << reg.status();
  std::vector<float> values(kHuge);
  for (int64_t i = 0; i < kHuge; ++i) values[i] = static_cast<float>(i % 1000) * 0.25f;  // exact in bf16
  ASSERT_TRUE(InitializeSlices(**client, 0, {{0, values}}).ok());
  // A bf16 gradient upload: half the bytes, decoded by the ps.
  std::vector<uint16_t> bf16(kHuge, 0x3f80);  // 1.0
  absl::StatusOr<std::unique_ptr<SliceUpload>> upload = (*client)->StartPush(PushHeader{0, 0, 1, true, reg->session});
  ASSERT_TRUE(upload.ok()) << upload.status();
  ASSERT_TRUE((*upload)->Write(0, 0, kHuge, WireDtype::kBF16, bf16.data()).ok());
  ASSERT_TRUE((*upload)->Finish().ok());
  for (WireDtype dtype : {WireDtype::kF32, WireDtype::kBF16}) {
    PullRequest pull;
    pull.session = reg->session;
    pull.min_step = 1;
    pull.wire_dtype = dtype;
    std::vector<float> out(kHuge, -7.f);
    const std::vector<SliceSpec> slices = c.slices;
    FlatPullReceiver receiver(&slices, out.data());
    ASSERT_TRUE((*client)->Pull(pull, &receiver).ok()) << DtypeName(dtype);
    ASSERT_TRUE(receiver.Finish().ok());
    for (int64_t i = 0; i < kHuge; i += 1'000'003) EXPECT_EQ(out[i], RoundTrip(dtype, values[i] - 1.f)) << i;
    EXPECT_EQ(out[kHuge - 1], RoundTrip(dtype, values[kHuge - 1] - 1.f)) << DtypeName(dtype);
  }
  (*server)->Shutdown();
}

// The elastic read-ahead crosses gRPC both ways, its "none" (-1) as the proto's default, and -2 ("none drawn yet").
TEST(WireFormatTest, TheElasticReadAheadAndTheHeldBatchRoundTrip) {
  for (int64_t ahead : {int64_t{-2}, int64_t{-1}, int64_t{0}, int64_t{41}}) {
    PullRequest r;
    r.elastic_read_ahead = ahead;
    dtrain::wire::PullRequest p;
    wire::ToProto(r, &p);
    EXPECT_EQ(wire::FromProto(p).elastic_read_ahead, ahead);
  }
  EXPECT_EQ(wire::FromProto(dtrain::wire::PullRequest()).elastic_read_ahead, -1);  // an older worker's pull
  for (int64_t next : {int64_t{-1}, int64_t{0}, int64_t{12}}) {
    PullHeader h;
    h.elastic.unit = 64;
    h.elastic.batches = {3};
    h.elastic.next_batch = next;
    dtrain::wire::PullHeader p;
    wire::ToProto(h, &p);
    EXPECT_EQ(wire::FromProto(p).elastic, h.elastic);
  }
}

// A dtrain_ctl command's strings are cut to what a command needs, before a character, never inside one: the
// reason goes on into the run's end and its stats, which a peer could not parse if they were not UTF-8.
TEST(WireFormatTest, AControlRequestIsCutBeforeACharacter) {
  dtrain::wire::ControlRequest in;
  in.set_command("drain");
  in.set_reason(std::string(199, 'a') + "\xc3\xa9" + std::string(100, 'b'));  // "é" across byte 200
  ControlRequest r = wire::FromProto(in, "ipv4:127.0.0.1:5");
  EXPECT_EQ(r.command, "drain");
  EXPECT_EQ(r.reason, std::string(199, 'a') + " (from ipv4:127.0.0.1:5)");
  in.set_reason(std::string(198, 'a') + "\xc3\xa9" + "b");  // the whole character fits
  EXPECT_EQ(wire::FromProto(in, "p").reason, std::string(198, 'a') + "\xc3\xa9 (from p)");
  // What came out travels in a stats message and parses again.
  dtrain::wire::StatsResponse stats, back;
  in.set_reason(std::string(199, 'a') + "\xe2\x82\xac");  // "€", 3 bytes, across byte 200
  stats.set_job_ended(wire::FromProto(in, "p").reason);
  EXPECT_TRUE(back.ParseFromString(stats.SerializeAsString()));
  EXPECT_EQ(back.job_ended(), std::string(199, 'a') + " (from p)");
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
  EXPECT_FALSE((*client)->Done(7, 1, true, 0).ok());
  (*server)->Shutdown();
}

// Nobody listens: retried calls give up when their retry window is spent (waiting for a connection does not
// stretch it), single attempts after about a second, and a cancelled pull at once.
TEST(GrpcPsTest, UnreachableServerIsUnavailableAfterRetryWindow) {
  GrpcClientOptions co;
  co.retry_window = absl::Milliseconds(300);
  co.rpc_timeout = absl::Seconds(1);
  auto client = NewGrpcPsClient("127.0.0.1:1", co);
  ASSERT_TRUE(client.ok());
  absl::Time start = absl::Now();
  absl::StatusOr<TrainingStats> s = (*client)->GetStats();
  EXPECT_EQ(s.status().code(), absl::StatusCode::kUnavailable) << s.status();
  EXPECT_NE(s.status().message().find("127.0.0.1:1"), std::string::npos);
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(900));

  co.retry_window = absl::Seconds(2);
  client = NewGrpcPsClient("127.0.0.1:1", co);
  ASSERT_TRUE(client.ok());
  start = absl::Now();
  EXPECT_EQ((*client)->GetStats().status().code(), absl::StatusCode::kUnavailable);
  EXPECT_GT(absl::Now() - start, absl::Milliseconds(1000));  // it did retry
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(2600));

  start = absl::Now();
  EXPECT_EQ((*client)->Heartbeat(0, 1).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(1800));

  Cancellation cancel;
  cancel.Cancel();
  PullRequest pull;
  pull.cancel = &cancel;
  start = absl::Now();
  EXPECT_FALSE(PullSlices(**client, pull).ok());
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(500));
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
    absl::StatusOr<RegisterResponse> reg = (*client)->Register(RegisterRequest{0, true, c});
    ASSERT_TRUE(reg.ok()) << reg.status();
    ASSERT_FALSE(reg->initialized);
    ASSERT_TRUE(InitializeSlices(**client, 0, {{0, {1.f, 2.f, 3.f, 4.f}}}).ok());
    PushHeader header{0, 0, 1, true, reg->session};
    header.input_position = "worker 0's input after step 0";
    ASSERT_TRUE(PushSlices(**client, header, {{0, {1.f, 1.f, 1.f, 1.f}}}).ok());
    PullRequest pull;
    pull.session = reg->session;
    pull.min_step = 1;
    absl::StatusOr<Pulled> values = PullSlices(**client, pull);
    ASSERT_TRUE(values.ok()) << values.status();
    ASSERT_EQ(values->header.decisions.size(), 1u);
    EXPECT_TRUE(values->header.decisions[0].checkpoint);  // ps 0 saved step 1
    pull.moving_averages = true;
    absl::StatusOr<Pulled> averages = PullSlices(**client, pull);
    ASSERT_TRUE(averages.ok()) << averages.status();
    EXPECT_EQ(values->slices[0], (std::vector<float>{0.5f, 1.5f, 2.5f, 3.5f}));
    // decay min(0.5, 2/11): shadow = 1 - (1 - 2/11) * 0.5 for the first element.
    EXPECT_FLOAT_EQ(averages->slices[0][0], 1.f - (1.f - 2.f / 11.f) * 0.5f);
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
    EXPECT_EQ(r->input_position, restore != kRestoreNone ? "worker 0's input after step 0" : "") << restore;
  }
  std::filesystem::remove_all(dir);
}

// The ps applies updates on gRPC's handler threads (async: the uploading call; sync: the committing call) with
// flush-to-zero and denormals-are-zero set: a denormal gradient leaves the value exactly unchanged. (This test
// binary never sets the mode itself, so only the handlers can have.)
TEST(GrpcPsTest, HandlerThreadsFlushDenormals) {
  ASSERT_FALSE(FlushDenormalsEnabled());
  for (const std::string mode : {"async", "sync"}) {
    absl::StatusOr<std::unique_ptr<PsServer>> server = StartServer();
    ASSERT_TRUE(server.ok()) << server.status();
    absl::StatusOr<std::unique_ptr<PsInterface>> client = NewGrpcPsClient((*server)->address(), {});
    ASSERT_TRUE(client.ok());
    TrainConfig c = Config();
    c.mode = mode;
    c.optimizer.learning_rate = 1.0f;
    c.slices = {SliceSpec{0, "w", 0, 4}};
    absl::StatusOr<RegisterResponse> reg = (*client)->Register(RegisterRequest{0, true, c});
    ASSERT_TRUE(reg.ok()) << reg.status();
    ASSERT_TRUE(InitializeSlices(**client, 0, {{0, {0.f, 0.f, 0.f, 0.f}}}).ok());
    ASSERT_TRUE(PushSlices(**client, PushHeader{0, 0, 1, true, reg->session}, {{0, std::vector<float>(4, 1e-39f)}}).ok());
    PullRequest pull;
    pull.session = reg->session;
    pull.min_step = 1;
    absl::StatusOr<Pulled> r = PullSlices(**client, pull);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->header.step, 1);
    for (float v : r->slices[0]) EXPECT_EQ(v, 0.0f) << mode << ": a denormal update was applied";
    (*server)->Shutdown();
  }
}

// A stranger without the cluster token, or with another, is refused on every method before anything changes.
TEST(GrpcPsTest, CallsWithoutTheTokenAreRefusedAndChangeNothing) {
  const std::string token = "0123456789abcdef-cluster-secret";
  PsServerOptions so;
  so.listen_address = "127.0.0.1:0";
  so.ps.num_workers = 2;
  so.linger = absl::ZeroDuration();
  so.security.auth_token = token;
  absl::StatusOr<std::unique_ptr<PsServer>> server = PsServer::Start(so);
  ASSERT_TRUE(server.ok()) << server.status();
  GrpcClientOptions good_options;
  good_options.security.auth_token = token;
  absl::StatusOr<std::unique_ptr<PsInterface>> good = NewGrpcPsClient((*server)->address(), good_options);
  ASSERT_TRUE(good.ok());
  TrainConfig c = Config();
  c.num_workers = 2;
  c.slices = {SliceSpec{0, "w", 0, 4}};
  absl::StatusOr<RegisterResponse> reg = (*good)->Register(RegisterRequest{0, true, c});
  ASSERT_TRUE(reg.ok()) << reg.status();
  ASSERT_TRUE(InitializeSlices(**good, 0, {{0, {1.f, 2.f, 3.f, 4.f}}}).ok());

  for (const std::string& stranger_token : {std::string(), std::string("0123456789abcdef-wrong-secret!!")}) {
    GrpcClientOptions o;
    o.security.auth_token = stranger_token;
    o.retry_window = absl::ZeroDuration();
    absl::StatusOr<std::unique_ptr<PsInterface>> stranger = NewGrpcPsClient((*server)->address(), o);
    ASSERT_TRUE(stranger.ok());
    auto unauthenticated = [](const absl::Status& s) {
      return s.code() == absl::StatusCode::kUnauthenticated && absl::StrContains(s.message(), "token");
    };
    EXPECT_TRUE(unauthenticated((*stranger)->Register(RegisterRequest{1, true, c}).status()));
    EXPECT_TRUE(unauthenticated(InitializeSlices(**stranger, 0, {{0, {9.f, 9.f, 9.f, 9.f}}})));
    EXPECT_TRUE(unauthenticated(
        PushSlices(**stranger, PushHeader{0, 0, 7, true, reg->session}, {{0, {5.f, 5.f, 5.f, 5.f}}}).status()));
    EXPECT_TRUE(unauthenticated(PullSlices(**stranger, PullRequest{}).status()));
    EXPECT_TRUE(unauthenticated((*stranger)->Done(0, 1, true, 0)));
    EXPECT_TRUE(unauthenticated((*stranger)->Done(1, 1, true, 0)));
    EXPECT_TRUE(unauthenticated((*stranger)->Heartbeat(0, 1).status()));
    EXPECT_TRUE(unauthenticated((*stranger)->GetStats().status()));
  }
  // Nothing changed: step 0, the initial values, nobody done, no bytes received beyond the initialization.
  absl::StatusOr<TrainingStats> stats = (*good)->GetStats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->global_step, 0);
  EXPECT_FALSE(stats->workers[0].done);
  EXPECT_FALSE(stats->workers[1].done);
  EXPECT_EQ(stats->bytes_received, 16);
  PullRequest pull;
  pull.session = reg->session;
  absl::StatusOr<Pulled> values = PullSlices(**good, pull);
  ASSERT_TRUE(values.ok()) << values.status();
  EXPECT_EQ(values->slices[0], (std::vector<float>{1.f, 2.f, 3.f, 4.f}));
  (*server)->Shutdown();
}

// TLS with certificates made for this test: the right client trains; a client that does not speak TLS, one that
// trusts another CA, and one without a client certificate (the ps requires one) cannot reach it.
TEST(GrpcPsTest, MutualTls) {
  if (std::system("command -v openssl >/dev/null 2>&1") != 0) GTEST_SKIP() << "no openssl binary";
  const std::string dir = absl::StrCat(::testing::TempDir(), "dtrain_tls_", getpid());
  std::filesystem::create_directories(dir);
  const std::string script = absl::StrCat(
      "set -e; cd ", dir, "; ",
      "mk() { openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 -subj \"/CN=$1\" ",
      "-keyout $1.key -out $1.pem 2>/dev/null; }; ",
      "sign() { openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj \"/CN=$2\" -keyout $2.key ",
      "-out $2.csr 2>/dev/null; printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\\n' > $2.ext; ",
      "openssl x509 -req -in $2.csr -CA $1.pem -CAkey $1.key -CAcreateserial -days 1 -extfile $2.ext -out $2.pem ",
      "2>/dev/null; }; ",
      "mk ca; mk other_ca; sign ca server; sign ca worker");
  ASSERT_EQ(std::system(absl::StrCat("bash -c '", script, "'").c_str()), 0) << script;
  auto load = [&](const std::string& cert, const std::string& ca) {
    absl::StatusOr<SecurityOptions> o = LoadSecurityOptions(
        "", cert.empty() ? "" : absl::StrCat(dir, "/", cert, ".pem"), cert.empty() ? "" : absl::StrCat(dir, "/", cert, ".key"),
        ca.empty() ? "" : absl::StrCat(dir, "/", ca, ".pem"), "");
    EXPECT_TRUE(o.ok()) << o.status();
    return o.ok() ? *o : SecurityOptions{};
  };
  PsServerOptions so;
  so.listen_address = "127.0.0.1:0";
  so.ps.num_workers = 1;
  so.linger = absl::ZeroDuration();
  so.security = load("server", "ca");
  absl::StatusOr<std::unique_ptr<PsServer>> server = PsServer::Start(so);
  ASSERT_TRUE(server.ok()) << server.status();
  TrainConfig c = Config();
  c.slices = {SliceSpec{0, "w", 0, 4}};
  auto client = [&](const SecurityOptions& security) {
    GrpcClientOptions o;
    o.security = security;
    o.retry_window = absl::ZeroDuration();
    o.rpc_timeout = absl::Seconds(5);
    return *NewGrpcPsClient((*server)->address(), o);
  };
  std::unique_ptr<PsInterface> good = client(load("worker", "ca"));
  absl::StatusOr<RegisterResponse> reg = good->Register(RegisterRequest{0, true, c});
  ASSERT_TRUE(reg.ok()) << reg.status();
  ASSERT_TRUE(InitializeSlices(*good, 0, {{0, {1.f, 2.f, 3.f, 4.f}}}).ok());
  ASSERT_TRUE(PushSlices(*good, PushHeader{0, 0, 1, true, reg->session}, {{0, {2.f, 2.f, 2.f, 2.f}}}).ok());
  PullRequest pull;
  pull.session = reg->session;
  pull.min_step = 1;
  absl::StatusOr<Pulled> pulled = PullSlices(*good, pull);
  ASSERT_TRUE(pulled.ok()) << pulled.status();
  EXPECT_EQ(pulled->slices[0], (std::vector<float>{0.f, 1.f, 2.f, 3.f}));
  EXPECT_FALSE(client(SecurityOptions{})->GetStats().ok()) << "plain text reached a TLS server";
  EXPECT_FALSE(client(load("worker", "other_ca"))->GetStats().ok()) << "a client trusting another CA connected";
  EXPECT_FALSE(client(load("", "ca"))->GetStats().ok()) << "a client without a certificate connected";
  // Under TLS the data stays on gRPC: the ps offers no TCP lanes and says why; --transport=tcp is refused, auto
  // moves data over gRPC without asking for lanes.
  EXPECT_EQ((*server)->tcp_server(), nullptr);
  GrpcClientOptions tls;
  tls.security = load("worker", "ca");
  absl::StatusOr<tcp::TcpOffer> offer = NewGrpcTcpAttach((*server)->address(), tls)(tcp::TcpAttachRequest{0});
  EXPECT_EQ(offer.status().code(), absl::StatusCode::kFailedPrecondition) << offer.status();
  EXPECT_NE(offer.status().message().find("TLS"), std::string::npos) << offer.status();
  PsClientOptions tcp_only;
  tcp_only.transport = Transport::kTcp;
  tcp_only.grpc = tls;
  EXPECT_EQ(NewPsClient((*server)->address(), tcp_only).status().code(), absl::StatusCode::kInvalidArgument);
  tcp::TcpCounters counters;
  PsClientOptions automatic;
  automatic.grpc = tls;
  automatic.tcp_counters = &counters;
  absl::StatusOr<std::unique_ptr<PsInterface>> via_auto = NewPsClient((*server)->address(), automatic);
  ASSERT_TRUE(via_auto.ok()) << via_auto.status();
  pull.min_step = 1;
  absl::StatusOr<Pulled> again = PullSlices(**via_auto, pull);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(counters.attaches.load(), 0);
  (*server)->Shutdown();
  std::filesystem::remove_all(dir);
}

TEST(GrpcPsTest, SecurityFlagsAreChecked) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "dtrain_secflags_", getpid());
  std::filesystem::create_directories(dir);
  auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(absl::StrCat(dir, "/", name)) << text;
    return absl::StrCat(dir, "/", name);
  };
  EXPECT_EQ(LoadSecurityOptions(dir + "/missing", "", "", "", "").status().code(), absl::StatusCode::kInvalidArgument);
  absl::StatusOr<SecurityOptions> s = LoadSecurityOptions(write("short", "tooshort\n"), "", "", "", "");
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("at least 16"), std::string::npos) << s.status();
  s = LoadSecurityOptions(write("good", "  0123456789abcdef0123\n"), "", "", "", "");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->auth_token, "0123456789abcdef0123");
  s = LoadSecurityOptions("", write("cert.pem", "-----BEGIN CERTIFICATE-----\n"), "", "", "");
  EXPECT_NE(s.status().message().find("go together"), std::string::npos) << s.status();
  s = LoadSecurityOptions("", "", "", write("ca.pem", "not a certificate"), "");
  EXPECT_NE(s.status().message().find("not a PEM"), std::string::npos) << s.status();
  std::filesystem::remove_all(dir);
}

TEST(GrpcPsTest, ShutdownEndsAWaitingPullAtOnce) {
  absl::StatusOr<std::unique_ptr<PsServer>> server = StartServer(/*num_workers=*/2);
  ASSERT_TRUE(server.ok()) << server.status();
  absl::StatusOr<std::unique_ptr<PsInterface>> client = NewGrpcPsClient((*server)->address(), {});
  ASSERT_TRUE(client.ok());
  TrainConfig c = Config();
  c.num_workers = 2;
  c.slices = {SliceSpec{0, "w", 0, 4}};
  absl::StatusOr<RegisterResponse> reg = (*client)->Register(RegisterRequest{0, true, c});
  ASSERT_TRUE(reg.ok()) << reg.status();
  ASSERT_TRUE(InitializeSlices(**client, 0, {{0, {1.f, 2.f, 3.f, 4.f}}}).ok());
  PullRequest pull;
  pull.session = reg->session;
  pull.min_step = 1;  // never comes: worker 1 does not push
  pull.timeout_ms = 60000;
  std::future<absl::StatusOr<Pulled>> waiting = std::async(std::launch::async, [&] { return PullSlices(**client, pull); });
  EXPECT_EQ(waiting.wait_for(std::chrono::milliseconds(100)), std::future_status::timeout);
  const absl::Time start = absl::Now();
  (*server)->Shutdown();
  ASSERT_EQ(waiting.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  EXPECT_FALSE(waiting.get().ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

// A cluster of `num_ps` gRPC ps tasks on 127.0.0.1 and one worker's WorkerClient over them, counting the
// bytes of every message (WireCounters).
struct GrpcCluster {
  GrpcCluster(int num_ps, TrainConfig config, std::vector<VariableInfo> variables, WireDtype dtype,
              std::vector<InitialRows> initial_rows = {}, int channels = 1) {
    PlacementOptions po;
    po.pieces_per_task = channels;
    placement = *PlaceVariables(variables, num_ps, po);
    GrpcClientOptions co;
    co.counters = &counters;
    co.channels = channels;
    std::vector<PsInterface*> tasks;
    for (int t = 0; t < num_ps; ++t) {
      PsServerOptions so;
      so.listen_address = "127.0.0.1:0";
      so.ps.task_index = t;
      so.ps.num_ps = num_ps;
      so.ps.num_workers = config.num_workers;
      so.linger = absl::ZeroDuration();
      servers.push_back(*PsServer::Start(so));
      clients.push_back(*NewGrpcPsClient(servers.back()->address(), co));
      tasks.push_back(clients.back().get());
    }
    int64_t n = 0;
    for (const VariableInfo& v : variables) n += v.size;
    initial.assign(n, 0.5f);
    WorkerClientOptions wo;
    wo.wire_dtype = dtype;
    client = std::make_unique<WorkerClient>(tasks, placement.task_slices, 0, true, wo);
    connected = client->Connect(config, initial.data(), absl::Seconds(10), std::move(initial_rows));
  }
  WireCounters counters;
  Placement placement;
  std::vector<std::unique_ptr<PsServer>> servers;
  std::vector<std::unique_ptr<PsInterface>> clients;
  std::vector<float> initial;
  std::unique_ptr<WorkerClient> client;
  absl::Status connected;
};

// Every optimizer field and a push's gradient norm cross the wire: three steps on two gRPC ps tasks equal the
// optimizer applied here to the whole flat buffer with the clip factor of the global norm (a field lost on the
// way, or a factor from one task's part of the norm, would change the values); a worker whose config differs in
// one new field is refused by its name.
TEST(GrpcPsTest, OptimizerConfigAndGradientNormCrossTheWire) {
  OptimizerConfig rmsprop = *DefaultOptimizerConfig("pytorch_rmsprop");
  rmsprop.learning_rate = 0.01f;
  rmsprop.momentum = 0.5f;
  rmsprop.centered = true;
  rmsprop.rho = 0.95f;
  rmsprop.epsilon = 1e-4f;
  rmsprop.weight_decay = 0.01f;
  rmsprop.lr_schedule = "cosine";
  rmsprop.decay_steps = 4;
  rmsprop.min_learning_rate = 0.001f;
  rmsprop.warmup_steps = 1;
  rmsprop.warmup_start_factor = 0.5f;
  rmsprop.clip_norm = 1.0f;
  OptimizerConfig adagrad = *DefaultOptimizerConfig("adagrad");
  adagrad.learning_rate = 0.1f;
  adagrad.initial_accumulator = 0.3f;
  adagrad.clip_norm = 2.0f;
  adagrad.decay_steps = 2;
  adagrad.decay_rate = 0.5f;
  adagrad.staircase = true;
  OptimizerConfig nesterov = *DefaultOptimizerConfig("momentum");
  nesterov.learning_rate = 0.1f;
  nesterov.nesterov = true;
  nesterov.momentum = 0.8f;
  OptimizerConfig adam = *DefaultOptimizerConfig("adam");
  adam.beta1 = 0.8f;
  adam.beta2 = 0.99f;
  for (const OptimizerConfig& optimizer : {rmsprop, adagrad, nesterov, adam}) {
    SCOPED_TRACE(optimizer.name);
    TrainConfig config = Config();
    config.slices.clear();
    config.optimizer = optimizer;
    const std::vector<VariableInfo> variables = {{"a", 700}, {"b", 600}};
    GrpcCluster c(2, config, variables, WireDtype::kF32);
    ASSERT_TRUE(c.connected.ok()) << c.connected;
    ASSERT_EQ(c.placement.task_slices[1].size(), 1u) << "one variable on each task";
    const int64_t n = 1300;
    Optimizer opt = *Optimizer::Create(optimizer);
    std::vector<float> want = c.initial, params(n);
    std::vector<std::vector<float>> slots(3);
    for (int k = 0; k < opt.num_slots(); ++k) slots[k].assign(n, opt.SlotInitialValue(k));
    for (int64_t step = 0; step < 3; ++step) {
      std::vector<float> grad(n);
      double sum = 0;
      for (int64_t i = 0; i < n; ++i) {
        grad[i] = 0.01f * static_cast<float>((i * 7 + step) % 23) - 0.1f;
        sum += static_cast<double>(grad[i]) * grad[i];
      }
      ASSERT_GT(std::sqrt(sum), optimizer.clip_norm);  // clipping bites where it is on
      absl::StatusOr<PushResponse> pushed = c.client->Push(step, grad.data());
      ASSERT_TRUE(pushed.ok()) << pushed.status();
      float* s[3] = {slots[0].data(), slots[1].data(), slots[2].data()};
      opt.Apply(step, kernels::ClipFactor(optimizer.clip_norm, std::sqrt(sum)), grad.data(), want.data(), s, n);
      ASSERT_TRUE(c.client->Pull(step + 1, step, params.data()).ok());
      for (int64_t i = 0; i < n; ++i) ASSERT_NEAR(params[i], want[i], 1e-6f * (1 + std::fabs(want[i]))) << i;
    }
    // A config that differs in one field is refused, naming it (the field crossed the wire).
    TrainConfig other = config;
    other.optimizer.clip_norm += 1.0f;
    other.slices = c.placement.task_slices[0];
    absl::StatusOr<CheckpointProbe> refused = c.clients[0]->Probe(other);
    ASSERT_FALSE(refused.ok());
    EXPECT_NE(refused.status().message().find("optimizer.clip_norm"), std::string::npos) << refused.status();
    // The probe's answer crosses too: ps 0 relays every decision since step 0; ps 1, none before its step.
    for (int t = 0; t < 2; ++t) {
      TrainConfig same = config;
      same.slices = c.placement.task_slices[t];
      absl::StatusOr<CheckpointProbe> probed = c.clients[t]->Probe(same);
      ASSERT_TRUE(probed.ok()) << probed.status();
      EXPECT_TRUE(probed->configured && probed->initialized);
      EXPECT_EQ(probed->step, 3);
      EXPECT_EQ(probed->first_relayable_step, t == 0 ? 0 : 3);
    }
  }
}

TrainConfig SparseConfig(int64_t rows, int dim) {
  TrainConfig c;
  c.model_signature = "sparse/v1";
  c.mode = "sync";
  c.num_workers = 1;
  c.optimizer.name = "sgd";
  c.optimizer.learning_rate = 0.5f;
  SparseTableSpec t;
  t.name = "emb";
  t.dim = dim;
  t.rows = rows;
  t.init_scale = 0.25f;
  c.tables = {t};
  c.sparse_optimizer.name = "adagrad";
  return c;
}

// The target: a step moves bytes in proportion to the ids it touches, not to the table. A [1M, 16]
// table (64 MB) and 1000 dense floats on two ps tasks; each step pulls and pushes 300 unique ids.
// The counters (WireCounters) count message bytes: the serialized protobuf messages of every call, without gRPC's
// 5-byte message prefix, HTTP/2 frames and TCP/IP headers. Each wire type has its own formula: the payload a
// step must carry, ids x (dim x B x 2 + 8 x 2) + dense x B x 2 (B bytes a value, 4 / 2 / 2; rows pulled and row
// gradients pushed; each id sent with the pull request and with its gradient), which the messages cannot be below
// and exceed only by their fields' tags and lengths (measured: under 1% plus a few hundred bytes a step).
TEST(GrpcPsTest, BytesPerStepAreProportionalToTheUniqueIds) {
  constexpr int64_t kRows = 1'000'000, kDense = 1000, kIds = 300;
  constexpr int kDim = 16, kSteps = 5;
  double fp32_per_step = 0;
  for (WireDtype dtype : {WireDtype::kF32, WireDtype::kBF16, WireDtype::kF16}) {
    GrpcCluster c(2, SparseConfig(kRows, kDim), {{"dense", kDense}}, dtype);
    ASSERT_TRUE(c.connected.ok()) << c.connected;
    std::mt19937_64 gen(9);
    std::vector<float> params(kDense), grads(kDense, 0.01f), rows(kIds * kDim), row_grads(kIds * kDim, 0.1f);
    std::vector<int64_t> ids;
    auto next_ids = [&] {
      std::set<int64_t> unique;
      while (static_cast<int64_t>(unique.size()) < kIds) unique.insert(static_cast<int64_t>(gen() % kRows));
      ids.assign(unique.begin(), unique.end());
    };
    next_ids();
    ASSERT_TRUE(c.client->Pull(0, 0, params.data(), {{0, ids.data(), kIds, rows.data()}}).ok());
    const int64_t sent0 = c.counters.sent, received0 = c.counters.received;
    for (int s = 0; s < kSteps; ++s) {
      ASSERT_TRUE(c.client->Push(s, grads.data(), {{0, ids.data(), kIds, row_grads.data()}}).ok());
      next_ids();
      ASSERT_TRUE(c.client->Pull(s + 1, s, params.data(), {{0, ids.data(), kIds, rows.data()}}).ok());
    }
    const double per_step = static_cast<double>(c.counters.sent - sent0 + c.counters.received - received0) / kSteps;
    const double b = DtypeBytes(dtype);
    const double payload = kIds * (kDim * b * 2 + 8 * 2) + kDense * b * 2;
    if (dtype == WireDtype::kF32) fp32_per_step = per_step;
    std::printf("%s: %.0f message bytes per step, %.4f x the payload ids x (dim x %g x 2 + 16) + dense x %g x 2 = "
                "%.0f (%.3f x fp32's bytes); the table is %.0f bytes\n",
                std::string(DtypeName(dtype)).c_str(), per_step, per_step / payload, b, b, payload,
                per_step / fp32_per_step, kRows * kDim * 4.0);
    EXPECT_GE(per_step, payload) << DtypeName(dtype);
    EXPECT_LE(per_step, 1.01 * payload + 512) << DtypeName(dtype);
    if (dtype != WireDtype::kF32) {
      // Half the value bytes, the same ids: (300 x (64 + 16) + 4000) / (300 x (128 + 16) + 8000) = 0.547.
      EXPECT_LE(per_step, 0.56 * fp32_per_step) << DtypeName(dtype);
      EXPECT_GE(per_step, 0.53 * fp32_per_step) << DtypeName(dtype);
    }
    int64_t lookups = 0;
    for (auto& t : c.clients) lookups += t->GetStats()->tables[0].lookups;
    EXPECT_EQ(lookups, (kSteps + 1) * kIds);
  }
}

TEST(GrpcPsTest, SparseRowsCrossTheWireInNarrowTypes) {
  GrpcCluster c(2, SparseConfig(0, 5), {{"dense", 3}}, WireDtype::kBF16);
  ASSERT_TRUE(c.connected.ok()) << c.connected;
  const SparseTableSpec table = SparseConfig(0, 5).tables[0];
  std::vector<int64_t> ids(2000);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>(i * 7919) - 5000;  // chunks of both tasks
  std::vector<float> params(3), rows(ids.size() * 5), row_grads(ids.size() * 5, 1.0f), grads(3, 0.0f);
  ASSERT_TRUE(c.client->Pull(0, 0, params.data(), {{0, ids.data(), 2000, rows.data()}}).ok());
  std::vector<float> initial(5);
  for (size_t i = 0; i < ids.size(); ++i) {
    SparseInitialRow(table, ids[i], initial.data());
    for (int k = 0; k < 5; ++k) ASSERT_EQ(rows[i * 5 + k], RoundTrip(WireDtype::kBF16, initial[k])) << ids[i];
  }
  ASSERT_TRUE(c.client->Push(0, grads.data(), {{0, ids.data(), 2000, row_grads.data()}}).ok());
  ASSERT_TRUE(c.client->Pull(1, 0, params.data(), {{0, ids.data(), 2000, rows.data()}}).ok());
  // adagrad (lr 0.01, accumulator 0.1 + 1): each row moved by -0.01 / sqrt(1.1).
  for (size_t i = 0; i < ids.size(); i += 97) {
    SparseInitialRow(table, ids[i], initial.data());
    for (int k = 0; k < 5; ++k) {
      EXPECT_EQ(rows[i * 5 + k], RoundTrip(WireDtype::kBF16, initial[k] - 0.01f / std::sqrt(1.1f))) << ids[i];
    }
  }
  TrainingStats stats = *c.clients[1]->GetStats();
  ASSERT_EQ(stats.tables.size(), 1u);
  EXPECT_EQ(stats.tables[0].name, "emb");
  EXPECT_GT(stats.tables[0].rows, 500);
  EXPECT_EQ(stats.tables[0].updates, stats.tables[0].rows);
  // The config with its tables crossed the wire: another worker's mismatch is refused.
  TrainConfig other = SparseConfig(0, 5);
  other.tables[0].admit_after = 3;
  other.slices = c.placement.task_slices[0];
  absl::StatusOr<RegisterResponse> refused = c.clients[0]->Register(RegisterRequest{0, false, other});
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "tables[0] mismatch")) << refused.status();
}

// A table with initial values: the chief's Initialize streams each task its rows (10 MB, chunked below gRPC's
// limit), and they read back exactly.
TEST(GrpcPsTest, InitialRowsCrossTheWireWithInitialize) {
  constexpr int64_t kRows = 300'000;
  constexpr int kDim = 8;
  TrainConfig config = SparseConfig(kRows, kDim);
  config.tables[0].initial_values = true;
  auto values = std::make_shared<std::vector<float>>(kRows * kDim);
  for (size_t i = 0; i < values->size(); ++i) (*values)[i] = static_cast<float>(i % 1009) * 0.25f - 100.0f;
  GrpcCluster c(2, config, {{"dense", 3}}, WireDtype::kF32, {InitialRows{0, values}});
  ASSERT_TRUE(c.connected.ok()) << c.connected;
  std::vector<int64_t> ids(kRows);
  std::iota(ids.begin(), ids.end(), 0);
  std::vector<float> params(3), rows(kRows * kDim);
  ASSERT_TRUE(c.client->Pull(0, 0, params.data(), {{0, ids.data(), kRows, rows.data()}}).ok());
  EXPECT_TRUE(rows == *values);
  EXPECT_EQ(c.clients[0]->GetStats()->tables[0].rows + c.clients[1]->GetStats()->tables[0].rows, kRows);
  // The flag crossed the wire with the config: a worker without it is refused.
  TrainConfig other = SparseConfig(kRows, kDim);
  other.slices = c.placement.task_slices[0];
  absl::StatusOr<RegisterResponse> refused = c.clients[0]->Register(RegisterRequest{0, false, other});
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "initial values}, worker 0 has")) << refused.status();
}

// --channels_per_ps: pushes and pulls striped by slice over 3 connections to each of 2 tasks train exactly as
// one connection does (dense slices cut finer, and sparse rows), and a bad count is refused by its flag's name.
TEST(GrpcPsTest, StripedOverThreeConnectionsTrainsAsOne) {
  constexpr int kDim = 4, kDense = 500'000;  // 2 MB: cut into 6 slices with 3 pieces per task
  constexpr int kSteps = 4;
  std::vector<std::vector<float>> results;
  for (int channels : {1, 3}) {
    SCOPED_TRACE(channels);
    GrpcCluster c(2, SparseConfig(1000, kDim), {{"dense", kDense}, {"bias", 7}}, WireDtype::kF32, {}, channels);
    ASSERT_TRUE(c.connected.ok()) << c.connected;
    EXPECT_EQ(c.placement.slices.size(), channels == 1 ? 3u : 7u);
    std::vector<float> params(kDense + 7), grads(kDense + 7), rows(6 * kDim), row_grads(6 * kDim);
    const std::vector<int64_t> ids = {3, 999, 4, 17, 500, 8};
    for (int step = 0; step < kSteps; ++step) {
      for (size_t i = 0; i < grads.size(); ++i) grads[i] = 0.001f * static_cast<float>((i * 13 + step) % 97) - 0.04f;
      for (size_t i = 0; i < row_grads.size(); ++i) row_grads[i] = 0.01f * static_cast<float>((i + step) % 11) - 0.05f;
      ASSERT_TRUE(c.client->SetSparsePull({{0, ids.data(), static_cast<int64_t>(ids.size()), rows.data()}}).ok());
      ASSERT_TRUE(c.client->Pull(step, 0, params.data()).ok());
      absl::StatusOr<PushResponse> pushed =
          c.client->Push(step, grads.data(), {{0, ids.data(), static_cast<int64_t>(ids.size()), row_grads.data()}});
      ASSERT_TRUE(pushed.ok()) << pushed.status();
    }
    ASSERT_TRUE(c.client->SetSparsePull({{0, ids.data(), static_cast<int64_t>(ids.size()), rows.data()}}).ok());
    absl::StatusOr<PullResult> last = c.client->Pull(kSteps, 0, params.data());
    ASSERT_TRUE(last.ok()) << last.status();
    EXPECT_EQ(last->step, kSteps);
    params.insert(params.end(), rows.begin(), rows.end());
    results.push_back(params);
    // Both ps tasks applied every step once.
    for (int t = 0; t < 2; ++t) EXPECT_EQ(c.servers[t]->parameter_server()->step(), kSteps) << "task " << t;
  }
  ASSERT_EQ(results[0].size(), results[1].size());
  EXPECT_TRUE(results[0] == results[1]) << "striping changed the values";
  EXPECT_NE(results[0][0], 0.5f) << "trained";
  GrpcClientOptions bad;
  bad.channels = 0;
  absl::StatusOr<std::unique_ptr<PsInterface>> refused = NewGrpcPsClient("127.0.0.1:1", bad);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("--channels_per_ps"), std::string::npos) << refused.status();
}

}  // namespace
}  // namespace dtrain::ps
