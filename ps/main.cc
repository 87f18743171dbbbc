// dtrain_ps: one parameter-server task. Generic like tf.train.Server: it knows the cluster, not the model;
// the chief worker sends the training configuration. Exits by itself once no worker is left, with one summary
// line and the exit code of common/exit_codes.h: 0 complete, 3 degraded (0 with --allow_degraded), 4 the run
// ended early (a peer failed, was refused or stopped, every worker was lost, or no chief registered within
// --registration_timeout_secs), 1 when the final checkpoint could not be saved (or --max_run_secs ran out), 2
// for bad flags. SIGTERM/SIGINT: the run ends here (final checkpoint, then the workers are told), then 143/130.
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <string>

#include <glog/logging.h>

#include "absl/cleanup/cleanup.h"
#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/cluster_flags.h"
#include "common/cluster_spec.h"
#include "common/command_line.h"
#include "common/exit_codes.h"
#include "common/malloc_tuning.h"
#include "common/metrics/metrics_exporter.h"
#include "common/metrics/metrics_flags.h"
#include "common/open_files.h"
#include "common/process_start.h"
#include "common/stop_signal.h"
#include "common/trace_flags.h"
#include "common/trace_recorder.h"
#include "ps/api/run_exit_code.h"
#include "ps/metrics/ps_metrics.h"
#include "ps/rpc/grpc_ps_client.h"
#include "ps/rpc/server.h"
#include "ps/rpc/transport.h"

ABSL_FLAG(std::string, job_name, "", "This task's job (ps)");
ABSL_FLAG(int, task_index, -1, "This task's index in the ps job");
// --ps_hosts, --worker_hosts, --cluster_spec: common/cluster_flags.h; --trace_steps, --trace_dir:
// common/trace_flags.h; --metrics_bind_address: common/metrics/metrics_flags.h (dtrain_worker has them too).
ABSL_FLAG(std::string, listen_address, "",
          "Address to bind (default: this task's address in the cluster spec; use 0.0.0.0:PORT for all "
          "interfaces)");
ABSL_FLAG(std::string, checkpoint_dir, "",
          "Save this task's checkpoints here (model.ckpt-<step>.ps<task>-of-<num_ps>) and restore the newest "
          "valid one when the chief registers (empty: no checkpoints)");
ABSL_FLAG(int64_t, save_checkpoint_steps, 0,
          "Save when the global step reaches a multiple of this (0: off); in sync mode ps 0 decides for all tasks");
ABSL_FLAG(double, save_checkpoint_secs, 0, "Save when this many seconds passed since the last save (0: off)");
ABSL_FLAG(int, keep_checkpoints, 5, "Keep the newest this many checkpoints of this task (0: keep all)");
ABSL_FLAG(bool, journal_applied, false,
          "Keep an applied journal in --checkpoint_dir (applied.ps<task>-of-<num_ps>.*.journal): every push "
          "accepted and applied, every checkpoint taken and restored, for scripts/check_updates.py to prove that "
          "nothing acknowledged was lost or applied twice");
ABSL_FLAG(std::string, auth_token_file, "",
          "The cluster's secret token: every call must carry it (see ps/rpc/grpc_security.h; empty: no "
          "authentication)");
ABSL_FLAG(std::string, tls_cert, "", "Serve TLS with this certificate chain (PEM; with --tls_key)");
ABSL_FLAG(std::string, tls_key, "", "The private key of --tls_cert (PEM)");
ABSL_FLAG(std::string, tls_ca, "", "Require and verify client certificates signed by this CA (PEM)");
ABSL_FLAG(double, max_run_secs, 0, "Give up and exit 1 after this long (0: wait for the workers forever)");
ABSL_FLAG(bool, allow_degraded, false,
          "Exit 0, not 3, when the run reached its end without some worker (lost, failed or stopped before it): "
          "for elastic jobs where workers may come and go");
ABSL_FLAG(double, final_save_wait_secs, 600,
          "At exit, how long to wait for a final checkpoint another thread is still writing (a large model's); past "
          "it the task exits 1 saying so, never claiming a checkpoint that is not on disk");
ABSL_FLAG(double, chief_grace_secs, 30,
          "After SIGTERM/SIGINT, wait at most this long for a training chief to leave before ending the run: when "
          "every process gets the signal at once (a Kubernetes Job deleted, Slurm's --signal), the chief finishes "
          "its step, evaluates and exports first, and the final checkpoint is of its step (0: end the run at once)");
