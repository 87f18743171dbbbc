#include "ps/grpc_ps_client.h"

#include <algorithm>
#include <thread>
#include <utility>

#include <glog/logging.h>
#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "dtrain.grpc.pb.h"
#include "ps/wire_format.h"

namespace dtrain::ps {
namespace {

namespace pb = ::dtrain::wire;

class GrpcPsClient final : public PsInterface {
 public:
  GrpcPsClient(std::string address, GrpcClientOptions options, std::shared_ptr<grpc::Channel> channel)
      : address_(std::move(address)), options_(options), stub_(pb::ParameterServer::NewStub(channel)) {}

  absl::StatusOr<RegisterResponse> Register(const RegisterRequest& request) override {
    pb::RegisterRequest req;
    req.set_worker_id(request.worker_id);
    req.set_is_chief(request.is_chief);
    wire::ToProto(request.config, req.mutable_config());
    if (request.restore_step != kRestoreNewest) req.set_restore_step(request.restore_step);
    pb::RegisterResponse resp;
    // One attempt: the caller (PsGroup::Connect) waits for late ps tasks itself and logs what it waits for.
    absl::Status s = WithRetries(
        "Register", options_.rpc_timeout,
        [&](grpc::ClientContext* ctx) { return stub_->Register(ctx, req, &resp); }, absl::ZeroDuration());
    if (!s.ok()) return s;
    {
      absl::MutexLock l(&mu_);
      slices_ = request.config.slices;  // the layout for flat pushes and pulls
    }
    return RegisterResponse{resp.initialized(), resp.global_step()};
  }

  absl::Status Initialize(const InitializeRequest& request) override {
    return WithRetries("Initialize", options_.rpc_timeout, [&](grpc::ClientContext* ctx) {
      pb::InitializeResponse resp;
      auto writer = stub_->Initialize(ctx, &resp);
      bool first = true;
      wire::ForEachChunkGroup(request.slices, [&](std::vector<pb::SliceChunk>&& group) {
        pb::InitializeChunk msg;
        if (first) msg.set_worker_id(request.worker_id);
        first = false;
        for (auto& c : group) *msg.add_chunks() = std::move(c);
        return writer->Write(msg);
      });
      writer->WritesDone();
      return writer->Finish();
    });
  }

  absl::StatusOr<PushResponse> Push(const PushRequest& request) override {
    std::vector<wire::SliceView> views;
    if (request.flat_gradients != nullptr) {
      std::vector<SliceSpec> slices = RegisteredSlices();
      if (slices.empty()) return absl::FailedPreconditionError("flat push before Register");
      views = wire::Views(slices, request.flat_gradients);
    } else {
      views = wire::Views(request.gradients);
    }
    pb::PushResponse resp;
    absl::Status s = WithRetries("Push", options_.rpc_timeout, [&](grpc::ClientContext* ctx) {
      auto writer = stub_->Push(ctx, &resp);
      bool first = true;
      wire::ForEachChunkGroup(views, [&](std::vector<pb::SliceChunk>&& group) {
        pb::PushChunk msg;
        if (first) {
          auto* h = msg.mutable_header();
          h->set_worker_id(request.worker_id);
          h->set_step(request.step);
          h->set_request_id(request.request_id);
          h->set_commit(request.commit);
          first = false;
        }
        for (auto& c : group) *msg.add_chunks() = std::move(c);
        return writer->Write(msg);
      });
      writer->WritesDone();
      return writer->Finish();
    });
    if (!s.ok()) return s;
    return PushResponse{wire::FromProto(resp.outcome()), resp.global_step()};
  }

