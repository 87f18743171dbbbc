#include "ps/rpc/wire_format.h"

#include <algorithm>
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
  out->set_sparse_mode(in.sparse_mode);
  out->set_elastic_batch(in.elastic_batch);
  out->set_batch_unit(in.batch_unit);
  out->set_global_batch(in.global_batch);
  out->set_num_ps(in.num_ps);
  for (const std::string& h : in.ps_hosts) out->add_ps_hosts(h);
  out->set_ps_version(in.ps_version);
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
  o->set_lr_schedule(in.optimizer.lr_schedule);
  o->set_min_learning_rate(in.optimizer.min_learning_rate);
  o->set_warmup_steps(in.optimizer.warmup_steps);
  o->set_warmup_start_factor(in.optimizer.warmup_start_factor);
  o->set_nesterov(in.optimizer.nesterov);
  o->set_weight_decay(in.optimizer.weight_decay);
  o->set_rho(in.optimizer.rho);
  o->set_centered(in.optimizer.centered);
  o->set_initial_accumulator(in.optimizer.initial_accumulator);
  o->set_clip_norm(in.optimizer.clip_norm);
  out->set_moving_average_decay(in.moving_average_decay);
  out->set_train_steps(in.train_steps);
  for (const SliceSpec& s : in.slices) {
    auto* p = out->add_slices();
    p->set_key(s.key);
    p->set_variable(s.variable);
    p->set_flat_offset(s.flat_offset);
    p->set_length(s.length);
    p->set_state(!s.trainable);
  }
  for (const SparseTableSpec& t : in.tables) {
    auto* p = out->add_tables();
    p->set_table(t.table);
    p->set_name(t.name);
    p->set_dim(t.dim);
    p->set_rows(t.rows);
    p->set_init_scale(t.init_scale);
    p->set_init_seed(t.init_seed);
    p->set_max_rows(t.max_rows);
    p->set_admit_after(t.admit_after);
    p->set_initial_values(t.initial_values);
    p->set_ttl_steps(t.ttl_steps);
    p->set_ttl_secs(t.ttl_secs);
    p->set_admit_probability(t.admit_probability);
    p->set_row_dtype(static_cast<uint32_t>(t.row_dtype));
    p->set_slot_dtype(static_cast<uint32_t>(t.slot_dtype));
  }
  auto* so = out->mutable_sparse_optimizer();
  so->set_name(in.sparse_optimizer.name);
  so->set_learning_rate(in.sparse_optimizer.learning_rate);
  so->set_initial_accumulator(in.sparse_optimizer.initial_accumulator);
  so->set_beta1(in.sparse_optimizer.beta1);
  so->set_beta2(in.sparse_optimizer.beta2);
  so->set_epsilon(in.sparse_optimizer.epsilon);
  so->set_l1(in.sparse_optimizer.l1);
  so->set_l2(in.sparse_optimizer.l2);
  so->set_lr_power(in.sparse_optimizer.lr_power);
  for (const std::string& f : in.model_flags) out->add_model_flags(f);
}

