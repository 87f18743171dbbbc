#include "ps/client/worker_client.h"

#include <algorithm>
#include <iterator>
#include <thread>
#include <utility>

#include <glog/logging.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"

#include "ps/client/worker_client_internal.h"

namespace dtrain::ps {

using worker_client_internal::PauseBefore;
using worker_client_internal::Retryable;
using worker_client_internal::Until;

// ---- connecting -----------------------------------------------------------------------------------------------

absl::Status WorkerClient::Connect(const TrainConfig& config, const float* initial_params, absl::Duration wait,
                                   std::vector<InitialRows> initial_rows) {
  config_ = config;
  sync_ = config.mode == "sync";
  if (initial_params != nullptr && is_chief_) {
    if (options_.keep_initial_values) {
      const int64_t n = slices_.empty() ? 0 : slices_.back().spec.flat_offset + slices_.back().spec.length;
      initial_.assign(initial_params, initial_params + n);
      initial_values_ = initial_.data();
    } else {
      initial_values_ = initial_params;  // valid for this call only
    }
  }
  if (!initial_rows.empty() && is_chief_) initial_rows_ = std::move(initial_rows);
  absl::Status connected = ConnectTasks(wait);
  if (!options_.keep_initial_values) {
    initial_values_ = nullptr;
    initial_rows_.clear();
  }
  return connected;
}

absl::Status WorkerClient::ConnectTasks(absl::Duration wait) {
  const absl::Time give_up = absl::Now() + wait;
  if (is_chief_) RETURN_IF_ERROR(PrepareTasks(give_up, wait));
  const absl::Duration backoff = absl::Milliseconds(100);
  absl::Time next_log = absl::Now();
  int64_t lease_ms = 0;
  for (int t = 0; t < num_tasks(); ++t) {
    RegisterRequest req;
    req.worker_id = worker_id_;
    req.is_chief = is_chief_;
    req.config = TaskConfig(t);
    // Timelines: the clock offset comes from the registration's round trip, whose first call on a new channel
    // would also carry the connection's set-up (one way only: milliseconds of error). A call whose answer does
    // not matter opens the connection first; of several registrations the shortest round trip is kept.
    int64_t best_rtt_ns = std::numeric_limits<int64_t>::max();
    if (options_.trace != nullptr) tasks_[t]->GetStats().IgnoreError();
    while (true) {
      if (cancel_.cancelled()) return absl::CancelledError("connecting: cancelled");
      // Given up only after a try that started past the deadline (a process paused meanwhile tries once more).
      const absl::Time tried = absl::Now();
      const int64_t sent_ns = TraceRecorder::NowNs();
      absl::StatusOr<RegisterResponse> r = tasks_[t]->Register(req);
      const int64_t answered_ns = TraceRecorder::NowNs();
      if (r.ok() && r->clock_ns != 0 && options_.trace != nullptr && answered_ns - sent_ns < best_rtt_ns) {
        // The task's clock when it answered, against the middle of the round trip (NTP's estimate: exact when
        // the request and the answer took equally long).
        best_rtt_ns = answered_ns - sent_ns;
        options_.trace->SetClockOffset(t, r->clock_ns - (sent_ns + answered_ns) / 2, best_rtt_ns);
      }
      std::string waiting_for;
      absl::Status failed;
      if (r.ok()) {
        {
          absl::MutexLock lock(&mu_);
          sessions_[t] = r->session;
          if (t == 0) {
            restored_position_ = r->input_position;
            join_step_ = r->join_step;
            registered_step_ = r->global_step;
          }
        }
        lease_ms = std::max(lease_ms, r->lease_ms);
        if (r->initialized) {
          if (is_chief_ && t == 0 && r->global_step > 0) {
            LOG(INFO) << "ps task 0 is at step " << r->global_step << " (restored from a checkpoint or running)";
          }
          break;
        }
        if (is_chief_) {
          if (initial_values_ == nullptr && !slices_.empty()) {
            return absl::FailedPreconditionError(absl::StrCat("ps task ", t, " holds no values and the chief has no "
                                                              "initial values to give it"));
          }
          absl::StatusOr<std::unique_ptr<SliceUpload>> init = tasks_[t]->StartInitialize(worker_id_);
          if (init.ok()) {
            std::vector<std::vector<int64_t>> row_ids;
            std::vector<std::vector<float>> rows;
            absl::Status s = WriteSlices(init->get(), initial_values_, placement_[t]);
            if (s.ok()) s = WriteInitialRows(init->get(), t, &row_ids, &rows);
            if (s.ok()) s = (*init)->Finish().status();
            failed = s;
          } else {
            failed = init.status();
          }
          if (failed.ok()) {
            LOG(INFO) << "initialized ps task " << t << " (" << placement_[t].size() << " slices)";
            break;
          }
          if (!Retryable(failed)) return failed;
          waiting_for = absl::StrCat("ps task ", t, " to take the initial values (", failed.message(), ")");
        } else {
          waiting_for = absl::StrCat("the chief to initialize ps task ", t);
        }
      } else if (Retryable(r.status())) {
        waiting_for = absl::StrCat("ps task ", t, " (", r.status().message(), ")");
      } else {
        return r.status();
      }
      if (tried > give_up) {
        return absl::DeadlineExceededError(absl::StrCat("worker ", worker_id_, " gave up waiting for ", waiting_for,
                                                        " after ", absl::FormatDuration(wait)));
      }
      if (absl::Now() >= next_log) {
        LOG(INFO) << "worker " << worker_id_ << " waiting for " << waiting_for << " " << Until(give_up, wait);
        next_log = absl::Now() + absl::Seconds(5);
      }
      // Every 100 ms, not backing off further: a worker mostly waits here for the chief to initialize the tasks,
      // and each doubling let it start up to that long after the chief (a try costs the ps a fraction of a
      // millisecond; a task not up yet is waited for by the channel's own reconnect backoff).
      absl::SleepFor(PauseBefore(give_up, backoff));
    }
  }
  {
    absl::MutexLock lock(&mu_);
    lease_ = absl::Milliseconds(lease_ms);
  }
  if (options_.background && lease_ms > 0 && !heartbeat_.joinable()) {
    const absl::Duration every = std::clamp(absl::Milliseconds(lease_ms) / 4, absl::Milliseconds(20), absl::Seconds(2));
    heartbeat_ = std::thread([this, every] { HeartbeatLoop(every); });
  }
  return absl::OkStatus();
}

absl::Status WorkerClient::WriteInitialRows(SliceUpload* upload, int task, std::vector<std::vector<int64_t>>* ids,
                                            std::vector<std::vector<float>>* rows) const {
  for (const SparseTableSpec& spec : config_.tables) {
    if (!spec.initial_values) continue;
    const InitialRows* given = nullptr;
    for (const InitialRows& r : initial_rows_) {
      if (r.table == spec.table) given = &r;
    }
    const size_t want = static_cast<size_t>(spec.rows) * spec.dim;
    if (given == nullptr || given->values == nullptr || given->values->size() != want) {
      return absl::FailedPreconditionError(absl::StrCat("sparse table '", spec.name, "' starts from initial values, "
                                                        "but the chief has no ", spec.rows, " x ", spec.dim,
                                                        " rows to give ps task ", task));
    }
    // The rows of the ids this task owns, in id order.
    std::vector<int64_t>& i = ids->emplace_back();
    std::vector<float>& r = rows->emplace_back();
    const float* values = given->values->data();
    for (int64_t id = 0; id < spec.rows; ++id) {
      if (ShardOfId(id, num_tasks()) != task) continue;
      i.push_back(id);
      r.insert(r.end(), values + id * spec.dim, values + (id + 1) * spec.dim);
    }
    RETURN_IF_ERROR(upload->WriteSparse(spec.table, i.data(), static_cast<int64_t>(i.size()), spec.dim,
                                        WireDtype::kF32, r.data()));
  }
  return absl::OkStatus();
}

TrainConfig WorkerClient::TaskConfig(int task) const {
  TrainConfig c = config_;
  c.slices = placement_[task];
  return c;
}

absl::Status WorkerClient::PrepareTasks(absl::Time give_up, absl::Duration wait) {
  int64_t move_step;
  {
    absl::MutexLock lock(&mu_);
    move_step = move_step_;
  }
  if (move_step >= 0) {
    ASSIGN_OR_RETURN(const MoveOutcome moved, MoveTasks(move_step, give_up, wait));
    if (moved == MoveOutcome::kMoved) return absl::OkStatus();
    // ps 0 restarted before every task held its share of the move's step (killed while it decided or saved it):
    // that step's checkpoint may lack ps 0's part. As after any restart, every task of the new set goes to the
    // newest step every one of them can restore (that step when ps 0's part was saved; an earlier checkpoint,
    // resharded, when it was not) and ps 0 takes the new set from the chief's config there (Adopt).
    LOG(WARNING) << "chief: ps task 0 restarted during the move at step " << move_step
                 << ": every ps task goes to the newest checkpoint step they can all restore, on the new set";
  }
  // What every task holds and could restore (waiting for tasks that are not up yet).
  std::vector<CheckpointProbe> probes(num_tasks());
  for (int t = 0; t < num_tasks(); ++t) {
    absl::Duration backoff = absl::Milliseconds(100);
    absl::Time next_log = absl::Now();
    while (true) {
      if (cancel_.cancelled()) return absl::CancelledError("connecting: cancelled");
      const absl::Time tried = absl::Now();  // given up only after a try that started past the deadline
      absl::StatusOr<CheckpointProbe> p = tasks_[t]->Probe(TaskConfig(t));
      if (p.ok()) {
        probes[t] = *std::move(p);
        break;
      }
      if (!Retryable(p.status())) return p.status();
      if (tried > give_up) {
        return absl::DeadlineExceededError(absl::StrCat("the chief gave up waiting for ps task ", t, " after ",
                                                        absl::FormatDuration(wait), " (", p.status().message(), ")"));
      }
      if (absl::Now() >= next_log) {
        LOG(INFO) << "chief waiting for ps task " << t << " (" << p.status().message() << ") " << Until(give_up, wait);
        next_log = absl::Now() + absl::Seconds(5);
      }
      absl::SleepFor(PauseBefore(give_up, backoff));
      backoff = std::min(backoff * 2, absl::Seconds(1));
    }
  }
  // Sync: a task behind ps 0 only lacks decisions ps 0 still relays when its step lies in
  // [first_relayable_step, ps 0's step] (a worker was stopped, killed or restarted between ps 0 deciding a step and
  // its pull carrying the decision to the other tasks): not a lost state. The pulls relay them, in order (this
  // chief's first pull asks for every logged decision). Tasks at ps 0's step agree.
  bool all_initialized = true, none_initialized = true, caught_up_by_pulls = true, any_checkpoint = false;
  for (const CheckpointProbe& p : probes) {
    all_initialized = all_initialized && p.initialized;
    none_initialized = none_initialized && !p.initialized;
    caught_up_by_pulls = caught_up_by_pulls && p.step <= probes[0].step && p.step >= probes[0].first_relayable_step;
    any_checkpoint = any_checkpoint || !p.restorable_steps.empty();
  }
  // Every task runs and agrees, or will once the pulls relay ps 0's decisions (async tasks count their own
  // updates: they need not agree).
  if (all_initialized && (caught_up_by_pulls || !sync_)) {
    for (int t = 1; sync_ && t < num_tasks(); ++t) {
      if (probes[t].step == probes[0].step) continue;
      LOG(INFO) << "chief: ps task " << t << " is at step " << probes[t].step << ", behind ps task 0 (step "
                << probes[0].step << "): it takes the decisions it lacks from the next pull";
    }
    return absl::OkStatus();
  }
  // A fresh start: Register and Initialize do it (a checkpoint that does not fit is refused there).
  if (none_initialized && !any_checkpoint) return absl::OkStatus();
  // Some task lost its state (restarted), or the cluster restarts from its checkpoints: every task goes to the
  // newest step that every task can restore.
  std::vector<int64_t> common = probes[0].restorable_steps;
  for (const CheckpointProbe& p : probes) {
    std::vector<int64_t> both;
    std::set_intersection(common.begin(), common.end(), p.restorable_steps.begin(), p.restorable_steps.end(),
                          std::back_inserter(both));
    common = std::move(both);
  }
  if (common.empty()) {
    std::string have;
    for (int t = 0; t < num_tasks(); ++t) {
      absl::StrAppend(&have, t == 0 ? "" : "; ", "ps task ", t, ": ",
                      probes[t].initialized ? absl::StrCat("running at step ", probes[t].step) : "no values",
                      ", checkpoints [", absl::StrJoin(probes[t].restorable_steps, ","), "]");
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "the ps tasks cannot be brought to one step: no checkpoint step is restorable on every task (", have,
        "). Restart every ps task with a --checkpoint_dir that holds a complete checkpoint, or an empty one"));
  }
  const int64_t k = common.back();
  // ps 0 last: a worker registers again with every task once ps 0 runs the new epoch, and only then pushes, so
  // ps 0 decides a step of the new epoch only on uploads the other tasks made after their own rollback. Restored
  // first, ps 0 could take a worker's commit for an upload that a later rollback of another task voided, and that
  // task could never apply the decision.
  for (int i = 1; i <= num_tasks(); ++i) {
    const int t = i % num_tasks();
    absl::Status s = tasks_[t]->Restore(TaskConfig(t), worker_id_, k);
    if (!s.ok()) return absl::Status(s.code(), absl::StrCat("restoring ps task ", t, " to step ", k, ": ", s.message()));
  }
  LOG(WARNING) << "chief: every ps task restored the checkpoint of step " << k
               << (none_initialized ? "" : " (a ps task had lost its state)");
  return absl::OkStatus();
}

