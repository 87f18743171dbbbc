// WorkerClient: a worker's side of the protocol (ps/api/ps_types.h), in one place (the role of ps-lite's
// KVWorker).
// It maps the model's flat parameter/gradient buffers onto the slices placed on each ps task and moves them
// with overlap: gradients are pushed layer by layer while backward still runs, parameters are pulled in
// forward order while the next forward pass already consumes the first layers.
//
// Every ps task gets two lanes (SerialExecutor): one for its uploads, one for its pulls; with
// `background = false` (in-process ps tasks) everything runs inline in the caller's thread instead, and so do
// the calls of a task that prefers it (PsInterface::PrefersInlineCalls: one reached through shared memory).
//
// One step, overlapped:
//   client.BeginPush(step, grads);                   // grads: flat, unchanged until the push is done
//   ... backward ... client.PushRange(begin, end);   // each layer's gradients as soon as they are final
//   client.FinishPush();                             // the commit on ps 0, after every other task has all
//   client.StartPull(step + 1, step, params);        // sync: min_step = step + 1
//   ASSIGN_OR_RETURN(PullResult next, client.WaitPullHeader());
//   ... forward: before each layer, RETURN_IF_ERROR(client.WaitForRange(begin, end)); ...
//   ASSIGN_OR_RETURN(PushResponse verdict, client.WaitPush());
//   ASSIGN_OR_RETURN(next, client.FinishPull());
// Whole-buffer calls (Push, Pull) do the same without overlap. When ps 0 is reached inline (shared memory),
// FinishPush only sends its commit (SliceUpload::StartFinish): StartPull sends the pull right behind it and
// reads the commit's answer once the pull has ended (or WaitPush does, when no pull follows), so the step
// sleeps once for both.
//
// Where ps 0 applies the push as it arrives (the early apply: sync, one worker, one ps task, granted to the last
// pull), the next pull need not wait for FinishPush: once every tower is past its forward pass (at the first
// PushRange), StartPullBesidePush sends it beside the push, so that it streams the new values back while the push
// still uploads. Its values are written into `params` only once FinishPush (or AbandonPush) says backward no
// longer reads them; until then they wait in the transport's buffers.
//
// Sparse embedding tables (TrainConfig::tables): a step pulls only the rows of its batch's ids and pushes only
// their gradients. The caller deduplicates the ids (one entry per id) and sums the gradients per id; the client
// splits them over the ps tasks by ShardOfId (one request per task, in the same pull as the slices), and puts
// each pulled row back at its id's position:
//   std::vector<int64_t> ids = UniqueIds(batch);           // the next batch's, before StartPull
//   std::vector<float> rows(ids.size() * dim);
//   RETURN_IF_ERROR(client.SetSparsePull({{table, ids.data(), (int64_t)ids.size(), rows.data()}}));
//   client.StartPull(step + 1, step, params);
//   ... RETURN_IF_ERROR(client.WaitForSparse(table));  // rows[i * dim, (i + 1) * dim) is ids[i]'s row ...
//   ... backward: row gradients summed per id into row_grads ...
//   RETURN_IF_ERROR(client.BeginPush(step, grads));
//   RETURN_IF_ERROR(client.PushSparse(table, ids.data(), ids.size(), row_grads.data()));  // before FinishPush
//   client.FinishPush();
// Rows travel after the slices of each task. The rows of ids a task has not admitted yet arrive as zeros, and
// their gradients are dropped there (ps/core/sparse_store.h).
//
// Gradient clipping (TrainConfig's optimizer.clip_norm > 0): FinishPush computes the L2 norm of the whole flat
// gradient's trainable slices and sends it to every task after its slices (SliceUpload::SetGradientNorm), so
// that every task scales this worker's gradient by the same factor.
//
// Retries: uploads and pulls failing with Unavailable or DeadlineExceeded (a task restarting, a broken
// connection) are retried with exponential backoff for `retry_window`; a retried upload reuses its request id
// and writes again every slice it had sent (the ps applies each at most once). The window is judged by when a
// failed try started: a process paused past it (SIGSTOP) tries once more when it wakes.
//
// Wire compression: with wire_dtype bf16/fp16 the gradients are rounded with error feedback (the rounding
// error of each step is added to the next step's gradient) and the parameters are rounded when pulled. Sparse
// rows are rounded both ways too, but their gradients without error feedback: a residual could only be added
// the next time the same id is pushed, often many steps later, and keeping one per id ever pushed would cost
// memory in proportion to the table (round to nearest even is unbiased on average).
//
// Thread-safety: one thread (the training loop) calls the methods; the lanes are internal.
#ifndef DTRAIN_PS_CLIENT_WORKER_CLIENT_H_
#define DTRAIN_PS_CLIENT_WORKER_CLIENT_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/cancellation.h"
#include "common/serial_executor.h"
#include "common/trace_recorder.h"
#include "ps/api/ps_interface.h"
#include "ps/api/ps_types.h"
#include "ps/client/push_journal.h"

