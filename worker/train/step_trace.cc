#include "worker/train/step_trace.h"

#include "absl/strings/str_cat.h"

namespace dtrain::worker {

StepTrace::StepTrace(TraceRecorder* trace, const std::vector<models::VariableInfo>& variables) : trace_(trace) {
  int64_t at = 0;
  for (const models::VariableInfo& v : variables) {
    const size_t slash = v.name.rfind('/');
    names_.emplace(at, slash == std::string::npos ? v.name : v.name.substr(0, slash));
    at += v.size();
  }
}

std::string StepTrace::LayerName(int64_t begin) const {
  auto it = names_.find(begin);
  return it == names_.end() ? absl::StrCat("floats ", begin) : it->second;
}

void StepTrace::Emit(const std::string& name, const char* category, int64_t begin_ns, int64_t end_ns) {
  trace_->Complete(name, category, begin_ns, end_ns, step_);
}

void StepTrace::Begin(int64_t step) {
  recording_ = trace_->InWindow(step);
  if (!recording_) return;
  step_ = step;
  thread_ = std::this_thread::get_id();
  mark_ns_ = TraceRecorder::NowNs();
  pending_.clear();
  backward_ = false;
}

models::StepHooks StepTrace::Hooks(const models::StepHooks& inner) {
  if (!recording_) return inner;
  models::StepHooks h;
  h.before_forward = [this, f = inner.before_forward](int64_t begin, int64_t end) -> absl::Status {
    if (!OnStepThread()) return f ? f(begin, end) : absl::OkStatus();
    const int64_t enter = TraceRecorder::NowNs();
    // What ran since the last mark: the nodes before the first layer, a layer's forward, or (a step of several
    // rounds) the previous round's backward below its first layer.
    Emit(backward_ ? "backward (first nodes)" : pending_.empty() ? "forward (first nodes)" : pending_,
         backward_ ? "backward" : "forward", mark_ns_, enter);
    backward_ = false;
    absl::Status s = f ? f(begin, end) : absl::OkStatus();
    const int64_t exit = TraceRecorder::NowNs();
    const std::string layer = LayerName(begin);
    Emit(absl::StrCat("wait params ", layer), "pull", enter, exit);
    pending_ = absl::StrCat("forward ", layer);
    mark_ns_ = exit;
    return s;
  };
  h.after_forward = [this, f = inner.after_forward](float loss) -> absl::Status {
    if (!OnStepThread()) return f ? f(loss) : absl::OkStatus();
    const int64_t enter = TraceRecorder::NowNs();
    Emit(pending_.empty() ? "forward (first nodes)" : pending_, "forward", mark_ns_, enter);
    absl::Status s = f ? f(loss) : absl::OkStatus();
    const int64_t exit = TraceRecorder::NowNs();
    Emit("loss", "forward", enter, exit);
    backward_ = true;
    mark_ns_ = exit;
    return s;
  };
  h.gradients_ready = [this, f = inner.gradients_ready](int64_t begin, int64_t end) -> absl::Status {
    const bool mine = OnStepThread();
    const int64_t enter = TraceRecorder::NowNs();
    if (mine) Emit(absl::StrCat("backward ", LayerName(begin)), "backward", mark_ns_, enter);
    absl::Status s = f ? f(begin, end) : absl::OkStatus();
    const int64_t exit = TraceRecorder::NowNs();
    Emit(absl::StrCat("push ", LayerName(begin)), "push", enter, exit);
    if (mine) mark_ns_ = exit;
    return s;
  };
  return h;
}

void StepTrace::End() {
  if (!recording_) return;
  if (backward_) Emit("backward (first nodes)", "backward", mark_ns_, TraceRecorder::NowNs());
  recording_ = false;
}

}  // namespace dtrain::worker
