// dtrain_hostile_peer's gRPC scenarios and the Attacker (tests/hostile_peer.h); the lanes' are in
// hostile_lanes.cc.
#include "tests/hostile_peer.h"

#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <chrono>
#include <climits>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "common/status_macros.h"
#include "dtrain.grpc.pb.h"
#include "ps/rpc/grpc_ps_client.h"
#include "ps/rpc/grpc_security.h"
#include "ps/rpc/wire_format.h"
#include "ps/shm/shm_offer.h"
#include "ps/tcp/tcp_lane.h"
#include "ps/testing/ps_test_util.h"
#include "tests/hostile_lanes.h"

namespace dtrain::hostile {

using ps::PsInterface;

void Tally::Count(const std::string& answer, bool was_refused, const std::string& to_what) {
  ++answers[answer];
  if (was_refused) {
    ++refused;
  } else {
    ++accepted;
    if (first_accepted.empty()) first_accepted = absl::StrCat(to_what, " -> ", answer);
  }
}

void Tally::Gone(const std::string& answer) {
  ++answers[absl::StrCat("gone:", answer)];
  ++gone;
}

std::string Tally::Line(const std::string& name) const {
  std::vector<std::string> a;
  for (const auto& [answer, n] : answers) a.push_back(absl::StrCat(answer, ":", n));
  std::string line =
      absl::StrCat("hostile ", name, ": sent=", sent, " refused=", refused, " accepted=", accepted,
                   " gone=", gone, " answers=", absl::StrJoin(a, ","), " | ", what);
  if (!first_accepted.empty()) absl::StrAppend(&line, " | FIRST ACCEPTED: ", first_accepted);
  for (const auto& [answer, message] : messages)
    absl::StrAppend(&line, "\n  ", name, " ", answer, ": ", message);
  return line;
}

namespace {

// The ps could not be reached (it is starting or ending): neither a refusal nor an acceptance.
bool Unreachable(const absl::Status& s) {
  return absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s) || absl::IsCancelled(s);
}

std::string CodeName(const absl::Status& s) { return absl::StatusCodeToString(s.code()); }

// Counts `s` as the answer to `sub`: a refusal when its code is one of `expected`.
void Answer(Tally* tally, const std::string& sub, const absl::Status& s,
            const std::vector<absl::StatusCode>& expected) {
  ++tally->sent;
  if (Unreachable(s)) {
    tally->Gone(absl::StrCat(sub, ":", CodeName(s)));
    return;
  }
  bool refused = false;
  for (absl::StatusCode c : expected) refused |= s.code() == c;
  const std::string answer = absl::StrCat(sub, ":", CodeName(s));
  tally->messages.emplace(answer, std::string(s.message()));
  tally->Count(answer, refused, absl::StrCat(sub, " (", s.message(), ")"));
}

// Accepts and drops whatever a pull sends.
class Discard : public ps::PullReceiver {
 public:
  absl::Status OnHeader(const ps::PullHeader&) override { return absl::OkStatus(); }
  absl::StatusOr<Buffer> Destination(uint32_t, int64_t, int64_t n) override { return Scratch(n); }
  absl::Status Written(uint32_t, int64_t, int64_t) override { return absl::OkStatus(); }
  absl::StatusOr<Buffer> SparseDestination(uint32_t, int64_t, int64_t n, int dim) override {
    return Scratch(n * dim);
  }

 private:
  absl::StatusOr<Buffer> Scratch(int64_t floats) {
    if (floats < 0 || floats > (int64_t{1} << 24))
      return absl::InvalidArgumentError("a piece of absurd size");
    scratch_.resize(static_cast<size_t>(floats));
    return Buffer{scratch_.data(), ps::WireDtype::kF32};
  }
  std::vector<float> scratch_;
};

// The attacker's own model: two dense slices, a hash table and a fixed-size [10, 3] table.
ps::TrainConfig OwnConfig(int num_workers) {
  ps::TrainConfig c = ps::testing::MakeConfig("sync", num_workers, num_workers, 0.1f);
  c.model_signature = "hostile-peer";
  c.num_ps = 1;
  c.slices = {{0, "w", 0, 1000}, {1, "b", 1000, 10}};
  c.tables.resize(2);
  c.tables[0].table = 0;
  c.tables[0].name = "emb";
  c.tables[0].dim = 4;
  c.tables[1].table = 1;
  c.tables[1].name = "fixed";
  c.tables[1].dim = 3;
  c.tables[1].rows = 10;
  c.sparse_optimizer.name = "adagrad";
  return c;
}

ps::testing::Slices OwnInitialValues() {
  ps::testing::Slices s;
  for (int i = 0; i < 1000; ++i) s[0].push_back(0.001f * static_cast<float>(i) - 0.3f);
  for (int i = 0; i < 10; ++i) s[1].push_back(static_cast<float>(i));
  return s;
}

}  // namespace