namespace dtrain::ps {

struct WorkerClientOptions {
  bool background = true;  // lanes on threads (gRPC tasks); false: inline (in-process tasks)
  // How long a pull may wait for its step (another worker's gradients), and any other wait of a step.
  absl::Duration step_timeout = absl::Seconds(120);
  // How long uploads and pulls are retried on Unavailable/DeadlineExceeded before giving up.
  absl::Duration retry_window = absl::Seconds(30);
  absl::Duration initial_backoff = absl::Milliseconds(50);
  absl::Duration max_backoff = absl::Seconds(2);
  WireDtype wire_dtype = WireDtype::kF32;
  // Not owned (may be null): every push ps 0 acknowledges is recorded there (ps/client/push_journal.h), once, by
  // the first WaitPush that sees it complete.
  PushJournal* push_journal = nullptr;
  // The chief keeps a copy of Connect's initial values (and rows) for a Reconnect that finds every task fresh
  // (the ps tasks restarted before any checkpoint). false: it reads them in place during Connect and keeps
  // nothing (local mode, whose in-process ps cannot restart on its own: a large model's parameters are not held
  // once more); a later fresh start is then FailedPrecondition.
  bool keep_initial_values = true;
  // Commits ask ps 0 to apply the push as it arrives (PushHeader::apply_early), so that the pull behind it
  // streams the new values while the push is still uploading (where ps 0 can: one worker, one ps task, sync).
  // Such a pull's slices count as arrived (WaitForRange) only once it ended OK: a push that fails takes them back.
  bool apply_early = false;
  // Not owned (may be null): the pushes and pulls of the steps in its window on the timeline (per slice and per
  // ps task, on the lanes' threads; common/trace_recorder.h), and the clock offset to each task measured at
  // registration (RegisterResponse::clock_ns).
  TraceRecorder* trace = nullptr;
};

struct PullResult {
  int64_t step = 0;            // global step of the parameters pulled
  bool training_done = false;  // every worker reported done
  ElasticView elastic;         // ps 0 of an elastic job: who the step counts on, which input this worker reads
  PsSet ps_set;                // ps 0: the job's ps tasks when they changed (MoveTo), version 0 otherwise
};

// The rows of one sparse table a pull brings: ids[0, n) (unique) into rows[0, n * dim), row i for ids[i]. Both
// stay valid, and rows untouched by the caller, until the pull has finished (FinishPull) or WaitForSparse for
// the table has returned.
struct SparsePullRequest {
  uint32_t table = 0;
  const int64_t* ids = nullptr;
  int64_t n = 0;
  float* rows = nullptr;
};
// The gradients of one sparse table a push brings: grads[i * dim, (i + 1) * dim) for ids[i] (unique ids,
// gradients summed per id over the batch).
struct SparseGradients {
  uint32_t table = 0;
  const int64_t* ids = nullptr;
  int64_t n = 0;
  const float* grads = nullptr;
};

// The chief's initial rows of a table with initial values (SparseTableSpec::initial_values): rows * dim floats,
// id i's row at [i * dim, (i + 1) * dim).
struct InitialRows {
  uint32_t table = 0;
  std::shared_ptr<const std::vector<float>> values;
};

class WorkerClient {
 public:
  // tasks[i] talks to ps task i (not owned, must outlive the client); placement[i] = the slices held by task i
  // (ps/client/placement.h), in key order.
  WorkerClient(std::vector<PsInterface*> tasks, std::vector<std::vector<SliceSpec>> placement, int worker_id,
               bool is_chief, WorkerClientOptions options = {});
  ~WorkerClient();  // cancels what is in flight and joins the lanes

