// The variables one ps task holds: for each slice its values, optimizer slots and (when enabled) moving
// averages, with the optimizer step that updates them, and each slice's *version*: the number of updates
// applied to it (== the task's step in sync mode).
//
// Updates are applied slice by slice and, within a slice, chunk by chunk in increasing offset; each chunk is
// published as soon as it is done, so a reader can stream the start of a slice while the rest is still being
// updated (WaitReadable). Every chunk is updated and read under the slice's own lock: no global lock.
//
// Usage:
//   ASSIGN_OR_RETURN(std::unique_ptr<SliceStore> store, SliceStore::Create(slices, optimizer, 0.999f));
//   RETURN_IF_ERROR(store->WriteValues(i, 0, n, WireDtype::kF32, data));   // before training
//   store->ResetSlotsAndAverages(/*version=*/0);
//   const float* grads[] = {sum.data()};
//   store->Apply(i, step, grads, 1, 1.0f / count, /*version=*/step + 1);
//   if (store->WaitReadable(i, n, step + 1, deadline)) store->Read(i, false, 0, n, WireDtype::kF32, out);
//
// Thread-safety: Apply, Read and WaitReadable may run concurrently from any threads (Apply of one slice by one
// thread at a time). WriteValues, ResetSlotsAndAverages, ImportState and set_apply_threads are for set-up:
// callers make sure nothing else touches the store meanwhile. ExportState copies each slice under its lock.
#ifndef DTRAIN_PS_CORE_SLICE_STORE_H_
#define DTRAIN_PS_CORE_SLICE_STORE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <unordered_map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "ps/checkpoint/checkpoint_format.h"
#include "ps/core/optimizer.h"
#include "ps/api/ps_types.h"
#include "ps/api/slice_io.h"

namespace dtrain::ps {

// How Apply reads the gradients it is given (see Apply).
enum class ApplyGuard { kNone, kCopyFinite };

class SliceStore {
 public:
  // Floats per published chunk of an update.
  static constexpr int64_t kChunkFloats = 1 << 16;

  // InvalidArgument for a bad optimizer config, a bad moving_average_decay, a repeated slice key or a
  // non-positive length. Values, slots and versions start at zero.
  static absl::StatusOr<std::unique_ptr<SliceStore>> Create(std::vector<SliceSpec> slices,
                                                            const OptimizerConfig& optimizer,
                                                            float moving_average_decay);

  int num_slices() const { return static_cast<int>(slices_.size()); }
  const SliceSpec& spec(int i) const { return specs_[i]; }
  const std::vector<SliceSpec>& specs() const { return specs_; }
  int64_t total_floats() const { return total_floats_; }
  const Optimizer& optimizer() const { return optimizer_; }
  bool has_moving_averages() const { return moving_average_decay_ > 0.0f; }

  // The index of the slice with cluster-wide `key`; InvalidArgument naming the key when this task lacks it.
  absl::StatusOr<int> IndexOf(uint32_t key) const;
  // InvalidArgument unless [offset, offset + n) lies inside slice i (n >= 0).
  absl::Status CheckRange(int i, int64_t offset, int64_t n) const;

  // Set-up: writes values of slice i (decoded from `dtype`).
  absl::Status WriteValues(int i, int64_t offset, int64_t n, WireDtype dtype, const void* data);
  // Set-up: sets the optimizer slots to their initial values (Optimizer::SlotInitialValue: zero but for adagrad's
  // accumulator and TensorFlow's rmsprop's ms), the moving averages to the values and every version to `version`.
  void ResetSlotsAndAverages(int64_t version);

  // Updates slice i as optimizer step `step` (0-based: drives the learning-rate schedule and Adam's t = step + 1)
  // with the gradient grad_scale * (w[0] * grads[0] + ... + w[num_grads - 1] * grads[num_grads - 1]) (each
  // spec(i).length floats; w = `weights`, each gradient's clip factor, or all 1 when null), then its moving
  // average with num_updates = step + 1, chunk by chunk; afterwards the slice's version is `version`. A state
  // slice (not trainable) ignores the weights. Large slices use up to apply_threads OpenMP threads (same result
  // bit for bit). num_grads == 0 only publishes the new version.
  //
  // `guard` (ApplyGuard::kCopyFinite): the gradients lie in memory another process may still write (a worker's
  // shared memory, lent in place; ps/core/gradient_buffers.h), checked for NaN/Inf when they arrived. Each chunk is
  // then copied (or summed) into this task's own memory first, and the optimizer reads only that copy, checked
  // again: a value that is not finite there (the worker changed it after the check) is applied as 0. Returns how
  // many values were (0 without the guard). The copy and the check read the chunk once more, in cache.
  int64_t Apply(int i, int64_t step, const float* const* grads, int num_grads, float grad_scale, int64_t version,
                const float* weights = nullptr, ApplyGuard guard = ApplyGuard::kNone);

