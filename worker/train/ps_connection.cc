#include "worker/train/ps_connection.h"

#include <glog/logging.h>

#include <algorithm>
#include <cstdio>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/env.h"
#include "common/status_macros.h"
#include "ps/core/train_config.h"
#include "worker/batch/table_spec.h"
#include "worker/models/graph.h"
#include "worker/models/model.h"
#include "worker/models/registry.h"
#include "worker/train/profile_recorder.h"

namespace dtrain::worker {

absl::Status SetUpConnection(const WorkerOptions& o, const std::vector<ps::PsInterface*>& tasks,
                             Towers* towers, Connection* c) {
  const bool local = tasks.empty();
  const bool chief = o.worker_id == 0;
  models::Model* model0 = towers->tower(0);
  std::vector<ps::VariableInfo> vars;
  for (const models::VariableInfo& v : model0->variables()) vars.push_back({v.name, v.size(), v.trainable});
  const int num_ps = local ? 1 : static_cast<int>(tasks.size());
  ps::PlacementOptions placement_options;
  placement_options.pieces_per_task = local ? 1 : o.slice_pieces_per_task;
  ASSIGN_OR_RETURN(c->placement, ps::PlaceVariables(vars, num_ps, placement_options));
  c->variables = vars;
  c->placement_options = placement_options;
  c->ps_hosts = o.ps_hosts;
  if (chief && !local && !o.quiet) LOG(INFO) << "variable placement:\n" << ps::FormatPlacement(c->placement);

  ps::TrainConfig& config = c->config;
  config.model_signature = models::ModelSignature(*o.resolved_model, model0->variables());
  config.mode = local ? "sync" : o.mode;
  config.num_workers = local ? 1 : o.num_workers;
  config.num_ps = num_ps;
  if (!local) config.ps_hosts = o.ps_hosts;
  config.replicas_to_aggregate = local ? 1 : o.replicas_to_aggregate;
  config.total_num_replicas = local ? 1 : o.total_num_replicas;
  config.max_staleness = o.max_staleness;
  ASSIGN_OR_RETURN(config.optimizer, OptimizerConfigOf(o));
  config.sparse_mode = o.sparse_mode;
  if (!local && !o.elastic_batch.empty()) {
    if (!model0->graph().tables.empty() && o.row_cache_rows > 0) {
      return absl::InvalidArgumentError(
          "--elastic_batch with --row_cache_rows: not together (a step whose workers changed pulls its rows again, "
          "past the cache)");
    }
    config.elastic_batch = o.elastic_batch;
    config.batch_unit = o.batch_size * towers->size();
    if (o.elastic_batch == "global") {
      config.global_batch = o.global_batch > 0 ? o.global_batch : config.batch_unit * o.num_workers;
    }
    RETURN_IF_ERROR(ps::CheckElasticConfig(config, config.num_workers));  // what ps 0 would refuse, said here
  }
  config.moving_average_decay = o.moving_average_decay;
  config.train_steps = o.train_steps;
  if (chief) config.model_flags = o.model_flags;
  const std::vector<models::TableInfo>& tables = model0->graph().tables;
  ASSIGN_OR_RETURN(const ps::RowDtype row_dtype, ps::ParseRowDtype(o.row_dtype));
  ASSIGN_OR_RETURN(const ps::RowDtype slot_dtype, ps::ParseRowDtype(o.row_slot_dtype));
  for (size_t t = 0; t < tables.size(); ++t) {
    ps::SparseTableSpec spec = TableSpecOf(tables[t], static_cast<uint32_t>(t), o.seed);
    spec.ttl_steps = o.row_ttl_steps;
    spec.ttl_secs = o.row_ttl_secs;
    spec.admit_probability = o.admit_probability;
    spec.row_dtype = row_dtype;
    spec.slot_dtype = slot_dtype;
    config.tables.push_back(std::move(spec));
  }
  if (!tables.empty()) {
    config.sparse_optimizer.name = o.sparse_optimizer;
    config.sparse_optimizer.learning_rate = o.sparse_learning_rate;
  }

  c->tasks = tasks;
  if (local) {
    ps::ParameterServerOptions po;
    po.num_workers = 1;
    po.checkpoint = o.checkpoint;
    po.delta = o.delta;
    if (po.delta.dir.empty()) po.delta.dir = o.checkpoint.dir;
    po.apply_threads = o.threads;
    if (o.profile != nullptr) {
      po.on_update_timed = [p = o.profile](const ps::ParameterServerOptions::TimedUpdate& u) { p->AddUpdate(u); };
    }
    po.trace = o.trace;  // local mode: the in-process ps's events on this worker's timeline
    ASSIGN_OR_RETURN(c->local_ps, ps::ParameterServer::Create(po));
    c->tasks = {c->local_ps.get()};
  }
  ps::WorkerClientOptions copt;
  copt.background = !local;  // an in-process ps answers inline: no transfer threads
  copt.keep_initial_values = !local;  // an in-process ps cannot restart on its own: no copy for a fresh start
  copt.step_timeout = absl::Seconds(o.step_timeout_secs);
  copt.retry_window = absl::Seconds(o.rpc_retry_secs);
  ASSIGN_OR_RETURN(copt.wire_dtype, ps::ParseWireDtype(o.wire_dtype));
  copt.apply_early = o.apply_early == "on" && !local;
  copt.trace = o.trace;
  if (!o.push_journal_dir.empty() && !local) {
    ASSIGN_OR_RETURN(c->push_journal, ps::PushJournal::Open(Env::Default(), o.push_journal_dir, o.worker_id));
    copt.push_journal = c->push_journal.get();
  }
  c->client = std::make_unique<ps::WorkerClient>(c->tasks, c->placement.task_slices, local ? 0 : o.worker_id,
                                                 chief, copt);
  return absl::OkStatus();
}

// Registers with the ps tasks; the chief's initial values (and the initial rows of tables from a file)
// initialize them (unless they restore a checkpoint).
// The flat parameters and gradients live in the towers' host buffers: CPU towers compute on them in place,
// GPU towers copy them (pinned memory).
absl::Status Connect(const WorkerOptions& o, Towers* towers, Connection* c) {
  float* params = towers->host_params();
  if (o.worker_id == 0) models::WriteInitialParameters(towers->tower(0)->variables(), o.seed, params);
  std::vector<ps::InitialRows> rows;  // tables from a file start from its values
  const std::vector<models::TableInfo>& tables = towers->tower(0)->graph().tables;
  for (size_t t = 0; t < tables.size(); ++t) {
    if (tables[t].initial_values != nullptr) rows.push_back({static_cast<uint32_t>(t), tables[t].initial_values});
  }
  return c->client->Connect(c->config, params, absl::Seconds(o.startup_wait_secs), std::move(rows));
}

// After connecting: a restored checkpoint says where this worker's input stream was at its step; reading on
// from there gives the batches an uninterrupted run would have. A position that does not fit this stream (another
// --batch_size or --seed, say) is reported and the stream starts over instead.
absl::Status ResumeInput(const WorkerOptions& o, Connection* c, data::BatchStream* stream) {
  const std::string position = c->client->restored_input_position();
  if (position.empty()) return absl::OkStatus();
  absl::Status s = stream->Restore(position);
  if (s.ok()) {
    if (!o.quiet) LOG(INFO) << "worker " << o.worker_id
                            << ": input resumes where ps 0 says it stopped (a restored checkpoint, or this "
                               "worker's newest commit)";
  } else if (s.code() == absl::StatusCode::kFailedPrecondition) {
    LOG(WARNING) << "worker " << o.worker_id << ": the checkpoint's input position does not fit this worker's "
                 << "input (" << s.message() << "): reading from the start of its shard instead";
  } else {
    return absl::Status(s.code(), absl::StrCat("the checkpoint's input position for worker ", o.worker_id, ": ",
                                               s.message()));
  }
  return absl::OkStatus();
}

// After a call failed with Aborted (`why`: a ps task restarted, rolled back or declared this worker lost):
// connects again (the chief restores every task to the newest common checkpoint) and resumes the input where
// that checkpoint left it.
absl::Status ConnectAgain(const WorkerOptions& o, Connection* c, data::BatchStream* stream, const absl::Status& why) {
  LOG(WARNING) << "worker " << o.worker_id << ": " << why.message() << "; connecting again";
  RETURN_IF_ERROR(c->client->Reconnect(absl::Seconds(o.startup_wait_secs)));
  return ResumeInput(o, c, stream);
}

// ps 0 announced a change of the job's ps tasks (`set`, from its step on): connects to the new set with the placement
// for its number of tasks (the chief first moves the state: WorkerClient::MoveTo), tells the tasks that left to go
// (chief), and resumes the input where the move's checkpoint left it. The caller pulls again, as after Reconnect.
absl::Status MoveToPsSet(const WorkerOptions& o, Connection* c, data::BatchStream* stream, const ps::PsSet& set) {
  if (!o.connect_ps || c->ps_hosts.size() != c->tasks.size()) {
    return absl::FailedPreconditionError(absl::StrCat("the job's ps tasks changed (", set.hosts.size(),
                                                      " now), and this worker cannot connect to other ps tasks"));
  }
  const absl::Time started = absl::Now();
  std::vector<ps::PsInterface*> tasks;
  for (size_t t = 0; t < set.hosts.size(); ++t) {
    const auto known = std::find(c->ps_hosts.begin(), c->ps_hosts.end(), set.hosts[t]);
    if (known != c->ps_hosts.end() && static_cast<size_t>(known - c->ps_hosts.begin()) == t) {
      tasks.push_back(c->tasks[t]);  // the same task at the same index: its connection stays
      continue;
    }
    ASSIGN_OR_RETURN(std::unique_ptr<ps::PsInterface> task, o.connect_ps(set.hosts[t], static_cast<int>(t)));
    tasks.push_back(task.get());
    c->joined_tasks.push_back(std::move(task));
  }
  ASSIGN_OR_RETURN(ps::Placement placement,
                   ps::PlaceVariables(c->variables, static_cast<int>(tasks.size()), c->placement_options));
  LOG(WARNING) << "worker " << o.worker_id << ": the job's ps tasks change at step " << set.step << ": "
               << c->tasks.size() << " -> " << tasks.size() << " (" << absl::StrJoin(set.hosts, ",") << ")";
  RETURN_IF_ERROR(c->client->MoveTo(tasks, placement.task_slices, set, absl::Seconds(o.startup_wait_secs)));
  // The tasks that left: the chief tells them to go (their share now lives on the others).
  if (o.worker_id == 0) {
    for (const std::string& gone : set.leaving) {
      for (size_t t = 0; t < c->ps_hosts.size(); ++t) {
        if (c->ps_hosts[t] != gone) continue;
        ps::ControlRequest retire;
        retire.command = "retire";
        retire.reason = absl::StrCat("the chief, after the job moved onto ", tasks.size(), " ps tasks");
        absl::StatusOr<std::string> said = c->tasks[t]->Control(retire);
        if (said.ok()) {
          LOG(INFO) << "chief: " << *said;
        } else {
          LOG(WARNING) << "chief: ps task " << t << " (" << gone << ") did not take its retirement: " << said.status();
        }
      }
    }
  }
  c->tasks = std::move(tasks);
  c->placement = std::move(placement);
  c->config.num_ps = static_cast<int>(c->tasks.size());
  c->config.ps_hosts = set.hosts;
  c->config.ps_version = set.version;
  c->ps_hosts = set.hosts;
  c->ps_version = set.version;
  if (o.worker_id == 0 && !o.quiet && set.step > 0) {
    // ps 0 restarted during the move: the new set went back to the newest checkpoint every task could restore.
    // An async job moves where ps 0 cut it (every worker stopped pushing), at or after the step it announced.
    const int64_t at = c->client->registered_step();
    const std::string back =
        at < set.step ? absl::StrCat(", back at step ", at, " (ps 0 restarted during the move)") : std::string();
    std::printf("step %lld: the job moved onto %zu ps task%s (%s) in %.2f s%s\n",
                static_cast<long long>(std::max(at, set.step)),
                c->tasks.size(), c->tasks.size() == 1 ? "" : "s", absl::StrJoin(set.hosts, ",").c_str(),
                absl::ToDoubleSeconds(absl::Now() - started), back.c_str());
    std::fflush(stdout);
  }
  return ResumeInput(o, c, stream);
}

}  // namespace dtrain::worker