  // Registers with every task (the chief's config is adopted by each task; others' are checked) and makes sure
  // every task holds values of one step. The chief first asks every task what it holds and could restore
  // (Probe): when some task lost its state (it restarted) or the cluster restarts from its checkpoints, it
  // restores every task to the newest step that every task can restore; on a fresh start it initializes the
  // tasks from `initial_params` (flat) and `initial_rows` (the tables with initial values: each task the rows of
  // the ids it owns; kept, as the parameters are, for a later Reconnect). Other workers wait until the chief
  // has. Waits for late ps tasks and for the chief with backoff, logging what it waits for, up to `wait`.
  // FailedPrecondition on config mismatch, when no step is restorable everywhere, or when a table with initial
  // values has none here (not retried). Starts the heartbeats when the tasks hold leases.
  absl::Status Connect(const TrainConfig& config, const float* initial_params, absl::Duration wait,
                       std::vector<InitialRows> initial_rows = {});
  // After a call failed with Aborted (a task restarted, rolled back, or declared this worker lost): lets what
  // is in flight end and connects again (the chief restoring the tasks as Connect does). Then pull.
  absl::Status Reconnect(absl::Duration wait);
  // Moves the client onto another set of ps tasks (a change of the job's ps set that ps 0 announced, PsSet):
  // what is in flight ends, the tasks (not owned; they must outlive the client or the next MoveTo) and their
  // placement replace the old ones, and the client connects again as Reconnect does. The chief moves the state
  // first: every task restores the checkpoint of `step` (which every old task saved), resharded onto the new
  // number of tasks, ps 0 last. The caller then pulls from `step` on, as after Reconnect.
  // `set.step` 0: the set changed before (this worker missed it: ps 0 refused its registration); nothing moves,
  // the client connects to it as Reconnect does.
  absl::Status MoveTo(std::vector<PsInterface*> tasks, std::vector<std::vector<SliceSpec>> placement,
                      const PsSet& set, absl::Duration wait);
  // After Connect / Reconnect: where ps 0 says this worker's input stream resumes (the position its restored
  // checkpoint holds, or else the one this worker's newest commit carried; BatchStream::Restore takes it), or
  // empty: keep reading where you are.
  std::string restored_input_position() const;
  // After Connect / Reconnect: the first step this worker counts in (ps 0 of an elastic sync job: a worker that
  // joins a running job starts at the next step boundary), 0: at once. Its first pull waits for it.
  int64_t join_step() const;
  // After Connect / Reconnect / MoveTo: the global step ps 0 was at when this worker registered (a move's step, or
  // an earlier checkpoint's when ps 0 restarted during the move).
  int64_t registered_step() const;
  // The input stream's position after the batches of the step about to be pushed (BatchStream::SaveState()):
  // sent with that push's commit, for checkpoints. Call before BeginPush.
  void SetInputPosition(std::string position);

