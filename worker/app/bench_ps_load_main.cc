// dtrain_bench_ps_load: many workers on one ps task. One real dtrain_ps process (started from beside this binary
// on a free port of 127.0.0.1) and --workers worker clients in this process, each with its own connection,
// worker id and WorkerClient (the one dtrain_worker uses), push a model's gradients and pull its parameters for
// steps, overlapped as in training: in sync mode every step aggregates all the workers' pushes; in async
// mode each push is applied as it comes. Every push must be answered. In sync mode each step's pulled values are
// also checked (every worker pushes the same +d / -d gradient, so the values alternate between two known
// buffers: checksums).
//
// What the ps's CPU allows: the ps process's CPU time (utime + stime, /proc/PID/stat) over the timed steps, per
// step and per push. A ps task's work per sync step is one apply plus, per worker, one push received and
// summed and one pull served; so its CPU time per step at W workers should be a + b x W. The runs of the two
// smallest --workers counts of the list give a and b; each larger count's measured CPU per step is compared with
// that line: at 1.00 the task spends on 64 workers exactly what 64 times one worker's share costs (no lock
// contention, no per-connection overhead growing with the count); above 1, what the extra workers cost beyond
// their share. (Async: per push, each the same work whatever the count: the reference is the two smallest
// counts' mean.) The step rate is the other side of it: the task's busy fraction
// (CPU seconds over wall seconds) says whether it, or the clients and the machine's cores, set the pace.
//
// Every run carries the same number of pushes (--pushes: each worker's steps are that over the count). The counts
// run interleaved (1, 4, 64, 1, 4, 64, ... for --repeats rounds), each on a fresh ps process; the
// table shows medians.
//
//   dtrain_bench_ps_load --workers=1,4,64 --mode=sync --model=mlp --pushes=2560
//
// Pin the whole command with taskset to keep it off cores that other work uses; `--ps_cpus` pins the ps alone.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <glog/logging.h>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/command_line.h"
#include "common/crc32c.h"
#include "common/free_ports.h"
#include "common/malloc_tuning.h"
#include "common/process_clock.h"
#include "common/mutex_config.h"
#include "ps/client/placement.h"
#include "ps/client/worker_client.h"
#include "ps/rpc/grpc_ps_client.h"
#include "ps/rpc/transport.h"
#include "worker/app/bench_process.h"
#include "worker/models/model.h"
#include "worker/models/registry.h"

ABSL_FLAG(std::string, workers, "1,4,64", "Worker counts to run, comma-separated (the two smallest fit the line)");
ABSL_FLAG(std::string, mode, "sync", "sync | async");
ABSL_FLAG(std::string, model, "mlp", "Move this model's parameters (mlp | cnn | convnet | cifar10 | PATH.onnx)");
ABSL_FLAG(int64_t, pushes, 2560,
          "Timed pushes per run, the same for every count (each worker's steps: pushes / workers, at least 10)");
ABSL_FLAG(int, warmup_steps, 5, "Steps per worker before timing");
ABSL_FLAG(int, repeats, 3, "Rounds over the worker counts (interleaved); the table shows medians");
ABSL_FLAG(std::string, transport, "grpc", "grpc | shm | tcp | auto: how the workers reach the ps");
ABSL_FLAG(std::string, ps_binary, "", "The dtrain_ps to start (default: beside this binary)");
ABSL_FLAG(std::string, ps_cpus, "", "Run the ps under taskset -c LIST (default: where this process runs)");
ABSL_FLAG(double, max_overhead, 0,
          "If > 0: exit 1 when a larger count's CPU per step exceeds the line's by more than this fraction "
          "(0.10: issue 41's target)");