  absl::StatusOr<PullResponse> Pull(const PullRequest& request) override {
    std::vector<SliceSpec> slices;
    if (request.flat_out != nullptr) {
      slices = RegisteredSlices();
      if (slices.empty()) return absl::FailedPreconditionError("flat pull before Register");
    }
    pb::PullRequest req;
    req.set_worker_id(request.worker_id);
    req.set_min_step(request.min_step);
    req.set_since_step(request.since_step);
    req.set_timeout_ms(request.timeout_ms);
    req.set_moving_averages(request.moving_averages);
    for (const StepDecision& d : request.decisions) wire::ToProto(d, req.add_decisions());
    PullResponse out;
    // The server may legitimately wait up to timeout_ms before answering.
    const absl::Duration deadline = absl::Milliseconds(request.timeout_ms) + options_.rpc_timeout;
    absl::Status s = WithRetries("Pull", deadline, [&](grpc::ClientContext* ctx) {
      out = PullResponse{};
      wire::SliceAssembler assembler;
      wire::FlatAssembler flat(slices, request.flat_out);
      auto reader = stub_->Pull(ctx, req);
      pb::PullChunk msg;
      bool first = true;
      absl::Status bad;
      while (reader->Read(&msg)) {
        if (first && msg.has_header()) {
          out.step = msg.header().step();
          out.training_done = msg.header().training_done();
          for (const auto& d : msg.header().decisions()) out.decisions.push_back(wire::FromProto(d));
        }
        first = false;
        for (const auto& c : msg.chunks()) {
          if (bad.ok()) bad = request.flat_out != nullptr ? flat.Add(c) : assembler.Add(c);
        }
      }
      grpc::Status st = reader->Finish();
      if (st.ok() && bad.ok() && request.flat_out != nullptr) bad = flat.Finish();
      if (st.ok() && !bad.ok()) return grpc::Status(grpc::StatusCode::DATA_LOSS, std::string(bad.message()));
      out.slices = assembler.Take();
      return st;
    });
    if (!s.ok()) return s;
    return out;
  }

  absl::Status Done(int worker_id) override {
    pb::DoneRequest req;
    req.set_worker_id(worker_id);
    pb::DoneResponse resp;
    return WithRetries("Done", options_.rpc_timeout,
                       [&](grpc::ClientContext* ctx) { return stub_->Done(ctx, req, &resp); });
  }

  absl::StatusOr<TrainingStats> GetStats() override {
    pb::StatsRequest req;
    pb::StatsResponse resp;
    absl::Status s = WithRetries("GetStats", options_.rpc_timeout,
                                 [&](grpc::ClientContext* ctx) { return stub_->GetStats(ctx, req, &resp); });
    if (!s.ok()) return s;
    return wire::FromProto(resp);
  }

 private:
  // Runs `call` with a fresh context per attempt; retries Unavailable until the retry window is spent.
  template <typename Call>
  absl::Status WithRetries(const char* what, absl::Duration attempt_timeout, Call call,
                           absl::Duration retry_window = absl::InfiniteDuration()) {
    if (retry_window == absl::InfiniteDuration()) retry_window = options_.retry_window;
    const absl::Time give_up = absl::Now() + retry_window;
    absl::Duration backoff = options_.initial_backoff;
    while (true) {
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(absl::Now() + attempt_timeout));
      grpc::Status st = call(&ctx);
      if (st.ok()) return absl::OkStatus();
      absl::Status s = wire::FromGrpc(st);
      if (s.code() != absl::StatusCode::kUnavailable || absl::Now() + backoff > give_up) {
        return absl::Status(s.code(), absl::StrCat("ps ", address_, ": ", what, ": ", s.message()));
      }
      VLOG(1) << "ps " << address_ << ": " << what << " unavailable (" << s.message() << "), retrying";
      std::this_thread::sleep_for(absl::ToChronoMilliseconds(backoff));
      backoff = std::min(backoff * 2, options_.max_backoff);
    }
  }

  std::vector<SliceSpec> RegisteredSlices() {
    absl::MutexLock l(&mu_);
    return slices_;
  }

  const std::string address_;
  const GrpcClientOptions options_;
  absl::Mutex mu_;
  std::vector<SliceSpec> slices_ ABSL_GUARDED_BY(mu_);  // from the last successful Register
  std::unique_ptr<pb::ParameterServer::Stub> stub_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<PsInterface>> NewGrpcPsClient(const std::string& address,
                                                             const GrpcClientOptions& options) {
  if (address.empty()) return absl::InvalidArgumentError("empty ps address");
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  args.SetMaxSendMessageSize(64 << 20);
  // Reconnect quickly when a ps comes up late.
  args.SetInt(GRPC_ARG_HTTP2_MAX_FRAME_SIZE, (16 << 20) - 1);
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 64 << 20);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  auto channel = grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
  return std::unique_ptr<PsInterface>(new GrpcPsClient(address, options, std::move(channel)));
}

}  // namespace dtrain::ps
