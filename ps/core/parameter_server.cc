// ParameterServer, part 1: the public class (each call handed to the Impl) and the parsing of its options. Uploads
// (push, initialize): parameter_server_uploads.cc; a push's end and its application (early, async, sparse):
// parameter_server_push.cc; the sync decisions and their application: parameter_server_sync.cc; pulls:
// parameter_server_pull.cc; registration, probe and restore, membership and the end of training:
// parameter_server_lifecycle.cc; checkpoints: parameter_server_state.cc. The design and the lock order:
// parameter_server_impl.h.
#include "ps/core/parameter_server.h"

#include "ps/core/parameter_server_impl.h"

namespace dtrain::ps {

std::string DecisionBytes(const StepDecision& d) {
  // The delta mark is signed only when set: a decision without one signs as before.
  return absl::StrCat("dtrain-decision/v1|", d.step, "|", absl::StrJoin(d.workers, ","), "|", d.checkpoint ? 1 : 0,
                      d.delta ? "|delta" : "");
}

// ---- the public class -----------------------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<ParameterServer>> ParameterServer::Create(ParameterServerOptions options) {
  DisableMutexDeadlockDetection();  // see common/mutex_config.h
  if (options.num_ps < 1 || options.task_index < 0 || options.task_index >= options.num_ps) {
    return absl::InvalidArgumentError(absl::StrCat("ps task_index ", options.task_index, " is outside [0, ",
                                                   options.num_ps, ") (num_ps ", options.num_ps, ")"));
  }
  if (options.num_workers < 1) {
    return absl::InvalidArgumentError(absl::StrCat("num_workers must be >= 1, got ", options.num_workers));
  }
  if (options.max_workers == 0) options.max_workers = options.num_workers;
  if (options.max_workers < options.num_workers || options.max_workers > kMaxWorkerSlots) {
    return absl::InvalidArgumentError(absl::StrCat("--max_workers=", options.max_workers, " must be between the "
                                                   "cluster spec's ", options.num_workers, " workers and ",
                                                   kMaxWorkerSlots));
  }
  RETURN_IF_ERROR(ValidateCheckpointOptions(options.checkpoint));
  if (options.worker_timeout < absl::ZeroDuration() || options.max_model_bytes <= 0) {
    return absl::InvalidArgumentError("worker_timeout must be >= 0 and max_model_bytes > 0");
  }
  if (options.apply_threads < 1) options.apply_threads = 1;
  if (options.journal_applied && !options.checkpoint.enabled()) {
    return absl::InvalidArgumentError("an applied journal (--journal_applied) is kept beside the checkpoints: it "
                                      "needs a checkpoint directory (--checkpoint_dir)");
  }
  auto impl = std::make_unique<Impl>(std::move(options));
  RETURN_IF_ERROR(impl->OpenJournal());
  return std::unique_ptr<ParameterServer>(new ParameterServer(std::move(impl)));
}

ParameterServer::ParameterServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

absl::StatusOr<std::string> ParameterServer::Control(const ControlRequest& request) {
  return impl_->Control(request);
}
ParameterServer::~ParameterServer() = default;

