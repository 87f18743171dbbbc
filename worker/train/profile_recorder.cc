#include "worker/train/profile_recorder.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <sstream>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/cpu_budget.h"
#include "common/file_util.h"
#include "common/process_clock.h"
#include "common/status_macros.h"
#include "ps/core/slice_store.h"

namespace dtrain::worker {
namespace {

using json = nlohmann::json;

// The profile holds the variables' placement on every count of ps tasks from 1 to this (the planner predicts
// only counts it has).
constexpr int kProfiledPsTasks = 16;

std::string CpuModel() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line)) {
    if (absl::StartsWith(line, "model name")) {
      absl::string_view v = line;
      v.remove_prefix(v.find(':') + 1);
      return std::string(absl::StripAsciiWhitespace(v));
    }
  }
  return "unknown";
}

json Stats(const std::vector<double>& v, bool quantiles = false) {
  json j;
  j["n"] = v.size();
  if (v.empty()) return j;
  const double mean = std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
  double var = 0;
  for (double x : v) var += (x - mean) * (x - mean);
  j["median"] = ProfileRecorder::Quantile(v, 0.5);
  j["p90"] = ProfileRecorder::Quantile(v, 0.9);
  j["mean"] = mean;
  j["stddev"] = v.size() > 1 ? std::sqrt(var / static_cast<double>(v.size() - 1)) : 0.0;
  j["min"] = *std::min_element(v.begin(), v.end());
  j["max"] = *std::max_element(v.begin(), v.end());
  if (quantiles) {
    // The distribution, for the expected slowest of W workers: quantiles 0, 0.01, ..., 1.
    std::vector<double> sorted = v;
    std::sort(sorted.begin(), sorted.end());
    json q = json::array();
    for (int i = 0; i <= 100; ++i) q.push_back(ProfileRecorder::Quantile(sorted, i / 100.0));
    j["quantiles"] = q;
  }
  return j;
}

double Median(const std::vector<double>& v) { return v.empty() ? 0.0 : ProfileRecorder::Quantile(v, 0.5); }

// A layer's name from the variables in its range: the first one's, without its last path component ("conv1/w"
// -> "conv1").
std::string LayerName(const std::vector<ps::VariableInfo>& vars, int64_t begin) {
  int64_t at = 0;
  for (const ps::VariableInfo& v : vars) {
    if (at == begin) {
      const size_t slash = v.name.rfind('/');
      return slash == std::string::npos ? v.name : v.name.substr(0, slash);
    }
    at += v.size;
  }
  return absl::StrCat("floats_", begin);
}

int WireBytesPerFloat(const std::string& dtype) { return dtype == "fp32" ? 4 : 2; }

}  // namespace

ProfileRecorder::ProfileRecorder(const Options& options) : options_(options), created_(Clock::now()) {}

double ProfileRecorder::Quantile(std::vector<double> values, double q) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const double at = std::clamp(q, 0.0, 1.0) * static_cast<double>(values.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(at));
  const size_t hi = std::min(values.size() - 1, lo + 1);
  return values[lo] + (values[hi] - values[lo]) * (at - static_cast<double>(lo));
}

void ProfileRecorder::SetRun(const ProfiledRun& run) {
  absl::MutexLock lock(&mu_);
  run_ = run;
  have_run_ = true;
}

void ProfileRecorder::AddInputWait(double seconds) {
  absl::MutexLock lock(&mu_);
  input_wait_ += seconds;
}

void ProfileRecorder::MarkTrainEnd() {
  absl::MutexLock lock(&mu_);
  train_end_ = Clock::now();
  have_train_end_ = true;
}

void ProfileRecorder::MarkEvaluation(bool begin) {
  absl::MutexLock lock(&mu_);
  (begin ? eval_begin_ : eval_end_) = Clock::now();
  if (!begin) have_eval_ = true;
}

void ProfileRecorder::MarkEnd() {
  absl::MutexLock lock(&mu_);
  end_ = Clock::now();
  have_end_ = true;
}

