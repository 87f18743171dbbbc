// dtrain_bench_ps_set_move: how long a running job pauses when its ps set changes (ps/core/ps_set_plan.h), at the
// size the issue names: a dlrm-shaped job (--tables embedding tables of --rows rows of --dim floats, every row
// present, Adagrad slots; a small dense part, Adam) on in-process ps tasks sharing one checkpoint directory, the
// chief's WorkerClient driving the move exactly as a cluster's does (gRPC and the process boundary left out).
//
//   dtrain_bench_ps_set_move [--tables=26] [--rows=1000000] [--dim=16] [--dir=/tmp/...] [--rounds=1]
//
// The job grows 1 -> 2 ps tasks, then shrinks 2 -> 1 (--rounds times). For each move it prints the pause and its parts:
//   save     the step whose decision is marked for the move, less an ordinary step (every task writes its part)
//   restore  WorkerClient::MoveTo: every task restores its share of that checkpoint, resharded (tasks > 0 side by
//            side, ps 0 last), and the client registers with the new set
//   pause    save + restore: the time training stands still
// and the bytes of the checkpoint moved. Peak memory is about four times the tables' bytes (the store, the file
// being written or read, its parsed parts).
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/env.h"
#include "ps/client/placement.h"
#include "ps/client/worker_client.h"
#include "ps/core/parameter_server.h"

ABSL_FLAG(int, tables, 26, "Embedding tables");
ABSL_FLAG(int64_t, rows, 1000000, "Rows per table (every one of them is created before the moves)");
ABSL_FLAG(int, dim, 16, "Floats per row");
ABSL_FLAG(std::string, dir, "", "The checkpoint directory (default: a fresh one under /tmp, removed at the end)");
ABSL_FLAG(int, rounds, 1,
          "Times the job grows and shrinks (a later round reuses memory the process already touched: on a virtual "
          "machine whose host backs memory as it is first touched, the first round pays for that too)");