class Attacker::Impl {
 public:
  explicit Impl(Options o) : options_(std::move(o)), rng_(std::random_device{}()) {}

  absl::Status Connect() {
    ps::GrpcClientOptions co;
    co.rpc_timeout = absl::Seconds(5);
    co.retry_window = absl::Milliseconds(200);
    ASSIGN_OR_RETURN(no_token_, ps::NewGrpcPsClient(options_.ps_address, co));
    co.security.auth_token = options_.token.empty() ? "" : WrongToken();
    ASSIGN_OR_RETURN(wrong_token_, ps::NewGrpcPsClient(options_.ps_address, co));
    co.security.auth_token = options_.token;
    ASSIGN_OR_RETURN(ps_, ps::NewGrpcPsClient(options_.ps_address, co));
    security_ = co.security;
    shm_attach_ = ps::NewGrpcShmAttach(options_.ps_address, co);
    tcp_attach_ = ps::NewGrpcTcpAttach(options_.ps_address, co);
    channel_ = grpc::CreateChannel(options_.ps_address, grpc::InsecureChannelCredentials());
    stub_ = wire::ParameterServer::NewStub(channel_);
    return absl::OkStatus();
  }

  absl::Status Setup() {
    ps::RegisterRequest r;
    r.worker_id = 0;
    r.is_chief = true;
    r.config = OwnConfig(options_.num_workers);
    r.restore_step = ps::kRestoreNone;
    absl::StatusOr<ps::RegisterResponse> reg;
    for (int i = 0; i < 100; ++i) {  // the ps may still be starting
      reg = ps_->Register(r);
      if (!Unreachable(reg.status())) break;
      absl::SleepFor(absl::Milliseconds(100));
    }
    RETURN_IF_ERROR(reg.status());
    session_ = reg->session;
    if (!reg->initialized) RETURN_IF_ERROR(ps::testing::InitializeSlices(*ps_, 0, OwnInitialValues()));
    return absl::OkStatus();
  }

  absl::Status Run(const std::string& name, Tally* t) {
    if (name == "no_token") return NoToken(t);
    if (name == "wrong_token") return WrongTokenRound(t);
    if (name == "register_outside") return RegisterOutside(t);
    if (name == "register_honest") return RegisterHonest(t);
    if (name == "session_forgery") return SessionForgery(t);
    if (name == "offer_flood") return OfferFlood(t);
    if (name == "oversize") return Oversize(t);
    if (name == "shm_stranger") return ShmStranger(t);
    if (name == "tcp_stranger") return TcpStranger(t);
    if (name == "push_bad_refs") return PushBadRefs(t);
    if (name == "pull_bad_refs") return PullBadRefs(t);
    if (name == "shm_bad_refs") return ShmBadRefs(t);
    if (name == "tcp_bad_frames") return TcpBadFrames(t);
    return absl::InvalidArgumentError(absl::StrCat("unknown scenario '", name, "'"));
  }

  absl::Status Finish() {
    ps::PullRequest r;
    r.worker_id = 0;
    r.session = session_;
    ASSIGN_OR_RETURN(ps::testing::Pulled pulled, ps::testing::PullSlices(*ps_, r));
    const ps::testing::Slices want = OwnInitialValues();
    for (const auto& [key, values] : want) {
      const std::vector<float>& got = pulled.slices[key];
      if (got.size() != values.size()) {
        return absl::FailedPreconditionError(
            absl::StrCat("slice ", key, " has ", got.size(), " values, not ", values.size()));
      }
      for (size_t i = 0; i < values.size(); ++i) {
        if (std::memcmp(&got[i], &values[i], sizeof(float)) != 0) {
          return absl::FailedPreconditionError(absl::StrCat("slice ", key, "[", i, "] is ", got[i], ", not ",
                                                            values[i], ": a hostile push was applied"));
        }
      }
    }
    ps::DoneRequest done;
    done.worker_id = 0;
    done.session = session_;
    done.global_step = pulled.header.step;
    return ps_->Done(done);
  }

