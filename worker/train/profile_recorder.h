// ProfileRecorder: what one training run costs, step by step and layer by layer, for scripts/plan_cluster.py
// to predict clusters nobody has run (dtrain_worker --profile_out=FILE; docs/planner.md). The training loop,
// the steps that push and pull (step_runner.h) and the in-process ps of local mode (ParameterServerOptions::
// on_update_timed) report to it; at the end it measures the ps's update costs on their own (the run's
// optimizer over the model's slices, one thread as dtrain_ps) and writes a versioned JSON file ("format":
// "dtrain-profile", "version": 1) with the transports' costs measured by its caller
// (worker/app/transport_probe.h).
//
// What a step records (warm-up steps excluded from every statistic): each layer's forward and backward time
// (a layer is a node with variables; the nodes without variables that follow it in forward order are counted
// with it), the compute (forward + backward, without the time spent in the transport's calls), the whole step
// (from one step's start to the next's: input, compute, push, update, pull), the input wait, the in-process
// ps's update, the process's CPU per step (its input threads included), and for models with tables the rows
// pushed per table.
//
// Usage (dtrain_worker):
//   ProfileRecorder profile;                       // at start: the run's clock starts here
//   options.profile = &profile;                    // RunTraining reports to it
//   ... RunTraining(options, tasks) ...
//   profile.MarkEnd();
//   profile.SetTransportCosts(MeasureTransports(...));
//   RETURN_IF_ERROR(profile.MeasurePsCosts());
//   RETURN_IF_ERROR(profile.Write("/tmp/mlp.profile.json"));
//
// Thread-safety: every method may be called from any thread (one mutex); the step hooks (TimeHooks) record
// only the calls of the thread that called ComputeBegin (tower 0's) for forward, any thread for gradients.
// Cost when no recorder is given: none (callers test the pointer).
#ifndef DTRAIN_WORKER_TRAIN_PROFILE_RECORDER_H_
#define DTRAIN_WORKER_TRAIN_PROFILE_RECORDER_H_

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "ps/api/ps_types.h"
#include "ps/client/placement.h"
#include "ps/core/parameter_server.h"
#include "worker/models/model.h"

namespace dtrain::worker {

// What a run is, as the profile describes it (set once by the training loop).
struct ProfiledRun {
  std::string model;
  int batch_size = 0;  // per tower
  int towers = 1;
  int threads = 1;   // the worker's --threads
  std::string mode;  // "local", "sync" or "async"
  std::string wire_dtype = "fp32";
  ps::OptimizerConfig optimizer;
  std::vector<ps::VariableInfo> variables;  // flat-buffer order
  struct Table {
    std::string name;
    int dim = 0;
    int64_t rows = 0;  // 0: hash-keyed
  };
  std::vector<Table> tables;
};

// The CPU one transport spends to move a model's bytes, per byte and side, measured on loopback
// (worker/app/transport_probe.h). All times in seconds.
struct TransportCost {
  std::string transport;                // "grpc", "shm" or "tcp" (TCP lanes)
  std::string skipped;                  // not empty: not measured, and why (the figures below are then 0)
  int64_t bytes = 0;                    // of one push and of one pull
  int exchanges = 0;                    // pushes timed, and pulls timed
  double push_worker_cpu_per_byte = 0;  // the worker sending a push
  double push_ps_cpu_per_byte = 0;      // the ps receiving it (its update subtracted)
  double pull_ps_cpu_per_byte = 0;      // the ps sending a pull
  double pull_worker_cpu_per_byte = 0;  // the worker receiving it
  double push_seconds = 0, pull_seconds = 0;  // median wall time of one push, one pull
  // A ps task's start (the process started to the worker connected and registered) and end (the worker done
  // to the process gone), the cluster's share of a run's wall-clock.
  double cluster_start_seconds = 0, cluster_end_seconds = 0;
  // The most bytes of a slice one message carries (the ps updates what has arrived message by message: with
  // the early apply a pull trails its push by one such piece). 0: unknown.
  int64_t stream_piece_bytes = 0;
  // A model with tables: steps that also pull and push each table's rows (as many as a step of the run had):
  // the rows per step, and what they add to a step of the dense parameters alone (its push and its pull):
  // wall seconds, the worker's CPU seconds and the ps's (its updates included). 0 rows: not measured.
  int64_t sparse_rows = 0;
  double sparse_extra_seconds = 0, sparse_worker_cpu_seconds = 0, sparse_ps_cpu_seconds = 0;
};

// Seconds of one update of `variables` (placed on one ps task) by `optimizer` on one thread, as dtrain_ps
// applies it, with `gradients` (1 to 4) summed in: the median of 3 to 50 updates (a quarter of a second)
// after one untimed. InvalidArgument for a bad optimizer or gradient count.
absl::StatusOr<double> TimeUpdate(const std::vector<ps::VariableInfo>& variables,
                                  const ps::OptimizerConfig& optimizer, int gradients);

class ProfileRecorder {
 public:
  struct Options {
    int warmup_steps = 10;        // the first steps, left out of every statistic
    int64_t max_samples = 20000;  // steps kept per series (the first ones after the warm-up)
  };
  ProfileRecorder() : ProfileRecorder(Options()) {}
  explicit ProfileRecorder(const Options& options);

  // ---- the training loop ----
  void SetRun(const ProfiledRun& run);
  // Seconds the loop waited for the current step's batches.
  void AddInputWait(double seconds);
  // Phases of the run: training ended (before the final evaluation), the final evaluation, the whole run
  // over.
  void MarkTrainEnd();
  void MarkEvaluation(bool begin);
  void MarkEnd();