namespace dtrain {
namespace {

int Fail(const std::string& what, const absl::Status& s) {
  std::fprintf(stderr, "dtrain_bench_ps_load: %s: %s\n", what.c_str(), s.ToString().c_str());
  return 1;
}

struct Model {
  std::vector<ps::VariableInfo> vars;
  int64_t n = 0;  // floats
};

struct RunResult {
  int workers = 0, steps = 0;  // steps: each worker's timed steps
  int64_t pushes = 0, answered = 0, bad_checksums = 0;
  double wall_s = 0, ps_cpu_s = 0;
  int64_t ps_hwm = 0;
  std::string error;  // empty: every call succeeded
};

// One run: a fresh dtrain_ps for `w` workers, the workers' threads here, warm-up, the timed steps.
RunResult RunOnce(const Model& model, int w, bool sync, ps::Transport transport, const std::string& ps_binary) {
  RunResult r;
  r.workers = w;
  const std::vector<int> ports = FreePorts(1);
  if (ports.empty()) return r.error = "cannot bind a socket on 127.0.0.1", r;
  // The spec lists w worker addresses; a ps task never connects to its workers, so they need no servers.
  std::string worker_hosts;
  for (int i = 0; i < w; ++i) absl::StrAppend(&worker_hosts, i ? "," : "", "127.0.0.1:", 1024 + i);
  std::vector<std::string> args;
  if (!absl::GetFlag(FLAGS_ps_cpus).empty()) args = {"taskset", "-c", absl::GetFlag(FLAGS_ps_cpus)};
  const std::string log = absl::StrCat("/tmp/dtrain_bench_ps_load.", getpid(), ".w", w, ".log");
  for (const std::string& a :
       {ps_binary, std::string("--job_name=ps"), std::string("--task_index=0"),
        absl::StrCat("--ps_hosts=127.0.0.1:", ports[0]), absl::StrCat("--worker_hosts=", worker_hosts),
        std::string("--worker_timeout_secs=0"), std::string("--registration_timeout_secs=60"),
        absl::StrCat("--transport=", absl::GetFlag(FLAGS_transport))}) {
    args.push_back(a);
  }
  absl::StatusOr<pid_t> spawned = SpawnWithLog(args, log);
  if (!spawned.ok()) return r.error = spawned.status().ToString(), r;
  const pid_t pid = *spawned;
  auto stop = [&] {
    kill(pid, SIGTERM);
    waitpid(pid, nullptr, 0);
  };
  absl::StatusOr<ps::Placement> placement = ps::PlaceVariables(model.vars, 1);
  if (!placement.ok()) return stop(), r.error = placement.status().ToString(), r;
  ps::TrainConfig config;
  config.model_signature = "dtrain_bench_ps_load";
  config.mode = sync ? "sync" : "async";
  config.num_workers = w;
  config.optimizer.name = "sgd";
  config.optimizer.learning_rate = 1.0f;
  // Small integers and +d / -d gradients, the same for every worker: in sync mode their average is d, every
  // update exact, and the values alternate between two buffers whose checksums are known (dtrain_bench_ps's way).
  const int64_t n = model.n;
  std::vector<float> initial(n), after_plus(n), plus(n), minus(n);
  for (int64_t i = 0; i < n; ++i) {
    initial[i] = static_cast<float>(i % 64);
    plus[i] = static_cast<float>(1 + i % 3);
    minus[i] = -plus[i];
    after_plus[i] = initial[i] - plus[i];
  }
  const uint32_t crc[2] = {crc32c::Value(reinterpret_cast<const char*>(initial.data()), n * 4),
                           crc32c::Value(reinterpret_cast<const char*>(after_plus.data()), n * 4)};
  const int warmup = absl::GetFlag(FLAGS_warmup_steps);
  const int steps = static_cast<int>(std::max<int64_t>(10, absl::GetFlag(FLAGS_pushes) / w));
  r.steps = steps;

  // The workers meet after their warm-up (the timed window starts when the last is through) and after their
  // last step (each says Done only then: the ps ends its run when all have).
  struct Meeting {
    absl::Mutex mu;
    int w = 0, warmed = 0, finished = 0;
    bool go = false, all_done = false;
    std::string error;  // the first failure
    bool WarmedOrFailed() const { return warmed >= w || !error.empty(); }
    bool FinishedOrFailed() const { return finished >= w || !error.empty(); }
  } m;
  m.w = w;
  std::atomic<int64_t> answered{0}, bad{0};
  auto fail = [&](int i, const absl::Status& s) {
    absl::MutexLock l(&m.mu);
    if (m.error.empty()) m.error = absl::StrCat("worker ", i, ": ", s.ToString());
  };
  auto worker = [&](int i) {
    ps::PsClientOptions co;
    co.transport = transport;
    co.grpc.connection_group = i + 1;  // a connection of its own, as a worker process has
    absl::StatusOr<std::unique_ptr<ps::PsInterface>> task =
        ps::NewPsClient(absl::StrCat("127.0.0.1:", ports[0]), co);
    if (!task.ok()) return fail(i, task.status());
    ps::WorkerClientOptions wo;
    wo.step_timeout = absl::Minutes(2);
    ps::WorkerClient client({task->get()}, placement->task_slices, i, /*is_chief=*/i == 0, wo);
    std::vector<float> params(n);
    if (absl::Status s = client.Connect(config, initial.data(), absl::Seconds(60)); !s.ok()) return fail(i, s);
    for (int s = 0; s < warmup + steps; ++s) {
      if (s == warmup) {
        absl::MutexLock l(&m.mu);
        ++m.warmed;
        m.mu.Await(absl::Condition(&m.go));
        if (!m.error.empty()) return;
      }
      const float* grads = s % 2 == 0 ? plus.data() : minus.data();
      if (absl::Status st = client.BeginPush(s, grads); !st.ok()) return fail(i, st);
      client.FinishPush();
      client.StartPull(s + 1, s, params.data());
      absl::StatusOr<ps::PullResult> pulled = client.FinishPull();
      if (!pulled.ok()) return fail(i, pulled.status());
      absl::StatusOr<ps::PushResponse> pushed = client.WaitPush();
      if (!pushed.ok()) return fail(i, pushed.status());
      if (s >= warmup) ++answered;
      if (sync && crc32c::Value(reinterpret_cast<const char*>(params.data()), n * 4) != crc[(s + 1) % 2]) ++bad;
    }
    bool failed = false;
    {
      absl::MutexLock l(&m.mu);
      ++m.finished;
      m.mu.Await(absl::Condition(&m.all_done));
      failed = !m.error.empty();
    }
    // Every worker says Done, as dtrain_worker does; the ps ends when all have.
    if (!failed) client.Done().IgnoreError();
  };
  std::vector<std::thread> threads;
  for (int i = 0; i < w; ++i) threads.emplace_back(worker, i);
  double cpu0 = 0;
  absl::Time t0;
  {
    absl::MutexLock l(&m.mu);
    if (!m.mu.AwaitWithTimeout(absl::Condition(&m, &Meeting::WarmedOrFailed), absl::Minutes(5))) {
      m.error = "the workers did not connect and warm up within 5 minutes";
    }
    cpu0 = ProcessCpuSeconds(pid);
    t0 = absl::Now();
    m.go = true;
    if (m.error.empty() &&
        !m.mu.AwaitWithTimeout(absl::Condition(&m, &Meeting::FinishedOrFailed), absl::Minutes(10))) {
      m.error = "the timed steps did not end within 10 minutes";
    }
    r.wall_s = absl::ToDoubleSeconds(absl::Now() - t0);
    r.ps_cpu_s = ProcessCpuSeconds(pid) - cpu0;
    r.ps_hwm = ReadProcessMemory(pid).peak;
    m.all_done = true;
    if (!m.error.empty()) kill(pid, SIGKILL);  // the others' calls end at once
  }
  for (std::thread& t : threads) t.join();
  int status = 0;
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (absl::Now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      break;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  const std::string error = m.error;
  r.pushes = static_cast<int64_t>(w) * steps;
  r.answered = answered.load();
  r.bad_checksums = bad.load();
  r.error = error;
  if (r.error.empty() && !(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
    r.error = absl::StrCat("dtrain_ps ended with status ", status, " (", log, ")");
  }
  if (r.error.empty()) unlink(log.c_str());
  return r;
}

int Main() {
  DisableMutexDeadlockDetection();
  const std::string mode = absl::GetFlag(FLAGS_mode);
  if (mode != "sync" && mode != "async") return Fail("--mode", absl::InvalidArgumentError(mode + ": sync or async"));
  const bool sync = mode == "sync";
  std::vector<int> counts;
  for (absl::string_view c : absl::StrSplit(absl::GetFlag(FLAGS_workers), ',')) {
    int k = 0;
    if (!absl::SimpleAtoi(c, &k) || k < 1 || k > 1024) {
      return Fail("--workers", absl::InvalidArgumentError(absl::StrCat("'", c, "': a count from 1 to 1024")));
    }
    counts.push_back(k);
  }
  std::sort(counts.begin(), counts.end());
  counts.erase(std::unique(counts.begin(), counts.end()), counts.end());
  if (counts.size() < 2) return Fail("--workers", absl::InvalidArgumentError("at least two different counts"));
  if (absl::GetFlag(FLAGS_pushes) < 1 || absl::GetFlag(FLAGS_warmup_steps) < 1 || absl::GetFlag(FLAGS_repeats) < 1) {
    return Fail("flags", absl::InvalidArgumentError("--pushes, --warmup_steps and --repeats must be >= 1"));
  }
  absl::StatusOr<ps::Transport> transport = ps::ParseTransport(absl::GetFlag(FLAGS_transport));
  if (!transport.ok()) return Fail("--transport", transport.status());
  absl::StatusOr<models::ModelRef> spec = models::ResolveModel(absl::GetFlag(FLAGS_model));
  if (!spec.ok()) return Fail("--model", spec.status());
  const models::ModelDefaults& d = (*spec)->defaults;
  models::ModelOptions mo;
  models::SetInputGeometry(d, d.data_height, d.data_width, d.data_channels, &mo);
  absl::StatusOr<std::vector<models::VariableInfo>> mv = models::ModelVariables(**spec, mo);
  if (!mv.ok()) return Fail("--model", mv.status());
  Model model;
  for (const models::VariableInfo& v : *mv) {
    model.vars.push_back({v.name, v.size(), v.trainable});
    model.n += v.size();
  }
  std::string ps_binary = absl::GetFlag(FLAGS_ps_binary);
  if (ps_binary.empty()) {
    char self[4096];
    const ssize_t len = readlink("/proc/self/exe", self, sizeof(self) - 1);
    const std::string exe = len > 0 ? std::string(self, len) : "./x";
    ps_binary = exe.substr(0, exe.find_last_of('/')) + "/dtrain_ps";
  }
  std::printf("dtrain_bench_ps_load: model=%s (%.2f MB) mode=%s transport=%s workers=%s, %ld timed pushes a run "
              "after %d warm-up steps, %d rounds interleaved, %u cores here\n",
              absl::GetFlag(FLAGS_model).c_str(), model.n * 4 / 1e6, mode.c_str(),
              absl::GetFlag(FLAGS_transport).c_str(), absl::GetFlag(FLAGS_workers).c_str(),
              static_cast<long>(absl::GetFlag(FLAGS_pushes)), absl::GetFlag(FLAGS_warmup_steps),
              absl::GetFlag(FLAGS_repeats),
              std::thread::hardware_concurrency());
  std::fflush(stdout);
  std::vector<std::vector<RunResult>> runs(counts.size());
  int failures = 0;
  for (int round = 0; round < absl::GetFlag(FLAGS_repeats); ++round) {
    for (size_t c = 0; c < counts.size(); ++c) {
      RunResult r = RunOnce(model, counts[c], sync, *transport, ps_binary);
      const double steps = sync ? r.steps : static_cast<double>(r.answered);
      std::printf("  round %d, %d workers: %ld/%ld pushes answered, %.2f s, ps CPU %.3f s (%.0f%% of a core), "
                  "%.3f ms CPU per %s%s%s\n",
                  round + 1, counts[c], static_cast<long>(r.answered), static_cast<long>(r.pushes), r.wall_s,
                  r.ps_cpu_s, 100 * r.ps_cpu_s / std::max(r.wall_s, 1e-9), 1e3 * r.ps_cpu_s / std::max(steps, 1.0),
                  sync ? "step" : "push",
                  r.bad_checksums > 0 ? absl::StrCat(", ", r.bad_checksums, " WRONG VALUES").c_str() : "",
                  r.error.empty() ? "" : absl::StrCat(" FAILED: ", r.error).c_str());
      std::fflush(stdout);
      if (!r.error.empty() || r.answered != r.pushes || r.bad_checksums > 0) ++failures;
      runs[c].push_back(std::move(r));
    }
  }
  // Medians per count; the line through the two smallest counts' CPU per unit (step in sync, push in async).
  struct Row {
    int workers;
    double rate, per_unit_ms, busy, hwm_mib;
  };
  std::vector<Row> rows;
  for (size_t c = 0; c < counts.size(); ++c) {
    std::vector<double> rate, unit, busy, hwm;
    for (const RunResult& r : runs[c]) {
      const double steps = sync ? r.steps : static_cast<double>(r.answered);
      rate.push_back(steps / std::max(r.wall_s, 1e-9));
      unit.push_back(1e3 * r.ps_cpu_s / std::max(steps, 1.0));
      busy.push_back(r.ps_cpu_s / std::max(r.wall_s, 1e-9));
      hwm.push_back(r.ps_hwm / 1048576.0);
    }
    rows.push_back({counts[c], Median(rate), Median(unit), Median(busy), Median(hwm)});
  }
  // sync: cpu(step) = a + b W, the line through the two smallest counts (b: one worker's push received and
  // summed and its pull served; a: the apply). async: cpu(push) is the same work whatever the count, so the
  // reference is the two smallest counts' mean (a) and b = 0.
  double a, b;
  if (sync) {
    b = (rows[1].per_unit_ms - rows[0].per_unit_ms) / (rows[1].workers - rows[0].workers);
    a = rows[0].per_unit_ms - b * rows[0].workers;
  } else {
    a = (rows[0].per_unit_ms + rows[1].per_unit_ms) / 2;
    b = 0;
  }
  const char* unit = sync ? "step" : "push";
  std::printf("%8s %12s %16s %14s %10s %12s %10s\n", "workers", sync ? "steps/s" : "pushes/s",
              absl::StrCat("ps CPU ms/", unit).c_str(), "reference ms", "ratio", "ps busy", "ps peak");
  double worst = 0;
  for (const Row& row : rows) {
    const double line = a + b * row.workers;
    const double ratio = row.per_unit_ms / std::max(line, 1e-9);
    if (row.workers > rows[1].workers) worst = std::max(worst, ratio - 1);
    std::printf("%8d %12.1f %16.3f %14.3f %10.3f %11.0f%% %7.1f MiB\n", row.workers, row.rate, row.per_unit_ms,
                line, ratio, 100 * row.busy, row.hwm_mib);
  }
  std::printf("dtrain_bench_ps_load: the reference from %d and %d workers: %.3f + %.4f x workers ms of ps CPU per "
              "%s; the larger counts spend at most %+.1f%% beyond it; %s\n",
              rows[0].workers, rows[1].workers, a, b, unit, 100 * worst,
              failures == 0 ? "every push answered" : absl::StrCat(failures, " runs FAILED").c_str());
  const double limit = absl::GetFlag(FLAGS_max_overhead);
  return failures == 0 && (limit <= 0 || worst <= limit) ? 0 : 1;
}

}  // namespace
}  // namespace dtrain

int main(int argc, char** argv) {
  dtrain::TuneMallocForLargeReusedBuffers();
  dtrain::CommandLineSpec spec;
  spec.program = "dtrain_bench_ps_load";
  spec.summary = "many workers on one ps task: every push answered, and the ps's CPU per step against a line";
  spec.epilogue = "Exit codes: 0 measured, every push answered (and within --max_overhead); 1 otherwise; 2 bad flags.";
  dtrain::ParseCommandLineOrExit(argc, argv, spec);
  FLAGS_logtostderr = true;
  FLAGS_minloglevel = 1;
  google::InitGoogleLogging(argv[0]);
  return dtrain::Main();
}
