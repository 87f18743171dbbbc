#include "ps/testing/ps_test_util.h"

#include <utility>

#include "common/status_macros.h"
#include "glog/logging.h"

namespace dtrain::ps::testing {

TrainConfig MakeConfig(const std::string& mode, int num_workers, int replicas_to_aggregate, float learning_rate) {
  TrainConfig c;
  c.model_signature = "test-model";
  c.mode = mode;
  c.num_workers = num_workers;
  c.replicas_to_aggregate = replicas_to_aggregate;
  c.total_num_replicas = num_workers;
  c.optimizer.name = "sgd";
  c.optimizer.learning_rate = learning_rate;
  return c;
}

namespace {

absl::Status WriteAll(SliceUpload* upload, const Slices& slices) {
  for (const auto& [key, values] : slices) {
    RETURN_IF_ERROR(upload->Write(key, 0, static_cast<int64_t>(values.size()), WireDtype::kF32, values.data()));
  }
  return absl::OkStatus();
}

// Collects pulled slices into a map.
class MapReceiver : public PullReceiver {
 public:
  explicit MapReceiver(Pulled* out) : out_(out) {}
  absl::Status OnHeader(const PullHeader& header) override {
    out_->header = header;
    return absl::OkStatus();
  }
  absl::StatusOr<Buffer> Destination(uint32_t key, int64_t offset, int64_t n) override {
    std::vector<float>& v = out_->slices[key];
    if (static_cast<int64_t>(v.size()) != offset) {
      return absl::DataLossError(absl::StrCat("slice ", key, ": floats from ", offset, " after ", v.size()));
    }
    v.resize(offset + n);
    return Buffer{v.data() + offset, WireDtype::kF32};
  }
  absl::Status Written(uint32_t, int64_t, int64_t) override { return absl::OkStatus(); }
  absl::StatusOr<Buffer> SparseDestination(uint32_t table, int64_t first, int64_t n, int dim) override {
    std::vector<float>& v = out_->rows[table];
    if (static_cast<int64_t>(v.size()) != first * dim) {
      return absl::DataLossError(absl::StrCat("table ", table, ": rows from ", first, " after ", v.size() / dim));
    }
    v.resize((first + n) * dim);
    return Buffer{v.data() + first * dim, WireDtype::kF32};
  }

