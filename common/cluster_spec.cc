#include "common/cluster_spec.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/file_util.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "nlohmann/json.hpp"

namespace dtrain {
namespace {

using json = nlohmann::json;

constexpr char kJobChief[] = "chief";
constexpr char kJobEvaluator[] = "evaluator";

// Jobs as a source lists them, before validation and chief folding.
using RawJobs = std::map<std::string, std::vector<std::string>>;

// Text for an error message: control characters (a newline...), and bytes beyond ASCII written as C escapes,
// so every message stays one printable line however hostile the input.
std::string Printable(absl::string_view s) {
  std::string out;
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\r') {
      out += "\\r";
    } else if (u < 0x20 || u >= 0x7f) {
      absl::StrAppend(&out, "\\x", absl::Hex(u, absl::kZeroPad2));
    } else {
      out += c;
    }
  }
  return out;
}

// A piece of input, quoted and Printable.
std::string Quoted(absl::string_view s) { return absl::StrCat("'", Printable(s), "'"); }

bool IsHostnameChar(char c) {
  return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.' || c == '_';
}

bool IsIpv6Char(char c) {
  // Hex digits, separators, an embedded IPv4 tail, and a "%zone" suffix (e.g. fe80::1%eth0).
  return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == ':' || c == '.' || c == '%';
}

absl::Status CheckHostChars(absl::string_view address, absl::string_view host, bool ipv6) {
  for (char c : host) {
    if (!(ipv6 ? IsIpv6Char(c) : IsHostnameChar(c))) {
      return absl::InvalidArgumentError(
          absl::StrCat(Quoted(address), " has an invalid character ", Quoted(absl::string_view(&c, 1)),
                       " in its host"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<int> ParsePort(absl::string_view address, absl::string_view port) {
  if (port.empty()) return absl::InvalidArgumentError(absl::StrCat(Quoted(address), " has no port"));
  bool digits = port.size() <= 5 && std::all_of(port.begin(), port.end(), [](char c) {
                  return absl::ascii_isdigit(static_cast<unsigned char>(c));
                });
  int value = 0;
  if (!digits || !absl::SimpleAtoi(port, &value) || value > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(Quoted(address), " has an invalid port ", Quoted(port),
                                                   " (must be an integer 0..65535)"));
  }
  return value;
}

std::string JsonTypeName(const json& j) { return j.type_name(); }

// A JSON value for a message: a scalar as written (shortened), anything else by its type only. Never dump() a
// container: the serializer recurses, and a deeply nested array overflows the stack.
std::string DescribeJson(const json& j) {
  if (j.is_structured()) return JsonTypeName(j);
  std::string text = j.dump();
  if (text.size() > 40) text = text.substr(0, 40) + "...";
  return Printable(text);
}

// nlohmann's message without its "[json.exception.parse_error.101] " prefix, quoted input escaped.
std::string JsonErrorText(const json::exception& e) {
  absl::string_view message = e.what();
  const size_t bracket = message.find("] ");
  if (absl::StartsWith(message, "[") && bracket != absl::string_view::npos) message.remove_prefix(bracket + 2);
  return Printable(message);
}

// Parses JSON; the error names `what` and the parser's position. Every exception of the parser is caught,
// not only syntax errors: a number too large for a double ("1e999") throws out_of_range.
absl::StatusOr<json> ParseJson(absl::string_view text, absl::string_view what) {
  try {
    return json::parse(text.begin(), text.end());
  } catch (const json::parse_error& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " is not valid JSON: ", JsonErrorText(e), " (byte ", e.byte, ")"));
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(what, " is not valid JSON: ", JsonErrorText(e)));
  }
}

// Reads {"job": ["host:port", ...], ...} into `jobs`.
absl::Status JobsFromJson(const json& cluster, absl::string_view what, RawJobs* jobs) {
  if (!cluster.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " must be a JSON object mapping job names to address lists, got ", JsonTypeName(cluster)));
  }
  for (const auto& [job, tasks] : cluster.items()) {
    if (!tasks.is_array()) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": job ", Quoted(job),
                                                     " must be a list of \"host:port\" strings, got ",
                                                     JsonTypeName(tasks)));
    }
    std::vector<std::string>& addresses = (*jobs)[job];
    for (size_t i = 0; i < tasks.size(); ++i) {
      if (!tasks[i].is_string()) {
        return absl::InvalidArgumentError(absl::StrCat(what, ": job ", Quoted(job), " task ", i,
                                                       " must be a \"host:port\" string, got ",
                                                       JsonTypeName(tasks[i])));
      }
      addresses.push_back(tasks[i].get<std::string>());
    }
  }
  return absl::OkStatus();
}

