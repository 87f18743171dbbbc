#include "worker/train/step_runner.h"

#include <signal.h>
#include <unistd.h>

#include <cstdio>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "worker/train/step_trace.h"

namespace dtrain::worker {

StepRunner::StepRunner(Towers* towers, ps::WorkerClient* client, bool sync, int64_t row_cache_rows,
                       int row_cache_staleness, int64_t kill_mid_push_at_step, bool tune_apply_early)
    : kill_mid_push_at_step_(kill_mid_push_at_step), towers_(towers), client_(client), sync_(sync) {
  if (tune_apply_early) tuner_ = std::make_unique<ApplyEarlyTuner>();
  const models::Graph& graph = towers->tower(0)->graph();
  sparse_model_ = !graph.tables.empty();
  if (sparse_model_) {
    for (auto& s : sparse_) s = std::make_unique<SparseBatch>(graph);
    eval_sparse_ = std::make_unique<SparseBatch>(graph);
    if (row_cache_rows > 0) {
      std::vector<int> dims;
      for (const models::TableInfo& t : graph.tables) dims.push_back(t.dim);
      cache_ = std::make_unique<RowCache>(std::move(dims), row_cache_rows, row_cache_staleness);
      for (int k = 0; k < 2; ++k) {
        plans_[k].resize(graph.tables.size());
        pulled_[k].resize(graph.tables.size());
      }
    }
  }
}

absl::Status StepRunner::SetUpcomingBatches(const std::vector<models::HostBatch>& batches) {
  if (!sparse_model_) return absl::OkStatus();
  // The slot the current step is not using (the previous step's, done).
  RETURN_IF_ERROR(sparse_[1 - current_]->Prepare(batches));
  upcoming_set_ = true;
  return absl::OkStatus();
}

absl::Status StepRunner::RequestRows(int slot, int64_t step) {
  SparseBatch* b = sparse_[slot].get();
  std::vector<ps::SparsePullRequest> requests;
  for (int t = 0; t < b->num_tables(); ++t) {
    const std::vector<int64_t>& ids = b->unique_ids(t);
    const int dim = b->table(t).dim;
    if (cache_ == nullptr) {
      requests.push_back({static_cast<uint32_t>(t), ids.data(), static_cast<int64_t>(ids.size()), b->rows(t)});
      traffic_.ids_pulled += static_cast<int64_t>(ids.size());
      traffic_.bytes_pulled += static_cast<int64_t>(ids.size()) * (8 + 4 * dim);
      continue;
    }
    RowCache::Plan& plan = plans_[slot][t];
    cache_->Serve(t, step, ids, b->rows(t), &plan);
    traffic_.ids_from_cache += static_cast<int64_t>(ids.size() - plan.pull_ids.size());
    traffic_.ids_pulled += static_cast<int64_t>(plan.pull_ids.size());
    traffic_.bytes_pulled += static_cast<int64_t>(plan.pull_ids.size()) * (8 + 4 * dim);
    if (plan.pull_ids.empty()) continue;
    pulled_[slot][t].resize(plan.pull_ids.size() * dim);
    requests.push_back({static_cast<uint32_t>(t), plan.pull_ids.data(), static_cast<int64_t>(plan.pull_ids.size()),
                        pulled_[slot][t].data()});
  }
  return client_->SetSparsePull(std::move(requests));
}

absl::Status StepRunner::BindRows(int64_t step) {
  SparseBatch& b = *sparse_[current_];
  for (int t = 0; t < b.num_tables(); ++t) {
    RETURN_IF_ERROR(client_->WaitForSparse(static_cast<uint32_t>(t)));
    // With a row cache: the pulled rows into the batch's rows, and into the cache (fresh at this step).
    if (cache_ != nullptr) cache_->Store(t, step, &plans_[current_][t], pulled_[current_][t].data(), b.rows(t));
  }
  return BindRound(0);
}

absl::Status StepRunner::BindRound(int round) {
  SparseBatch& b = *sparse_[current_];
  const int towers = towers_->size();
  for (int k = 0; k < towers; ++k) RETURN_IF_ERROR(towers_->tower(k)->SetSparseInputs(b.inputs(round * towers + k)));
  return absl::OkStatus();
}

absl::Status StepRunner::AddRowGradients(int round) {
  std::vector<models::Model*> models;
  for (int k = 0; k < towers_->size(); ++k) models.push_back(towers_->tower(k));
  return sparse_[current_]->AddGradients(models, /*first=*/round == 0);
}

absl::Status StepRunner::PushRows(float scale) {
  SparseBatch& b = *sparse_[current_];
  // The rounds' row gradients are summed (AddRowGradients): averaged over the towers, times the step's scale.
  if (towers_->size() > 1 || scale != 1.0f) b.ScaleGradients(scale / static_cast<float>(towers_->size()));
  last_step_unique_ids_ = b.total_unique();
  ++traffic_.steps;
  for (int t = 0; t < b.num_tables(); ++t) {
    const int dim = b.table(t).dim;
    if (profile_ != nullptr) profile_->AddSparseRows(t, static_cast<int64_t>(b.unique_ids(t).size()));
    if (cache_ == nullptr) {
      RETURN_IF_ERROR(client_->PushSparse(static_cast<uint32_t>(t), b.unique_ids(t).data(),
                                          static_cast<int64_t>(b.unique_ids(t).size()), b.grads(t)));
      traffic_.ids_pushed += static_cast<int64_t>(b.unique_ids(t).size());
      traffic_.bytes_pushed += static_cast<int64_t>(b.unique_ids(t).size()) * (8 + 4 * dim);
      continue;
    }
    // The gradients of cached rows wait for their next pull; the others go now, with what their rows gathered.
    cache_->Gradients(t, b.unique_ids(t), plans_[current_][t], b.grads(t), &push_ids_, &push_grads_);
    traffic_.ids_pushed += static_cast<int64_t>(push_ids_.size());
    traffic_.bytes_pushed += static_cast<int64_t>(push_ids_.size()) * (8 + 4 * dim);
    if (push_ids_.empty()) continue;
    RETURN_IF_ERROR(client_->PushSparse(static_cast<uint32_t>(t), push_ids_.data(),
                                        static_cast<int64_t>(push_ids_.size()), push_grads_.data()));
  }
  return absl::OkStatus();
}

absl::StatusOr<ps::PullResult> StepRunner::Start() {
  if (sparse_model_) {
    if (!upcoming_set_) {
      return absl::FailedPreconditionError("a model with sparse tables starts with SetUpcomingBatches");
    }
    current_ = 1 - current_;
    upcoming_set_ = false;
    RETURN_IF_ERROR(RequestRows(current_, step_));
  }
  // A worker that joins a running elastic job waits for the step it counts from (WorkerClient::join_step).
  ASSIGN_OR_RETURN(ps::PullResult at,
                   client_->Pull(/*min_step=*/client_->join_step(), /*since_step=*/0, towers_->host_params()));
  step_ = at.step;
  return at;
}

absl::StatusOr<ps::PullResult> StepRunner::RedrawCurrent(const std::vector<models::HostBatch>& batches) {
  if (!sparse_model_) return absl::FailedPreconditionError("RedrawCurrent: the model has no sparse tables");
  if (cache_ != nullptr) return absl::FailedPreconditionError("RedrawCurrent: not with a row cache");
  RETURN_IF_ERROR(client_->FinishPull().status());  // it brought the rows of the batches drawn before
  RETURN_IF_ERROR(sparse_[current_]->Prepare(batches));
  RETURN_IF_ERROR(RequestRows(current_, step_));
  ASSIGN_OR_RETURN(ps::PullResult at, client_->Pull(sync_ ? step_ : 0, step_, towers_->host_params()));
  step_ = at.step;
  return at;
}

absl::Status StepRunner::LoadSparseRows(const models::HostBatch& batch) {
  if (!sparse_model_) return absl::OkStatus();
  RETURN_IF_ERROR(eval_sparse_->Prepare({batch}));
  // Read only: evaluation must not create (or count, or keep from eviction) the rows of the test set's ids.
  std::vector<ps::SparsePullRequest> requests;  // every row (the cache is the training steps')
  for (int t = 0; t < eval_sparse_->num_tables(); ++t) {
    requests.push_back({static_cast<uint32_t>(t), eval_sparse_->unique_ids(t).data(),
                        static_cast<int64_t>(eval_sparse_->unique_ids(t).size()), eval_sparse_->rows(t)});
  }
  RETURN_IF_ERROR(client_->SetSparsePull(std::move(requests), /*read_only=*/true));
  // The parameters of that pull are not used (tower 0 keeps what LoadParameters gave it: maybe the moving
  // averages): only the rows.
  scratch_params_.resize(towers_->num_parameters());
  RETURN_IF_ERROR(client_->Pull(sync_ ? step_ : 0, step_, scratch_params_.data()).status());
  return towers_->tower(0)->SetSparseInputs(eval_sparse_->inputs(0));
}

absl::StatusOr<std::vector<std::vector<float>>> StepRunner::PullTables() {
  const std::vector<models::TableInfo>& tables = towers_->tower(0)->graph().tables;
  std::vector<std::vector<float>> rows(tables.size());
  std::vector<std::vector<int64_t>> ids(tables.size());
  int64_t most = 0;
  for (size_t t = 0; t < tables.size(); ++t) {
    if (tables[t].rows <= 0) continue;
    ids[t].resize(tables[t].rows);
    for (int64_t id = 0; id < tables[t].rows; ++id) ids[t][id] = id;
    rows[t].resize(tables[t].rows * tables[t].dim);
    most = std::max(most, tables[t].rows);
  }
  scratch_params_.resize(towers_->num_parameters());
  // In pulls of at most kRowsPerPull rows of each table: a ps task answers at most --max_pull_rows (4 M) rows of
  // a table in one pull, and a smaller answer keeps the memory both sides hold for it small.
  constexpr int64_t kRowsPerPull = int64_t{1} << 20;
  for (int64_t first = 0; first < most; first += kRowsPerPull) {
    std::vector<ps::SparsePullRequest> requests;
    for (size_t t = 0; t < tables.size(); ++t) {
      if (tables[t].rows <= first) continue;
      const int64_t n = std::min(kRowsPerPull, tables[t].rows - first);
      requests.push_back({static_cast<uint32_t>(t), ids[t].data() + first, n, rows[t].data() + first * tables[t].dim});
    }
    // Read only: a row never touched in training is its initializer, as on the ps, without being created there.
    RETURN_IF_ERROR(client_->Pull(sync_ ? step_ : 0, step_, scratch_params_.data(), std::move(requests),
                                  /*read_only=*/true)
                        .status());
  }
  return rows;
}

absl::Status StepRunner::ScoreBatch(const models::HostBatch& batch, float* logits) {
  RETURN_IF_ERROR(client_->WaitForRange(0, towers_->num_parameters()));
  if (sparse_model_) {
    RETURN_IF_ERROR(BindRows(step_));
  }
  RETURN_IF_ERROR(towers_->SetParameters(towers_->host_params()));  // devices: upload them (host towers: nothing)
  return towers_->tower(0)->Predict(batch, logits);
}

absl::Status StepRunner::Step(const std::vector<models::HostBatch>& batches, int64_t step) {
  return StepRounds(batches, step, 1.0f);
}

namespace {

using SteadyClock = std::chrono::steady_clock;

// Adds the seconds from its construction to its destruction to `*into` (nothing when `into` is null).
class PartTimer {
 public:
  explicit PartTimer(double* into) : into_(into), start_(into ? SteadyClock::now() : SteadyClock::time_point()) {}
  ~PartTimer() {
    if (into_ != nullptr) *into_ += SecondsSince(start_);
  }

