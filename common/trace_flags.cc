#include "common/trace_flags.h"

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

ABSL_FLAG(
    std::string, trace_steps, "",
    "Record a timeline of global steps A to B (A:B, 0 <= A <= B) as Chrome trace-event JSON in --trace_dir "
    "(Perfetto, chrome://tracing; scripts/merge_traces.py joins a cluster's files; docs/timelines.md)");
ABSL_FLAG(std::string, trace_dir, "", "--trace_steps: the directory of the trace files (made when missing)");

namespace dtrain {

absl::StatusOr<std::unique_ptr<TraceRecorder>> TimelineFromFlags(const std::string& process_name) {
  return TraceRecorderFromFlags(absl::GetFlag(FLAGS_trace_steps), absl::GetFlag(FLAGS_trace_dir),
                                process_name);
}

absl::StatusOr<std::string> WriteTimeline(const TraceRecorder& trace, const std::string& file_stem) {
  const std::string path = absl::StrCat(absl::GetFlag(FLAGS_trace_dir), "/", file_stem, ".trace.json");
  if (absl::Status s = trace.Write(path); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("--trace_dir: ", s.message()));
  }
  return absl::StrCat("timeline of steps ", absl::GetFlag(FLAGS_trace_steps), " (", trace.events(),
                      " events, ", trace.dropped(), " dropped) written to ", path);
}

}  // namespace dtrain