absl::StatusOr<WorkerClient::MoveOutcome> WorkerClient::MoveTasks(int64_t step, absl::Time give_up,
                                                                   absl::Duration wait) {
  // Every task restores its share of the checkpoint of `step`, which every task of the old set saved as it applied
  // the step's decision (ps 0 marked it): NotFound while a part is still being written (ps 0's may be), tried again
  // until `give_up`. The tasks other than ps 0 at once, side by side (each reads the old parts it needs); ps 0 last,
  // as in PrepareTasks: it takes the new set only once every other task holds its share. No probe: reading every
  // checkpoint a task could restore costs as much as the move itself.
  const absl::Time started = absl::Now();
  // ps 0 writes its part of the move's checkpoint after the step's values went out (the other tasks wrote theirs
  // before their pulls answered): the new tasks read it, so it is waited for first.
  for (absl::Duration backoff = absl::Milliseconds(5);; backoff = std::min(backoff * 2, absl::Milliseconds(200))) {
    absl::StatusOr<TrainingStats> stats = tasks_[0]->GetStats();
    if (stats.ok() && stats->checkpoint_step >= step) break;
    // ps 0 holds the move's step from its decision on (it decides nothing past it until the move): behind it, it is
    // a ps 0 started again, with no state, which will never save that step.
    if (stats.ok() && stats->global_step < step) return MoveOutcome::kPs0Restarted;
    if (!stats.ok() && !Retryable(stats.status())) return stats.status();
    if (cancel_.cancelled()) return absl::CancelledError("moving onto other ps tasks: cancelled");
    if (absl::Now() > give_up) {
      return absl::DeadlineExceededError(absl::StrCat(
          "ps task 0 did not save the checkpoint of step ", step, " the job moves at within ",
          absl::FormatDuration(wait), stats.ok() ? absl::StrCat(" (its newest: step ", stats->checkpoint_step, ")")
                                                 : absl::StrCat(" (", stats.status().message(), ")")));
    }
    absl::SleepFor(backoff);
  }
  auto restore = [&](int t) -> absl::Status {
    absl::Duration backoff = absl::Milliseconds(20);
    while (true) {
      if (cancel_.cancelled()) return absl::CancelledError("moving onto other ps tasks: cancelled");
      const absl::Time tried = absl::Now();
      absl::Status s = tasks_[t]->Restore(TaskConfig(t), worker_id_, step);
      if (s.ok()) return s;
      if (!Retryable(s) && !absl::IsNotFound(s)) {
        return absl::Status(s.code(), absl::StrCat("moving ps task ", t, " onto ", num_tasks(), " ps tasks at step ",
                                                   step, ": ", s.message()));
      }
      if (tried > give_up) {
        return absl::DeadlineExceededError(absl::StrCat(
            "ps task ", t, " could not restore the checkpoint of step ", step, " the job moves from within ",
            absl::FormatDuration(wait), " (", s.message(), "): is --checkpoint_dir one directory that every ps "
            "task reads?"));
      }
      absl::SleepFor(backoff);
      backoff = std::min(backoff * 2, absl::Milliseconds(500));
    }
  };
  std::vector<absl::Status> restored(num_tasks());
  {
    std::vector<std::thread> others;
    for (int t = 1; t < num_tasks(); ++t) others.emplace_back([&, t] { restored[t] = restore(t); });
    for (std::thread& th : others) th.join();
  }
  for (int t = 1; t < num_tasks(); ++t) RETURN_IF_ERROR(restored[t]);
  RETURN_IF_ERROR(restore(0));
  LOG(WARNING) << "chief: the job moved onto " << num_tasks() << " ps task" << (num_tasks() == 1 ? "" : "s")
               << " at step " << step << " in " << absl::FormatDuration(absl::Now() - started)
               << " (every task restored its share of that step)";
  return MoveOutcome::kMoved;
}

