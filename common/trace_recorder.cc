#include "common/trace_recorder.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <system_error>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/file_util.h"

namespace dtrain {
namespace {

using json = nlohmann::json;

// A small number per thread of the process, for the trace's "tid" (the same in every recorder).
int ThisThreadId() {
  static std::atomic<int> next{1};
  thread_local const int id = next.fetch_add(1);
  return id;
}

}  // namespace

absl::StatusOr<TraceWindow> ParseTraceSteps(absl::string_view text) {
  const std::vector<absl::string_view> parts = absl::StrSplit(text, ':');
  TraceWindow w;
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &w.first) || !absl::SimpleAtoi(parts[1], &w.last)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--trace_steps='", text, "': give the first and last step to trace as A:B (say 10:29)"));
  }
  if (w.first < 0 || w.last < w.first) {
    return absl::InvalidArgumentError(absl::StrCat("--trace_steps=", text,
                                                   ": the steps must satisfy 0 <= A <= B (got A=", w.first,
                                                   ", B=", w.last, ")"));
  }
  return w;
}

absl::Status CheckTraceDir(const std::string& dir) {
  if (dir.empty()) return absl::InvalidArgumentError("--trace_dir is empty: name a directory for the trace files");
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return absl::InvalidArgumentError(absl::StrCat("--trace_dir=", dir, ": cannot create it: ", ec.message()));
  }
  if (!std::filesystem::is_directory(dir, ec)) {
    return absl::InvalidArgumentError(absl::StrCat("--trace_dir=", dir, ": not a directory"));
  }
  const std::string probe = absl::StrCat(dir, "/.trace_probe.", getpid());
  std::FILE* f = std::fopen(probe.c_str(), "w");
  if (f == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("--trace_dir=", dir, ": not writable (",
                                                   std::generic_category().message(errno), ")"));
  }
  std::fclose(f);
  std::remove(probe.c_str());
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<TraceRecorder>> TraceRecorderFromFlags(absl::string_view steps, const std::string& dir,
                                                                      std::string process_name) {
  if (steps.empty() && dir.empty()) return nullptr;
  if (steps.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("--trace_dir=", dir, " without --trace_steps: say which steps to "
                                                   "trace (--trace_steps=A:B)"));
  }
  if (dir.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("--trace_steps=", steps, " without --trace_dir: say where the "
                                                   "trace files go"));
  }
  absl::StatusOr<TraceWindow> window = ParseTraceSteps(steps);
  if (!window.ok()) return window.status();
  if (absl::Status s = CheckTraceDir(dir); !s.ok()) return s;
  TraceRecorder::Options o;
  o.first_step = window->first;
  o.last_step = window->last;
  o.process_name = std::move(process_name);
  return std::make_unique<TraceRecorder>(std::move(o));
}

TraceRecorder::TraceRecorder(Options options) : options_(std::move(options)), pid_(getpid()) {}

int64_t TraceRecorder::NowNs() {
  static const int64_t skew = [] {
    const char* v = std::getenv("DTRAIN_TRACE_CLOCK_SKEW_NS");
    int64_t ns = 0;
    return v != nullptr && absl::SimpleAtoi(v, &ns) ? ns : int64_t{0};
  }();
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
             .count() +
         skew;
}

void TraceRecorder::Complete(absl::string_view name, absl::string_view category, int64_t begin_ns, int64_t end_ns,
                             int64_t step, absl::string_view detail) {
  if (!InWindow(step)) return;
  const int tid = ThisThreadId();
  absl::MutexLock lock(&mu_);
  if (static_cast<int64_t>(events_.size()) >= options_.max_events) {
    ++dropped_;
    return;
  }
  events_.push_back(
      {std::string(name), std::string(category), std::string(detail), begin_ns, std::max(begin_ns, end_ns), step, tid});
}

void TraceRecorder::NameThread(absl::string_view name) {
  const int tid = ThisThreadId();
  absl::MutexLock lock(&mu_);
  thread_names_.try_emplace(tid, std::string(name));
}

void TraceRecorder::SetMetadata(const std::string& key, const std::string& value) {
  absl::MutexLock lock(&mu_);
  metadata_[key] = value;
}

void TraceRecorder::SetClockOffset(int task, int64_t offset_ns, int64_t rtt_ns) {
  absl::MutexLock lock(&mu_);
  offsets_[task] = {offset_ns, rtt_ns};
}

int64_t TraceRecorder::events() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(events_.size());
}

int64_t TraceRecorder::dropped() const {
  absl::MutexLock lock(&mu_);
  return dropped_;
}

std::string TraceRecorder::ToJson() const {
  absl::MutexLock lock(&mu_);
  json events = json::array();
  events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", pid_}, {"tid", 0},
                    {"args", {{"name", options_.process_name}}}});
  for (const auto& [tid, name] : thread_names_) {
    events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", pid_}, {"tid", tid}, {"args", {{"name", name}}}});
  }
  for (const Event& e : events_) {
    json args = {{"step", e.step}};
    if (!e.detail.empty()) args["detail"] = e.detail;
    events.push_back({{"name", e.name},
                      {"cat", e.category},
                      {"ph", "X"},
                      {"pid", pid_},
                      {"tid", e.tid},
                      {"ts", static_cast<double>(e.begin_ns) / 1e3},
                      {"dur", static_cast<double>(e.end_ns - e.begin_ns) / 1e3},
                      {"args", args}});
  }
  json offsets = json::array();
  for (const auto& [task, o] : offsets_) {
    offsets.push_back({{"ps_task", task}, {"offset_ns", o.offset_ns}, {"rtt_ns", o.rtt_ns}});
  }
  json other = {{"format", "dtrain-trace"},
                {"version", 1},
                {"process", options_.process_name},
                {"pid", pid_},
                {"clock", "steady_clock (CLOCK_MONOTONIC), microseconds"},
                {"first_step", options_.first_step},
                {"last_step", options_.last_step},
                {"events", events_.size()},
                {"dropped_events", dropped_},
                {"max_events", options_.max_events},
                {"clock_offsets", offsets}};
  for (const auto& [key, value] : metadata_) other[key] = value;
  json j = {{"traceEvents", events}, {"displayTimeUnit", "ms"}, {"otherData", other}};
  return j.dump();
}

absl::Status TraceRecorder::Write(const std::string& path) const { return WriteFileAtomically(path, ToJson()); }

}  // namespace dtrain
