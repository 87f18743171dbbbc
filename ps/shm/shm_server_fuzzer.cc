// libFuzzer harness for the shm server's message handling (ps/shm/shm_server.h), not only its frame decoding
// (shm_frame_fuzzer): a worker process of the ps's own user that holds a valid offer (the token and its session)
// and sends what a well-behaved worker never would. Each input attaches anew (an offer, two lanes, a shared
// segment whose bytes come from the input) and sends a sequence of frames built from the input with the real
// encoders, their fields drawn near the edges that matter: slice keys, offsets and counts in and just outside
// their slices, segment references in and past the segment (and to segments never sent), row counts and dims
// past the table's, pushes for other workers, sessions and steps, pulls whose ids and rows lie anywhere,
// segments sent without a descriptor, frames of the wrong lane, and raw frames of any type.
//
// Checked: no crash, hang or sanitizer report; at the end of each input (the lanes closed, an offer ends the
// attachment and waits for its calls) the ParameterServer has nothing in flight and its push accounting
// balances; and every 256 inputs an honest step through shared memory (the real client) still works.
//
// Leaks: checked once, at exit, after the harness has shut its ps task and shm server down (their threads
// joined), not after each input. libFuzzer's per-input check (-detect_leaks) runs LeakSanitizer while the
// server's lane threads and the task's threads still work, and a check concurrent with other threads reports
// memory that is only referenced from their thread-local storage or in transit between their containers
// (google/sanitizers#757, open). Hunted with whole allocation stacks (ASAN_OPTIONS=fast_unwind_on_malloc=0,
// -detect_leaks=1), the report that came (after 16,896 inputs) was the destructor record of a thread_local
// (__cxa_thread_atexit_impl: a lane thread's apply scratch), memory of a live thread; an earlier one, its stack
// cut short, was an absl::Status. So LLVMFuzzerInitialize below adds -detect_leaks=0 unless the command line sets
// it, and the check at exit, with no thread at work, fails the run on any leak (a planted one is caught).
//
// Input: u8 choices and little-endian fields consumed by FuzzedDataProvider, in op order (see Op below); the
// segment's 64 KiB are filled from the tail of the input.
#include <fuzzer/FuzzedDataProvider.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "glog/logging.h"
#include "ps/client/worker_client.h"
#include "ps/core/parameter_server.h"
#include "ps/shm/shm_frame.h"
#include "ps/shm/shm_lane.h"
#include "ps/shm/shm_offer.h"
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

constexpr int64_t kSegmentBytes = 64 << 10;

struct World {
  std::unique_ptr<SimCluster> cluster;
  std::unique_ptr<ShmServer> server;
  std::unique_ptr<ShmSegment> segment;
  std::vector<SliceSpec> slices;  // task 0's
  uint64_t session = 0;           // worker 0's
  int64_t inputs = 0;
};

World* TheWorld() {
  static World* w = [] {
    auto* w = new World;
    SimClusterOptions o;
    o.variables = {{"w", 3000}, {"b", 10}};
    o.config = MakeConfig("async", 1, 1, 0.1f);
    SparseTableSpec t;
    t.table = 0;
    t.name = "emb";
    t.dim = 4;
    o.config.tables.push_back(t);
    o.config.sparse_optimizer.name = "adagrad";
    o.initial.assign(3010, 0.5f);
    absl::StatusOr<std::unique_ptr<SimCluster>> c = SimCluster::Start(o);
    CHECK(c.ok()) << c.status();
    w->cluster = *std::move(c);
    ShmServerOptions so;
    so.hello_timeout = absl::Milliseconds(200);
    so.upload_timeout = absl::Seconds(2);
    so.max_pull_rows = 1000;
    absl::StatusOr<std::unique_ptr<ShmServer>> s = ShmServer::Start(&w->cluster->task(0), so);
    CHECK(s.ok()) << s.status();
    w->server = *std::move(s);
    absl::StatusOr<std::unique_ptr<ShmSegment>> seg = ShmSegment::Create(kSegmentBytes);
    CHECK(seg.ok()) << seg.status();
    w->segment = *std::move(seg);
    w->slices = w->cluster->placement().task_slices[0];
    w->session = w->cluster->Session(0, 0);
    // Registered after the sanitizer's own exit hook, so it runs first: the leak check at exit then sees no
    // thread at work.
    std::atexit([] {
      World* w = TheWorld();
      w->server.reset();
      w->cluster.reset();
      w->segment.reset();
    });
    return w;
  }();
  return w;
}