std::string WorkerClient::restored_input_position() const {
  absl::MutexLock lock(&mu_);
  return restored_position_;
}

int64_t WorkerClient::join_step() const {
  absl::MutexLock lock(&mu_);
  return join_step_;
}

int64_t WorkerClient::registered_step() const {
  absl::MutexLock lock(&mu_);
  return registered_step_;
}

void WorkerClient::SetInputPosition(std::string position) { next_input_position_ = std::move(position); }

absl::Status WorkerClient::MoveTo(std::vector<PsInterface*> tasks, std::vector<std::vector<SliceSpec>> placement,
                                  const PsSet& set, absl::Duration wait) {
  if (tasks.empty() || tasks.size() != placement.size()) {
    return absl::InvalidArgumentError(absl::StrCat("moving onto ", tasks.size(), " ps tasks with a placement for ",
                                                   placement.size()));
  }
  // Async: every task applies a push on its own, so the job is cut where no push is half applied (StopForMove).
  int64_t step = set.step > 0 ? set.step : -1;
  if (!sync_ && step >= 0) RETURN_IF_ERROR(StopForMove(&step, tasks.size(), absl::Now() + wait, wait));
  // What is in flight ends first, and so do the lanes and the heartbeat, which use the old tasks.
  inflight_.Cancel();
  ReleasePullWrites();
  absl::Status push = WaitPush().status();
  absl::Status pull = FinishPull().status();
  VLOG(1) << "moving after push: " << push << ", pull: " << pull;
  if (cancel_.cancelled()) return absl::CancelledError("moving onto other ps tasks: cancelled");
  {
    absl::MutexLock lock(&mu_);
    heartbeat_stop_ = true;
    heartbeat_cv_.SignalAll();
  }
  if (heartbeat_.joinable()) heartbeat_.join();
  push_lanes_.clear();
  pull_lanes_.clear();
  {
    absl::MutexLock lock(&mu_);
    heartbeat_stop_ = false;
    move_step_ = step;
  }
  const int from = num_tasks();
  tasks_ = std::move(tasks);
  placement_ = std::move(placement);
  SetUpTasks();
  config_.num_ps = num_tasks();
  config_.ps_hosts = set.hosts;
  config_.ps_version = set.version;
  LOG(INFO) << "worker " << worker_id_ << ": moving from " << from << " onto " << num_tasks() << " ps tasks"
            << (step >= 0 ? absl::StrCat(" at step ", step) : std::string(" (the job moved before)"));
  absl::Status moved = Reconnect(wait);
  absl::MutexLock lock(&mu_);
  move_step_ = -1;
  return moved;
}

