#include "worker/train/resident_steps.h"

#include <glog/logging.h>

#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace dtrain::worker {

using kernels::Queue;

absl::StatusOr<std::unique_ptr<ResidentSteps>> ResidentSteps::Create(Towers* towers, ps::ParameterServer* ps,
                                                                     const kernels::OptimizerParams& params,
                                                                     const ResidentStepsOptions& options) {
  if (towers == nullptr || ps == nullptr)
    return absl::InvalidArgumentError("ResidentSteps: no towers or no ps");
  if (towers->host_resident()) {
    return absl::InvalidArgumentError("ResidentSteps: the towers compute in place on the host buffers");
  }
  if (options.loss_ring < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("ResidentSteps: loss_ring must be >= 1, got ", options.loss_ring));
  }
  std::unique_ptr<ResidentSteps> r(new ResidentSteps(towers, ps, options));
  for (int t = 0; t < towers->size(); ++t) r->devices_.push_back(towers->device(t));
  ASSIGN_OR_RETURN(r->state_, DeviceState::Create(towers, params));
  for (kernels::Device* dev : r->devices_) {
    ASSIGN_OR_RETURN(float* ring, dev->Alloc(options.loss_ring));
    r->rings_.push_back(ring);
    RETURN_IF_ERROR(dev->Fill(0.0f, ring, options.loss_ring));
    ASSIGN_OR_RETURN(std::unique_ptr<kernels::AsyncReadback> reader,
                     kernels::AsyncReadback::Create(dev, options.loss_ring));
    r->ring_readers_.push_back(std::move(reader));
    ASSIGN_OR_RETURN(std::unique_ptr<kernels::Event> ready, dev->MakeEvent());
    r->inputs_ready_.push_back(std::move(ready));
  }
  ASSIGN_OR_RETURN(r->replayed_, r->devices_[0]->MakeEvent());
  r->try_graph_ = options.cuda_graphs && towers->gpu();
  return r;
}

ResidentSteps::~ResidentSteps() {
  for (kernels::Device* dev : devices_) (void)dev->Synchronize();
  graph_.reset();
  ring_readers_.clear();
  for (size_t t = 0; t < rings_.size(); ++t) devices_[t]->Free(rings_[t]);
  state_.reset();
}

absl::StatusOr<ps::PullResult> ResidentSteps::Start() {
  ASSIGN_OR_RETURN(ps::CheckpointData state, ps_->ExportState());
  RETURN_IF_ERROR(state_->Load(state));
  step_ = state.global_step;
  return ps::PullResult{step_, false};
}

absl::Status ResidentSteps::StageInputs(const std::vector<models::HostBatch>& batches) {
  const int n = towers_->size();
  // Tower t's inputs are read by the last graph replay (launched on tower 0's stream) until it ends.
  for (int t = 1; t < n; ++t) RETURN_IF_ERROR(devices_[t]->WaitEvent(replayed_.get(), Queue::kCompute));
  RETURN_IF_ERROR(towers_->StageInputs(batches));
  // ... and the step (a replay on tower 0's stream, or eager work that the averages tie together) reads them.
  for (int t = 1; t < n; ++t) {
    RETURN_IF_ERROR(devices_[t]->RecordEvent(inputs_ready_[t].get(), Queue::kCompute));
    RETURN_IF_ERROR(devices_[0]->WaitEvent(inputs_ready_[t].get(), Queue::kCompute));
  }
  return absl::OkStatus();
}

absl::Status ResidentSteps::EnqueueStep() {
  RETURN_IF_ERROR(towers_->EnqueueGradients(nullptr));
  if (kernels::GradientAverager* averager = towers_->averager(); averager != nullptr) {
    RETURN_IF_ERROR(averager->Join());
  }
  RETURN_IF_ERROR(state_->EnqueueUpdates());
  // The counter holds the step just applied: its loss goes into that slot, then the counter moves on (dropout
  // and the optimizer of the next step read the new value).
  for (int t = 0; t < towers_->size(); ++t) {
    kernels::DeviceCounter* counter = towers_->step_counter(t);
    RETURN_IF_ERROR(devices_[t]->CopyToCounterSlot(towers_->tower(t)->device_loss(), rings_[t],
                                                   options_.loss_ring, *counter));
    RETURN_IF_ERROR(counter->Increment());
  }
  return absl::OkStatus();
}