// A field near the edges: 0, small, a valid value v, v +- 1, the limit, the limit +- 1, negative, or anything.
int64_t Near(FuzzedDataProvider& in, int64_t v, int64_t limit) {
  switch (in.ConsumeIntegralInRange<int>(0, 8)) {
    case 0: return 0;
    case 1: return v;
    case 2: return v + 1;
    case 3: return v - 1;
    case 4: return limit;
    case 5: return limit + 1;
    case 6: return -in.ConsumeIntegralInRange<int64_t>(1, 1 << 20);
    case 7: return in.ConsumeIntegralInRange<int64_t>(0, limit);
    default: return in.ConsumeIntegral<int64_t>();
  }
}

WireDtype Dtype(FuzzedDataProvider& in) { return static_cast<WireDtype>(in.ConsumeIntegralInRange<int>(0, 3)); }

uint32_t Segment(FuzzedDataProvider& in) { return in.ConsumeIntegralInRange<int>(0, 7) == 0 ? 7u : 1u; }

const SliceSpec& SomeSlice(World& w, FuzzedDataProvider& in) {
  return w.slices[in.ConsumeIntegralInRange<size_t>(0, w.slices.size() - 1)];
}

uint32_t Key(World& w, FuzzedDataProvider& in) {
  return in.ConsumeIntegralInRange<int>(0, 7) == 0 ? in.ConsumeIntegral<uint32_t>() : SomeSlice(w, in).key;
}

PushHeader Header(World& w, FuzzedDataProvider& in) {
  PushHeader h;
  h.worker_id = in.ConsumeIntegralInRange<int>(0, 7) == 0 ? in.ConsumeIntegralInRange<int>(-1, 3) : 0;
  h.step = Near(in, w.cluster->task(0).step(), w.cluster->task(0).step() + 2);
  h.request_id = in.ConsumeIntegral<uint64_t>();
  h.commit = in.ConsumeBool();
  h.session = in.ConsumeIntegralInRange<int>(0, 7) == 0 ? in.ConsumeIntegral<uint64_t>() : w.session;
  return h;
}

PullOrder Order(World& w, FuzzedDataProvider& in) {
  PullOrder o;
  o.request.worker_id = in.ConsumeIntegralInRange<int>(0, 7) == 0 ? in.ConsumeIntegralInRange<int>(-1, 3) : 0;
  o.request.session = in.ConsumeIntegralInRange<int>(0, 7) == 0 ? in.ConsumeIntegral<uint64_t>() : w.session;
  o.request.min_step = Near(in, w.cluster->task(0).step(), w.cluster->task(0).step() + 1);
  o.request.timeout_ms = in.ConsumeIntegralInRange<int>(0, 63) == 0 ? 1 : 0;  // nothing waits (an input a few ms at most)
  o.request.moving_averages = in.ConsumeIntegralInRange<int>(0, 15) == 0;
  o.request.sparse_read_only = in.ConsumeBool();
  o.request.wire_dtype = Dtype(in);
  const int destinations = in.ConsumeIntegralInRange<int>(0, 3);
  for (int d = 0; d < destinations; ++d) {
    const SliceSpec& s = SomeSlice(w, in);
    Destination dst;
    dst.key = in.ConsumeIntegralInRange<int>(0, 7) == 0 ? in.ConsumeIntegral<uint32_t>() : s.key;
    dst.kind = static_cast<Destination::Kind>(in.ConsumeIntegralInRange<int>(0, 3));
    dst.segment = Segment(in);
    dst.at = Near(in, 0, kSegmentBytes - s.length * 4);
    dst.length = Near(in, s.length, s.length);
    o.destinations.push_back(dst);
  }
  const int tables = in.ConsumeIntegralInRange<int>(0, 2);
  for (int t = 0; t < tables; ++t) {
    SparseOrder so;
    so.table = in.ConsumeIntegralInRange<int>(0, 7) == 0 ? in.ConsumeIntegral<uint32_t>() : 0;
    so.n = Near(in, 16, 1000);
    so.dim = static_cast<int32_t>(Near(in, 4, 4));
    so.segment = Segment(in);
    so.ids_at = Near(in, 0, kSegmentBytes - 8);
    so.rows_at = Near(in, 1024, kSegmentBytes - 16);
    o.sparse.push_back(so);
  }
  return o;
}