absl::Status WorkerClient::StopForMove(int64_t* step, size_t to, absl::Time give_up, absl::Duration wait) {
  // The push in flight lands on every task of the old set (it is in the cut), then ps 0 hears that this worker
  // pushes no more.
  const absl::Status push = WaitPush().status();
  VLOG(1) << "worker " << worker_id_ << " stops for the move after push: " << push;
  // One command to one task of the old set, asked again while it answers Unavailable (ps 0 waiting for workers
  // to stop), until `give_up`.
  auto ask = [&](int t, const ControlRequest& r) -> absl::StatusOr<std::string> {
    absl::Duration backoff = absl::Milliseconds(5);
    absl::Time next_log = absl::Now() + absl::Seconds(5);
    while (true) {
      if (cancel_.cancelled()) return absl::CancelledError("moving onto other ps tasks: cancelled");
      const absl::Time tried = absl::Now();
      absl::StatusOr<std::string> said = tasks_[t]->Control(r);
      if (said.ok() || !Retryable(said.status())) return said;
      if (tried > give_up) {
        return absl::DeadlineExceededError(absl::StrCat("moving onto other ps tasks: ", r.command, " on ps task ", t,
                                                        " did not succeed within ", absl::FormatDuration(wait), " (",
                                                        said.status().message(), ")"));
      }
      if (absl::Now() >= next_log) {
        LOG(INFO) << "worker " << worker_id_ << ": " << said.status().message() << " " << Until(give_up, wait);
        next_log = absl::Now() + absl::Seconds(5);
      }
      absl::SleepFor(PauseBefore(give_up, backoff));
      backoff = std::min(backoff * 2, absl::Milliseconds(200));
    }
  };
  // ps 0 restarted since it announced the move (it knows no move now, or no job yet): the change died with it.
  // Another worker goes on to the new set, where ps 0's Register sends it back to the job's set when the change
  // is gone (or has it wait for the move when it was asked again); the chief connects again to the old set, and
  // restores it as after any restart of ps 0 (a --join task asks again).
  auto lost = [&](const absl::Status& s) {
    return absl::AbortedError(absl::StrCat("ps task 0 restarted during the move onto ", to,
                                           " ps tasks (", s.message(), "): connecting again to the job's set"));
  };
  ControlRequest stop;
  stop.command = "stop-for-move";
  stop.worker = worker_id_;
  stop.reason = absl::StrCat("worker ", worker_id_);
  absl::StatusOr<std::string> stopped = ask(0, stop);
  if (!stopped.ok() && stopped.status().code() == absl::StatusCode::kFailedPrecondition) {
    if (!is_chief_) return absl::OkStatus();
    return lost(stopped.status());
  }
  RETURN_IF_ERROR(stopped.status());
  if (!is_chief_) return absl::OkStatus();
  // The chief: ps 0 cuts the job once every active worker stopped (its part saved at its step), then every other
  // task of the old set saves its part of that step, side by side.
  ControlRequest cut = stop;
  cut.command = "cut";
  absl::StatusOr<std::string> was_cut = ask(0, cut);
  if (!was_cut.ok() && was_cut.status().code() == absl::StatusCode::kFailedPrecondition) return lost(was_cut.status());
  RETURN_IF_ERROR(was_cut.status());
  ASSIGN_OR_RETURN(const TrainingStats stats, tasks_[0]->GetStats());
  if (stats.checkpoint_step != stats.global_step) {
    return absl::InternalError(absl::StrCat("ps task 0 cut the job for the move at step ", stats.global_step,
                                            " but its newest checkpoint is of step ", stats.checkpoint_step));
  }
  *step = stats.global_step;
  ControlRequest save = stop;
  save.command = "save-for-move";
  save.step = *step;
  std::vector<absl::Status> saved(tasks_.size());
  {
    std::vector<std::thread> others;
    for (size_t t = 1; t < tasks_.size(); ++t) {
      others.emplace_back([&, t] { saved[t] = ask(static_cast<int>(t), save).status(); });
    }
    for (std::thread& th : others) th.join();
  }
  for (const absl::Status& s : saved) RETURN_IF_ERROR(s);
  LOG(INFO) << "chief: the async job was cut at step " << *step << " for the move: every ps task saved its part";
  return absl::OkStatus();
}