TrainConfig FromProto(const dtrain::wire::TrainConfig& in) {
  TrainConfig c;
  c.model_signature = in.model_signature();
  c.mode = in.mode();
  c.sparse_mode = in.sparse_mode().empty() ? "sync" : in.sparse_mode();
  c.elastic_batch = in.elastic_batch();
  c.batch_unit = in.batch_unit();
  c.global_batch = in.global_batch();
  c.num_ps = in.num_ps();
  c.ps_hosts.assign(in.ps_hosts().begin(), in.ps_hosts().end());
  c.ps_version = in.ps_version();
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
  c.optimizer.lr_schedule = o.lr_schedule().empty() ? "exponential" : o.lr_schedule();
  c.optimizer.min_learning_rate = o.min_learning_rate();
  c.optimizer.warmup_steps = o.warmup_steps();
  c.optimizer.warmup_start_factor = o.warmup_start_factor();
  c.optimizer.nesterov = o.nesterov();
  c.optimizer.weight_decay = o.weight_decay();
  c.optimizer.rho = o.rho();
  c.optimizer.centered = o.centered();
  c.optimizer.initial_accumulator = o.initial_accumulator();
  c.optimizer.clip_norm = o.clip_norm();
  c.moving_average_decay = in.moving_average_decay();
  c.train_steps = in.train_steps();
  for (const auto& p : in.slices()) {
    c.slices.push_back(SliceSpec{p.key(), p.variable(), p.flat_offset(), p.length(), !p.state()});
  }
  for (const auto& p : in.tables()) {
    SparseTableSpec t;
    t.table = p.table();
    t.name = p.name();
    t.dim = p.dim();
    t.rows = p.rows();
    t.init_scale = p.init_scale();
    t.init_seed = p.init_seed();
    t.max_rows = p.max_rows();
    t.admit_after = p.admit_after();
    t.initial_values = p.initial_values();
    t.ttl_steps = p.ttl_steps();
    t.ttl_secs = p.ttl_secs();
    t.admit_probability = p.admit_probability() == 0.0f ? 1.0f : p.admit_probability();
    // An unknown dtype number stays out of range: ValidateTrainConfig refuses it by name.
    t.row_dtype = static_cast<RowDtype>(std::min<uint32_t>(p.row_dtype(), 255));
    t.slot_dtype = static_cast<RowDtype>(std::min<uint32_t>(p.slot_dtype(), 255));
    c.tables.push_back(std::move(t));
  }
  c.model_flags.assign(in.model_flags().begin(), in.model_flags().end());
  if (in.has_sparse_optimizer()) {  // else the defaults (a worker that knows no tables)
    const auto& so = in.sparse_optimizer();
    c.sparse_optimizer.name = so.name();
    c.sparse_optimizer.learning_rate = so.learning_rate();
    c.sparse_optimizer.initial_accumulator = so.initial_accumulator();
    c.sparse_optimizer.beta1 = so.beta1();
    c.sparse_optimizer.beta2 = so.beta2();
    c.sparse_optimizer.epsilon = so.epsilon();
    c.sparse_optimizer.l1 = so.l1();
    c.sparse_optimizer.l2 = so.l2();
    c.sparse_optimizer.lr_power = so.lr_power();
  }
  return c;
}

void ToProto(const StepDecision& in, dtrain::wire::StepDecision* out) {
  out->set_step(in.step);
  for (int w : in.workers) out->add_workers(w);
  out->set_checkpoint(in.checkpoint);
  out->set_mac(in.mac);
  out->set_delta(in.delta);
}

StepDecision FromProto(const dtrain::wire::StepDecision& in) {
  StepDecision d;
  d.step = in.step();
  d.workers.assign(in.workers().begin(), in.workers().end());
  d.checkpoint = in.checkpoint();
  d.mac = in.mac();
  d.delta = in.delta();
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
    p->set_lost(w.lost);
    p->set_times_lost(w.times_lost);
    p->set_nonfinite(w.nonfinite);
    p->set_failed(w.failed);
    p->set_leaving(static_cast<int32_t>(w.leaving));
    p->set_left_at_step(w.left_at_step);
    p->set_present_at_step(w.present_at_step);
    p->set_reason(w.reason);
  }
  out->set_job_ended(in.job_ended);
  out->set_checkpoint_step(in.checkpoint_step);
  for (const std::string& h : in.ps_hosts) out->add_ps_hosts(h);
  for (int64_t h : in.staleness_histogram) out->add_staleness_histogram(h);
  out->set_max_staleness_seen(in.max_staleness_seen);
  out->set_bytes_received(in.bytes_received);
  out->set_bytes_sent(in.bytes_sent);
  for (const SparseTableStats& t : in.tables) {
    auto* p = out->add_tables();
    p->set_name(t.name);
    p->set_rows(t.rows);
    p->set_created(t.created);
    p->set_evicted(t.evicted);
    p->set_expired(t.expired);
    p->set_not_admitted(t.not_admitted);
    p->set_dropped_gradients(t.dropped_gradients);
    p->set_lookups(t.lookups);
    p->set_updates(t.updates);
    p->set_bytes(t.bytes);
  }
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
    w.lost = p.lost();
    w.times_lost = p.times_lost();
    w.nonfinite = p.nonfinite();
    w.failed = p.failed();
    w.leaving = LeavingFromProto(p.leaving());
    w.left_at_step = p.left_at_step();
    w.present_at_step = p.present_at_step();
    w.reason = p.reason();
    s.workers.push_back(std::move(w));
  }
  s.job_ended = in.job_ended();
  s.checkpoint_step = in.checkpoint_step();
  s.ps_hosts.assign(in.ps_hosts().begin(), in.ps_hosts().end());
  s.staleness_histogram.assign(in.staleness_histogram().begin(), in.staleness_histogram().end());
  s.max_staleness_seen = in.max_staleness_seen();
  s.bytes_received = in.bytes_received();
  s.bytes_sent = in.bytes_sent();
  for (const auto& p : in.tables()) {
    s.tables.push_back(SparseTableStats{p.name(), p.rows(), p.created(), p.evicted(), p.expired(),
                                        p.not_admitted(), p.dropped_gradients(), p.lookups(), p.updates(),
                                        p.bytes()});
  }
  return s;
}

