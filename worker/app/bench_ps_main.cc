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
//
// Across hosts (--netns, root): the ps and the client run on two emulated hosts, network namespaces cabled to a
// switch by scripts/netns_hosts.sh, each link capped at --bandwidth in both directions (tc tbf); the raw TCP
// round trip crosses the same link. Prints the goodput, the bytes both directions carried over the step's time,
// as a fraction of one direction's cap (push then pull at the cap: 1.0; the two fully overlapped: 2.0).
//
//   dtrain_bench_ps --netns --bandwidth=1gbit --model=cnn --transport=grpc
//   → ... goodput 118.6 MB/s = 0.95 of the 1gbit cap (2.00: both directions full)
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
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
#include "common/free_ports.h"
#include "common/malloc_tuning.h"
#include "common/mutex_config.h"
#include "ps/rpc/grpc_ps_client.h"
#include "ps/client/placement.h"
#include "ps/rpc/server.h"
#include "ps/rpc/transport.h"
#include "ps/client/worker_client.h"
#include "worker/app/bench_process.h"
#include "worker/models/model.h"
#include "worker/models/registry.h"

ABSL_FLAG(std::string, model, "cnn", "Move this model's parameters (mlp | cnn | convnet | cifar10 | PATH.onnx)");
ABSL_FLAG(int64_t, bytes, 0, "Instead of a model: one variable of this many bytes");
ABSL_FLAG(int, steps, 40, "Timed steps (push + pull each)");
ABSL_FLAG(int, warmup_steps, 5, "Steps before timing");
ABSL_FLAG(std::string, wire_dtype, "fp32", "fp32 | bf16 | fp16 on the wire");
ABSL_FLAG(std::string, transport, "grpc",
          "grpc | shm | tcp | auto: how the worker side reaches the ps (shm: shared memory, the buffers read and "
          "written in place; tcp: TCP lanes beside gRPC, the data sent from and received into the buffers); in_process: the worker calls the ParameterServer directly, as local mode does (the floor "
          "of any transport: the ps's own copies and update)");
ABSL_FLAG(int, channels_per_ps, 1,
          "gRPC: connections to the ps, pushes and pulls striped by slice over them (as dtrain_worker's flag)");
ABSL_FLAG(std::string, apply_early, "off",
          "off | auto | on: the client asks the ps to apply each push as it arrives, the pull streaming the new "
          "values behind it (dtrain_worker's --apply_early), and the ps grants it as dtrain_ps's flag says (auto: a "
          "client on another host only; on: here too)");
ABSL_FLAG(int64_t, sparse_rows, 0, "Sparse mode: the embedding table's rows (hash-keyed; 0: dense mode)");
ABSL_FLAG(int, dim, 16, "Sparse mode: floats per row");
ABSL_FLAG(int64_t, ids_per_step, 10000, "Sparse mode: unique ids each step pulls and pushes");
ABSL_FLAG(int, num_ps, 2, "Sparse mode: dtrain_ps processes");
ABSL_FLAG(int64_t, max_rows, 0, "Sparse mode: the table's max_rows per ps task (0: no bound)");
ABSL_FLAG(int64_t, dense_floats, 1000, "Sparse mode: dense parameters beside the table");
ABSL_FLAG(std::string, sparse_optimizer, "adagrad", "Sparse mode: sgd | adagrad | adam | ftrl");
ABSL_FLAG(std::string, ps_binary, "", "Sparse mode: the dtrain_ps to start (default: beside this binary)");
ABSL_FLAG(bool, netns, false,
          "Run the ps and the client on two emulated hosts (network namespaces, scripts/netns_hosts.sh; root)");
ABSL_FLAG(std::string, bandwidth, "", "With --netns: cap each link at this rate in both directions (e.g. 1gbit)");
ABSL_FLAG(std::string, netns_hosts, "",
          "With --netns: the netns_hosts.sh to use (default: scripts/netns_hosts.sh of the source tree)");
