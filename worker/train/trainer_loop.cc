#include "worker/train/trainer_internal.h"

#include <glog/logging.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <optional>
#include <cstdio>
#include <memory>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "ps/client/worker_client.h"
#include "worker/batch/batch_view.h"
#include "worker/batch/table_spec.h"
#include "worker/data/batch_stream_state.h"
#include "worker/data/metrics.h"
#include "worker/train/profile_recorder.h"
#include "worker/train/step_metrics.h"

namespace dtrain::worker::trainer_internal {

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

absl::Status CollectLosses(TrainingSteps* steps, StepLossLog* log, TrainingResult* result) {
  ASSIGN_OR_RETURN(std::vector<float> losses, steps->TakeLosses());
  result->losses.insert(result->losses.end(), losses.begin(), losses.end());
  return log->Collect(result);
}

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

namespace {

// Where an elastic step's view places this worker's batches: the stream batch of its first (-1: read on where
// the stream is), the rounds of the towers, the gradient's factor.
struct Place {
  int64_t first = -1;
  int rounds = 1;
  float scale = 1.0f;
};

// What a pass of the loop came to: it goes on (a step was taken, or its input is ready); a new pull's answer to
// look at from the loop's top (after a reconnect, or with batches drawn again); the input ended.
enum class Pass { kGoOn, kPullAgain, kInputEnded };

// TrainLoop's state (its parameters, the step's pull answer `at`, the batches at hand, the progress window) and
// its steps, in the order a pass of the loop takes them. Used by the worker's training thread only.
struct TrainingLoop {
  TrainingLoop(const WorkerOptions& o, bool chief, TrainingData* d, Towers* towers, Connection* c,
               TrainingSteps* steps, EventWriter* events, TrainingSummaries* summaries, ScoreWindow* window,
               StepLossLog* losses, TrainingResult* result)
      : o(o), chief(chief), d(d), towers(towers), c(c), steps(steps), events(events), summaries(summaries),
        window(window), losses(losses), result(result), sparse(!towers->tower(0)->graph().tables.empty()),
        elastic(!c->config.elastic_batch.empty()), global(c->config.elastic_batch == "global") {}

  // ---- the pieces the steps share ----
  Place PlaceOf(const ps::ElasticView& view) const;
  ps::ElasticView Predicted(const ps::ElasticView& view) const;
  absl::StatusOr<bool> Draw(StepInput* in, const ps::ElasticView* view = nullptr);
  absl::StatusOr<ps::PullResult> StartPulling();
  void ReadAhead(int64_t batch);
  absl::StatusOr<ps::PullResult> Recover(absl::Status failure);
  absl::StatusOr<ps::PullResult> Settle();
  void LogMembership();
  bool BeforeEnd(int64_t step) const { return o.train_steps == 0 || step < o.train_steps; }

  // ---- the steps ----
  absl::Status Begin();
  void StartClock(const ps::Optimizer* learning_rates);
  bool StopRequested();
  absl::StatusOr<Pass> RunStep();
  absl::StatusOr<Pass> TakeInput();
  absl::StatusOr<Pass> Compute(absl::Status* stepped);
  absl::Status FollowPsSet();
  absl::StatusOr<bool> LogProgress();
  absl::Status WriteSummaries();
  absl::Status EvaluateIfDue(bool logging);
  absl::Status Finish();

  const WorkerOptions& o;
  const bool chief;
  TrainingData* const d;
  Towers* const towers;
  Connection* const c;
  TrainingSteps* const steps;
  EventWriter* const events;
  TrainingSummaries* const summaries;
  ScoreWindow* const window;
  StepLossLog* const losses;
  TrainingResult* const result;

