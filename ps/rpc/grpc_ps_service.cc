#include "ps/rpc/grpc_ps_service.h"

#include <algorithm>
#include <utility>

#include <grpcpp/impl/codegen/proto_utils.h>
#include <grpcpp/impl/rpc_service_method.h>
#include <grpcpp/support/method_handler.h>

#include "absl/strings/str_cat.h"
#include "common/denormals.h"
#include "common/status_macros.h"
#include "dtrain.pb.h"
#include "ps/rpc/grpc_methods.h"
#include "ps/rpc/grpc_security.h"
#include "ps/rpc/peer_address.h"
#include "ps/rpc/push_stripes.h"
#include "ps/rpc/tensor_coding.h"
#include "ps/rpc/upload_feeder.h"
#include "ps/rpc/wire_format.h"

namespace dtrain::ps {
namespace {

namespace pb = ::dtrain::wire;
using grpc::internal::RpcMethod;
using grpc::internal::RpcServiceMethod;

// Sends what the ps task delivers: the header at once, then the pieces (and sparse rows), copied into slices the
// messages own and sent as soon as a slice (or a table's rows) is whole, a megabyte has gathered, or the task
// has nothing more ready.
class StreamReceiver : public PullReceiver {
 public:
  StreamReceiver(grpc::ServerWriter<grpc::ByteBuffer>* writer, WireDtype dtype, GrpcStreamCounters* counters)
      : writer_(writer), dtype_(dtype), counters_(counters) {}

  absl::Status OnHeader(const PullHeader& header) override {
    pb::PullHeader h;
    wire::ToProto(header, &h);
    builder_.SetHeader(h.SerializeAsString());
    return Flush();
  }
  absl::StatusOr<Buffer> Destination(uint32_t key, int64_t offset, int64_t n) override {
    return Buffer{builder_.AddChunkOwned(key, offset, dtype_, n), dtype_};
  }
  absl::Status Written(uint32_t, int64_t, int64_t) override {
    return builder_.data_bytes() >= coding::kMaxChunkBytes ? Flush() : absl::OkStatus();
  }
  absl::StatusOr<Buffer> SparseDestination(uint32_t table, int64_t first, int64_t n, int dim) override {
    return Buffer{builder_.AddRowsOwned(table, first, n, dim, dtype_), dtype_};
  }
  absl::Status SparseWritten(uint32_t, int64_t, int64_t) override {
    return builder_.data_bytes() >= coding::kMaxChunkBytes ? Flush() : absl::OkStatus();
  }
  absl::Status Flush() override {
    if (builder_.empty()) return absl::OkStatus();
    const grpc::ByteBuffer message = builder_.Build();
    if (counters_ != nullptr) {
      counters_->bytes_sent.fetch_add(static_cast<int64_t>(message.Length()), std::memory_order_relaxed);
    }
    if (!writer_->Write(message)) return absl::UnavailableError("Pull: the worker went away");
    return absl::OkStatus();
  }

