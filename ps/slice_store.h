// The variables one ps task holds: for each slice its values, optimizer slots and (when enabled) moving
// averages, with the optimizer step that updates them.
//
// Usage:
//   ASSIGN_OR_RETURN(SliceStore store, SliceStore::Create(config.slices, config.optimizer, 0.999f));
//   RETURN_IF_ERROR(store.SetValues(initial));        // slots zeroed, moving averages = values
//   ASSIGN_OR_RETURN(int i, store.IndexOf(key));
//   store.ApplyGradient(i, step, grad_sum.data(), 1.0f / count);
//
// Thread-safety: thread-compatible (const methods may run concurrently; the ParameterServer serializes the
// rest under its lock).
#ifndef DTRAIN_PS_SLICE_STORE_H_
#define DTRAIN_PS_SLICE_STORE_H_

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ps/checkpoint_format.h"
#include "ps/optimizer.h"
#include "ps/ps_types.h"

namespace dtrain::ps {

class SliceStore {
 public:
  // InvalidArgument for a bad optimizer config or a repeated slice key. Values start at zero.
  static absl::StatusOr<SliceStore> Create(std::vector<SliceSpec> slices, const OptimizerConfig& optimizer,
                                           float moving_average_decay);

  int num_slices() const { return static_cast<int>(specs_.size()); }
  const SliceSpec& spec(int i) const { return specs_[i]; }
  const std::vector<SliceSpec>& specs() const { return specs_; }
  int64_t total_floats() const { return total_floats_; }
  const Optimizer& optimizer() const { return optimizer_; }

  // The index of the slice with cluster-wide `key`; InvalidArgument naming the key when this task lacks it.
  absl::StatusOr<int> IndexOf(uint32_t key) const;

  // Sets every slice from `values` (each key exactly once, right length; else InvalidArgument and nothing
  // changes). Zeroes the optimizer slots and sets the moving averages to the values.
  absl::Status SetValues(const std::vector<SliceData>& values);

  // Applies the gradient grad_scale * grad (spec(i).length floats) to slice i as step `step` (0-based, drives
  // the learning-rate schedule and Adam's t = step + 1), then updates its moving average with
  // num_updates = step + 1 (the global step after the update, as TF's ExponentialMovingAverage sees it when
  // applied after the optimizer).
  void ApplyGradient(int i, int64_t step, const float* grad, float grad_scale);

  const std::vector<float>& values(int i) const { return values_[i]; }
  bool has_moving_averages() const { return moving_average_decay_ > 0.0f; }
  // The moving average of slice i (empty when moving averages are off).
  const std::vector<float>& moving_average(int i) const { return shadows_[i]; }
  // Optimizer slot `slot` (< optimizer().num_slots()) of slice i.
  const std::vector<float>& slot(int i, int slot) const { return slots_[i][slot]; }

  // Copies every slice's values (or moving averages) into the model's flat buffer at the slices' flat_offsets.
  void CopyValuesToFlat(float* flat) const;
  void CopyMovingAveragesToFlat(float* flat) const;

  // Threads ApplyGradient may use for a large slice (OpenMP; 1 = the calling thread only).
  void set_apply_threads(int threads) { apply_threads_ = threads < 1 ? 1 : threads; }

  // Copies every slice's values into `out` (resized to num_slices(), in slice order; reuses capacity).
  void ReadValues(std::vector<SliceData>* out) const;
  // The same with the moving averages. Precondition (CHECKed): has_moving_averages().
  void ReadMovingAverages(std::vector<SliceData>* out) const;

  // Checkpoints: the full state of every slice (values, slots, moving averages), in slice order.
  std::vector<SliceState> ExportState() const;
  // Replaces the full state from a checkpoint. Every slice of this store exactly once, matching spec, the
  // optimizer's number of slots; else InvalidArgument and nothing changes. Moving averages: taken when both
  // sides keep them; set to the values when the store keeps them but `slices` lack them; ignored otherwise.
  absl::Status ImportState(const std::vector<SliceState>& slices);

 private:
  SliceStore(std::vector<SliceSpec> specs, Optimizer optimizer, float moving_average_decay);

  std::vector<SliceSpec> specs_;
  int apply_threads_ = 1;
  std::unordered_map<uint32_t, int> index_of_key_;
  Optimizer optimizer_;
  float moving_average_decay_;
  int64_t total_floats_ = 0;
  std::vector<std::vector<float>> values_;
  std::vector<std::vector<std::vector<float>>> slots_;  // [slice][slot]
  std::vector<std::vector<float>> shadows_;             // [slice], empty when moving averages are off
};

}  // namespace dtrain::ps

#endif  // DTRAIN_PS_SLICE_STORE_H_
