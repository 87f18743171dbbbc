// dtrain_ctl: an operator's commands to a running job, over the cluster's authenticated gRPC channel (the token and
// TLS flags of dtrain_ps and dtrain_worker).
//
//   dtrain_ctl --ps_hosts=h0:2222,h1:2222 status            the membership table and the ps tasks
//   dtrain_ctl --ps_hosts=... remove-worker 3               worker 3 leaves at its next call; the run goes on
//   dtrain_ctl --ps_hosts=... drain                         the run ends here: every task saves, the workers stop
//   dtrain_ctl --ps_hosts=... add-ps h2:2222                a started ps task joins at the next step boundary
//   dtrain_ctl --ps_hosts=... remove-ps 2                   ps task 2 leaves at the next step boundary
//
// The cluster comes from --ps_hosts, --cluster_spec or TF_CONFIG as for the other binaries. A refusal is one line
// on stderr and exit 2 (a bad command or argument) or 1 (the job refused it, or could not be reached).
#include <cstdio>
#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/cluster_spec.h"
#include "common/command_line.h"
#include "ps/api/ps_interface.h"
#include "ps/rpc/grpc_ps_client.h"
#include "ps/rpc/grpc_security.h"

ABSL_FLAG(std::string, ps_hosts, "", "Comma-separated host:port of the ps tasks");
ABSL_FLAG(std::string, worker_hosts, "", "Comma-separated host:port of the worker tasks (optional)");
ABSL_FLAG(std::string, cluster_spec, "", "JSON file {\"ps\": [...], \"worker\": [...]} (else flags or TF_CONFIG)");
ABSL_FLAG(std::string, auth_token_file, "", "The cluster's secret token (as the ps tasks were given)");
ABSL_FLAG(std::string, tls_cert, "", "Client certificate chain (PEM; with --tls_key), when the ps tasks require one");
ABSL_FLAG(std::string, tls_key, "", "The private key of --tls_cert (PEM)");
ABSL_FLAG(std::string, tls_ca, "", "Talk TLS to the ps tasks and trust only certificates signed by this CA (PEM)");
ABSL_FLAG(std::string, tls_server_name, "", "Expect this name in the ps certificates (default: each address's host)");
ABSL_FLAG(double, timeout_secs, 10, "How long each call to a ps task may take");
ABSL_FLAG(double, rate_secs, 1, "status: the examples/sec column is measured over this many seconds (0: none)");

namespace {

constexpr char kUsage[] =
    "commands:\n"
    "  status              the workers (task, state, since step, steps applied, steps/sec) and the ps tasks (step,\n"
    "                      rows held)\n"
    "  remove-worker K     worker K leaves the job at its next call (exit 0 for it); the run goes on without it\n"
    "  drain               the run ends here: every ps task saves its state as its final checkpoint and tells the\n"
    "                      workers to stop (a later launch resumes from it)\n"
    "  add-ps ADDR         the ps task started at ADDR (dtrain_ps --join does this itself) joins at the next step\n"
    "                      boundary: every task saves that step and takes its share of it, resharded (sync jobs)\n"
    "  remove-ps P         ps task P (not 0) leaves at the next step boundary, its share moving to the others\n"
    "                      (the last task takes its index)\n"
    "exit codes: 0 done, 1 the job refused it or could not be reached, 2 a bad command line";

int Fail(const std::string& line, int code) {
  std::fprintf(stderr, "dtrain_ctl: %s\n", line.c_str());
  return code;
}

const char* StateOf(const dtrain::ps::WorkerStats& w) {
  if (w.lost) return "lost";
  if (!w.done) return "active";
  return dtrain::ps::LeavingName(w.leaving);
}

}  // namespace