 private:
  std::string WrongToken() const {
    std::string w = options_.token;
    w[w.size() / 2] = w[w.size() / 2] == 'x' ? 'y' : 'x';  // one character off, the same length
    return w;
  }
  uint64_t ForgedSession() {
    uint64_t s;
    do s = rng_();
    while (s == 0 || s == session_);
    return s;
  }

  // ---- a stranger -------------------------------------------------------------------------------------------
  absl::Status Unauthenticated(PsInterface* client, const std::string& how, Tally* t) {
    const std::vector<absl::StatusCode> kRefused = {absl::StatusCode::kUnauthenticated};
    Answer(t, "GetStats", client->GetStats().status(), kRefused);
    ps::RegisterRequest r;
    r.worker_id = 0;
    r.is_chief = true;
    r.config = OwnConfig(options_.num_workers);
    Answer(t, "Register", client->Register(r).status(), kRefused);
    Answer(t, "Heartbeat", client->Heartbeat(0, ForgedSession()).status(), kRefused);
    ps::ControlRequest c;
    c.command = "drain";
    Answer(t, "Control(drain)", client->Control(c).status(), kRefused);
    t->what = absl::StrCat("GetStats, Register as chief, Heartbeat and Control(drain) ", how);
    return absl::OkStatus();
  }
  absl::Status NoToken(Tally* t) { return Unauthenticated(no_token_.get(), "without a token", t); }
  absl::Status WrongTokenRound(Tally* t) {
    if (options_.token.empty()) return absl::FailedPreconditionError("wrong_token needs --auth_token_file");
    return Unauthenticated(wrong_token_.get(), "with a token one character off", t);
  }

  absl::Status RegisterOutside(Tally* t) {
    t->what = "Register for worker ids outside the spec (-1, n, n + 1, 4096, INT_MAX) with the token";
    for (int id : {-1, options_.num_workers, options_.num_workers + 1, 4096, INT_MAX}) {
      ps::RegisterRequest r;
      r.worker_id = id;
      r.config = OwnConfig(options_.num_workers);
      Answer(t, absl::StrCat("id", id), ps_->Register(r).status(),
             {absl::StatusCode::kInvalidArgument, absl::StatusCode::kOutOfRange});
    }
    return absl::OkStatus();
  }

  // Registering as an honest worker with its own config would take its place (a newer process of it): the
  // token allows that by design. What the attacker cannot know is that config; with another it must be
  // refused.
  absl::Status RegisterHonest(Tally* t) {
    t->what = "Register as each honest worker (and as chief) with a config that is not the job's";
    for (int id = 0; id < options_.num_workers; ++id) {
      for (bool chief : {false, true}) {
        ps::RegisterRequest r;
        r.worker_id = id;
        r.is_chief = chief;
        r.config = OwnConfig(options_.num_workers);
        Answer(t, absl::StrCat("worker", id, chief ? "_chief" : ""), ps_->Register(r).status(),
               {absl::StatusCode::kFailedPrecondition, absl::StatusCode::kInvalidArgument,
                absl::StatusCode::kOutOfRange});
      }
    }
    return absl::OkStatus();
  }

  absl::Status SessionForgery(Tally* t) {
    t->what = "Heartbeat, Pull, Push and Done(failed) as each honest worker with forged sessions";
    // (OUT_OF_RANGE: the run is over, which the ps says first once it is.)
    const std::vector<absl::StatusCode> kRefused = {absl::StatusCode::kPermissionDenied,
                                                    absl::StatusCode::kOutOfRange};
    for (int id = 0; id < options_.num_workers; ++id) {
      Answer(t, "Heartbeat", ps_->Heartbeat(id, ForgedSession()).status(), kRefused);
      ps::PullRequest pull;
      pull.worker_id = id;
      pull.session = ForgedSession();
      pull.timeout_ms = 0;
      Discard discard;
      Answer(t, "Pull", ps_->Pull(pull, &discard), kRefused);
      ps::PushHeader h;
      h.worker_id = id;
      h.session = ForgedSession();
      h.request_id = rng_();
      h.commit = true;
      absl::StatusOr<std::unique_ptr<ps::SliceUpload>> up = ps_->StartPush(h);
      absl::Status s = up.status();
      const float g[4] = {1e30f, 1e30f, 1e30f, 1e30f};
      if (s.ok()) s = (*up)->Write(0, 0, 4, ps::WireDtype::kF32, g);
      if (s.ok()) s = (*up)->Finish().status();
      Answer(t, "Push", s, kRefused);
      ps::DoneRequest d;
      d.worker_id = id;
      d.session = ForgedSession();
      d.leaving = ps::Leaving::kFailed;
      d.reason = "hostile peer";
      Answer(t, "Done", ps_->Done(d), kRefused);
    }
    return absl::OkStatus();
  }

