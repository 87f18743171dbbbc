// ps task 0 of an elastic job (TrainConfig::elastic_batch set): which workers each sync step counts on, where in
// the input each of them reads, and the log line of every change of membership.
//
// Sync: the step's plan (its workers) is fixed when the step before is decided, from the workers active then; a
// worker that joins (or comes back after it was lost) during a step counts from the next one (its join step), so
// that every worker of a step learns the same plan, and so the same part of the step's batch, from its pull
// header. A worker that leaves during a step leaves a smaller step (the coordinator needs min(R, its workers that
// are still active) commits); the next plan goes without it. The input: the data set's one shuffled order, cut
// into batches of `unit` examples; "per_worker" steps take one batch per worker of the plan (the cursor moves by
// the plan's size), "global" steps take batch `step` whole and split its rows among the plan.
// Async: no plan; each pull takes the next batch of the order for the pulling worker alone.
//
// Thread-safety: thread-compatible; the ParameterServer guards it with its lock.
#ifndef DTRAIN_PS_CORE_ELASTIC_PLAN_H_
#define DTRAIN_PS_CORE_ELASTIC_PLAN_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "ps/api/ps_types.h"

namespace dtrain::ps {

class ElasticPlan {
 public:
  // `global`: "global" batches (else "per_worker"); `unit`: TrainConfig::batch_unit; `replicas_to_aggregate`:
  // the config's (0: follows the plan's workers).
  ElasticPlan(bool sync, bool global, int unit, int replicas_to_aggregate);

  // The job (re)starts at `step` with `active` workers (a start, a restore): they are the plan.
  void Start(int64_t step, const std::vector<int>& active);
  // `worker` registered while the task is at `step` and `active` (without it) are active: the first step it counts
  // in (sync: `step` when it is already in the plan, or when nobody of the plan is active any more, else step + 1;
  // async: `step`).
  int64_t Join(int worker, int64_t step, const std::vector<int>& active);
  // Sync: the commits step `step` needs, of which `active` are still active: min(R, plan workers still active).
  int Needed(const std::vector<int>& active) const;
  // Sync: step `decided` was decided; the plan of step decided + 1 is `active` (those whose join step has come).
  // Returns the log line of a change ("step 840: worker 3 joined (4 workers, aggregating 4, global batch 400)"),
  // or "" when the plan stays.
  std::string Advance(int64_t decided, const std::vector<int>& active);
  // Async: a worker joined or left: the log line of the change at `step` ("" when the active set is the same).
  std::string Changed(int64_t step, const std::vector<int>& active);
  // The header of a pull answered at `step` (sync: the plan and its batch; async: `take_batch` gives the pulling
  // worker the next batch of the order, else the view only describes the membership).
  ElasticView View(int64_t step, int worker, bool take_batch);

  int64_t version() const { return version_; }
  const std::vector<int>& plan() const { return plan_; }
  int aggregating() const;
  int64_t global_batch() const;

  // The cursor (per_worker sync: the first batch of the current step; async: the next batch to hand out), kept in
  // checkpoints so a restored job reads on where it was.
  int64_t cursor() const { return cursor_; }
  void set_cursor(int64_t cursor) { cursor_ = cursor; }

 private:
  std::string Describe(int64_t step, const std::vector<int>& before, const std::vector<int>& after) const;

  const bool sync_, global_;
  const int unit_, replicas_;
  std::vector<int> plan_;            // sync: the current step's workers; async: the active ones
  std::map<int, int64_t> joins_;     // worker -> the first step it counts in (sync, not yet in the plan)
  int64_t version_ = 0;
  int64_t cursor_ = 0;
};

}  // namespace dtrain::ps

#endif  // DTRAIN_PS_CORE_ELASTIC_PLAN_H_
