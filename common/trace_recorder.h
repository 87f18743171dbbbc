// TraceRecorder: a timeline of a window of training steps, written as Chrome trace-event JSON (the
// {"traceEvents": [...]} format of chrome://tracing and Perfetto; `--trace_steps=A:B --trace_dir=DIR` of
// dtrain_worker, dtrain_ps and dtrain_bench; docs/timelines.md). scripts/merge_traces.py puts the files of a
// cluster on one timeline.
//
// What it records: complete events ("ph": "X": a name, a category, a begin and an end on the calling thread),
// each tagged with the step it belongs to; only steps in [first_step, last_step] are kept, and at most
// max_events in all (the rest are counted as dropped). Times are steady_clock (CLOCK_MONOTONIC on Linux, shared
// by the processes of one host), written in microseconds. Metadata events ("ph": "M") name the process and every
// thread that recorded; the file's "otherData" holds the window, the counts and what the caller adds
// (SetMetadata: a worker's measured clock offsets to its ps tasks, SetClockOffset).
//
// Usage:
//   TraceRecorder trace({.first_step = 10, .last_step = 19, .process_name = "worker 0"});
//   trace.SetStep(step);                       // a worker's step loop: the step events without one belong to
//   { TraceSpan span(&trace, "forward", "compute"); ... }          // in the window of the current step
//   { TraceSpan span(&trace, "apply slice 3", "ps", header.step); ... }  // an explicit step (the ps)
//   RETURN_IF_ERROR(trace.Write("/tmp/trace/worker-0.trace.json"));
// Code that may run without a recorder holds a pointer and tests it (TraceSpan does: a null recorder or a step
// outside the window costs a branch and one clock read at most).
//
// Thread-safety: every method may be called from any thread (one mutex guards the events; SetStep and the
// window tests are atomic). Events hold their own copies of names.
#ifndef DTRAIN_COMMON_TRACE_RECORDER_H_
#define DTRAIN_COMMON_TRACE_RECORDER_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace dtrain {

// "A:B" (0 <= A <= B) as the steps [A, B]. InvalidArgument naming what is wrong otherwise.
struct TraceWindow {
  int64_t first = 0, last = 0;
};
absl::StatusOr<TraceWindow> ParseTraceSteps(absl::string_view text);

// --trace_dir: made when missing and checked writable (a file created and removed there). InvalidArgument
// with the reason otherwise.
absl::Status CheckTraceDir(const std::string& dir);

class TraceRecorder {
 public:
  struct Options {
    int64_t first_step = 0;  // the window of steps recorded, inclusive
    int64_t last_step = 0;
    int64_t max_events = 200000;  // events kept at most (about 100 bytes each in memory)
    std::string process_name;     // "worker 0", "ps 1": the process's track in a viewer
  };
  explicit TraceRecorder(Options options);

  // steady_clock now, in nanoseconds (the clock of every event and of the clock exchange). Tests of the clock
  // alignment play a host whose clock differs: the environment variable DTRAIN_TRACE_CLOCK_SKEW_NS (read once)
  // is added to it.
  static int64_t NowNs();

  bool InWindow(int64_t step) const { return step >= options_.first_step && step <= options_.last_step; }
  // The step in progress (the worker's loop sets it), for events that do not name a step.
  void SetStep(int64_t step) { step_.store(step, std::memory_order_relaxed); }
  int64_t step() const { return step_.load(std::memory_order_relaxed); }
  // The current step is in the window.
  bool active() const { return InWindow(step()); }

  // Records [begin_ns, end_ns] on the calling thread as a step `step` event, when the step is in the window
  // and the cap allows. `detail` (may be empty) goes into the event's args.
  void Complete(absl::string_view name, absl::string_view category, int64_t begin_ns, int64_t end_ns, int64_t step,
                absl::string_view detail = {});
  // Names the calling thread's track (the first name given to a thread stays).
  void NameThread(absl::string_view name);
  // A string or number for the file's "otherData" (the last value given to a key stays).
  void SetMetadata(const std::string& key, const std::string& value);
  // This process's clock minus ps task `task`'s, as measured over a round trip (offset_ns: the ps's clock at
  // its answer minus the midpoint of the request's send and the answer's arrival here; rtt_ns: that round
  // trip). merge_traces.py moves this process's events onto ps 0's clock with task 0's offset.
  void SetClockOffset(int task, int64_t offset_ns, int64_t rtt_ns);

  int64_t events() const;   // kept
  int64_t dropped() const;  // in the window but over max_events

  // The trace as JSON text.
  std::string ToJson() const;
  // Writes ToJson() to `path` (through a temporary file renamed into place). The error names the path.
  absl::Status Write(const std::string& path) const;

 private:
  struct Event {
    std::string name, category, detail;
    int64_t begin_ns, end_ns, step;
    int tid;
  };
  const Options options_;
  const int pid_;
  std::atomic<int64_t> step_{-1};
  mutable absl::Mutex mu_;
  std::vector<Event> events_ ABSL_GUARDED_BY(mu_);
  int64_t dropped_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<int, std::string> thread_names_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::string> metadata_ ABSL_GUARDED_BY(mu_);
  struct Offset {
    int64_t offset_ns, rtt_ns;
  };
  std::map<int, Offset> offsets_ ABSL_GUARDED_BY(mu_);
};

// The recorder of a binary's --trace_steps=A:B and --trace_dir=DIR flags: null when neither is given;
// InvalidArgument (naming the flag) when only one is, or either is bad. The directory is made when missing.
absl::StatusOr<std::unique_ptr<TraceRecorder>> TraceRecorderFromFlags(absl::string_view steps, const std::string& dir,
                                                                      std::string process_name);

// Times its scope as one event, when `trace` is set and the step (the recorder's current one when not given)
// is in the window; otherwise it reads no clock and copies nothing (a name built for it, absl::StrCat, is still
// built: hot paths test recording conditions first).
class TraceSpan {
 public:
  TraceSpan(TraceRecorder* trace, absl::string_view name, absl::string_view category)
      : TraceSpan(trace, name, category, trace != nullptr ? trace->step() : 0) {}
  TraceSpan(TraceRecorder* trace, absl::string_view name, absl::string_view category, int64_t step)
      : trace_(trace != nullptr && trace->InWindow(step) ? trace : nullptr), step_(step),
        begin_ns_(trace_ != nullptr ? TraceRecorder::NowNs() : 0) {
    if (trace_ != nullptr) name_.assign(name.data(), name.size()), category_.assign(category.data(), category.size());
  }
  ~TraceSpan() {
    if (trace_ != nullptr) trace_->Complete(name_, category_, begin_ns_, TraceRecorder::NowNs(), step_, detail_);
  }
  TraceSpan(const TraceSpan&) = delete;
  TraceSpan& operator=(const TraceSpan&) = delete;
  bool recording() const { return trace_ != nullptr; }
  void set_detail(std::string detail) { detail_ = std::move(detail); }

 private:
  TraceRecorder* const trace_;
  std::string name_, category_;  // copied only when recording
  const int64_t step_;
  const int64_t begin_ns_;
  std::string detail_;
};

}  // namespace dtrain

#endif  // DTRAIN_COMMON_TRACE_RECORDER_H_