// An honest step through the real shm client: the server and the task still serve a well-behaved worker.
void HonestStep(World& w) {
  ShmClientOptions co;
  co.required = true;
  co.address = "in-process";
  ShmServer* server = w.server.get();
  std::unique_ptr<PsInterface> control = std::make_unique<FaultInjectingPs>(&w.cluster->task(0), FaultInjectingPs::Faults{});
  std::unique_ptr<PsInterface> client =
      NewShmPsClient(std::move(control), [server](const ShmAttachRequest& r) { return server->Offer(r); }, co);
  WorkerClientOptions wo;
  wo.step_timeout = absl::Seconds(20);
  WorkerClient wc({client.get()}, w.cluster->placement().task_slices, 0, /*is_chief=*/true, wo);
  absl::Status connected = wc.Connect(w.cluster->config(), w.cluster->initial().data(), absl::Seconds(10));
  CHECK(connected.ok()) << connected;
  std::vector<float> params(w.cluster->total_floats()), grads(w.cluster->total_floats(), 0.001f);
  absl::StatusOr<PullResult> pulled = wc.Pull(0, 0, params.data());
  CHECK(pulled.ok()) << pulled.status();
  absl::Status pushed = wc.Push(pulled->step, grads.data()).status();
  CHECK(pushed.ok()) << pushed;
  w.session = w.cluster->Session(0, 0);  // the client registered anew
}

}  // namespace
}  // namespace dtrain::ps::shm