  // ---- the steps that push and pull (one step: StepBegin, ComputeBegin, hooks, ComputeEnd, StepEnd) ----
  void StepBegin();
  void ComputeBegin();
  // Hooks that time each layer around `inner` (which stays in force; its calls count as transport time, not
  // compute). Valid while this recorder lives; use them between ComputeBegin and ComputeEnd.
  models::StepHooks TimeHooks(const models::StepHooks& inner);
  void ComputeEnd();
  void StepEnd();
  // Models with tables: the unique ids of table `table` this step pushed.
  void AddSparseRows(int table, int64_t ids);

  // ---- the in-process ps (ParameterServerOptions::on_update_timed) ----
  void AddUpdate(const ps::ParameterServerOptions::TimedUpdate& update);

  // ---- after the run ----
  // The ps's update cost per byte on its own: the run's optimizer over the model's slices (placement on one
  // task), one thread as dtrain_ps, with 1, 2 and 4 gradients summed (the slope: summing one more worker's
  // gradient). FailedPrecondition before SetRun; InvalidArgument for a bad optimizer.
  absl::Status MeasurePsCosts();
  void SetTransportCosts(std::vector<TransportCost> costs);
  const ProfiledRun& run() const { return run_; }
  // Models with tables: the median unique ids a step pushed, per table of run().tables (0 where none was
  // seen).
  std::vector<int64_t> SparseRowsPerStep() const;
  // The profile as JSON. FailedPrecondition when no step was measured past the warm-up (too few
  // --train_steps, or steps that do not push and pull: device-resident ones).
  absl::StatusOr<std::string> ToJson() const;
  absl::Status Write(const std::string& path) const;

  // Statistics of a sample, as written (exposed for tests): linear-interpolated quantile q in [0, 1].
  static double Quantile(std::vector<double> values, double q);

 private:
  using Clock = std::chrono::steady_clock;
  static double Secs(Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double>(b - a).count();
  }
  bool measuring() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return steps_seen_ > options_.warmup_steps; }
  bool keep() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return measuring() && steps_seen_ - options_.warmup_steps <= options_.max_samples;
  }

  const Options options_;
  mutable absl::Mutex mu_;
  ProfiledRun run_ ABSL_GUARDED_BY(mu_);
  bool have_run_ ABSL_GUARDED_BY(mu_) = false;
  const Clock::time_point created_;
  Clock::time_point first_step_ ABSL_GUARDED_BY(mu_), last_step_begin_ ABSL_GUARDED_BY(mu_),
      train_end_ ABSL_GUARDED_BY(mu_),
      eval_begin_ ABSL_GUARDED_BY(mu_), eval_end_ ABSL_GUARDED_BY(mu_), end_ ABSL_GUARDED_BY(mu_);
  bool have_train_end_ ABSL_GUARDED_BY(mu_) = false,
                       have_eval_ ABSL_GUARDED_BY(mu_) = false, have_end_ ABSL_GUARDED_BY(mu_) = false;
  int64_t steps_seen_ ABSL_GUARDED_BY(mu_) = 0;  // StepBegin calls
  // The process's CPU seconds when the first measured step began and when the last one ended, and the
  // measured steps that ended between them.
  double cpu_first_ ABSL_GUARDED_BY(mu_) = -1, cpu_last_ ABSL_GUARDED_BY(mu_) = -1;
  int64_t cpu_steps_ ABSL_GUARDED_BY(mu_) = 0;

  // The step in flight.
  std::thread::id compute_thread_ ABSL_GUARDED_BY(mu_);
  Clock::time_point compute_begin_ ABSL_GUARDED_BY(mu_), compute_end_ ABSL_GUARDED_BY(mu_);
  double input_wait_ ABSL_GUARDED_BY(mu_) = 0;
  double update_seconds_ ABSL_GUARDED_BY(mu_) = 0;
  struct Mark {
    int64_t begin, end;  // the layer's variables in the flat buffer
    Clock::time_point enter, exit;
  };
  std::vector<Mark> forward_ ABSL_GUARDED_BY(mu_), ready_ ABSL_GUARDED_BY(mu_);
  bool have_loss_ ABSL_GUARDED_BY(mu_) = false;
  Clock::time_point loss_enter_ ABSL_GUARDED_BY(mu_), loss_exit_ ABSL_GUARDED_BY(mu_);

  // Layers (by the flat offset where their variables begin), in forward order, and their samples.
  struct Layer {
    int64_t begin = 0, end = 0;
    std::vector<double> forward, backward;
  };
  std::vector<Layer> layers_ ABSL_GUARDED_BY(mu_);
  std::map<int64_t, int> layer_of_ ABSL_GUARDED_BY(mu_);
  std::vector<double> step_, compute_, forward_total_, backward_total_, transport_, input_,
      update_ ABSL_GUARDED_BY(mu_);
  // The in-process ps's updates.
  std::vector<double> dense_update_ ABSL_GUARDED_BY(mu_);   // seconds of each dense update
  std::vector<double> sparse_update_ ABSL_GUARDED_BY(mu_);  // seconds per row of each sparse update
  std::map<int, std::vector<double>> sparse_rows_ ABSL_GUARDED_BY(mu_);  // table -> unique ids per step
  std::map<int, int64_t> sparse_rows_now_ ABSL_GUARDED_BY(mu_);

  // MeasurePsCosts.
  bool have_ps_costs_ ABSL_GUARDED_BY(mu_) = false;
  double apply_per_byte_ ABSL_GUARDED_BY(mu_) = 0, sum_per_byte_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<double> apply_seconds_by_grads_ ABSL_GUARDED_BY(mu_);  // 1, 2, 4 gradients
  std::vector<TransportCost> transports_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dtrain::worker

#endif  // DTRAIN_WORKER_TRAIN_PROFILE_RECORDER_H_