absl::Status WorkerClient::Reconnect(absl::Duration wait) {
  // What is in flight belongs to the old sessions: end it now (a pull may wait on ps 0 for a step that needs
  // workers who are reconnecting themselves) and let it finish before connecting again.
  inflight_.Cancel();
  ReleasePullWrites();
  absl::Status push = WaitPush().status();
  absl::Status pull = FinishPull().status();
  VLOG(1) << "reconnecting after push: " << push << ", pull: " << pull;
  if (cancel_.cancelled()) return absl::CancelledError("reconnecting: cancelled");
  auto start_over = [this] {
    absl::MutexLock lock(&mu_);
    inflight_.Reset();  // nothing is in flight
    session_lost_ = absl::OkStatus();
    // The old push's failure was taken above: it must not fail the new sessions' waits (WaitForSparse, which a
    // sparse step calls before its BeginPush, and WaitPush with no push in flight would report it).
    push_status_ = absl::OkStatus();
  };
  start_over();
  absl::Status connected = Connect(config_, nullptr, wait);
  // A heartbeat of an old session may have been refused while Connect ran: Connect replaced every session.
  start_over();
  return connected;
}

void WorkerClient::HeartbeatLoop(absl::Duration every) {
  absl::MutexLock lock(&mu_);
  while (!cancel_.cancelled() && !heartbeat_stop_) {
    const absl::Time until = absl::Now() + every;
    while (!cancel_.cancelled() && !heartbeat_stop_ && !heartbeat_cv_.WaitWithDeadline(&mu_, until)) {
    }
    if (cancel_.cancelled() || heartbeat_stop_) break;
    const std::vector<uint64_t> sessions = sessions_;
    mu_.Unlock();
    std::vector<absl::Status> answers(num_tasks());
    for (int t = 0; t < num_tasks(); ++t) {
      if (sessions[t] != 0) answers[t] = tasks_[t]->Heartbeat(worker_id_, sessions[t]).status();
    }
    mu_.Lock();
    // Other failures are for the training thread to find: its next call to the task says what is wrong. But a
    // task that lost this worker's session may be one the training thread does not call while it waits (for a
    // step on ps 0 that needs every worker, one of them waiting for this chief to restore the task).
    for (int t = 0; t < num_tasks(); ++t) {
      if (IsJobEnded(answers[t]) && session_lost_.ok()) {
        // The run ended elsewhere: what the training thread waits for will not come; it stops.
        session_lost_ = absl::Status(answers[t].code(), absl::StrCat("ps task ", t, ": ", answers[t].message()));
        LOG(WARNING) << "worker " << worker_id_ << ": " << session_lost_.message() << "; ending the calls in flight";
        inflight_.Cancel();
        cv_.SignalAll();
      }
      if (answers[t].code() == absl::StatusCode::kAborted && sessions_[t] == sessions[t] && session_lost_.ok()) {
        session_lost_ = absl::AbortedError(absl::StrCat("heartbeat to ps task ", t, ": ", answers[t].message()));
        LOG(WARNING) << "worker " << worker_id_ << ": " << session_lost_.message() << "; ending the calls in flight";
        inflight_.Cancel();  // under mu_, so Reconnect's Reset cannot come between (its callbacks take no mu_)
        cv_.SignalAll();
      }
    }
  }
}

uint64_t WorkerClient::session(int task) {
  absl::MutexLock lock(&mu_);
  return sessions_[task];
}

}  // namespace dtrain::ps