  int reconnects = 0;
  // Models with sparse tables read one step ahead: the pull that brings a step's parameters also brings the rows
  // of that step's ids (TrainingSteps::SetUpcomingBatches).
  const bool sparse;
  StepInput current, upcoming;
  bool have_current = false;
  // The time the loop waits for input (a stream that keeps ahead of the towers returns at once).
  double window_input_wait = 0;
  // One step's batches; false when the input ended (an online run: no new file, or stopped). An elastic job's
  // `view` (ps 0's header of the step) says which batch of the one order: the one of this worker's place in the
  // step's workers (sync), or the one handed to it (async). A worker outside the plan (it is behind) reads on
  // where it is: ps 0 drops its commit, so nothing of that batch is trained on twice.
  const bool elastic;
  const bool global;
  ps::PullResult at;        // the answer of the pull the next step computes on
  ps::ElasticView seen;     // the chief logs each change of an elastic job's membership
  bool step_again = false;  // the pull answered the step just computed (a global step planned again)
  // From StartClock on.
  const ps::Optimizer* schedule = nullptr;
  int64_t examples_per_step = 0;
  absl::Time start, window_start;
  int64_t window_steps = 0, window_examples = 0;
  int64_t next_eval = -1;
  bool scoring = false;
  std::vector<float> logits;
};

Place TrainingLoop::PlaceOf(const ps::ElasticView& view) const {
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
}

// Models with sparse tables read a step ahead, before ps 0's header names the step's batches: the next step's
// view as it will be when the workers stay (the next batch of the order; per_worker, the batches after the
// plan's). When it is not (RedrawCurrent in TakeInput), the step's batches are drawn again.
ps::ElasticView TrainingLoop::Predicted(const ps::ElasticView& view) const {
  ps::ElasticView next = view;
  if (o.mode != "sync") {
    // Async: the batch ps 0 holds for this worker's next step (none: the next one of the stream, drawn again
    // once the pull names the step's batch).
    next.batches.clear();
    if (view.next_batch >= 0) next.batches.push_back(view.next_batch);
    return next;
  }
  if (global) {
    ++next.first_batch;
  } else {
    for (int64_t& b : next.batches) b += static_cast<int64_t>(next.batches.size());
  }
  return next;
}

absl::StatusOr<bool> TrainingLoop::Draw(StepInput* in, const ps::ElasticView* view) {
  const Place p = view != nullptr ? PlaceOf(*view) : Place{};
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
}

absl::StatusOr<ps::PullResult> TrainingLoop::StartPulling() {
  if (sparse) {
    ASSIGN_OR_RETURN(const bool got, Draw(&current));
    if (!got) return absl::FailedPreconditionError("the input ended before its first batch");
    have_current = true;
    RETURN_IF_ERROR(steps->SetUpcomingBatches(current.views));
    ReadAhead(-2);  // not drawn where ps 0 will place it: drawn again once the header names the batch
  }
  return steps->Start();
}

// An async elastic job's sparse model: tells ps 0, with the next pull, which batch this worker drew for it
// (PullRequest::elastic_read_ahead; -2: none of its own yet).
void TrainingLoop::ReadAhead(int64_t batch) {
  if (sparse && elastic && o.mode != "sync" && !c->device_resident) c->client->SetElasticReadAhead(batch);
}

// A worker may connect again just before the chief rolls the tasks back (voiding the sessions it just got):
// then the first pull is Aborted too, and it connects once more.
absl::StatusOr<ps::PullResult> TrainingLoop::Recover(absl::Status failure) {
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
    absl::StatusOr<ps::PullResult> started = StartPulling();  // from the input position the restore gave back
    if (started.ok()) return started;
    failure = started.status();
  }
}

absl::StatusOr<ps::PullResult> TrainingLoop::Settle() {
  absl::StatusOr<ps::PullResult> r = steps->Settle();
  return r.ok() ? r : Recover(r.status());
}

void TrainingLoop::LogMembership() {
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
}

// The first pull (connecting again if a ps task answers Aborted), and the lines that say where the run starts.
absl::Status TrainingLoop::Begin() {
  absl::StatusOr<ps::PullResult> started = StartPulling();
  if (!started.ok()) started = Recover(started.status());
  if (!started.ok()) return started.status();
  at = *started;
  result->first_step = at.step;
  LogMembership();
  if (at.step > 0 && !o.quiet) {
    // A restored checkpoint gives this worker the input position it had at that step; a worker that simply
    // starts after the others joins the run where it is.
    if (!c->client->restored_input_position().empty()) {
      std::printf("resuming at global step %lld\n", static_cast<long long>(at.step));
    } else {
      std::printf("joining the run at global step %lld\n", static_cast<long long>(at.step));
    }
  }
  return absl::OkStatus();
}

// The clock of the run and of the first progress window, the first evaluation's step. `learning_rates`: the
// schedule the ps tasks apply, for the progress lines and the metrics file; outlives the loop.
void TrainingLoop::StartClock(const ps::Optimizer* learning_rates) {
  schedule = learning_rates;
  examples_per_step = static_cast<int64_t>(o.batch_size) * towers->size();
  start = absl::Now();
  if (result->training_started == absl::InfinitePast()) result->training_started = start;
  window_start = start;
  next_eval = o.eval_every > 0 ? (at.step / o.eval_every + 1) * o.eval_every : -1;
  // Progressive validation: the chief of an online run scores its batch before it trains on it.
  scoring = chief && o.follow && o.eval_window > 0 && towers->tower(0)->graph().output_shape().size() == 1;
}

// True (and the result says why) when the loop should stop before the next step.
bool TrainingLoop::StopRequested() {
  if (o.stop != nullptr && o.stop->cancelled()) {  // SIGTERM: the step before is done, this one not begun
    result->stopped = true;
    return true;
  }
  if (o.input_stop && o.input_stop()) {
    result->input_ended = true;
    return true;
  }
  return false;
}

// One step: its input, its computation and push, the pull of the next one (and a move to a new set of ps
// tasks), then the counts of the progress window.
absl::StatusOr<Pass> TrainingLoop::RunStep() {
  // The timeline's step: this iteration, from its input to the answer of the pull its push started.
  const int64_t traced_step = at.step, step_begin_ns = o.trace != nullptr ? TraceRecorder::NowNs() : 0;
  if (o.trace != nullptr) o.trace->SetStep(traced_step);
  ASSIGN_OR_RETURN(const Pass input, TakeInput());
  if (input != Pass::kGoOn) return input;
  absl::Status stepped = absl::OkStatus();
  ASSIGN_OR_RETURN(const Pass computed, Compute(&stepped));
  if (computed != Pass::kGoOn) return computed;
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
    ASSIGN_OR_RETURN(at, Recover(next.status()));
    return Pass::kPullAgain;
  }
  step_again = next->step == at.step;
  at = *next;
  RETURN_IF_ERROR(FollowPsSet());
  LogMembership();
  if (result->local_steps == 0 && !o.quiet) {
    // The ops are made as the first step runs: now the towers can say what they computed in.
    if (const std::string report = towers->PrecisionReport(); !report.empty()) LOG(INFO) << "towers: " << report;
  }
  ++result->local_steps;
  ++window_steps;
  window_examples += step_examples;
  result->examples += step_examples;
  return Pass::kGoOn;
}