ABSL_FLAG(std::string, join, "",
          "HOST:PORT: this ps task joins a running job (sync or async) at that address, as task N past the cluster spec's N ps "
          "tasks: it asks ps 0 (dtrain_ctl add-ps), and the chief moves the job onto it at the next step boundary "
          "(async: where every worker stopped pushing) (needs the job's --checkpoint_dir, shared by every ps task)");
ABSL_FLAG(int, max_workers, 0,
          "Workers this task takes: past the cluster spec's (0: the spec's count), workers started with "
          "--task_index up to max_workers - 1 join the running job (the workers need --elastic_batch)");
ABSL_FLAG(double, worker_timeout_secs, 20,
          "A worker silent (no call, no heartbeat) for this long is declared lost: sync training stops waiting for "
          "it and goes on with the others; it may come back by registering again (0: never declare a worker lost)");
ABSL_FLAG(double, registration_timeout_secs, 600,
          "Exit 4 (the run ended early) if no chief worker registers within this long after start (0: wait for "
          "ever). A task started again after training ended elsewhere exits once the workers that report to it are "
          "done");
ABSL_FLAG(std::string, nonfinite, "reject",
          "Gradients with NaN or Inf: reject (the push fails, nothing applied), skip (counted, left out of the "
          "step) or apply");
ABSL_FLAG(int64_t, max_model_bytes, int64_t{4} << 30,
          "Refuse a chief whose model puts more than this many bytes of variables on this task");
ABSL_FLAG(int64_t, max_push_rows, int64_t{1} << 22,
          "Refuse a push carrying more than this many rows of one sparse table (its unique ids; a step's are far "
          "fewer): one peer cannot grow this task's gradient buffers without bound");
ABSL_FLAG(int64_t, max_pull_rows, int64_t{1} << 22,
          "Refuse a pull asking for more than this many rows of one sparse table (a step's unique ids; evaluation "
          "pulls in batches): one peer cannot make this task copy and answer without bound");
ABSL_FLAG(int64_t, sparse_max_rows_per_table, 0,
          "Hold at most this many rows of each sparse embedding table on this task, whatever the chief's max_rows "
          "(the least recently touched are evicted; 0: the chief's max_rows alone)");
ABSL_FLAG(std::string, transport, "auto",
          "Which data planes to offer beside gRPC (which carries the control calls): auto (both), shm (workers on "
          "this host: gradients and parameters move through memory files both processes map), tcp (workers on other "
          "hosts: TCP lanes on a port of --tcp_port, the tensor data sent from and received into its buffers; not "
          "with --tls, whose data stays on gRPC), grpc (neither)");
ABSL_FLAG(int, tcp_port, 0,
          "The TCP data lanes' port on this task's host (0: any free one; workers learn it over gRPC). Open it in "
          "a firewall beside the gRPC port");
ABSL_FLAG(int, shm_spin_us, 20,
          "Shared memory: how long a lane looks for a worker's next frame before its thread sleeps in a system call "
          "(more: less wake-up latency, more CPU spent waiting); within an upload (the worker's backward pass) up "
          "to 500 us, and after answering a commit 300 us, yielding the core past 20 us to any thread with work. "
          "0: never look, always sleep");
ABSL_FLAG(std::string, apply_early, "auto",
          "Sync with one worker and this one task: apply a push as it arrives and stream it back to the worker's "
          "pull behind it (a worker asks with its --apply_early). auto: for workers on other hosts (on this host "
          "both directions are copies on the same cores, where it measured slower); on: for every worker that asks; "
          "off: never");
ABSL_FLAG(double, delta_every_secs, 0,
          "Write what changed since the last delta (every touched sparse row with its optimizer state, the ids "
          "removed, the dense variables) every this many seconds to --delta_dir, beside the full checkpoints: "
          "serving follows them (dtrain_eval --follow_deltas) and a restarted task restores its newest checkpoint "
          "plus the deltas after it (0: no deltas)");
ABSL_FLAG(int64_t, delta_every_steps, 0, "A delta every this many global steps too (0: by time only)");
ABSL_FLAG(std::string, delta_dir, "",
          "Where deltas are written and restored from (default: --checkpoint_dir)");
ABSL_FLAG(int64_t, max_inflight_bytes, int64_t{1} << 30,
          "Memory gRPC may use for this task's connections and messages in flight (a gRPC resource quota)");
ABSL_FLAG(double, malloc_trim_secs, 10,
          "Give the allocator's free pages back to the system this often (common/malloc_tuning.h; 0: never)");
ABSL_FLAG(int, malloc_arenas, 2,
          "At most this many malloc arenas: bounds the memory the allocator keeps (common/malloc_tuning.h; 0: "
          "glibc's default of 8 per core)");
