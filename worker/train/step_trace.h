// StepTrace: one step's parts on the timeline (--trace_steps; common/trace_recorder.h), from the hooks a step
// already has (models::StepHooks): each layer's forward and backward (the time between the hooks), the wait for
// its parameters before its forward (the pull), the loss check, and the hand-over of each layer's gradients to
// the push (gradients_ready). The parts of the step's thread tile its compute: forward of a layer runs from its
// parameters' arrival to the next layer's wait, backward of a layer from the previous hand-over to its own.
//
// Usage (StepRunner):
//   StepTrace trace(recorder, towers->tower(0)->variables());
//   trace.Begin(step);
//   models::StepHooks traced = trace.Hooks(hooks);   // valid while `trace` lives
//   ... ComputeGradients(..., &traced) ...
//   trace.End();
//
// Thread-safety: Begin, End and the hooks' calls on the thread that called Begin are that thread's; hooks
// called from other threads (towers) record only their own call, not the time around it.
#ifndef DTRAIN_WORKER_TRAIN_STEP_TRACE_H_
#define DTRAIN_WORKER_TRAIN_STEP_TRACE_H_

#include <cstdint>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "common/trace_recorder.h"
#include "worker/models/model.h"

namespace dtrain::worker {

class StepTrace {
 public:
  // `trace` not owned, not null. Layers are named after their first variable ("conv1/w" -> "conv1").
  StepTrace(TraceRecorder* trace, const std::vector<models::VariableInfo>& variables);

  // The step's compute begins on this thread (the step is the recorder's when in its window; nothing is
  // recorded otherwise).
  void Begin(int64_t step);
  models::StepHooks Hooks(const models::StepHooks& inner);
  void End();

 private:
  std::string LayerName(int64_t begin) const;
  void Emit(const std::string& name, const char* category, int64_t begin_ns, int64_t end_ns);
  bool OnStepThread() const { return recording_ && std::this_thread::get_id() == thread_; }

  TraceRecorder* const trace_;
  std::map<int64_t, std::string> names_;  // a variable's flat offset -> its layer's name
  bool recording_ = false;
  int64_t step_ = 0;
  std::thread::id thread_;
  int64_t mark_ns_ = 0;    // where the part in progress began
  std::string pending_;    // the part in progress ("forward conv1"); empty: before the first layer
  bool backward_ = false;  // past the loss
};

}  // namespace dtrain::worker

#endif  // DTRAIN_WORKER_TRAIN_STEP_TRACE_H_
