// ps task 0 of an elastic job (TrainConfig::elastic_batch set): which workers each sync step counts on, which
// batches of the input each of them reads, and the log line of every change of membership.
//
// Sync: the step's plan (its workers) is fixed when the step before is decided, from the workers active then; a
// worker that joins (or comes back after it was lost) during a step counts from the next one (its join step), so
// that every worker of a step learns the same plan, and so its own batch, from its pull header. A worker that
// leaves during a step leaves a smaller step (the coordinator needs min(R, its workers that are still active)
// commits); the next plan goes without it. The input: the data set's one shuffled order, cut into batches of
// `unit` examples; "per_worker" plans give each of their workers one batch, the batches of workers whose gradient
// did not make it into the step go back and are handed out again first (the oldest first), so every batch is
// trained on exactly once; "global" steps take batch `step` whole and split its rows among the plan.
// A "global" step whose plan loses a worker that has not committed (it left, or was lost) is planned again
// (Replan): the step's workers still active split the whole batch among them and compute the step again, at the
// same parameters; the commits of the old split are set aside. So every step is the one batch, whoever left.
// Async: no plan; each pull takes a batch for the pulling worker alone; a worker that leaves (or is lost) gives
// back the batch it took last. A worker whose model has sparse tables reads a step ahead (it pulls the rows of its
// next batch with the pull before that step): ps 0 holds a second batch for it, named in each header
// (ElasticView::next_batch), which its next pull trains when that pull says it read it
// (PullRequest::elastic_read_ahead); a leaving worker gives back both.
//
// Thread-safety: thread-compatible; the ParameterServer guards it with its lock.
#ifndef DTRAIN_PS_CORE_ELASTIC_PLAN_H_
#define DTRAIN_PS_CORE_ELASTIC_PLAN_H_

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ps/api/ps_types.h"

namespace dtrain::ps {

class ElasticPlan {
 public:
  // `global`: "global" batches (else "per_worker"); `unit`: TrainConfig::batch_unit; `replicas_to_aggregate`:
  // the config's (0: follows the plan's workers); `global_batch`: TrainConfig::global_batch (0: `unit`).
  ElasticPlan(bool sync, bool global, int unit, int replicas_to_aggregate, int global_batch = 0);

  // The job (re)starts with `active` workers (a start, a restore): they are the plan, each given a batch.
  void Start(const std::vector<int>& active);
  // `worker` registered while the task is at `step` and `active` (without it) are active: the first step it counts
  // in (sync: `step` when it is already in the plan, or when nobody of the plan is active any more, else step + 1;
  // async: `step`).
  int64_t Join(int worker, int64_t step, const std::vector<int>& active);
  // Sync: whether `worker` counts in the current step (a commit from outside the plan is dropped).
  bool InPlan(int worker) const;
  // Sync: the commits the current step needs, of which `active` are still active: min(R, plan workers active).
  int Needed(const std::vector<int>& active) const;
  // Sync: step `decided` was decided with the gradients of `contributed`; the plan of step decided + 1 is `active`
  // (those whose join step has come). The batches of plan workers not in `contributed` go back. Returns the log
  // line of a change ("step 840: worker 3 joined (4 workers, aggregating 4, global batch 400)"), or "".
  std::string Advance(int64_t decided, const std::vector<int>& contributed, const std::vector<int>& active);
  // Sync "global": the current step `step` is planned again with the plan's workers that are still `active` (when
  // none is, with every active worker: those waiting to count from the next step take it up at once; the caller
  // knows one left without committing); returns the log line ("step 840: worker 3 left (3 workers,
  // aggregating 3, global batch 400); step 840 is computed again"), "" when the plan is unchanged.
  std::string Replan(int64_t step, const std::vector<int>& active);
  // Async: the active set may have changed (a join, a leave): the log line of the change at `step` ("" when it is
  // the same); a worker that left gives back its batch.
  std::string Changed(int64_t step, const std::vector<int>& active);
  // The header of a pull by `worker` answered at `step` (sync: the plan and its batches; async: with `take_batch`
  // the worker gets the next batch, else the view only describes the membership). `read_ahead`: async, the pull's
  // PullRequest::elastic_read_ahead (-1: the worker does not read ahead; else it gets the batch held for it, and
  // another is held for its next step).
  ElasticView View(int64_t step, int worker, bool take_batch, int64_t read_ahead = -1);

  bool global() const { return global_; }
  int64_t version() const { return version_; }
  const std::vector<int>& plan() const { return plan_; }
  int aggregating() const;
  int64_t global_batch() const;
  int64_t cursor() const { return cursor_; }  // the next batch never handed out

  // The input's state for checkpoints ("cursor" or "cursor:b1,b2,..."): the batches handed out but not trained on
  // yet count as given back, so a restored job hands them out again.
  std::string SaveState() const;
  // Restores SaveState()'s string: InvalidArgument when it is malformed (the state is then left as it was).
  absl::Status RestoreState(absl::string_view state);

 private:
  int64_t TakeBatch();
  void Assign();  // sync per_worker: a batch for every plan worker
  std::string Describe(int64_t step, const std::vector<int>& before, const std::vector<int>& after,
                       bool again = false) const;

  const bool sync_, global_;
  const int unit_, replicas_, global_batch_;
  std::vector<int> plan_;            // sync: the current step's workers; async: the active ones
  std::vector<int64_t> assigned_;    // sync per_worker: plan_[i] reads assigned_[i]
  std::map<int, int64_t> joins_;     // worker -> the first step it counts in (sync, not yet in the plan)
  std::map<int, int64_t> outstanding_;  // async: the batch each worker took last
  std::map<int, int64_t> reserved_;     // async, workers that read ahead: the batch held for the next step
  std::set<int64_t> returned_;       // batches given back, handed out again first
  int64_t version_ = 0;
  int64_t cursor_ = 0;
};

}  // namespace dtrain::ps

#endif  // DTRAIN_PS_CORE_ELASTIC_PLAN_H_