  // Tentative updates: an update applied as its gradient arrives, before anyone knows whether it will count (the
  // ParameterServer's early apply, parameter_server.h), and taken back when it does not.
  // ApplyTentative applies, as update `version` of optimizer step `step` from one gradient (scale 1, no weights:
  // what Apply does with num_grads 1), the floats of slice i that `grad` holds and the slice's tentative update
  // has not covered yet: `available` floats from 0, used up to the last whole chunk of kChunkFloats (or all of
  // them when available == length), so the chunks are Apply's and the bits are Apply's. Each chunk's old values,
  // slots and moving averages are saved first, and each is published as Apply publishes (readers stream it).
  // Returns the floats applied so far. A slice's tentative update is at most one at a time and goes on only
  // from the thread that started it.
  // `guard` and *zeroed (may be null; added to): as Apply's.
  int64_t ApplyTentative(int i, int64_t step, const float* grad, int64_t available, int64_t version,
                         ApplyGuard guard = ApplyGuard::kNone, int64_t* zeroed = nullptr);
  // Floats of slice i its tentative update has applied (0: none in progress).
  int64_t tentative_floats(int i) const;
  // Keeps slice i's tentative update (it is the update of its version): the saved copy is dropped.
  void ConfirmTentative(int i);
  // Takes slice i's tentative update back: its values, slots and moving averages as they were, its version the
  // one before (readers waiting for the tentative version wait on). Nothing when none is in progress.
  void UndoTentative(int i);

  // Waits until floats [0, end) of slice i hold version >= `version` (fully updated, or updated that far by the
  // Apply in progress), or until `deadline`, or until `stop` (may be null) returns true. Returns whether they do.
  // `stop` is evaluated whenever the store's progress lock is released, on whatever thread releases it: it must
  // read only atomics and take no lock (a Cancellation's cancelled() does).
  bool WaitReadable(int i, int64_t end, int64_t version, absl::Time deadline,
                    const std::function<bool()>& stop = nullptr) const;
  // Waits until a slice, say slice k, has floats beyond sent[k] (one entry per slice) that hold version >=
  // `version` (see WaitReadable), or until `deadline` or `stop` as WaitReadable. Returns k, with the end of its
  // readable floats in *readable_end, or -1. A reader that streams slices in the order their updates arrive (the
  // early apply's pull) uses it.
  int WaitAnyReadable(const std::vector<int64_t>& sent, int64_t version, absl::Time deadline,
                      const std::function<bool()>& stop, int64_t* readable_end) const;
  // Makes every WaitReadable check its `stop` again (they wait on conditions of the progress lock: releasing it is
  // what wakes them).
  void WakeWaiters() const;
  int64_t version(int i) const;

  // Copies floats [offset, offset + n) of slice i's values (or moving averages) to dst as `dtype`.
  // Precondition (CHECKed): moving_average implies has_moving_averages().
  void Read(int i, bool moving_average, int64_t offset, int64_t n, WireDtype dtype, void* dst) const;

  // Threads Apply may use for a large slice (OpenMP; 1 = the calling thread only).
  void set_apply_threads(int threads) { apply_threads_ = threads < 1 ? 1 : threads; }

  // Checkpoints: the full state of every slice (values, slots, moving averages), in slice order; a tentative
  // update in progress is left out (what it overwrote is exported).
  std::vector<SliceState> ExportState() const;
  // Replaces the full state from a checkpoint and sets every version to `version`. Every slice of this store
  // exactly once, matching spec and the optimizer's number of slots; else InvalidArgument (naming the slots this
  // optimizer keeps when their number differs) and nothing changes.
  // Moving averages: taken when both sides keep them; set to the values when the store keeps them but `slices`
  // lack them; ignored otherwise.
  absl::Status ImportState(const std::vector<SliceState>& slices, int64_t version);

 private:
  struct Slice {
    SliceSpec spec;
    mutable absl::Mutex mu;  // guards the floats below, chunk by chunk
    std::vector<float> values;
    std::vector<std::vector<float>> slots;
    std::vector<float> shadow;  // empty when moving averages are off
    // A tentative update in progress: floats [0, tentative_floats) hold it; what they held before is saved in
    // the undo_* vectors (allocated on first use), and the slice's version before it in tentative_from.
    int64_t tentative_floats = 0;
    int64_t tentative_from = 0;
    std::vector<float> undo_values;
    std::vector<std::vector<float>> undo_slots;
    std::vector<float> undo_shadow;
  };
  // Progress of one slice's updates, guarded by progress_mu_.
  struct Progress {
    int64_t version = 0;           // completed updates
    int64_t applying_version = 0;  // version being applied (== version when none is in progress)
    int64_t applied_floats = 0;    // floats [0, applied_floats) already hold applying_version
    // How far from 0 the floats of a slice of `length` hold version >= `want`.
    int64_t ReadableEnd(int64_t length, int64_t want) const {
      return version >= want ? length : applying_version >= want ? applied_floats : 0;
    }
  };

  SliceStore(std::vector<SliceSpec> specs, Optimizer optimizer, float moving_average_decay);
  void Publish(int i, int64_t applying_version, int64_t applied_floats, bool done);
  // The optimizer step (and moving average) on floats [begin, end) of `slice` from `grad` (indexed from begin)
  // times `scale`; state slices take the change itself scaled by `state_scale`. The caller holds slice.mu.
  void UpdateRange(Slice& slice, int64_t step, const float* grad, float scale, float state_scale, int64_t begin,
                   int64_t end) const;

  std::vector<SliceSpec> specs_;
  std::vector<std::unique_ptr<Slice>> slices_;
  std::unordered_map<uint32_t, int> index_of_key_;
  Optimizer optimizer_;
  float moving_average_decay_;
  int64_t total_floats_ = 0;
  int apply_threads_ = 1;

  mutable absl::Mutex progress_mu_;
  std::vector<Progress> progress_ ABSL_GUARDED_BY(progress_mu_);
};

}  // namespace dtrain::ps

#endif  // DTRAIN_PS_CORE_SLICE_STORE_H_