// The step's batches in `current`: drawn now unless they were read a step ahead, and drawn again (with their
// rows pulled again) when the ones read ahead are not where the step's view places this worker.
absl::StatusOr<Pass> TrainingLoop::TakeInput() {
  if (!have_current) {
    ASSIGN_OR_RETURN(const bool got, Draw(&current, elastic ? &at.elastic : nullptr));
    if (!got) return Pass::kInputEnded;
  }
  if (sparse && elastic && at.elastic.unit > 0) {
    // The batches read a step ahead are not the ones the step's view gives this worker (the workers changed):
    // drawn again, with their rows pulled again.
    const Place want = PlaceOf(at.elastic);
    if (want.first >= 0 && (want.first != current.first || want.rounds != current.rounds)) {
      ASSIGN_OR_RETURN(const bool got, Draw(&current, &at.elastic));
      if (!got) return Pass::kInputEnded;
      if (!at.elastic.batches.empty()) ReadAhead(at.elastic.batches[0]);  // async: the step's own batch, kept
      ++result->redrawn_steps;
      absl::StatusOr<ps::PullResult> redrawn = steps->RedrawCurrent(current.views);
      if (!redrawn.ok()) {
        ASSIGN_OR_RETURN(at, Recover(redrawn.status()));
        return Pass::kPullAgain;
      }
      at = *redrawn;
      return Pass::kPullAgain;  // the pull's view is checked again
    }
    current.scale = want.scale;
  }
  return Pass::kGoOn;
}

