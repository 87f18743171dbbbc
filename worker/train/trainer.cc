#include "worker/train/trainer.h"

#include <glog/logging.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <optional>
#include <cstdio>
#include <memory>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/notification.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/denormals.h"
#include "common/event_writer.h"
#include "common/exit_codes.h"
#include "common/env.h"
#include "common/file_util.h"
#include "common/status_macros.h"
#include "ps/client/placement.h"
#include "ps/core/optimizer.h"
#include "ps/client/worker_client.h"
#include "worker/batch/batch_view.h"
#include "worker/data/batch_stream_follow.h"
#include "worker/data/batch_stream_state.h"
#include "worker/data/metrics.h"
#include "worker/eval/evaluation.h"
#include "worker/models/graph.h"
#include "worker/models/model.h"
#include "worker/models/onnx/onnx_export.h"
#include "worker/models/registry.h"
#include "worker/train/summaries.h"
#include "worker/batch/table_spec.h"
#include "worker/towers/towers.h"
#include "worker/train/make_training_steps.h"
#include "worker/train/profile_recorder.h"
#include "worker/train/ps_connection.h"

namespace dtrain::worker {
namespace {

constexpr int kMaxReconnects = 1000;  // a ps that restarts for ever stops the worker eventually

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

// Models with tables: the rows held over every task and table, and the bytes the tasks received and sent per
// global step of this run, on one line (scripts/compare_cluster_sizes.py reads it).
void PrintSparseTotals(ps::WorkerClient* client, const TrainingResult& result) {
  int64_t rows = 0, bytes = 0, table_bytes = 0, created = 0, expired = 0, not_admitted = 0;
  for (int t = 0; t < client->num_tasks(); ++t) {
    absl::StatusOr<ps::TrainingStats> s = client->Stats(t);
    if (!s.ok()) return;
    for (const ps::SparseTableStats& table : s->tables) {
      rows += table.rows;
      table_bytes += table.bytes;
      created += table.created;
      expired += table.expired;
      not_admitted += table.not_admitted;
    }
    bytes += s->bytes_received + s->bytes_sent;
  }
  const int64_t steps = std::max<int64_t>(1, result.global_step - result.first_step);
  std::printf("sparse tables: %lld rows held on %d ps task%s; %lld bytes/step received + sent by the ps tasks "
              "(%lld steps); %lld bytes of tables; %lld rows created, %lld expired, %lld lookups not admitted\n",
              static_cast<long long>(rows), client->num_tasks(), client->num_tasks() > 1 ? "s" : "",
              static_cast<long long>(bytes / steps), static_cast<long long>(steps), static_cast<long long>(table_bytes),
              static_cast<long long>(created), static_cast<long long>(expired), static_cast<long long>(not_admitted));
}

// What the data set gives a run: the model's input geometry, this worker's training stream and (chief) the
// test batches. Filled in place: the stream refers to the data set it reads.
struct TrainingData {
  data::DatasetPair loaded;  // when read from data_dir
  const data::DatasetPair* dataset = nullptr;
  models::ModelDefaults defaults;  // input pipeline, default schedule
  models::ModelOptions model_options;
  std::unique_ptr<data::BatchStream> stream;
  std::unique_ptr<data::EvalBatchSet> eval_set;  // chief: the test set's batches
  data::SetAsideCounts set_aside;                // --follow: the files the stream set aside
};

// ---- data ----
absl::Status SetUpData(WorkerOptions* o, bool local, bool chief, TrainingData* d) {
  d->dataset = o->dataset;
  data::BatchStreamOptions sopt;
  sopt.batch_size = o->batch_size;
  // An elastic job's workers read one order of the whole set, the batches ps 0 gives them (SeekBatch below).
  const bool elastic = !local && !o->elastic_batch.empty();
  sopt.shard_index = local || elastic ? 0 : o->worker_id;
  sopt.num_shards = local || elastic ? 1 : o->num_workers;
  sopt.seed = o->seed;
  sopt.shuffle = o->shuffle;
  if (o->follow) {
    // Online: the stream follows the directory; its first file gives the features (no test set).
    data::FollowOptions fo;
    fo.dir = o->data_dir;
    fo.format = o->data_format;
    fo.poll = absl::Seconds(o->follow_poll_secs);
    fo.idle_timeout = o->follow_idle_secs > 0 ? absl::Seconds(o->follow_idle_secs) : absl::InfiniteDuration();
    fo.stop = o->input_stop;
    fo.bad_files = o->bad_records;
    fo.set_aside = &d->set_aside;
    ASSIGN_OR_RETURN(d->stream, data::FollowFiles(fo, sopt, &d->loaded.train));
    d->loaded.test = d->loaded.train;  // no examples: the shape only
    d->loaded.format = "follow";
    d->dataset = &d->loaded;
  } else if (d->dataset == nullptr) {
    ASSIGN_OR_RETURN(d->loaded, data::LoadDataset(o->data_dir, o->data_format, o->data_options));
    d->dataset = &d->loaded;
  }
  const data::Dataset& train = d->dataset->train;
  d->defaults = o->resolved_model->defaults;
  const bool ctr = train.kind() == data::DataKind::kCtr;
  if (ctr != d->defaults.ctr_data) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--model=", o->model, " trains on ", d->defaults.ctr_data ? "click-through-rate data" : "images",
        " but ", o->dataset != nullptr ? std::string("the data set") : o->data_dir, " holds ",
        ctr ? "click-through-rate data (dense and categorical features)" : "images",
        d->defaults.ctr_data ? " (give --data_dir a Criteo-format directory, e.g. one dtrain_convert "
                               "--synthetic_ctr wrote)"
                             : ""));
  }
  models::ModelOptions& mopt = d->model_options;
  mopt.batch_size = o->batch_size;
  // Evaluation batches of up to 500 examples, fewer for large examples (an eval batch's input at most 4 M
  // floats: 26 images of 224 x 224 x 3), never fewer than the training batch.
  const int64_t example_floats = std::max<int64_t>(1, train.kind() == data::DataKind::kCtr
                                                          ? train.num_dense + train.num_sparse
                                                          : train.image_size());
  mopt.eval_batch_size = std::max<int>(o->batch_size, static_cast<int>(std::min<int64_t>(500, (4 << 20) / example_floats)));
  mopt.seed = o->seed;
  if (ctr) {
    mopt.height = mopt.width = 1;  // the dense features, as a 1x1 image of num_dense channels
    mopt.channels = train.num_dense;
    mopt.num_sparse = train.num_sparse;
  } else {
    models::SetInputGeometry(d->defaults, train.height, train.width, train.channels, &mopt);
    if (train.source != nullptr && (mopt.height != train.height || mopt.width != train.width)) {
      // Examples read by a source (image folders) come out at their final size; the model's own crops do not apply.
      return absl::InvalidArgumentError(absl::StrCat("--model=", o->model, " takes ", mopt.height, "x", mopt.width,
                                                     " crops but the data set's examples are ", train.height, "x",
                                                     train.width, " (an image folder: --image_size=", mopt.height, ")"));
    }
  }
  mopt.num_classes = train.num_classes;

  sopt.preprocess = d->defaults.train_preprocess;
  if (!ctr) RETURN_IF_ERROR(data::CheckNormalization(o->input_normalization, train.channels));
  sopt.normalize = o->input_normalization;
  sopt.crop_h = mopt.height;  // the model's input size (the CIFAR modes crop to it)
  sopt.crop_w = mopt.width;
  sopt.threads = o->input_threads;
  sopt.augment = o->augment;
  sopt.bad_examples = o->bad_images;
  if (!o->follow) {
    ASSIGN_OR_RETURN(d->stream, data::BatchStream::Create(train, sopt));
  }
  if (o->decay_steps == 0 && d->defaults.decay_epochs > 0 && !o->follow &&
      (o->lr_schedule == "exponential" || o->lr_schedule == "step")) {  // the model's default schedule
    o->decay_steps = models::DefaultDecaySteps(d->defaults, train.count(), o->batch_size);
    o->decay_rate = d->defaults.decay_rate;
    o->staircase = d->defaults.staircase;
  }
  if (chief && (o->evaluate || o->eval_every > 0) && !o->follow) {
    data::EvalBatchOptions eo;
    eo.batch_size = mopt.eval_batch_size;
    eo.preprocess = d->defaults.eval_preprocess;
    eo.crop_h = mopt.height;
    eo.crop_w = mopt.width;
    eo.normalize = o->input_normalization;
    eo.threads = o->input_threads;
    eo.bad_examples = o->bad_images;
    ASSIGN_OR_RETURN(d->eval_set, data::EvalBatchSet::Create(d->dataset->test, eo));
  }
  return absl::OkStatus();
}