  // ---- one step, overlapped (see the example above) ----
  // Starts the push of the gradients computed at `step`, read from `grads` (flat) until the push is done. Waits
  // for the previous push first.
  absl::Status BeginPush(int64_t step, const float* grads);
  // The gradients in flat range [begin, end) are final: sends the slices inside it.
  void PushRange(int64_t begin, int64_t end);
  // Every gradient is final: sends what is left and commits on ps 0 once every other task has the push.
  void FinishPush();
  // Instead of FinishPush, when the step failed before its gradients were all final: the uploads begun are
  // cancelled (no task commits or applies an unfinished upload) and the push completes with `why`, so that
  // WaitPush (and Reconnect) do not wait for a push that would never finish.
  void AbandonPush(absl::Status why);
  // Whether the pushes that start from now on ask for the early apply (WorkerClientOptions::apply_early; a worker
  // that measures which is faster switches it between steps). Any thread.
  void set_apply_early(bool on) { apply_early_.store(on); }
  // Waits for the push to complete; returns ps 0's verdict.
  absl::StatusOr<PushResponse> WaitPush();
  // Between BeginPush and FinishPush, in sync training: when ps 0 streamed the pull in flight behind its push
  // (it granted the early apply), and this push asks for it too, finishes that pull (it must have been read:
  // call this once no tower reads it any more) and starts the next one, as StartPull does, now; true then.
  // Its values reach `params` only after FinishPush or AbandonPush. Otherwise (false, or an error from finishing
  // the pull in flight) nothing is started: call StartPull after FinishPush as usual. Not with sparse rows.
  absl::StatusOr<bool> StartPullBesidePush(int64_t min_step, int64_t since_step, float* params);
  // Starts pulling the parameters (or their moving averages) into `params` (flat). `min_step`: wait until the
  // global step reaches it (sync: last pushed step + 1). `since_step`: the step of the previous pull
  // (decisions from it on are relayed). In async mode it starts after the push in flight has completed.
  void StartPull(int64_t min_step, int64_t since_step, float* params, bool moving_averages = false);
  // Waits for ps 0's answer (the step the parameters belong to).
  absl::StatusOr<PullResult> WaitPullHeader();
  // Waits until the parameters in flat range [begin, end) have arrived.
  absl::Status WaitForRange(int64_t begin, int64_t end);
  // Waits until every parameter (and every sparse row) has arrived.
  absl::StatusOr<PullResult> FinishPull();

  // ---- sparse tables (after Connect; see the example above) ----
  // The rows the next StartPull (or Pull) brings besides the slices; the pull after it brings none unless this
  // is called again. InvalidArgument for a table the config lacks or a table named twice (ids are checked by
  // the ps tasks: an id outside a fixed-size table fails the pull with InvalidArgument).
  // `read_only`: the rows are read without changing the tables (evaluation, export: PullRequest::
  // sparse_read_only).
  absl::Status SetSparsePull(std::vector<SparsePullRequest> requests, bool read_only = false);
  // An async elastic job's worker that reads ahead: the batch its next pulls from ps 0 say it drew
  // (PullRequest::elastic_read_ahead; -2: none yet). -1 (the default): it does not read ahead.
  void SetElasticReadAhead(int64_t batch) { elastic_read_ahead_.store(batch, std::memory_order_relaxed); }
  // Waits until the rows of `table` have arrived from every task (at once when the pull did not ask for it).
  absl::Status WaitForSparse(uint32_t table);
  // Between BeginPush and FinishPush: sends the row gradients of `table` (grads: n * dim floats), split by
  // task. Copied before it returns (the caller may reuse ids and grads). May be called for several tables, and
  // several times for one (with other ids). InvalidArgument for an unknown table, FailedPrecondition outside a
  // push.
  absl::Status PushSparse(uint32_t table, const int64_t* ids, int64_t n, const float* grads);

  // ---- whole buffers ----
  absl::StatusOr<PushResponse> Push(int64_t step, const float* grads);
  absl::StatusOr<PullResult> Pull(int64_t min_step, int64_t since_step, float* params,
                                  bool moving_averages = false);
  // With sparse tables: the push with their gradients, the pull with their rows.
  absl::StatusOr<PushResponse> Push(int64_t step, const float* grads, const std::vector<SparseGradients>& sparse);
  absl::StatusOr<PullResult> Pull(int64_t min_step, int64_t since_step, float* params,
                                  std::vector<SparsePullRequest> sparse, bool read_only = false);

  // Tells every task this worker is leaving, as `leaving` says (ps_types.h), having reached `global_step` (0:
  // unknown), for `reason` (one line; empty when completed). `retry`: how long an unreachable task is retried
  // (0: the transport's default); a worker leaving after a failure passes a few seconds.
  absl::Status Done(Leaving leaving = Leaving::kCompleted, int64_t global_step = 0, std::string reason = "",
                    absl::Duration retry = absl::ZeroDuration());
  absl::StatusOr<TrainingStats> Stats(int task);  // stats of one task (0 = coordinator)
  int num_tasks() const { return static_cast<int>(tasks_.size()); }
  // The longest lease a task gave at the last Connect (zero: none): a worker silent this long is declared lost.
  absl::Duration lease() const;
  // Ends everything in flight and every wait, for good (Cancelled): a worker stopping (SIGTERM) that cannot
  // finish its step in time. Done still reaches the tasks. Any thread.
  void Stop() { cancel_.Cancel(); }