void ProfileRecorder::StepBegin() {
  const Clock::time_point now = Clock::now();
  absl::MutexLock lock(&mu_);
  if (steps_seen_ == 0) first_step_ = now;
  // The cycle of the step before (its start to this one's): recorded once that step is past the warm-up.
  if (steps_seen_ > options_.warmup_steps && steps_seen_ - options_.warmup_steps <= options_.max_samples) {
    step_.push_back(Secs(last_step_begin_, now));
  }
  last_step_begin_ = now;
  ++steps_seen_;
  if (steps_seen_ == options_.warmup_steps + 1) cpu_first_ = ProcessCpuSeconds();
  if (keep()) input_.push_back(input_wait_);
  input_wait_ = 0;
  update_seconds_ = 0;
  sparse_rows_now_.clear();
}

void ProfileRecorder::ComputeBegin() {
  absl::MutexLock lock(&mu_);
  compute_thread_ = std::this_thread::get_id();
  forward_.clear();
  ready_.clear();
  have_loss_ = false;
  compute_begin_ = Clock::now();
}

models::StepHooks ProfileRecorder::TimeHooks(const models::StepHooks& inner) {
  models::StepHooks h;
  h.before_forward = [this, f = inner.before_forward](int64_t begin, int64_t end) -> absl::Status {
    const Clock::time_point enter = Clock::now();
    absl::Status s = f ? f(begin, end) : absl::OkStatus();
    const Clock::time_point exit = Clock::now();
    absl::MutexLock lock(&mu_);
    if (std::this_thread::get_id() == compute_thread_) forward_.push_back({begin, end, enter, exit});
    return s;
  };
  h.after_forward = [this, f = inner.after_forward](float loss) -> absl::Status {
    const Clock::time_point enter = Clock::now();
    absl::Status s = f ? f(loss) : absl::OkStatus();
    const Clock::time_point exit = Clock::now();
    absl::MutexLock lock(&mu_);
    if (std::this_thread::get_id() == compute_thread_ && !have_loss_) {
      have_loss_ = true;
      loss_enter_ = enter;
      loss_exit_ = exit;
    }
    return s;
  };
  h.gradients_ready = [this, f = inner.gradients_ready](int64_t begin, int64_t end) -> absl::Status {
    const Clock::time_point enter = Clock::now();
    absl::Status s = f ? f(begin, end) : absl::OkStatus();
    const Clock::time_point exit = Clock::now();
    absl::MutexLock lock(&mu_);
    ready_.push_back({begin, end, enter, exit});
    return s;
  };
  return h;
}

void ProfileRecorder::ComputeEnd() {
  absl::MutexLock lock(&mu_);
  compute_end_ = Clock::now();
}

void ProfileRecorder::StepEnd() {
  const Clock::time_point now = Clock::now();
  absl::MutexLock lock(&mu_);
  // The layers, in forward order, from the first step that reached its loss.
  auto layer = [this](int64_t begin, int64_t end) -> Layer& {
    auto [it, inserted] = layer_of_.try_emplace(begin, static_cast<int>(layers_.size()));
    if (inserted) layers_.push_back({begin, end, {}, {}});
    return layers_[it->second];
  };
  if (!have_loss_ || forward_.empty()) return;  // a step that failed before its loss
  for (const Mark& m : forward_) layer(m.begin, m.end);
  double hooks = Secs(loss_enter_, loss_exit_);
  for (const Mark& m : forward_) hooks += Secs(m.enter, m.exit);
  for (const Mark& m : ready_) hooks += Secs(m.enter, m.exit);
  const double forward_total = Secs(compute_begin_, loss_enter_) - [&] {
    double s = 0;
    for (const Mark& m : forward_) s += Secs(m.enter, m.exit);
    return s;
  }();
  const double compute = Secs(compute_begin_, compute_end_) - hooks;
  // The in-process ps's work of the step (local mode: pushes copied in, the commit, the pull copied out),
  // besides its update.
  const double transport = hooks - Secs(loss_enter_, loss_exit_) + Secs(compute_end_, now) - update_seconds_;
  if (!keep()) return;
  for (size_t i = 0; i < forward_.size(); ++i) {
    const Clock::time_point next = i + 1 < forward_.size() ? forward_[i + 1].enter : loss_enter_;
    double f = Secs(forward_[i].exit, next);
    if (i == 0) f += Secs(compute_begin_, forward_[0].enter);  // the nodes before the first layer
    layer(forward_[i].begin, forward_[i].end).forward.push_back(f);
  }
  for (size_t i = 0; i < ready_.size(); ++i) {
    const Clock::time_point prev = i == 0 ? loss_exit_ : ready_[i - 1].exit;
    double b = Secs(prev, ready_[i].enter);
    if (i + 1 == ready_.size()) b += Secs(ready_[i].exit, compute_end_);  // the nodes before the first layer
    layer(ready_[i].begin, ready_[i].end).backward.push_back(b);
  }
  if (cpu_first_ >= 0) {
    cpu_last_ = ProcessCpuSeconds();
    ++cpu_steps_;
  }
  compute_.push_back(compute);
  forward_total_.push_back(forward_total);
  backward_total_.push_back(compute - forward_total);
  transport_.push_back(std::max(0.0, transport));
  update_.push_back(update_seconds_);
  for (const auto& [table, ids] : sparse_rows_now_) sparse_rows_[table].push_back(static_cast<double>(ids));
}

