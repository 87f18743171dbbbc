// What each worker has uploaded to one ps task for its current push: the gradient floats of every slice of
// the task, and how much of each slice has arrived; and the rows of each sparse table it pushed (ids and their
// gradients). Sync mode keeps a worker's buffer until its step is decided and applied; async mode uses it to
// gather each slice whole before applying it (and the rows until the push finishes).
//
// Sparse rows: an id may come once per upload *attempt*: a retried upload (a new SliceUpload with the same
// request id, identified by a different `writer`) sends its rows again and overwrites them, while a repeat
// within one attempt is InvalidArgument.
//
// A buffer belongs to one upload, named by (step, request_id): an upload with another name starts it afresh
// (the memory is reused, no allocation after the first step). Within an upload, a slice's pieces arrive in
// increasing offset without gaps; a piece at offset 0 starts that slice again (a retried upload rewrites it).
// A transport whose sender's memory this process maps (ps/shm) lends whole slices instead (Borrow): the buffer
// then refers to the worker's floats until the next upload claims it.
//
// Thread-safety: each worker's buffer has its own lock; Lock() hands it out for a sequence of calls.
#ifndef DTRAIN_PS_CORE_GRADIENT_BUFFERS_H_
#define DTRAIN_PS_CORE_GRADIENT_BUFFERS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "ps/api/slice_io.h"
#include "ps/core/slice_store.h"
#include "ps/core/sparse_store.h"

namespace dtrain::ps {

class GradientBuffers {
 public:
  // One worker's buffer. Use it through Locked.
  class Buffer {
   public:
    int64_t step() const { return step_; }
    uint64_t request_id() const { return request_id_; }
    // Makes the buffer belong to upload (step, request_id); a different upload resets what has arrived.
    void Claim(int64_t step, uint64_t request_id);
    // Copies a piece in (decoding `dtype`); with `check_finite`, notes whether it holds NaN or Inf.
    // InvalidArgument for a range outside the slice or a piece that does not continue the slice (offset !=
    // floats received so far, unless 0).
    absl::Status Write(int slice, int64_t offset, int64_t n, WireDtype dtype, const void* data, bool check_finite);
    // Write for fp32 floats that stay at `data`, unchanged, until this upload's step has been applied or dropped
    // (SliceUpload::WriteInPlace). A slice is lent from its start: data(slice) is then `data` itself, no copy, and
    // `keep` keeps that memory alive while the buffer refers to it (until the next upload claims the buffer, or
    // the slice is written again); pieces that follow right behind it in the same memory, from the same attempt,
    // extend it (a transport that receives a slice in pieces lends each as it lands). Any other piece is copied,
    // as by Write (with what was lent of the slice before it).
    // `writer` names the upload attempt (any number unique per attempt), for Unlend.
    absl::Status Borrow(int slice, int64_t offset, int64_t n, const float* data, std::shared_ptr<const void> keep,
                        bool check_finite, uint64_t writer);
    // Lets go of the slices attempt `writer` lent (all lent slices for 0): they count as not received. For an
    // upload that will not be applied (abandoned, refused, dropped) and for one whose step has been applied, so
    // that a worker's memory is not held past its use (a worker that exits has its segments unmapped at once).
    void Unlend(uint64_t writer);
    // The first slice of the current upload with a non-finite value (its name), or empty.
    const std::string& nonfinite_slice() const { return nonfinite_slice_; }
    bool complete(int slice) const { return received_[slice] == length_[slice]; }
    int64_t received(int slice) const { return received_[slice]; }  // floats of the slice so far, from 0
    bool all_complete() const { return num_complete_ == static_cast<int>(length_.size()); }
    // "w/biases (0 of 10 floats), ..." for the slices not yet whole, for error messages.
    std::string DescribeMissing() const;
    // Whether slice `slice` is lent (Borrow): data(slice) is then the lender's memory, which it may still write.
    bool lent(int slice) const { return lent_[slice].data != nullptr; }
    const float* data(int slice) const {
      return lent_[slice].data != nullptr ? lent_[slice].data : values_[slice].data();
    }
    // The worker's gradient norm for this upload (SliceUpload::SetGradientNorm; a retried upload sets it again).
    void set_gradient_norm(double norm) {
      gradient_norm_ = norm;
      has_gradient_norm_ = true;
    }
    bool has_gradient_norm() const { return has_gradient_norm_; }
    double gradient_norm() const { return gradient_norm_; }
    // Async: whether slice `slice` of the current upload has been applied (a retried upload applies it once).
    bool applied(int slice) const { return applied_[slice] != 0; }
    void set_applied(int slice) { applied_[slice] = 1; }

    // Rows of sparse table `table` (checked by the caller: owned ids, the table's `dim`), decoded from `dtype`,
    // written by upload attempt `writer` (any number unique per attempt); with `check_finite` notes NaN/Inf.
    // InvalidArgument for an id repeated within the attempt (the rows before it are kept; the upload fails).
    absl::Status WriteSparse(int table, const int64_t* ids, int64_t n, WireDtype dtype, const void* rows,
                             bool check_finite, uint64_t writer);
    int num_tables() const { return static_cast<int>(sparse_.size()); }
    // The rows of one table in arrival order: ids, and ids.size() * dim gradient floats.
    const std::vector<int64_t>& sparse_ids(int table) const { return sparse_[table].ids; }
    const float* sparse_grads(int table) const { return sparse_[table].grads.data(); }

   private:
    friend class GradientBuffers;
    // Sets how much of `slice` has arrived, keeping num_complete_.
    void SetReceived(int slice, int64_t floats);
    int64_t step_ = -1;
    uint64_t request_id_ = 0;
    std::vector<std::string> names_;
    std::vector<int64_t> length_;
    std::vector<std::vector<float>> values_;  // allocated on first use
    struct Lent {
      const float* data = nullptr;      // Borrow's floats (then values_ is not used), or null
      std::shared_ptr<const void> keep;  // what keeps them mapped
      uint64_t writer = 0;               // the attempt that lent them
    };
    std::vector<Lent> lent_;  // per slice
    std::vector<int64_t> received_;
    std::vector<char> applied_;
    int num_complete_ = 0;
    std::string nonfinite_slice_;
    bool has_gradient_norm_ = false;
    double gradient_norm_ = 0.0;
    struct SparseRows {
      std::string name;
      int dim = 0;
      std::vector<int64_t> ids;
      std::vector<float> grads;
      std::vector<uint64_t> writer;                   // per row: the attempt that wrote it
      absl::flat_hash_map<int64_t, uint32_t> row_of;  // id -> row
    };
    std::vector<SparseRows> sparse_;
  };

  // RAII access to one worker's buffer.
  class Locked {
   public:
    Locked(Locked&&) = default;
    Buffer* operator->() const { return buffer_; }
    Buffer& operator*() const { return *buffer_; }

   private:
    friend class GradientBuffers;
    Locked(absl::Mutex* mu, Buffer* buffer) : lock_(std::make_unique<absl::MutexLock>(mu)), buffer_(buffer) {}
    std::unique_ptr<absl::MutexLock> lock_;
    Buffer* buffer_;
  };

  // `tables` may be null (no sparse tables).
  GradientBuffers(int num_workers, const SliceStore& store, const SparseStore* tables = nullptr);
  // Precondition: 0 <= worker < num_workers.
  Locked Lock(int worker);

 private:
  struct Entry {
    absl::Mutex mu;
    Buffer buffer;
  };
  std::vector<std::unique_ptr<Entry>> entries_;
};

}  // namespace dtrain::ps

#endif  // DTRAIN_PS_CORE_GRADIENT_BUFFERS_H_
