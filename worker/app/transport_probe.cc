#include "worker/app/transport_probe.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <glog/logging.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/free_ports.h"
#include "common/process_clock.h"
#include "common/status_macros.h"
#include "ps/client/worker_client.h"
#include "ps/core/slice_store.h"
#include "ps/rpc/tensor_coding.h"
#include "ps/rpc/transport.h"
#include "ps/shm/shm_segment.h"
#include "worker/app/bench_process.h"

namespace dtrain::worker {
namespace {

double Median(std::vector<double> v) {
  return v.empty() ? 0.0 : ProfileRecorder::Quantile(std::move(v), 0.5);
}

std::string Tail(const std::string& path) {
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return text.size() > 400 ? text.substr(text.size() - 400) : text;
}

// How many exchanges of `bytes` a phase makes.
int Exchanges(int64_t bytes, const TransportProbeOptions& o) {
  const int64_t want = (o.min_bytes + bytes - 1) / std::max<int64_t>(1, bytes);
  return static_cast<int>(std::clamp<int64_t>(want, o.min_exchanges, o.max_exchanges));
}

// A buffer in the memory the transport reads and writes in place (shared memory for shm).
class Buffer {
 public:
  Buffer(int64_t n, bool shared) : shared_(shared) {
    if (shared_) {
      absl::StatusOr<float*> p = ps::shm::SharedHostMemory::Default()->Allocate(n);
      if (p.ok()) data_ = *p;
    } else {
      owned_.assign(static_cast<size_t>(n), 0.0f);
      data_ = owned_.data();
    }
  }
  ~Buffer() {
    if (shared_ && data_ != nullptr) ps::shm::SharedHostMemory::Default()->Free(data_);
  }
  float* data() { return data_; }