// Validates `jobs` and this task, folds "chief" into "worker", and builds the config.
absl::StatusOr<ClusterConfig> BuildConfig(const RawJobs& jobs, const std::string& job_name,
                                          int task_index, const std::string& source) {
  // Jobs and their addresses.
  std::map<std::string, std::string> seen;  // normalized address → "job 'x' task i"
  for (const auto& [job, addresses] : jobs) {
    if (job != kJobPs && job != kJobWorker && job != kJobChief && job != kJobEvaluator) {
      return absl::InvalidArgumentError(absl::StrCat("unknown job ", Quoted(job), " in ", source,
                                                     "; expected ps, worker, chief or evaluator"));
    }
    if (addresses.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("job ", Quoted(job), " in ", source, " has an empty task list"));
    }
    for (size_t i = 0; i < addresses.size(); ++i) {
      const std::string where = absl::StrCat("job ", Quoted(job), " task ", i);
      auto host_port = SplitHostPort(addresses[i]);
      if (!host_port.ok()) {
        return absl::InvalidArgumentError(absl::StrCat("invalid address for ", where, " in ",
                                                       source, ": ", host_port.status().message()));
      }
      if (host_port->second == 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("invalid address for ", where, " in ", source, ": ", Quoted(addresses[i]),
                         " has port 0; cluster addresses must name the port others connect to"));
      }
      std::string key = absl::StrCat(absl::AsciiStrToLower(host_port->first), "|", host_port->second);
      auto [it, inserted] = seen.emplace(key, where);
      if (!inserted) {
        return absl::InvalidArgumentError(absl::StrCat("duplicate address ", Quoted(addresses[i]), " in ",
                                                       source, ": ", it->second, " and ", where));
      }
    }
  }
  auto job_tasks = [&jobs](const char* job) -> const std::vector<std::string>* {
    auto it = jobs.find(job);
    return it == jobs.end() ? nullptr : &it->second;
  };
  const std::vector<std::string>* chief = job_tasks(kJobChief);
  const std::vector<std::string>* workers = job_tasks(kJobWorker);
  const std::vector<std::string>* ps = job_tasks(kJobPs);
  if (chief != nullptr && chief->size() != 1) {
    return absl::InvalidArgumentError(absl::StrCat("job 'chief' in ", source,
                                                   " must have exactly 1 task, has ", chief->size()));
  }

  // This task.
  if (job_name.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("no job name for this task in ", source,
                     ": pass --job_name (ps or worker) or set TF_CONFIG's task.type"));
  }
  if (job_name == kJobEvaluator) {
    return absl::InvalidArgumentError(absl::StrCat(
        "this task is an 'evaluator' (", source, "); dtrain trains with ps and worker tasks only"));
  }
  if (job_name == kJobLocal) {
    return absl::InvalidArgumentError(absl::StrCat(
        "job 'local' runs without a cluster, but ", source, " lists ", jobs.size(), " job(s)"));
  }
  if (job_name != kJobPs && job_name != kJobWorker && job_name != kJobChief) {
    return absl::InvalidArgumentError(absl::StrCat("unknown job name ", Quoted(job_name), " in ", source,
                                                   "; expected ps, worker, chief or local"));
  }
  const std::vector<std::string>* own = job_tasks(job_name.c_str());
  if (own == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("job ", Quoted(job_name), " is not in the cluster (", source, ")"));
  }
  if (task_index < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("task_index ", task_index, " is negative (", source, ")"));
  }
  // A worker beyond the spec's list joins a running elastic job (dtrain_ps --max_workers decides whether it may).
  const bool joining = job_name == kJobWorker && task_index >= static_cast<int>(own->size());
  if (task_index >= static_cast<int>(own->size()) && !joining) {
    return absl::InvalidArgumentError(absl::StrCat("task_index ", task_index, " out of range: job '",
                                                   job_name, "' has ", own->size(), " task",
                                                   own->size() == 1 ? "" : "s", " (", source, ")"));
  }
  if (ps == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("cluster in ", source, " has no ps tasks; ps/worker training needs at least one"));
  }
  if (workers == nullptr && chief == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("cluster in ", source, " has no worker tasks"));
  }

  ClusterConfig config;
  config.ps = *ps;
  config.chief_folded = chief != nullptr;
  if (chief != nullptr) config.worker = *chief;
  if (workers != nullptr) config.worker.insert(config.worker.end(), workers->begin(), workers->end());
  config.original_job_name = job_name;
  config.original_task_index = task_index;
  config.source = source;
  if (job_name == kJobChief) {
    config.job_name = kJobWorker;
    config.task_index = 0;
  } else if (job_name == kJobWorker && chief != nullptr) {
    config.job_name = kJobWorker;
    config.task_index = task_index + 1;
  } else {
    config.job_name = job_name;
    config.task_index = task_index;
  }
  config.joining = joining;
  return config;
}