// ---- towers ----
// Local mode with device-owned towers (GPUs) keeps the training state on the devices.
bool DeviceResident(const WorkerOptions& o, const std::vector<kernels::DeviceSpec>& specs, bool local) {
  const bool gpu = !specs.empty() && specs[0].kind == kernels::DeviceSpec::Kind::kGpu;
  return local && o.device_resident && (gpu || !o.cpu_towers_in_place);
}

// Test accuracy of tower 0 with the current parameters (or their moving averages).
// The test metrics of `e` as TensorBoard scalars at `step`.
absl::Status AddEvaluationScalars(EventWriter* events, int64_t step, const Evaluation& e) {
  RETURN_IF_ERROR(events->AddScalar("test_accuracy", step, e.accuracy));
  if (e.binary) {
    RETURN_IF_ERROR(events->AddScalar("test_auc", step, e.auc));
    RETURN_IF_ERROR(events->AddScalar("test_log_loss", step, e.log_loss));
  }
  return absl::OkStatus();
}

absl::StatusOr<Evaluation> EvaluateNow(TrainingSteps* steps, models::Model* model0, const TrainingData& d,
                                       bool moving_averages) {
  RETURN_IF_ERROR(steps->LoadParameters(moving_averages));
  // Tower 0 on the whole test set; the rows of a sparse model's ids are pulled batch by batch.
  return EvaluateBatches(model0, *d.eval_set,
                         [steps](const models::HostBatch& b) { return steps->LoadSparseRows(b); });
}

// Appends the losses known so far to the result.
absl::Status CollectLosses(TrainingSteps* steps, TrainingResult* result) {
  ASSIGN_OR_RETURN(std::vector<float> losses, steps->TakeLosses());
  result->losses.insert(result->losses.end(), losses.begin(), losses.end());
  if (!result->losses.empty()) result->last_loss = result->losses.back();
  return absl::OkStatus();
}

// The newest examples the chief of an online run scored before training on them (progressive validation): a
// ring of (logit, label) pairs.
class ScoreWindow {
 public:
  explicit ScoreWindow(int64_t capacity) : capacity_(static_cast<size_t>(std::max<int64_t>(capacity, 0))) {}
  void Add(const float* logits, const std::vector<float>& labels) {
    for (size_t i = 0; i < labels.size() && capacity_ > 0; ++i) {
      if (logits_.size() < capacity_) {
        logits_.push_back(logits[i]);
        labels_.push_back(labels[i]);
      } else {
        logits_[next_] = logits[i];
        labels_[next_] = labels[i];
        next_ = (next_ + 1) % capacity_;
      }
    }
  }
  int64_t size() const { return static_cast<int64_t>(logits_.size()); }
  double LogLoss() const { return data::MeanLogLoss(logits_, labels_); }
  double Auc() const { return data::RocAuc(logits_, labels_); }

 private:
  size_t capacity_;
  size_t next_ = 0;
  std::vector<float> logits_, labels_;
};

// ---- the loop ----
// Steps until the global step reaches train_steps: a progress line every log_every local steps, the chief's
// test accuracy every eval_every global steps, summaries every summary_every local steps. A ps task that
// restarted (or rolled back, or declared this worker lost) answers Aborted: the worker connects again (the chief
// restores every task to a common checkpoint) and goes on from a fresh pull.
// An elastic job: makes batch `index` of the stream the next one Next() returns (a jump drops the batches
// prepared ahead).
absl::Status SeekBatch(data::BatchStream* stream, int64_t index) {
  if (stream->batches_read() == index) return absl::OkStatus();
  ASSIGN_OR_RETURN(data::BatchStreamState s, data::DecodeBatchStreamState(stream->SaveState()));
  const int64_t first = index * s.batch_size;
  s.next_batch = index;
  s.epoch = s.shard_size > 0 ? first / s.shard_size : 0;
  s.offset = s.shard_size > 0 ? first % s.shard_size : 0;
  return stream->Restore(data::EncodeBatchStreamState(s));
}

// One step's input: a batch per tower and where the stream is after them (for the checkpoints).
struct StepInput {
  std::vector<data::Batch> batches;
  std::vector<models::HostBatch> views;  // into batches (whose buffers move with them on a swap)
  std::string position;
  // An elastic job with a global batch: the rounds of the towers this worker's part of the step takes (batches
  // holds rounds x towers), and the factor its summed gradient is pushed with.
  int rounds = 1;
  float scale = 1.0f;
  int64_t first = 0;  // the stream batch they start at
};

// An elastic job with a global batch: this worker's part of a step as ps 0's `view` plans it. The step's batch
// (view.first_batch of the order, `global_batch` examples) is `global_batch / unit` parts of `unit` examples
// (one round of the towers each); the plan's workers, in order, take runs of consecutive parts as even as can
// be. A worker outside the plan reads on where it is for one round (its commit is dropped). The factor: the
// workers' gradients are summed over their rounds, and ps 0 averages them over the plan's workers, so each is
// scaled by workers / parts to make the step's gradient the mean over the whole batch.
struct GlobalPart {
  int64_t first_unit = -1;  // of the order, in units (-1: outside the plan)
  int rounds = 1;
  float scale = 1.0f;
};
GlobalPart GlobalPartOf(const ps::ElasticView& view, int worker, int64_t global_batch, int unit) {
  GlobalPart part;
  const auto me = std::find(view.workers.begin(), view.workers.end(), worker);
  if (me == view.workers.end() || unit <= 0) return part;
  const int64_t parts = global_batch / unit;
  const int64_t n = static_cast<int64_t>(view.workers.size());
  const int64_t rank = me - view.workers.begin();
  const int64_t first = rank * parts / n, end = (rank + 1) * parts / n;
  part.first_unit = view.first_batch * parts + first;
  part.rounds = static_cast<int>(end - first);
  part.scale = static_cast<float>(static_cast<double>(n) / static_cast<double>(parts));
  return part;
}

