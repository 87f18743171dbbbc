#include "ps/wire_format.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace dtrain::ps::wire {

grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

absl::Status FromGrpc(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  // gRPC and absl share the canonical code numbering.
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

void ToProto(const TrainConfig& in, dtrain::wire::TrainConfig* out) {
  out->set_model_signature(in.model_signature);
  out->set_mode(in.mode);
  out->set_num_workers(in.num_workers);
  out->set_replicas_to_aggregate(in.replicas_to_aggregate);
  out->set_total_num_replicas(in.total_num_replicas);
  out->set_max_staleness(in.max_staleness);
  auto* o = out->mutable_optimizer();
  o->set_name(in.optimizer.name);
  o->set_learning_rate(in.optimizer.learning_rate);
  o->set_decay_steps(in.optimizer.decay_steps);
  o->set_decay_rate(in.optimizer.decay_rate);
  o->set_staircase(in.optimizer.staircase);
  o->set_momentum(in.optimizer.momentum);
  o->set_beta1(in.optimizer.beta1);
  o->set_beta2(in.optimizer.beta2);
  o->set_epsilon(in.optimizer.epsilon);
  out->set_moving_average_decay(in.moving_average_decay);
  for (const SliceSpec& s : in.slices) {
    auto* p = out->add_slices();
    p->set_key(s.key);
    p->set_variable(s.variable);
    p->set_flat_offset(s.flat_offset);
    p->set_length(s.length);
  }
}

TrainConfig FromProto(const dtrain::wire::TrainConfig& in) {
  TrainConfig c;
  c.model_signature = in.model_signature();
  c.mode = in.mode();
  c.num_workers = in.num_workers();
  c.replicas_to_aggregate = in.replicas_to_aggregate();
  c.total_num_replicas = in.total_num_replicas();
  c.max_staleness = in.max_staleness();
  const auto& o = in.optimizer();
  c.optimizer.name = o.name();
  c.optimizer.learning_rate = o.learning_rate();
  c.optimizer.decay_steps = o.decay_steps();
  c.optimizer.decay_rate = o.decay_rate();
  c.optimizer.staircase = o.staircase();
  c.optimizer.momentum = o.momentum();
  c.optimizer.beta1 = o.beta1();
  c.optimizer.beta2 = o.beta2();
  c.optimizer.epsilon = o.epsilon();
  c.moving_average_decay = in.moving_average_decay();
  for (const auto& p : in.slices()) {
    c.slices.push_back(SliceSpec{p.key(), p.variable(), p.flat_offset(), p.length()});
  }
  return c;
}

void ToProto(const StepDecision& in, dtrain::wire::StepDecision* out) {
  out->set_step(in.step);
  for (int w : in.workers) out->add_workers(w);
  out->set_checkpoint(in.checkpoint);
}

StepDecision FromProto(const dtrain::wire::StepDecision& in) {
  StepDecision d;
  d.step = in.step();
  d.workers.assign(in.workers().begin(), in.workers().end());
  d.checkpoint = in.checkpoint();
  return d;
}

void ToProto(const TrainingStats& in, dtrain::wire::StatsResponse* out) {
  out->set_global_step(in.global_step);
  for (const WorkerStats& w : in.workers) {
    auto* p = out->add_workers();
    p->set_worker_id(w.worker_id);
    p->set_applied(w.applied);
    p->set_dropped_stale(w.dropped_stale);
    p->set_dropped_backup(w.dropped_backup);
    p->set_duplicates(w.duplicates);
    p->set_wait_seconds(w.wait_seconds);
    p->set_done(w.done);
  }
  for (int64_t h : in.staleness_histogram) out->add_staleness_histogram(h);
  out->set_max_staleness_seen(in.max_staleness_seen);
  out->set_bytes_received(in.bytes_received);
  out->set_bytes_sent(in.bytes_sent);
}

TrainingStats FromProto(const dtrain::wire::StatsResponse& in) {
  TrainingStats s;
  s.global_step = in.global_step();
  for (const auto& p : in.workers()) {
    WorkerStats w;
    w.worker_id = p.worker_id();
    w.applied = p.applied();
    w.dropped_stale = p.dropped_stale();
    w.dropped_backup = p.dropped_backup();
    w.duplicates = p.duplicates();
    w.wait_seconds = p.wait_seconds();
    w.done = p.done();
    s.workers.push_back(w);
  }
  s.staleness_histogram.assign(in.staleness_histogram().begin(), in.staleness_histogram().end());
  s.max_staleness_seen = in.max_staleness_seen();
  s.bytes_received = in.bytes_received();
  s.bytes_sent = in.bytes_sent();
  return s;
}

dtrain::wire::PushResponse::Outcome ToProto(PushResponse::Outcome o) {
  switch (o) {
    case PushResponse::Outcome::kAccepted: return dtrain::wire::PushResponse::ACCEPTED;
    case PushResponse::Outcome::kDuplicate: return dtrain::wire::PushResponse::DUPLICATE;
    case PushResponse::Outcome::kDroppedStale: return dtrain::wire::PushResponse::DROPPED_STALE;
    case PushResponse::Outcome::kDroppedBackup: return dtrain::wire::PushResponse::DROPPED_BACKUP;
  }
  return dtrain::wire::PushResponse::ACCEPTED;
}

PushResponse::Outcome FromProto(dtrain::wire::PushResponse::Outcome o) {
  switch (o) {
    case dtrain::wire::PushResponse::DUPLICATE: return PushResponse::Outcome::kDuplicate;
    case dtrain::wire::PushResponse::DROPPED_STALE: return PushResponse::Outcome::kDroppedStale;
    case dtrain::wire::PushResponse::DROPPED_BACKUP: return PushResponse::Outcome::kDroppedBackup;
    default: return PushResponse::Outcome::kAccepted;
  }
}

std::vector<SliceView> Views(const std::vector<SliceData>& slices) {
  std::vector<SliceView> v;
  v.reserve(slices.size());
  for (const SliceData& s : slices) v.push_back({s.key, s.values.data(), static_cast<int64_t>(s.values.size())});
  return v;
}

std::vector<SliceView> Views(const std::vector<SliceSpec>& slices, const float* flat) {
  std::vector<SliceView> v;
  v.reserve(slices.size());
  for (const SliceSpec& s : slices) v.push_back({s.key, flat + s.flat_offset, s.length});
  return v;
}

bool ForEachChunkGroup(const std::vector<SliceData>& slices, const ChunkSink& emit) {
  return ForEachChunkGroup(Views(slices), emit);
}

bool ForEachChunkGroup(const std::vector<SliceView>& slices, const ChunkSink& emit) {
  constexpr int64_t kChunkFloats = kChunkBytes / sizeof(float);
  std::vector<dtrain::wire::SliceChunk> group;
  int64_t group_floats = 0;
  for (const SliceView& s : slices) {
    const int64_t n = s.length;
    int64_t offset = 0;
    do {
      const int64_t room = kChunkFloats - group_floats;
      const int64_t take = std::min(room, n - offset);
      dtrain::wire::SliceChunk chunk;
      chunk.set_key(s.key);
      chunk.set_offset(offset);
      chunk.set_data(reinterpret_cast<const char*>(s.data + offset), take * sizeof(float));
      group.push_back(std::move(chunk));
      group_floats += take;
      offset += take;
      if (group_floats >= kChunkFloats) {
        if (!emit(std::move(group))) return false;
        group.clear();
        group_floats = 0;
      }
    } while (offset < n);
  }
  if (!group.empty() || slices.empty()) return emit(std::move(group));
  return true;
}

absl::Status SliceAssembler::Add(const dtrain::wire::SliceChunk& chunk) {
  if (chunk.data().size() % sizeof(float) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("slice ", chunk.key(), ": chunk of ", chunk.data().size(), " bytes is not whole floats"));
  }
  const int64_t n = chunk.data().size() / sizeof(float);
  SliceData* target = nullptr;
  if (!slices_.empty() && slices_.back().key == chunk.key()) {
    target = &slices_.back();
  } else {
    if (chunk.offset() != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("slice ", chunk.key(), ": first chunk starts at offset ", chunk.offset(), ", not 0"));
    }
    slices_.push_back(SliceData{chunk.key(), {}});
    target = &slices_.back();
  }
  if (chunk.offset() != static_cast<int64_t>(target->values.size())) {
    return absl::InvalidArgumentError(absl::StrCat("slice ", chunk.key(), ": chunk at offset ", chunk.offset(),
                                                   " but ", target->values.size(), " floats received so far"));
  }
  // insert() copies without zero-filling first (resize + memcpy would write every byte twice).
  const float* src = reinterpret_cast<const float*>(chunk.data().data());
  target->values.insert(target->values.end(), src, src + n);
  bytes_ += n * sizeof(float);
  return absl::OkStatus();
}