  // Each offer, were it made, would end the worker's attachment in place: 10 of each per honest worker a
  // round.
  absl::Status OfferFlood(Tally* t) {
    t->what = "AttachShm and AttachTcp offers for each honest worker with forged sessions (and session 0)";
    for (int i = 0; i < 10; ++i) {
      for (int id = 0; id < options_.num_workers; ++id) {
        const uint64_t session = i == 0 ? 0 : ForgedSession();
        ps::shm::ShmAttachRequest shm{id, ps::shm::HostBootId(), static_cast<uint32_t>(geteuid()), session};
        Answer(t, "AttachShm", shm_attach_(shm).status(), {absl::StatusCode::kPermissionDenied});
        if (options_.tcp_port > 0) {
          Answer(t, "AttachTcp", tcp_attach_(ps::tcp::TcpAttachRequest{id, session}).status(),
                 {absl::StatusCode::kPermissionDenied});
        }
      }
    }
    return absl::OkStatus();
  }

  // Past gRPC's message limit (8 MiB): refused by gRPC before the ps decodes it. gRPC still receives what was
  // sent (about 17 MB a round), and the refused caller moves on while the ps's side reads it: at most one
  // round a second, or the test would measure how fast the machine frees gRPC's buffers rather than whether
  // the ps's memory is bounded.
  absl::Status Oversize(Tally* t) {
    t->what =
        "a Push whose one message is 8 MiB + 64 KiB, a Pull asking for 1.05 M sparse ids (8.4 MB) with a "
        "forged session (at most a round a second)";
    if (absl::Now() - last_oversize_ < absl::Seconds(1)) return absl::OkStatus();
    last_oversize_ = absl::Now();
    wire::PushResponse response;
    grpc::ClientContext context;
    ps::AttachCallToken(security_, &context);
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    std::unique_ptr<grpc::ClientWriter<wire::PushChunk>> writer = stub_->Push(&context, &response);
    wire::PushChunk chunk;
    chunk.mutable_header()->set_worker_id(0);
    chunk.mutable_header()->set_session(ForgedSession());
    wire::SliceChunk* c = chunk.add_chunks();
    c->set_key(0);
    c->set_data(std::string((8 << 20) + (64 << 10), '\x7f'));
    writer->Write(chunk);
    writer->WritesDone();
    Answer(t, "Push(8MiB+64KiB)", ps::wire::FromGrpc(writer->Finish()),
           {absl::StatusCode::kResourceExhausted});
    ps::PullRequest pull;
    pull.worker_id = 0;
    pull.session = ForgedSession();
    pull.sparse.push_back(ps::SparseIds{0, std::vector<int64_t>(1050000, 7)});
    Discard discard;
    Answer(t, "Pull(1.05M ids)", ps_->Pull(pull, &discard), {absl::StatusCode::kResourceExhausted});
    return absl::OkStatus();
  }

  absl::Status ShmStranger(Tally* t) {
    t->what =
        "connections to the shm socket: silent, half a frame, an absurd length, a made-up ticket, a segment "
        "before the Hello";
    absl::StatusOr<std::string> socket = FindShmSocket(options_.ps_task, options_.ps_pid);
    if (!socket.ok()) {
      ++t->sent;
      t->Gone(absl::StrCat("no shm socket (", socket.status().message(), ")"));
      return absl::OkStatus();
    }
    StrangerShmRound(*socket, t);
    return absl::OkStatus();
  }

  absl::Status TcpStranger(Tally* t) {
    t->what =
        "connections to the TCP lane port: silent, half a header, an absurd payload length, bulk on a Hello, "
        "a "
        "made-up ticket";
    if (options_.tcp_port <= 0) return absl::FailedPreconditionError("tcp_stranger needs --tcp_port");
    std::string host;
    int port;
    RETURN_IF_ERROR(ps::tcp::SplitHostPort(options_.ps_address, &host, &port));
    StrangerTcpRound(host, options_.tcp_port, t);
    return absl::OkStatus();
  }

