// How tensor data moves between workers and ps tasks: as *pieces*, floats [offset, offset + n) of one slice.
// This is the only payload shape of the protocol (ps_types.h). An upload (SliceUpload) takes pieces from its
// writer; a download (PullReceiver) tells the ps task where each piece goes and the task copies it there. Each
// side therefore copies the bytes at most once:
//   worker flat gradients --(zero-copy send)--> wire --(one copy)--> ps task's buffer
//   ps task's values --(one copy into the receiver's destination)--> worker flat parameters (in process), or
//   --> a send buffer --(zero-copy send)--> wire --(one copy)--> worker flat parameters (gRPC).
//
// Pieces may carry floats in a narrower wire type (bf16, fp16: --wire_dtype); the receiving side converts.
//
// Thread-safety: an upload or a receiver is used by one thread at a time.
#ifndef DTRAIN_PS_API_SLICE_IO_H_
#define DTRAIN_PS_API_SLICE_IO_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ps/api/ps_types.h"

namespace dtrain::ps {

// Whether [first, first + n) lies within [0, size), checked without adding (a peer's first + n can overflow and
// pass a naive check). Every transport checks the ranges a peer names so.
inline bool RangeWithin(int64_t first, int64_t n, int64_t size) {
  return first >= 0 && n >= 0 && first <= size && n <= size - first;
}

// OK when a pull asking `n` rows of sparse table `table` stays within `limit` (dtrain_ps --max_pull_rows); else
// ResourceExhausted naming the worker, the task and the flag. Checked by the ParameterServer, and by the shm and
// TCP servers before they copy a pull's ids.
absl::Status CheckPullRows(int64_t limit, int worker, int task, uint32_t table, int64_t n);

// Element type of tensor data on the wire. The ps and the workers always compute in fp32.
enum class WireDtype : uint8_t { kF32 = 0, kBF16 = 1, kF16 = 2 };

int DtypeBytes(WireDtype dtype);  // 4, 2, 2
absl::string_view DtypeName(WireDtype dtype);  // "fp32", "bf16", "fp16"
// "fp32" | "bf16" | "fp16"; InvalidArgument naming the flag value otherwise.
absl::StatusOr<WireDtype> ParseWireDtype(absl::string_view name);
// Converts n floats to `dtype` (round to nearest even; fp16 saturates to +-65504 and keeps inf/NaN) at `dst`
// (any alignment), or copies them for kF32.
void EncodeFloats(WireDtype dtype, const float* src, int64_t n, void* dst);
// The inverse: n values of `dtype` at `src` (any alignment) to floats at `dst`.
void DecodeFloats(WireDtype dtype, const void* src, int64_t n, float* dst);
// The float `x` becomes after a round trip through `dtype` (x itself for kF32).
float RoundTrip(WireDtype dtype, float x);

// The receiving end of an upload: the chief's initial values (Initialize) or one worker's gradients for one
// step (Push). Slices may come in any order and pieces in any size; the pieces of one slice come in increasing
// offset without gaps, and a piece at offset 0 starts the slice again (a retried upload writes it anew).
class SliceUpload {
 public:
  virtual ~SliceUpload() = default;
  // Takes floats [offset, offset + n) of slice `key`, stored as `dtype` at `data` (unaligned allowed). The
  // bytes are copied (or, by a gRPC client, referenced until Finish returns: the caller keeps them unchanged
  // until then). InvalidArgument for an unknown key or a range outside the slice; the upload is then unusable.
  virtual absl::Status Write(uint32_t key, int64_t offset, int64_t n, WireDtype dtype, const void* data) = 0;
  // The most values of `dtype` one message of this transport carries: a Write of more goes out as several
  // chunks of this many (a caller that writes pieces of exactly this size sends the same messages). 0: a Write
  // travels whole, however long. The worker's timeline writes such chunks one by one to show each.
  virtual int64_t ChunkValues(WireDtype dtype) const { return 0; }
  // Write, for fp32 floats that stay at `data`, unchanged, until the push's step has been applied or dropped: a
  // transport whose worker's memory this process maps (ps/shm) lends them, and an upload may read a whole slice
  // there instead of copying it (by default, and for a part of a slice, it copies: Write). The protocol
  // keeps them unchanged: a worker computes its next gradients only after pulling the step they belong to (sync),
  // or after Finish returned (async, which applies within Finish); a worker that breaks it only spoils its own
  // gradients. `keep` holds the memory mapped for as long as the upload's task refers to it.
  virtual absl::Status WriteInPlace(uint32_t key, int64_t offset, int64_t n, const float* data,
                                    std::shared_ptr<const void> keep) {
    return Write(key, offset, n, WireDtype::kF32, data);
  }
  // A push's sparse gradients: row i of `rows` (`dim` values of `dtype`, rows back to back, unaligned allowed)
  // is the gradient of id ids[i] in table `table`, summed over the worker's batch. Ids this task does not own,
  // ids outside a fixed-size table, ids repeated within the upload, or a `dim` that is not the table's are
  // InvalidArgument. May be called several times per table (chunks); the bytes are copied (or, by a gRPC client,
  // referenced until Finish returns). A retried upload sends its rows again (applied once). An Initialize takes
  // the initial rows of tables with initial values (SparseTableSpec::initial_values), every id the task owns;
  // other tables' rows start from their initializer there (InvalidArgument).
  virtual absl::Status WriteSparse(uint32_t table, const int64_t* ids, int64_t n, int dim, WireDtype dtype,
                                   const void* rows) {
    return absl::InvalidArgumentError("this upload takes no sparse rows");
  }
  // A push's gradient norm: the L2 norm of the worker's whole dense gradient (every trainable slice on every ps
  // task), sent after the slices and before Finish when the config clips gradients (OptimizerConfig::clip_norm >
  // 0; see there). A retried upload sends it again. InvalidArgument for a negative norm (NaN and +Inf are taken:
  // a non-finite gradient is the --nonfinite policy's matter) or on an upload that is not a push.
  virtual absl::Status SetGradientNorm(double norm) {
    return absl::InvalidArgumentError("this upload takes no gradient norm");
  }
  // Ends the upload. For a push: the outcome; a commit requires every slice of the task to have arrived whole
  // (FailedPrecondition naming the missing slices otherwise). For an Initialize: kAccepted with the step.
  virtual absl::StatusOr<PushResponse> Finish() = 0;
  // Optional: sends what ends the upload now and leaves Finish only to wait for the outcome, so that the caller
  // can send something else first (a pull right behind a commit) and sleep once for both. True when it did; false
  // when this upload has no such split or the send failed (Finish then does everything, or returns the error).
  // Either way Finish is still called, and no other call on this upload comes between.
  virtual bool StartFinish() { return false; }
};

// Writes whole slices of a flat fp32 buffer (slice i at flat + slices[i].flat_offset) to an upload.
absl::Status WriteSlices(SliceUpload* upload, const float* flat, const std::vector<SliceSpec>& slices);

// Where a download's pieces go. The ps task calls OnHeader once, then Destination/Written per piece, in key
// order (and Flush at times); it copies (converting to the destination's dtype) between Destination and
// Written, holding no lock across the calls.
class PullReceiver {
 public:
  virtual ~PullReceiver() = default;
  virtual absl::Status OnHeader(const PullHeader& header) = 0;
  struct Buffer {
    void* data = nullptr;  // room for n values of `dtype`; nullptr: drop this piece (e.g. already received)
    WireDtype dtype = WireDtype::kF32;
  };
  // Where floats [offset, offset + n) of slice `key` go.
  virtual absl::StatusOr<Buffer> Destination(uint32_t key, int64_t offset, int64_t n) = 0;
  // The piece of the last Destination call is in place.
  virtual absl::Status Written(uint32_t key, int64_t offset, int64_t n) = 0;
  // The ps task has finished a slice, or has nothing more ready right now (it may wait for an update next): a
  // receiver that batches pieces (a gRPC stream) sends what it holds.
  virtual absl::Status Flush() { return absl::OkStatus(); }
  // Sparse rows (PullRequest::sparse), after every slice: where rows [first, first + n) of the request's ids of
  // `table` go (n * dim values of the returned dtype; data nullptr: drop them), then SparseWritten once they
  // are in place. In request order, table by table, in pieces. A receiver that expects another `dim` returns
  // DataLoss.
  virtual absl::StatusOr<Buffer> SparseDestination(uint32_t table, int64_t first, int64_t n, int dim) {
    return absl::InvalidArgumentError("this receiver takes no sparse rows");
  }
  virtual absl::Status SparseWritten(uint32_t table, int64_t first, int64_t n) { return absl::OkStatus(); }
};

// A PullReceiver that writes into a flat fp32 buffer at each slice's flat_offset and checks that every slice of
// `slices` arrives whole, exactly once (Finish). Used by in-process pulls and by tests.
class FlatPullReceiver : public PullReceiver {
 public:
  // `slices` and `flat` must outlive the receiver.
  FlatPullReceiver(const std::vector<SliceSpec>* slices, float* flat);
  absl::Status OnHeader(const PullHeader& header) override;
  absl::StatusOr<Buffer> Destination(uint32_t key, int64_t offset, int64_t n) override;
  absl::Status Written(uint32_t key, int64_t offset, int64_t n) override;
  // DataLoss unless the header and every slice whole arrived.
  absl::Status Finish() const;
  const PullHeader& header() const { return header_; }
  int64_t bytes() const { return bytes_; }

 private:
  const std::vector<SliceSpec>* slices_;
  float* flat_;
  std::vector<int> index_of_key_;   // key -> index in *slices_, -1 if absent
  std::vector<int64_t> received_;   // floats received per slice
  bool got_header_ = false;
  PullHeader header_;
  int64_t bytes_ = 0;
};

}  // namespace dtrain::ps

#endif  // DTRAIN_PS_API_SLICE_IO_H_
