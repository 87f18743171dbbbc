// DeltaWriter: writes one ps task's deltas (delta_format.h) on a thread of its own, so that the RPC that took
// a delta (between two updates, under the ps's locks) does not wait for the disk; and prunes the deltas no
// snapshot chain needs any more.
//
//   DeltaOptions o;  o.dir = "/ckpt";  o.every_secs = 10;
//   DeltaWriter writer(o, env, /*task=*/0, /*num_ps=*/1);
//   if (!writer.busy()) writer.Submit(std::move(delta));   // queued; written atomically as model.delta-<step>...
//   writer.NoteSnapshot(step);  // a checkpoint of `step` was written: deltas up to the one before it may go
//
// A write that fails is logged (LOG(ERROR)) and counted; the next delta still applies to the state of the one
// that failed, so a reader's chain stops at the gap (and resumes from the next snapshot): serving and restarts
// lose that interval, never more. Submit while a write is in progress waits for it (at most one is queued).
//
// The writer keeps its buffers from one delta to the next (TakeSpare, and the bytes' buffer): a delta of ~50 MB
// otherwise faulted in ~150 MB of fresh pages each time, most of its cost.
//
// Thread-safety: every method may be called from any thread.
#ifndef DTRAIN_PS_CHECKPOINT_DELTA_WRITER_H_
#define DTRAIN_PS_CHECKPOINT_DELTA_WRITER_H_

#include <cstdint>
#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/env.h"
#include "ps/checkpoint/delta_format.h"

namespace dtrain::ps {

// The ps's deltas (--delta_every_secs, --delta_dir).
struct DeltaOptions {
  std::string dir;        // where deltas go (the ps defaults it to --checkpoint_dir); empty: no deltas
  double every_secs = 0;  // > 0: a delta every this many seconds
  int64_t every_steps = 0;  // > 0: a delta every this many global steps (tests; with every_secs, whichever first)
  bool enabled() const { return !dir.empty() && (every_secs > 0 || every_steps > 0); }
};
// InvalidArgument naming the flag: negative intervals, or an interval without a directory.
absl::Status ValidateDeltaOptions(const DeltaOptions& o);

class DeltaWriter {
 public:
  // Precondition (CHECKed): o.enabled().
  DeltaWriter(const DeltaOptions& o, Env* env, int task, int num_ps);
  ~DeltaWriter();  // writes what is queued, then stops

  // A write is queued or in progress (a caller that may skip a delta should then wait for the next one).
  bool busy() const ABSL_LOCKS_EXCLUDED(mu_);
  // Queues `delta` (waits while another is queued).
  void Submit(DeltaData delta) ABSL_LOCKS_EXCLUDED(mu_);
  // The last delta written, emptied with its buffers' capacity kept (an empty DeltaData before the first): the
  // ps takes the next delta into it, so that every delta does not fault in tens of MB of fresh pages (the ps's
  // periodic malloc_trim gives freed ones back to the system between deltas).
  DeltaData TakeSpare() ABSL_LOCKS_EXCLUDED(mu_);
  // Waits until everything submitted is written (or failed).
  void Flush() ABSL_LOCKS_EXCLUDED(mu_);
  // A snapshot (checkpoint) of `step` is on disk: the deltas up to the snapshot before it are removed (a reader
  // or a restart starts from one of the two newest snapshots).
  void NoteSnapshot(int64_t step) ABSL_LOCKS_EXCLUDED(mu_);

  int64_t written() const ABSL_LOCKS_EXCLUDED(mu_);        // deltas written
  int64_t failed() const ABSL_LOCKS_EXCLUDED(mu_);         // deltas that could not be written
  int64_t bytes_written() const ABSL_LOCKS_EXCLUDED(mu_);
  double write_seconds() const ABSL_LOCKS_EXCLUDED(mu_);   // spent serializing and writing
  absl::Status last_status() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Loop();

  const DeltaOptions options_;
  Env* const env_;
  const int task_, num_ps_;

  mutable absl::Mutex mu_;
  std::optional<DeltaData> queued_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  int64_t snapshots_[2] ABSL_GUARDED_BY(mu_) = {-1, -1};  // the two newest snapshot steps, newest first
  int64_t prune_up_to_ ABSL_GUARDED_BY(mu_) = -1;          // pending pruning (done by the writing thread)
  int64_t written_ ABSL_GUARDED_BY(mu_) = 0, failed_ ABSL_GUARDED_BY(mu_) = 0, bytes_ ABSL_GUARDED_BY(mu_) = 0;
  double seconds_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status last_status_ ABSL_GUARDED_BY(mu_);
  std::optional<DeltaData> spare_ ABSL_GUARDED_BY(mu_);
  std::string bytes_buffer_;  // the writer thread's: a delta's bytes, reused from one delta to the next
  std::thread thread_;
};

}  // namespace dtrain::ps

#endif  // DTRAIN_PS_CHECKPOINT_DELTA_WRITER_H_
