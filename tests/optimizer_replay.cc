// dtrain_optimizer_replay: replays given gradients through real ps tasks and WorkerClients and prints the
// parameters after every step, so that tests/optimizers_pytorch_test.py can hold them against PyTorch's optimizers
// fed the same gradients. A test tool, not part of the product.
//
//   dtrain_optimizer_replay --input=case.json --output=trajectory.json
//
// case.json:
//   {"optimizer": {"name": "adamw", "learning_rate": 0.01, ...any OptimizerConfig field...},  (the rest: the
//                  name's framework defaults, ps::DefaultOptimizerConfig)
//    "mode": "sync" | "async", "num_ps": 2, "num_workers": 2, "transport": "inprocess" | "grpc",
//    "variables": [["a", 700], ["b", 600]], "initial": [...], "gradients": [[[...w0...], [...w1...]], ...],
//    "restart_after": 0}
// Sync: at step s every worker pushes gradients[s][w] (computed at s), the R = num_workers gradients average into
// one update; the parameters after each step are recorded. Async: at step s the workers in turn pull and push
// gradients[s][w], each push an update of its own; the parameters after each push are recorded.
// restart_after = k > 0 (sync): the ps tasks checkpoint at step k, everything is torn down after it (no Done: a
// crash), and new tasks restore the checkpoint and carry on.
// trajectory.json: {"params": [[...], ...]} (one flat vector per recorded update).
//
// Exit status: 0, or 1 with a message on stderr.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "ps/client/placement.h"
#include "ps/client/worker_client.h"
#include "ps/core/optimizer.h"
#include "ps/core/parameter_server.h"
#include "ps/rpc/grpc_ps_client.h"
#include "ps/rpc/server.h"

ABSL_FLAG(std::string, input, "", "The case (JSON, see the file comment)");
ABSL_FLAG(std::string, output, "", "Where the trajectory goes (JSON)");

namespace dtrain::ps {
namespace {

using nlohmann::json;

absl::StatusOr<OptimizerConfig> OptimizerFromJson(const json& j) {
  ASSIGN_OR_RETURN(OptimizerConfig c, DefaultOptimizerConfig(j.at("name").get<std::string>()));
  auto f = [&](const char* key, float* v) {
    if (j.contains(key)) *v = j.at(key).get<float>();
  };
  auto i = [&](const char* key, int64_t* v) {
    if (j.contains(key)) *v = j.at(key).get<int64_t>();
  };
  auto b = [&](const char* key, bool* v) {
    if (j.contains(key)) *v = j.at(key).get<bool>();
  };
  f("learning_rate", &c.learning_rate);
  if (j.contains("lr_schedule")) c.lr_schedule = j.at("lr_schedule").get<std::string>();
  i("decay_steps", &c.decay_steps);
  f("decay_rate", &c.decay_rate);
  b("staircase", &c.staircase);
  f("min_learning_rate", &c.min_learning_rate);
  i("warmup_steps", &c.warmup_steps);
  f("warmup_start_factor", &c.warmup_start_factor);
  f("momentum", &c.momentum);
  b("nesterov", &c.nesterov);
  f("beta1", &c.beta1);
  f("beta2", &c.beta2);
  f("epsilon", &c.epsilon);
  f("weight_decay", &c.weight_decay);
  f("rho", &c.rho);
  b("centered", &c.centered);
  f("initial_accumulator", &c.initial_accumulator);
  f("clip_norm", &c.clip_norm);
  return c;
}

// The ps tasks of one run and every worker's client.
class Cluster {
 public:
  static absl::StatusOr<std::unique_ptr<Cluster>> Start(const json& in, const TrainConfig& config,
                                                        const Placement& placement, const std::string& dir,
                                                        int64_t save_steps, const std::vector<float>& initial) {
    auto c = std::unique_ptr<Cluster>(new Cluster);
    const int num_ps = in.at("num_ps").get<int>();
    const bool grpc = in.value("transport", std::string("inprocess")) == "grpc";
    std::vector<PsInterface*> tasks;
    for (int t = 0; t < num_ps; ++t) {
      ParameterServerOptions po;
      po.task_index = t;
      po.num_ps = num_ps;
      po.num_workers = config.num_workers;
      po.checkpoint.dir = dir;
      po.checkpoint.save_steps = save_steps;
      if (grpc) {
        PsServerOptions so;
        so.listen_address = "127.0.0.1:0";
        so.ps = po;
        so.linger = absl::ZeroDuration();
        ASSIGN_OR_RETURN(std::unique_ptr<PsServer> server, PsServer::Start(so));
        ASSIGN_OR_RETURN(std::unique_ptr<PsInterface> client, NewGrpcPsClient(server->address(), {}));
        c->servers_.push_back(std::move(server));
        c->remotes_.push_back(std::move(client));
        tasks.push_back(c->remotes_.back().get());
      } else {
        ASSIGN_OR_RETURN(std::unique_ptr<ParameterServer> ps, ParameterServer::Create(po));
        c->local_.push_back(std::move(ps));
        tasks.push_back(c->local_.back().get());
      }
    }
    for (int w = 0; w < config.num_workers; ++w) {
      WorkerClientOptions wo;
      wo.background = grpc;
      c->workers_.push_back(std::make_unique<WorkerClient>(tasks, placement.task_slices, w, w == 0, wo));
      // The chief first: it initializes the tasks (or restores their checkpoint); the others find them ready.
      RETURN_IF_ERROR(c->workers_.back()->Connect(config, initial.data(), absl::Seconds(30)));
    }
    return c;
  }
  WorkerClient& worker(int w) { return *workers_[w]; }