 private:
  grpc::ServerWriter<grpc::ByteBuffer>* writer_;
  const WireDtype dtype_;
  GrpcStreamCounters* const counters_;  // may be null
  coding::MessageBuilder builder_;
};

class GrpcPsService final : public grpc::Service {
 public:
  GrpcPsService(PsInterface* ps, Cancellation* shutdown, std::string token, shm::ShmServer* shm,
                ApplyEarly apply_early, tcp::TcpServer* tcp, absl::Status tcp_refusal, GrpcStreamCounters* counters)
      : ps_(ps),
        shutdown_(shutdown),
        token_(std::move(token)),
        shm_(shm),
        apply_early_(apply_early),
        tcp_(tcp),
        tcp_refusal_(std::move(tcp_refusal)),
        counters_(counters) {
    AddMethod(new RpcServiceMethod(
        grpc_methods::kRegister, RpcMethod::NORMAL_RPC,
        new grpc::internal::RpcMethodHandler<GrpcPsService, pb::RegisterRequest, pb::RegisterResponse>(
            [](GrpcPsService* s, grpc::ServerContext* ctx, const pb::RegisterRequest* req, pb::RegisterResponse* resp) {
              if (grpc::Status denied = CheckCallToken(*ctx, s->token_); !denied.ok()) return denied;
              return s->Register(*req, resp);
            },
            this)));
    AddMethod(new RpcServiceMethod(
        grpc_methods::kInitialize, RpcMethod::CLIENT_STREAMING,
        new grpc::internal::ClientStreamingHandler<GrpcPsService, grpc::ByteBuffer, pb::InitializeResponse>(
            [](GrpcPsService* s, grpc::ServerContext* ctx, grpc::ServerReader<grpc::ByteBuffer>* reader,
               pb::InitializeResponse* resp) {
              if (grpc::Status denied = CheckCallToken(*ctx, s->token_); !denied.ok()) return denied;
              absl::StatusOr<PushResponse> r = s->Upload(*ctx, reader, /*initialize=*/true);
              if (r.ok()) resp->set_global_step(r->global_step);
              return wire::ToGrpc(r.status());
            },
            this)));
    AddMethod(new RpcServiceMethod(
        grpc_methods::kPush, RpcMethod::CLIENT_STREAMING,
        new grpc::internal::ClientStreamingHandler<GrpcPsService, grpc::ByteBuffer, pb::PushResponse>(
            [](GrpcPsService* s, grpc::ServerContext* ctx, grpc::ServerReader<grpc::ByteBuffer>* reader,
               pb::PushResponse* resp) {
              if (grpc::Status denied = CheckCallToken(*ctx, s->token_); !denied.ok()) return denied;
              absl::StatusOr<PushResponse> r = s->Upload(*ctx, reader, /*initialize=*/false);
              if (r.ok()) {
                resp->set_outcome(wire::ToProto(r->outcome));
                resp->set_global_step(r->global_step);
              }
              return wire::ToGrpc(r.status());
            },
            this)));
    AddMethod(new RpcServiceMethod(
        grpc_methods::kPushPart, RpcMethod::CLIENT_STREAMING,
        new grpc::internal::ClientStreamingHandler<GrpcPsService, grpc::ByteBuffer, pb::PushResponse>(
            [](GrpcPsService* s, grpc::ServerContext* ctx, grpc::ServerReader<grpc::ByteBuffer>* reader,
               pb::PushResponse*) {
              if (grpc::Status denied = CheckCallToken(*ctx, s->token_); !denied.ok()) return denied;
              return wire::ToGrpc(s->Upload(*ctx, reader, /*initialize=*/false, /*part=*/true).status());
            },
            this)));
    AddMethod(new RpcServiceMethod(
        grpc_methods::kPull, RpcMethod::SERVER_STREAMING,
        new grpc::internal::ServerStreamingHandler<GrpcPsService, pb::PullRequest, grpc::ByteBuffer>(
            [](GrpcPsService* s, grpc::ServerContext* ctx, const pb::PullRequest* req,
               grpc::ServerWriter<grpc::ByteBuffer>* writer) {
              if (grpc::Status denied = CheckCallToken(*ctx, s->token_); !denied.ok()) return denied;
              return s->Pull(*req, writer);
            },
            this)));
    AddMethod(new RpcServiceMethod(
        grpc_methods::kDone, RpcMethod::NORMAL_RPC,
        new grpc::internal::RpcMethodHandler<GrpcPsService, pb::DoneRequest, pb::DoneResponse>(
            [](GrpcPsService* s, grpc::ServerContext* ctx, const pb::DoneRequest* req, pb::DoneResponse*) {
              SetFlushDenormals();  // a worker leaving may decide (and apply) a step
              if (grpc::Status denied = CheckCallToken(*ctx, s->token_); !denied.ok()) return denied;
              return wire::ToGrpc(s->ps_->Done(wire::FromProto(*req)));
            },
            this)));
    AddMethod(new RpcServiceMethod(
        grpc_methods::kHeartbeat, RpcMethod::NORMAL_RPC,
        new grpc::internal::RpcMethodHandler<GrpcPsService, pb::HeartbeatRequest, pb::HeartbeatResponse>(
            [](GrpcPsService* s, grpc::ServerContext* ctx, const pb::HeartbeatRequest* req,
               pb::HeartbeatResponse* resp) {
              if (grpc::Status denied = CheckCallToken(*ctx, s->token_); !denied.ok()) return denied;
              absl::StatusOr<int64_t> step = s->ps_->Heartbeat(req->worker_id(), req->session());
              if (step.ok()) resp->set_step(*step);
              return wire::ToGrpc(step.status());
            },
            this)));
    AddMethod(new RpcServiceMethod(
        grpc_methods::kProbe, RpcMethod::NORMAL_RPC,
        new grpc::internal::RpcMethodHandler<GrpcPsService, pb::ProbeRequest, pb::ProbeResponse>(
            [](GrpcPsService* s, grpc::ServerContext* ctx, const pb::ProbeRequest* req, pb::ProbeResponse* resp) {
              if (grpc::Status denied = CheckCallToken(*ctx, s->token_); !denied.ok()) return denied;
              absl::StatusOr<CheckpointProbe> probe = s->ps_->Probe(wire::FromProto(req->config()));
              if (!probe.ok()) return wire::ToGrpc(probe.status());
              resp->set_configured(probe->configured);
              resp->set_initialized(probe->initialized);
              resp->set_step(probe->step);
              for (int64_t step : probe->restorable_steps) resp->add_restorable_steps(step);
              resp->set_first_relayable_step(probe->first_relayable_step);
              resp->set_num_ps(probe->num_ps);
              return grpc::Status::OK;
            },
            this)));
    AddMethod(new RpcServiceMethod(
        grpc_methods::kRestore, RpcMethod::NORMAL_RPC,
        new grpc::internal::RpcMethodHandler<GrpcPsService, pb::RestoreRequest, pb::RestoreResponse>(
            [](GrpcPsService* s, grpc::ServerContext* ctx, const pb::RestoreRequest* req, pb::RestoreResponse*) {
              if (grpc::Status denied = CheckCallToken(*ctx, s->token_); !denied.ok()) return denied;
              return wire::ToGrpc(s->ps_->Restore(wire::FromProto(req->config()), req->worker_id(), req->step()));
            },
            this)));
    AddMethod(new RpcServiceMethod(
        grpc_methods::kAttachShm, RpcMethod::NORMAL_RPC,
        new grpc::internal::RpcMethodHandler<GrpcPsService, pb::ShmAttachRequest, pb::ShmAttachResponse>(
            [](GrpcPsService* s, grpc::ServerContext* ctx, const pb::ShmAttachRequest* req,
               pb::ShmAttachResponse* resp) {
              if (grpc::Status denied = CheckCallToken(*ctx, s->token_); !denied.ok()) return denied;
              if (s->shm_ == nullptr) {
                return grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                                    "this ps task serves gRPC only (--transport=grpc)");
              }
              absl::StatusOr<shm::ShmOffer> offer =
                  s->shm_->Offer(shm::ShmAttachRequest{req->worker_id(), req->boot_id(), req->uid(), req->session()});
              if (!offer.ok()) return wire::ToGrpc(offer.status());
              resp->set_socket_name(offer->socket_name);
              resp->set_push_ticket(offer->push_ticket);
              resp->set_pull_ticket(offer->pull_ticket);
              resp->set_boot_id(offer->boot_id);
              resp->set_uid(offer->uid);
              resp->set_pid(offer->pid);
              return grpc::Status::OK;
            },
            this)));
    AddMethod(new RpcServiceMethod(
        grpc_methods::kAttachTcp, RpcMethod::NORMAL_RPC,
        new grpc::internal::RpcMethodHandler<GrpcPsService, pb::TcpAttachRequest, pb::TcpAttachResponse>(
            [](GrpcPsService* s, grpc::ServerContext* ctx, const pb::TcpAttachRequest* req,
               pb::TcpAttachResponse* resp) {
              if (grpc::Status denied = CheckCallToken(*ctx, s->token_); !denied.ok()) return denied;
              if (!s->tcp_refusal_.ok()) return wire::ToGrpc(s->tcp_refusal_);
              if (s->tcp_ == nullptr) {
                return grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                                    "this ps task offers no TCP lanes (--transport=grpc or shm)");
              }
              absl::StatusOr<tcp::TcpOffer> offer = s->tcp_->Offer(tcp::TcpAttachRequest{req->worker_id(), req->session()});
              if (!offer.ok()) return wire::ToGrpc(offer.status());
              resp->set_port(offer->port);
              resp->set_push_ticket(offer->push_ticket);
              resp->set_pull_ticket(offer->pull_ticket);
              resp->set_pid(offer->pid);
              return grpc::Status::OK;
            },
            this)));
    AddMethod(new RpcServiceMethod(
        grpc_methods::kControl, RpcMethod::NORMAL_RPC,
        new grpc::internal::RpcMethodHandler<GrpcPsService, pb::ControlRequest, pb::ControlResponse>(
            [](GrpcPsService* s, grpc::ServerContext* ctx, const pb::ControlRequest* req, pb::ControlResponse* resp) {
              if (grpc::Status denied = CheckCallToken(*ctx, s->token_); !denied.ok()) return denied;
              absl::StatusOr<std::string> out = s->ps_->Control(wire::FromProto(*req, ctx->peer()));
              if (!out.ok()) return wire::ToGrpc(out.status());
              resp->set_message(*out);
              return grpc::Status::OK;
            },
            this)));
    AddMethod(new RpcServiceMethod(
        grpc_methods::kGetStats, RpcMethod::NORMAL_RPC,
        new grpc::internal::RpcMethodHandler<GrpcPsService, pb::StatsRequest, pb::StatsResponse>(
            [](GrpcPsService* s, grpc::ServerContext* ctx, const pb::StatsRequest*, pb::StatsResponse* resp) {
              if (grpc::Status denied = CheckCallToken(*ctx, s->token_); !denied.ok()) return denied;
              absl::StatusOr<TrainingStats> out = s->ps_->GetStats();
              if (!out.ok()) return wire::ToGrpc(out.status());
              wire::ToProto(*out, resp);
              return grpc::Status::OK;
            },
            this)));
  }