dtrain::wire::PushResponse::Outcome ToProto(PushResponse::Outcome o) {
  switch (o) {
    case PushResponse::Outcome::kAccepted: return dtrain::wire::PushResponse::ACCEPTED;
    case PushResponse::Outcome::kDuplicate: return dtrain::wire::PushResponse::DUPLICATE;
    case PushResponse::Outcome::kDroppedStale: return dtrain::wire::PushResponse::DROPPED_STALE;
    case PushResponse::Outcome::kDroppedBackup: return dtrain::wire::PushResponse::DROPPED_BACKUP;
    case PushResponse::Outcome::kSkippedNonFinite: return dtrain::wire::PushResponse::SKIPPED_NONFINITE;
  }
  return dtrain::wire::PushResponse::ACCEPTED;
}

PushResponse::Outcome FromProto(dtrain::wire::PushResponse::Outcome o) {
  switch (o) {
    case dtrain::wire::PushResponse::DUPLICATE: return PushResponse::Outcome::kDuplicate;
    case dtrain::wire::PushResponse::DROPPED_STALE: return PushResponse::Outcome::kDroppedStale;
    case dtrain::wire::PushResponse::DROPPED_BACKUP: return PushResponse::Outcome::kDroppedBackup;
    case dtrain::wire::PushResponse::SKIPPED_NONFINITE: return PushResponse::Outcome::kSkippedNonFinite;
    default: return PushResponse::Outcome::kAccepted;
  }
}

void ToProto(const PushHeader& in, dtrain::wire::PushHeader* out) {
  out->set_worker_id(in.worker_id);
  out->set_step(in.step);
  out->set_request_id(in.request_id);
  out->set_commit(in.commit);
  out->set_session(in.session);
  out->set_input_position(in.input_position);
  out->set_apply_early(in.apply_early);
}

PushHeader FromProto(const dtrain::wire::PushHeader& in) {
  PushHeader h;
  h.worker_id = in.worker_id();
  h.step = in.step();
  h.request_id = in.request_id();
  h.commit = in.commit();
  h.session = in.session();
  h.input_position = in.input_position();
  h.apply_early = in.apply_early();
  return h;
}

void ToProto(const PullRequest& in, dtrain::wire::PullRequest* out) {
  out->set_worker_id(in.worker_id);
  out->set_min_step(in.min_step);
  out->set_since_step(in.since_step);
  for (const StepDecision& d : in.decisions) ToProto(d, out->add_decisions());
  out->set_timeout_ms(in.timeout_ms);
  out->set_moving_averages(in.moving_averages);
  out->set_wire_dtype(static_cast<dtrain::wire::WireDtype>(in.wire_dtype));
  out->set_after_push(in.after_push);
  out->set_session(in.session);
  for (const SparseIds& e : in.sparse) {
    auto* p = out->add_sparse();
    p->set_table(e.table);
    p->mutable_ids()->Add(e.ids.begin(), e.ids.end());
  }
  out->set_sparse_read_only(in.sparse_read_only);
  if (in.parts > 1) {
    out->set_part(in.part);
    out->set_parts(in.parts);
  }
  out->set_elastic_read_ahead(in.elastic_read_ahead + 1);  // 0 (the proto default): -1
}

PullRequest FromProto(const dtrain::wire::PullRequest& in) {
  PullRequest r;
  r.worker_id = in.worker_id();
  r.min_step = in.min_step();
  r.since_step = in.since_step();
  for (const auto& d : in.decisions()) r.decisions.push_back(FromProto(d));
  r.timeout_ms = in.timeout_ms() > 0 ? in.timeout_ms() : 60000;
  r.moving_averages = in.moving_averages();
  r.after_push = in.after_push();
  r.session = in.session();
  const int dtype = in.wire_dtype();
  r.wire_dtype = dtype >= 0 && dtype <= static_cast<int>(WireDtype::kF16) ? static_cast<WireDtype>(dtype)
                                                                          : WireDtype::kF32;
  for (const auto& p : in.sparse()) r.sparse.push_back(SparseIds{p.table(), {p.ids().begin(), p.ids().end()}});
  r.sparse_read_only = in.sparse_read_only();
  if (in.parts() != 0 || in.part() != 0) {  // checked by the ps (ParameterServer::Pull)
    r.part = in.part();
    r.parts = in.parts();
  }
  r.elastic_read_ahead = std::max<int64_t>(in.elastic_read_ahead() - 1, -2);
  return r;
}