  // ---- a worker with a session ------------------------------------------------------------------------------
  // One push with this worker's session whose pieces `write` sends; its status (of the piece or the Finish).
  absl::Status Push(const std::function<absl::Status(ps::SliceUpload*)>& write, int worker = 0,
                    uint64_t session = 0) {
    ps::PushHeader h;
    h.worker_id = worker;
    h.session = session != 0 ? session : session_;
    h.request_id = rng_();
    h.commit = true;
    ASSIGN_OR_RETURN(std::unique_ptr<ps::SliceUpload> up, ps_->StartPush(h));
    RETURN_IF_ERROR(write(up.get()));
    return up->Finish().status();
  }

  absl::Status PushBadRefs(Tally* t) {
    t->what = absl::StrCat(
        "pushes with the session whose one bad piece is: an unknown slice key, a range past the "
        "slice's end, a negative offset, an unknown table, ids outside a [10, 3] table, ",
        options_.max_push_rows + 1,
        " rows (past --max_push_rows), a row width that does not "
        "divide, NaN; a push as worker 1 (outside the spec) and with another session");
    const std::vector<float> ones(4 * (options_.max_push_rows + 1), 1.0f);
    const float* g = ones.data();
    const std::vector<absl::StatusCode> refused = {
        absl::StatusCode::kInvalidArgument, absl::StatusCode::kResourceExhausted,
        absl::StatusCode::kOutOfRange, absl::StatusCode::kDataLoss, absl::StatusCode::kFailedPrecondition};
    Answer(t, "unknown_key",
           Push([&](ps::SliceUpload* u) { return u->Write(999, 0, 4, ps::WireDtype::kF32, g); }), refused);
    Answer(t, "past_slice_end",
           Push([&](ps::SliceUpload* u) { return u->Write(0, 998, 4, ps::WireDtype::kF32, g); }), refused);
    Answer(t, "negative_offset",
           Push([&](ps::SliceUpload* u) { return u->Write(1, -1, 2, ps::WireDtype::kF32, g); }), refused);
    const int64_t ids[2] = {3, 4};
    Answer(t, "unknown_table",
           Push([&](ps::SliceUpload* u) { return u->WriteSparse(7, ids, 2, 4, ps::WireDtype::kF32, g); }),
           refused);
    const int64_t outside[2] = {10, -1};
    Answer(t, "ids_outside_table",
           Push([&](ps::SliceUpload* u) { return u->WriteSparse(1, outside, 2, 3, ps::WireDtype::kF32, g); }),
           refused);
    std::vector<int64_t> many(options_.max_push_rows + 1);
    for (size_t i = 0; i < many.size(); ++i) many[i] = static_cast<int64_t>(i);
    Answer(t, "rows_past_max_push_rows", Push([&](ps::SliceUpload* u) {
             return u->WriteSparse(0, many.data(), static_cast<int64_t>(many.size()), 4, ps::WireDtype::kF32,
                                   g);
           }),
           refused);
    Answer(t, "row_width_mismatch",
           Push([&](ps::SliceUpload* u) { return u->WriteSparse(0, ids, 2, 5, ps::WireDtype::kF32, g); }),
           refused);
    const float nan[10] = {0, 0, 0, std::numeric_limits<float>::quiet_NaN(), 0, 0, 0, 0, 0, 0};
    Answer(t, "nan_gradient",
           Push([&](ps::SliceUpload* u) { return u->Write(1, 0, 10, ps::WireDtype::kF32, nan); }), refused);
    Answer(t, "as_worker_outside",
           Push([&](ps::SliceUpload* u) { return u->Write(1, 0, 10, ps::WireDtype::kF32, g); }, 1), refused);
    Answer(t, "other_session",
           Push([&](ps::SliceUpload* u) { return u->Write(1, 0, 10, ps::WireDtype::kF32, g); }, 0,
                ForgedSession()),
           {absl::StatusCode::kPermissionDenied});
    return absl::OkStatus();
  }

  absl::Status PullBadRefs(Tally* t) {
    t->what =
        absl::StrCat("pulls with the session asking for: an unknown table, ids outside a [10, 3] table, ",
                     options_.max_pull_rows + 1, " ids (past --max_pull_rows)");
    auto pull = [&](ps::SparseIds ids) {
      ps::PullRequest r;
      r.worker_id = 0;
      r.session = session_;
      r.timeout_ms = 0;
      r.sparse.push_back(std::move(ids));
      Discard discard;
      return ps_->Pull(r, &discard);
    };
    const std::vector<absl::StatusCode> refused = {absl::StatusCode::kInvalidArgument,
                                                   absl::StatusCode::kResourceExhausted,
                                                   absl::StatusCode::kOutOfRange};
    Answer(t, "unknown_table", pull({7, {1, 2}}), refused);
    Answer(t, "ids_outside_table", pull({1, {3, 10}}), refused);
    Answer(t, "negative_id_fixed_table", pull({1, {-1}}), refused);
    std::vector<int64_t> many(options_.max_pull_rows + 1);
    for (size_t i = 0; i < many.size(); ++i) many[i] = static_cast<int64_t>(i) + 1000000;
    Answer(t, "ids_past_max_pull_rows", pull({0, std::move(many)}), refused);
    return absl::OkStatus();
  }

