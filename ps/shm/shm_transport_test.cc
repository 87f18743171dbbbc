// The shared-memory data plane end to end in one process: ParameterServers behind ShmServers, WorkerClients over
// shm clients. Steps over shared memory equal the in-process ps's bit for bit (dense and sparse; bf16 rounds as
// on gRPC), the worker's buffers are read and written in place, a process without a ticket cannot attach, an
// upload cut off mid-way is never applied, the fallbacks to the control plane, and no segment outlives its
// users.
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "ps/client/worker_client.h"
#include "ps/shm/shm_frame.h"
#include "ps/shm/shm_lane.h"
#include "ps/shm/shm_ps_client.h"
#include "ps/shm/shm_segment.h"
#include "ps/shm/shm_server.h"
#include "ps/testing/fault_injecting_ps.h"
#include "ps/testing/ps_test_util.h"

namespace dtrain::ps::shm {
namespace {

using ::dtrain::ps::testing::MakeConfig;
using ::dtrain::ps::testing::SimCluster;
using ::dtrain::ps::testing::SimClusterOptions;
using ::dtrain::ps::testing::SimWorker;
using ::dtrain::ps::testing::TestGradient;

SimClusterOptions Options(int num_ps, bool sparse) {
  SimClusterOptions o;
  o.variables = {{"w1", 70000}, {"b1", 100}, {"w2", 300000}, {"b2", 10}};
  o.num_ps = num_ps;
  o.config = MakeConfig("sync", 1, 1, 0.5f);
  if (sparse) {
    SparseTableSpec t;
    t.table = 0;
    t.name = "emb";
    t.dim = 8;
    o.config.tables.push_back(t);
    o.config.sparse_optimizer.name = "adagrad";
  }
  const int64_t n = 70000 + 100 + 300000 + 10;
  o.initial.resize(n);
  for (int64_t i = 0; i < n; ++i) o.initial[i] = std::sin(0.001f * static_cast<float>(i));
  return o;
}

// A flat float buffer in shared memory (what the towers allocate when --transport is auto or shm).
struct SharedBuffer {
  explicit SharedBuffer(int64_t n) : n(n) {
    absl::StatusOr<float*> p = SharedHostMemory::Default()->Allocate(n);
    data = p.ok() ? *p : nullptr;
  }
  ~SharedBuffer() { SharedHostMemory::Default()->Free(data); }
  float* data = nullptr;
  int64_t n = 0;
};

// The shm side of a cluster: a ShmServer per task of `cluster` and a WorkerClient through shm clients.
struct ShmSide {
  ShmSide(SimCluster* cluster, int worker, WireDtype wire, ShmServerOptions server_options = {},
          std::function<absl::Status(int)> attach_error = nullptr, bool required = false) {
    for (int t = 0; t < cluster->num_ps(); ++t) {
      ShmServerOptions so = server_options;
      so.task_index = t;
      servers.push_back(*ShmServer::Start(&cluster->task(t), so));
      controls.push_back(std::make_unique<FaultInjectingPs>(&cluster->task(t), FaultInjectingPs::Faults{}));
      ShmClientOptions co;
      co.counters = &counters;
      co.task = t;
      co.address = "in-process";
      co.required = required;
      ShmServer* server = servers.back().get();
      ShmAttachFn attach = [server, attach_error, t](const ShmAttachRequest& r) -> absl::StatusOr<ShmOffer> {
        if (attach_error != nullptr) {
          absl::Status s = attach_error(t);
          if (!s.ok()) return s;
        }
        return server->Offer(r);
      };
      clients.push_back(NewShmPsClient(std::make_unique<FaultInjectingPs>(&cluster->task(t), FaultInjectingPs::Faults{}),
                                       attach, co));
      tasks.push_back(clients.back().get());
    }
    WorkerClientOptions wo;
    wo.wire_dtype = wire;
    wo.step_timeout = absl::Seconds(20);
    client = std::make_unique<WorkerClient>(tasks, cluster->placement().task_slices, worker, worker == 0, wo);
    connected = client->Connect(cluster->config(), cluster->initial().data(), absl::Seconds(10));
  }
  std::vector<std::unique_ptr<ShmServer>> servers;
  std::vector<std::unique_ptr<PsInterface>> controls;
  std::vector<std::unique_ptr<PsInterface>> clients;
  std::vector<PsInterface*> tasks;
  ShmCounters counters;
  std::unique_ptr<WorkerClient> client;
  absl::Status connected;
};

// An in-process reference cluster and an shm one of `num_ps` tasks, each with worker 0, for bit-for-bit steps.
struct AgainstInProcess {
  explicit AgainstInProcess(int num_ps)
      : ref(SimCluster::Start(Options(num_ps, false)).value()),
        shm_cluster(SimCluster::Start(Options(num_ps, false)).value()),
        worker(ref.get(), 0),
        side(shm_cluster.get(), 0, WireDtype::kF32),
        n(ref->total_floats()),
        params(n),
        grads(n) {}
  std::unique_ptr<SimCluster> ref, shm_cluster;
  SimWorker worker;
  ShmSide side;
  const int64_t n;
  SharedBuffer params, grads;
};

TEST(ShmTransportTest, SyncStepsEqualInProcessBitForBitInPlace) {
  for (int num_ps : {1, 2}) {
    SCOPED_TRACE(absl::StrCat(num_ps, " ps"));
    AgainstInProcess c(num_ps);
    ASSERT_TRUE(c.side.connected.ok()) << c.side.connected;
    std::vector<float> expected;
    for (int64_t s = 0; s < 6; ++s) {
      ASSERT_TRUE(c.worker.Pull(s, std::max<int64_t>(0, s - 1), &expected).ok());
      absl::StatusOr<PullResult> pulled = c.side.client->Pull(s, std::max<int64_t>(0, s - 1), c.params.data);
      ASSERT_TRUE(pulled.ok()) << pulled.status();
      ASSERT_EQ(pulled->step, s);
      ASSERT_EQ(0, std::memcmp(expected.data(), c.params.data, c.n * 4)) << "step " << s;
      const std::vector<float> g = TestGradient(0, s, expected);
      ASSERT_TRUE(c.worker.Push(s, g).ok());
      std::copy(g.begin(), g.end(), c.grads.data);
      ASSERT_TRUE(c.side.client->Push(s, c.grads.data).ok());
    }
    // Every byte moved in place: nothing staged, nothing on the control plane.
    EXPECT_EQ(c.side.counters.bytes_staged.load(), 0);
    EXPECT_GE(c.side.counters.bytes_in_place.load(), 12 * c.n * 4);
    EXPECT_EQ(c.side.counters.shm_pushes.load(), 6 * num_ps);
    EXPECT_EQ(c.side.counters.control_pushes.load(), 0);
    EXPECT_EQ(c.side.counters.control_pulls.load(), 0);
    EXPECT_EQ(c.side.counters.attaches.load(), num_ps);
  }
  EXPECT_EQ(CountSegments(getpid()), 0);
}

// A step as a worker runs it: the commit only sent, the pull right behind it, the commit's answer read after
// the pull (WorkerClient over SliceUpload::StartFinish). The same values as in process, bit for bit.
TEST(ShmTransportTest, StepsWithThePullRightBehindTheCommitEqualInProcess) {
  for (int num_ps : {1, 2}) {
    SCOPED_TRACE(absl::StrCat(num_ps, " ps"));
    AgainstInProcess c(num_ps);
    ASSERT_TRUE(c.side.connected.ok()) << c.side.connected;
    std::vector<float> expected;
    ASSERT_TRUE(c.worker.Pull(0, 0, &expected).ok());
    ASSERT_TRUE(c.side.client->Pull(0, 0, c.params.data).ok());
    for (int64_t s = 0; s < 6; ++s) {
      const std::vector<float> g = TestGradient(0, s, expected);
      ASSERT_TRUE(c.worker.Push(s, g).ok());
      ASSERT_TRUE(c.worker.Pull(s + 1, s, &expected).ok());
      std::copy(g.begin(), g.end(), c.grads.data);
      ASSERT_TRUE(c.side.client->BeginPush(s, c.grads.data).ok());
      c.side.client->PushRange(0, c.n);
      c.side.client->FinishPush();
      c.side.client->StartPull(s + 1, s, c.params.data);
      absl::StatusOr<PullResult> pulled = c.side.client->FinishPull();
      ASSERT_TRUE(pulled.ok()) << pulled.status();
      EXPECT_EQ(pulled->step, s + 1);
      absl::StatusOr<PushResponse> pushed = c.side.client->WaitPush();
      ASSERT_TRUE(pushed.ok()) << pushed.status();
      EXPECT_EQ(pushed->global_step, s + 1);
      ASSERT_EQ(0, std::memcmp(expected.data(), c.params.data, c.n * 4)) << "step " << s;
    }
    EXPECT_EQ(c.side.counters.shm_pushes.load(), 6 * num_ps);
    EXPECT_EQ(c.side.counters.shm_pulls.load(), 7 * num_ps);
    EXPECT_EQ(c.side.counters.control_pushes.load(), 0);
    EXPECT_EQ(c.side.counters.control_pulls.load(), 0);
  }
  EXPECT_EQ(CountSegments(getpid()), 0);
}

// An upload whose end was sent (StartFinish) and then dropped unread reads its answer as it goes: the next
// upload on the lane gets its own answer, not that one.
TEST(ShmTransportTest, AnAnswerLeftUnreadIsNotTakenForTheNextUploads) {
  auto cluster = SimCluster::Start(Options(1, false));
  ASSERT_TRUE(cluster.ok());
  ShmSide side(cluster->get(), 0, WireDtype::kF32);
  ASSERT_TRUE(side.connected.ok()) << side.connected;
  const int64_t n = (*cluster)->total_floats();
  SharedBuffer params(n), grads(n);
  ASSERT_TRUE(side.client->Pull(0, 0, params.data).ok());
  const uint64_t session = (*cluster)->Session(0, 0);
  const int64_t step = (*cluster)->task(0).step();
  auto start = [&](int64_t at, uint64_t id) -> absl::StatusOr<std::unique_ptr<SliceUpload>> {
    PushHeader h;
    h.worker_id = 0;
    h.step = at;
    h.request_id = id;
    h.commit = true;
    h.session = session;
    absl::StatusOr<std::unique_ptr<SliceUpload>> up = side.tasks[0]->StartPush(h);
    if (up.ok()) {
      absl::Status s = WriteSlices(up->get(), grads.data, (*cluster)->placement().task_slices[0]);
      if (!s.ok()) return s;
    }
    return up;
  };
  {
    absl::StatusOr<std::unique_ptr<SliceUpload>> up = start(step, uint64_t{1} << 40);
    ASSERT_TRUE(up.ok()) << up.status();
    ASSERT_TRUE((*up)->StartFinish());
  }  // dropped with its answer unread
  for (int k = 1; k <= 2; ++k) {
    absl::StatusOr<std::unique_ptr<SliceUpload>> up = start(step + k, (uint64_t{1} << 40) + k);
    ASSERT_TRUE(up.ok()) << up.status();
    absl::StatusOr<PushResponse> r = (*up)->Finish();
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->global_step, step + k + 1) << "push " << k << " read another push's answer";
  }
  EXPECT_EQ((*cluster)->task(0).step(), step + 3);
}

TEST(ShmTransportTest, Bf16PullsAreRoundedAsOnTheWire) {
  auto cluster = SimCluster::Start(Options(1, false));
  ASSERT_TRUE(cluster.ok());
  ShmSide side(cluster->get(), 0, WireDtype::kBF16);
  ASSERT_TRUE(side.connected.ok()) << side.connected;
  const int64_t n = (*cluster)->total_floats();
  SharedBuffer params(n), grads(n);
  for (int64_t s = 0; s < 3; ++s) {
    ASSERT_TRUE(side.client->Pull(s, std::max<int64_t>(0, s - 1), params.data).ok());
    // The ps's own fp32 values, rounded once: what a bf16 pull over gRPC delivers.
    absl::StatusOr<CheckpointData> truth = (*cluster)->task(0).ExportState();
    ASSERT_TRUE(truth.ok()) << truth.status();
    int64_t checked = 0;
    for (const SliceState& slice : truth->slices) {
      for (int64_t i = 0; i < slice.spec.length; ++i, ++checked) {
        ASSERT_EQ(params.data[slice.spec.flat_offset + i], RoundTrip(WireDtype::kBF16, slice.values[i]))
            << slice.spec.variable << "[" << i << "]";
      }
    }
    ASSERT_EQ(checked, n);
    std::vector<float> p(params.data, params.data + n);
    const std::vector<float> g = TestGradient(0, s, p);
    std::copy(g.begin(), g.end(), grads.data);
    ASSERT_TRUE(side.client->Push(s, grads.data).ok());
  }
  EXPECT_GT(side.counters.bytes_staged.load(), 0);  // narrow values go through staging
}

TEST(ShmTransportTest, SparseRowsEqualInProcess) {
  auto ref = SimCluster::Start(Options(2, true));
  auto shm_cluster = SimCluster::Start(Options(2, true));
  ASSERT_TRUE(ref.ok() && shm_cluster.ok());
  SimWorker worker(ref->get(), 0);
  ShmSide side(shm_cluster->get(), 0, WireDtype::kF32);
  ASSERT_TRUE(side.connected.ok()) << side.connected;
  const int64_t n = (*ref)->total_floats();
  SharedBuffer params(n), grads(n);
  std::vector<float> ref_params(n), ref_grads(n);
  for (int64_t s = 0; s < 4; ++s) {
    std::vector<int64_t> ids;
    for (int64_t k = 0; k < 300; ++k) ids.push_back(k * 7919 + s * 13);  // new and known ids every step
    std::vector<float> ref_rows(ids.size() * 8), rows(ids.size() * 8);
    absl::StatusOr<PullResult> a = worker.client().Pull(
        s, std::max<int64_t>(0, s - 1), ref_params.data(), {{0, ids.data(), static_cast<int64_t>(ids.size()), ref_rows.data()}});
    absl::StatusOr<PullResult> b = side.client->Pull(
        s, std::max<int64_t>(0, s - 1), params.data, {{0, ids.data(), static_cast<int64_t>(ids.size()), rows.data()}});
    ASSERT_TRUE(a.ok() && b.ok()) << a.status() << " " << b.status();
    ASSERT_EQ(0, std::memcmp(ref_params.data(), params.data, n * 4));
    ASSERT_EQ(ref_rows, rows);
    std::vector<float> row_grads(rows.size());
    for (size_t i = 0; i < row_grads.size(); ++i) row_grads[i] = 0.01f * std::cos(rows[i] + static_cast<float>(i + s));
    const std::vector<float> g = TestGradient(0, s, ref_params);
    std::copy(g.begin(), g.end(), grads.data);
    const std::vector<SparseGradients> sg = {{0, ids.data(), static_cast<int64_t>(ids.size()), row_grads.data()}};
    ASSERT_TRUE(worker.client().Push(s, g.data(), sg).ok());
    ASSERT_TRUE(side.client->Push(s, grads.data, sg).ok());
  }
  EXPECT_GT(side.counters.bytes_staged.load(), 0);  // rows travel through staging
  EXPECT_EQ(side.counters.control_pushes.load(), 0);
}

// A pull's ids lie in the worker's memory: the server refuses a count past its limit before it copies them.
TEST(ShmTransportTest, APullPastMaxPullRowsIsRefusedBeforeItsIdsAreCopied) {
  auto cluster = SimCluster::Start(Options(1, true));
  ASSERT_TRUE(cluster.ok());
  ShmServerOptions so;
  so.max_pull_rows = 10;  // the ParameterServer's own limit stays at its default: this refusal is the server's
  ShmSide side(cluster->get(), 0, WireDtype::kF32, so);
  ASSERT_TRUE(side.connected.ok()) << side.connected;
  SharedBuffer params((*cluster)->total_floats());
  std::vector<int64_t> ids(300);
  for (size_t k = 0; k < ids.size(); ++k) ids[k] = static_cast<int64_t>(k);
  std::vector<float> rows(ids.size() * 8);
  absl::StatusOr<PullResult> r =
      side.client->Pull(0, 0, params.data, {{0, ids.data(), static_cast<int64_t>(ids.size()), rows.data()}});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status();
  EXPECT_TRUE(absl::StrContains(r.status().message(), "more than 10: refused (--max_pull_rows)")) << r.status();
  ids.resize(10);
  EXPECT_TRUE(side.client->Pull(0, 0, params.data, {{0, ids.data(), 10, rows.data()}}).ok());
}

TEST(ShmTransportTest, AProcessWithoutATicketCannotAttach) {
  auto cluster = SimCluster::Start(Options(1, false));
  ASSERT_TRUE(cluster.ok());
  ShmServerOptions so;
  so.hello_timeout = absl::Milliseconds(300);
  absl::StatusOr<std::unique_ptr<ShmServer>> server = ShmServer::Start(&(*cluster)->task(0), so);
  ASSERT_TRUE(server.ok());
  // A made-up ticket: refused with a reason, and the lane closed.
  {
    absl::StatusOr<std::unique_ptr<Lane>> lane = Lane::Connect((*server)->socket_name());
    ASSERT_TRUE(lane.ok()) << lane.status();
    ASSERT_TRUE((*lane)->Send(FrameType::kHello, EncodeHello(Hello{LaneKind::kPush, 0, "0123456789abcdef"})).ok());
    absl::StatusOr<Frame> welcome = (*lane)->Receive(absl::Now() + absl::Seconds(5));
    ASSERT_TRUE(welcome.ok()) << welcome.status();
    absl::StatusOr<PushResult> w = DecodePushResult(welcome->payload);
    ASSERT_TRUE(w.ok());
    EXPECT_EQ(w->status.code(), absl::StatusCode::kPermissionDenied) << w->status;
    // A segment sent anyway is never read: the ps has closed the lane.
    absl::StatusOr<Frame> next = (*lane)->Receive(absl::Now() + absl::Seconds(5));
    EXPECT_EQ(next.status().code(), absl::StatusCode::kUnavailable);
  }
  // Silence: closed after the hello timeout.
  {
    absl::StatusOr<std::unique_ptr<Lane>> lane = Lane::Connect((*server)->socket_name());
    ASSERT_TRUE(lane.ok());
    absl::StatusOr<Frame> welcome = (*lane)->Receive(absl::Now() + absl::Seconds(5));
    ASSERT_TRUE(welcome.ok());
    EXPECT_FALSE(DecodePushResult(welcome->payload)->status.ok());
  }
  // A ticket is single use: a second lane presenting the same one is refused.
  const uint64_t session = (*cluster)->Session(0, 0);
  absl::StatusOr<ShmOffer> offer =
      (*server)->Offer(ShmAttachRequest{0, HostBootId(), static_cast<uint32_t>(geteuid()), session});
  ASSERT_TRUE(offer.ok()) << offer.status();
  for (int attempt = 0; attempt < 2; ++attempt) {
    absl::StatusOr<std::unique_ptr<Lane>> lane = Lane::Connect((*server)->socket_name());
    ASSERT_TRUE(lane.ok());
    ASSERT_TRUE((*lane)->Send(FrameType::kHello, EncodeHello(Hello{LaneKind::kPush, 0, offer->push_ticket})).ok());
    absl::StatusOr<Frame> welcome = (*lane)->Receive(absl::Now() + absl::Seconds(5));
    ASSERT_TRUE(welcome.ok());
    EXPECT_EQ(DecodePushResult(welcome->payload)->status.ok(), attempt == 0);
  }
  // Offers are for this host and user only.
  EXPECT_EQ(
      (*server)->Offer(ShmAttachRequest{0, "another-host", static_cast<uint32_t>(geteuid()), session}).status().code(),
      absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ((*server)->Offer(ShmAttachRequest{0, HostBootId(), geteuid() + 1, session}).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ((*server)->counters().lanes_refused, 3);
}

// An offer ends the worker's attachment in place, so only the process registered as that worker gets one: a caller
// with the token but another session (a stranger, or a worker of an older registration) is refused, and the live
// attachment goes on: the worker's next steps still travel through shared memory, without attaching again.
// The server's byte counts: the pushes' floats exactly, the pulls' at least, each attachment counting on its own
// and its counts kept (not lost, not counted twice) once it has ended.
TEST(ShmTransportTest, TheServerCountsTheBytesOfEveryAttachmentAlsoAfterItEnded) {
  AgainstInProcess c(1);
  ASSERT_TRUE(c.side.connected.ok()) << c.side.connected;
  std::vector<float> expected;
  for (int64_t s = 0; s < 3; ++s) {
    ASSERT_TRUE(c.worker.Pull(s, std::max<int64_t>(0, s - 1), &expected).ok());
    ASSERT_TRUE(c.side.client->Pull(s, std::max<int64_t>(0, s - 1), c.params.data).ok());
    const std::vector<float> g = TestGradient(0, s, expected);
    ASSERT_TRUE(c.worker.Push(s, g).ok());
    std::copy(g.begin(), g.end(), c.grads.data);
    ASSERT_TRUE(c.side.client->Push(s, c.grads.data).ok());
  }
  const ShmServerCounters during = c.side.servers[0]->counters();
  EXPECT_EQ(during.bytes_received, 3 * c.n * 4);
  EXPECT_GE(during.bytes_sent, 3 * c.n * 4);
  EXPECT_EQ(during.bytes_sent, c.side.servers[0]->counters().bytes_sent);  // asking again changes nothing
  // The worker goes: its lanes close, the attachment ends, and what it moved stays counted.
  c.side.client.reset();
  c.side.clients.clear();
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  while (c.side.servers[0]->counters().active_attachments > 0 && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_EQ(c.side.servers[0]->counters().active_attachments, 0);
  EXPECT_EQ(c.side.servers[0]->counters().bytes_received, during.bytes_received);
  EXPECT_EQ(c.side.servers[0]->counters().bytes_sent, during.bytes_sent);
  // An offer for it again (a worker attaching anew) drops the ended attachment, whose counts go into the totals
  // once: the sums neither fall nor double, however often they are asked for.
  ASSERT_TRUE(c.side.servers[0]
                  ->Offer(ShmAttachRequest{0, HostBootId(), static_cast<uint32_t>(geteuid()),
                                           c.shm_cluster->Session(0, 0)})
                  .ok());
  for (int i = 0; i < 2; ++i) {
    const ShmServerCounters after = c.side.servers[0]->counters();
    EXPECT_EQ(after.bytes_received, during.bytes_received);
    EXPECT_EQ(after.bytes_sent, during.bytes_sent);
  }
}

TEST(ShmTransportTest, AnOfferWithoutTheWorkersSessionLeavesItsAttachmentAlone) {
  AgainstInProcess c(1);
  ASSERT_TRUE(c.side.connected.ok()) << c.side.connected;
  std::vector<float> expected;
  auto step = [&](int64_t s) {
    ASSERT_TRUE(c.worker.Pull(s, std::max<int64_t>(0, s - 1), &expected).ok());
    absl::StatusOr<PullResult> pulled = c.side.client->Pull(s, std::max<int64_t>(0, s - 1), c.params.data);
    ASSERT_TRUE(pulled.ok()) << pulled.status();
    ASSERT_EQ(0, std::memcmp(expected.data(), c.params.data, c.n * 4));
    const std::vector<float> g = TestGradient(0, s, expected);
    std::copy(g.begin(), g.end(), c.grads.data);
    ASSERT_TRUE(c.worker.Push(s, g).ok());
    ASSERT_TRUE(c.side.client->Push(s, c.grads.data).ok());
  };
  step(0);
  const int64_t attaches = c.side.counters.attaches.load();
  ASSERT_EQ(c.side.servers[0]->counters().active_attachments, 1);
  // (Sessions are random 64-bit numbers: none of these is the worker's.)
  for (uint64_t wrong : {uint64_t{0}, uint64_t{1}, uint64_t{0x5eed5eed5eed5eed}, ~uint64_t{0}}) {
    absl::StatusOr<ShmOffer> offer =
        c.side.servers[0]->Offer(ShmAttachRequest{0, HostBootId(), static_cast<uint32_t>(geteuid()), wrong});
    EXPECT_EQ(offer.status().code(), absl::StatusCode::kPermissionDenied) << offer.status();
  }
  EXPECT_EQ(c.side.servers[0]->counters().active_attachments, 1);
  for (int64_t s = 1; s < 3; ++s) step(s);
  EXPECT_EQ(c.side.counters.attaches.load(), attaches);  // the same attachment all along
  EXPECT_EQ(c.side.counters.control_pushes.load(), 0);
}

// A worker whose session the ps no longer knows (here another process registered as it, and the offer that
// process asked for ended this one's attachment) is not offered shared memory again: its next call goes through
// the control plane once and gets the ps's own answer, not a transport error to retry.
TEST(ShmTransportTest, AWorkerWhoseSessionIsGoneHearsThePsNotATransportError) {
  AgainstInProcess c(1);
  ASSERT_TRUE(c.side.connected.ok()) << c.side.connected;
  ASSERT_TRUE(c.side.client->Pull(0, 0, c.params.data).ok());
  const uint64_t newer = c.shm_cluster->Session(0, 0);  // another process registers as worker 0
  ASSERT_TRUE(
      c.side.servers[0]->Offer(ShmAttachRequest{0, HostBootId(), static_cast<uint32_t>(geteuid()), newer}).ok());
  std::fill(c.grads.data, c.grads.data + c.n, 0.01f);
  absl::StatusOr<PushResponse> pushed = c.side.client->Push(0, c.grads.data);
  EXPECT_EQ(pushed.status().code(), absl::StatusCode::kPermissionDenied) << pushed.status();
  EXPECT_TRUE(absl::StrContains(pushed.status().message(), "a newer process registered as worker 0"))
      << pushed.status();
}

// A process of another user is refused as it connects, before the ps reads a byte from it (or maps a segment it
// sends): the answer comes at once, not after the hello timeout the ps would wait for its Hello. Needs root (to
// run the other user's process); CI runs as root.
TEST(ShmTransportTest, AProcessOfAnotherUserIsRefusedBeforeItsHelloIsRead) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to connect as another user";
  auto cluster = SimCluster::Start(Options(1, false));
  ASSERT_TRUE(cluster.ok());
  ShmServerOptions so;
  so.hello_timeout = absl::Seconds(3);
  absl::StatusOr<std::unique_ptr<ShmServer>> server = ShmServer::Start(&(*cluster)->task(0), so);
  ASSERT_TRUE(server.ok());
  int answer[2];
  ASSERT_EQ(pipe(answer), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // As user nobody: connect, send nothing, time the ps's answer; report "<code> <milliseconds>".
    int code = -1;
    int64_t ms = -1;
    if (setgid(65534) == 0 && setuid(65534) == 0) {
      const absl::Time start = absl::Now();
      absl::StatusOr<std::unique_ptr<Lane>> lane = Lane::Connect((*server)->socket_name());
      if (lane.ok()) {
        absl::StatusOr<Frame> welcome = (*lane)->Receive(absl::Now() + absl::Seconds(10));
        ms = absl::ToInt64Milliseconds(absl::Now() - start);
        if (welcome.ok()) {
          absl::StatusOr<PushResult> w = DecodePushResult(welcome->payload);
          code = w.ok() ? static_cast<int>(w->status.code()) : -2;
        }
      }
    }
    const std::string line = absl::StrCat(code, " ", ms);
    (void)!write(answer[1], line.data(), line.size());
    _exit(0);
  }
  close(answer[1]);
  char buf[64] = {};
  const ssize_t n = read(answer[0], buf, sizeof(buf) - 1);
  close(answer[0]);
  int status = 0;
  waitpid(child, &status, 0);
  ASSERT_GT(n, 0);
  int code = 0;
  long long ms = 0;
  ASSERT_EQ(sscanf(buf, "%d %lld", &code, &ms), 2) << buf;
  EXPECT_EQ(code, static_cast<int>(absl::StatusCode::kPermissionDenied)) << buf;
  EXPECT_LT(ms, 1000) << "the ps waited " << ms << " ms for the stranger's Hello";
  EXPECT_EQ((*server)->counters().lanes_refused, 1);
}

TEST(ShmTransportTest, AnUploadCutOffMidwayIsNeverApplied) {
  auto cluster = SimCluster::Start(Options(1, false));
  ASSERT_TRUE(cluster.ok());
  ParameterServer& ps = (*cluster)->task(0);
  absl::StatusOr<std::unique_ptr<ShmServer>> server = ShmServer::Start(&ps, {});
  ASSERT_TRUE(server.ok());
  const uint64_t session = (*cluster)->Session(0, 0);
  const int64_t step_before = ps.step();
  const PushAccounting before = ps.accounting();
  {
    // A worker that shares its gradients, writes one slice of two, and dies (its lanes close without a word).
    absl::StatusOr<ShmOffer> offer =
        (*server)->Offer(ShmAttachRequest{0, HostBootId(), static_cast<uint32_t>(geteuid()), session});
    ASSERT_TRUE(offer.ok());
    auto lane = Lane::Connect((*server)->socket_name());
    auto pull_lane = Lane::Connect((*server)->socket_name());
    ASSERT_TRUE(lane.ok() && pull_lane.ok());
    ASSERT_TRUE((*lane)->Send(FrameType::kHello, EncodeHello(Hello{LaneKind::kPush, 0, offer->push_ticket})).ok());
    ASSERT_TRUE((*lane)->Receive(absl::Now() + absl::Seconds(5)).ok());
    ASSERT_TRUE(
        (*pull_lane)->Send(FrameType::kHello, EncodeHello(Hello{LaneKind::kPull, 0, offer->pull_ticket})).ok());
    ASSERT_TRUE((*pull_lane)->Receive(absl::Now() + absl::Seconds(5)).ok());
    auto seg = ShmSegment::Create(1 << 20);
    ASSERT_TRUE(seg.ok());
    ASSERT_TRUE((*lane)->Send(FrameType::kSegment, EncodeSegment(SegmentInfo{1, (*seg)->size()}), (*seg)->fd()).ok());
    PushHeader h;
    h.worker_id = 0;
    h.step = step_before;
    h.request_id = 4242;
    h.commit = true;
    h.session = session;
    ASSERT_TRUE((*lane)->Send(FrameType::kPushBegin, EncodePushHeader(h)).ok());
    const SliceSpec& first = (*cluster)->placement().task_slices[0][0];
    ASSERT_TRUE((*lane)->Send(FrameType::kPushData,
                              EncodeDataRef(DataRef{first.key, 0, first.length, WireDtype::kF32, 1, 0}))
                    .ok());
  }  // the lane closes here, like a process killed mid-push
  for (int i = 0; i < 100 && ps.accounting().abandoned == before.abandoned; ++i) absl::SleepFor(absl::Milliseconds(20));
  const PushAccounting after = ps.accounting();
  EXPECT_EQ(after.abandoned, before.abandoned + 1);
  EXPECT_EQ(after.applied, before.applied);
  EXPECT_EQ(after.accepted, before.accepted);
  EXPECT_EQ(ps.step(), step_before);
  EXPECT_TRUE(after.Balanced()) << after.DebugString();
  // The worker comes back and trains normally.
  ShmSide side(cluster->get(), 0, WireDtype::kF32);
  ASSERT_TRUE(side.connected.ok()) << side.connected;
  SharedBuffer params((*cluster)->total_floats()), grads((*cluster)->total_floats());
  ASSERT_TRUE(side.client->Pull(step_before, 0, params.data).ok());
  ASSERT_TRUE(side.client->Push(step_before, grads.data).ok());
  EXPECT_EQ(ps.step(), step_before + 1);
}

TEST(ShmTransportTest, FallsBackToTheControlPlaneOrFailsWhenRequired) {
  // The ps offers no shared memory (a gRPC-only ps): auto moves data to the control plane.
  auto cluster = SimCluster::Start(Options(1, false));
  ASSERT_TRUE(cluster.ok());
  auto unimplemented = [](int) { return absl::UnimplementedError("no AttachShm"); };
  {
    ShmSide side(cluster->get(), 0, WireDtype::kF32, {}, unimplemented);
    ASSERT_TRUE(side.connected.ok()) << side.connected;
    SharedBuffer params((*cluster)->total_floats()), grads((*cluster)->total_floats());
    ASSERT_TRUE(side.client->Pull(0, 0, params.data).ok());
    ASSERT_TRUE(side.client->Push(0, grads.data).ok());
    EXPECT_EQ(side.counters.shm_pushes.load(), 0);
    EXPECT_EQ(side.counters.control_pushes.load(), 1);
  }
  // --transport=shm: the connection fails, naming why.
  {
    ShmSide side(cluster->get(), 0, WireDtype::kF32, {}, unimplemented, /*required=*/true);
    EXPECT_EQ(side.connected.code(), absl::StatusCode::kFailedPrecondition) << side.connected;
    EXPECT_NE(side.connected.message().find("--transport=shm"), std::string::npos) << side.connected;
    EXPECT_NE(side.connected.message().find("gRPC only"), std::string::npos) << side.connected;
  }
  // A ps that cannot map the worker's segments (here: it takes none): the push moves to gRPC and is applied
  // exactly once.
  {
    auto c2 = SimCluster::Start(Options(1, false));
    ASSERT_TRUE(c2.ok());
    ShmServerOptions none;
    none.max_segments = 0;
    ShmSide side(c2->get(), 0, WireDtype::kF32, none);
    ASSERT_TRUE(side.connected.ok()) << side.connected;
    SharedBuffer params((*c2)->total_floats()), grads((*c2)->total_floats());
    ASSERT_TRUE(side.client->Pull(0, 0, params.data).ok());
    ASSERT_TRUE(side.client->Push(0, grads.data).ok());
    EXPECT_EQ((*c2)->task(0).step(), 1);
    EXPECT_EQ((*c2)->task(0).accounting().applied, 1);
  }
  EXPECT_EQ(CountSegments(getpid()), 0);
}

}  // namespace
}  // namespace dtrain::ps::shm