void ToProto(const PullHeader& in, dtrain::wire::PullHeader* out) {
  out->set_step(in.step);
  for (const StepDecision& d : in.decisions) ToProto(d, out->add_decisions());
  out->set_training_done(in.training_done);
  out->set_tentative(in.tentative);
  if (in.elastic.unit > 0) {
    auto* e = out->mutable_elastic();
    e->set_version(in.elastic.version);
    e->mutable_workers()->Add(in.elastic.workers.begin(), in.elastic.workers.end());
    e->set_aggregating(in.elastic.aggregating);
    e->set_first_batch(in.elastic.first_batch);
    e->mutable_batches()->Add(in.elastic.batches.begin(), in.elastic.batches.end());
    e->set_unit(in.elastic.unit);
    e->set_next_batch(in.elastic.next_batch + 1);  // 0 (the proto default): none
  }
  if (in.ps_set.version > 0) {
    auto* p = out->mutable_ps_set();
    p->set_version(in.ps_set.version);
    p->set_step(in.ps_set.step);
    for (const std::string& h : in.ps_set.hosts) p->add_hosts(h);
    for (const std::string& h : in.ps_set.leaving) p->add_leaving(h);
  }
}

PullHeader FromProto(const dtrain::wire::PullHeader& in) {
  PullHeader h;
  h.step = in.step();
  for (const auto& d : in.decisions()) h.decisions.push_back(FromProto(d));
  h.training_done = in.training_done();
  h.tentative = in.tentative();
  if (in.has_elastic()) {
    const auto& e = in.elastic();
    h.elastic.version = e.version();
    h.elastic.workers.assign(e.workers().begin(), e.workers().end());
    h.elastic.aggregating = e.aggregating();
    h.elastic.first_batch = e.first_batch();
    h.elastic.batches.assign(e.batches().begin(), e.batches().end());
    h.elastic.unit = e.unit();
    h.elastic.next_batch = std::max<int64_t>(e.next_batch() - 1, -1);
  }
  if (in.has_ps_set()) {
    const auto& p = in.ps_set();
    h.ps_set.version = p.version();
    h.ps_set.step = p.step();
    h.ps_set.hosts.assign(p.hosts().begin(), p.hosts().end());
    h.ps_set.leaving.assign(p.leaving().begin(), p.leaving().end());
  }
  return h;
}

Leaving LeavingFromProto(int32_t leaving) {
  switch (leaving) {
    case static_cast<int32_t>(Leaving::kCompleted):
    case static_cast<int32_t>(Leaving::kFailed):
    case static_cast<int32_t>(Leaving::kRefused):
    case static_cast<int32_t>(Leaving::kStopped):
    case static_cast<int32_t>(Leaving::kPeerFailed):
      return static_cast<Leaving>(leaving);
    default:
      return Leaving::kFailed;  // a newer kind this build does not know: not completed
  }
}

void ToProto(const DoneRequest& in, dtrain::wire::DoneRequest* out) {
  out->set_worker_id(in.worker_id);
  out->set_session(in.session);
  out->set_completed(in.leaving == Leaving::kCompleted);
  out->set_global_step(in.global_step);
  out->set_leaving(static_cast<int32_t>(in.leaving));
  out->set_reason(in.reason);
}

DoneRequest FromProto(const dtrain::wire::DoneRequest& in) {
  DoneRequest r;
  r.worker_id = in.worker_id();
  r.session = in.session();
  r.global_step = in.global_step();
  r.leaving = in.completed() ? Leaving::kCompleted : LeavingFromProto(in.leaving());
  if (!in.completed() && r.leaving == Leaving::kCompleted) r.leaving = Leaving::kFailed;
  r.reason = in.reason();
  return r;
}

namespace {

// At most `n` bytes of UTF-8 text `s`, cut before a character rather than inside one: the reason goes on into
// strings of other messages (the run's end, its stats), which a peer cannot parse if they are not UTF-8.
std::string CutUtf8(const std::string& s, size_t n) {
  if (s.size() <= n) return s;
  while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;  // s[n] continues a character
  return s.substr(0, n);
}

}  // namespace

ControlRequest FromProto(const dtrain::wire::ControlRequest& in, absl::string_view peer) {
  ControlRequest r;
  r.command = CutUtf8(in.command(), 64);
  r.worker = in.worker();
  r.address = CutUtf8(in.address(), 256);
  r.ps = in.ps();
  r.step = in.step();
  r.reason = absl::StrCat(CutUtf8(in.reason(), 200), " (from ", peer, ")");
  return r;
}

}  // namespace dtrain::ps::wire
