#include "ps/grpc_ps_service.h"

#include <utility>

#include "dtrain.grpc.pb.h"
#include "ps/wire_format.h"

namespace dtrain::ps {
namespace {

namespace pb = ::dtrain::wire;

class GrpcPsService final : public pb::ParameterServer::Service {
 public:
  explicit GrpcPsService(PsInterface* ps) : ps_(ps) {}

  grpc::Status Register(grpc::ServerContext*, const pb::RegisterRequest* req, pb::RegisterResponse* resp) override {
    RegisterRequest r;
    r.worker_id = req->worker_id();
    r.is_chief = req->is_chief();
    r.config = wire::FromProto(req->config());
    r.restore_step = req->has_restore_step() ? req->restore_step() : kRestoreNewest;
    absl::StatusOr<RegisterResponse> out = ps_->Register(r);
    if (!out.ok()) return wire::ToGrpc(out.status());
    resp->set_initialized(out->initialized);
    resp->set_global_step(out->global_step);
    return grpc::Status::OK;
  }

  grpc::Status Initialize(grpc::ServerContext*, grpc::ServerReader<pb::InitializeChunk>* reader,
                          pb::InitializeResponse*) override {
    InitializeRequest r;
    wire::SliceAssembler assembler;
    pb::InitializeChunk msg;
    bool first = true;
    while (reader->Read(&msg)) {
      if (first) r.worker_id = msg.worker_id();
      first = false;
      for (const auto& c : msg.chunks()) {
        absl::Status s = assembler.Add(c);
        if (!s.ok()) return wire::ToGrpc(s);
      }
    }
    if (first) return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "Initialize: empty stream");
    r.slices = assembler.Take();
    return wire::ToGrpc(ps_->Initialize(r));
  }

  grpc::Status Push(grpc::ServerContext*, grpc::ServerReader<pb::PushChunk>* reader,
                    pb::PushResponse* resp) override {
    PushRequest r;
    // Keep every message: a slice that arrived whole in one chunk is handed to the ps as a pointer into it
    // (no copy); only slices split over several chunks are assembled.
    std::vector<pb::PushChunk> messages;
    pb::PushChunk msg;
    while (reader->Read(&msg)) messages.push_back(std::move(msg));
    if (messages.empty()) return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "Push: empty stream");
    if (!messages[0].has_header()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "Push: first message has no header");
    }
    r.worker_id = messages[0].header().worker_id();
    r.step = messages[0].header().step();
    r.request_id = messages[0].header().request_id();
    r.commit = messages[0].header().commit();
    std::vector<const pb::SliceChunk*> chunks;
    for (const auto& m : messages) {
      for (const auto& c : m.chunks()) chunks.push_back(&c);
    }
    wire::SliceAssembler assembler;
    for (size_t i = 0; i < chunks.size(); ++i) {
      const pb::SliceChunk& c = *chunks[i];
      const bool whole = c.offset() == 0 && c.data().size() % sizeof(float) == 0 &&
                         (i + 1 == chunks.size() || chunks[i + 1]->key() != c.key()) &&
                         (i == 0 || chunks[i - 1]->key() != c.key());
      if (whole) {
        r.gradient_refs.push_back(SliceRef{c.key(), reinterpret_cast<const float*>(c.data().data()),
                                           static_cast<int64_t>(c.data().size() / sizeof(float))});
      } else {
        absl::Status s = assembler.Add(c);
        if (!s.ok()) return wire::ToGrpc(s);
      }
    }
    r.gradients = assembler.Take();
    absl::StatusOr<PushResponse> out = ps_->Push(r);
    if (!out.ok()) return wire::ToGrpc(out.status());
    resp->set_outcome(wire::ToProto(out->outcome));
    resp->set_global_step(out->global_step);
    return grpc::Status::OK;
  }

  grpc::Status Pull(grpc::ServerContext*, const pb::PullRequest* req,
                    grpc::ServerWriter<pb::PullChunk>* writer) override {
    PullRequest r;
    r.worker_id = req->worker_id();
    r.min_step = req->min_step();
    r.since_step = req->since_step();
    r.timeout_ms = req->timeout_ms() > 0 ? req->timeout_ms() : 60000;
    r.moving_averages = req->moving_averages();
    for (const auto& d : req->decisions()) r.decisions.push_back(wire::FromProto(d));
    absl::StatusOr<PullResponse> out = ps_->Pull(r);
    if (!out.ok()) return wire::ToGrpc(out.status());
    bool first = true;
    const bool ok = wire::ForEachChunkGroup(out->slices, [&](std::vector<pb::SliceChunk>&& group) {
      pb::PullChunk msg;
      if (first) {
        auto* h = msg.mutable_header();
        h->set_step(out->step);
        h->set_training_done(out->training_done);
        for (const StepDecision& d : out->decisions) wire::ToProto(d, h->add_decisions());
        first = false;
      }
      for (auto& c : group) *msg.add_chunks() = std::move(c);
      return writer->Write(msg);
    });
    if (!ok) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "Pull: client went away");
    return grpc::Status::OK;
  }

  grpc::Status Done(grpc::ServerContext*, const pb::DoneRequest* req, pb::DoneResponse*) override {
    return wire::ToGrpc(ps_->Done(req->worker_id()));
  }

  grpc::Status GetStats(grpc::ServerContext*, const pb::StatsRequest*, pb::StatsResponse* resp) override {
    absl::StatusOr<TrainingStats> out = ps_->GetStats();
    if (!out.ok()) return wire::ToGrpc(out.status());
    wire::ToProto(*out, resp);
    return grpc::Status::OK;
  }

 private:
  PsInterface* ps_;
};

}  // namespace

std::unique_ptr<grpc::Service> NewGrpcPsService(PsInterface* ps) { return std::make_unique<GrpcPsService>(ps); }

}  // namespace dtrain::ps