 private:
  // The step in progress is in the trace's window.
  bool tracing() const { return options_.trace != nullptr && options_.trace->active(); }
  struct Slice {
    SliceSpec spec;
    int task = 0;
  };
  struct TaskPush;
  struct TaskPull;
  class Receiver;
  // One table's part of a push for one task: its ids and gradient rows (encoded when the wire type is narrow).
  struct SparsePart {
    uint32_t table = 0;
    int dim = 0;
    std::vector<int64_t> ids;
    std::vector<float> grads;
    std::vector<char> encoded;
  };
  // One table of the pull in flight: which ids each task brings, and where their rows go.
  struct SparsePull {
    uint32_t table = 0;
    int dim = 0;
    float* rows = nullptr;                       // the caller's
    std::vector<std::vector<int64_t>> ids;       // per task
    std::vector<std::vector<int64_t>> position;  // per task: index of each id in the caller's list
    std::vector<std::vector<float>> scratch;     // per task: rows as they arrive (several tasks only)
  };

  // Runs `job` on `lane` of `task`: on its thread, or in the calling thread when the task prefers inline calls.
  void RunOn(SerialExecutor* lane, int task, std::function<void()> job);
  // Lane jobs.
  void SendSlices(int task, std::vector<int> slices);
  void SendSparse(int task, SparsePart* part);
  // A new upload for the push in flight to `task`, with everything sent so far written again (a retry).
  absl::Status Reopen(int task);
  absl::Status WriteSparsePart(int task, const SparsePart& part);
  void SparseArrived(int index) ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<SparseIds> SparseRequest(int task) const;
  // Sends what is left of the push to `task` and ends it: with `defer` (task 0, on the training thread) only
  // sends the commit when the upload can (SliceUpload::StartFinish), leaving its outcome to CompleteStartedCommit.
  void FinishTaskPush(int task, bool defer = false);
  // Finish (with retries) and the bookkeeping of a task's upload. `norm_sent`: the upload in hand carries the
  // gradient norm already; `first_error`: the first try fails with it (a norm that could not be sent).
  void CompleteTaskPush(int task, bool norm_sent, absl::Status first_error = absl::OkStatus());
  // Reads the outcome of a commit FinishTaskPush only sent (training thread; nothing when none is pending).
  void CompleteStartedCommit();
  void AbandonTaskPush(int task, const absl::Status& why);
  // `complete_commit`: the commit before this pull is only sent; read its outcome after the first try.
  void RunTaskPull(int task, PullRequest request, bool complete_commit = false);
  absl::Status OpenUpload(int task) ABSL_LOCKS_EXCLUDED(mu_);
  // `s`, or the reason the heartbeat thread found the session lost when `s` is an error.
  absl::Status Explain(absl::Status s) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !s.ok() && !session_lost_.ok() ? session_lost_ : s;
  }
  TrainConfig TaskConfig(int task) const;
  void SetUpTasks();  // the per-task state for tasks_ and placement_ (constructor, MoveTo)
  // The chief's part of MoveTo: every task restores its share of the move's checkpoint of `step`. kPs0Restarted:
  // ps 0 came back without its state before its part of that checkpoint was known saved (PrepareTasks then brings
  // every task to the newest step all can restore, as after any restart).
  enum class MoveOutcome { kMoved, kPs0Restarted };
  // MoveTo's first part in an async job: the push in flight lands, ps 0 hears that this worker stopped pushing to the
  // old set, and the chief has ps 0 cut the job once every worker has and every old task save its part of the cut's
  // step, which it returns in `step` (the move's step; ps 0 fixed another when the change was asked for). `to`: the
  // new set's size. Aborted for the chief when ps 0 restarted meanwhile (the change died with it).
  absl::Status StopForMove(int64_t* step, size_t to, absl::Time give_up, absl::Duration wait);
  absl::StatusOr<MoveOutcome> MoveTasks(int64_t step, absl::Time give_up, absl::Duration wait);
  // Connect's work once the initial values are in place (Reconnect's too).
  absl::Status ConnectTasks(absl::Duration wait);
  absl::Status PrepareTasks(absl::Time give_up, absl::Duration wait);
  void HeartbeatLoop(absl::Duration every);
  uint64_t session(int task) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status WriteSlice(int task, int slice);
  // Writes the slice's values (gradients, encoded as `dtype`) to the task's upload; chunk by chunk when traced.
  absl::Status WriteSliceData(int task, int slice, WireDtype dtype, const void* data);
  // Initialize: the initial rows `task` owns of every table with initial values (kept in *buffers until the
  // upload has finished).
  absl::Status WriteInitialRows(SliceUpload* upload, int task, std::vector<std::vector<int64_t>>* ids,
                                std::vector<std::vector<float>>* rows) const;
  template <typename Op>
  absl::Status WithRetries(const char* what, int task, Op op);