 private:
  grpc::Status Register(const pb::RegisterRequest& req, pb::RegisterResponse* resp) {
    RegisterRequest r;
    r.worker_id = req.worker_id();
    r.is_chief = req.is_chief();
    r.config = wire::FromProto(req.config());
    r.restore_step = req.has_restore_step() ? req.restore_step() : kRestoreNewest;
    absl::StatusOr<RegisterResponse> out = ps_->Register(r);
    if (!out.ok()) return wire::ToGrpc(out.status());
    resp->set_initialized(out->initialized);
    resp->set_global_step(out->global_step);
    resp->set_session(out->session);
    resp->set_lease_ms(out->lease_ms);
    resp->set_input_position(out->input_position);
    resp->set_join_step(out->join_step);
    resp->set_max_workers(out->max_workers);
    resp->set_clock_ns(out->clock_ns);
    return grpc::Status::OK;
  }

  absl::StatusOr<PushResponse> Upload(const grpc::ServerContext& ctx, grpc::ServerReader<grpc::ByteBuffer>* reader,
                                      bool initialize, bool part = false) {
    SetFlushDenormals();  // async uploads apply the optimizer on this thread
    // A part waits for its push's main stream (sent first, on another connection) at most this long.
    const absl::Time join_deadline = std::min(absl::FromChrono(ctx.deadline()), absl::Now() + absl::Seconds(10));
    // The early apply pays only across a link: on the ps's own host both directions are copies on the same cores.
    const bool apply_early =
        apply_early_ == ApplyEarly::kOn || (apply_early_ == ApplyEarly::kAuto && !PeerOnThisHost(ctx.peer()));
    UploadFeeder feeder(ps_, initialize, &stripes_, part, join_deadline,
                        [this, &ctx] { return ctx.IsCancelled() || shutdown_->cancelled(); }, apply_early);
    grpc::ByteBuffer message;
    while (reader->Read(&message)) {
      if (counters_ != nullptr) {
        counters_->bytes_received.fetch_add(static_cast<int64_t>(message.Length()), std::memory_order_relaxed);
      }
      RETURN_IF_ERROR(feeder.Feed(message));
    }
    // The stream ended without the client's WritesDone (it cancelled the upload, died, or lost its connection):
    // the upload is dropped unfinished, nothing of it is committed.
    if (ctx.IsCancelled()) return absl::CancelledError("upload cancelled by the client or its connection lost");
    return feeder.Finish();
  }

