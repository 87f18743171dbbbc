// libFuzzer harness for what a ps task does with requests from the network (after the token check, i.e. a
// stranger who has the token, or a buggy worker): the unary requests as protobuf bytes (Register, Pull, Done,
// Heartbeat, Probe, Restore, and the control messages: dtrain_ctl's Control commands and GetStats) through the
// wire conversions into a ParameterServer, and the Push / Initialize
// streams as raw messages through the service's decoder (UploadFeeder). Every answer must be a Status with one
// of the codes the ps documents (ps/api/ps_interface.h), never a crash, a hang or a sanitizer report; the task stays
// consistent (GetStats works, a well-formed pull still streams every slice).
//
// Input: a sequence of calls, each  u8 op | u16 length | payload[length]:
//   op % 11 = 0 Register     payload: wire::RegisterRequest
//            1 Push stream   payload: messages, each u16 length | bytes (raw PushChunk encodings; a header may
//                            name a stripe of part streams, which op 8 streams may join)
//            2 Init stream   payload: as for 1 (raw InitializeChunk encodings)
//            3 Pull          payload: wire::PullRequest (its timeout is cut to 0: nothing waits)
//            4 Done          payload: wire::DoneRequest
//            5 Heartbeat     payload: wire::HeartbeatRequest
//            6 Probe         payload: wire::ProbeRequest
//            7 Restore       payload: wire::RestoreRequest
//            8 PushPart      payload: as for 1 (the first message a PushPartHeader; joins no waiting)
//            9 Control       payload: wire::ControlRequest (drain, remove-worker, add-ps, remove-ps, retire, ...)
//           10 GetStats      payload: none
// Sessions 1 and 2 in any request stand for the real sessions of workers 0 and 1, which the harness registers
// (with a small valid config: two slices, a bounded hash table with admission and a fixed-size table, ftrl)
// before the calls, so that fuzzed pushes and pulls (their sparse ids and rows too) get past the session check.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include "absl/status/status.h"
#include "dtrain.pb.h"
#include "glog/logging.h"
#include "ps/core/parameter_server.h"
#include "ps/testing/ps_test_util.h"
#include "ps/rpc/upload_feeder.h"
#include "ps/rpc/wire_format.h"

namespace dtrain::ps {
namespace {

namespace pb = ::dtrain::wire;

bool Documented(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kOk:
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kDataLoss:
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
    case absl::StatusCode::kAborted:
    case absl::StatusCode::kPermissionDenied:
    case absl::StatusCode::kResourceExhausted:
    case absl::StatusCode::kCancelled:
    case absl::StatusCode::kOutOfRange:  // the run ended early (JobEndedError) or is over (RunOverError)
      return true;
    default:
      return false;
  }
}

// Accepts every piece a pull delivers (into scratch memory) and checks they stay inside their slice.
class DiscardReceiver : public PullReceiver {
 public:
  absl::Status OnHeader(const PullHeader&) override { return absl::OkStatus(); }
  absl::StatusOr<Buffer> Destination(uint32_t, int64_t offset, int64_t n) override {
    CHECK_GE(offset, 0);
    CHECK_GE(n, 0);
    scratch_.resize(static_cast<size_t>(n) * sizeof(float));
    return Buffer{scratch_.data(), WireDtype::kF32};
  }
  absl::Status Written(uint32_t, int64_t, int64_t) override { return absl::OkStatus(); }
  absl::StatusOr<Buffer> SparseDestination(uint32_t table, int64_t first, int64_t n, int dim) override {
    CHECK_LT(table, 2u);
    CHECK_GE(first, 0);
    CHECK_GE(n, 1);
    CHECK_EQ(dim, table == 0 ? 2 : 3);
    scratch_.resize(static_cast<size_t>(n) * dim * sizeof(float));
    return Buffer{scratch_.data(), WireDtype::kF32};
  }

 private:
  std::vector<char> scratch_;
};

class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : p_(data), end_(data + size) {}
  bool done() const { return p_ >= end_; }
  uint8_t U8() { return p_ < end_ ? *p_++ : 0; }
  uint16_t U16() {
    const uint16_t lo = U8();
    return static_cast<uint16_t>(lo | (U8() << 8));
  }
  std::string Bytes(size_t n) {
    n = std::min<size_t>(n, static_cast<size_t>(end_ - p_));
    std::string s(reinterpret_cast<const char*>(p_), n);
    p_ += n;
    return s;
  }

 private:
  const uint8_t* p_;
  const uint8_t* end_;
};

grpc::ByteBuffer ToBuffer(const std::string& bytes) {
  grpc::Slice slice(bytes.data(), bytes.size());
  return grpc::ByteBuffer(&slice, 1);
}

TrainConfig SmallConfig() {
  TrainConfig c = testing::MakeConfig("sync", 2, 2);
  c.optimizer.name = "momentum";
  c.moving_average_decay = 0.9f;
  c.slices = {{0, "w", 0, 8}, {1, "b", 8, 3}};
  // A hash table (bounded, with admission) and a fixed-size [10, 3] one.
  c.tables.resize(2);
  c.tables[0].table = 0;
  c.tables[0].name = "emb";
  c.tables[0].dim = 2;
  c.tables[0].max_rows = 16;
  c.tables[0].admit_after = 2;
  c.tables[1].table = 1;
  c.tables[1].name = "fixed";
  c.tables[1].dim = 3;
  c.tables[1].rows = 10;
  c.sparse_optimizer.name = "ftrl";
  return c;
}