absl::Status TrainLoop(const WorkerOptions& o, bool chief, TrainingData* d, Towers* towers, Connection* c,
                       TrainingSteps* steps, EventWriter* events, TrainingSummaries* summaries, ScoreWindow* window,
                       TrainingResult* result) {
  int reconnects = 0;
  // Models with sparse tables read one step ahead: the pull that brings a step's parameters also brings the rows
  // of that step's ids (TrainingSteps::SetUpcomingBatches).
  const bool sparse = !towers->tower(0)->graph().tables.empty();
  StepInput current, upcoming;
  bool have_current = false;
  // The time the loop waits for input (a stream that keeps ahead of the towers returns at once).
  double window_input_wait = 0;
  // One step's batches; false when the input ended (an online run: no new file, or stopped). An elastic job's
  // `view` (ps 0's header of the step) says which batch of the one order: the one of this worker's place in the
  // step's workers (sync), or the one handed to it (async). A worker outside the plan (it is behind) reads on
  // where it is: ps 0 drops its commit, so nothing of that batch is trained on twice.
  const bool elastic = !c->config.elastic_batch.empty();
  const bool global = c->config.elastic_batch == "global";
  // Where an elastic step's view places this worker's batches: the stream batch of its first (-1: read on where
  // the stream is), the rounds of the towers, the gradient's factor.
  struct Place {
    int64_t first = -1;
    int rounds = 1;
    float scale = 1.0f;
  };
  auto place_of = [&](const ps::ElasticView& view) {
    Place p;
    if (view.unit <= 0) return p;
    if (global) {
      const GlobalPart part = GlobalPartOf(view, o.worker_id, c->config.global_batch, c->config.batch_unit);
      if (part.first_unit >= 0) p.first = part.first_unit * towers->size();
      p.rounds = part.rounds;
      p.scale = part.scale;
      return p;
    }
    int64_t unit_index = -1;
    if (o.mode != "sync") {
      if (!view.batches.empty()) unit_index = view.batches[0];
    } else {
      const auto me = std::find(view.workers.begin(), view.workers.end(), o.worker_id);
      const size_t rank = static_cast<size_t>(me - view.workers.begin());
      if (rank < view.batches.size()) unit_index = view.batches[rank];
    }
    if (unit_index >= 0) p.first = unit_index * towers->size();
    return p;
  };
  // Models with sparse tables read a step ahead, before ps 0's header names the step's batches: the next step's
  // view as it will be when the workers stay (the next batch of the order; per_worker, the batches after the
  // plan's). When it is not (RedrawCurrent below), the step's batches are drawn again.
  auto predicted = [&](const ps::ElasticView& view) {
    ps::ElasticView next = view;
    if (global) {
      ++next.first_batch;
    } else {
      for (int64_t& b : next.batches) b += static_cast<int64_t>(next.batches.size());
    }
    return next;
  };
  auto draw = [&](StepInput* in, const ps::ElasticView* view = nullptr) -> absl::StatusOr<bool> {
    const Place p = view != nullptr ? place_of(*view) : Place{};
    if (p.first >= 0) RETURN_IF_ERROR(SeekBatch(d->stream.get(), p.first));
    in->first = d->stream->batches_read();
    in->rounds = p.rounds;
    in->scale = p.scale;
    const int count = in->rounds * towers->size();
    in->batches.resize(count);
    in->views.resize(count);
    for (int t = 0; t < count; ++t) {
      const absl::Time asked = absl::Now();
      const int64_t asked_ns = o.trace != nullptr ? TraceRecorder::NowNs() : 0;
      const data::Batch& next = d->stream->Next();  // blocks only while the batch is not ready
      const double waited = absl::ToDoubleSeconds(absl::Now() - asked);
      if (o.trace != nullptr) {
        o.trace->Complete("input wait", "input", asked_ns, TraceRecorder::NowNs(), o.trace->step());
      }
      result->input_wait_seconds += waited;
      window_input_wait += waited;
      if (o.profile != nullptr) o.profile->AddInputWait(waited);
      if (o.metrics != nullptr) o.metrics->Observe(StepMetrics::Part::kInputWait, waited);
      in->batches[t] = next;  // copy: the stream's buffer is reused on the next call
      if (in->batches[t].batch == 0) {
        RETURN_IF_ERROR(d->stream->status());  // a file that could not be read
        if (!o.follow) return absl::InternalError("the input stream returned an empty batch");
        return false;
      }
      in->views[t] = View(in->batches[t]);
    }
    in->position = d->stream->SaveState();
    return true;
  };
  auto start_pulling = [&]() -> absl::StatusOr<ps::PullResult> {
    if (sparse) {
      ASSIGN_OR_RETURN(const bool got, draw(&current));
      if (!got) return absl::FailedPreconditionError("the input ended before its first batch");
      have_current = true;
      RETURN_IF_ERROR(steps->SetUpcomingBatches(current.views));
    }
    return steps->Start();
  };
  // A worker may connect again just before the chief rolls the tasks back (voiding the sessions it just got):
  // then the first pull is Aborted too, and it connects once more.
  auto recover = [&](absl::Status failure) -> absl::StatusOr<ps::PullResult> {
    while (true) {
      if (failure.code() != absl::StatusCode::kAborted || ++reconnects > kMaxReconnects) return failure;
      absl::Status again = absl::OkStatus();
      if (std::optional<ps::PsSet> set = ps::ParsePsSetChanged(failure); set.has_value()) {
        // This worker missed a change of the ps tasks (ps 0 refused its registration for the old set).
        again = MoveToPsSet(o, c, d->stream.get(), *set);
      } else {
        again = ConnectAgain(o, c, d->stream.get(), failure);
      }
      if (!again.ok() && ps::ParsePsSetChanged(again).has_value()) {
        failure = again;
        continue;
      }
      RETURN_IF_ERROR(again);
      absl::StatusOr<ps::PullResult> started = start_pulling();  // from the input position the restore gave back
      if (started.ok()) return started;
      failure = started.status();
    }
  };
  auto settle = [&]() -> absl::StatusOr<ps::PullResult> {
    absl::StatusOr<ps::PullResult> r = steps->Settle();
    return r.ok() ? r : recover(r.status());
  };
  absl::StatusOr<ps::PullResult> started = start_pulling();
  if (!started.ok()) started = recover(started.status());
  if (!started.ok()) return started.status();
  ps::PullResult at = *started;
  result->first_step = at.step;
  ps::ElasticView seen;     // the chief logs each change of an elastic job's membership
  bool step_again = false;  // the pull answered the step just computed (a global step planned again)
  auto log_membership = [&]() {
    if (!elastic || !chief || o.quiet || at.elastic.unit == 0 || at.elastic.version == seen.version) return;
    if (seen.unit != 0) {
      const bool sync = o.mode == "sync";
      const int64_t unit = at.elastic.unit;
      const int64_t batch = c->config.global_batch > 0 ? c->config.global_batch
                            : sync ? unit * static_cast<int64_t>(at.elastic.workers.size())
                                   : unit;
      const std::string line = ps::DescribeMembershipChange(at.step, seen.workers, at.elastic.workers, sync,
                                                            at.elastic.aggregating, batch, step_again);
      std::printf("%s\n", line.c_str());
      std::fflush(stdout);
    }
    seen = at.elastic;
  };
  log_membership();
  if (at.step > 0 && !o.quiet) {
    // A restored checkpoint gives this worker the input position it had at that step; a worker that simply
    // starts after the others joins the run where it is.
    if (!c->client->restored_input_position().empty()) {
      std::printf("resuming at global step %lld\n", static_cast<long long>(at.step));
    } else {
      std::printf("joining the run at global step %lld\n", static_cast<long long>(at.step));
    }
  }
  // The learning-rate schedule the ps tasks apply (the config this worker registered), for the progress lines and
  // the metrics file.
  ASSIGN_OR_RETURN(const ps::Optimizer schedule, ps::Optimizer::Create(c->config.optimizer));
  const int64_t examples_per_step = static_cast<int64_t>(o.batch_size) * towers->size();
  const absl::Time start = absl::Now();
  if (result->training_started == absl::InfinitePast()) result->training_started = start;
  absl::Time window_start = start;
  int64_t window_steps = 0, window_examples = 0;
  int64_t next_eval = o.eval_every > 0 ? (at.step / o.eval_every + 1) * o.eval_every : -1;
  const auto before_end = [&o](int64_t step) { return o.train_steps == 0 || step < o.train_steps; };
  // Progressive validation: the chief of an online run scores its batch before it trains on it.
  const bool scoring = chief && o.follow && o.eval_window > 0 && towers->tower(0)->graph().output_shape().size() == 1;
  std::vector<float> logits;
  while (before_end(at.step) && !at.training_done) {
    if (o.stop != nullptr && o.stop->cancelled()) {  // SIGTERM: the step before is done, this one not begun
      result->stopped = true;
      break;
    }
    if (o.input_stop && o.input_stop()) {
      result->input_ended = true;
      break;
    }
    // The timeline's step: this iteration, from its input to the answer of the pull its push started.
    const int64_t traced_step = at.step, step_begin_ns = o.trace != nullptr ? TraceRecorder::NowNs() : 0;
    if (o.trace != nullptr) o.trace->SetStep(traced_step);
    if (!have_current) {
      ASSIGN_OR_RETURN(const bool got, draw(&current, elastic ? &at.elastic : nullptr));
      if (!got) {
        result->input_ended = true;
        break;
      }
    }
    if (sparse && elastic && at.elastic.unit > 0) {
      // The batches read a step ahead are not the ones the step's view gives this worker (the workers changed):
      // drawn again, with their rows pulled again.
      const Place want = place_of(at.elastic);
      if (want.first >= 0 && (want.first != current.first || want.rounds != current.rounds)) {
        ASSIGN_OR_RETURN(const bool got, draw(&current, &at.elastic));
        if (!got) {
          result->input_ended = true;
          break;
        }
        absl::StatusOr<ps::PullResult> redrawn = steps->RedrawCurrent(current.views);
        if (!redrawn.ok()) {
          ASSIGN_OR_RETURN(at, recover(redrawn.status()));
          continue;
        }
        at = *redrawn;
        continue;  // the pull's view is checked again
      }
      current.scale = want.scale;
    }
    absl::Status stepped = absl::OkStatus();
    if (sparse) {
      const ps::ElasticView next_view = elastic ? predicted(at.elastic) : ps::ElasticView{};
      ASSIGN_OR_RETURN(const bool got, draw(&upcoming, elastic ? &next_view : nullptr));
      if (!got) {
        result->input_ended = true;
        break;
      }
      stepped = steps->SetUpcomingBatches(upcoming.views);
    }
    if (stepped.ok() && scoring) {
      logits.resize(current.views[0].batch);
      stepped = steps->ScoreBatch(current.views[0], logits.data());
      if (stepped.ok()) window->Add(logits.data(), current.batches[0].labels);
    }
    // Where the input is after this step's batches, for the checkpoints (a few dozen bytes).
    if (c->device_resident) {
      RETURN_IF_ERROR(c->local_ps->RecordInputPosition(0, at.step, current.position));
    } else {
      c->client->SetInputPosition(current.position);
    }
    if (o.step_delay_ms > 0) absl::SleepFor(absl::Milliseconds(o.step_delay_ms));
    if (stepped.ok()) {
      stepped = global ? steps->StepRounds(current.views, at.step, current.scale) : steps->Step(current.views, at.step);
      // The step's loss is kept (TakeLosses): the rate its update is applied with goes beside it.
      if (stepped.ok()) result->learning_rates.push_back(schedule.LearningRate(at.step));
    }
    const int64_t step_examples = static_cast<int64_t>(current.rounds) * examples_per_step;
    if (sparse) {
      std::swap(current, upcoming);  // the next step's batches, whose rows the pull now in flight brings
    } else {
      have_current = false;
    }
    absl::StatusOr<ps::PullResult> next = stepped.ok() ? steps->NextStep() : stepped;
    if (o.trace != nullptr && next.ok()) {
      o.trace->Complete(absl::StrCat("step ", traced_step), "step", step_begin_ns, TraceRecorder::NowNs(), traced_step);
    }
    if (!next.ok()) {
      ASSIGN_OR_RETURN(at, recover(next.status()));
      continue;
    }
    step_again = next->step == at.step;
    at = *next;
    if (at.ps_set.version > c->ps_version && at.ps_set.hosts == c->ps_hosts) {
      c->ps_version = at.ps_set.version;  // started with the set as it is now
      c->config.ps_version = at.ps_set.version;
    } else if (at.ps_set.version > c->ps_version && at.ps_set.step <= at.step) {
      // ps 0 moves the job onto another set of ps tasks at this step: every task saved it; move, then pull it.
      if (sparse) have_current = false;  // the batches drawn for the pull in flight are drawn again
      absl::Status moved = MoveToPsSet(o, c, d->stream.get(), at.ps_set);
      absl::StatusOr<ps::PullResult> again = moved.ok() ? start_pulling() : moved;
      ASSIGN_OR_RETURN(at, again.ok() ? again : recover(again.status()));
    }
    log_membership();
    ++result->local_steps;
    ++window_steps;
    window_examples += step_examples;
    result->examples += step_examples;
    const bool logging = result->local_steps % o.log_every == 0;
    if (logging) {
      RETURN_IF_ERROR(
          CollectLosses(steps, result));  // device-resident steps: the one read-back of the window
      const double secs = absl::ToDoubleSeconds(absl::Now() - window_start);
      const double rate = static_cast<double>(window_examples) / std::max(secs, 1e-9);
      const float loss = result->last_loss;
      if (!o.quiet) {
        // The learning rate at the line's step, as TensorBoard's learning_rate scalar has it (the schedule's value).
        std::printf("step %lld, loss = %.2f (%.1f examples/sec; %.3f sec/batch; input wait %.3f sec/batch; "
                    "learning rate %.4g)\n",
                    static_cast<long long>(at.step), loss, rate, secs / std::max<int64_t>(window_steps, 1),
                    window_input_wait / std::max<int64_t>(window_steps, 1), schedule.LearningRate(at.step));
        std::fflush(stdout);
      }
      if (events) {
        RETURN_IF_ERROR(events->AddScalar("loss", at.step, loss));
        RETURN_IF_ERROR(events->AddScalar("examples_per_sec", at.step, rate));
        RETURN_IF_ERROR(events->Flush());
      }
      window_start = absl::Now();
      window_steps = 0;
      window_examples = 0;
      window_input_wait = 0;
    }
    if (summaries && result->local_steps % o.summary_every == 0) {
      ASSIGN_OR_RETURN(at, settle());  // the histograms read every parameter and gradient
      ASSIGN_OR_RETURN(std::vector<float> params, steps->Parameters());
      // Device-resident steps keep the gradients on the devices: no gradient histograms then.
      RETURN_IF_ERROR(summaries->Write(at.step, params.data(), c->device_resident ? nullptr : towers->host_grads()));
    }
    // Online, the chief's progressive validation: every eval_every global steps, or with each progress line when
    // eval_every is 0 (a stream has no end to wait for).
    const bool window_due = next_eval > 0 ? at.step >= next_eval : o.eval_every == 0 && logging;
    if (chief && o.follow && window_due && before_end(at.step)) {
      if (window->size() > 0) {
        const double log_loss = window->LogLoss(), auc = window->Auc();
        if (!o.quiet) {
          std::printf("step %lld: newest %lld examples (scored before training on them): log loss = %.4f, AUC = %.4f\n",
                      static_cast<long long>(at.step), static_cast<long long>(window->size()), log_loss, auc);
          std::fflush(stdout);
        }
        if (events) {
          RETURN_IF_ERROR(events->AddScalar("window_log_loss", at.step, log_loss));
          RETURN_IF_ERROR(events->AddScalar("window_auc", at.step, auc));
          RETURN_IF_ERROR(events->Flush());
        }
      }
      if (next_eval > 0) next_eval = (at.step / o.eval_every + 1) * o.eval_every;
    } else if (chief && !o.follow && next_eval > 0 && at.step >= next_eval && before_end(at.step)) {
      ASSIGN_OR_RETURN(at, settle());
      ASSIGN_OR_RETURN(Evaluation e, EvaluateNow(steps, towers->tower(0), *d, /*moving_averages=*/false));
      const double secs = absl::ToDoubleSeconds(absl::Now() - start);
      if (!o.quiet) {
        if (e.binary) {
          std::printf("step %lld: test log loss = %.4f, AUC = %.4f at %.2f sec\n", static_cast<long long>(at.step),
                      e.log_loss, e.auc, secs);
        } else {
          std::printf("step %lld: test accuracy = %.4f at %.2f sec\n", static_cast<long long>(at.step), e.accuracy,
                      secs);
        }
      }
      if (events) RETURN_IF_ERROR(AddEvaluationScalars(events, at.step, e));
      next_eval = (at.step / o.eval_every + 1) * o.eval_every;
    }
  }
  RETURN_IF_ERROR(CollectLosses(steps, result));
  // The last step's pull has shown the end of training: every step this worker took part in was decided (sync) or
  // handled (async; a pull waits for its push). If a ps task died after deciding it, before the answer to this
  // worker's push went out, that push is now retried against a new process that has no session for it: connecting
  // again would only wait for a chief that has finished. The push's answer does not matter any more.
  absl::StatusOr<ps::PullResult> settled = steps->Settle();
  const bool ended = at.step >= o.train_steps || at.training_done;
  if (!settled.ok() && ended &&
      (absl::IsAborted(settled.status()) || absl::IsUnavailable(settled.status()) ||
       absl::IsDeadlineExceeded(settled.status()))) {
    LOG(WARNING) << "worker " << o.worker_id << ": training reached step " << at.step
                 << "; the answer to its last push was lost (" << settled.status().message()
                 << "), which changes nothing: every step it took part in was decided";
  } else {
    ASSIGN_OR_RETURN(at, settled.ok() ? settled : recover(settled.status()));
  }
  result->seconds = absl::ToDoubleSeconds(absl::Now() - start);
  // result->examples: counted as the steps ran (an elastic global step's rounds).
  result->global_step = at.step;
  return absl::OkStatus();
}