namespace dtrain::ps {
namespace {

constexpr int kDense = 64 * 1024;  // the dense part: a few slices

std::unique_ptr<ParameterServer> Task(int index, std::vector<std::string> hosts, const std::string& dir) {
  ParameterServerOptions o;
  o.task_index = index;
  o.num_ps = static_cast<int>(hosts.size());
  o.ps_hosts = std::move(hosts);
  o.checkpoint.dir = dir;
  o.checkpoint.keep = 1;
  o.max_model_bytes = int64_t{64} << 30;
  absl::StatusOr<std::unique_ptr<ParameterServer>> ps = ParameterServer::Create(o);
  if (!ps.ok()) {
    std::fprintf(stderr, "%s\n", std::string(ps.status().message()).c_str());
    std::exit(1);
  }
  return *std::move(ps);
}

void Check(const absl::Status& s, const char* what) {
  if (s.ok()) return;
  std::fprintf(stderr, "%s: %s\n", what, std::string(s.message()).c_str());
  std::exit(1);
}

std::vector<std::vector<SliceSpec>> PlacementFor(int num_ps) {
  absl::StatusOr<Placement> p = PlaceVariables({{"dense/w", kDense - 64}, {"dense/b", 64}}, num_ps);
  Check(p.status(), "placement");
  return p->task_slices;
}

double Seconds(absl::Time since) { return absl::ToDoubleSeconds(absl::Now() - since); }

int Run() {
  const int tables = absl::GetFlag(FLAGS_tables), dim = absl::GetFlag(FLAGS_dim);
  const int64_t rows = absl::GetFlag(FLAGS_rows);
  std::string dir = absl::GetFlag(FLAGS_dir);
  const bool own_dir = dir.empty();
  if (own_dir) dir = absl::StrCat("/tmp/dtrain_bench_ps_set_move.", getpid());
  TrainConfig config;
  config.mode = "sync";
  config.num_workers = 1;
  config.replicas_to_aggregate = 1;
  config.optimizer.name = "adam";
  config.optimizer.learning_rate = 0.001f;
  config.train_steps = 1000;
  config.model_signature = "bench";
  config.num_ps = 1;
  config.sparse_optimizer.name = "adagrad";
  config.sparse_optimizer.learning_rate = 0.05f;
  for (int t = 0; t < tables; ++t) {
    SparseTableSpec spec;
    spec.table = static_cast<uint32_t>(t);
    spec.name = absl::StrCat("emb_C", t + 1);
    spec.dim = dim;
    spec.rows = rows;
    config.tables.push_back(spec);
  }
  WorkerClientOptions copt;
  copt.background = false;
  copt.keep_initial_values = false;
  auto ps0 = Task(0, {"h0:1"}, dir);
  WorkerClient client(std::vector<PsInterface*>{ps0.get()}, PlacementFor(1), 0, true, copt);
  std::vector<float> params(kDense, 0.01f), grads(kDense, 0.001f);
  Check(client.Connect(config, params.data(), absl::Seconds(60)), "connect");

  // Every row of every table made (a pull creates the rows it reads).
  const absl::Time filling = absl::Now();
  std::vector<int64_t> ids(rows);
  std::iota(ids.begin(), ids.end(), 0);
  std::vector<float> row_values(static_cast<size_t>(rows) * dim);
  for (int t = 0; t < tables; ++t) {
    Check(client.Pull(0, 0, params.data(), {{static_cast<uint32_t>(t), ids.data(), rows, row_values.data()}}).status(),
          "filling the tables");
  }
  std::printf("%d tables x %lld rows x %d floats (+ Adagrad slots) made in %.1f s\n", tables,
              static_cast<long long>(rows), dim, Seconds(filling));
  std::fflush(stdout);

  int64_t step = 0;
  // One sync step: a dense gradient and a few rows of each table.
  std::vector<int64_t> few(64);
  std::iota(few.begin(), few.end(), 0);
  std::vector<float> few_grads(few.size() * dim, 0.01f);
  auto one_step = [&]() -> double {
    const absl::Time t0 = absl::Now();
    std::vector<SparseGradients> sparse;
    for (int t = 0; t < tables; ++t) {
      sparse.push_back({static_cast<uint32_t>(t), few.data(), static_cast<int64_t>(few.size()), few_grads.data()});
    }
    Check(client.Push(step, grads.data(), sparse).status(), "push");
    Check(client.Pull(step + 1, step, params.data()).status(), "pull");
    ++step;
    return Seconds(t0);
  };
  double ordinary = 1e30;
  for (int i = 0; i < 3; ++i) ordinary = std::min(ordinary, one_step());

  auto bytes_at = [&](int64_t s) {
    int64_t b = 0;
    absl::StatusOr<std::vector<std::string>> names = Env::Default()->GetChildren(dir);
    if (!names.ok()) return b;
    for (const std::string& n : *names) {
      if (n.rfind(absl::StrCat("model.ckpt-", s, ".ps"), 0) != 0) continue;
      struct stat st;
      if (stat(absl::StrCat(dir, "/", n).c_str(), &st) == 0) b += st.st_size;
    }
    return b;
  };
  std::unique_ptr<ParameterServer> ps1;
  std::printf("%-12s %8s %9s %8s %10s\n", "move", "save s", "restore s", "pause s", "moved GB");
  const int rounds = std::max(1, absl::GetFlag(FLAGS_rounds));
  for (int m = 0; m < 2 * rounds; ++m) {
    const bool grow = m % 2 == 0;
    const std::string move =
        absl::StrCat(grow ? "1 -> 2" : "2 -> 1", rounds > 1 ? absl::StrCat(" (", m / 2 + 1, ")") : std::string());
    ControlRequest r;
    r.command = grow ? "add-ps" : "remove-ps";
    r.address = "h1:2";
    r.ps = 1;
    Check(ps0->Control(r).status(), r.command.c_str());
    const double marked = one_step();  // its decision is saved by every task
    const int64_t at = step;
    PsSet set;
    set.version = m + 1;
    set.step = at;
    set.hosts = grow ? std::vector<std::string>{"h0:1", "h1:2"} : std::vector<std::string>{"h0:1"};
    const double save = std::max(0.0, marked - ordinary);
    if (grow) ps1 = Task(1, {"h0:1", "h1:2"}, dir);
    const absl::Time moving = absl::Now();
    std::vector<PsInterface*> tasks = {ps0.get()};
    if (grow) tasks.push_back(ps1.get());
    Check(client.MoveTo(tasks, PlacementFor(grow ? 2 : 1), set, absl::Seconds(600)), "move");
    const double restore = Seconds(moving);
    std::printf("%-12s %8.2f %9.2f %8.2f %10.2f\n", move.c_str(), save, restore, save + restore,
                bytes_at(at) / 1e9);
    std::fflush(stdout);
    if (!grow) {
      ControlRequest retire;
      retire.command = "retire";
      Check(ps1->Control(retire).status(), "retire");
    }
    one_step();
  }
  std::printf("an ordinary step: %.3f s\n", ordinary);
  if (own_dir) {
    absl::StatusOr<std::vector<std::string>> names = Env::Default()->GetChildren(dir);
    if (names.ok()) {
      for (const std::string& n : *names) Env::Default()->RemoveFile(absl::StrCat(dir, "/", n)).IgnoreError();
    }
    rmdir(dir.c_str());
  }
  return 0;
}

}  // namespace
}  // namespace dtrain::ps

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("How long a dlrm-sized job pauses when its ps set changes (1 -> 2 -> 1 ps tasks)");
  absl::ParseCommandLine(argc, argv);
  return dtrain::ps::Run();
}
