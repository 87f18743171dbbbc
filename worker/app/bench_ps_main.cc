// dtrain_bench_ps: the data path alone. One ps task (a gRPC server on 127.0.0.1) and one worker-side client
// (the WorkerClient that dtrain_worker uses) move a model's parameters (--model=cnn; or one variable of
// --bytes=N): each step pushes the gradients and pulls the updated parameters, overlapped as in training (the
// pull starts right after the commit and streams each slice as the ps has applied it). Every pulled buffer is
// checked against its expected CRC32C. In the same run, a plain TCP round trip of the same bytes (send N, get
// N back, on 127.0.0.1) is the reference.
//
//   dtrain_bench_ps --model=cnn
//   → ... push+pull median_ms=9.8 raw_tcp median_ms=8.1 ratio=1.21
//
// Sparse mode (--sparse_rows=N): one hash-keyed embedding table of N rows (ids are hashed feature values) on
// --num_ps real dtrain_ps processes (started from beside this binary, on free ports of 127.0.0.1) and
// --dense_floats dense parameters. Each sync step pulls the rows of --ids_per_step unique ids with the dense
// parameters and pushes their gradients; the ids walk through the N ids in order, so N / ids_per_step steps
// create every row once, then further steps (--steps beyond that) touch ids seen before. Verifies every row
// pulled for the first time against the initializer (#wrong), and reports bytes per step on the wire
// (WireCounters) against (ids x dim x 4 x 2 + dense x 4 x 2), rows created per second, and per ps task its rows,
// evictions and RSS against rows x (dim + dim x slots) x 4.
//
//   dtrain_bench_ps --sparse_rows=50000000 --dim=16 --ids_per_step=100000 --num_ps=2 --max_rows=25000000
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <glog/logging.h>

#include "absl/flags/flag.h"
#include "common/command_line.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/crc32c.h"
#include "common/denormals.h"
#include "common/malloc_tuning.h"
#include "common/mutex_config.h"
#include "ps/rpc/grpc_ps_client.h"
#include "ps/client/placement.h"
#include "ps/rpc/server.h"
#include "ps/client/worker_client.h"
#include "worker/models/model.h"
#include "worker/models/registry.h"

ABSL_FLAG(std::string, model, "cnn", "Move this model's parameters (mlp | cnn | convnet | cifar10 | PATH.onnx)");
ABSL_FLAG(int64_t, bytes, 0, "Instead of a model: one variable of this many bytes");
ABSL_FLAG(int, steps, 40, "Timed steps (push + pull each)");
ABSL_FLAG(int, warmup_steps, 5, "Steps before timing");
ABSL_FLAG(std::string, wire_dtype, "fp32", "fp32 | bf16 | fp16 on the wire");
ABSL_FLAG(int64_t, sparse_rows, 0, "Sparse mode: the embedding table's rows (hash-keyed; 0: dense mode)");
ABSL_FLAG(int, dim, 16, "Sparse mode: floats per row");
ABSL_FLAG(int64_t, ids_per_step, 10000, "Sparse mode: unique ids each step pulls and pushes");
ABSL_FLAG(int, num_ps, 2, "Sparse mode: dtrain_ps processes");
ABSL_FLAG(int64_t, max_rows, 0, "Sparse mode: the table's max_rows per ps task (0: no bound)");
ABSL_FLAG(int64_t, dense_floats, 1000, "Sparse mode: dense parameters beside the table");
ABSL_FLAG(std::string, sparse_optimizer, "adagrad", "Sparse mode: sgd | adagrad | adam | ftrl");
ABSL_FLAG(std::string, ps_binary, "", "Sparse mode: the dtrain_ps to start (default: beside this binary)");
ABSL_FLAG(double, hold_secs, 0, "Sparse mode: keep the ps processes up this long after the report (to inspect them)");