 private:
  const bool shared_;
  std::vector<float> owned_;
  float* data_ = nullptr;
};

// The optimizer of the probe's pushes (cheap, and the same for every transport).
ps::OptimizerConfig ProbeOptimizer() {
  ps::OptimizerConfig sgd;
  sgd.name = "sgd";
  sgd.learning_rate = 1e-3f;
  return sgd;
}

// A dtrain_ps process and this process's WorkerClient over `transport`. `update_seconds`: the ps's update of a
// push on its own (TimeUpdate with ProbeOptimizer), taken out of the push's cost.
absl::Status MeasurePsTransport(const ProfiledRun& run, const std::vector<int64_t>& rows_per_step,
                                const TransportProbeOptions& o, ps::Transport transport, double update_seconds,
                                TransportCost* cost) {
  const std::vector<ps::VariableInfo>& variables = run.variables;
  ASSIGN_OR_RETURN(const ps::WireDtype dtype, ps::ParseWireDtype(o.wire_dtype));
  std::string ps_binary = o.ps_binary;
  if (ps_binary.empty()) {
    char self[4096];
    const ssize_t len = readlink("/proc/self/exe", self, sizeof(self) - 1);
    const std::string exe = len > 0 ? std::string(self, len) : "";
    ps_binary = exe.substr(0, exe.find_last_of('/') + 1) + "dtrain_ps";
  }
  if (access(ps_binary.c_str(), X_OK) != 0) {
    return absl::NotFoundError(absl::StrCat("no dtrain_ps to start at ", ps_binary));
  }
  const std::vector<int> ports = FreePorts(2);
  if (ports.empty()) return absl::UnavailableError("cannot bind a port on 127.0.0.1");
  const int port = ports[0], worker_port = ports[1];
  const std::string address = absl::StrCat("127.0.0.1:", port);
  char log_template[] = "/tmp/dtrain_transport_probe.XXXXXX";
  const int log_fd = mkstemp(log_template);
  if (log_fd < 0) return absl::InternalError(absl::StrCat("mkstemp: ", std::strerror(errno)));
  close(log_fd);
  const std::string log = log_template;
  std::vector<std::string> args = {
      ps_binary,
      "--job_name=ps",
      "--task_index=0",
      "--ps_hosts=" + address,
      absl::StrCat("--worker_hosts=127.0.0.1:", worker_port),
      "--worker_timeout_secs=0",
      absl::StrCat("--registration_timeout_secs=", o.start_timeout_secs),
      absl::StrCat("--max_run_secs=", 4 * o.max_seconds + 2 * o.start_timeout_secs),
      "--max_model_bytes=1099511627776",
      "--apply_early=off",
      absl::StrCat("--transport=", ps::TransportName(transport))};
  const absl::Time spawn_time = absl::Now();
  absl::StatusOr<pid_t> spawned = SpawnWithLog(args, log);
  if (!spawned.ok()) {
    unlink(log.c_str());
    return spawned.status();
  }
  const pid_t pid = *spawned;
  // Whatever happens below, the ps ends (it exits on its own once the worker is done; else SIGTERM, SIGKILL).
  auto reap = [pid](bool done) {
    const absl::Time until = absl::Now() + absl::Seconds(done ? 10 : 0);
    int status = 0;
    while (waitpid(pid, &status, WNOHANG) == 0) {
      if (absl::Now() >= until) {
        kill(pid, SIGTERM);
        const absl::Time hard = absl::Now() + absl::Seconds(5);
        while (waitpid(pid, &status, WNOHANG) == 0) {
          if (absl::Now() >= hard) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            break;
          }
          absl::SleepFor(absl::Milliseconds(20));
        }
        break;
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
  };
  auto fail = [&](const absl::Status& s) {
    reap(false);
    const std::string tail = Tail(log);
    unlink(log.c_str());
    return absl::Status(s.code(), absl::StrCat(s.message(), tail.empty() ? "" : "; dtrain_ps said: ", tail));
  };

  ps::PsClientOptions co;
  co.transport = transport;
  co.grpc.rpc_timeout = absl::Seconds(o.start_timeout_secs);
  co.grpc.retry_window = absl::Seconds(o.start_timeout_secs);
  absl::StatusOr<std::unique_ptr<ps::PsInterface>> task = ps::NewPsClient(address, co);
  if (!task.ok()) return fail(task.status());
  absl::StatusOr<ps::Placement> placement = ps::PlaceVariables(variables, 1);
  if (!placement.ok()) return fail(placement.status());
  int64_t n = 0;
  for (const ps::VariableInfo& v : variables) n += v.size;
  const bool shared = transport == ps::Transport::kShm;
  Buffer params(n, shared), grads(n, shared);
  if (params.data() == nullptr || grads.data() == nullptr) {
    return fail(absl::ResourceExhaustedError("no shared memory for the probe's buffers"));
  }
  for (int64_t i = 0; i < n; ++i) grads.data()[i] = 1e-6f * static_cast<float>(i % 7 - 3);
  ps::TrainConfig config;
  config.model_signature = "dtrain_worker/transport_probe";
  config.mode = "async";
  config.num_workers = 1;
  config.optimizer = ProbeOptimizer();
  int64_t sparse_rows = 0;
  for (size_t t = 0; t < run.tables.size() && t < rows_per_step.size(); ++t) {
    ps::SparseTableSpec spec;
    spec.table = static_cast<uint32_t>(t);
    spec.name = run.tables[t].name;
    spec.dim = run.tables[t].dim;
    spec.rows = run.tables[t].rows;
    config.tables.push_back(spec);
    sparse_rows += rows_per_step[t];
  }
  if (!config.tables.empty()) config.sparse_optimizer.name = "sgd";
  ps::WorkerClientOptions wo;
  wo.wire_dtype = dtype;
  wo.step_timeout = absl::Seconds(o.start_timeout_secs);
  wo.retry_window = absl::Seconds(o.start_timeout_secs);
  auto client = std::make_unique<ps::WorkerClient>(std::vector<ps::PsInterface*>{task->get()},
                                                   placement->task_slices, 0, /*is_chief=*/true, wo);
  if (absl::Status s = client->Connect(config, params.data(), absl::Seconds(o.start_timeout_secs)); !s.ok()) {
    return fail(s);
  }
  cost->cluster_start_seconds = absl::ToDoubleSeconds(absl::Now() - spawn_time);
  const int64_t wire_bytes = n * ps::DtypeBytes(dtype);
  const int exchanges = Exchanges(wire_bytes, o);
  int64_t step = 0;
  auto push = [&]() -> absl::Status { return client->Push(step++, grads.data()).status(); };
  auto pull = [&]() -> absl::Status { return client->Pull(0, 0, params.data()).status(); };
  for (int k = 0; k < 2; ++k) {  // warm-up: connections, buffers
    if (absl::Status s = push(); !s.ok()) return fail(s);
    if (absl::Status s = pull(); !s.ok()) return fail(s);
  }
  // One phase: `exchanges` calls (fewer past max_seconds); each side's CPU seconds per byte moved.
  struct Phase {
    int done = 0;
    double worker_cpu = 0, ps_cpu = 0, median_wall = 0;
  };
  auto phase = [&](const std::function<absl::Status()>& call, Phase* p) -> absl::Status {
    std::vector<double> walls;
    const double w0 = ProcessCpuSeconds(), p0 = ProcessCpuSeconds(pid);
    const absl::Time start = absl::Now();
    while (p->done < exchanges &&
           (p->done < o.min_exchanges || absl::ToDoubleSeconds(absl::Now() - start) < o.max_seconds)) {
      const absl::Time t0 = absl::Now();
      RETURN_IF_ERROR(call());
      walls.push_back(absl::ToDoubleSeconds(absl::Now() - t0));
      ++p->done;
    }
    const double p1 = ProcessCpuSeconds(pid);
    if (p0 < 0 || p1 < 0) return absl::InternalError(absl::StrCat("cannot read /proc/", pid, "/stat"));
    p->worker_cpu = ProcessCpuSeconds() - w0;
    p->ps_cpu = p1 - p0;
    p->median_wall = Median(walls);
    return absl::OkStatus();
  };
  Phase pushes, pulls;
  if (absl::Status s = phase(push, &pushes); !s.ok()) return fail(s);
  if (absl::Status s = phase(pull, &pulls); !s.ok()) return fail(s);
  // A model with tables: steps that push and pull each table's rows besides the parameters. A step's ids are
  // new for the first four steps, then seen again (ids (s mod 4) * k + i, modulo a fixed-size table's rows).
  Phase sparse_steps;
  if (sparse_rows > 0) {
    std::vector<std::vector<int64_t>> ids(config.tables.size());
    std::vector<std::vector<float>> rows(config.tables.size()), row_grads(config.tables.size());
    for (size_t t = 0; t < ids.size(); ++t) {
      const int64_t k = rows_per_step[t];
      ids[t].resize(k);
      rows[t].resize(k * config.tables[t].dim);
      row_grads[t].assign(k * config.tables[t].dim, 1e-4f);
    }
    auto sparse_step = [&]() -> absl::Status {
      std::vector<ps::SparseGradients> push_rows;
      std::vector<ps::SparsePullRequest> pull_rows;
      for (size_t t = 0; t < ids.size(); ++t) {
        const int64_t k = static_cast<int64_t>(ids[t].size());
        if (k == 0) continue;
        const int64_t table_rows = config.tables[t].rows;
        for (int64_t i = 0; i < k; ++i) {
          const int64_t id = (step % 4) * k + i;
          ids[t][i] = table_rows > 0 ? id % table_rows : id;
        }
        const uint32_t table = static_cast<uint32_t>(t);
        push_rows.push_back({table, ids[t].data(), k, row_grads[t].data()});
        pull_rows.push_back({table, ids[t].data(), k, rows[t].data()});
      }
      RETURN_IF_ERROR(client->Push(step++, grads.data(), push_rows).status());
      return client->Pull(0, 0, params.data(), std::move(pull_rows)).status();
    };
    if (absl::Status s = sparse_step(); !s.ok()) return fail(s);  // warm-up
    if (absl::Status s = phase(sparse_step, &sparse_steps); !s.ok()) return fail(s);
  }
  const absl::Time done_time = absl::Now();
  if (absl::Status s = client->Done(); !s.ok()) return fail(s);
  client.reset();  // the connection closes, as a worker's does when it exits
  task->reset();
  reap(true);
  cost->cluster_end_seconds = absl::ToDoubleSeconds(absl::Now() - done_time);
  unlink(log.c_str());
  // The ps's side of a push holds its update (SGD, one thread): taken out.
  const double update = update_seconds;
  const double push_bytes = static_cast<double>(wire_bytes) * pushes.done;
  const double pull_bytes = static_cast<double>(wire_bytes) * pulls.done;
  cost->bytes = wire_bytes;
  cost->exchanges = std::min(pushes.done, pulls.done);
  cost->push_worker_cpu_per_byte = pushes.worker_cpu / push_bytes;
  cost->push_ps_cpu_per_byte = std::max(0.0, pushes.ps_cpu - update * pushes.done) / push_bytes;
  cost->pull_ps_cpu_per_byte = pulls.ps_cpu / pull_bytes;
  cost->pull_worker_cpu_per_byte = pulls.worker_cpu / pull_bytes;
  cost->push_seconds = pushes.median_wall;
  cost->pull_seconds = pulls.median_wall;
  // gRPC carries a slice in messages of at most this much data (ps/rpc/tensor_coding.h); TCP lanes lend it to
  // the ps in pieces of a store chunk as they land (ps/tcp/tcp_server.cc); shared memory lends whole slices.
  if (transport == ps::Transport::kGrpc) cost->stream_piece_bytes = ps::coding::kMaxChunkBytes;
  if (transport == ps::Transport::kTcp)
    cost->stream_piece_bytes = ps::SliceStore::kChunkFloats * ps::DtypeBytes(dtype);
  if (sparse_steps.done > 0) {
    // What the rows add to a step of the parameters alone: its push (with the update) and its pull.
    const double n_steps = sparse_steps.done;
    cost->sparse_rows = sparse_rows;
    cost->sparse_extra_seconds =
        std::max(0.0, sparse_steps.median_wall - pushes.median_wall - pulls.median_wall);
    cost->sparse_worker_cpu_seconds =
        std::max(0.0, sparse_steps.worker_cpu / n_steps - pushes.worker_cpu / pushes.done -
                          pulls.worker_cpu / pulls.done);
    cost->sparse_ps_cpu_seconds = std::max(
        0.0, sparse_steps.ps_cpu / n_steps - pushes.ps_cpu / pushes.done - pulls.ps_cpu / pulls.done);
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<TransportCost> MeasureTransports(const ProfiledRun& run,
                                             const std::vector<int64_t>& rows_per_step,
                                             const TransportProbeOptions& options) {
  std::vector<TransportCost> costs;
  absl::StatusOr<ps::WireDtype> dtype = ps::ParseWireDtype(options.wire_dtype);
  // The ps's update of a push on its own, timed once for every transport.
  const absl::StatusOr<double> update = TimeUpdate(run.variables, ProbeOptimizer(), 1);
  for (const std::string& name : options.transports) {
    TransportCost cost;
    cost.transport = name;
    absl::Status s;
    absl::StatusOr<ps::Transport> transport = ps::ParseTransport(name);
    if (!dtype.ok()) {
      s = dtype.status();
    } else if (!update.ok()) {
      s = update.status();
    } else if (!transport.ok() || *transport == ps::Transport::kAuto) {
      s = absl::InvalidArgumentError(absl::StrCat("unknown transport '", name, "' (grpc, shm or tcp)"));
    } else {
      s = MeasurePsTransport(run, rows_per_step, options, *transport, *update, &cost);
    }
    if (!s.ok()) {
      cost = TransportCost();
      cost.transport = name;
      cost.skipped = std::string(s.message());
      LOG(WARNING) << "--profile_out: the " << name << " transport's cost was not measured: " << s.message();
    }
    costs.push_back(std::move(cost));
  }
  return costs;
}

absl::Status FinishProfile(ProfileRecorder* profile, const std::string& path, TransportProbeOptions options) {
  profile->MarkEnd();
  RETURN_IF_ERROR(profile->MeasurePsCosts());
  options.wire_dtype = profile->run().wire_dtype;
  profile->SetTransportCosts(MeasureTransports(profile->run(), profile->SparseRowsPerStep(), options));
  return profile->Write(path);
}

}  // namespace dtrain::worker