 private:
  std::vector<std::unique_ptr<PsServer>> servers_;
  std::vector<std::unique_ptr<PsInterface>> remotes_;
  std::vector<std::unique_ptr<ParameterServer>> local_;
  std::vector<std::unique_ptr<WorkerClient>> workers_;  // destroyed first (declared last)
};

absl::Status Run() {
  std::ifstream f(absl::GetFlag(FLAGS_input));
  if (!f) return absl::NotFoundError(absl::StrCat("cannot read --input=", absl::GetFlag(FLAGS_input)));
  const json in = json::parse(f);
  TrainConfig config;
  config.model_signature = "optimizer-replay";
  config.mode = in.at("mode").get<std::string>();
  config.num_workers = in.at("num_workers").get<int>();
  ASSIGN_OR_RETURN(config.optimizer, OptimizerFromJson(in.at("optimizer")));
  std::vector<VariableInfo> variables;
  for (const json& v : in.at("variables")) variables.push_back({v.at(0).get<std::string>(), v.at(1).get<int64_t>()});
  ASSIGN_OR_RETURN(Placement placement, PlaceVariables(variables, in.at("num_ps").get<int>()));
  const std::vector<float> initial = in.at("initial").get<std::vector<float>>();
  const auto gradients = in.at("gradients").get<std::vector<std::vector<std::vector<float>>>>();
  const int64_t restart_after = in.value("restart_after", int64_t{0});
  const bool sync = config.mode == "sync";
  if (restart_after > 0 && !sync) return absl::InvalidArgumentError("restart_after needs sync mode");

  std::string dir;
  if (restart_after > 0) {
    dir = (std::filesystem::temp_directory_path() / absl::StrCat("dtrain_optimizer_replay.", getpid())).string();
    std::filesystem::remove_all(dir);
  }
  json out;
  out["params"] = json::array();
  std::vector<std::vector<float>> params(config.num_workers, std::vector<float>(initial.size()));
  const int64_t steps = static_cast<int64_t>(gradients.size());
  int64_t step = 0;
  while (step < steps) {
    ASSIGN_OR_RETURN(std::unique_ptr<Cluster> cluster,
                     Cluster::Start(in, config, placement, dir, restart_after, initial));
    const int64_t stop = restart_after > 0 && step < restart_after ? restart_after : steps;
    std::vector<int64_t> at(config.num_workers, step);
    for (int w = 0; w < config.num_workers; ++w) {
      ASSIGN_OR_RETURN(PullResult r, cluster->worker(w).Pull(0, 0, params[w].data()));
      if (r.step != step) return absl::InternalError(absl::StrCat("worker ", w, " starts at step ", r.step));
    }
    for (; step < stop; ++step) {
      for (int w = 0; w < config.num_workers; ++w) {
        if (!sync) {
          ASSIGN_OR_RETURN(PullResult r, cluster->worker(w).Pull(0, 0, params[w].data()));
          at[w] = r.step;
        }
        ASSIGN_OR_RETURN(PushResponse p, cluster->worker(w).Push(sync ? step : at[w], gradients[step][w].data()));
        if (p.outcome != PushResponse::Outcome::kAccepted) {
          return absl::InternalError(absl::StrCat("worker ", w, "'s push at step ", step, " was not taken"));
        }
        if (!sync) {
          RETURN_IF_ERROR(cluster->worker(w).Pull(0, 0, params[w].data()).status());
          out["params"].push_back(params[w]);
        }
      }
      if (sync) {
        for (int w = 0; w < config.num_workers; ++w) {
          ASSIGN_OR_RETURN(PullResult r, cluster->worker(w).Pull(step + 1, step, params[w].data()));
          if (r.step != step + 1) return absl::InternalError(absl::StrCat("pulled step ", r.step, " after ", step));
        }
        out["params"].push_back(params[0]);
      }
    }
    // Gone without Done (a crash): the next round restores the checkpoint of step `stop`.
  }
  if (!dir.empty()) std::filesystem::remove_all(dir);
  std::ofstream o(absl::GetFlag(FLAGS_output));
  o << out.dump();
  if (!o) return absl::InternalError(absl::StrCat("cannot write --output=", absl::GetFlag(FLAGS_output)));
  return absl::OkStatus();
}

}  // namespace
}  // namespace dtrain::ps

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  absl::Status s = dtrain::ps::Run();
  if (!s.ok()) {
    std::fprintf(stderr, "dtrain_optimizer_replay: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  return 0;
}