  absl::Status ShmBadRefs(Tally* t) {
    t->what = absl::StrCat(
        "shm attachments with the session: a Hello naming worker 1, push references past the "
        "segment and to a segment never sent, ",
        options_.max_push_rows + 1,
        " rows and 2^40 rows claimed, a pull of 2^40 ids, a pull destination past the segment");
    const uint64_t session = session_;
    auto offer = [this, session]() {
      return shm_attach_(
          ps::shm::ShmAttachRequest{0, ps::shm::HostBootId(), static_cast<uint32_t>(geteuid()), session});
    };
    OwnShmRound(offer, session, options_.max_push_rows, t);
    return absl::OkStatus();
  }

  absl::Status TcpBadFrames(Tally* t) {
    t->what =
        absl::StrCat("TCP lanes with the session: a Hello naming worker 1, ", options_.max_push_rows + 1,
                     " rows and 2^28 rows (6 GiB) claimed with 1 MiB of their bytes, a pull of 2^40 ids, a "
                     "piece whose bulk "
                     "is not its size, a header of absurd length");
    if (options_.tcp_port <= 0) return absl::FailedPreconditionError("tcp_bad_frames needs --tcp_port");
    std::string host;
    int port;
    RETURN_IF_ERROR(ps::tcp::SplitHostPort(options_.ps_address, &host, &port));
    const uint64_t session = session_;
    OwnTcpRound(
        [this, session]() {
          return tcp_attach_(ps::tcp::TcpAttachRequest{0, session});
        },
        host, session, options_.max_push_rows, t);
    return absl::OkStatus();
  }

  const Options options_;
  std::mt19937_64 rng_;
  std::unique_ptr<PsInterface> no_token_, wrong_token_, ps_;
  ps::SecurityOptions security_;
  ps::shm::ShmAttachFn shm_attach_;
  ps::tcp::TcpAttachFn tcp_attach_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<wire::ParameterServer::Stub> stub_;
  uint64_t session_ = 0;  // own mode
  absl::Time last_oversize_ = absl::InfinitePast();
};

Attacker::Attacker(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Attacker::~Attacker() = default;

absl::StatusOr<std::unique_ptr<Attacker>> Attacker::Create(const Options& options) {
  if (options.ps_address.empty()) return absl::InvalidArgumentError("no ps address (--ps_hosts)");
  if (options.num_workers < 1)
    return absl::InvalidArgumentError("no workers in the cluster spec (--worker_hosts)");
  if (options.max_push_rows < 1 || options.max_pull_rows < 1 || options.max_push_rows > (1 << 22) ||
      options.max_pull_rows > (1 << 22)) {
    return absl::InvalidArgumentError(
        "--max_push_rows and --max_pull_rows must be in [1, 4M] (the ps's values)");
  }
  auto impl = std::make_unique<Impl>(options);
  RETURN_IF_ERROR(impl->Connect());
  return std::unique_ptr<Attacker>(new Attacker(std::move(impl)));
}

const std::vector<std::string>& Attacker::StrangerScenarios() {
  static const auto* names = new std::vector<std::string>{
      "no_token",    "wrong_token", "register_outside", "register_honest", "session_forgery",
      "offer_flood", "oversize",    "shm_stranger",     "tcp_stranger"};
  return *names;
}

const std::vector<std::string>& Attacker::OwnScenarios() {
  static const auto* names =
      new std::vector<std::string>{"push_bad_refs", "pull_bad_refs", "shm_bad_refs", "tcp_bad_frames"};
  return *names;
}

absl::Status Attacker::Setup() { return impl_->Setup(); }
absl::Status Attacker::Run(const std::string& name, Tally* tally) { return impl_->Run(name, tally); }
absl::Status Attacker::Finish() { return impl_->Finish(); }

}  // namespace dtrain::hostile
