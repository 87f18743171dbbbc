// dtrain_bench_trace_recorder: what one recording site of a timeline (common/trace_recorder.h) costs, in the
// thread's CPU time (a machine shared with other work still gives what one core does): a TraceSpan with no
// recorder (tracing off), with a recorder whose window excludes the step, and recording. Checks what it recorded
// (the events kept must be exactly the recording passes'; a mismatch counts in "#wrong" and fails the run).
//
//   dtrain_bench_trace_recorder [--spans=1000000]
//   → tracing off (no recorder): 3.2 ns per site ... #wrong=0
#include <time.h>

#include <cstdio>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "common/trace_recorder.h"

ABSL_FLAG(int, spans, 1000000, "Sites passed per measurement");

namespace {

double ThreadCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int n = absl::GetFlag(FLAGS_spans);
  dtrain::TraceRecorder recording({.first_step = 0, .last_step = 1, .max_events = n, .process_name = "bench"});
  dtrain::TraceRecorder outside({.first_step = 5, .last_step = 5, .max_events = n, .process_name = "bench"});
  auto time = [n](dtrain::TraceRecorder* trace, const char* what) {
    const double t0 = ThreadCpuSeconds();
    for (int i = 0; i < n; ++i) dtrain::TraceSpan span(trace, "forward conv1", "forward", /*step=*/1);
    const double ns = (ThreadCpuSeconds() - t0) * 1e9 / n;
    std::printf("%-40s %8.1f ns per site\n", what, ns);
  };
  time(nullptr, "tracing off (no recorder):");
  time(&outside, "a recorder, the step outside its window:");
  time(&recording, "recording:");
  const int64_t wrong = (recording.events() != n) + (outside.events() != 0) + (recording.dropped() != 0);
  std::printf("events kept %lld of %d, #wrong=%lld\n", static_cast<long long>(recording.events()), n,
              static_cast<long long>(wrong));
  return wrong == 0 ? 0 : 1;
}
