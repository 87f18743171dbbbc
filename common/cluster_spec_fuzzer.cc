// libFuzzer harness for the cluster spec parsers (common/cluster_spec.h): JSON files, TF_CONFIG, the host
// flags and host:port splitting. Beyond "no crash, no sanitizer report", it checks the header's contract:
// an error is InvalidArgument with one line of text; a config that parses is consistent.
//
// Input: a first line "<source> <job_name> <task_index>" (missing words: "", -1), then the payload:
//   json       ClusterFromJson(payload, job_name, task_index)
//   tf_config  ClusterFromTfConfig(payload, job_name, task_index)
//   flags      ClusterFromFlags(payload's first line, its second line, job_name, task_index)
//   hostport   SplitHostPort(payload)
//   resolve    ResolveCluster({ps_hosts/worker_hosts from the payload's first two lines, job_name,
//              task_index}, TF_CONFIG = the rest of the payload)
// Seeds: fuzz/seeds/cluster_spec_fuzzer/.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "common/cluster_spec.h"
#include "glog/logging.h"

namespace dtrain {
namespace {

void CheckError(const absl::Status& s) {
  CHECK(absl::IsInvalidArgument(s)) << s;
  CHECK(!s.message().empty());
  CHECK(s.message().find('\n') == absl::string_view::npos) << "not one line: " << s;
}

void CheckConfig(const absl::StatusOr<ClusterConfig>& c) {
  if (!c.ok()) {
    CheckError(c.status());
    return;
  }
  if (c->is_local()) {
    CHECK(c->ps.empty() && c->worker.empty());
    return;
  }
  CHECK(c->is_ps() || c->is_worker()) << c->job_name;
  CHECK(!c->ps.empty() && !c->worker.empty());
  CHECK_GE(c->task_index, 0);
  if (c->joining) {
    // A worker past the spec's list (it joins an elastic job): no address of its own.
    CHECK(c->is_worker());
    CHECK_GE(c->task_index, c->num_workers());
    CHECK(c->address().empty());
  } else {
    CHECK_LT(c->task_index, c->is_ps() ? c->num_ps() : c->num_workers());
    CHECK(!c->address().empty());
  }
  for (const std::vector<std::string>* job : {&c->ps, &c->worker}) {
    for (const std::string& a : *job) {
      absl::StatusOr<std::pair<std::string, int>> hp = SplitHostPort(a);
      CHECK(hp.ok()) << a << ": " << hp.status();
      CHECK_GT(hp->second, 0);
    }
  }
  CHECK(!c->DebugString().empty());
}

}  // namespace
}  // namespace dtrain

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dtrain;  // NOLINT
  const absl::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t newline = input.find('\n');
  const absl::string_view header = input.substr(0, newline);
  const absl::string_view payload = newline == absl::string_view::npos ? "" : input.substr(newline + 1);
  const std::vector<absl::string_view> words = absl::StrSplit(header, ' ');
  const absl::string_view source = words[0];
  const std::string job_name = words.size() > 1 ? std::string(words[1]) : "";
  int task_index = -1;
  if (words.size() > 2 && !absl::SimpleAtoi(words[2], &task_index)) task_index = -1;
  const std::vector<absl::string_view> lines = absl::StrSplit(payload, absl::MaxSplits('\n', 2));

  if (source == "json") {
    CheckConfig(ClusterFromJson(payload, job_name, task_index));
  } else if (source == "tf_config") {
    CheckConfig(ClusterFromTfConfig(payload, job_name, task_index));
  } else if (source == "flags") {
    CheckConfig(ClusterFromFlags(std::string(lines[0]), lines.size() > 1 ? std::string(lines[1]) : "",
                                 job_name, task_index));
  } else if (source == "hostport") {
    absl::StatusOr<std::pair<std::string, int>> hp = SplitHostPort(payload);
    if (hp.ok()) {
      CHECK(!hp->first.empty());
      CHECK(hp->second >= 0 && hp->second <= 65535);
    } else {
      CheckError(hp.status());
    }
  } else if (source == "resolve") {
    ClusterFlags flags;
    flags.ps_hosts = std::string(lines[0]);
    flags.worker_hosts = lines.size() > 1 ? std::string(lines[1]) : "";
    flags.job_name = job_name;
    flags.task_index = task_index;
    CheckConfig(ResolveCluster(flags, lines.size() > 2 ? lines[2] : ""));
  }
  return 0;
}