  // Slices (global index) whose range lies in [begin, end).
  std::vector<int> SlicesIn(int64_t begin, int64_t end) const;
  void OnPullHeader(const PullHeader& header) ABSL_LOCKS_EXCLUDED(mu_);
  void SliceArrived(int slice) ABSL_LOCKS_EXCLUDED(mu_);
  // Pull lanes, before writing pulled values: waits while StartPullBesidePush holds them.
  absl::Status AwaitPullWritable() ABSL_LOCKS_EXCLUDED(mu_);
  void ReleasePullWrites() ABSL_LOCKS_EXCLUDED(mu_);
  void TaskPullDone(int task, absl::Status status) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status AwaitWithDeadline(const absl::Condition& condition, const char* what)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  std::vector<PsInterface*> tasks_;                   // replaced only by MoveTo, with no lane running
  std::vector<std::vector<SliceSpec>> placement_;
  const int worker_id_;
  const bool is_chief_;
  const WorkerClientOptions options_;
  std::atomic<bool> apply_early_;  // set_apply_early; starts as options_.apply_early
  std::vector<Slice> slices_;           // every slice, in flat order (== key order)
  std::vector<int> slice_of_key_;       // key -> index in slices_
  std::vector<std::vector<int>> task_slices_;  // task -> indices into slices_
  bool sync_ = true;
  TrainConfig config_;         // from Connect (its slices per task: placement_)
  std::vector<float> initial_;  // the chief's initial values (Connect), for a fresh start
  // What a fresh start writes: initial_, or during Connect without keep_initial_values the caller's buffer
  // (null after it).
  const float* initial_values_ = nullptr;
  std::vector<InitialRows> initial_rows_;  // and its tables' initial rows
  uint64_t next_request_id_;
  std::vector<std::unique_ptr<SerialExecutor>> push_lanes_, pull_lanes_;
  Cancellation cancel_;  // cancels in-flight pulls and uploads when the client goes away
  // Carried by every pull and upload (cancelled with cancel_, and by Reconnect: a pull waiting on ps 0 for a
  // step that will not come under the old sessions must not hold the reconnect up for a step timeout).
  Cancellation inflight_;
  // Set by the heartbeat thread when a task answers Aborted for a session still in use (it restarted, rolled
  // back, or declared this worker lost): the calls in flight are cancelled and the waits return this status, so
  // that the training thread reconnects instead of waiting, say, for a step that needs this very task. (The
  // waits themselves still wait for what is in flight: cancelled, it ends at once.)
  absl::Status session_lost_ ABSL_GUARDED_BY(mu_);

  // Error feedback for compressed gradients: residual (flat) and the encoded send buffer.
  std::vector<float> residual_;
  std::vector<char> encoded_;