// See the header: the per-input leak check off unless asked for; the world shut down before the check at exit.
extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  for (int i = 1; i < *argc; ++i) {
    if (std::string((*argv)[i]).rfind("-detect_leaks=", 0) == 0) return 0;
  }
  static std::vector<char*> args;
  args.assign(*argv, *argv + *argc);
  args.push_back(const_cast<char*>("-detect_leaks=0"));
  args.push_back(nullptr);
  *argc += 1;
  *argv = args.data();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dtrain::ps;        // NOLINT: a harness
  using namespace dtrain::ps::shm;  // NOLINT
  World& w = *TheWorld();
  FuzzedDataProvider in(data, size);
  // The segment's bytes (ids, rows, floats the frames point at) from the input's tail.
  std::vector<uint8_t> fill = in.ConsumeBytes<uint8_t>(in.ConsumeIntegralInRange<size_t>(0, 4096));
  for (size_t i = 0; i < static_cast<size_t>(kSegmentBytes); i += fill.empty() ? kSegmentBytes : fill.size()) {
    if (!fill.empty()) std::memcpy(w.segment->data() + i, fill.data(), std::min(fill.size(), kSegmentBytes - i));
  }
  if (++w.inputs % 256 == 0) {
    HonestStep(w);
    return 0;
  }
  absl::StatusOr<ShmOffer> offer =
      w.server->Offer(ShmAttachRequest{0, HostBootId(), static_cast<uint32_t>(geteuid()), w.session});
  CHECK(offer.ok()) << offer.status();
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  absl::StatusOr<std::unique_ptr<Lane>> push = Lane::Connect(offer->socket_name);
  absl::StatusOr<std::unique_ptr<Lane>> pull = Lane::Connect(offer->socket_name);
  CHECK(push.ok() && pull.ok());
  const bool good_tickets = in.ConsumeIntegralInRange<int>(0, 15) != 0;
  (*push)->Send(FrameType::kHello, EncodeHello(Hello{LaneKind::kPush, 0, good_tickets ? offer->push_ticket : "x"}),
                -1, deadline).IgnoreError();
  (*pull)->Send(FrameType::kHello, EncodeHello(Hello{LaneKind::kPull, 0, offer->pull_ticket}), -1, deadline)
      .IgnoreError();
  if (!(*push)->Receive(deadline).ok() || !(*pull)->Receive(deadline).ok()) return 0;
  if (in.ConsumeIntegralInRange<int>(0, 15) != 0) {
    (*push)->Send(FrameType::kSegment, EncodeSegment(SegmentInfo{1, w.segment->size()}), w.segment->fd(), deadline)
        .IgnoreError();
  }
  for (int ops = 0; ops < 24 && in.remaining_bytes() > 0; ++ops) {
    Lane* lane = in.ConsumeIntegralInRange<int>(0, 15) == 0 ? pull->get() : push->get();  // now and then the wrong one
    absl::Status sent;
    switch (in.ConsumeIntegralInRange<int>(0, 10)) {
      case 0:
        sent = lane->Send(FrameType::kPushBegin, EncodePushHeader(Header(w, in)), -1, deadline);
        break;
      case 1:
      case 2: {
        const SliceSpec& s = SomeSlice(w, in);
        DataRef r;
        r.key = Key(w, in);
        r.offset = Near(in, 0, s.length);
        r.n = Near(in, s.length, s.length);
        r.dtype = Dtype(in);
        r.segment = Segment(in);
        r.at = Near(in, 0, kSegmentBytes - s.length * 4);
        r.lent = in.ConsumeBool();
        sent = lane->Send(FrameType::kPushData, EncodeDataRef(r), -1, deadline);
        break;
      }
      case 3: {
        RowsRef r;
        r.table = in.ConsumeIntegralInRange<int>(0, 7) == 0 ? in.ConsumeIntegral<uint32_t>() : 0;
        r.n = Near(in, 16, 2000);
        r.dim = static_cast<int32_t>(Near(in, 4, 4));
        r.dtype = Dtype(in);
        r.segment = Segment(in);
        r.ids_at = Near(in, 0, kSegmentBytes - 8);
        r.rows_at = Near(in, 1024, kSegmentBytes - 16);
        sent = lane->Send(FrameType::kPushRows, EncodeRowsRef(r), -1, deadline);
        break;
      }
      case 4: sent = lane->Send(FrameType::kPushNorm, EncodeNorm(in.ConsumeFloatingPoint<double>()), -1, deadline); break;
      case 5: sent = lane->Send(FrameType::kPushFinish, "", -1, deadline); break;
      case 6: sent = lane->Send(FrameType::kPushAbandon, "", -1, deadline); break;
      case 7:
      case 8: sent = (*pull)->Send(FrameType::kPullRequest, EncodePullOrder(Order(w, in)), -1, deadline); break;
      case 9: {
        // Another segment: with a descriptor or (a lie) without one, any number and size.
        const bool fd = in.ConsumeBool();
        SegmentInfo info{in.ConsumeIntegralInRange<uint32_t>(0, 9), Near(in, kSegmentBytes, kSegmentBytes)};
        sent = lane->Send(FrameType::kSegment, EncodeSegment(info), fd ? w.segment->fd() : -1, deadline);
        break;
      }
      default: {
        const auto type = static_cast<FrameType>(in.ConsumeIntegralInRange<uint16_t>(0, 16));
        sent = lane->Send(type, in.ConsumeRandomLengthString(256), -1, deadline);
        break;
      }
    }
    if (!sent.ok()) break;  // the ps closed the lane
  }
  // The lanes close, as a worker's that exits; an offer ends the attachment and waits for its calls, so that
  // everything of this input is over before it returns (its upload is let go just after).
  push->reset();
  pull->reset();
  CHECK(w.server->Offer(ShmAttachRequest{0, HostBootId(), static_cast<uint32_t>(geteuid()), w.session}).ok());
  for (int i = 0; i < 20000 && w.cluster->task(0).accounting().in_flight > 0; ++i) {
    absl::SleepFor(absl::Microseconds(100));
  }
  const PushAccounting a = w.cluster->task(0).accounting();
  CHECK_EQ(a.in_flight, 0) << a.DebugString();
  CHECK(a.Balanced()) << a.DebugString();
  CHECK(w.cluster->task(0).GetStats().ok());
  return 0;
}