int main(int argc, char** argv) {
  dtrain::CommandLineSpec spec;
  spec.program = "dtrain_ctl";
  spec.summary = "commands to a running job: status, remove-worker K, drain, add-ps ADDR, remove-ps P";
  spec.epilogue = kUsage;
  spec.positional_args = true;
  const dtrain::ParsedCommandLine parsed = dtrain::ParseCommandLineOrExit(argc, argv, spec);
  const std::vector<std::string>& args = parsed.positional;
  if (args.empty()) return Fail(absl::StrCat("no command: status, remove-worker K, drain, add-ps ADDR or remove-ps P (--help)"), 2);
  const std::string& command = args[0];

  dtrain::ClusterFlags cf;
  cf.cluster_spec = absl::GetFlag(FLAGS_cluster_spec);
  cf.ps_hosts = absl::GetFlag(FLAGS_ps_hosts);
  cf.worker_hosts = absl::GetFlag(FLAGS_worker_hosts);
  if (cf.worker_hosts.empty() && !cf.ps_hosts.empty()) cf.worker_hosts = "127.0.0.1:1";  // only the ps list matters
  cf.job_name = "ps";
  cf.task_index = 0;
  const char* tf_config = std::getenv("TF_CONFIG");
  absl::StatusOr<dtrain::ClusterConfig> cluster = dtrain::ResolveCluster(cf, tf_config ? tf_config : "");
  if (!cluster.ok()) return Fail(absl::StrCat("bad cluster spec: ", cluster.status().message()), 2);

  int worker = -1, ps_task = -1;
  if (command == "remove-worker") {
    if (args.size() != 2 || !absl::SimpleAtoi(args[1], &worker) || worker < 0) {
      return Fail("remove-worker takes one worker index >= 0 (remove-worker 3)", 2);
    }
  } else if (command == "add-ps") {
    if (args.size() != 2 || args[1].find(':') == std::string::npos) {
      return Fail("add-ps takes the new ps task's host:port (add-ps h2:2222)", 2);
    }
  } else if (command == "remove-ps") {
    if (args.size() != 2 || !absl::SimpleAtoi(args[1], &ps_task) || ps_task < 0) {
      return Fail("remove-ps takes one ps task index >= 0 (remove-ps 2)", 2);
    }
  } else if ((command == "status" || command == "drain") && args.size() != 1) {
    return Fail(absl::StrCat(command, " takes no argument"), 2);
  } else if (command != "status" && command != "drain") {
    return Fail(absl::StrCat("unknown command '", command,
                             "': status, remove-worker K, drain, add-ps ADDR or remove-ps P (--help)"), 2);
  }

  absl::StatusOr<dtrain::ps::SecurityOptions> security = dtrain::ps::LoadSecurityOptions(
      absl::GetFlag(FLAGS_auth_token_file), absl::GetFlag(FLAGS_tls_cert), absl::GetFlag(FLAGS_tls_key),
      absl::GetFlag(FLAGS_tls_ca), absl::GetFlag(FLAGS_tls_server_name));
  if (!security.ok()) return Fail(std::string(security.status().message()), 2);
  dtrain::ps::GrpcClientOptions copt;
  copt.security = *security;
  copt.rpc_timeout = absl::Seconds(absl::GetFlag(FLAGS_timeout_secs));
  copt.retry_window = absl::Seconds(absl::GetFlag(FLAGS_timeout_secs));
  std::vector<std::unique_ptr<dtrain::ps::PsInterface>> tasks;
  for (const std::string& address : cluster->ps) {
    absl::StatusOr<std::unique_ptr<dtrain::ps::PsInterface>> c = dtrain::ps::NewGrpcPsClient(address, copt);
    if (!c.ok()) return Fail(absl::StrCat("ps ", address, ": ", c.status().message()), 1);
    tasks.push_back(*std::move(c));
  }
  const char* user = std::getenv("USER") != nullptr ? std::getenv("USER") : std::getenv("LOGNAME");
  const std::string who = user != nullptr ? absl::StrCat("dtrain_ctl (", user, ")") : std::string("dtrain_ctl");

  if (command == "add-ps" || command == "remove-ps") {
    // ps 0 keeps the job's ps set and decides the step of the change.
    dtrain::ps::ControlRequest r;
    r.command = command;
    r.address = command == "add-ps" ? args[1] : "";
    r.ps = ps_task;
    r.reason = who;
    absl::StatusOr<std::string> out = tasks[0]->Control(r);
    if (!out.ok()) return Fail(absl::StrCat("ps task 0 (", cluster->ps[0], "): ", out.status().message()), 1);
    std::printf("%s\n", out->c_str());
    return 0;
  }
  if (command == "remove-worker" || command == "drain") {
    dtrain::ps::ControlRequest r;
    r.command = command;
    r.worker = worker;
    r.reason = who;
    // remove-worker: ps 0 decides; drain: every task saves and ends (ps 0 last, so the workers hear it once the
    // others have saved).
    int failed = 0;
    for (int t = command == "drain" ? static_cast<int>(tasks.size()) - 1 : 0; t >= 0; --t) {
      absl::StatusOr<std::string> out = tasks[t]->Control(r);
      if (!out.ok()) {
        std::fprintf(stderr, "dtrain_ctl: ps task %d (%s): %s\n", t, cluster->ps[t].c_str(),
                     std::string(out.status().message()).c_str());
        ++failed;
      } else {
        std::printf("%s\n", out->c_str());
      }
      if (command == "remove-worker") break;
    }
    return failed == 0 ? 0 : 1;
  }

  // status
  absl::StatusOr<dtrain::ps::TrainingStats> first = tasks[0]->GetStats();
  if (!first.ok()) return Fail(absl::StrCat("ps task 0 (", cluster->ps[0], "): ", first.status().message()), 1);
  const double rate_secs = absl::GetFlag(FLAGS_rate_secs);
  absl::StatusOr<dtrain::ps::TrainingStats> second = first;
  const absl::Time from = absl::Now();
  if (rate_secs > 0) {
    absl::SleepFor(absl::Seconds(rate_secs));
    second = tasks[0]->GetStats();
    if (!second.ok()) return Fail(absl::StrCat("ps task 0: ", second.status().message()), 1);
  }
  const double secs = std::max(1e-9, absl::ToDoubleSeconds(absl::Now() - from));
  std::printf("global step %lld%s\n", static_cast<long long>(second->global_step),
              second->job_ended.empty() ? "" : absl::StrCat(" (the run ended: ", second->job_ended, ")").c_str());
  std::printf("%-7s %-10s %11s %10s %11s  %s\n", "worker", "state", "since step", "applied", "steps/sec", "note");
  for (const dtrain::ps::WorkerStats& w : second->workers) {
    int64_t before = w.applied;
    for (const dtrain::ps::WorkerStats& b : first->workers) {
      if (b.worker_id == w.worker_id) before = b.applied;
    }
    const std::string rate = rate_secs > 0 && !w.done && !w.lost
                                 ? absl::StrFormat("%.1f", static_cast<double>(w.applied - before) / secs)
                                 : "-";
    std::printf("%-7d %-10s %11lld %10lld %11s  %s\n", w.worker_id, StateOf(w),
                static_cast<long long>(w.present_at_step), static_cast<long long>(w.applied), rate.c_str(),
                w.done || w.lost ? absl::StrCat("left at step ", w.left_at_step,
                                                w.reason.empty() ? "" : absl::StrCat(": ", w.reason)).c_str()
                                 : "");
  }
  // The job's ps tasks: the spec's, or the set ps 0 says the job moved onto (dtrain_ctl add-ps / remove-ps).
  std::vector<std::string> hosts = cluster->ps;
  if (!second->ps_hosts.empty() && second->ps_hosts != hosts) {
    hosts = second->ps_hosts;
    std::printf("(the job's ps tasks changed since the spec: %zu now)\n", hosts.size());
  }
  std::printf("%-7s %-22s %11s %12s\n", "ps", "address", "step", "rows held");
  for (size_t t = 0; t < hosts.size(); ++t) {
    if (t >= tasks.size() || cluster->ps[t] != hosts[t]) {
      absl::StatusOr<std::unique_ptr<dtrain::ps::PsInterface>> c = dtrain::ps::NewGrpcPsClient(hosts[t], copt);
      if (!c.ok()) return Fail(absl::StrCat("ps ", hosts[t], ": ", c.status().message()), 1);
      if (t < tasks.size()) {
        tasks[t] = *std::move(c);
      } else {
        tasks.push_back(*std::move(c));
      }
    }
    absl::StatusOr<dtrain::ps::TrainingStats> s = t == 0 ? second : tasks[t]->GetStats();
    if (!s.ok()) {
      std::printf("%-7zu %-22s unreachable: %s\n", t, hosts[t].c_str(), std::string(s.status().message()).c_str());
      continue;
    }
    int64_t rows = 0;
    for (const dtrain::ps::SparseTableStats& table : s->tables) rows += table.rows;
    std::printf("%-7zu %-22s %11lld %12lld\n", t, hosts[t].c_str(), static_cast<long long>(s->global_step),
                static_cast<long long>(rows));
  }
  return 0;
}