  mutable absl::Mutex mu_;
  absl::CondVar cv_;
  // The heartbeat thread's own (signalled only on cancel): cv_ is signalled several times a step, and waking the
  // heartbeat thread each time cost a thread switch per signal.
  absl::CondVar heartbeat_cv_;
  std::vector<uint64_t> sessions_ ABSL_GUARDED_BY(mu_);  // per task, from Register
  std::string restored_position_ ABSL_GUARDED_BY(mu_);   // from ps 0's Register
  int64_t join_step_ ABSL_GUARDED_BY(mu_) = 0;           // from ps 0's Register
  int64_t registered_step_ ABSL_GUARDED_BY(mu_) = 0;     // from ps 0's Register
  std::atomic<int64_t> elastic_read_ahead_{-1};          // SetElasticReadAhead
  absl::Duration lease_ ABSL_GUARDED_BY(mu_);            // from the last Connect
  std::string next_input_position_;  // SetInputPosition's, taken by the next BeginPush (training thread)
  std::string input_position_;       // the current push's: set by BeginPush, read by the push lanes
  std::thread heartbeat_;
  bool heartbeat_stop_ ABSL_GUARDED_BY(mu_) = false;  // MoveTo ends the heartbeat of the old tasks
  int64_t move_step_ ABSL_GUARDED_BY(mu_) = -1;       // MoveTo: the step the chief moves the state at
  // The push in flight.
  int64_t push_step_ ABSL_GUARDED_BY(mu_) = -1;
  const float* push_grads_ = nullptr;  // set by BeginPush while no lane job runs
  // The push's gradient norm when the config clips (else -1): set by FinishPush before it queues the lanes' jobs.
  double push_norm_ = -1.0;
  uint64_t push_request_id_ = 0;
  std::vector<char> slice_queued_;     // training thread only: slices handed to a lane this push
  std::vector<std::unique_ptr<TaskPush>> pushes_;  // per task; lane-owned while a push runs
  // The sparse parts of the push in flight, per task: made by the training thread (PushSparse), read by the
  // task's lane through the pointer its job carries; cleared by BeginPush once the previous push is done.
  std::vector<std::vector<std::unique_ptr<SparsePart>>> sparse_parts_;
  bool push_finishing_ = false;  // training thread only: FinishPush or AbandonPush was called
  // Training thread only: ps 0's commit was sent (FinishTaskPush with defer) and its outcome not yet read.
  bool commit_started_ = false;
  int pushes_pending_ ABSL_GUARDED_BY(mu_) = 0;    // tasks whose upload has not finished
  int others_pending_ ABSL_GUARDED_BY(mu_) = 0;    // tasks > 0 whose upload has not finished
  absl::Status push_status_ ABSL_GUARDED_BY(mu_);
  PushResponse push_response_ ABSL_GUARDED_BY(mu_);
  bool push_active_ ABSL_GUARDED_BY(mu_) = false;
  // The pull in flight.
  bool pull_active_ ABSL_GUARDED_BY(mu_) = false;
  float* pull_params_ = nullptr;
  bool pull_moving_averages_ = false;
  int64_t pull_min_step_ = 0, pull_since_step_ = 0;
  bool have_header_ ABSL_GUARDED_BY(mu_) = false;
  PullHeader header_ ABSL_GUARDED_BY(mu_);
  std::vector<char> arrived_ ABSL_GUARDED_BY(mu_);  // per slice
  // The pull is tentative (PullHeader::tentative): its slices count as arrived only when its task's pull ended OK.
  bool tentative_pull_ ABSL_GUARDED_BY(mu_) = false;
  // StartPullBesidePush: the pull's values wait until backward is over (FinishPush, AbandonPush). Set by the
  // training thread; the pull lanes wait for it to clear (AwaitPullWritable) before writing any value.
  std::atomic<bool> pull_writes_held_{false};
  bool pulled_beside_push_ = false;  // training thread only: for its log line, once
  int pulls_pending_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status pull_status_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<Receiver>> receivers_;  // per task
  // Sparse rows: what SetSparsePull set for the next pull (training thread), and the pull in flight's (set by
  // StartPull before any lane job of the pull runs; read by the lanes).
  std::vector<SparsePull> next_sparse_, sparse_;
  bool next_sparse_read_only_ = false, sparse_read_only_ = false;
  std::vector<int> sparse_index_;  // table -> index in sparse_, -1 when the pull does not bring it
  std::vector<int> sparse_pending_ ABSL_GUARDED_BY(mu_);  // per index in sparse_: tasks whose rows are missing
};

}  // namespace dtrain::ps

#endif  // DTRAIN_PS_CLIENT_WORKER_CLIENT_H_
