#include "ps/core/train_config.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "ps/core/optimizer.h"
#include "ps/core/sparse_optimizer.h"
#include "ps/core/sparse_store.h"

namespace dtrain::ps {
namespace {

std::string Describe(const SliceSpec& s) {
  return absl::StrCat("{key ", s.key, ", '", s.variable, "', offset ", s.flat_offset, ", length ", s.length, "}");
}

std::string Describe(const SparseTableSpec& t) {
  return absl::StrCat("{table ", t.table, ", '", t.name, "', dim ", t.dim, ", rows ", t.rows, ", init_scale ",
                      absl::StrFormat("%.9g", t.init_scale), ", init_seed ", t.init_seed, ", max_rows ", t.max_rows,
                      ", admit_after ", t.admit_after, t.initial_values ? ", initial values" : "", "}");
}

std::string Describe(const std::string& s) { return absl::StrCat("'", s, "'"); }
std::string Describe(bool b) { return b ? "true" : "false"; }
std::string Describe(float f) { return absl::StrFormat("%.9g", f); }
template <typename T>
std::string Describe(const T& v) {
  return absl::StrCat(v);
}

template <typename T>
absl::Status Mismatch(absl::string_view field, const T& ps_value, const T& worker_value, int worker_id) {
  return absl::FailedPreconditionError(absl::StrCat(field, " mismatch: ps has ", Describe(ps_value), ", worker ",
                                                    worker_id, " has ", Describe(worker_value)));
}

}  // namespace

int ResolvedReplicasToAggregate(const TrainConfig& config) {
  return config.replicas_to_aggregate == 0 ? config.num_workers : config.replicas_to_aggregate;
}

int ResolvedTotalNumReplicas(const TrainConfig& config) {
  return config.total_num_replicas == 0 ? config.num_workers : config.total_num_replicas;
}

absl::Status ValidateTrainConfig(const TrainConfig& config, int cluster_num_workers) {
  if (config.mode != "sync" && config.mode != "async") {
    return absl::InvalidArgumentError(absl::StrCat("mode must be 'sync' or 'async', got '", config.mode, "'"));
  }
  if (config.num_workers < 1) {
    return absl::InvalidArgumentError(absl::StrCat("num_workers must be >= 1, got ", config.num_workers));
  }
  if (cluster_num_workers > 0 && config.num_workers != cluster_num_workers) {
    return absl::InvalidArgumentError(absl::StrCat("num_workers is ", config.num_workers,
                                                   " but the ps's cluster spec has ", cluster_num_workers,
                                                   " workers"));
  }
  const int r = ResolvedReplicasToAggregate(config), t = ResolvedTotalNumReplicas(config);
  if (config.replicas_to_aggregate < 0 || config.total_num_replicas < 0 || r > t || t > config.num_workers) {
    return absl::InvalidArgumentError(
        absl::StrCat("need 1 <= replicas_to_aggregate (", r, ") <= total_num_replicas (", t,
                     ") <= num_workers (", config.num_workers, ")"));
  }
  if (config.sparse_mode != "sync" && config.sparse_mode != "async") {
    return absl::InvalidArgumentError(
        absl::StrCat("sparse_mode must be 'sync' or 'async', got '", config.sparse_mode, "' (--sparse_mode)"));
  }
  if (config.max_staleness < -1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_staleness must be >= 0 or -1 (unbounded), got ", config.max_staleness));
  }
  if (absl::StatusOr<Optimizer> opt = Optimizer::Create(config.optimizer); !opt.ok()) return opt.status();
  if (!(config.moving_average_decay >= 0.0f && config.moving_average_decay < 1.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("moving_average_decay must be in [0, 1), got ", config.moving_average_decay));
  }
  if (absl::Status s = ValidateSparseTables(config.tables); !s.ok()) return s;
  if (!config.tables.empty()) {
    absl::StatusOr<SparseOptimizer> opt = SparseOptimizer::Create(config.sparse_optimizer, config.optimizer);
    if (!opt.ok()) return opt.status();
  }
  std::set<uint32_t> keys;
  std::vector<const SliceSpec*> by_offset;
  for (const SliceSpec& s : config.slices) {
    if (s.length <= 0 || s.flat_offset < 0) {
      return absl::InvalidArgumentError(absl::StrCat("slice ", Describe(s), " has a bad offset or length"));
    }
    if (!keys.insert(s.key).second) {
      return absl::InvalidArgumentError(absl::StrCat("slice key ", s.key, " appears twice"));
    }
    by_offset.push_back(&s);
  }
  std::sort(by_offset.begin(), by_offset.end(),
            [](const SliceSpec* a, const SliceSpec* b) { return a->flat_offset < b->flat_offset; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    if (by_offset[i - 1]->flat_offset + by_offset[i - 1]->length > by_offset[i]->flat_offset) {
      return absl::InvalidArgumentError(
          absl::StrCat("slices ", Describe(*by_offset[i - 1]), " and ", Describe(*by_offset[i]), " overlap"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckElasticConfig(const TrainConfig& config, int max_workers) {
  const std::string& e = config.elastic_batch;
  if (!e.empty() && e != "per_worker" && e != "global") {
    return absl::InvalidArgumentError(
        absl::StrCat("--elastic_batch must be per_worker or global (or unset), got '", e, "'"));
  }
  if (!e.empty() && config.batch_unit <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("an elastic job (--elastic_batch=", e, ") needs a batch > 0"));
  }
  if (e == "global" && config.mode != "sync") {
    return absl::InvalidArgumentError("--elastic_batch=global keeps each sync step's batch: it needs --mode=sync");
  }
  if (e == "global") {
    const int unit = config.batch_unit;
    if (config.global_batch <= 0 || config.global_batch % unit != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--elastic_batch=global needs a --global_batch that is a multiple of --batch_size times the towers (",
          unit, "), got ", config.global_batch));
    }
    if (config.replicas_to_aggregate > 0 || config.total_num_replicas > 0) {
      return absl::InvalidArgumentError(
          "--elastic_batch=global counts every worker of a step (each computes its part of the one batch): "
          "leave --replicas_to_aggregate and --total_num_replicas unset");
    }
    if (config.optimizer.clip_norm > 0) {
      return absl::InvalidArgumentError(
          "--elastic_batch=global with --clip_norm: each worker's part would be clipped on its own, not the step's "
          "gradient; clip with --elastic_batch=per_worker");
    }
    const int units = config.global_batch / unit;
    if (std::max(max_workers, config.num_workers) > units) {
      return absl::InvalidArgumentError(absl::StrCat(
          "a global batch of ", config.global_batch, " examples in parts of ", unit, " (--batch_size times the "
          "towers) feeds at most ", units, " workers, but the job takes up to ", std::max(max_workers,
          config.num_workers), " (--max_workers, or the spec's workers): raise --global_batch or lower the batch"));
    }
  }
  if (e.empty() && max_workers > config.num_workers) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the ps tasks take up to ", max_workers, " workers (--max_workers), more than the cluster spec's ",
        config.num_workers, ": workers that join read their input from ps 0, so start every worker with "
        "--elastic_batch=per_worker or --elastic_batch=global"));
  }
  return absl::OkStatus();
}

absl::Status CompareTrainConfigs(const TrainConfig& ps, const TrainConfig& w, int worker_id) {
  if (ps.model_signature != w.model_signature) {
    return Mismatch("model_signature", ps.model_signature, w.model_signature, worker_id);
  }
  if (ps.mode != w.mode) return Mismatch("mode", ps.mode, w.mode, worker_id);
  if (ps.sparse_mode != w.sparse_mode) return Mismatch("sparse_mode", ps.sparse_mode, w.sparse_mode, worker_id);
  if (ps.num_workers != w.num_workers) return Mismatch("num_workers", ps.num_workers, w.num_workers, worker_id);
  if (ps.elastic_batch != w.elastic_batch) {
    return Mismatch("elastic_batch", ps.elastic_batch, w.elastic_batch, worker_id);
  }
  if (ps.batch_unit != w.batch_unit) return Mismatch("the elastic batch", ps.batch_unit, w.batch_unit, worker_id);
  if (ps.global_batch != w.global_batch) {
    return Mismatch("global_batch", ps.global_batch, w.global_batch, worker_id);
  }
  if (ResolvedReplicasToAggregate(ps) != ResolvedReplicasToAggregate(w)) {
    return Mismatch("replicas_to_aggregate", ResolvedReplicasToAggregate(ps), ResolvedReplicasToAggregate(w),
                    worker_id);
  }
  if (ResolvedTotalNumReplicas(ps) != ResolvedTotalNumReplicas(w)) {
    return Mismatch("total_num_replicas", ResolvedTotalNumReplicas(ps), ResolvedTotalNumReplicas(w), worker_id);
  }
  if (ps.max_staleness != w.max_staleness) {
    return Mismatch("max_staleness", ps.max_staleness, w.max_staleness, worker_id);
  }
  const OptimizerConfig &a = ps.optimizer, &b = w.optimizer;
  if (a.name != b.name) return Mismatch("optimizer.name", a.name, b.name, worker_id);
  if (a.learning_rate != b.learning_rate) {
    return Mismatch("optimizer.learning_rate", a.learning_rate, b.learning_rate, worker_id);
  }
  if (a.decay_steps != b.decay_steps) return Mismatch("optimizer.decay_steps", a.decay_steps, b.decay_steps, worker_id);
  if (a.decay_rate != b.decay_rate) return Mismatch("optimizer.decay_rate", a.decay_rate, b.decay_rate, worker_id);
  if (a.staircase != b.staircase) return Mismatch("optimizer.staircase", a.staircase, b.staircase, worker_id);
  if (a.lr_schedule != b.lr_schedule) return Mismatch("optimizer.lr_schedule", a.lr_schedule, b.lr_schedule, worker_id);
  if (a.min_learning_rate != b.min_learning_rate) {
    return Mismatch("optimizer.min_learning_rate", a.min_learning_rate, b.min_learning_rate, worker_id);
  }
  if (a.warmup_steps != b.warmup_steps) {
    return Mismatch("optimizer.warmup_steps", a.warmup_steps, b.warmup_steps, worker_id);
  }
  if (a.warmup_start_factor != b.warmup_start_factor) {
    return Mismatch("optimizer.warmup_start_factor", a.warmup_start_factor, b.warmup_start_factor, worker_id);
  }
  if (a.momentum != b.momentum) return Mismatch("optimizer.momentum", a.momentum, b.momentum, worker_id);
  if (a.nesterov != b.nesterov) return Mismatch("optimizer.nesterov", a.nesterov, b.nesterov, worker_id);
  if (a.beta1 != b.beta1) return Mismatch("optimizer.beta1", a.beta1, b.beta1, worker_id);
  if (a.beta2 != b.beta2) return Mismatch("optimizer.beta2", a.beta2, b.beta2, worker_id);
  if (a.epsilon != b.epsilon) return Mismatch("optimizer.epsilon", a.epsilon, b.epsilon, worker_id);
  if (a.weight_decay != b.weight_decay) {
    return Mismatch("optimizer.weight_decay", a.weight_decay, b.weight_decay, worker_id);
  }
  if (a.rho != b.rho) return Mismatch("optimizer.rho", a.rho, b.rho, worker_id);
  if (a.centered != b.centered) return Mismatch("optimizer.centered", a.centered, b.centered, worker_id);
  if (a.initial_accumulator != b.initial_accumulator) {
    return Mismatch("optimizer.initial_accumulator", a.initial_accumulator, b.initial_accumulator, worker_id);
  }
  if (a.clip_norm != b.clip_norm) return Mismatch("optimizer.clip_norm", a.clip_norm, b.clip_norm, worker_id);
  if (ps.moving_average_decay != w.moving_average_decay) {
    return Mismatch("moving_average_decay", ps.moving_average_decay, w.moving_average_decay, worker_id);
  }
  if (ps.slices.size() != w.slices.size()) {
    return Mismatch("number of slices", ps.slices.size(), w.slices.size(), worker_id);
  }
  for (size_t i = 0; i < ps.slices.size(); ++i) {
    if (!(ps.slices[i] == w.slices[i])) {
      return Mismatch(absl::StrCat("slices[", i, "]"), ps.slices[i], w.slices[i], worker_id);
    }
  }
  if (ps.tables.size() != w.tables.size()) {
    return Mismatch("number of sparse tables", ps.tables.size(), w.tables.size(), worker_id);
  }
  for (size_t i = 0; i < ps.tables.size(); ++i) {
    if (!(ps.tables[i] == w.tables[i])) {
      return Mismatch(absl::StrCat("tables[", i, "]"), ps.tables[i], w.tables[i], worker_id);
    }
  }
  if (!ps.tables.empty()) {
    const SparseOptimizerConfig &x = ps.sparse_optimizer, &y = w.sparse_optimizer;
    if (x.name != y.name) return Mismatch("sparse_optimizer.name", x.name, y.name, worker_id);
    if (x.learning_rate != y.learning_rate) {
      return Mismatch("sparse_optimizer.learning_rate", x.learning_rate, y.learning_rate, worker_id);
    }
    if (x.initial_accumulator != y.initial_accumulator) {
      return Mismatch("sparse_optimizer.initial_accumulator", x.initial_accumulator, y.initial_accumulator,
                      worker_id);
    }
    if (x.beta1 != y.beta1) return Mismatch("sparse_optimizer.beta1", x.beta1, y.beta1, worker_id);
    if (x.beta2 != y.beta2) return Mismatch("sparse_optimizer.beta2", x.beta2, y.beta2, worker_id);
    if (x.epsilon != y.epsilon) return Mismatch("sparse_optimizer.epsilon", x.epsilon, y.epsilon, worker_id);
    if (x.l1 != y.l1) return Mismatch("sparse_optimizer.l1", x.l1, y.l1, worker_id);
    if (x.l2 != y.l2) return Mismatch("sparse_optimizer.l2", x.l2, y.l2, worker_id);
    if (x.lr_power != y.lr_power) return Mismatch("sparse_optimizer.lr_power", x.lr_power, y.lr_power, worker_id);
  }
  return absl::OkStatus();
}

}  // namespace dtrain::ps