ABSL_FLAG(std::string, serve_on, "", "Internal (--netns): be the ps host, listening on this address");
ABSL_FLAG(std::string, connect_to, "", "Internal (--netns): be the client host of the ps host at this address");
ABSL_FLAG(double, cap_bytes_per_sec, 0, "Internal (--netns): the links' cap, for the goodput line");
ABSL_FLAG(double, hold_secs, 0, "Sparse mode: keep the ps processes up this long after the report (to inspect them)");

namespace dtrain {
namespace {

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
// Ports of the ps host in --netns mode (its namespace is fresh: nothing else listens there).
constexpr int kNetnsPsPort = 7070;
constexpr int kNetnsEchoPort = 7071;

// Connects to host:port over TCP (no delay), retrying until `deadline`; -1 then.
int ConnectTcp(const std::string& host, int port, absl::Time deadline) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  if (inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) return -1;
  while (true) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) return fd;
    close(fd);
    if (absl::Now() >= deadline) return -1;
    absl::SleepFor(absl::Milliseconds(50));
  }
}

// The raw TCP reference across hosts: an 8-byte size, then `rounds` of n bytes there and n back.
double RemoteTcpRoundTripMs(const std::string& host, size_t n, int warmup, int rounds) {
  const int fd = ConnectTcp(host, kNetnsEchoPort, absl::Now() + absl::Seconds(30));
  if (fd < 0) return -1;
  const uint64_t header[2] = {n, static_cast<uint64_t>(warmup + rounds)};
  bool ok = SendAll(fd, reinterpret_cast<const char*>(header), sizeof(header));
  std::vector<char> out(n, 'w'), in(n);
  std::vector<double> ms;
  for (int i = 0; ok && i < warmup + rounds; ++i) {
    const absl::Time t0 = absl::Now();
    ok = SendAll(fd, out.data(), n) && RecvAll(fd, in.data(), n);
    if (i >= warmup) ms.push_back(absl::ToDoubleMilliseconds(absl::Now() - t0));
  }
  close(fd);
  return ok && !ms.empty() ? Median(ms) : -1;
}

// The ps host's echo for RemoteTcpRoundTripMs (one connection).
void ServeEcho(const std::string& host) {
  const int listener = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(kNetnsEchoPort);
  const int one = 1;
  setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (listener < 0 || inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1 ||
      bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || listen(listener, 1) != 0) {
    std::fprintf(stderr, "dtrain_bench_ps: cannot listen on %s:%d: %s\n", host.c_str(), kNetnsEchoPort,
                 std::strerror(errno));
    return;
  }
  const int fd = accept(listener, nullptr, nullptr);
  close(listener);
  if (fd < 0) return;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  uint64_t header[2] = {0, 0};
  if (RecvAll(fd, reinterpret_cast<char*>(header), sizeof(header)) && header[0] <= (uint64_t{1} << 32)) {
    std::vector<char> buf(header[0]);
    for (uint64_t i = 0; i < header[1]; ++i) {
      if (!RecvAll(fd, buf.data(), buf.size()) || !SendAll(fd, buf.data(), buf.size())) break;
    }
  }
  close(fd);
}

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

// n floats on the heap, or in shared memory for a shared-memory transport (what the towers use then).
class HostBuffer {
 public:
  HostBuffer(int64_t n, ps::Transport transport) {
    if (transport == ps::Transport::kShm || transport == ps::Transport::kAuto) {
      absl::StatusOr<float*> p = ps::shm::SharedHostMemory::Default()->Allocate(n);
      if (p.ok()) shared_ = *p;
    }
    if (shared_ == nullptr) heap_.resize(n);
  }
  ~HostBuffer() { ps::shm::SharedHostMemory::Default()->Free(shared_); }
  float* data() { return shared_ != nullptr ? shared_ : heap_.data(); }
  float& operator[](int64_t i) { return data()[i]; }

 private:
  float* shared_ = nullptr;
  std::vector<float> heap_;
};

// ---- sparse mode ------------------------------------------------------------------------------------------------