ABSL_FLAG(int, metrics_port, 0,
          "Serve this task's figures for Prometheus at http://<--metrics_bind_address>:PORT/metrics (pushes, "
          "drops, sync waits, workers and leases, bytes, sparse rows, checkpoint and delta age, RSS; "
          "docs/metrics.md). 0: off");

namespace {

// The add-ps request of dtrain_ps --join=`address` (`note` after the reason).
dtrain::ps::ControlRequest JoinRequest(const std::string& address, const std::string& note) {
  dtrain::ps::ControlRequest r;
  r.command = "add-ps";
  r.address = address;
  r.reason = absl::StrCat("dtrain_ps --join=", address, note);
  return r;
}

// dtrain_ps --join: asks ps 0 at `ps0` to add this task (`address`) to the running job, again while ps 0 cannot be
// reached or has no job yet, for at most `wait`. A refusal (FailedPrecondition, InvalidArgument) is returned at once.
absl::Status AskToJoin(const std::string& ps0, const std::string& address, const dtrain::ps::SecurityOptions& security,
                       absl::Duration wait) {
  dtrain::ps::GrpcClientOptions copt;
  copt.security = security;
  copt.rpc_timeout = absl::Seconds(10);
  copt.retry_window = absl::Seconds(10);
  absl::StatusOr<std::unique_ptr<dtrain::ps::PsInterface>> client = dtrain::ps::NewGrpcPsClient(ps0, copt);
  if (!client.ok()) return client.status();
  const dtrain::ps::ControlRequest r = JoinRequest(address, "");
  const absl::Time give_up = absl::Now() + std::min(wait, absl::Minutes(10));
  absl::Duration backoff = absl::Milliseconds(100);
  while (true) {
    absl::StatusOr<std::string> said = (*client)->Control(r);
    if (said.ok()) {
      LOG(INFO) << "ps 0 (" << ps0 << "): " << *said;
      return absl::OkStatus();
    }
    if (absl::StrContains(said.status().message(), "is a ps task of the job already")) {
      // A restart of a task that joined before (kill -9, a lost machine): the chief restores it as any restarted
      // task, from the newest checkpoint every task holds.
      LOG(INFO) << "ps 0 (" << ps0 << "): " << address << " is a ps task of the job already: serving again";
      return absl::OkStatus();
    }
    const bool again = absl::IsUnavailable(said.status()) || absl::IsDeadlineExceeded(said.status()) ||
                       absl::StrContains(said.status().message(), "no job is running yet") ||
                       absl::StrContains(said.status().message(), "under way already");
    if (!again) return said.status();
    if (absl::Now() > give_up) {
      return absl::DeadlineExceededError(absl::StrCat("ps 0 (", ps0, ") did not take this task: ",
                                                      said.status().message()));
    }
    LOG(INFO) << "waiting to join through ps 0 (" << ps0 << "): " << said.status().message();
    absl::SleepFor(backoff);
    backoff = std::min(backoff * 2, absl::Seconds(2));
  }
}


constexpr char kExitCodes[] =
    "Exit codes: 0 the run completed; 3 it reached its end without some worker (0 with --allow_degraded); 4 it\n"
    "ended early (a peer failed, was refused or stopped; every worker gone; no chief in time); 1 the final\n"
    "checkpoint was not saved or --max_run_secs ran out; 2 bad flags; 143/130 stopped by SIGTERM/SIGINT (after the\n"
    "final checkpoint; a second signal stops at once). A --flagfile shared with dtrain_worker may hold its flags:\n"
    "they are ignored here, with one note.";

}  // namespace