namespace dtrain {
namespace {

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

int Fail(const std::string& what, const absl::Status& s) {
  std::fprintf(stderr, "dtrain_bench_ps: %s: %s\n", what.c_str(), s.ToString().c_str());
  return what == "flags" || what == "--model" ? 2 : 1;  // a bad flag: common/exit_codes.h
}

// Reads or writes exactly n bytes; false on a closed or broken socket.
bool SendAll(int fd, const char* p, size_t n) {
  while (n > 0) {
    const ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
    if (k <= 0) return false;
    p += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}
bool RecvAll(int fd, char* p, size_t n) {
  while (n > 0) {
    const ssize_t k = recv(fd, p, n, 0);
    if (k <= 0) return false;
    p += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

// Median milliseconds of `rounds` round trips of `n` bytes each way over TCP on 127.0.0.1 (an echo server
// thread answering from its own buffer), or -1 on a socket error.
double RawTcpRoundTripMs(size_t n, int warmup, int rounds) {
  const int listener = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (listener < 0 || bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      listen(listener, 1) != 0 || getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    return -1;
  }
  const int total = warmup + rounds;
  std::thread server([&] {
    const int fd = accept(listener, nullptr, nullptr);
    if (fd < 0) return;
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    std::vector<char> in(n), out(n, 'p');
    for (int i = 0; i < total; ++i) {
      if (!RecvAll(fd, in.data(), n) || !SendAll(fd, out.data(), n)) break;
    }
    close(fd);
  });
  std::vector<double> ms;
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  bool ok = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  std::vector<char> out(n, 'w'), in(n);
  for (int i = 0; ok && i < total; ++i) {
    const absl::Time t0 = absl::Now();
    ok = SendAll(fd, out.data(), n) && RecvAll(fd, in.data(), n);
    if (i >= warmup) ms.push_back(absl::ToDoubleMilliseconds(absl::Now() - t0));
  }
  close(fd);
  server.join();
  close(listener);
  return ok ? Median(ms) : -1;
}

// ---- sparse mode ------------------------------------------------------------------------------------------------

// `count` distinct free ports on 127.0.0.1: every socket stays bound until all are picked (one at a time, the
// kernel may hand the same port out twice). Empty when sockets cannot be made.
std::vector<int> FreePorts(int count) {
  std::vector<int> fds, ports;
  for (int i = 0; i < count; ++i) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) break;
    fds.push_back(fd);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
        getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      break;
    }
    ports.push_back(ntohs(addr.sin_port));
  }
  for (int fd : fds) close(fd);
  if (static_cast<int>(ports.size()) != count) ports.clear();
  return ports;
}

// VmRSS and VmHWM of a process, in bytes (-1 if unreadable).
std::pair<int64_t, int64_t> Rss(pid_t pid) {
  std::ifstream f(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  int64_t rss = -1, hwm = -1;
  while (std::getline(f, line)) {
    long kb = 0;
    if (std::sscanf(line.c_str(), "VmRSS: %ld kB", &kb) == 1) rss = kb * 1024;
    if (std::sscanf(line.c_str(), "VmHWM: %ld kB", &kb) == 1) hwm = kb * 1024;
  }
  return {rss, hwm};
}

pid_t Spawn(const std::vector<std::string>& args, const std::string& log) {
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  pid_t pid = -1;
  if (posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ) != 0) pid = -1;
  posix_spawn_file_actions_destroy(&actions);
  return pid;
}

int SparseMain() {
  const int64_t n = absl::GetFlag(FLAGS_sparse_rows), k = absl::GetFlag(FLAGS_ids_per_step);
  const int dim = absl::GetFlag(FLAGS_dim), num_ps = absl::GetFlag(FLAGS_num_ps);
  const int64_t dense = absl::GetFlag(FLAGS_dense_floats);
  absl::StatusOr<ps::WireDtype> dtype = ps::ParseWireDtype(absl::GetFlag(FLAGS_wire_dtype));
  if (!dtype.ok()) return Fail("flags", dtype.status());
  if (k < 1 || dim < 1 || num_ps < 1 || dense < 1) {
    return Fail("flags", absl::InvalidArgumentError("--ids_per_step, --dim, --num_ps, --dense_floats must be >= 1"));
  }
  std::string ps_binary = absl::GetFlag(FLAGS_ps_binary);
  if (ps_binary.empty()) {
    char self[4096];
    const ssize_t len = readlink("/proc/self/exe", self, sizeof(self) - 1);
    std::string dir = len > 0 ? std::string(self, len) : ".";
    ps_binary = dir.substr(0, dir.find_last_of('/')) + "/dtrain_ps";
  }
  // The cluster: num_ps ps processes, one worker (this process).
  const std::vector<int> ports = FreePorts(num_ps + 1);
  if (ports.empty()) return Fail("ports", absl::UnavailableError("cannot bind sockets on 127.0.0.1"));
  std::string ps_hosts;
  for (int i = 0; i < num_ps; ++i) absl::StrAppend(&ps_hosts, i ? "," : "", "127.0.0.1:", ports[i]);
  std::vector<pid_t> pids;
  for (int i = 0; i < num_ps; ++i) {
    const std::string log = absl::StrCat("/tmp/dtrain_bench_ps.", getpid(), ".ps", i, ".log");
    pids.push_back(Spawn({ps_binary, "--job_name=ps", absl::StrCat("--task_index=", i),
                          absl::StrCat("--ps_hosts=", ps_hosts), absl::StrCat("--worker_hosts=127.0.0.1:", ports[num_ps]),
                          "--worker_timeout_secs=0", "--registration_timeout_secs=120", "--malloc_trim_secs=2",
                          "--max_model_bytes=1099511627776"},
                         log));
    if (pids.back() < 0) return Fail("starting " + ps_binary, absl::UnavailableError("posix_spawn failed"));
  }
  auto stop_all = [&] {
    for (pid_t pid : pids) kill(pid, SIGTERM);
    for (pid_t pid : pids) waitpid(pid, nullptr, 0);
  };
  ps::WireCounters counters;
  ps::GrpcClientOptions co;
  co.counters = &counters;
  std::vector<std::unique_ptr<ps::PsInterface>> owned;
  std::vector<ps::PsInterface*> tasks;
  for (int i = 0; i < num_ps; ++i) {
    absl::StatusOr<std::unique_ptr<ps::PsInterface>> t = ps::NewGrpcPsClient(absl::StrCat("127.0.0.1:", ports[i]), co);
    if (!t.ok()) return stop_all(), Fail("ps client", t.status());
    owned.push_back(*std::move(t));
    tasks.push_back(owned.back().get());
  }
  absl::StatusOr<ps::Placement> placement = ps::PlaceVariables({{"dense", dense}}, num_ps);
  if (!placement.ok()) return stop_all(), Fail("placement", placement.status());
  ps::TrainConfig config;
  config.model_signature = "dtrain_bench_ps/sparse";
  config.num_workers = 1;
  config.optimizer.name = "sgd";
  ps::SparseTableSpec table;
  table.name = "emb";
  table.dim = dim;
  table.init_scale = 0.05f;
  table.max_rows = absl::GetFlag(FLAGS_max_rows);
  config.tables = {table};
  config.sparse_optimizer.name = absl::GetFlag(FLAGS_sparse_optimizer);
  ps::WorkerClientOptions wo;
  wo.wire_dtype = *dtype;
  wo.step_timeout = absl::Minutes(10);
  ps::WorkerClient client(tasks, placement->task_slices, 0, /*is_chief=*/true, wo);
  std::vector<float> params(dense, 0.0f), grads(dense, 1e-3f);
  if (absl::Status s = client.Connect(config, params.data(), absl::Seconds(60)); !s.ok()) {
    return stop_all(), Fail("connect", s);
  }
  std::vector<int64_t> base_rss(num_ps);
  for (int i = 0; i < num_ps; ++i) base_rss[i] = Rss(pids[i]).first;

  const int64_t fill_steps = (n + k - 1) / k;
  const int64_t steps = std::max<int64_t>(fill_steps, absl::GetFlag(FLAGS_steps));
  std::vector<int64_t> ids(k);
  std::vector<float> rows(k * dim), row_grads(k * dim, 1e-3f), want(dim);
  int64_t next = 0, wrong = 0, checked = 0;
  auto next_ids = [&](int64_t s) {
    ids.clear();
    for (int64_t j = 0; j < k; ++j) ids.push_back(static_cast<int64_t>(ps::Mix64(static_cast<uint64_t>(next++ % n))));
    return s < fill_steps;  // the first pass: every row pulled is new
  };
  bool fresh = next_ids(0);
  const absl::Time start = absl::Now();
  absl::Time fill_end = start;
  int64_t bytes_fill = 0;
  std::printf("dtrain_bench_ps: sparse rows=%ld dim=%d ids_per_step=%ld num_ps=%d max_rows=%ld dense=%ld %s %s\n",
              static_cast<long>(n), dim, static_cast<long>(k), num_ps, static_cast<long>(table.max_rows),
              static_cast<long>(dense), config.sparse_optimizer.name.c_str(), std::string(ps::DtypeName(*dtype)).c_str());
  for (int64_t s = 0; s < steps; ++s) {
    absl::StatusOr<ps::PullResult> pulled =
        client.Pull(s, s > 0 ? s - 1 : 0, params.data(), {{0, ids.data(), static_cast<int64_t>(ids.size()), rows.data()}});
    if (!pulled.ok()) return stop_all(), Fail("pull", pulled.status());
    if (fresh) {
      for (int64_t j = s % 97; j < static_cast<int64_t>(ids.size()); j += 97) {
        ps::SparseInitialRow(table, ids[j], want.data());
        ++checked;
        for (int c = 0; c < dim; ++c) {
          if (rows[j * dim + c] != ps::RoundTrip(*dtype, want[c])) {
            ++wrong;
            break;
          }
        }
      }
    }
    absl::StatusOr<ps::PushResponse> pushed =
        client.Push(s, grads.data(), {{0, ids.data(), static_cast<int64_t>(ids.size()), row_grads.data()}});
    if (!pushed.ok()) return stop_all(), Fail("push", pushed.status());
    if (s + 1 == fill_steps) {
      fill_end = absl::Now();
      bytes_fill = counters.sent + counters.received;
    }
    fresh = next_ids(s + 1);
    if ((s + 1) % std::max<int64_t>(1, steps / 10) == 0) {
      std::printf("  step %ld/%ld: %.1f s\n", static_cast<long>(s + 1), static_cast<long>(steps),
                  absl::ToDoubleSeconds(absl::Now() - start));
      std::fflush(stdout);
    }
  }
  const double secs = absl::ToDoubleSeconds(absl::Now() - start);
  const double fill_secs = absl::ToDoubleSeconds(fill_end - start);
  const int64_t bytes = counters.sent + counters.received;
  const double per_step = static_cast<double>(bytes) / steps;
  const double formula = k * dim * 4.0 * 2 + dense * 4.0 * 2;
  std::printf("dtrain_bench_ps: %ld steps in %.1f s (%.1f steps/s); filling %ld rows took %.1f s (%.0f rows/s); "
              "checked %ld fresh rows, %ld wrong\n",
              static_cast<long>(steps), secs, steps / secs, static_cast<long>(std::min(n, fill_steps * k)), fill_secs,
              std::min(n, fill_steps * k) / std::max(fill_secs, 1e-9), static_cast<long>(checked),
              static_cast<long>(wrong));
  std::printf("  wire: %.0f bytes/step, %.3f x formula (ids x dim x 4 x 2 + dense x 4 x 2 = %.0f)%s\n", per_step,
              per_step / formula, formula,
              bytes_fill > 0 ? absl::StrFormat(", filling %.0f bytes/step", static_cast<double>(bytes_fill) / fill_steps).c_str() : "");
  const int slots = config.sparse_optimizer.num_slots();
  int64_t total_rows = 0;
  for (int i = 0; i < num_ps; ++i) {
    absl::StatusOr<ps::TrainingStats> stats = client.Stats(i);
    if (!stats.ok() || stats->tables.empty()) return stop_all(), Fail("stats", stats.status());
    const ps::SparseTableStats& t = stats->tables[0];
    total_rows += t.rows;
    const auto [rss, hwm] = Rss(pids[i]);
    const double floats = static_cast<double>(t.rows) * dim * (1 + slots) * 4;
    std::printf("  ps %d: rows=%ld created=%ld evicted=%ld (max_rows %ld) | RSS %.3f GiB (peak %.3f), at start "
                "%.1f MiB; rows x (dim + slots) x 4 = %.3f GiB; RSS - start = %.4f x that (%.1f bytes per row "
                "beyond the floats; the store counts %.1f)\n",
                i, static_cast<long>(t.rows), static_cast<long>(t.created), static_cast<long>(t.evicted),
                static_cast<long>(table.max_rows), rss / 1073741824.0, hwm / 1073741824.0, base_rss[i] / 1048576.0,
                floats / 1073741824.0, (rss - base_rss[i]) / std::max(floats, 1.0),
                t.rows > 0 ? (rss - base_rss[i] - floats) / t.rows : 0.0,
                t.rows > 0 ? (t.bytes - floats) / t.rows : 0.0);
    if (table.max_rows > 0 && t.rows > table.max_rows) ++wrong;
  }
  std::printf("  rows held: %ld (ps pids:", static_cast<long>(total_rows));
  for (pid_t pid : pids) std::printf(" %d", static_cast<int>(pid));
  std::printf(")\n");
  std::fflush(stdout);
  absl::SleepFor(absl::Seconds(absl::GetFlag(FLAGS_hold_secs)));
  client.Done().IgnoreError();
  for (pid_t pid : pids) waitpid(pid, nullptr, 0);
  return wrong == 0 ? 0 : 1;
}

int Main() {
  SetFlushDenormals();
  DisableMutexDeadlockDetection();
  if (absl::GetFlag(FLAGS_sparse_rows) > 0) return SparseMain();
  absl::StatusOr<ps::WireDtype> dtype = ps::ParseWireDtype(absl::GetFlag(FLAGS_wire_dtype));
  if (!dtype.ok()) return Fail("flags", dtype.status());
  std::vector<ps::VariableInfo> vars;
  std::string what;
  if (absl::GetFlag(FLAGS_bytes) > 0) {
    vars.push_back({"bytes", std::max<int64_t>(1, absl::GetFlag(FLAGS_bytes) / 4)});
    what = absl::StrCat("bytes=", vars[0].size * 4);
  } else {
    absl::StatusOr<models::ModelRef> spec = models::ResolveModel(absl::GetFlag(FLAGS_model));
    if (!spec.ok()) return Fail("--model", spec.status());
    // The model's own input (its defaults: the data it is made for, cropped as it crops).
    const models::ModelDefaults& d = (*spec)->defaults;
    models::ModelOptions mo;
    models::SetInputGeometry(d, d.data_height, d.data_width, d.data_channels, &mo);
    absl::StatusOr<std::vector<models::VariableInfo>> mv = models::ModelVariables(**spec, mo);
    if (!mv.ok()) return Fail("--model", mv.status());
    for (const models::VariableInfo& v : *mv) vars.push_back({v.name, v.size(), v.trainable});
    what = absl::StrCat("model=", absl::GetFlag(FLAGS_model));
  }
  absl::StatusOr<ps::Placement> placement = ps::PlaceVariables(vars, 1);
  if (!placement.ok()) return Fail("placement", placement.status());
  int64_t n = 0;
  for (const ps::VariableInfo& v : vars) n += v.size;
  const int64_t bytes = n * 4;

  ps::PsServerOptions so;
  so.listen_address = "127.0.0.1:0";
  so.ps.num_workers = 1;
  absl::StatusOr<std::unique_ptr<ps::PsServer>> server = ps::PsServer::Start(so);
  if (!server.ok()) return Fail("ps server", server.status());
  absl::StatusOr<std::unique_ptr<ps::PsInterface>> task = ps::NewGrpcPsClient((*server)->address(), {});
  if (!task.ok()) return Fail("ps client", task.status());
  ps::WorkerClientOptions wo;
  wo.wire_dtype = *dtype;
  ps::WorkerClient client({task->get()}, placement->task_slices, 0, /*is_chief=*/true, wo);
  ps::TrainConfig config;
  config.model_signature = "dtrain_bench_ps";
  config.num_workers = 1;
  config.optimizer.name = "sgd";
  config.optimizer.learning_rate = 1.0f;
  // Small integers and an alternating +d/-d gradient: every update is exact, so the values alternate between
  // two known buffers whose checksums are computed once (in any wire type: they are exact in bf16 and fp16).
  std::vector<float> initial(n), params(n), plus(n), minus(n), after_plus(n);
  for (int64_t i = 0; i < n; ++i) {
    initial[i] = static_cast<float>(i % 64);
    plus[i] = static_cast<float>(1 + i % 3);
    minus[i] = -plus[i];
    after_plus[i] = initial[i] - plus[i];
  }
  const uint32_t crc[2] = {crc32c::Value(reinterpret_cast<const char*>(initial.data()), bytes),
                           crc32c::Value(reinterpret_cast<const char*>(after_plus.data()), bytes)};
  if (absl::Status s = client.Connect(config, initial.data(), absl::Seconds(10)); !s.ok()) return Fail("connect", s);

  const int warmup = absl::GetFlag(FLAGS_warmup_steps), steps = absl::GetFlag(FLAGS_steps);
  std::vector<double> step_ms, push_ms, pull_ms;
  int bad = 0;
  for (int s = 0; s < warmup + steps; ++s) {
    const float* grads = s % 2 == 0 ? plus.data() : minus.data();
    const absl::Time t0 = absl::Now();
    if (absl::Status st = client.BeginPush(s, grads); !st.ok()) return Fail("push", st);
    client.FinishPush();
    client.StartPull(s + 1, s, params.data());
    absl::StatusOr<ps::PullResult> pulled = client.FinishPull();
    if (!pulled.ok()) return Fail("pull", pulled.status());
    absl::StatusOr<ps::PushResponse> pushed = client.WaitPush();
    if (!pushed.ok()) return Fail("push", pushed.status());
    const absl::Time t1 = absl::Now();
    if (s >= warmup) step_ms.push_back(absl::ToDoubleMilliseconds(t1 - t0));
    bad += crc32c::Value(reinterpret_cast<const char*>(params.data()), bytes) != crc[(s + 1) % 2];
  }
  // Pushes alone (each one a full step on the ps), then pulls alone (of the step just applied).
  for (int s = warmup + steps; s < warmup + steps + std::max(5, steps / 4); ++s) {
    const float* grads = s % 2 == 0 ? plus.data() : minus.data();
    const absl::Time t0 = absl::Now();
    absl::StatusOr<ps::PushResponse> pushed = client.Push(s, grads);
    if (!pushed.ok()) return Fail("push", pushed.status());
    const absl::Time t1 = absl::Now();
    push_ms.push_back(absl::ToDoubleMilliseconds(t1 - t0));
    absl::StatusOr<ps::PullResult> pulled = client.Pull(s + 1, s, params.data());
    if (!pulled.ok()) return Fail("pull", pulled.status());
    pull_ms.push_back(absl::ToDoubleMilliseconds(absl::Now() - t1));
    bad += crc32c::Value(reinterpret_cast<const char*>(params.data()), bytes) != crc[(s + 1) % 2];
  }
  if (absl::Status s = client.Done(); !s.ok()) return Fail("done", s);
  (*server)->Wait(absl::Seconds(10));

  const double tcp = RawTcpRoundTripMs(static_cast<size_t>(bytes), warmup, steps);
  const double wire_bytes = static_cast<double>(bytes) * ps::DtypeBytes(*dtype) / 4;
  const double med = Median(step_ms);
  std::printf("dtrain_bench_ps: %s slices=%zu wire=%s %.1f MB each way, %d steps, checksums %s\n", what.c_str(),
              placement->slices.size(), std::string(ps::DtypeName(*dtype)).c_str(), wire_bytes / 1e6, steps,
              bad == 0 ? "ok" : absl::StrCat(bad, " BAD").c_str());
  std::printf("  push alone median_ms=%.2f, pull alone %.2f; push+pull %.2f GB/s; raw TCP %.2f GB/s\n",
              Median(push_ms), Median(pull_ms),
              2 * wire_bytes / (med * 1e6), tcp > 0 ? 2 * static_cast<double>(bytes) / (tcp * 1e6) : 0.0);
  std::printf("dtrain_bench_ps: %s push+pull median_ms=%.2f raw_tcp median_ms=%.2f ratio=%.2f\n", what.c_str(), med,
              tcp, tcp > 0 ? med / tcp : 0.0);
  return bad == 0 && tcp > 0 ? 0 : 1;
}

}  // namespace
}  // namespace dtrain

int main(int argc, char** argv) {
  dtrain::TuneMallocForLargeReusedBuffers();
  dtrain::CommandLineSpec spec;
  spec.program = "dtrain_bench_ps";
  spec.summary = "the worker <-> ps data path alone, against a raw TCP round trip of the same bytes";
  spec.epilogue = "Exit codes: 0 measured and verified; 1 a failure or a wrong value; 2 bad flags.";
  dtrain::ParseCommandLineOrExit(argc, argv, spec);
  FLAGS_logtostderr = true;
  FLAGS_minloglevel = 1;
  google::InitGoogleLogging(argv[0]);
  return dtrain::Main();
}