absl::Status ResidentSteps::Capture() {
  RETURN_IF_ERROR(kernels::BeginCaptureGroup(devices_));
  const absl::Status body = EnqueueStep();
  absl::StatusOr<std::unique_ptr<kernels::Graph>> graph = kernels::EndCaptureGroup(devices_);
  RETURN_IF_ERROR(body);  // captured, not run: the eager step runs instead
  if (!graph.ok()) return graph.status();
  graph_ = *std::move(graph);
  return absl::OkStatus();
}

absl::Status ResidentSteps::Step(const std::vector<models::HostBatch>& batches, int64_t step) {
  if (step != step_) {
    return absl::FailedPreconditionError(absl::StrCat("ResidentSteps: a step for global step ", step,
                                                      ", but the devices are at step ", step_));
  }
  RETURN_IF_ERROR(state_->UseMovingAverages(false));  // after an evaluation with the averages
  RETURN_IF_ERROR(StageInputs(batches));
  // The first step runs eagerly (libraries load their kernels lazily); the second is captured.
  if (try_graph_ && local_steps_ > 0) {
    try_graph_ = false;
    if (absl::Status s = Capture(); s.ok()) {
      LOG(INFO) << "the training step is a CUDA graph over " << devices_.size()
                << " tower(s), replayed every step";
    } else {
      LOG(WARNING) << "CUDA graphs off, steps run eagerly: " << s.message();
    }
  }
  if (graph_ != nullptr) {
    RETURN_IF_ERROR(graph_->Launch());
    RETURN_IF_ERROR(devices_[0]->RecordEvent(replayed_.get(), Queue::kCompute));
  } else {
    RETURN_IF_ERROR(EnqueueStep());
  }
  ++step_;
  ++local_steps_;
  if (++pending_ >= options_.loss_ring) RETURN_IF_ERROR(DrainLosses());
  // The ps owns the checkpoint schedule: when a save is due, it gets the state (the one host copy of it).
  if (ps_->CheckpointDue(step_)) {
    ASSIGN_OR_RETURN(std::vector<ps::SliceState> slices, state_->Export());
    RETURN_IF_ERROR(ps_->ImportState(step_, slices, /*save=*/true));
  }
  return absl::OkStatus();
}

absl::Status ResidentSteps::DrainLosses() {
  if (pending_ == 0) return absl::OkStatus();
  const int n = towers_->size();
  std::vector<const float*> rings(n);
  for (int t = 0; t < n; ++t) {
    if (t > 0) RETURN_IF_ERROR(devices_[t]->WaitEvent(replayed_.get(), Queue::kCompute));
    RETURN_IF_ERROR(ring_readers_[t]->Start(rings_[t]));
  }
  for (int t = 0; t < n; ++t) {
    ASSIGN_OR_RETURN(rings[t], ring_readers_[t]->Wait());
  }
  const int64_t first = step_ - pending_;
  pending_ = 0;
  for (int64_t s = first; s < step_; ++s) {
    const int64_t k = s % options_.loss_ring;
    float loss = rings[0][k];
    if (n > 1) {
      // The mean over the towers, as Towers::ComputeGradients forms it.
      double sum = 0;
      for (int t = 0; t < n; ++t) sum += rings[t][k];
      loss = static_cast<float>(sum / n);
    }
    if (!std::isfinite(loss)) {
      return absl::InternalError(absl::StrCat("loss is ", loss, " at step ", s,
                                              ": training diverged (try a smaller --learning_rate)"));
    }
    losses_.push_back(loss);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<float>> ResidentSteps::TakeLosses() {
  RETURN_IF_ERROR(DrainLosses());
  return std::exchange(losses_, {});
}

absl::StatusOr<ps::PullResult> ResidentSteps::Settle() {
  for (kernels::Device* dev : devices_) RETURN_IF_ERROR(dev->Synchronize());
  return ps::PullResult{step_, false};
}

absl::Status ResidentSteps::LoadParameters(bool moving_averages) {
  return state_->UseMovingAverages(moving_averages);
}

absl::StatusOr<std::vector<float>> ResidentSteps::Parameters() { return state_->ExportValues(); }

absl::Status ResidentSteps::Finish() {
  ASSIGN_OR_RETURN(std::vector<ps::SliceState> slices, state_->Export());
  return ps_->ImportState(step_, slices, /*save=*/false);
}

}  // namespace dtrain::worker