int SparseMain() {
  absl::StatusOr<ps::Transport> transport = ps::ParseTransport(absl::GetFlag(FLAGS_transport));
  if (!transport.ok()) return Fail("flags", transport.status());
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
    absl::StatusOr<pid_t> pid =
        SpawnWithLog({ps_binary, "--job_name=ps", absl::StrCat("--task_index=", i),
                      absl::StrCat("--ps_hosts=", ps_hosts), absl::StrCat("--worker_hosts=127.0.0.1:", ports[num_ps]),
                      "--worker_timeout_secs=0", "--registration_timeout_secs=120", "--malloc_trim_secs=2",
                      "--max_model_bytes=1099511627776", absl::StrCat("--transport=", absl::GetFlag(FLAGS_transport))},
                     log);
    if (!pid.ok()) return Fail("ps", pid.status());
    pids.push_back(*pid);
  }
  auto stop_all = [&] {
    for (pid_t pid : pids) kill(pid, SIGTERM);
    for (pid_t pid : pids) waitpid(pid, nullptr, 0);
  };
  ps::WireCounters counters;
  ps::PsClientOptions co;
  co.grpc.counters = &counters;
  co.transport = *transport;
  std::vector<std::unique_ptr<ps::PsInterface>> owned;
  std::vector<ps::PsInterface*> tasks;
  for (int i = 0; i < num_ps; ++i) {
    co.task = i;
    absl::StatusOr<std::unique_ptr<ps::PsInterface>> t = ps::NewPsClient(absl::StrCat("127.0.0.1:", ports[i]), co);
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
  for (int i = 0; i < num_ps; ++i) base_rss[i] = ReadProcessMemory(pids[i]).rss;

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
    const ProcessMemory mem = ReadProcessMemory(pids[i]);
    const int64_t rss = mem.rss, hwm = mem.peak;
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

// --netns, the ps host: a ps task for one worker on `host`:7070 and the raw TCP echo on `host`:7071, until the
// client is done (at most 10 minutes).
int ServeMain(const std::string& host) {
  ps::PsServerOptions so;
  so.listen_address = absl::StrCat(host, ":", kNetnsPsPort);
  so.ps.num_workers = 1;
  so.offer_shm = false;
  absl::StatusOr<ps::ApplyEarly> apply_early = ps::ParseApplyEarly(absl::GetFlag(FLAGS_apply_early));
  if (!apply_early.ok()) return Fail("flags", apply_early.status());
  so.apply_early = *apply_early;
  absl::StatusOr<std::unique_ptr<ps::PsServer>> server = ps::PsServer::Start(so);
  if (!server.ok()) return Fail("ps server", server.status());
  std::thread echo([host] { ServeEcho(host); });
  const bool done = (*server)->Wait(absl::Minutes(10));
  echo.join();
  return done ? 0 : 1;
}

// Runs `argv` and returns its exit code (-1 when it cannot run); its stdout goes to `out` when given.
int RunCommand(const std::vector<std::string>& argv, std::string* out) {
  std::string line;
  for (const std::string& a : argv) absl::StrAppend(&line, line.empty() ? "" : " ", "'", a, "'");
  FILE* p = popen(line.c_str(), "r");
  if (p == nullptr) return -1;
  char buf[4096];
  size_t got;
  while ((got = fread(buf, 1, sizeof(buf), p)) > 0) {
    if (out != nullptr) {
      out->append(buf, got);
    } else {
      fwrite(buf, 1, got, stdout);
    }
  }
  const int status = pclose(p);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// Bytes per second of a tc rate such as 1gbit, 100mbit; 0 when it is not one.
double RateBytesPerSec(const std::string& rate) {
  double num = 0;
  char unit[16] = {0};
  if (std::sscanf(rate.c_str(), "%lf%15s", &num, unit) != 2 || num <= 0) return 0;
  const std::string u = unit;
  const double mult = u == "bit" ? 1 : u == "kbit" ? 1e3 : u == "mbit" ? 1e6 : u == "gbit" ? 1e9 : 0;
  return num * mult / 8;
}

// --netns: two emulated hosts, this binary as the ps on host 0 and as the client on host 1, then the hosts
// removed (also when a side fails).
int NetnsMain() {
  const std::string bandwidth = absl::GetFlag(FLAGS_bandwidth);
  const double cap = bandwidth.empty() ? 0 : RateBytesPerSec(bandwidth);
  if (!bandwidth.empty() && cap <= 0) {
    return Fail("--bandwidth", absl::InvalidArgumentError(absl::StrCat(
                                   "'", bandwidth, "' is not a rate (a number with bit, kbit, mbit or gbit)")));
  }
  std::string script = absl::GetFlag(FLAGS_netns_hosts);
  if (script.empty()) script = std::string(DTRAIN_SOURCE_DIR) + "/scripts/netns_hosts.sh";
  if (access(script.c_str(), X_OK) != 0) {
    return Fail("--netns", absl::NotFoundError(absl::StrCat(script, " is not there (--netns_hosts=PATH)")));
  }
  std::string why;
  if (RunCommand({script, "check"}, &why) != 0) {
    std::fprintf(stderr, "dtrain_bench_ps: --netns cannot run here: %s\n", why.c_str());
    return 77;
  }
  const std::string name = absl::StrCat("benchps", getpid());
  std::vector<std::string> up = {script, "up", name, "2"};
  if (!bandwidth.empty()) up.push_back("--bandwidth=" + bandwidth);
  std::string hosts;
  if (RunCommand(up, &hosts) != 0) {
    RunCommand({script, "down", name}, nullptr);
    return Fail("--netns", absl::UnavailableError("scripts/netns_hosts.sh up failed"));
  }
  // "NAME-h0 ADDRESS\n..."
  char host0[64] = {0};
  std::sscanf(hosts.c_str(), "%*s %63s", host0);
  char self[4096] = {0};
  const ssize_t len = readlink("/proc/self/exe", self, sizeof(self) - 1);
  int code = 1;
  if (len > 0 && host0[0] != '\0') {
    std::vector<std::string> pass = {
        "--model=" + absl::GetFlag(FLAGS_model), absl::StrCat("--bytes=", absl::GetFlag(FLAGS_bytes)),
        absl::StrCat("--steps=", absl::GetFlag(FLAGS_steps)),
        absl::StrCat("--warmup_steps=", absl::GetFlag(FLAGS_warmup_steps)),
        "--wire_dtype=" + absl::GetFlag(FLAGS_wire_dtype), "--bandwidth=" + bandwidth,
        absl::StrCat("--channels_per_ps=", absl::GetFlag(FLAGS_channels_per_ps)),
        "--apply_early=" + absl::GetFlag(FLAGS_apply_early)};
    std::vector<std::string> serve = {script, "exec", name, "0", self, std::string("--serve_on=") + host0,
                                      "--apply_early=" + absl::GetFlag(FLAGS_apply_early)};
    std::string log = absl::StrCat("/tmp/", name, "_ps.log");
    std::string cmd;
    for (const std::string& a : serve) absl::StrAppend(&cmd, "'", a, "' ");
    const pid_t ps = SpawnWithLog({"/bin/sh", "-c", cmd}, log).value_or(-1);
    std::vector<std::string> client = {script, "exec", name, "1", self, std::string("--connect_to=") + host0,
                                       absl::StrCat("--cap_bytes_per_sec=", cap),
                                       "--transport=" + absl::GetFlag(FLAGS_transport)};
    client.insert(client.end(), pass.begin(), pass.end());
    std::printf("dtrain_bench_ps: the ps on %s, the client on the second emulated host%s\n", host0,
                bandwidth.empty() ? " (links not capped)" : absl::StrCat(", links capped at ", bandwidth).c_str());
    std::fflush(stdout);
    code = RunCommand(client, nullptr);
    if (ps > 0) {
      int status = 0;
      const absl::Time until = absl::Now() + absl::Seconds(30);
      while (waitpid(ps, &status, WNOHANG) == 0 && absl::Now() < until) absl::SleepFor(absl::Milliseconds(50));
    }
    if (code != 0) {
      std::ifstream in(log);
      std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      std::fprintf(stderr, "dtrain_bench_ps: the ps host's log (%s):\n%s\n", log.c_str(), text.c_str());
    }
    unlink(log.c_str());
  }
  RunCommand({script, "down", name}, nullptr);  // also ends the ps host's process if it is still there
  return code;
}

int Main() {
  SetFlushDenormals();
  DisableMutexDeadlockDetection();
  if (absl::GetFlag(FLAGS_sparse_rows) > 0) return SparseMain();
  if (absl::GetFlag(FLAGS_netns)) return NetnsMain();
  if (!absl::GetFlag(FLAGS_serve_on).empty()) return ServeMain(absl::GetFlag(FLAGS_serve_on));
  const std::string remote = absl::GetFlag(FLAGS_connect_to);
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
  ps::PlacementOptions placement_options;
  placement_options.pieces_per_task = absl::GetFlag(FLAGS_channels_per_ps);
  absl::StatusOr<ps::Placement> placement = ps::PlaceVariables(vars, 1, placement_options);
  if (!placement.ok()) return Fail("flags", placement.status());
  int64_t n = 0;
  for (const ps::VariableInfo& v : vars) n += v.size;
  const int64_t bytes = n * 4;

  const bool in_process = absl::GetFlag(FLAGS_transport) == "in_process";
  absl::StatusOr<ps::Transport> transport =
      in_process ? ps::Transport::kGrpc : ps::ParseTransport(absl::GetFlag(FLAGS_transport));
  if (!transport.ok()) return Fail("flags", transport.status());
  if (!remote.empty() && (in_process || *transport == ps::Transport::kShm)) {
    return Fail("flags", absl::InvalidArgumentError("--netns: the hosts are apart: --transport=grpc, tcp or auto"));
  }
  absl::StatusOr<ps::ApplyEarly> apply_early = ps::ParseApplyEarly(absl::GetFlag(FLAGS_apply_early));
  if (!apply_early.ok()) return Fail("flags", apply_early.status());
  std::unique_ptr<ps::PsServer> server;
  if (remote.empty()) {
    ps::PsServerOptions so;
    so.listen_address = "127.0.0.1:0";
    so.ps.num_workers = 1;
    so.offer_shm = *transport == ps::Transport::kShm || *transport == ps::Transport::kAuto;
    so.offer_tcp = *transport == ps::Transport::kTcp || *transport == ps::Transport::kAuto;
    so.apply_early = *apply_early;
    absl::StatusOr<std::unique_ptr<ps::PsServer>> started = ps::PsServer::Start(so);
    if (!started.ok()) return Fail("ps server", started.status());
    server = std::move(*started);
  }
  ps::shm::ShmCounters shm_counters;
  ps::tcp::TcpCounters tcp_counters;
  ps::PsClientOptions co;
  co.transport = *transport;
  co.shm_counters = &shm_counters;
  co.tcp_counters = &tcp_counters;
  co.grpc.channels = absl::GetFlag(FLAGS_channels_per_ps);
  const std::string address = remote.empty() ? server->address() : absl::StrCat(remote, ":", kNetnsPsPort);
  absl::StatusOr<std::unique_ptr<ps::PsInterface>> task = ps::NewPsClient(address, co);
  if (!task.ok()) return Fail("ps client", task.status());
  ps::WorkerClientOptions wo;
  wo.wire_dtype = *dtype;
  wo.background = !in_process;
  wo.apply_early = *apply_early != ps::ApplyEarly::kOff && !in_process && co.grpc.channels == 1;
  ps::WorkerClient client({in_process ? static_cast<ps::PsInterface*>(server->parameter_server()) : task->get()},
                          placement->task_slices, 0, /*is_chief=*/true, wo);
  ps::TrainConfig config;
  config.model_signature = "dtrain_bench_ps";
  config.num_workers = 1;
  config.optimizer.name = "sgd";
  config.optimizer.learning_rate = 1.0f;
  // Small integers and an alternating +d/-d gradient: every update is exact, so the values alternate between
  // two known buffers whose checksums are computed once (in any wire type: they are exact in bf16 and fp16).
  // The worker's buffers: in shared memory with a shared-memory transport (as the towers' are), so that the ps
  // reads the gradients and writes the parameters in place.
  std::vector<float> initial(n), after_plus(n);
  HostBuffer params(n, *transport), plus(n, *transport), minus(n, *transport);
  for (int64_t i = 0; i < n; ++i) {
    initial[i] = static_cast<float>(i % 64);
    plus[i] = static_cast<float>(1 + i % 3);
    minus[i] = -plus[i];
    after_plus[i] = initial[i] - plus[i];
  }
  const uint32_t crc[2] = {crc32c::Value(reinterpret_cast<const char*>(initial.data()), bytes),
                           crc32c::Value(reinterpret_cast<const char*>(after_plus.data()), bytes)};
  if (absl::Status s = client.Connect(config, initial.data(), absl::Seconds(remote.empty() ? 10 : 60)); !s.ok()) {
    return Fail("connect", s);
  }

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
  if (server != nullptr) server->Wait(absl::Seconds(10));

  const double tcp = remote.empty() ? RawTcpRoundTripMs(static_cast<size_t>(bytes), warmup, steps)
                                    : RemoteTcpRoundTripMs(remote, static_cast<size_t>(bytes), warmup, steps);
  const double wire_bytes = static_cast<double>(bytes) * ps::DtypeBytes(*dtype) / 4;
  const double med = Median(step_ms);
  std::printf("dtrain_bench_ps: %s slices=%zu connections=%d wire=%s %.1f MB each way, %d steps, checksums %s\n",
              what.c_str(), placement->slices.size(), co.grpc.channels, std::string(ps::DtypeName(*dtype)).c_str(),
              wire_bytes / 1e6, steps, bad == 0 ? "ok" : absl::StrCat(bad, " BAD").c_str());
  std::printf("  push alone median_ms=%.2f, pull alone %.2f; push+pull %.2f GB/s; raw TCP %.2f GB/s\n",
              Median(push_ms), Median(pull_ms),
              2 * wire_bytes / (med * 1e6), tcp > 0 ? 2 * static_cast<double>(bytes) / (tcp * 1e6) : 0.0);
  if (tcp_counters.attaches.load() > 0) {
    std::printf("  TCP lanes: %ld pushes and %ld pulls over the lanes (%ld / %ld on gRPC), %.1f MB sent, %.1f MB "
                "received\n",
                static_cast<long>(tcp_counters.tcp_pushes.load()), static_cast<long>(tcp_counters.tcp_pulls.load()),
                static_cast<long>(tcp_counters.control_pushes.load()),
                static_cast<long>(tcp_counters.control_pulls.load()), tcp_counters.bytes_sent.load() / 1e6,
                tcp_counters.bytes_received.load() / 1e6);
  }
  if (shm_counters.attaches.load() > 0) {
    std::printf("  shared memory: %ld pushes and %ld pulls over the lanes (%ld / %ld on gRPC), %.1f MB in place, "
                "%.1f MB staged\n",
                static_cast<long>(shm_counters.shm_pushes.load()), static_cast<long>(shm_counters.shm_pulls.load()),
                static_cast<long>(shm_counters.control_pushes.load()),
                static_cast<long>(shm_counters.control_pulls.load()), shm_counters.bytes_in_place.load() / 1e6,
                shm_counters.bytes_staged.load() / 1e6);
  }
  if (const double cap = absl::GetFlag(FLAGS_cap_bytes_per_sec); cap > 0) {
    const double goodput = 2 * wire_bytes / (med / 1e3), raw = tcp > 0 ? 2 * static_cast<double>(bytes) / (tcp / 1e3) : 0;
    std::printf("  across hosts: goodput %.1f MB/s = %.2f of the %s cap (2.00: both directions full); raw TCP "
                "%.2f of it\n",
                goodput / 1e6, goodput / cap, absl::GetFlag(FLAGS_bandwidth).c_str(), raw / cap);
    std::printf("dtrain_bench_ps: goodput_fraction=%.3f raw_tcp_fraction=%.3f\n", goodput / cap, raw / cap);
  }
  std::printf("dtrain_bench_ps: %s transport=%s push+pull median_ms=%.2f raw_tcp median_ms=%.2f ratio=%.2f\n",
              what.c_str(), in_process ? "in_process" : std::string(ps::TransportName(*transport)).c_str(), med, tcp,
              tcp > 0 ? med / tcp : 0.0);
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