// A sparse model's next batches read ahead, the chief's score of the batch before it trains on it, the input
// position for the checkpoints, and the step itself. *stepped: how the step (or the read-ahead's pull of rows, or
// the scoring) went, for the pull to recover from; an error returned ends the loop.
absl::StatusOr<Pass> TrainingLoop::Compute(absl::Status* stepped) {
  if (sparse) {
    const ps::ElasticView next_view = elastic ? Predicted(at.elastic) : ps::ElasticView{};
    ASSIGN_OR_RETURN(const bool got, Draw(&upcoming, elastic ? &next_view : nullptr));
    if (!got) return Pass::kInputEnded;
    ReadAhead(next_view.batches.empty() ? -2 : next_view.batches[0]);
    *stepped = steps->SetUpcomingBatches(upcoming.views);
  }
  if (stepped->ok() && scoring) {
    logits.resize(current.views[0].batch);
    *stepped = steps->ScoreBatch(current.views[0], logits.data());
    if (stepped->ok()) window->Add(logits.data(), current.batches[0].labels);
  }
  // Where the input is after this step's batches, for the checkpoints (a few dozen bytes).
  if (c->device_resident) {
    RETURN_IF_ERROR(c->local_ps->RecordInputPosition(0, at.step, current.position));
  } else {
    c->client->SetInputPosition(current.position);
  }
  if (o.step_delay_ms > 0) absl::SleepFor(absl::Milliseconds(o.step_delay_ms));
  if (stepped->ok()) {
    *stepped = global ? steps->StepRounds(current.views, at.step, current.scale) : steps->Step(current.views, at.step);
    // The step's loss is kept (TakeLosses): the rate its update is applied with goes beside it.
    if (stepped->ok()) result->learning_rates.push_back(schedule->LearningRate(at.step));
  }
  return Pass::kGoOn;
}

// The pull's answer names a newer set of ps tasks: the same hosts (this worker started with the set as it is
// now), or a move that ps 0 makes at this step.
absl::Status TrainingLoop::FollowPsSet() {
  if (at.ps_set.version > c->ps_version && at.ps_set.hosts == c->ps_hosts) {
    c->ps_version = at.ps_set.version;  // started with the set as it is now
    c->config.ps_version = at.ps_set.version;
  } else if (at.ps_set.version > c->ps_version && at.ps_set.step <= at.step) {
    // ps 0 moves the job onto another set of ps tasks at this step: every task saved it; move, then pull it.
    if (sparse) have_current = false;  // the batches drawn for the pull in flight are drawn again
    absl::Status moved = MoveToPsSet(o, c, d->stream.get(), at.ps_set);
    absl::StatusOr<ps::PullResult> again = moved.ok() ? StartPulling() : moved;
    ASSIGN_OR_RETURN(at, again.ok() ? again : Recover(again.status()));
  }
  return absl::OkStatus();
}