ClusterConfig LocalConfig(const std::string& source) {
  ClusterConfig config;
  config.job_name = kJobLocal;
  config.task_index = 0;
  config.original_job_name = kJobLocal;
  config.source = source;
  return config;
}

absl::Status SplitHostList(const std::string& list, absl::string_view flag,
                           std::vector<std::string>* out) {
  if (absl::StripAsciiWhitespace(list).empty()) return absl::OkStatus();
  int position = 0;
  for (absl::string_view entry : absl::StrSplit(list, ',')) {
    ++position;
    entry = absl::StripAsciiWhitespace(entry);
    if (entry.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, "=", Quoted(list), " has an empty entry at position ", position));
    }
    out->emplace_back(entry);
  }
  return absl::OkStatus();
}

}  // namespace

std::string ClusterConfig::address() const {
  if (is_ps() && task_index >= 0 && task_index < num_ps()) return ps[task_index];
  if (is_worker() && task_index >= 0 && task_index < num_workers()) return worker[task_index];
  return "";
}

std::string ClusterConfig::DebugString() const {
  if (is_local()) return absl::StrCat("local (single process, no ps); from ", source);
  std::string out = absl::StrCat(job_name, ":", task_index, is_chief() ? " (chief)" : "",
                                 joining ? absl::StrCat(" (joining: past the spec's ", worker.size(), " workers)")
                                         : absl::StrCat(" at ", address()),
                                 "; ps=[", absl::StrJoin(ps, ","), "] worker=[",
                                 absl::StrJoin(worker, ","), "]; from ", source);
  if (chief_folded) {
    absl::StrAppend(&out, "; TF task ", original_job_name, ":", original_task_index,
                    " (TF chief folded into worker 0, TF worker i is worker i+1)");
  }
  return out;
}