 private:
  Pulled* out_;
};

}  // namespace

absl::StatusOr<PushResponse> PushSlices(PsInterface& ps, const PushHeader& header, const Slices& slices,
                                        const std::vector<SparseRows>& sparse) {
  ASSIGN_OR_RETURN(std::unique_ptr<SliceUpload> upload, ps.StartPush(header));
  RETURN_IF_ERROR(WriteAll(upload.get(), slices));
  for (const SparseRows& r : sparse) {
    const int64_t n = static_cast<int64_t>(r.ids.size());
    const int dim = n == 0 ? 0 : static_cast<int>(r.rows.size() / n);
    RETURN_IF_ERROR(upload->WriteSparse(r.table, r.ids.data(), n, dim, WireDtype::kF32, r.rows.data()));
  }
  return upload->Finish();
}

absl::Status InitializeSlices(PsInterface& ps, int worker_id, const Slices& slices) {
  ASSIGN_OR_RETURN(std::unique_ptr<SliceUpload> upload, ps.StartInitialize(worker_id));
  RETURN_IF_ERROR(WriteAll(upload.get(), slices));
  return upload->Finish().status();
}

absl::StatusOr<Pulled> PullSlices(PsInterface& ps, const PullRequest& request) {
  Pulled out;
  MapReceiver receiver(&out);
  RETURN_IF_ERROR(ps.Pull(request, &receiver));
  return out;
}

absl::StatusOr<std::unique_ptr<SimCluster>> SimCluster::Start(SimClusterOptions options) {
  auto cluster = std::make_unique<SimCluster>();
  ASSIGN_OR_RETURN(cluster->placement_, PlaceVariables(options.variables, options.num_ps, options.placement));
  cluster->num_workers_ = options.config.num_workers;
  cluster->config_ = options.config;
  cluster->initial_ = options.initial;
  for (const SliceSpec& s : cluster->placement_.slices) cluster->total_floats_ += s.length;
  if (static_cast<int64_t>(options.initial.size()) != cluster->total_floats_) {
    return absl::InvalidArgumentError("initial values do not match the variables");
  }
  for (int t = 0; t < options.num_ps; ++t) {
    ParameterServerOptions ps_options;
    ps_options.task_index = t;
    ps_options.num_ps = options.num_ps;
    ps_options.num_workers = cluster->num_workers_;
    if (t == 0) ps_options.on_step_applied = options.on_step_applied;
    ps_options.checkpoint = options.checkpoint;
    ps_options.delta = options.delta;
    ps_options.clock = options.clock;
    ps_options.worker_timeout = options.worker_timeout;
    ps_options.decision_key = options.decision_key;
    ps_options.max_workers = options.max_workers;
    ps_options.max_push_rows = options.max_push_rows;
    ps_options.max_pull_rows = options.max_pull_rows;
    ASSIGN_OR_RETURN(std::unique_ptr<ParameterServer> ps, ParameterServer::Create(ps_options));
    cluster->tasks_.push_back(std::move(ps));
  }
  // Whether the chief will restore a checkpoint (task 0 has one that fits) or initialize fresh values.
  TrainConfig config0 = options.config;
  config0.slices = cluster->placement_.task_slices[0];
  ASSIGN_OR_RETURN(CheckpointProbe probe0, cluster->tasks_[0]->Probe(config0));
  for (int w = 0; w < cluster->num_workers_; ++w) {
    std::vector<PsInterface*> tasks;
    for (auto& t : cluster->tasks_) tasks.push_back(t.get());
    WorkerClientOptions wo;
    wo.background = false;
    WorkerClient client(tasks, cluster->placement_.task_slices, w, w == 0, wo);
    RETURN_IF_ERROR(client.Connect(options.config, options.initial.data(), absl::Seconds(5), options.initial_rows));
  }
  cluster->restored_step_ = probe0.restorable_steps.empty() ? -1 : cluster->tasks_[0]->step();
  if (options.config.mode == "sync") {
    for (int t = 1; t < options.num_ps; ++t) {
      if (cluster->tasks_[t]->step() != cluster->tasks_[0]->step()) {
        return absl::InternalError("ps tasks are at different steps after connecting");
      }
    }
  }
  return cluster;
}

uint64_t SimCluster::Session(int t, int worker) {
  RegisterRequest r;
  r.worker_id = worker;
  r.is_chief = worker == 0;
  r.config = config_;
  r.config.slices = placement_.task_slices[t];
  absl::StatusOr<RegisterResponse> response = tasks_[t]->Register(r);
  CHECK(response.ok()) << response.status();
  return response->session;
}

Slices SimCluster::SlicesFor(int t, const std::vector<float>& flat) const {
  Slices out;
  for (const SliceSpec& s : placement_.task_slices[t]) {
    out[s.key] = std::vector<float>(flat.begin() + s.flat_offset, flat.begin() + s.flat_offset + s.length);
  }
  return out;
}

void SimCluster::Scatter(const Slices& slices, std::vector<float>* flat) const {
  flat->resize(total_floats_);
  for (const auto& [key, values] : slices) {
    std::copy(values.begin(), values.end(), flat->begin() + placement_.slices[key].flat_offset);
  }
}

SimWorker::SimWorker(SimCluster* cluster, int worker_id, FaultInjectingPs::Faults faults,
                     absl::Duration step_timeout)
    : cluster_(cluster) {
  std::vector<PsInterface*> tasks;
  for (int t = 0; t < cluster->num_ps(); ++t) {
    faulty_.push_back(std::make_unique<FaultInjectingPs>(&cluster->task(t), faults));
    tasks.push_back(faulty_.back().get());
  }
  WorkerClientOptions wo;
  wo.background = false;
  wo.step_timeout = step_timeout;
  client_ = std::make_unique<WorkerClient>(tasks, cluster->placement().task_slices, worker_id, worker_id == 0, wo);
  // Registered already by SimCluster::Start: connecting again only checks the config and learns the mode.
  connected_ = client_->Connect(cluster->config(), cluster->initial().data(), absl::Seconds(5));
}

absl::StatusOr<int64_t> SimWorker::Pull(int64_t min_step, int64_t since_step, std::vector<float>* params) {
  RETURN_IF_ERROR(connected_);
  params->resize(cluster_->total_floats());
  ASSIGN_OR_RETURN(PullResult r, client_->Pull(min_step, since_step, params->data()));
  training_done_ = r.training_done;
  return r.step;
}

absl::StatusOr<PushResponse::Outcome> SimWorker::Push(int64_t step, const std::vector<float>& grad) {
  RETURN_IF_ERROR(connected_);
  grad_ = grad;
  ASSIGN_OR_RETURN(PushResponse r, client_->Push(step, grad_.data()));
  return r.outcome;
}

absl::Status SimWorker::Done() { return client_->Done(); }

std::vector<float> TestGradient(int worker, int64_t step, const std::vector<float>& params) {
  std::vector<float> g(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    g[i] = 0.1f * params[i] + 0.05f * static_cast<float>(worker + 1) + 0.001f * static_cast<float>(i % 7) -
           0.002f * static_cast<float>(step);
  }
  return g;
}

}  // namespace dtrain::ps::testing