void ProfileRecorder::AddSparseRows(int table, int64_t ids) {
  absl::MutexLock lock(&mu_);
  sparse_rows_now_[table] += ids;
}

void ProfileRecorder::AddUpdate(const ps::ParameterServerOptions::TimedUpdate& update) {
  absl::MutexLock lock(&mu_);
  update_seconds_ += update.dense_seconds + update.sparse_seconds;
  if (!keep()) return;
  if (update.floats > 0) dense_update_.push_back(update.dense_seconds);
  if (update.rows > 0) sparse_update_.push_back(update.sparse_seconds / static_cast<double>(update.rows));
}

absl::StatusOr<double> TimeUpdate(const std::vector<ps::VariableInfo>& variables,
                                  const ps::OptimizerConfig& optimizer, int gradients) {
  constexpr int kMaxGrads = 4;
  if (gradients < 1 || gradients > kMaxGrads) {
    return absl::InvalidArgumentError(absl::StrCat("TimeUpdate: 1 to 4 gradients, not ", gradients));
  }
  ASSIGN_OR_RETURN(ps::Placement placement, ps::PlaceVariables(variables, 1));
  ASSIGN_OR_RETURN(std::unique_ptr<ps::SliceStore> store,
                   ps::SliceStore::Create(placement.task_slices[0], optimizer, 0.0f));
  store->ResetSlotsAndAverages(0);
  const int64_t floats = store->total_floats();
  std::vector<std::vector<float>> grads(gradients, std::vector<float>(static_cast<size_t>(floats)));
  for (int g = 0; g < gradients; ++g) {
    for (int64_t i = 0; i < floats; ++i) grads[g][i] = 1e-3f * static_cast<float>((i * 7 + g * 13) % 17 - 8);
  }
  using Clock = std::chrono::steady_clock;
  auto secs = [](Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double>(b - a).count();
  };
  std::vector<double> times;
  const Clock::time_point start = Clock::now();
  for (int64_t version = 0; version < 51 && (version < 4 || secs(start, Clock::now()) < 0.25); ++version) {
    const Clock::time_point t0 = Clock::now();
    for (int i = 0; i < store->num_slices(); ++i) {
      const float* ptrs[kMaxGrads];
      for (int g = 0; g < gradients; ++g) ptrs[g] = grads[g].data() + store->spec(i).flat_offset;
      store->Apply(i, version, ptrs, gradients, 1.0f / static_cast<float>(gradients), version + 1);
    }
    if (version > 0) times.push_back(secs(t0, Clock::now()));
  }
  return Median(times);
}

absl::Status ProfileRecorder::MeasurePsCosts() {
  ProfiledRun run;
  {
    absl::MutexLock lock(&mu_);
    if (!have_run_) return absl::FailedPreconditionError("MeasurePsCosts before SetRun: no run described");
    run = run_;
  }
  std::vector<double> by_grads;
  for (int n : {1, 2, 4}) {
    ASSIGN_OR_RETURN(double seconds, TimeUpdate(run.variables, run.optimizer, n));
    by_grads.push_back(seconds);
  }
  // Least squares over (1, 2, 4) gradients: the slope is the cost of one more gradient summed in.
  const double xs[] = {1, 2, 4};
  double mx = 0, my = 0;
  for (int k = 0; k < 3; ++k) mx += xs[k] / 3, my += by_grads[k] / 3;
  double cov = 0, var = 0;
  for (int k = 0; k < 3; ++k) cov += (xs[k] - mx) * (by_grads[k] - my), var += (xs[k] - mx) * (xs[k] - mx);
  int64_t floats = 0;
  for (const ps::VariableInfo& v : run.variables) floats += v.size;
  const double bytes = 4.0 * static_cast<double>(floats);
  absl::MutexLock lock(&mu_);
  apply_seconds_by_grads_ = by_grads;
  sum_per_byte_ = std::max(0.0, cov / var) / bytes;
  apply_per_byte_ = by_grads[0] / bytes;
  have_ps_costs_ = true;
  return absl::OkStatus();
}