absl::StatusOr<RegisterResponse> ParameterServer::Register(const RegisterRequest& request) {
  // The clock midway through the call: a first registration configures the task (tens of milliseconds for a large
  // model), which a clock read at the answer would put all on the request's way.
  const int64_t entered = TraceRecorder::NowNs();
  absl::StatusOr<RegisterResponse> r = impl_->Register(request);
  if (r.ok()) r->clock_ns = entered + (TraceRecorder::NowNs() - entered) / 2;
  return r;
}
absl::StatusOr<std::unique_ptr<SliceUpload>> ParameterServer::StartInitialize(int worker_id) {
  return impl_->StartInitialize(worker_id);
}
absl::StatusOr<std::unique_ptr<SliceUpload>> ParameterServer::StartPush(const PushHeader& header) {
  return impl_->StartPush(header);
}
absl::Status ParameterServer::Pull(const PullRequest& request, PullReceiver* receiver) {
  return impl_->Pull(request, receiver);
}
absl::Status ParameterServer::Done(const DoneRequest& request) { return impl_->Done(request); }
void ParameterServer::EndRun(const std::string& why) { impl_->EndRun(why); }
absl::StatusOr<int64_t> ParameterServer::Heartbeat(int worker_id, uint64_t session) {
  return impl_->Heartbeat(worker_id, session);
}
absl::StatusOr<TrainingStats> ParameterServer::GetStats() { return impl_->GetStats(); }
absl::StatusOr<CheckpointProbe> ParameterServer::Probe(const TrainConfig& config) { return impl_->Probe(config); }
absl::Status ParameterServer::Restore(const TrainConfig& config, int worker_id, int64_t step) {
  return impl_->Restore(config, worker_id, step);
}
bool ParameterServer::finished() const { return impl_->finished(); }
bool ParameterServer::WaitUntilFinished(absl::Duration timeout) { return impl_->WaitUntilFinished(timeout); }
TrainingOutcome ParameterServer::outcome() const { return impl_->outcome(); }
void ParameterServer::CheckLeases() { impl_->CheckLeases(); }
void ParameterServer::FlushDeltas() { impl_->FlushDeltas(); }
absl::Status ParameterServer::final_checkpoint_status() const { return impl_->final_checkpoint_status(); }

absl::Status ParameterServer::WaitFinalCheckpoint(absl::Duration timeout) {
  return impl_->WaitFinalCheckpoint(timeout);
}

PushAccounting ParameterServer::accounting() const { return impl_->accounting(); }
int64_t ParameterServer::nonfinite_at_apply() const { return impl_->nonfinite_at_apply(); }

bool PushAccounting::Balanced() const {
  return received == accepted + duplicates + dropped_stale + dropped_backup + rejected_nonfinite + refused +
                         abandoned + in_flight &&
         accepted == applied + skipped_nonfinite + discarded + pending;
}

std::string PushAccounting::DebugString() const {
  return absl::StrCat("received=", received, " accepted=", accepted, " duplicates=", duplicates,
                      " dropped_stale=", dropped_stale, " dropped_backup=", dropped_backup,
                      " rejected_nonfinite=", rejected_nonfinite, " refused=", refused, " abandoned=", abandoned,
                      " in_flight=", in_flight, " applied=", applied, " skipped_nonfinite=", skipped_nonfinite,
                      " partly_applied=", partly_applied,
                      " discarded=", discarded, " pending=", pending, Balanced() ? " (balanced)" : " (UNBALANCED)");
}
int64_t ParameterServer::step() const { return impl_->step(); }
bool ParameterServer::configured() const { return impl_->configured(); }
absl::StatusOr<CheckpointData> ParameterServer::ExportState() { return impl_->ExportState(); }
bool ParameterServer::CheckpointDue(int64_t step) { return impl_->CheckpointDue(step); }
absl::Status ParameterServer::RecordInputPosition(int worker, int64_t step, std::string position) {
  return impl_->RecordInputPosition(worker, step, std::move(position));
}
absl::Status ParameterServer::ImportState(int64_t step, const std::vector<SliceState>& slices, bool save) {
  return impl_->ImportState(step, slices, save);
}

absl::StatusOr<ParameterServerOptions::NonFinite> ParseNonFinitePolicy(absl::string_view name) {
  if (name == "reject") return ParameterServerOptions::NonFinite::kReject;
  if (name == "skip") return ParameterServerOptions::NonFinite::kSkip;
  if (name == "apply") return ParameterServerOptions::NonFinite::kApply;
  return absl::InvalidArgumentError(absl::StrCat("--nonfinite=", name, ": expected reject, skip or apply"));
}

}  // namespace dtrain::ps
