#include "worker/train/trainer_internal.h"

#include <glog/logging.h>

#include <algorithm>
#include <cstdio>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/file_util.h"
#include "common/status_macros.h"
#include "ps/client/worker_client.h"
#include "worker/models/onnx/onnx_export.h"
#include "worker/train/profile_recorder.h"

namespace dtrain::worker::trainer_internal {
namespace {

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

}  // namespace

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
    if (result->redrawn_steps > 0) {
      std::printf("worker %d: %lld step(s) drew their batches again (read ahead for another place; each pulled "
                  "its rows once more)\n",
                  o.worker_id, static_cast<long long>(result->redrawn_steps));
    }
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

}  // namespace dtrain::worker::trainer_internal