std::vector<int64_t> ProfileRecorder::SparseRowsPerStep() const {
  absl::MutexLock lock(&mu_);
  std::vector<int64_t> rows(run_.tables.size(), 0);
  for (size_t t = 0; t < rows.size(); ++t) {
    auto it = sparse_rows_.find(static_cast<int>(t));
    if (it != sparse_rows_.end()) rows[t] = static_cast<int64_t>(std::llround(Median(it->second)));
  }
  return rows;
}

void ProfileRecorder::SetTransportCosts(std::vector<TransportCost> costs) {
  absl::MutexLock lock(&mu_);
  transports_ = std::move(costs);
}

absl::StatusOr<std::string> ProfileRecorder::ToJson() const {
  absl::MutexLock lock(&mu_);
  if (!have_run_) return absl::FailedPreconditionError("no run described (SetRun)");
  if (compute_.empty() || step_.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "no step was measured: ", steps_seen_, " steps ran, the first ", options_.warmup_steps,
        " are warm-up (give --train_steps well above that; device-resident steps on GPUs are not profiled)"));
  }
  json j;
  j["format"] = "dtrain-profile";
  j["version"] = 1;
  const CpuBudget budget = MeasureCpuBudget();  // the affinity mask and the cgroup quota (0: none)
  const double quota = budget.quota_cores;
  const int affinity = budget.affinity_cpus;
  const double available = quota > 0 ? std::min<double>(affinity, quota) : affinity;
  j["host"] = {{"cpu_model", CpuModel()},
               {"online_cpus", sysconf(_SC_NPROCESSORS_ONLN)},
               {"affinity_cpus", affinity},
               {"cgroup_cpu_quota", quota > 0 ? json(quota) : json(nullptr)},
               {"cpus_available", available}};
  const int wire = WireBytesPerFloat(run_.wire_dtype);
  j["run"] = {{"model", run_.model},
              {"batch_size", run_.batch_size},
              {"towers", run_.towers},
              {"examples_per_step", run_.batch_size * run_.towers},
              {"threads", run_.threads},
              // The cores the compute could use: its threads, at most what the host gave the process.
              {"compute_cores", std::min<double>(run_.threads, available)},
              {"mode", run_.mode},
              {"optimizer", run_.optimizer.name},
              {"wire_dtype", run_.wire_dtype},
              {"wire_bytes_per_float", wire}};
  json vars = json::array();
  int64_t total = 0;
  for (const ps::VariableInfo& v : run_.variables) {
    vars.push_back({{"name", v.name}, {"floats", v.size}, {"trainable", v.trainable}});
    total += v.size;
  }
  j["variables"] = vars;
  j["model_floats"] = total;
  json layers = json::array();
  for (const Layer& l : layers_) {
    layers.push_back({{"name", LayerName(run_.variables, l.begin)},
                      {"begin", l.begin},
                      {"end", l.end},
                      {"forward_s", Median(l.forward)},
                      {"backward_s", Median(l.backward)}});
  }
  j["layers"] = layers;
  j["steps"] = {{"seen", steps_seen_},
                {"warmup", options_.warmup_steps},
                {"measured", compute_.size()},
                {"step_s", Stats(step_, /*quantiles=*/true)},
                {"compute_s", Stats(compute_, /*quantiles=*/true)},
                {"forward_s", Stats(forward_total_)},
                {"backward_s", Stats(backward_total_)},
                {"input_s", Stats(input_)},
                {"update_s", Stats(update_)},
                // In the transport's calls (local mode: the in-process ps).
                {"transport_s", Stats(transport_)},
                // Every thread of the process (the input pipeline's too), per measured step.
                {"process_cpu_s", cpu_steps_ > 0 ? (cpu_last_ - cpu_first_) / cpu_steps_ : 0.0}};
  json placements;
  for (int p = 1; p <= kProfiledPsTasks; ++p) {  // every count the planner may be asked about
    absl::StatusOr<ps::Placement> placed = ps::PlaceVariables(run_.variables, p);
    if (!placed.ok()) return placed.status();
    json slices = json::array();
    for (const ps::SliceSpec& s : placed->slices) {
      slices.push_back({{"key", s.key},
                        {"task", placed->task_of_slice[s.key]},
                        {"variable", s.variable},
                        {"begin", s.flat_offset},
                        {"floats", s.length}});
    }
    placements[std::to_string(p)] = {{"task_bytes", placed->task_bytes}, {"slices", slices}};
  }
  j["placement"] = placements;  // bytes and floats as fp32 (the wire carries wire_bytes_per_float per float)
  json ps_costs = {{"optimizer", run_.optimizer.name}, {"apply_threads", 1}};
  if (have_ps_costs_) {
    ps_costs["apply_s_per_byte"] = apply_per_byte_;
    ps_costs["sum_s_per_byte"] = sum_per_byte_;
    ps_costs["apply_s_by_gradients"] = {{"1", apply_seconds_by_grads_[0]},
                                        {"2", apply_seconds_by_grads_[1]},
                                        {"4", apply_seconds_by_grads_[2]}};
  }
  ps_costs["in_run_update_s"] = Stats(dense_update_);
  ps_costs["in_run_apply_threads"] = run_.threads;
  j["ps"] = ps_costs;
  if (!run_.tables.empty()) {
    json tables = json::array();
    for (size_t t = 0; t < run_.tables.size(); ++t) {
      auto it = sparse_rows_.find(static_cast<int>(t));
      tables.push_back({{"name", run_.tables[t].name},
                        {"dim", run_.tables[t].dim},
                        {"rows", run_.tables[t].rows},
                        {"bytes_per_row", 4 * run_.tables[t].dim},
                        {"id_bytes", 8},
                        {"rows_per_step", it == sparse_rows_.end() ? 0.0 : Median(it->second)}});
    }
    j["sparse"] = {{"tables", tables}, {"update_s_per_row", Median(sparse_update_)}};
  }
  json transports = json::object();
  for (const TransportCost& c : transports_) {
    json t = {{"bytes", c.bytes}, {"exchanges", c.exchanges}};
    if (!c.skipped.empty()) {
      t["skipped"] = c.skipped;
    } else {
      t["push_worker_cpu_s_per_byte"] = c.push_worker_cpu_per_byte;
      t["push_ps_cpu_s_per_byte"] = c.push_ps_cpu_per_byte;
      t["pull_ps_cpu_s_per_byte"] = c.pull_ps_cpu_per_byte;
      t["pull_worker_cpu_s_per_byte"] = c.pull_worker_cpu_per_byte;
      t["push_s"] = c.push_seconds;
      t["pull_s"] = c.pull_seconds;
      if (c.stream_piece_bytes > 0) t["stream_piece_bytes"] = c.stream_piece_bytes;
      if (c.sparse_rows > 0) {
        t["sparse_rows"] = {{"per_step", c.sparse_rows},
                            {"extra_s", c.sparse_extra_seconds},
                            {"worker_cpu_s", c.sparse_worker_cpu_seconds},
                            {"ps_cpu_s", c.sparse_ps_cpu_seconds}};
      }
      if (c.cluster_start_seconds > 0) {
        t["cluster_start_s"] = c.cluster_start_seconds;
        t["cluster_end_s"] = c.cluster_end_seconds;
      }
    }
    transports[c.transport] = t;
  }
  j["transports"] = transports;
  const Clock::time_point train_end = have_train_end_ ? train_end_ : last_step_begin_;
  const Clock::time_point after_train = have_eval_ ? eval_end_ : train_end;
  json phases = {{"startup_s", Secs(created_, first_step_)},
                 {"train_s", Secs(first_step_, train_end)},
                 {"evaluate_s", have_eval_ ? Secs(eval_begin_, eval_end_) : 0.0},
                 {"train_steps", steps_seen_}};
  if (have_end_) {
    phases["end_s"] = Secs(after_train, end_);
    phases["total_s"] = Secs(created_, end_);
  }
  j["phases"] = phases;
  return j.dump(1);
}

absl::Status ProfileRecorder::Write(const std::string& path) const {
  ASSIGN_OR_RETURN(std::string text, ToJson());
  return WriteFileAtomically(path, text + "\n");
}

}  // namespace dtrain::worker