// ---- the end ----
// The final parameters, the chief's evaluation (with the moving averages too when kept), this worker's rate
// and, on the chief in a cluster, the ps statistics and traffic. Before the worker reports done.
absl::Status FinishTraining(const WorkerOptions& o, bool chief, bool local, const TrainingData& d,
                            Towers* towers, Connection* c, TrainingSteps* steps, EventWriter* events,
                            TrainingResult* result) {
  RETURN_IF_ERROR(steps->Finish());
  if (o.profile != nullptr) o.profile->MarkTrainEnd();
  if (chief) {
    // The newest parameters (other workers may have pushed after our last pull).
    ASSIGN_OR_RETURN(ps::PullResult at, steps->PullNewest());
    result->global_step = at.step;
  }
  ASSIGN_OR_RETURN(result->parameters, steps->Parameters());
  if (chief && !o.export_onnx.empty()) {
    ASSIGN_OR_RETURN(result->table_rows, steps->PullTables());
  }
  if (chief) {
    if (o.evaluate && !o.follow) {
      const absl::Time evaluating = absl::Now();
      auto evaluated = absl::MakeCleanup(
          [&] { result->evaluate_seconds += absl::ToDoubleSeconds(absl::Now() - evaluating); });
      if (o.profile != nullptr) o.profile->MarkEvaluation(/*begin=*/true);
      ASSIGN_OR_RETURN(Evaluation e, EvaluateNow(steps, towers->tower(0), d, /*moving_averages=*/false));
      if (o.profile != nullptr) o.profile->MarkEvaluation(/*begin=*/false);
      result->test_accuracy = e.accuracy;
      result->test_log_loss = e.log_loss;
      result->test_auc = e.auc;
      result->test_binary = e.binary;
      if (events) RETURN_IF_ERROR(AddEvaluationScalars(events, result->global_step, e));
      if (o.moving_average_decay > 0) {
        // The seeds evaluate with the moving averages of the variables when they keep them.
        ASSIGN_OR_RETURN(Evaluation averaged, EvaluateNow(steps, towers->tower(0), d, /*moving_averages=*/true));
        result->test_accuracy_averaged = averaged.accuracy;
        if (events) {
          RETURN_IF_ERROR(events->AddScalar("test_accuracy_moving_average", result->global_step,
                                            result->test_accuracy_averaged));
        }
      }
    }
    if (events) RETURN_IF_ERROR(events->Close());
  }
  const TrainingSteps::SparseTraffic traffic = steps->sparse_traffic();
  if (traffic.steps > 0) {
    result->sparse_bytes_per_step =
        static_cast<double>(traffic.bytes_pulled + traffic.bytes_pushed) / static_cast<double>(traffic.steps);
    const int64_t served = traffic.ids_pulled + traffic.ids_from_cache;
    result->row_cache_hit_rate = served > 0 ? static_cast<double>(traffic.ids_from_cache) / served : 0;
    if (!o.quiet) {
      std::printf("worker %d: sparse rows: %.0f bytes/step pulled + pushed (%.0f ids pulled, %.0f pushed a step; %.1f%% "
                  "of the ids served by the row cache)\n",
                  o.worker_id, result->sparse_bytes_per_step,
                  static_cast<double>(traffic.ids_pulled) / static_cast<double>(traffic.steps),
                  static_cast<double>(traffic.ids_pushed) / static_cast<double>(traffic.steps),
                  100.0 * result->row_cache_hit_rate);
    }
  }
  if (!o.quiet) {
    std::printf("worker %d: %lld local steps, %lld examples in %.2f sec (%.1f examples/sec)\n", o.worker_id,
                static_cast<long long>(result->local_steps), static_cast<long long>(result->examples),
                result->seconds, result->examples / std::max(result->seconds, 1e-9));
    std::printf("worker %d: waited %.2f sec for input (%.1f%% of the training loop)\n", o.worker_id,
                result->input_wait_seconds, 100.0 * result->input_wait_seconds / std::max(result->seconds, 1e-9));
  }
  result->input_files_set_aside = d.set_aside.files.load();
  result->input_lines_set_aside = d.set_aside.lines.load();
  if (!o.quiet && result->input_files_set_aside > 0) {
    std::printf("worker %d: %lld input file(s) set aside as bad (%lld lines of plain text; --bad_records=skip): "
                "the WARNING lines 'set aside' name them and why\n",
                o.worker_id, static_cast<long long>(result->input_files_set_aside),
                static_cast<long long>(result->input_lines_set_aside));
  }
  if (chief) {
    // Taken before this worker reports done: ps 0 exits once every worker has.
    absl::StatusOr<ps::TrainingStats> stats = c->client->Stats(0);
    if (stats.ok()) {
      result->stats = *stats;
      if (!o.quiet && !local) std::printf("%s", FormatStats(*stats, c->config.mode == "async").c_str());
    }
    // Traffic per ps task: what each one received (gradients) and sent (parameters) per global step.
    if (!o.quiet && !local) {
      const double steps_run = std::max<int64_t>(1, result->global_step - result->first_step);
      for (int t = 0; t < c->client->num_tasks(); ++t) {
        absl::StatusOr<ps::TrainingStats> ts = t == 0 ? stats : c->client->Stats(t);
        if (!ts.ok()) continue;
        std::printf("ps task %d: %lld bytes held; received %.2f MB/step, sent %.2f MB/step\n", t,
                    static_cast<long long>(c->placement.task_bytes[t]), ts->bytes_received / steps_run / 1e6,
                    ts->bytes_sent / steps_run / 1e6);
        for (const ps::SparseTableStats& s : ts->tables) {
          std::printf("  table %s: %lld rows (%lld created, %lld evicted, %lld expired), %lld lookups, %lld not "
                      "admitted\n",
                      s.name.c_str(), static_cast<long long>(s.rows), static_cast<long long>(s.created),
                      static_cast<long long>(s.evicted), static_cast<long long>(s.expired),
                      static_cast<long long>(s.lookups), static_cast<long long>(s.not_admitted));
        }
      }
    }
    if (!o.quiet && !c->config.tables.empty()) PrintSparseTotals(c->client.get(), *result);
  }
  return absl::OkStatus();
}