int main(int argc, char** argv) {
  dtrain::CommandLineSpec spec;
  spec.program = "dtrain_ps";
  spec.summary = "one parameter-server task of a cluster (it learns the model from the chief worker)";
  spec.epilogue = kExitCodes;
  spec.peer_program = "dtrain_worker";
  spec.peer_flags = dtrain::DtrainWorkerFlagNames();
  dtrain::StopSignals* signals = dtrain::StartProcess(argc, argv, spec, "dtrain parameter server task");
  // Every connection is a descriptor: a soft limit of 1024 would let idle connections shut gRPC's listener.
  const dtrain::OpenFileLimit open_files = dtrain::RaiseOpenFileLimit();
  if (absl::GetFlag(FLAGS_malloc_arenas) < 0) {
    std::fprintf(stderr, "dtrain_ps: --malloc_arenas=%d must be >= 0\n", absl::GetFlag(FLAGS_malloc_arenas));
    return dtrain::kExitConfigRefused;
  }
  dtrain::LimitMallocArenas(absl::GetFlag(FLAGS_malloc_arenas));  // before gRPC starts its threads
  const double trim_secs = absl::GetFlag(FLAGS_malloc_trim_secs);
  if (!(trim_secs >= 0)) {
    std::fprintf(stderr, "dtrain_ps: --malloc_trim_secs=%g must be >= 0\n", trim_secs);
    return dtrain::kExitConfigRefused;
  }
  dtrain::PeriodicMallocTrim trim(absl::Seconds(trim_secs));

  const std::string join = absl::GetFlag(FLAGS_join);
  const int asked_index = absl::GetFlag(FLAGS_task_index);
  // --join: the spec is read as ps 0 would; this task comes after its list.
  absl::StatusOr<dtrain::ClusterConfig> cluster = dtrain::ClusterOfThisTask(
      absl::GetFlag(FLAGS_job_name), join.empty() ? asked_index : 0, dtrain::TaskBinary::kPs);
  if (!cluster.ok()) {
    std::fprintf(stderr, "dtrain_ps: %s\n", std::string(cluster.status().message()).c_str());
    return dtrain::kExitConfigRefused;
  }
  std::vector<std::string> ps_hosts = cluster->ps;
  if (!join.empty()) {
    const int n = cluster->num_ps();
    if (asked_index >= 0 && asked_index != n) {
      std::fprintf(stderr, "dtrain_ps: --join: this task comes after the spec's %d ps tasks: its --task_index is %d "
                   "(or leave it out), not %d\n", n, n, asked_index);
      return dtrain::kExitConfigRefused;
    }
    if (join.rfind(':') == std::string::npos ||
        std::find(ps_hosts.begin(), ps_hosts.end(), join) != ps_hosts.end()) {
      std::fprintf(stderr, "dtrain_ps: --join=%s must be a host:port of its own, not one of the spec's ps tasks\n",
                   join.c_str());
      return dtrain::kExitConfigRefused;
    }
    cluster->task_index = n;
    ps_hosts.push_back(join);
  }
  dtrain::ps::PsServerOptions o;
  o.listen_address = absl::GetFlag(FLAGS_listen_address);
  if (o.listen_address.empty()) o.listen_address = join.empty() ? cluster->address() : join;
  o.ps.task_index = cluster->task_index;
  o.ps.num_ps = static_cast<int>(ps_hosts.size());
  o.ps.ps_hosts = ps_hosts;
  o.ps.num_workers = cluster->num_workers();
  o.ps.max_workers = absl::GetFlag(FLAGS_max_workers);
  if (o.ps.max_workers != 0 &&
      (o.ps.max_workers < o.ps.num_workers || o.ps.max_workers > dtrain::ps::kMaxWorkerSlots)) {
    std::fprintf(stderr, "dtrain_ps: --max_workers=%d must be 0 or between the cluster spec's %d workers and %d\n",
                 o.ps.max_workers, o.ps.num_workers, dtrain::ps::kMaxWorkerSlots);
    return dtrain::kExitConfigRefused;
  }
  o.ps.checkpoint.dir = absl::GetFlag(FLAGS_checkpoint_dir);
  o.ps.checkpoint.save_steps = absl::GetFlag(FLAGS_save_checkpoint_steps);
  o.ps.checkpoint.save_secs = absl::GetFlag(FLAGS_save_checkpoint_secs);
  o.ps.checkpoint.keep = absl::GetFlag(FLAGS_keep_checkpoints);
  if (o.ps.checkpoint.save_steps < 0 || o.ps.checkpoint.save_secs < 0 || o.ps.checkpoint.keep < 0) {
    std::fprintf(stderr, "dtrain_ps: --save_checkpoint_steps, --save_checkpoint_secs and --keep_checkpoints "
                         "must be >= 0\n");
    return dtrain::kExitConfigRefused;
  }
  const double worker_timeout = absl::GetFlag(FLAGS_worker_timeout_secs);
  if (!(worker_timeout >= 0)) {
    std::fprintf(stderr, "dtrain_ps: --worker_timeout_secs=%g must be >= 0\n", worker_timeout);
    return dtrain::kExitConfigRefused;
  }
  o.ps.worker_timeout = absl::Seconds(worker_timeout);
  const double chief_grace_secs = absl::GetFlag(FLAGS_chief_grace_secs);
  if (!(chief_grace_secs >= 0)) {
    std::fprintf(stderr, "dtrain_ps: --chief_grace_secs=%g must be >= 0\n", chief_grace_secs);
    return dtrain::kExitConfigRefused;
  }
  const absl::Duration chief_grace = absl::Seconds(chief_grace_secs);
  const double registration_timeout = absl::GetFlag(FLAGS_registration_timeout_secs);
  if (!(registration_timeout >= 0)) {
    std::fprintf(stderr, "dtrain_ps: --registration_timeout_secs=%g must be >= 0\n", registration_timeout);
    return dtrain::kExitConfigRefused;
  }
  o.ps.registration_timeout =
      registration_timeout > 0 ? absl::Seconds(registration_timeout) : absl::InfiniteDuration();
  absl::StatusOr<dtrain::ps::ParameterServerOptions::NonFinite> nonfinite =
      dtrain::ps::ParseNonFinitePolicy(absl::GetFlag(FLAGS_nonfinite));
  if (!nonfinite.ok()) {
    std::fprintf(stderr, "dtrain_ps: %s\n", std::string(nonfinite.status().message()).c_str());
    return dtrain::kExitConfigRefused;
  }
  o.ps.nonfinite = *nonfinite;
  absl::StatusOr<dtrain::ps::Transport> transport = dtrain::ps::ParseTransport(absl::GetFlag(FLAGS_transport));
  if (!transport.ok()) {
    std::fprintf(stderr, "dtrain_ps: %s\n", std::string(transport.status().message()).c_str());
    return 2;
  }
  o.offer_shm = *transport == dtrain::ps::Transport::kAuto || *transport == dtrain::ps::Transport::kShm;
  o.offer_tcp = *transport == dtrain::ps::Transport::kAuto || *transport == dtrain::ps::Transport::kTcp;
  o.tcp_port = absl::GetFlag(FLAGS_tcp_port);
  if (o.tcp_port < 0 || o.tcp_port > 65535) {
    std::fprintf(stderr, "dtrain_ps: --tcp_port=%d must be in [0, 65535]\n", o.tcp_port);
    return 2;
  }
  o.shm_spin_us = absl::GetFlag(FLAGS_shm_spin_us);
  absl::StatusOr<dtrain::ps::ApplyEarly> apply_early = dtrain::ps::ParseApplyEarly(absl::GetFlag(FLAGS_apply_early));
  if (!apply_early.ok()) {
    std::fprintf(stderr, "dtrain_ps: %s\n", std::string(apply_early.status().message()).c_str());
    return 2;
  }
  o.apply_early = *apply_early;
  o.ps.max_model_bytes = absl::GetFlag(FLAGS_max_model_bytes);
  o.ps.max_push_rows = absl::GetFlag(FLAGS_max_push_rows);
  o.ps.max_pull_rows = absl::GetFlag(FLAGS_max_pull_rows);
  if (o.ps.max_push_rows <= 0 || o.ps.max_pull_rows <= 0) {
    std::fprintf(stderr, "dtrain_ps: --max_push_rows and --max_pull_rows must be > 0\n");
    return dtrain::kExitConfigRefused;
  }
  o.ps.sparse_max_rows = absl::GetFlag(FLAGS_sparse_max_rows_per_table);
  if (o.ps.sparse_max_rows < 0) {
    std::fprintf(stderr, "dtrain_ps: --sparse_max_rows_per_table must be >= 0\n");
    return dtrain::kExitConfigRefused;
  }
  o.ps.delta.every_secs = absl::GetFlag(FLAGS_delta_every_secs);
  o.ps.delta.every_steps = absl::GetFlag(FLAGS_delta_every_steps);
  o.ps.delta.dir = absl::GetFlag(FLAGS_delta_dir).empty() ? o.ps.checkpoint.dir : absl::GetFlag(FLAGS_delta_dir);
  if (absl::Status s = dtrain::ps::ValidateDeltaOptions(o.ps.delta); !s.ok()) {
    std::fprintf(stderr, "dtrain_ps: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  o.max_inflight_bytes = absl::GetFlag(FLAGS_max_inflight_bytes);
  if (o.ps.max_model_bytes <= 0 || o.max_inflight_bytes < (int64_t{16} << 20)) {
    std::fprintf(stderr, "dtrain_ps: --max_model_bytes must be > 0 and --max_inflight_bytes >= 16 MiB\n");
    return dtrain::kExitConfigRefused;
  }
  o.ps.journal_applied = absl::GetFlag(FLAGS_journal_applied);
  if (o.ps.journal_applied && !o.ps.checkpoint.enabled()) {
    std::fprintf(stderr, "dtrain_ps: --journal_applied needs --checkpoint_dir (the journal is kept beside the "
                         "checkpoints)\n");
    return 2;
  }
  if (!o.ps.checkpoint.enabled() && (o.ps.checkpoint.save_steps > 0 || o.ps.checkpoint.save_secs > 0)) {
    std::fprintf(stderr, "dtrain_ps: --save_checkpoint_steps/--save_checkpoint_secs need --checkpoint_dir\n");
    return dtrain::kExitConfigRefused;
  }

  absl::StatusOr<dtrain::ps::SecurityOptions> security =
      dtrain::ps::LoadSecurityOptions(absl::GetFlag(FLAGS_auth_token_file), absl::GetFlag(FLAGS_tls_cert),
                                      absl::GetFlag(FLAGS_tls_key), absl::GetFlag(FLAGS_tls_ca), "");
  if (!security.ok()) {
    std::fprintf(stderr, "dtrain_ps: %s\n", std::string(security.status().message()).c_str());
    return dtrain::kExitConfigRefused;
  }
  o.security = *security;
  o.ps.decision_key = o.security.auth_token;  // ps 0 signs its step decisions; the others check
  // After the last worker left, serve until the workers that completed have asked ps 0 how the run ended (every
  // worker's leaving; they exit with its code) and no lost worker may come back: at most 2 s (ps/rpc/server.h).
  o.linger = absl::Seconds(2);
  absl::StatusOr<std::unique_ptr<dtrain::TraceRecorder>> trace =
      dtrain::TimelineFromFlags(absl::StrCat("ps ", cluster->task_index));
  if (!trace.ok()) {
    std::fprintf(stderr, "dtrain_ps: %s\n", std::string(trace.status().message()).c_str());
    return dtrain::kExitConfigRefused;
  }
  o.ps.trace = trace->get();
  // Written once the server is done (whatever the outcome: a failed run's timeline is worth reading too).
  auto write_trace = absl::MakeCleanup([&trace, task = cluster->task_index] {
    if (*trace == nullptr) return;
    absl::StatusOr<std::string> written = dtrain::WriteTimeline(**trace, absl::StrCat("ps-", task));
    if (!written.ok()) {
      std::fprintf(stderr, "dtrain_ps: %s\n", std::string(written.status().message()).c_str());
    } else {
      LOG(INFO) << "ps task " << task << ": " << *written;
    }
  });
  // --metrics_port: bound before the gRPC server starts, so that a port in use fails the start at once.
  const int metrics_port = absl::GetFlag(FLAGS_metrics_port);
  if (absl::Status s = dtrain::metrics::ValidateMetricsEndpointFlags(metrics_port); !s.ok()) {
    std::fprintf(stderr, "dtrain_ps: %s\n", std::string(s.message()).c_str());
    return dtrain::kExitConfigRefused;
  }
  absl::StatusOr<std::unique_ptr<dtrain::metrics::MetricsExporter>> endpoint =
      dtrain::metrics::StartMetricsEndpoint(metrics_port);
  if (!endpoint.ok()) {
    std::fprintf(stderr, "dtrain_ps: %s\n", std::string(endpoint.status().message()).c_str());
    return dtrain::kExitError;
  }
  std::unique_ptr<dtrain::metrics::MetricsExporter> exporter = *std::move(endpoint);
  if (signals->received() != 0) {
    std::fprintf(stderr, "dtrain_ps: stopped by %s before it started\n", signals->received_name().c_str());
    return dtrain::ExitCodeForSignal(signals->received());
  }
  absl::StatusOr<std::unique_ptr<dtrain::ps::PsServer>> server = dtrain::ps::PsServer::Start(o);
  if (!server.ok()) {
    std::fprintf(stderr, "dtrain_ps: %s\n", std::string(server.status().message()).c_str());
    return dtrain::kExitError;
  }
  // The exporter stops (its request threads joined) before the server its collector reads goes away.
  auto stop_exporter = absl::MakeCleanup([&exporter] { exporter.reset(); });
  dtrain::ps::ParameterServer* ps = (*server)->parameter_server();
  if (exporter != nullptr) {
    dtrain::ps::PsMetricsSources src;
    src.ps = ps;
    if (dtrain::ps::shm::ShmServer* shm = (*server)->shm_server(); shm != nullptr) {
      src.shm = [shm] { return shm->counters(); };
    }
    if (dtrain::ps::tcp::TcpServer* tcp = (*server)->tcp_server(); tcp != nullptr) {
      src.tcp = [tcp] { return tcp->counters(); };
    }
    src.grpc_bytes = [s = server->get()] {
      const dtrain::ps::PsServer::GrpcBytes b = s->grpc_bytes();
      return std::make_pair(b.received, b.sent);
    };
    src.checkpoint_dir = o.ps.checkpoint.dir;
    src.delta_dir = o.ps.delta.every_secs > 0 || o.ps.delta.every_steps > 0 ? o.ps.delta.dir : "";
    src.task = o.ps.task_index;
    src.num_ps = o.ps.num_ps;
    exporter->Register(dtrain::ps::NewPsCollector(std::move(src)));
    LOG(INFO) << "ps task " << cluster->task_index << ": serving metrics at " << exporter->url();
  }
  if (!join.empty()) {
    // Ask ps 0 to take this task into the job (as dtrain_ctl add-ps does); the chief then moves it in.
    absl::Status asked = AskToJoin(cluster->ps[0], join, o.security, o.ps.registration_timeout);
    if (!asked.ok()) {
      std::fprintf(stderr, "dtrain_ps: --join=%s: %s\n", join.c_str(), std::string(asked.message()).c_str());
      return absl::IsFailedPrecondition(asked) || absl::IsInvalidArgument(asked) ? dtrain::kExitConfigRefused
                                                                                 : dtrain::kExitError;
    }
  }
  LOG(INFO) << "ps task " << cluster->task_index << " listening on " << (*server)->address() << "; "
            << cluster->DebugString();
  if (!open_files.error.empty()) {
    LOG(WARNING) << "ps task " << cluster->task_index << ": open files: the soft limit stays " << open_files.before
                 << " (raising it to the hard limit " << open_files.hard << " failed: " << open_files.error << ")";
  } else if (open_files.after != open_files.before) {
    LOG(INFO) << "ps task " << cluster->task_index << ": open files: soft limit raised from " << open_files.before
              << " to " << open_files.after << " (each connection is one)";
  }
  if (o.ps.registration_timeout < absl::InfiniteDuration()) {
    LOG(INFO) << "ps task " << cluster->task_index << ": waiting for the chief worker to register until "
              << absl::FormatTime("%H:%M:%S", absl::Now() + o.ps.registration_timeout, absl::LocalTimeZone())
              << " (--registration_timeout_secs=" << registration_timeout << ")";
  }
  // SIGTERM/SIGINT: the run ends here. The final checkpoint is written inside EndRun; the workers hear of it with
  // their next call (a pull waiting for a step is woken) and leave; this task then finishes.
  const int task = cluster->task_index;
  // The workers that do not leave are lost after --worker_timeout_secs (10 s without leases); then it exits.
  const absl::Duration stop_grace =
      (o.ps.worker_timeout > absl::ZeroDuration() ? o.ps.worker_timeout : absl::Seconds(10)) + absl::Seconds(5);
  // Set when main() stops waiting for the run: the callback below (on the signal thread) stops waiting too, and
  // main() deregisters it before the server it uses goes away.
  std::atomic<bool> leaving{false};
  const int64_t on_stop = signals->stop()->Register([signals, ps, task, stop_grace, chief_grace, &leaving] {
    // A chief that is training may have got the signal too: let it finish its step and leave (its leaving ends
    // the run, and the final checkpoint is then of the step it evaluated), for at most --chief_grace_secs.
    const auto chief_training = [ps] {
      absl::StatusOr<dtrain::ps::TrainingStats> s = ps->GetStats();
      return s.ok() && s->job_ended.empty() && !s->workers.empty() && s->workers[0].applied > 0 &&
             !s->workers[0].done && !s->workers[0].lost && !ps->finished();
    };
    if (chief_grace > absl::ZeroDuration() && chief_training()) {
      const absl::Time until = absl::Now() + chief_grace;
      LOG(WARNING) << "ps task " << task << ": " << signals->received_name() << ": waiting until "
                   << absl::FormatTime("%H:%M:%S", until, absl::LocalTimeZone())
                   << " (--chief_grace_secs) for the chief to finish its step and leave, then ending the run";
      while (absl::Now() < until && !leaving.load() && chief_training()) absl::SleepFor(absl::Milliseconds(20));
    }
    if (ps->finished() || !ps->GetStats().ok() || !ps->GetStats()->job_ended.empty()) return;  // the chief ended it
    LOG(WARNING) << "ps task " << task << ": " << signals->received_name() << ": saving the final checkpoint and "
                 << "telling the workers; exiting once they left, at the latest at "
                 << absl::FormatTime("%H:%M:%S", absl::Now() + stop_grace, absl::LocalTimeZone());
    ps->EndRun(absl::StrCat("ps task ", task, " was stopped by ", signals->received_name(), " at step ",
                            ps->step()));
  });
  const double max_secs = absl::GetFlag(FLAGS_max_run_secs);
  const absl::Time give_up = max_secs > 0 ? absl::Now() + absl::Seconds(max_secs) : absl::InfiniteFuture();
  absl::Time stop_deadline = absl::InfiniteFuture();
  bool finished = false;
  std::unique_ptr<dtrain::ps::PsInterface> ps0;  // --join: watched until the chief moves the job onto this task
  if (!join.empty()) {
    dtrain::ps::GrpcClientOptions copt;
    copt.security = o.security;
    copt.rpc_timeout = absl::Seconds(5);
    copt.retry_window = absl::ZeroDuration();
    absl::StatusOr<std::unique_ptr<dtrain::ps::PsInterface>> c = dtrain::ps::NewGrpcPsClient(cluster->ps[0], copt);
    if (c.ok()) ps0 = *std::move(c);
  }
  absl::Time ask_again = absl::Now() + absl::Seconds(2);
  while (!(finished = ps->WaitUntilFinished(absl::Seconds(ps0 != nullptr ? 0.5 : 1)))) {
    if (absl::Now() >= give_up) break;
    if (ps0 != nullptr) {
      // Taken in but not moved in yet: a run that ends first (its last step came before the step of the move)
      // leaves nothing for this task to do.
      if (ps->configured()) {
        ps0.reset();
      } else if (std::optional<dtrain::ps::RunOver> over = dtrain::ps::ParseRunOver(
                     ps0->Probe(dtrain::ps::TrainConfig()).status())) {
        dtrain::ps::ControlRequest retire;
        retire.command = "retire";
        retire.reason = absl::StrCat("the run ended before the job moved onto this task: ", over->line);
        ps->Control(retire).IgnoreError();
        ps0.reset();
      } else if (absl::Now() >= ask_again) {
        // A ps 0 that restarted before the chief moved the job lost the change: the join is asked again (ps 0
        // answers "(asked before)" while it still holds it).
        absl::StatusOr<std::string> said = ps0->Control(JoinRequest(join, ", asking again"));
        if (said.ok() && !absl::StrContains(*said, "(asked before)")) {
          LOG(WARNING) << "ps 0 (" << cluster->ps[0] << ") had lost this task's join (it restarted before the job "
                       << "moved): asked again: " << *said;
        }
        ask_again = absl::Now() + absl::Seconds(2);
      }
    }
    if (signals->received() != 0 && stop_deadline == absl::InfiniteFuture()) {
      stop_deadline = absl::Now() + chief_grace + stop_grace;
    }
    if (absl::Now() >= stop_deadline) break;
  }
  leaving = true;
  signals->stop()->Deregister(on_stop);  // waits for it if it runs (an EndRun in progress completes)
  // The thread that ended the run may still be writing the final checkpoint (the loop above gives up at its
  // deadlines): it is on disk, or failed, before this task says how it ended.
  const double final_save_wait_secs = std::max(0.0, absl::GetFlag(FLAGS_final_save_wait_secs));
  const absl::Status saved = ps->WaitFinalCheckpoint(absl::Seconds(final_save_wait_secs));
  (*server)->Wait(absl::ZeroDuration());  // serves until no worker needs it (bounded), then shuts down
  // What became of every push this task received (ps/core/parameter_server.h: PushAccounting); tests/chaos.sh
  // checks that it balances.
  LOG(INFO) << "ps task " << cluster->task_index << ": accounting: global_step="
            << (*server)->parameter_server()->step() << " "
            << (*server)->parameter_server()->accounting().DebugString();
  if (!saved.ok()) {
    std::fprintf(stderr, "dtrain_ps: ps task %d: the final checkpoint was not saved: %s%s\n", task,
                 std::string(saved.message()).c_str(),
                 absl::IsUnavailable(saved) ? absl::StrCat(" after ", final_save_wait_secs,
                                                           " s (--final_save_wait_secs)").c_str()
                                            : "");
    return dtrain::kExitError;
  }
  if (signals->received() != 0) {
    std::fprintf(stderr, "dtrain_ps: ps task %d: stopped by %s%s\n", task, signals->received_name().c_str(),
                 finished ? absl::StrCat("; ", ps->outcome().message).c_str()
                          : "; some workers had not left yet (they hear of it at their next call)");
    return dtrain::ExitCodeForSignal(signals->received());
  }
  if (!finished) {
    std::fprintf(stderr, "dtrain_ps: gave up after --max_run_secs=%g with workers still running\n", max_secs);
    return dtrain::kExitError;
  }
  // The summary line, the same the chief prints.
  const dtrain::ps::TrainingOutcome outcome = ps->outcome();
  std::fprintf(stderr, "dtrain_ps: ps task %d: %s\n", task, outcome.message.c_str());
  return dtrain::ps::ExitCodeOfRun(outcome.kind, absl::GetFlag(FLAGS_allow_degraded));
}