 private:
  double* into_;
  SteadyClock::time_point start_;
};

}  // namespace

absl::Status StepRunner::StepRounds(const std::vector<models::HostBatch>& batches, int64_t step, float scale) {
  const size_t per_round = static_cast<size_t>(towers_->size());
  const size_t rounds = batches.size() / per_round;
  if (rounds == 0 || batches.size() % per_round != 0) {
    return absl::InvalidArgumentError(absl::StrCat("a step takes a batch per tower in each round: got ",
                                                   batches.size(), " batches for ", per_round, " towers"));
  }
  if (profile_ != nullptr) profile_->StepBegin();
  if (trace_ != nullptr) trace_->SetStep(step);
  // --metrics_port: the parts of this step, in seconds (none timed without metrics).
  double pull_s = 0, push_s = 0;
  double* const pull_into = metrics_ != nullptr ? &pull_s : nullptr;
  double* const push_into = metrics_ != nullptr ? &push_s : nullptr;
  if (metrics_ != nullptr) {
    metrics_step_start_ = SteadyClock::now();
    metrics_examples_ = 0;
    for (const models::HostBatch& b : batches) metrics_examples_ += b.batch;
    hook_pull_ = hook_push_ = 0;
  }
  if (sparse_model_) {
    if (!upcoming_set_) {
      return absl::FailedPreconditionError("a model with sparse tables steps after SetUpcomingBatches");
    }
    TraceSpan span(trace_, "wait rows", "pull", step);
    PartTimer timed(pull_into);
    RETURN_IF_ERROR(BindRows(step));
  }
  if (tuner_) {
    const absl::Time now = absl::Now();
    const double seconds =
        last_step_start_ == absl::InfinitePast() ? -1.0 : absl::ToDoubleSeconds(now - last_step_start_);
    last_step_start_ = now;
    const int decided = tuner_->decisions();
    client_->set_apply_early(tuner_->Next(seconds));
    if (tuner_->decisions() != decided) {
      LOG(INFO) << "early apply (--apply_early=auto) at step " << step << ": " << tuner_->last_decision();
    }
  }
  // The previous push reads host_grads() until it is done: wait for it before backward overwrites them.
  {
    TraceSpan span(trace_, "wait previous push", "push", step);
    PartTimer timed(push_into);
    RETURN_IF_ERROR(client_->BeginPush(step, towers_->host_grads()));
  }
  models::StepHooks hooks;
  hooks.before_forward = [this](int64_t begin, int64_t end) {
    PartTimer timed(metrics_ != nullptr ? &hook_pull_ : nullptr);
    return client_->WaitForRange(begin, end);
  };
  hooks.after_forward = [step](float loss) -> absl::Status {
    if (std::isfinite(loss)) return absl::OkStatus();
    return absl::InternalError(
        absl::StrCat("loss is ", loss, " at step ", step, ": training diverged (try a smaller --learning_rate)"));
  };
  // Where ps 0 applies the push as it arrives (the early apply), the next pull goes out beside the push once
  // every tower is past its forward pass (the first gradients are their average), and streams the new values
  // while the push uploads; they wait in the transport until backward is over (FinishPush).
  bool pulled_early = false;
  bool try_early = sync_ && !sparse_model_;
  hooks.gradients_ready = [this, step, &pulled_early, &try_early](int64_t begin, int64_t end) -> absl::Status {
    PartTimer timed(metrics_ != nullptr ? &hook_push_ : nullptr);
    if (try_early) {
      try_early = false;
      ASSIGN_OR_RETURN(pulled_early, client_->StartPullBesidePush(step + 1, step, towers_->host_params()));
    }
    client_->PushRange(begin, end);
    if (step == kill_mid_push_at_step_) {
      std::fprintf(stderr, "debug: killing this worker in the middle of the push of step %lld\n",
                   static_cast<long long>(step));
      std::fflush(stderr);
      kill(getpid(), SIGKILL);
    }
    return absl::OkStatus();
  };
  // Several rounds: the last one pushes, with the sum of the others and the scale folded into each range as it
  // is ready; the others add their gradients to round_sum_.
  float* grads = towers_->host_grads();
  if (rounds > 1 || scale != 1.0f) {
    hooks.gradients_ready = [this, grads, scale, rounds, push = std::move(hooks.gradients_ready)](
                                int64_t begin, int64_t end) -> absl::Status {
      for (int64_t i = begin; i < end; ++i) grads[i] = (rounds > 1 ? round_sum_[i] + grads[i] : grads[i]) * scale;
      return push(begin, end);
    };
  }
  // The rounds before the last (none in a plain step: nothing of this is built then).
  models::StepHooks summing;
  if (rounds > 1) {
    summing = hooks;
    summing.gradients_ready = [this, grads](int64_t begin, int64_t end) -> absl::Status {
      for (int64_t i = begin; i < end; ++i) round_sum_[i] += grads[i];
      return absl::OkStatus();
    };
    round_sum_.assign(towers_->num_parameters(), 0.0f);
  }
  // The timeline's hooks around the profile's (or the plain ones): a step in the trace's window only.
  std::optional<StepTrace> traced;
  if (trace_ != nullptr && trace_->InWindow(step)) {
    traced.emplace(trace_, towers_->tower(0)->variables());
    traced->Begin(step);
    hooks = traced->Hooks(hooks);
    if (rounds > 1) summing = traced->Hooks(summing);
  }
  models::StepHooks timed, timed_summing;
  if (profile_ != nullptr) {
    timed = profile_->TimeHooks(hooks);
    if (rounds > 1) timed_summing = profile_->TimeHooks(summing);
    profile_->ComputeBegin();
  }
  absl::StatusOr<float> loss = 0.0f;
  double loss_sum = 0;
  const SteadyClock::time_point compute_start = metrics_ != nullptr ? SteadyClock::now() : SteadyClock::time_point();
  for (size_t r = 0; r < rounds && loss.ok(); ++r) {
    const bool last = r + 1 == rounds;
    models::StepHooks* round_hooks =
        profile_ != nullptr ? (last ? &timed : &timed_summing) : (last ? &hooks : &summing);
    if (sparse_model_ && r > 0) {
      const absl::Status bound = BindRound(static_cast<int>(r));
      if (!bound.ok()) loss = bound;
    }
    if (loss.ok() && rounds == 1) {
      loss = towers_->ComputeGradients(batches, step, round_hooks);
    } else if (loss.ok()) {
      const std::vector<models::HostBatch> round(batches.begin() + r * per_round,
                                                 batches.begin() + (r + 1) * per_round);
      loss = towers_->ComputeGradients(round, step, round_hooks);
    }
    if (loss.ok() && sparse_model_) {
      const absl::Status added = AddRowGradients(static_cast<int>(r));
      if (!added.ok()) loss = added;
    }
    if (loss.ok()) loss_sum += *loss;
  }
  if (loss.ok()) loss = static_cast<float>(loss_sum / static_cast<double>(rounds));
  if (profile_ != nullptr) profile_->ComputeEnd();
  if (traced) traced->End();
  if (metrics_ != nullptr) {
    metrics_->Observe(StepMetrics::Part::kCompute, std::max(0.0, SecondsSince(compute_start) - hook_pull_ - hook_push_));
    pull_s += hook_pull_;
    push_s += hook_push_;
  }
  // Every parameter has been read; the pull that brought them is over (finished already when the next one went
  // out beside the push).
  absl::Status pulled = absl::OkStatus();
  {
    TraceSpan span(trace_, "finish pull", "pull", step);
    PartTimer timed(pull_into);
    pulled = !loss.ok() ? loss.status() : pulled_early ? absl::OkStatus() : client_->FinishPull().status();
  }
  if (pulled.ok() && sparse_model_) {
    TraceSpan span(trace_, "push rows", "push", step);
    PartTimer timed(push_into);
    pulled = PushRows(scale);
  }
  if (!pulled.ok()) {
    // The gradients are not all final (a pull failed, say, because a ps task restarted): the push must not
    // commit, and must complete, or the next WaitPush (Reconnect's) would wait for it until it times out.
    client_->AbandonPush(pulled);
    metrics_examples_ = -1;
    return pulled;
  }
  {
    TraceSpan span(trace_, "finish push", "push", step);
    PartTimer timed(push_into);
    client_->FinishPush();
  }
  if (sparse_model_) {
    // The next step's rows come with the next pull.
    current_ = 1 - current_;
    upcoming_set_ = false;
    TraceSpan span(trace_, "request rows", "pull", step);
    PartTimer timed(pull_into);
    RETURN_IF_ERROR(RequestRows(current_, step + 1));
  }
  if (!pulled_early) {
    TraceSpan span(trace_, "start pull", "pull", step);
    PartTimer timed(pull_into);
    client_->StartPull(sync_ ? step + 1 : 0, step, towers_->host_params());
  }
  if (profile_ != nullptr) profile_->StepEnd();
  if (metrics_ != nullptr) {
    metrics_->Observe(StepMetrics::Part::kPull, pull_s);
    metrics_->Observe(StepMetrics::Part::kPush, push_s);
  }
  losses_.push_back(*loss);
  return absl::OkStatus();
}

absl::StatusOr<ps::PullResult> StepRunner::NextStep() {
  TraceSpan span(trace_, "wait pull header", "pull");  // of the step just computed (the trace's current one)
  const SteadyClock::time_point waiting = metrics_ != nullptr ? SteadyClock::now() : SteadyClock::time_point();
  absl::StatusOr<ps::PullResult> at = client_->WaitPullHeader();
  if (metrics_ != nullptr && metrics_examples_ >= 0) {
    if (at.ok()) {
      // The step is done once the next parameters are announced: what the progress lines count.
      metrics_->Observe(StepMetrics::Part::kSyncWait, SecondsSince(waiting));
      metrics_->ObserveStep(SecondsSince(metrics_step_start_));
      metrics_->AddStep(metrics_examples_);
      metrics_->SetGlobalStep(at->step);
    }
    metrics_examples_ = -1;
  }
  if (!at.ok()) return at.status();
  step_ = at->step;
  return *at;
}

absl::StatusOr<std::vector<float>> StepRunner::TakeLosses() { return std::exchange(losses_, {}); }

absl::StatusOr<ps::PullResult> StepRunner::Settle() {
  ASSIGN_OR_RETURN(ps::PullResult at, client_->FinishPull());
  RETURN_IF_ERROR(client_->WaitPush().status());
  step_ = at.step;
  return at;
}

absl::StatusOr<ps::PullResult> StepRunner::PullNewest() {
  ASSIGN_OR_RETURN(ps::PullResult at, client_->Pull(0, step_, towers_->host_params()));
  step_ = at.step;
  return at;
}

absl::Status StepRunner::LoadParameters(bool moving_averages) {
  if (moving_averages) {
    RETURN_IF_ERROR(client_->Pull(0, step_, towers_->host_params(), /*moving_averages=*/true).status());
  }
  return towers_->SetParameters(towers_->host_params());
}

absl::StatusOr<std::vector<float>> StepRunner::Parameters() {
  const float* p = towers_->host_params();
  return std::vector<float>(p, p + towers_->num_parameters());
}

}  // namespace dtrain::worker