// The chief's last lines, after the worker reported done.
void PrintAccuracy(const WorkerOptions& o, const TrainingData& d, const TrainingResult& result) {
  if (o.quiet) return;
  if (result.test_accuracy_averaged >= 0) {
    std::printf("step %lld: test accuracy with moving averages = %.4f (%lld examples)\n",
                static_cast<long long>(result.global_step), result.test_accuracy_averaged,
                static_cast<long long>(d.dataset->test.count()));
  }
  if (result.window_examples > 0) {
    std::printf("step %lld: newest %lld examples (scored before training on them): log loss = %.4f, AUC = %.4f\n",
                static_cast<long long>(result.global_step), static_cast<long long>(result.window_examples),
                result.window_log_loss, result.window_auc);
  }
  if (result.test_binary) {
    std::printf("step %lld: test log loss = %.4f, AUC = %.4f, accuracy = %.4f (%lld examples)\n",
                static_cast<long long>(result.global_step), result.test_log_loss, result.test_auc,
                result.test_accuracy, static_cast<long long>(d.dataset->test.count()));
  } else if (result.test_accuracy >= 0) {
    std::printf("step %lld: test accuracy = %.4f (%lld examples)\n",
                static_cast<long long>(result.global_step), result.test_accuracy,
                static_cast<long long>(d.dataset->test.count()));
  }
}

// The loss of every local step and the learning rate of its update, one CSV line each, with the digits that give
// the floats back.
absl::Status WriteMetrics(const std::string& path, const TrainingResult& result) {
  std::string csv = "local_step,loss,learning_rate\n";
  for (size_t i = 0; i < result.losses.size(); ++i) {
    absl::StrAppendFormat(&csv, "%d,%.9g,", i + 1, result.losses[i]);
    if (i < result.learning_rates.size()) absl::StrAppendFormat(&csv, "%.9g", result.learning_rates[i]);
    csv += '\n';
  }
  return WriteFileAtomically(path, csv);
}

}  // namespace

absl::Status ApplyModelDefaults(WorkerOptions* o) {
  if (o->resolved_model == nullptr) {
    models::ResolveOptions ro;
    ro.dlrm = o->dlrm;
    ASSIGN_OR_RETURN(o->resolved_model, models::ResolveModel(o->model, ro));
  }
  if (!o->export_onnx.empty() && !o->resolved_model->imported()) {
    return absl::InvalidArgumentError(absl::StrCat("--export_onnx needs a model imported from ONNX (--model=PATH.onnx); '",
                                                   o->resolved_model->name, "' is built in"));
  }
  const models::ModelDefaults& d = o->resolved_model->defaults;
  if (o->batch_size <= 0) o->batch_size = d.batch_size;
  if (o->optimizer.empty()) o->optimizer = d.optimizer;
  // The learning rate: the one given; else an adaptive optimizer other than the model's takes its framework's
  // default (the model's rate is tuned for the model's optimizer: mlp's 0.1 for sgd does not train rmsprop);
  // else the model's.
  if (o->learning_rate_note.empty()) {
    const ps::FrameworkLearningRate framework = ps::FrameworkDefaultLearningRate(o->optimizer);
    const std::string model = o->resolved_model->name;
    if (o->learning_rate > 0) {
      o->learning_rate_note = absl::StrCat("learning rate ", o->learning_rate, " (--learning_rate)");
    } else if (o->optimizer != d.optimizer && framework.rate > 0) {
      o->learning_rate = framework.rate;
      o->learning_rate_note = absl::StrCat("learning rate ", o->learning_rate, ": --optimizer=", o->optimizer,
                                           "'s default (as ", framework.source, "), not the model ", model, "'s ",
                                           d.learning_rate, " (for its ", d.optimizer,
                                           "); --learning_rate sets another");
    } else {
      o->learning_rate = d.learning_rate;
      o->learning_rate_note = absl::StrCat("learning rate ", o->learning_rate, ": the model ", model,
                                           "'s default (for ", d.optimizer, "); --learning_rate sets another");
    }
  }
  if (o->sparse_optimizer.empty()) o->sparse_optimizer = d.sparse_optimizer.empty() ? "adagrad" : d.sparse_optimizer;
  if (o->sparse_learning_rate <= 0) {
    o->sparse_learning_rate = d.sparse_learning_rate > 0 ? d.sparse_learning_rate : o->learning_rate;
  }
  if (o->mode != "sync" && o->mode != "async") {
    return absl::InvalidArgumentError(absl::StrCat("--mode must be sync or async, got '", o->mode, "'"));
  }
  if (o->train_steps < 0 || (o->train_steps == 0 && !o->follow)) {
    return absl::InvalidArgumentError("--train_steps must be > 0 (0, no end, only with --follow)");
  }
  if (o->log_every <= 0) return absl::InvalidArgumentError("--log_every must be > 0");
  return absl::OkStatus();
}