// Every log_every local steps: the progress line and its scalars, and a new window. Returns whether it was due.
absl::StatusOr<bool> TrainingLoop::LogProgress() {
  const bool logging = result->local_steps % o.log_every == 0;
  if (logging) {
    RETURN_IF_ERROR(
        CollectLosses(steps, losses, result));  // device-resident steps: the one read-back of the window
    const double secs = absl::ToDoubleSeconds(absl::Now() - window_start);
    const double rate = static_cast<double>(window_examples) / std::max(secs, 1e-9);
    const float loss = result->last_loss;
    if (!o.quiet) {
      // The learning rate at the line's step, as TensorBoard's learning_rate scalar has it (the schedule's value).
      std::printf("step %lld, loss = %.2f (%.1f examples/sec; %.3f sec/batch; input wait %.3f sec/batch; "
                  "learning rate %.4g)\n",
                  static_cast<long long>(at.step), loss, rate, secs / std::max<int64_t>(window_steps, 1),
                  window_input_wait / std::max<int64_t>(window_steps, 1), schedule->LearningRate(at.step));
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
  return logging;
}

// Every summary_every local steps: the histograms.
absl::Status TrainingLoop::WriteSummaries() {
  if (summaries && result->local_steps % o.summary_every == 0) {
    ASSIGN_OR_RETURN(at, Settle());  // the histograms read every parameter and gradient
    ASSIGN_OR_RETURN(std::vector<float> params, steps->Parameters());
    // Device-resident steps keep the gradients on the devices: no gradient histograms then.
    RETURN_IF_ERROR(summaries->Write(at.step, params.data(), c->device_resident ? nullptr : towers->host_grads()));
  }
  return absl::OkStatus();
}

// The chief's evaluation when it is due: online, of the window of scored batches; else of the test set.
absl::Status TrainingLoop::EvaluateIfDue(bool logging) {
  // Online, the chief's progressive validation: every eval_every global steps, or with each progress line when
  // eval_every is 0 (a stream has no end to wait for).
  const bool window_due = next_eval > 0 ? at.step >= next_eval : o.eval_every == 0 && logging;
  if (chief && o.follow && window_due && BeforeEnd(at.step)) {
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
  } else if (chief && !o.follow && next_eval > 0 && at.step >= next_eval && BeforeEnd(at.step)) {
    ASSIGN_OR_RETURN(at, Settle());
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
  return absl::OkStatus();
}

// After the last step: the losses, the answer of the last push, the result's totals.
absl::Status TrainingLoop::Finish() {
  RETURN_IF_ERROR(CollectLosses(steps, losses, result));
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
    ASSIGN_OR_RETURN(at, settled.ok() ? settled : Recover(settled.status()));
  }
  result->seconds = absl::ToDoubleSeconds(absl::Now() - start);
  // result->examples: counted as the steps ran (an elastic global step's rounds).
  result->global_step = at.step;
  return absl::OkStatus();
}

}  // namespace

absl::Status TrainLoop(const WorkerOptions& o, bool chief, TrainingData* d, Towers* towers, Connection* c,
                       TrainingSteps* steps, EventWriter* events, TrainingSummaries* summaries, ScoreWindow* window,
                       StepLossLog* losses, TrainingResult* result) {
  TrainingLoop loop(o, chief, d, towers, c, steps, events, summaries, window, losses, result);
  RETURN_IF_ERROR(loop.Begin());
  // The learning-rate schedule the ps tasks apply (the config this worker registered), for the progress lines and
  // the metrics file.
  ASSIGN_OR_RETURN(const ps::Optimizer schedule, ps::Optimizer::Create(c->config.optimizer));
  loop.StartClock(&schedule);
  while (loop.BeforeEnd(loop.at.step) && !loop.at.training_done) {
    if (loop.StopRequested()) break;
    ASSIGN_OR_RETURN(const Pass pass, loop.RunStep());
    if (pass == Pass::kInputEnded) {
      result->input_ended = true;
      break;
    }
    if (pass == Pass::kPullAgain) continue;
    ASSIGN_OR_RETURN(const bool logging, loop.LogProgress());
    RETURN_IF_ERROR(loop.WriteSummaries());
    RETURN_IF_ERROR(loop.EvaluateIfDue(logging));
  }
  return loop.Finish();
}

}  // namespace dtrain::worker::trainer_internal
