#include "worker/trainer.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <utility>

#include <glog/logging.h>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/event_writer.h"
#include "common/status_macros.h"
#include "ps/placement.h"
#include "worker/models/model.h"
#include "worker/ps_group.h"
#include "worker/towers.h"

namespace dtrain::worker {
namespace {

data::Preprocess TrainPreprocess(const std::string& model) {
  return model == "cifar10" ? data::Preprocess::kCifarTrain : data::Preprocess::kScale01;
}
data::Preprocess EvalPreprocess(const std::string& model) {
  return model == "cifar10" ? data::Preprocess::kCifarEval : data::Preprocess::kScale01;
}

models::HostBatch View(const data::Batch& b) {
  return models::HostBatch{b.batch, b.height, b.width, b.channels, b.images.data(), b.labels.data()};
}

// Accuracy of `model` (tower 0, parameters already set) on the whole test set.
absl::StatusOr<double> Evaluate(models::Model* model, const std::vector<data::Batch>& batches) {
  int64_t correct = 0, total = 0;
  for (const data::Batch& b : batches) {
    ASSIGN_OR_RETURN(int c, model->CountCorrect(View(b)));
    correct += c;
    total += b.batch;
  }
  if (total == 0) return absl::FailedPreconditionError("empty test set");
  return static_cast<double>(correct) / total;
}

std::string FormatStats(const ps::TrainingStats& s, bool async) {
  std::string out = absl::StrFormat("ps 0 statistics: global step %d\n", s.global_step);
  absl::StrAppendFormat(&out, "  %-8s %10s %12s %13s %10s %12s\n", "worker", "applied", "dropped_stale",
                        "dropped_backup", "duplicates", "wait_secs");
  for (const ps::WorkerStats& w : s.workers) {
    absl::StrAppendFormat(&out, "  %-8d %10d %12d %13d %10d %12.2f\n", w.worker_id, w.applied, w.dropped_stale,
                          w.dropped_backup, w.duplicates, w.wait_seconds);
  }
  if (async && !s.staleness_histogram.empty()) {
    absl::StrAppend(&out, "  staleness histogram (staleness: pushes):");
    for (size_t k = 0; k < s.staleness_histogram.size(); ++k) {
      if (s.staleness_histogram[k] == 0) continue;
      const bool last = k + 1 == s.staleness_histogram.size();
      absl::StrAppendFormat(&out, " %s%d: %d", last ? ">=" : "", k, s.staleness_histogram[k]);
    }
    absl::StrAppendFormat(&out, "; max %d\n", s.max_staleness_seen);
  }
  return out;
}

}  // namespace

absl::Status ApplyModelDefaults(WorkerOptions* o) {
  const models::ModelDefaults d = models::DefaultsFor(o->model);
  if (d.optimizer.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown --model=", o->model, " (expected mlp, cnn, convnet or cifar10)"));
  }
  if (o->batch_size <= 0) o->batch_size = d.batch_size;
  if (o->learning_rate <= 0) o->learning_rate = d.learning_rate;
  if (o->optimizer.empty()) o->optimizer = d.optimizer;
  if (o->mode != "sync" && o->mode != "async") {
    return absl::InvalidArgumentError(absl::StrCat("--mode must be sync or async, got '", o->mode, "'"));
  }
  if (o->train_steps <= 0) return absl::InvalidArgumentError("--train_steps must be > 0");
  if (o->log_every <= 0) return absl::InvalidArgumentError("--log_every must be > 0");
  return absl::OkStatus();
}

absl::StatusOr<TrainingResult> RunTraining(const WorkerOptions& options,
                                           const std::vector<ps::PsInterface*>& tasks) {
  WorkerOptions o = options;
  RETURN_IF_ERROR(ApplyModelDefaults(&o));
  const bool local = tasks.empty();
  const bool chief = o.worker_id == 0;

  // ---- data ----
  data::DatasetPair loaded;
  const data::DatasetPair* dataset = o.dataset;
  if (dataset == nullptr) {
    ASSIGN_OR_RETURN(loaded, data::LoadDataset(o.data_dir));
    dataset = &loaded;
  }
  const bool crop = o.model == "cifar10";
  models::ModelOptions mopt;
  mopt.batch_size = o.batch_size;
  mopt.eval_batch_size = std::max(o.batch_size, 500);
  mopt.seed = o.seed;
  mopt.height = crop ? 24 : dataset->train.height;
  mopt.width = crop ? 24 : dataset->train.width;
  mopt.channels = dataset->train.channels;
  mopt.num_classes = dataset->train.num_classes;

  data::BatchStreamOptions sopt;
  sopt.batch_size = o.batch_size;
  sopt.shard_index = local ? 0 : o.worker_id;
  sopt.num_shards = local ? 1 : o.num_workers;
  sopt.seed = o.seed;
  sopt.shuffle = o.shuffle;
  sopt.preprocess = TrainPreprocess(o.model);
  ASSIGN_OR_RETURN(std::unique_ptr<data::BatchStream> stream, data::BatchStream::Create(dataset->train, sopt));
  if (o.model == "cifar10" && o.decay_steps == 0) {
    // The CIFAR-10 tutorial: lr 0.1, staircase decay by 0.1 every 350 epochs (steps of one worker's batch).
    o.decay_steps = std::max<int64_t>(1, dataset->train.count() / o.batch_size) * 350;
    o.decay_rate = 0.1f;
    o.staircase = true;
  }

  // ---- towers ----
  ASSIGN_OR_RETURN(std::vector<kernels::DeviceSpec> specs, ParseTowers(o.towers, o.num_gpus, o.threads));
  ASSIGN_OR_RETURN(std::unique_ptr<Towers> towers, Towers::Create(o.model, mopt, specs));
  models::Model* model0 = towers->tower(0);
  const int64_t n = towers->num_parameters();

  // ---- placement and ps config ----
  std::vector<ps::VariableInfo> vars;
  for (const models::VariableInfo& v : model0->variables()) vars.push_back({v.name, v.size()});
  const int num_ps = local ? 1 : static_cast<int>(tasks.size());
  ASSIGN_OR_RETURN(ps::Placement placement, ps::PlaceVariables(vars, num_ps));
  if (chief && !local && !o.quiet) LOG(INFO) << "variable placement:\n" << ps::FormatPlacement(placement);

  ps::TrainConfig config;
  config.model_signature = models::Signature(o.model, model0->variables());
  config.mode = local ? "sync" : o.mode;
  config.num_workers = local ? 1 : o.num_workers;
  config.replicas_to_aggregate = local ? 1 : o.replicas_to_aggregate;
  config.total_num_replicas = local ? 1 : o.total_num_replicas;
  config.max_staleness = o.max_staleness;
  config.optimizer.name = o.optimizer;
  config.optimizer.learning_rate = o.learning_rate;
  config.optimizer.momentum = o.momentum;
  config.optimizer.decay_steps = o.decay_steps;
  config.optimizer.decay_rate = o.decay_rate;
  config.optimizer.staircase = o.staircase;
  config.moving_average_decay = o.moving_average_decay;

  std::unique_ptr<ps::ParameterServer> local_ps;
  std::vector<ps::PsInterface*> task_ptrs = tasks;
  if (local) {
    ps::ParameterServerOptions po;
    po.num_workers = 1;
    po.checkpoint = o.checkpoint;
    po.apply_threads = o.threads;
    local_ps = std::make_unique<ps::ParameterServer>(po);
    task_ptrs = {local_ps.get()};
  }
  PsGroup group(task_ptrs, placement.task_slices, local ? 0 : o.worker_id, chief);
  // A worker that stops on an error still leaves the cluster (best effort), so the ps tasks stop expecting it
  // instead of waiting for it forever; cancelled on the normal path, which reports done itself.
  auto leave_on_error = absl::MakeCleanup([&group, &o] {
    absl::Status s = group.Done();
    if (!s.ok()) LOG(WARNING) << "worker " << o.worker_id << " could not report done: " << s;
  });
  // The flat parameters and gradients live in the towers' host staging buffers (pinned for GPUs).
  float* params = towers->host_params();
  float* grads = towers->host_grads();
  if (chief) {
    const std::vector<float> init = models::InitialParameters(model0->variables(), o.seed);
    std::copy(init.begin(), init.end(), params);
  }
  RETURN_IF_ERROR(group.Connect(config, params, absl::Seconds(o.startup_wait_secs)));

  std::vector<data::Batch> eval_batches;
  if (chief && (o.evaluate || o.eval_every > 0)) {
    eval_batches = data::EvalBatches(dataset->test, mopt.eval_batch_size, EvalPreprocess(o.model));
  }

  // TensorBoard summaries from the chief (loss, throughput, accuracy), like the seeds' Supervisor.
  std::unique_ptr<EventWriter> events;
  if (chief && !o.logdir.empty()) {
    ASSIGN_OR_RETURN(events, EventWriter::Create(o.logdir));
  }

  // ---- the loop ----
  TrainingResult result;
  ASSIGN_OR_RETURN(PullResult pulled, group.Pull(0, 0, params));
  int64_t step = pulled.step;
  result.first_step = step;
  if (step > 0 && !o.quiet) std::printf("resuming at global step %lld\n", static_cast<long long>(step));
  const int64_t examples_per_step = static_cast<int64_t>(o.batch_size) * towers->size();
  const absl::Time start = absl::Now();
  absl::Time window_start = start;
  int64_t window_steps = 0;
  int64_t next_eval = o.eval_every > 0 ? (step / o.eval_every + 1) * o.eval_every : -1;
  std::vector<models::HostBatch> views(towers->size());
  std::vector<data::Batch> batches(towers->size());
  while (step < o.train_steps && !pulled.training_done) {
    RETURN_IF_ERROR(towers->SetParameters(params));
    for (int t = 0; t < towers->size(); ++t) {
      batches[t] = stream->Next();  // copy: the stream's buffer is reused on the next call
      views[t] = View(batches[t]);
    }
    ASSIGN_OR_RETURN(float loss, towers->ComputeGradients(views, step, grads));
    if (o.step_delay_ms > 0) absl::SleepFor(absl::Milliseconds(o.step_delay_ms));
    if (!std::isfinite(loss)) {
      return absl::InternalError(absl::StrCat("loss is ", loss, " at step ", step,
                                              ": training diverged (try a smaller --learning_rate)"));
    }
    RETURN_IF_ERROR(group.Push(step, grads).status());
    const int64_t pushed_step = step;
    ASSIGN_OR_RETURN(pulled, group.Pull(config.mode == "sync" ? pushed_step + 1 : 0, pushed_step, params));
    step = pulled.step;
    result.last_loss = loss;
    result.losses.push_back(loss);
    ++result.local_steps;
    ++window_steps;
    if (result.local_steps % o.log_every == 0) {
      const double secs = absl::ToDoubleSeconds(absl::Now() - window_start);
      if (!o.quiet) {
        std::printf("step %lld, loss = %.2f (%.1f examples/sec; %.3f sec/batch)\n", static_cast<long long>(step),
                    loss, window_steps * examples_per_step / std::max(secs, 1e-9),
                    secs / std::max<int64_t>(window_steps, 1));
        std::fflush(stdout);
      }
      if (events) {
        RETURN_IF_ERROR(events->AddScalar("loss", step, loss));
        RETURN_IF_ERROR(events->AddScalar("examples_per_sec", step,
                                          window_steps * examples_per_step / std::max(secs, 1e-9)));
        RETURN_IF_ERROR(events->Flush());
      }
      window_start = absl::Now();
      window_steps = 0;
    }
    if (chief && next_eval > 0 && step >= next_eval && step < o.train_steps) {
      RETURN_IF_ERROR(towers->SetParameters(params));
      ASSIGN_OR_RETURN(double acc, Evaluate(model0, eval_batches));
      if (!o.quiet) std::printf("step %lld: test accuracy = %.4f\n", static_cast<long long>(step), acc);
      if (events) RETURN_IF_ERROR(events->AddScalar("test_accuracy", step, acc));
      next_eval = (step / o.eval_every + 1) * o.eval_every;
    }
  }
  result.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  result.examples = result.local_steps * examples_per_step;
  result.global_step = step;

  if (chief) {
    // The newest parameters (other workers may have pushed after our last pull).
    ASSIGN_OR_RETURN(pulled, group.Pull(0, step, params));
    result.global_step = pulled.step;
    if (o.evaluate) {
      RETURN_IF_ERROR(towers->SetParameters(params));
      ASSIGN_OR_RETURN(result.test_accuracy, Evaluate(model0, eval_batches));
      if (events) RETURN_IF_ERROR(events->AddScalar("test_accuracy", result.global_step, result.test_accuracy));
      if (o.moving_average_decay > 0) {
        // The seeds evaluate with the moving averages of the variables when they keep them.
        std::vector<float> averaged(n);
        ASSIGN_OR_RETURN(PullResult unused, group.Pull(0, result.global_step, averaged.data(),
                                                       absl::Seconds(120), /*moving_averages=*/true));
        (void)unused;
        RETURN_IF_ERROR(towers->SetParameters(averaged.data()));
        ASSIGN_OR_RETURN(result.test_accuracy_averaged, Evaluate(model0, eval_batches));
        if (events) {
          RETURN_IF_ERROR(events->AddScalar("test_accuracy_moving_average", result.global_step,
                                            result.test_accuracy_averaged));
        }
      }
    }
    if (events) RETURN_IF_ERROR(events->Close());
  }
  if (!o.quiet) {
    std::printf("worker %d: %lld local steps, %lld examples in %.2f sec (%.1f examples/sec)\n", o.worker_id,
                static_cast<long long>(result.local_steps), static_cast<long long>(result.examples),
                result.seconds, result.examples / std::max(result.seconds, 1e-9));
  }
  if (chief) {
    // Taken before this worker reports done: ps 0 exits once every worker has.
    absl::StatusOr<ps::TrainingStats> stats = group.Stats(0);
    if (stats.ok()) {
      result.stats = *stats;
      if (!o.quiet && !local) std::printf("%s", FormatStats(*stats, config.mode == "async").c_str());
    }
    // Traffic per ps task: what each one received (gradients) and sent (parameters) per global step.
    if (!o.quiet && !local) {
      const double steps = std::max<int64_t>(1, result.global_step - result.first_step);
      for (int t = 0; t < group.num_tasks(); ++t) {
        absl::StatusOr<ps::TrainingStats> ts = t == 0 ? stats : group.Stats(t);
        if (!ts.ok()) continue;
        std::printf("ps task %d: %lld bytes held; received %.2f MB/step, sent %.2f MB/step\n", t,
                    static_cast<long long>(placement.task_bytes[t]), ts->bytes_received / steps / 1e6,
                    ts->bytes_sent / steps / 1e6);
      }
    }
  }
  std::move(leave_on_error).Cancel();
  RETURN_IF_ERROR(group.Done());
  if (chief) {
    if (!o.quiet && result.test_accuracy_averaged >= 0) {
      std::printf("step %lld: test accuracy with moving averages = %.4f (%lld examples)\n",
                  static_cast<long long>(result.global_step), result.test_accuracy_averaged,
                  static_cast<long long>(dataset->test.count()));
    }
    if (!o.quiet && result.test_accuracy >= 0) {
      std::printf("step %lld: test accuracy = %.4f (%lld examples)\n", static_cast<long long>(result.global_step),
                  result.test_accuracy, static_cast<long long>(dataset->test.count()));
    }
    std::fflush(stdout);
  }
  result.parameters.assign(params, params + n);
  return result;
}

}  // namespace dtrain::worker