FlatAssembler::FlatAssembler(const std::vector<SliceSpec>& slices, float* flat)
    : slices_(slices), flat_(flat), received_(slices.size(), 0) {}

absl::Status FlatAssembler::Add(const dtrain::wire::SliceChunk& chunk) {
  int index = -1;
  for (size_t i = 0; i < slices_.size(); ++i) {
    if (slices_[i].key == chunk.key()) index = static_cast<int>(i);
  }
  if (index < 0) return absl::DataLossError(absl::StrCat("chunk for unknown slice key ", chunk.key()));
  const SliceSpec& spec = slices_[index];
  if (chunk.data().size() % sizeof(float) != 0) {
    return absl::DataLossError(
        absl::StrCat("slice ", chunk.key(), ": chunk of ", chunk.data().size(), " bytes is not whole floats"));
  }
  const int64_t n = chunk.data().size() / sizeof(float);
  if (chunk.offset() != received_[index] || chunk.offset() + n > spec.length) {
    return absl::DataLossError(absl::StrCat("slice ", chunk.key(), " (", spec.variable, "): chunk [",
                                            chunk.offset(), ", ", chunk.offset() + n, ") after ",
                                            received_[index], " of ", spec.length, " floats"));
  }
  std::memcpy(flat_ + spec.flat_offset + chunk.offset(), chunk.data().data(), n * sizeof(float));
  received_[index] += n;
  bytes_ += n * sizeof(float);
  return absl::OkStatus();
}

absl::Status FlatAssembler::Finish() const {
  for (size_t i = 0; i < slices_.size(); ++i) {
    if (received_[i] != slices_[i].length) {
      return absl::DataLossError(absl::StrCat("slice ", slices_[i].key, " (", slices_[i].variable, "): ",
                                              received_[i], " of ", slices_[i].length, " floats received"));
    }
  }
  return absl::OkStatus();
}

std::vector<SliceData> SliceAssembler::Take() {
  bytes_ = 0;
  return std::move(slices_);
}

}  // namespace dtrain::ps::wire
