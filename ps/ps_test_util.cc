#include "ps/ps_test_util.h"

#include <utility>

#include "common/status_macros.h"

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

absl::StatusOr<std::unique_ptr<SimCluster>> SimCluster::Start(SimClusterOptions options) {
  auto cluster = std::make_unique<SimCluster>();
  ASSIGN_OR_RETURN(cluster->placement_, PlaceVariables(options.variables, options.num_ps, options.placement));
  cluster->num_workers_ = options.config.num_workers;
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
    cluster->tasks_.push_back(std::make_unique<ParameterServer>(ps_options));
  }
  int64_t restore_step = kRestoreNewest;  // task 0: its newest; the others: what task 0 restored
  for (int t = 0; t < options.num_ps; ++t) {
    TrainConfig config = options.config;
    config.slices = cluster->placement_.task_slices[t];
    for (int w = 0; w < cluster->num_workers_; ++w) {
      RegisterRequest request;
      request.worker_id = w;
      request.is_chief = w == 0;
      request.config = config;
      request.restore_step = restore_step;
      ASSIGN_OR_RETURN(RegisterResponse response, cluster->tasks_[t]->Register(request));
      if (w != 0) continue;
      if (!response.initialized) {
        InitializeRequest init;
        init.worker_id = 0;
        init.slices = cluster->SlicesFor(t, options.initial);
        RETURN_IF_ERROR(cluster->tasks_[t]->Initialize(init));
      } else if (t > 0 && options.config.mode == "sync" && response.global_step != cluster->restored_step_) {
        return absl::InternalError("ps tasks restored different steps");
      }
      if (t == 0) {
        cluster->restored_step_ = response.initialized ? response.global_step : -1;
        restore_step = response.initialized ? response.global_step : kRestoreNone;
      }
    }
  }
  return cluster;
}

std::vector<SliceData> SimCluster::SlicesFor(int t, const std::vector<float>& flat) const {
  std::vector<SliceData> out;
  for (const SliceSpec& s : placement_.task_slices[t]) {
    out.push_back({s.key, std::vector<float>(flat.begin() + s.flat_offset, flat.begin() + s.flat_offset + s.length)});
  }
  return out;
}

void SimCluster::Scatter(const std::vector<SliceData>& slices, std::vector<float>* flat) const {
  flat->resize(total_floats_);
  for (const SliceData& d : slices) {
    std::copy(d.values.begin(), d.values.end(), flat->begin() + placement_.slices[d.key].flat_offset);
  }
}

absl::StatusOr<int64_t> SimWorker::Pull(int64_t min_step, int64_t since_step, std::vector<float>* params,
                                        int64_t timeout_ms) {
  PullRequest request;
  request.worker_id = worker_id_;
  request.min_step = min_step;
  request.since_step = since_step;
  request.timeout_ms = timeout_ms;
  ASSIGN_OR_RETURN(PullResponse ps0, cluster_->task(0).Pull(request));
  cluster_->Scatter(ps0.slices, params);
  training_done_ = ps0.training_done;
  for (int t = 1; t < cluster_->num_ps(); ++t) {
    PullRequest other;
    other.worker_id = worker_id_;
    other.min_step = 0;
    other.decisions = ps0.decisions;
    other.timeout_ms = timeout_ms;
    ASSIGN_OR_RETURN(PullResponse response, cluster_->task(t).Pull(other));
    cluster_->Scatter(response.slices, params);
  }
  return ps0.step;
}

absl::StatusOr<PushResponse::Outcome> SimWorker::Push(int64_t step, const std::vector<float>& grad,
                                                      bool send_twice) {
  const uint64_t request_id = next_request_id_++;
  PushResponse::Outcome outcome = PushResponse::Outcome::kAccepted;
  for (int t = cluster_->num_ps() - 1; t >= 0; --t) {
    PushRequest request;
    request.worker_id = worker_id_;
    request.step = step;
    request.request_id = request_id;
    request.commit = t == 0;
    request.gradients = cluster_->SlicesFor(t, grad);
    for (int attempt = 0; attempt < (send_twice ? 2 : 1); ++attempt) {
      ASSIGN_OR_RETURN(PushResponse response, cluster_->task(t).Push(request));
      if (t == 0 && attempt == 0) outcome = response.outcome;
    }
  }
  return outcome;
}

absl::Status SimWorker::Done() {
  for (int t = 0; t < cluster_->num_ps(); ++t) RETURN_IF_ERROR(cluster_->task(t).Done(worker_id_));
  return absl::OkStatus();
}

std::vector<float> TestGradient(int worker, int64_t step, const std::vector<float>& params) {
  std::vector<float> g(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    g[i] = 0.1f * params[i] + 0.05f * static_cast<float>(worker + 1) + 0.001f * static_cast<float>(i % 7) -
           0.002f * static_cast<float>(step);
  }
  return g;
}

}  // namespace dtrain::ps::testing