absl::StatusOr<ps::OptimizerConfig> OptimizerConfigOf(const WorkerOptions& o) {
  ASSIGN_OR_RETURN(ps::OptimizerConfig c, ps::DefaultOptimizerConfig(o.optimizer));
  c.learning_rate = o.learning_rate;
  if (o.momentum) c.momentum = *o.momentum;
  if (o.beta1) c.beta1 = *o.beta1;
  if (o.beta2) c.beta2 = *o.beta2;
  if (o.epsilon) c.epsilon = *o.epsilon;
  if (o.weight_decay) c.weight_decay = *o.weight_decay;
  if (o.rho) c.rho = *o.rho;
  if (o.initial_accumulator) c.initial_accumulator = *o.initial_accumulator;
  c.nesterov = o.nesterov;
  c.centered = o.centered;
  c.clip_norm = o.clip_norm;
  c.decay_steps = o.decay_steps;
  c.decay_rate = o.decay_rate;
  c.staircase = o.staircase;
  c.min_learning_rate = o.min_learning_rate;
  c.warmup_steps = o.warmup_steps;
  // Without warmup steps the factor means nothing: 0 then, so that the workers' configs agree whatever factor
  // each was given (ps::CompareTrainConfigs), and a run without warmup registers the config it did before 1/3.
  c.warmup_start_factor = o.warmup_steps > 0 ? o.warmup_start_factor : 0.0f;
  if (o.lr_schedule == "exponential") {
    c.lr_schedule = "exponential";
  } else if (o.lr_schedule == "step") {
    if (o.decay_steps <= 0) {
      return absl::InvalidArgumentError("--lr_schedule=step needs --decay_steps > 0 (the step size)");
    }
    c.lr_schedule = "exponential";
    c.staircase = true;
  } else if (o.lr_schedule == "cosine") {
    c.lr_schedule = "cosine";
    if (c.decay_steps == 0) c.decay_steps = std::max<int64_t>(1, o.train_steps - o.warmup_steps);
  } else if (o.lr_schedule == "constant") {
    c.lr_schedule = "exponential";
    c.decay_steps = 0;
  } else {
    return absl::InvalidArgumentError(absl::StrCat("--lr_schedule must be exponential, step, cosine or constant, got '",
                                                   o.lr_schedule, "'"));
  }
  if (absl::Status s = ps::ToOptimizerParams(c).status(); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--optimizer=", o.optimizer, ": ", s.message()));
  }
  return c;
}