  grpc::Status Pull(const pb::PullRequest& req, grpc::ServerWriter<grpc::ByteBuffer>* writer) {
    SetFlushDenormals();  // sync pulls on other tasks apply the relayed decisions on this thread
    PullRequest r = wire::FromProto(req);
    r.cancel = shutdown_;
    StreamReceiver receiver(writer, r.wire_dtype, counters_);
    if (absl::Status s = ps_->Pull(r, &receiver); !s.ok()) return wire::ToGrpc(s);
    return wire::ToGrpc(receiver.Flush());
  }

  PsInterface* ps_;
  PushStripes stripes_;  // pushes striped over several connections (--channels_per_ps)
  Cancellation* shutdown_;
  const std::string token_;  // empty: no authentication
  shm::ShmServer* shm_;      // null: no shared memory offered
  const ApplyEarly apply_early_;
  tcp::TcpServer* tcp_;          // null: no TCP lanes offered
  const absl::Status tcp_refusal_;  // not OK: AttachTcp's answer
  GrpcStreamCounters* const counters_;  // may be null
};

}  // namespace

absl::StatusOr<ApplyEarly> ParseApplyEarly(absl::string_view name) {
  if (name == "auto") return ApplyEarly::kAuto;
  if (name == "on") return ApplyEarly::kOn;
  if (name == "off") return ApplyEarly::kOff;
  return absl::InvalidArgumentError(absl::StrCat("--apply_early must be auto, on or off, got '", name, "'"));
}

std::unique_ptr<grpc::Service> NewGrpcPsService(PsInterface* ps, Cancellation* shutdown, const std::string& token,
                                                shm::ShmServer* shm, ApplyEarly apply_early, tcp::TcpServer* tcp,
                                                absl::Status tcp_refusal, GrpcStreamCounters* counters) {
  return std::make_unique<GrpcPsService>(ps, shutdown, token, shm, apply_early, tcp, std::move(tcp_refusal),
                                         counters);
}

}  // namespace dtrain::ps