absl::StatusOr<std::pair<std::string, int>> SplitHostPort(absl::string_view address) {
  if (address.empty()) return absl::InvalidArgumentError("empty address");
  if (absl::StrContains(address, "://")) {
    return absl::InvalidArgumentError(
        absl::StrCat(Quoted(address), " must be host:port, without a scheme"));
  }
  absl::string_view host;
  absl::string_view port;
  bool ipv6 = false;
  if (address[0] == '[') {
    ipv6 = true;
    size_t close = address.find(']');
    if (close == absl::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat(Quoted(address), " has no closing ']'"));
    }
    host = address.substr(1, close - 1);
    absl::string_view rest = address.substr(close + 1);
    if (rest.empty()) return absl::InvalidArgumentError(absl::StrCat(Quoted(address), " has no port"));
    if (rest[0] != ':') {
      return absl::InvalidArgumentError(
          absl::StrCat(Quoted(address), " must be '[ipv6]:port', found ", Quoted(rest), " after ']'"));
    }
    port = rest.substr(1);
  } else {
    size_t colon = address.find(':');
    if (colon == absl::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat(Quoted(address), " has no port"));
    }
    if (address.find(':', colon + 1) != absl::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat(
          Quoted(address), " has several ':'; write IPv6 addresses in brackets, e.g. '[::1]:2222'"));
    }
    host = address.substr(0, colon);
    port = address.substr(colon + 1);
  }
  if (host.empty()) return absl::InvalidArgumentError(absl::StrCat(Quoted(address), " has an empty host"));
  RETURN_IF_ERROR(CheckHostChars(address, host, ipv6));
  ASSIGN_OR_RETURN(int port_number, ParsePort(address, port));
  return std::make_pair(std::string(host), port_number);
}

absl::StatusOr<ClusterConfig> ClusterFromFlags(const std::string& ps_hosts,
                                               const std::string& worker_hosts,
                                               const std::string& job_name, int task_index) {
  const std::string source = "--ps_hosts/--worker_hosts";
  RawJobs jobs;
  std::vector<std::string> ps;
  std::vector<std::string> workers;
  RETURN_IF_ERROR(SplitHostList(ps_hosts, "--ps_hosts", &ps));
  RETURN_IF_ERROR(SplitHostList(worker_hosts, "--worker_hosts", &workers));
  if (job_name == kJobLocal && ps.empty() && workers.empty()) return LocalConfig("--job_name=local");
  if (!ps.empty()) jobs[kJobPs] = std::move(ps);
  if (!workers.empty()) jobs[kJobWorker] = std::move(workers);
  return BuildConfig(jobs, job_name, task_index, source);
}

absl::StatusOr<ClusterConfig> ClusterFromJson(absl::string_view json_text,
                                              const std::string& job_name, int task_index,
                                              const std::string& source) {
  ASSIGN_OR_RETURN(json root, ParseJson(json_text, source));
  RawJobs jobs;
  RETURN_IF_ERROR(JobsFromJson(root, source, &jobs));
  if (jobs.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(source, " lists no jobs; expected e.g. "
                                                   "{\"ps\": [\"h:2222\"], \"worker\": [\"h:2223\"]}"));
  }
  return BuildConfig(jobs, job_name, task_index, source);
}

absl::StatusOr<ClusterConfig> ClusterFromJsonFile(const std::string& path,
                                                  const std::string& job_name, int task_index) {
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  return ClusterFromJson(text, job_name, task_index, absl::StrCat("--cluster_spec=", path));
}