namespace {

// Where RunTraining was when it failed: it decides what a failure means (HowTrainingFailed).
enum class Phase { kSetUp, kConnect, kTrain };

constexpr char kLeavingPayload[] = "type.dtrain/leaving";

ps::Leaving Classify(const absl::Status& s, Phase phase, bool stop_requested) {
  if (ps::IsJobEnded(s)) return ps::Leaving::kPeerFailed;
  if (stop_requested && (s.code() == absl::StatusCode::kCancelled || phase == Phase::kConnect)) {
    return ps::Leaving::kStopped;
  }
  switch (s.code()) {
    case absl::StatusCode::kInvalidArgument:
      return phase == Phase::kTrain ? ps::Leaving::kFailed : ps::Leaving::kRefused;
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kResourceExhausted:
    case absl::StatusCode::kPermissionDenied:
      return phase == Phase::kConnect ? ps::Leaving::kRefused : ps::Leaving::kFailed;
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
      return phase == Phase::kSetUp ? ps::Leaving::kFailed : ps::Leaving::kPeerFailed;
    default:
      return ps::Leaving::kFailed;
  }
}

std::string StopReason(const WorkerOptions& o) { return o.stop_reason ? o.stop_reason() : "asked to stop"; }

// A status as the one line a ps task keeps as the worker's reason.
std::string ReasonLine(const absl::Status& s) {
  std::string r(s.message());
  std::replace(r.begin(), r.end(), '\n', ' ');
  if (r.size() > 400) r = r.substr(0, 400) + "...";
  return r;
}

// After this worker reported done (completed): how the run ended, from ps 0 once every worker has left (at most a
// lease and a few seconds: a worker that is still running by then is named in the line).
void AwaitRunOutcome(const WorkerOptions& o, ps::WorkerClient* client, TrainingResult* result) {
  const absl::Duration lease = client->lease();
  const absl::Duration limit = (lease > absl::ZeroDuration() ? lease : absl::Seconds(5)) + absl::Seconds(5);
  const absl::Time start = absl::Now(), deadline = start + limit;
  bool said = false;
  while (true) {
    absl::StatusOr<ps::TrainingStats> s = client->Stats(0);
    if (!s.ok()) {
      LOG(WARNING) << "worker " << o.worker_id << ": could not ask ps task 0 how the run ended ("
                   << s.status().message() << "); this worker completed its training";
      return;
    }
    if (s->global_step < result->global_step && s->job_ended.empty()) {
      // ps task 0 is behind the step this worker completed: it was restarted (or rolled back) after the end and
      // cannot say how the run ended; this worker's own training did complete.
      LOG(WARNING) << "worker " << o.worker_id << ": ps task 0 is at step " << s->global_step << ", behind the "
                   << "step " << result->global_step << " this worker completed (it restarted after the end): "
                   << "this worker completed its training";
      result->outcome_line = absl::StrCat("this worker completed its training at step ", result->global_step, " of ",
                                          o.train_steps, "; ps task 0 restarted after the end and cannot say how "
                                          "the others ended");
      return;
    }
    std::vector<int> running;
    for (const ps::WorkerStats& w : s->workers) {
      if (!w.done && !w.lost) running.push_back(w.worker_id);
    }
    if (running.empty() || absl::Now() >= deadline) {
      result->outcome = ps::SummarizeRun(s->workers, s->global_step, o.train_steps, s->job_ended,
                                         &result->outcome_line, !o.elastic_batch.empty());
      if (!running.empty()) {
        absl::StrAppend(&result->outcome_line, " (worker", running.size() > 1 ? "s " : " ",
                        absl::StrJoin(running, ", "), " had not left within ", absl::FormatDuration(limit), ")");
      }
      return;
    }
    if (!said && absl::Now() - start > absl::Seconds(2)) {
      LOG(INFO) << "worker " << o.worker_id << ": waiting until "
                << absl::FormatTime("%H:%M:%S", deadline, absl::LocalTimeZone()) << " for worker"
                << (running.size() > 1 ? "s " : " ") << absl::StrJoin(running, ", ")
                << " to leave, to know how the run ended";
      said = true;
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
}

// What --profile_out records of the run's set-up.
ProfiledRun ProfiledRunOf(const WorkerOptions& o, bool local, Towers* towers, const ps::TrainConfig& config) {
  ProfiledRun run;
  run.model = o.model;
  run.batch_size = o.batch_size;
  run.towers = towers->size();
  run.threads = o.threads;
  run.mode = local ? "local" : o.mode;
  run.wire_dtype = o.wire_dtype;
  run.optimizer = config.optimizer;
  for (const models::VariableInfo& v : towers->tower(0)->variables()) {
    run.variables.push_back({v.name, v.size(), v.trainable});
  }
  for (const models::TableInfo& t : towers->tower(0)->graph().tables) run.tables.push_back({t.name, t.dim, t.rows});
  return run;
}

absl::StatusOr<TrainingResult> Train(const WorkerOptions& options, const std::vector<ps::PsInterface*>& tasks,
                                     Connection* conn, Phase* phase) {
  SetFlushDenormals();  // the training loop computes (the kernels' own pools set it too)
  WorkerOptions o = options;
  RETURN_IF_ERROR(ApplyModelDefaults(&o));
  if (!o.quiet) LOG(INFO) << "worker " << o.worker_id << ": " << o.learning_rate_note;
  const bool local = tasks.empty();
  const bool chief = o.worker_id == 0;

  // Set-up: data, towers, placement and config, the connection (the chief initializes the variables).
  TrainingData data;
  RETURN_IF_ERROR(SetUpData(&o, local, chief, &data));
  ASSIGN_OR_RETURN(std::vector<kernels::DeviceSpec> specs, ParseTowers(o.towers, o.num_gpus, o.threads));
  // Sparse tables stay on the ps (a step pulls the rows of its ids), so their models never keep the training
  // state on the devices.
  ASSIGN_OR_RETURN(const models::Graph graph, o.resolved_model->build_graph(data.model_options));
  const bool resident = DeviceResident(o, specs, local) && graph.tables.empty();
  TowersOptions topt;
  topt.cpu_in_place = o.cpu_towers_in_place;
  topt.replicated = resident;
  if (!local) topt.host_memory = o.host_memory;
  ASSIGN_OR_RETURN(std::unique_ptr<Towers> towers, Towers::Create(*o.resolved_model, data.model_options, specs, topt));
  Connection& ps = *conn;
  ps.device_resident = resident;
  RETURN_IF_ERROR(SetUpConnection(o, tasks, towers.get(), &ps));

  // Stopping (WorkerOptions::stop): while connecting, give up at once; in the loop, the step in flight may end
  // within stop_grace (the loop then stops before the next one), else it is abandoned.
  std::atomic<bool> connected{false};
  absl::Notification loop_over;
  auto end_of_loop = [&loop_over] {
    if (!loop_over.HasBeenNotified()) loop_over.Notify();
  };
  int64_t stop_id = 0;
  if (o.stop != nullptr) {
    ps::WorkerClient* client = ps.client.get();
    stop_id = o.stop->Register([&o, client, &connected, &loop_over] {
      if (!connected.load()) {
        client->Stop();
        return;
      }
      if (!loop_over.WaitForNotificationWithTimeout(o.stop_grace)) {
        LOG(WARNING) << "worker " << o.worker_id << ": the step in flight did not end within "
                     << absl::FormatDuration(o.stop_grace) << " of the stop: abandoning it";
        client->Stop();
      }
    });
  }
  auto stop_done = absl::MakeCleanup([&] {
    end_of_loop();
    if (o.stop != nullptr) o.stop->Deregister(stop_id);
  });

  *phase = Phase::kConnect;
  if (!local && !o.quiet) {
    LOG(INFO) << "worker " << o.worker_id << ": connecting to the ps tasks" << (chief ? "" : " and waiting for the chief")
              << " until " << absl::FormatTime("%H:%M:%S", absl::Now() + absl::Seconds(o.startup_wait_secs),
                                               absl::LocalTimeZone())
              << " (--startup_wait_secs=" << o.startup_wait_secs << ")";
  }
  absl::Status connected_now = Connect(o, towers.get(), &ps);
  if (std::optional<ps::PsSet> set = ps::ParsePsSetChanged(connected_now); set.has_value()) {
    // Started with a ps set the job has left (a restarted worker of the original spec): ps 0 named the new one.
    connected_now = MoveToPsSet(o, &ps, data.stream.get(), *set);
  }
  RETURN_IF_ERROR(connected_now);
  RETURN_IF_ERROR(ResumeInput(o, &ps, data.stream.get()));
  connected = true;
  *phase = Phase::kTrain;
  TrainingStepsOptions sopt;
  sopt.sync = ps.config.mode == "sync";
  sopt.local_ps = resident ? ps.local_ps.get() : nullptr;
  sopt.config = ps.config;
  sopt.cuda_graphs = o.cuda_graphs;
  sopt.kill_mid_push_at_step = o.kill_mid_push_at_step;
  sopt.row_cache_rows = o.row_cache_rows;
  sopt.row_cache_staleness = o.row_cache_staleness;
  // Only where ps 0 can grant it: one worker, one ps task, sync, whole (not striped) pulls.
  sopt.tune_apply_early = o.apply_early == "auto" && !local && sopt.sync && o.num_workers == 1 &&
                          o.num_ps == 1 && o.slice_pieces_per_task == 1;
  sopt.profile = o.profile;
  sopt.metrics = o.metrics;
  sopt.trace = o.trace;
  if (o.profile != nullptr) o.profile->SetRun(ProfiledRunOf(o, local, towers.get(), ps.config));
  ASSIGN_OR_RETURN(std::unique_ptr<TrainingSteps> steps,
                   MakeTrainingSteps(towers.get(), ps.client.get(), sopt));
  // TensorBoard summaries from the chief (loss, throughput, accuracy), like the seeds' Supervisor.
  std::unique_ptr<EventWriter> events;
  if (chief && !o.logdir.empty()) {
    ASSIGN_OR_RETURN(events, EventWriter::Create(o.logdir));
  }

  // Summaries beyond loss and accuracy (worker/train/summaries.h): learning rate, ps traffic, staleness, histograms.
  std::unique_ptr<TrainingSummaries> summaries;
  if (events && o.summary_every > 0) {
    ps::WorkerClient* client = ps.client.get();
    TrainingSummaries::UniqueIdsFn unique_ids;  // sparse/unique_ids_per_step, for models with tables
    if (!graph.tables.empty()) unique_ids = [s = steps.get()] { return s->last_step_unique_ids(); };
    ASSIGN_OR_RETURN(summaries, TrainingSummaries::Create(events.get(), towers->tower(0)->variables(),
                                                          ps.config.optimizer, client->num_tasks(),
                                                          [client](int t) { return client->Stats(t); }, absl::Now(),
                                                          std::move(unique_ids)));
  }

  // The loop, then the end: evaluation, statistics, done.
  TrainingResult result;
  ScoreWindow window(o.follow ? o.eval_window : 0);
  // A ps task that restarts after the last step answers the chief's final pull with Aborted: connect again (the
  // chief restores every task to the newest common checkpoint) and train from there to the end once more.
  int64_t first_step = -1;
  for (int reconnects = 0;; ++reconnects) {
    const double seconds_before = result.seconds;
    const absl::Status looped = TrainLoop(o, chief, &data, towers.get(), &ps, steps.get(), events.get(),
                                          summaries.get(), &window, &result);
    end_of_loop();  // a stop from here on lets the chief evaluate and export
    RETURN_IF_ERROR(looped);
    if (window.size() > 0) {  // the chief's progressive validation at the end
      result.window_examples = window.size();
      result.window_log_loss = window.LogLoss();
      result.window_auc = window.Auc();
      if (events) {
        RETURN_IF_ERROR(events->AddScalar("window_log_loss", result.global_step, result.window_log_loss));
        RETURN_IF_ERROR(events->AddScalar("window_auc", result.global_step, result.window_auc));
      }
    }
    // The throughput figures cover the whole run.
    if (first_step < 0) first_step = result.first_step;
    result.first_step = first_step;
    result.seconds += seconds_before;
    const absl::Status finished =
        FinishTraining(o, chief, local, data, towers.get(), &ps, steps.get(), events.get(), &result);
    if (finished.ok()) break;
    if (finished.code() != absl::StatusCode::kAborted || local || reconnects >= kMaxReconnects) return finished;
    RETURN_IF_ERROR(ConnectAgain(o, &ps, data.stream.get(), finished));
  }
  if (result.input_ended && !o.quiet) {
    std::printf("worker %d: the input ended at global step %lld\n", o.worker_id,
                static_cast<long long>(result.global_step));
  }
  if (result.stopped) {
    // Stopped before the end (SIGTERM): leave as stopped. The chief has evaluated and exported first (below: the
    // export needs no ps); its leaving ends the run, and the ps tasks save the final checkpoint.
    const std::string why = absl::StrCat(StopReason(o), " at step ", result.global_step);
    RETURN_IF_ERROR(ps.client->Done(ps::Leaving::kStopped, result.global_step, why, absl::Seconds(5)));
    result.outcome = ps::RunOutcome::kEndedEarly;
    result.outcome_line =
        chief ? absl::StrCat("run stopped at step ", result.global_step, " of ", o.train_steps, ": the chief was ",
                             "stopped (", StopReason(o), ")", o.evaluate ? "; evaluated at that step" : "",
                             o.export_onnx.empty() ? "" : " and exported",
                             local ? "" : "; the ps tasks save their final checkpoint and stop the other workers")
              : absl::StrCat("worker ", o.worker_id, " stopped (", StopReason(o), ") at step ", result.global_step,
                             "; it left the cluster, the run goes on without it");
  } else {
    RETURN_IF_ERROR(ps.client->Done(ps::Leaving::kCompleted, result.global_step));
    if (!local) {
      AwaitRunOutcome(o, ps.client.get(), &result);
    } else {
      result.outcome_line = absl::StrCat("run complete: training reached step ", result.global_step, " of ",
                                         o.train_steps);
    }
  }
  if (ps.local_ps) {
    // Local mode: the in-process ps wrote its final checkpoint inside Done; the end of training must be on disk.
    const absl::Status saved = ps.local_ps->final_checkpoint_status();
    if (!saved.ok()) {
      return absl::Status(saved.code(), absl::StrCat("training finished at step ", result.global_step,
                                                     " but the final checkpoint was not saved: ", saved.message()));
    }
  }
  if (chief) {
    PrintAccuracy(o, data, result);
    std::fflush(stdout);
  }
  if (!o.metrics_file.empty()) RETURN_IF_ERROR(WriteMetrics(o.metrics_file, result));
  if (chief && !o.export_onnx.empty()) {
    models::onnx::TableRows rows;  // the embedding tables' rows, into their initializers
    const std::vector<models::TableInfo>& tables = towers->tower(0)->graph().tables;
    for (size_t t = 0; t < tables.size(); ++t) {
      // Every table's rows, whatever the file's dims let the import see: the file's own rows never stand in.
      if (t >= result.table_rows.size() || result.table_rows[t].empty()) {
        return absl::InternalError(absl::StrCat("--export_onnx: the rows of embedding table '", tables[t].name,
                                                "' were not pulled at the end"));
      }
      rows[tables[t].name] = result.table_rows[t];
    }
    RETURN_IF_ERROR(models::onnx::ExportOnnx(*o.resolved_model, towers->tower(0)->variables(), result.parameters.data(),
                                             rows, o.export_onnx));
    if (!o.quiet) std::printf("exported the trained model to %s\n", o.export_onnx.c_str());
  }
  // The summary line: the chief's always, another worker's when the run was not complete.
  if (!o.quiet && !result.outcome_line.empty() && (chief || result.outcome != ps::RunOutcome::kComplete)) {
    std::printf("%s\n", result.outcome_line.c_str());
    std::fflush(stdout);
  }
  return result;
}

}  // namespace

absl::StatusOr<TrainingResult> RunTraining(const WorkerOptions& options,
                                           const std::vector<ps::PsInterface*>& tasks) {
  Connection ps;
  Phase phase = Phase::kSetUp;
  absl::StatusOr<TrainingResult> result = Train(options, tasks, &ps, &phase);
  if (result.ok()) return result;
  const absl::Status& s = result.status();
  if (std::optional<ps::RunOver> over = ps::ParseRunOver(s)) {
    // Registered (or probed, the chief) after the run was over: a task that only lingers before it exits. The
    // run's outcome is this worker's too; nothing is left for it to do, and it has nothing to tell the tasks.
    TrainingResult done;
    done.global_step = over->global_step;
    done.outcome = over->kind;
    // The export asked for is not there: not a complete run for whoever waits for the file.
    if (done.outcome == ps::RunOutcome::kComplete && options.worker_id == 0 && !options.export_onnx.empty()) {
      done.outcome = ps::RunOutcome::kDegraded;
    }
    done.outcome_line = absl::StrCat("worker ", options.worker_id, " came back after the run was over (",
                                     over->line, ")",
                                     options.worker_id == 0 && (options.evaluate || !options.export_onnx.empty())
                                         ? "; it did not evaluate or export: dtrain_eval --checkpoint=DIR does, from "
                                           "the final checkpoint"
                                         : "");
    if (!options.quiet) {
      std::printf("%s\n", done.outcome_line.c_str());
      std::fflush(stdout);
    }
    return done;
  }
  if (ps::IsRemoved(s) && ps.client != nullptr) {
    // An operator removed this worker (dtrain_ctl remove-worker): it leaves as a stopped worker does, the run goes
    // on without it, and for this process that is a success.
    const std::string why = ps::RemovedReason(s);
    ps.client->Done(ps::Leaving::kStopped, 0, why, absl::Seconds(5)).IgnoreError();
    TrainingResult done;
    done.outcome = ps::RunOutcome::kComplete;
    done.outcome_line = absl::StrCat("worker ", options.worker_id, " left the job: ", why,
                                     " (the run goes on without it)");
    if (!options.quiet) {
      std::printf("%s\n", done.outcome_line.c_str());
      std::fflush(stdout);
    }
    return done;
  }
  const ps::Leaving leaving = Classify(s, phase, options.stop != nullptr && options.stop->cancelled());
  if (!tasks.empty()) {
    // The worker leaves the cluster (best effort, a few seconds at most), so the ps tasks stop expecting it and
    // know why: they end the run for a refused worker when it cannot complete without it, or for the chief.
    const std::string reason = leaving == ps::Leaving::kStopped     ? StopReason(options)
                               : leaving == ps::Leaving::kPeerFailed ? ps::JobEndedReason(s)
                                                                     : ReasonLine(s);
    // A worker that gave up reaching the ps tasks has little hope of reaching them now: one second for it.
    const absl::Duration tell =
        phase == Phase::kConnect && leaving == ps::Leaving::kPeerFailed ? absl::Seconds(1) : absl::Seconds(5);
    LOG(INFO) << "worker " << options.worker_id << " leaves the cluster (" << ps::LeavingName(leaving)
              << "): telling the ps tasks, for at most " << absl::FormatDuration(tell);
    absl::Status told;
    if (ps.client != nullptr) {
      told = ps.client->Done(leaving, 0, reason, tell);
    } else {
      ps::DoneRequest request;  // no session yet: leaving needs none
      request.worker_id = options.worker_id;
      request.leaving = leaving;
      request.reason = reason;
      request.retry_ms = absl::ToInt64Milliseconds(tell);
      for (int t = static_cast<int>(tasks.size()) - 1; t >= 0; --t) told.Update(tasks[t]->Done(request));
    }
    if (!told.ok()) {
      LOG(WARNING) << "worker " << options.worker_id << " could not tell every ps task it leaves ("
                   << ps::LeavingName(leaving) << "): " << told.message();
    }
  }
  absl::Status marked = s;
  if (tasks.empty() && ps.local_ps != nullptr && ps.client != nullptr && phase == Phase::kTrain) {
    // Local mode: the in-process ps is the job's ps, and this failure ends the job. It saves the final checkpoint
    // (and a last delta) of what was trained before the error, as a cluster's ps tasks do when their chief fails
    // (an online run's bad input file with --bad_records=fail, a disk error): a restart resumes there. The error
    // stays this process's (exit 1), the line says whether the state was saved.
    ps.client->Done(leaving, 0, ReasonLine(s), absl::ZeroDuration()).IgnoreError();
    const absl::Status saved = ps.local_ps->WaitFinalCheckpoint(absl::Seconds(60));  // written by Done, as a rule
    if (options.checkpoint.enabled()) {
      marked = absl::Status(
          s.code(), saved.ok() ? absl::StrCat(s.message(), "; the final checkpoint of step ", ps.local_ps->step(),
                                              " was saved in ", options.checkpoint.dir)
                               : absl::StrCat(s.message(), "; the final checkpoint of step ", ps.local_ps->step(),
                                              " was not saved either: ", saved.message()));
    }
  }
  marked.SetPayload(kLeavingPayload, absl::Cord(std::to_string(static_cast<int>(leaving))));
  return marked;
}

ps::Leaving HowTrainingFailed(const absl::Status& s) {
  if (absl::optional<absl::Cord> p = s.GetPayload(kLeavingPayload)) {
    const std::string v(*p);
    if (v.size() == 1 && v[0] >= '0' && v[0] <= '4') return static_cast<ps::Leaving>(v[0] - '0');
  }
  if (ps::IsJobEnded(s)) return ps::Leaving::kPeerFailed;
  return s.code() == absl::StatusCode::kInvalidArgument ? ps::Leaving::kRefused : ps::Leaving::kFailed;
}

int FailedRunExitCode(const absl::Status& failure, int signal) {
  switch (HowTrainingFailed(failure)) {
    case ps::Leaving::kRefused:
      return kExitConfigRefused;
    case ps::Leaving::kPeerFailed: {
      const std::string why = ps::IsJobEnded(failure) ? ps::JobEndedReason(failure) : "";
      // A run ended for another process's refused configuration: 2 on every process, as on that one.
      if (ps::EndedByRefusal(why)) return kExitConfigRefused;
      // Signalled, and the run ended meanwhile because of a stop (every process got the signal at once, the chief
      // left first), or without a word of why (the ps tasks went away as they stopped): stopped, as asked. A run
      // that failed elsewhere stays a failure.
      if (signal != 0 && (why.empty() || ps::EndedByStop(why))) return ExitCodeForSignal(signal);
      return kExitPeerFailed;
    }
    case ps::Leaving::kStopped:
      return signal != 0 ? ExitCodeForSignal(signal) : kExitError;
    default:
      return kExitError;
  }
}

}  // namespace dtrain::worker