struct Task {
  std::unique_ptr<ParameterServer> ps;
  uint64_t sessions[2] = {0, 0};
  std::unique_ptr<PushStripes> stripes = std::make_unique<PushStripes>();

  uint64_t Map(uint64_t session) const { return session == 1 || session == 2 ? sessions[session - 1] : session; }
};

Task MakeTask() {
  ParameterServerOptions o;
  o.num_workers = 2;
  o.max_model_bytes = 1 << 20;  // a fuzzed Register may not allocate more
  Task t;
  t.ps = *ParameterServer::Create(o);
  for (int w = 0; w < 2; ++w) {
    RegisterRequest r;
    r.worker_id = w;
    r.is_chief = w == 0;
    r.config = SmallConfig();
    absl::StatusOr<RegisterResponse> reg = t.ps->Register(r);
    CHECK(reg.ok()) << reg.status();
    t.sessions[w] = reg->session;
  }
  CHECK(testing::InitializeSlices(*t.ps, 0, {{0, std::vector<float>(8, 0.5f)}, {1, {1, 2, 3}}}).ok());
  return t;
}

constexpr int kOps = 11;

void Call(Task& t, uint8_t op, const std::string& payload) {
  absl::Status s;
  switch (op % kOps) {
    case 0: {
      pb::RegisterRequest req;
      if (!req.ParseFromString(payload)) return;
      RegisterRequest r;
      r.worker_id = req.worker_id();
      r.is_chief = req.is_chief();
      r.config = wire::FromProto(req.config());
      r.restore_step = req.has_restore_step() ? req.restore_step() : kRestoreNewest;
      s = t.ps->Register(r).status();
      break;
    }
    case 1:
    case 2:
    case 8: {
      UploadFeeder feeder(t.ps.get(), /*initialize=*/op % kOps == 2, t.stripes.get(), /*part=*/op % kOps == 8, absl::Now());
      Reader messages(reinterpret_cast<const uint8_t*>(payload.data()), payload.size());
      while (!messages.done() && s.ok()) {
        std::string bytes = messages.Bytes(messages.U16());
        // A push header naming session 1 or 2: the real one (the header is field 1, length-delimited).
        pb::PushChunk chunk;
        if (chunk.ParseFromString(bytes) && chunk.has_header() && (chunk.header().session() == 1 ||
                                                                   chunk.header().session() == 2)) {
          chunk.mutable_header()->set_session(t.Map(chunk.header().session()));
          bytes = chunk.SerializeAsString();
        }
        s = feeder.Feed(ToBuffer(bytes));
      }
      if (s.ok()) s = feeder.Finish().status();
      break;
    }
    case 3: {
      pb::PullRequest req;
      if (!req.ParseFromString(payload)) return;
      PullRequest r = wire::FromProto(req);
      r.session = t.Map(r.session);
      r.timeout_ms = 0;
      DiscardReceiver receiver;
      s = t.ps->Pull(r, &receiver);
      break;
    }
    case 4: {
      pb::DoneRequest req;
      if (!req.ParseFromString(payload)) return;
      ps::DoneRequest done = wire::FromProto(req);
      done.session = t.Map(req.session());
      s = t.ps->Done(done);
      break;
    }
    case 5: {
      pb::HeartbeatRequest req;
      if (!req.ParseFromString(payload)) return;
      s = t.ps->Heartbeat(req.worker_id(), t.Map(req.session())).status();
      break;
    }
    case 6: {
      pb::ProbeRequest req;
      if (!req.ParseFromString(payload)) return;
      s = t.ps->Probe(wire::FromProto(req.config())).status();
      break;
    }
    case 7: {
      pb::RestoreRequest req;
      if (!req.ParseFromString(payload)) return;
      s = t.ps->Restore(wire::FromProto(req.config()), req.worker_id(), req.step());
      break;
    }
    case 9: {
      pb::ControlRequest req;
      if (!req.ParseFromString(payload)) return;
      s = t.ps->Control(wire::FromProto(req, "ipv4:127.0.0.1:1")).status();
      break;
    }
    case 10: {
      absl::StatusOr<TrainingStats> stats = t.ps->GetStats();
      s = stats.status();
      if (stats.ok()) {
        // What a peer would receive must parse again (its strings are UTF-8: the run's end, a worker's reason).
        pb::StatsResponse out, back;
        wire::ToProto(*stats, &out);
        CHECK(back.ParseFromString(out.SerializeAsString())) << "stats that a peer cannot parse";
        CHECK_GE(stats->global_step, 0);
      }
      break;
    }
  }
  CHECK(Documented(s)) << "op " << op % kOps << ": undocumented status " << s;
}

}  // namespace
}  // namespace dtrain::ps

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dtrain::ps;  // NOLINT
  Task t = MakeTask();
  Reader in(data, size);
  for (int calls = 0; !in.done() && calls < 64; ++calls) {
    const uint8_t op = in.U8();
    const std::string payload = in.Bytes(in.U16());
    Call(t, op, payload);
  }
  // Still consistent: statistics, and (unless training ended) a pull that streams every slice.
  CHECK(t.ps->GetStats().ok());
  if (!t.ps->finished()) {
    PullRequest r;
    r.session = t.sessions[0];
    r.timeout_ms = 0;
    r.sparse = {SparseIds{0, {1, -2, 3}}, SparseIds{1, {9, 0}}};
    DiscardReceiver receiver;
    const absl::Status s = t.ps->Pull(r, &receiver);
    CHECK(Documented(s)) << s;
  }
  return 0;
}
