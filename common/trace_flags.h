// The timeline flags dtrain_ps and dtrain_worker define alike, --trace_steps=A:B and --trace_dir=DIR
// (docs/timelines.md), and the recorder and file they give. Defined here, once for both binaries; link this
// library only into binaries that define no flag of these names (dtrain_bench defines its own).
//
// Usage, in main() once the command line is parsed:
//   absl::StatusOr<std::unique_ptr<dtrain::TraceRecorder>> trace = dtrain::TimelineFromFlags("ps 0");
//   ... (null when --trace_steps is not given) ...
//   absl::StatusOr<std::string> written = dtrain::WriteTimeline(**trace, "ps-0");  // DIR/ps-0.trace.json
//
// Thread-safety: both read flags; call them from main() once the command line is parsed.
#ifndef DTRAIN_COMMON_TRACE_FLAGS_H_
#define DTRAIN_COMMON_TRACE_FLAGS_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/trace_recorder.h"

namespace dtrain {

// The recorder of --trace_steps and --trace_dir for the process named `process_name` in the timeline ("ps 0",
// "worker 1"): TraceRecorderFromFlags (trace_recorder.h): null when neither flag is given, InvalidArgument
// naming the flag when only one is or either is bad; the directory is made when missing.
absl::StatusOr<std::unique_ptr<TraceRecorder>> TimelineFromFlags(const std::string& process_name);

// Writes `trace` to --trace_dir/<file_stem>.trace.json and returns the line that says so: "timeline of steps
// <--trace_steps> (<N> events, <M> dropped) written to <path>". Errors: TraceRecorder::Write's, the message
// prefixed "--trace_dir: ".
absl::StatusOr<std::string> WriteTimeline(const TraceRecorder& trace, const std::string& file_stem);

}  // namespace dtrain

#endif  // DTRAIN_COMMON_TRACE_FLAGS_H_
