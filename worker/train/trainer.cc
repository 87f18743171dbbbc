#include "worker/train/trainer.h"

#include <glog/logging.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <optional>
#include <cstdio>
#include <functional>
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
#include "worker/train/trainer_internal.h"

namespace dtrain::worker {
namespace {

using trainer_internal::FinishTraining;
using trainer_internal::kMaxReconnects;
using trainer_internal::PrintAccuracy;
using trainer_internal::ScoreWindow;
using trainer_internal::SetUpData;
using trainer_internal::TrainingData;
using trainer_internal::TrainLoop;

// Local mode with device-owned towers (GPUs) keeps the training state on the devices.
bool DeviceResident(const WorkerOptions& o, const std::vector<kernels::DeviceSpec>& specs, bool local) {
  const bool gpu = !specs.empty() && specs[0].kind == kernels::DeviceSpec::Kind::kGpu;
  return local && o.device_resident && (gpu || !o.cpu_towers_in_place);
}

}  // namespace

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

// Summaries beyond loss and accuracy (worker/train/summaries.h): learning rate, ps traffic, staleness, histograms.
absl::StatusOr<std::unique_ptr<TrainingSummaries>> MakeSummaries(EventWriter* events, const models::Graph& graph,
                                                                 Towers* towers, const Connection& ps,
                                                                 TrainingSteps* steps) {
  ps::WorkerClient* client = ps.client.get();
  TrainingSummaries::UniqueIdsFn unique_ids;  // sparse/unique_ids_per_step, for models with tables
  if (!graph.tables.empty()) unique_ids = [s = steps] { return s->last_step_unique_ids(); };
  return TrainingSummaries::Create(events, towers->tower(0)->variables(), ps.config.optimizer, client->num_tasks(),
                                   [client](int t) { return client->Stats(t); }, absl::Now(), std::move(unique_ids));
}

// The training loop to the end of the run, with the chief's evaluation (FinishTraining); connects again when a
// ps task restarted after the last step. `end_of_loop` lets a stop that comes now wait for the evaluation.
absl::Status TrainToTheEnd(const WorkerOptions& o, bool chief, bool local, TrainingData* data, Towers* towers,
                           Connection* ps, TrainingSteps* steps, EventWriter* events, TrainingSummaries* summaries,
                           const std::function<void()>& end_of_loop, StepLossLog* losses, TrainingResult* result) {
  ScoreWindow window(o.follow ? o.eval_window : 0);
  // A ps task that restarts after the last step answers the chief's final pull with Aborted: connect again (the
  // chief restores every task to the newest common checkpoint) and train from there to the end once more.
  int64_t first_step = -1;
  for (int reconnects = 0;; ++reconnects) {
    const double seconds_before = result->seconds;
    const absl::Status looped = TrainLoop(o, chief, data, towers, ps, steps, events, summaries, &window, losses, result);
    end_of_loop();  // a stop from here on lets the chief evaluate and export
    RETURN_IF_ERROR(looped);
    if (window.size() > 0) {  // the chief's progressive validation at the end
      result->window_examples = window.size();
      result->window_log_loss = window.LogLoss();
      result->window_auc = window.Auc();
      if (events != nullptr) {
        RETURN_IF_ERROR(events->AddScalar("window_log_loss", result->global_step, result->window_log_loss));
        RETURN_IF_ERROR(events->AddScalar("window_auc", result->global_step, result->window_auc));
      }
    }
    // The throughput figures cover the whole run.
    if (first_step < 0) first_step = result->first_step;
    result->first_step = first_step;
    result->seconds += seconds_before;
    const absl::Status finished = FinishTraining(o, chief, local, *data, towers, ps, steps, events, result);
    if (finished.ok()) break;
    if (finished.code() != absl::StatusCode::kAborted || local || reconnects >= kMaxReconnects) return finished;
    RETURN_IF_ERROR(ConnectAgain(o, ps, data->stream.get(), finished));
  }
  return absl::OkStatus();
}

// Tells the ps tasks this worker leaves (stopped, or done at the end), and the run's outcome line.
absl::Status LeaveCluster(const WorkerOptions& o, bool chief, bool local, Connection* ps, TrainingResult* result) {
  if (result->stopped) {
    // Stopped before the end (SIGTERM): leave as stopped. The chief has evaluated and exported first (below: the
    // export needs no ps); its leaving ends the run, and the ps tasks save the final checkpoint.
    const std::string why = absl::StrCat(StopReason(o), " at step ", result->global_step);
    RETURN_IF_ERROR(ps->client->Done(ps::Leaving::kStopped, result->global_step, why, absl::Seconds(5)));
    result->outcome = ps::RunOutcome::kEndedEarly;
    result->outcome_line =
        chief ? absl::StrCat("run stopped at step ", result->global_step, " of ", o.train_steps, ": the chief was ",
                             "stopped (", StopReason(o), ")", o.evaluate ? "; evaluated at that step" : "",
                             o.export_onnx.empty() ? "" : " and exported",
                             local ? "" : "; the ps tasks save their final checkpoint and stop the other workers")
              : absl::StrCat("worker ", o.worker_id, " stopped (", StopReason(o), ") at step ", result->global_step,
                             "; it left the cluster, the run goes on without it");
  } else {
    RETURN_IF_ERROR(ps->client->Done(ps::Leaving::kCompleted, result->global_step));
    if (!local) {
      AwaitRunOutcome(o, ps->client.get(), result);
    } else {
      result->outcome_line = absl::StrCat("run complete: training reached step ", result->global_step, " of ",
                                          o.train_steps);
    }
  }
  return absl::OkStatus();
}

// --export_onnx: the imported model's file with the trained values (the embedding tables' rows included).
absl::Status ExportTrained(const WorkerOptions& o, Towers& towers, const TrainingResult& result) {
  models::onnx::TableRows rows;  // the embedding tables' rows, into their initializers
  const std::vector<models::TableInfo>& tables = towers.tower(0)->graph().tables;
  for (size_t t = 0; t < tables.size(); ++t) {
    // Every table's rows, whatever the file's dims let the import see: the file's own rows never stand in.
    if (t >= result.table_rows.size() || result.table_rows[t].empty()) {
      return absl::InternalError(absl::StrCat("--export_onnx: the rows of embedding table '", tables[t].name,
                                              "' were not pulled at the end"));
    }
    rows[tables[t].name] = result.table_rows[t];
  }
  RETURN_IF_ERROR(models::onnx::ExportOnnx(*o.resolved_model, towers.tower(0)->variables(), result.parameters.data(),
                                           rows, o.export_onnx));
  if (!o.quiet) std::printf("exported the trained model to %s\n", o.export_onnx.c_str());
  return absl::OkStatus();
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
  ASSIGN_OR_RETURN(std::vector<kernels::DeviceSpec> specs, ParseTowers(o.towers, o.num_gpus, o.threads, o.compute_dtype));
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

  std::unique_ptr<TrainingSummaries> summaries;
  if (events && o.summary_every > 0) {
    ASSIGN_OR_RETURN(summaries, MakeSummaries(events.get(), graph, towers.get(), ps, steps.get()));
  }

  // The loop, then the end: evaluation, statistics, done.
  TrainingResult result;
  StepLossLog losses(o.metrics_file, o.keep_step_losses);
  RETURN_IF_ERROR(losses.Open());
  RETURN_IF_ERROR(TrainToTheEnd(o, chief, local, &data, towers.get(), &ps, steps.get(), events.get(),
                                summaries.get(), end_of_loop, &losses, &result));
  if (result.input_ended && !o.quiet) {
    std::printf("worker %d: the input ended at global step %lld\n", o.worker_id,
                static_cast<long long>(result.global_step));
  }
  RETURN_IF_ERROR(LeaveCluster(o, chief, local, &ps, &result));
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
  RETURN_IF_ERROR(losses.Finish());  // --metrics_file: PATH.tmp becomes PATH
  if (chief && !o.export_onnx.empty()) RETURN_IF_ERROR(ExportTrained(o, *towers, result));
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