absl::StatusOr<ClusterConfig> ClusterFromTfConfig(absl::string_view tf_config,
                                                  const std::string& job_name_override,
                                                  int task_index_override) {
  const std::string source = "TF_CONFIG";
  ASSIGN_OR_RETURN(json root, ParseJson(tf_config, source));
  if (!root.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("TF_CONFIG must be a JSON object, got ", JsonTypeName(root)));
  }
  for (const auto& [key, value] : root.items()) {
    if (key != "cluster" && key != "task" && key != "environment" && key != "rpc_layer") {
      LOG(WARNING) << "TF_CONFIG: ignoring unknown key " << Quoted(key);
    }
  }
  auto cluster = root.find("cluster");
  if (cluster == root.end()) {
    return absl::InvalidArgumentError("TF_CONFIG has no \"cluster\" key");
  }
  RawJobs jobs;
  RETURN_IF_ERROR(JobsFromJson(*cluster, "TF_CONFIG \"cluster\"", &jobs));
  if (jobs.empty()) return absl::InvalidArgumentError("TF_CONFIG \"cluster\" lists no jobs");

  std::string job_name;
  int task_index = 0;
  auto task = root.find("task");
  if (task != root.end()) {
    if (!task->is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat("TF_CONFIG \"task\" must be an object, got ", JsonTypeName(*task)));
    }
    auto type = task->find("type");
    if (type != task->end()) {
      if (!type->is_string()) {
        return absl::InvalidArgumentError(
            absl::StrCat("TF_CONFIG task.type must be a string, got ", JsonTypeName(*type)));
      }
      job_name = type->get<std::string>();
    }
    auto index = task->find("index");
    if (index != task->end()) {
      if (!index->is_number_integer()) {
        return absl::InvalidArgumentError(
            absl::StrCat("TF_CONFIG task.index must be an integer, got ", DescribeJson(*index)));
      }
      int64_t value = index->get<int64_t>();
      if (value > std::numeric_limits<int>::max() || value < std::numeric_limits<int>::min()) {
        return absl::InvalidArgumentError(
            absl::StrCat("TF_CONFIG task.index ", value, " out of range"));
      }
      task_index = static_cast<int>(value);
    }
  }
  if (!job_name_override.empty()) job_name = job_name_override;
  if (task_index_override != -1) task_index = task_index_override;
  if (job_name.empty()) {
    return absl::InvalidArgumentError(
        "TF_CONFIG has no task.type and no --job_name was given; set \"task\": {\"type\": ..., "
        "\"index\": ...}");
  }
  return BuildConfig(jobs, job_name, task_index, source);
}

absl::StatusOr<ClusterConfig> ResolveCluster(const ClusterFlags& flags, absl::string_view tf_config) {
  const bool have_file = !flags.cluster_spec.empty();
  const bool have_hosts = !absl::StripAsciiWhitespace(flags.ps_hosts).empty() ||
                          !absl::StripAsciiWhitespace(flags.worker_hosts).empty();
  const bool have_tf_config = !absl::StripAsciiWhitespace(tf_config).empty();

  if (have_file && have_hosts) {
    return absl::InvalidArgumentError(
        "pass either --cluster_spec or --ps_hosts/--worker_hosts, not both");
  }
  if (have_file || have_hosts) {
    if (have_tf_config) LOG(INFO) << "TF_CONFIG is set but ignored: explicit cluster flags given";
    const char* source = have_file ? "--cluster_spec" : "--ps_hosts/--worker_hosts";
    if (flags.job_name.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("--job_name is required with ", source));
    }
    if (flags.job_name == kJobLocal) {
      return absl::InvalidArgumentError(
          absl::StrCat("--job_name=local runs without a cluster; drop ", source));
    }
    if (flags.task_index == -1) {
      return absl::InvalidArgumentError(absl::StrCat("--task_index is required with ", source,
                                                     " (--job_name=", flags.job_name, ")"));
    }
    if (have_file) return ClusterFromJsonFile(flags.cluster_spec, flags.job_name, flags.task_index);
    return ClusterFromFlags(flags.ps_hosts, flags.worker_hosts, flags.job_name, flags.task_index);
  }
  if (flags.job_name == kJobLocal) {
    if (have_tf_config) LOG(INFO) << "TF_CONFIG is set but ignored: --job_name=local";
    if (flags.task_index > 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--job_name=local has a single task, got --task_index=", flags.task_index));
    }
    return LocalConfig("--job_name=local");
  }
  if (have_tf_config) return ClusterFromTfConfig(tf_config, flags.job_name, flags.task_index);
  return absl::InvalidArgumentError(
      "no cluster given: pass --cluster_spec=FILE.json or --ps_hosts/--worker_hosts with "
      "--job_name/--task_index, set TF_CONFIG, or pass --job_name=local for one process");
}

}  // namespace dtrain
