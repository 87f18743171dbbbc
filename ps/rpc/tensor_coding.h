// The tensor-carrying messages of proto/dtrain.proto (InitializeChunk, PushChunk, PullChunk: a header in field 1,
// SliceChunks in field 2, sparse rows in field 3: RowGradientChunks in a PushChunk, RowChunks in a PullChunk; a
// PushChunk's trailer in field 4)
// encoded straight into and decoded straight out of grpc::ByteBuffer, the idea of TensorFlow's
// grpc_tensor_coding:
// - Encoding (MessageBuilder): the small fields are gathered in one slice per message; a chunk's data is either
//   a slice that *references* the caller's memory (AddChunkRef: no copy; a SendTracker counts the references
//   gRPC still holds, so the caller knows when it may overwrite the memory) or a slice the caller fills
//   (AddChunkOwned: the one copy of a ps task that sends values it keeps updating).
// - Decoding (DecodeMessage): walks the received slices without copying and hands each chunk's data to a
//   callback as runs of whole elements (a run never splits an element, even when gRPC's slices do); the
//   callback copies them to their destination, the one copy on the receiving side. A chunk of rows is handed
//   over whole (its data gathered into one buffer only when gRPC split it; its ids are copied, being few).
// Sparse rows: a RowGradientChunk's ids (packed sfixed64: the host's little-endian int64s) and data are
// referenced like slice data (AddRowGradientsRef); a RowChunk's data is owned (AddRowsOwned).
// The bytes are the plain protobuf encoding of those messages (fields in number order), and the decoder accepts
// any valid encoding of them (any field order, unknown fields skipped).
//
// Thread-safety: a MessageBuilder belongs to one thread; a SendTracker's methods may be called from any thread
// (gRPC releases slices on its own threads).
#ifndef DTRAIN_PS_RPC_TENSOR_CODING_H_
#define DTRAIN_PS_RPC_TENSOR_CODING_H_

#include <cstdint>
#include <string>
#include <vector>

#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "ps/api/slice_io.h"

namespace dtrain::ps::coding {

// Largest data of one chunk. Each message carries at most a few chunks.
inline constexpr int64_t kMaxChunkBytes = 1 << 20;
// The widest sparse row a decoder accepts (SparseTableSpec::dim is at most this).
inline constexpr int64_t kMaxRowDim = 65536;

// Counts the zero-copy slices gRPC still holds.
class SendTracker {
 public:
  // Waits until gRPC has released every referencing slice (true), or until `deadline` (false).
  bool WaitIdle(absl::Time deadline);
  int64_t outstanding() const;

 private:
  friend class MessageBuilder;
  void Acquire();
  static void Release(void* tracker);
  mutable absl::Mutex mu_;
  int64_t outstanding_ ABSL_GUARDED_BY(mu_) = 0;
};

class MessageBuilder {
 public:
  // Field 1: a serialized header message (PushHeader, PullHeader), or InitializeChunk's worker_id.
  void SetHeader(const std::string& serialized_header);
  void SetWorkerId(int32_t worker_id);
  // Field 4 of a PushChunk: a serialized PushTrailer (sent after the data).
  void SetTrailer(const std::string& serialized_trailer);
  // A chunk of `n` elements whose data stays at `data` (unchanged until `tracker` says gRPC let go of it).
  void AddChunkRef(uint32_t key, int64_t offset, WireDtype dtype, const void* data, int64_t n,
                   SendTracker* tracker);
  // A chunk of `n` elements whose data the caller writes into the returned memory (valid until Build).
  void* AddChunkOwned(uint32_t key, int64_t offset, WireDtype dtype, int64_t n);
  // PullChunk.rows: rows [first, first + count) of `table`, count * dim elements the caller writes into the
  // returned memory (valid until Build; nullptr for no elements).
  void* AddRowsOwned(uint32_t table, int64_t first, int64_t count, int dim, WireDtype dtype);
  // PushChunk.rows: the gradients of ids[0, count), count * dim elements at `data`; ids and data stay unchanged
  // until `tracker` says gRPC let go of them.
  void AddRowGradientsRef(uint32_t table, const int64_t* ids, int64_t count, int dim, WireDtype dtype,
                          const void* data, SendTracker* tracker);
  int64_t data_bytes() const { return data_bytes_; }
  bool empty() const { return slices_.empty() && meta_.empty(); }
  // The message; the builder is empty again afterwards.
  grpc::ByteBuffer Build();

 private:
  void AddChunkFields(uint32_t key, int64_t offset, WireDtype dtype, int64_t bytes);
  void AddRef(const void* data, int64_t bytes, SendTracker* tracker);
  void* OwnedData(int64_t bytes);  // a slice of `bytes` the caller fills (nullptr for 0)
  void FlushMeta();
  std::string meta_;                 // encoded fields not yet in a slice
  std::vector<grpc::Slice> slices_;  // finished slices, in order
  int64_t data_bytes_ = 0;
};

// What DecodeMessage finds, in message order.
class ChunkHandler {
 public:
  virtual ~ChunkHandler() = default;
  // Field 1 as a length-delimited header (PushChunk, PullChunk): its serialized bytes.
  virtual absl::Status OnHeader(const std::string& serialized_header) { return absl::OkStatus(); }
  // Field 4 as a length-delimited trailer (PushChunk): its serialized bytes.
  virtual absl::Status OnTrailer(const std::string& serialized_trailer) { return absl::OkStatus(); }
  // Field 1 as a varint (InitializeChunk's worker_id).
  virtual absl::Status OnWorkerId(int64_t worker_id) { return absl::OkStatus(); }
  // Elements [offset, offset + n) of slice `key`, n >= 1, as `dtype` at `data` (any alignment). A chunk's data
  // comes in one or more consecutive runs.
  virtual absl::Status OnData(uint32_t key, int64_t offset, int64_t n, WireDtype dtype, const void* data) = 0;
  // A RowChunk (pull): rows [first, first + count) of `table`, count >= 1, count * dim values of `dtype` at
  // `data` (contiguous, any alignment).
  virtual absl::Status OnRows(uint32_t table, int64_t first, int64_t count, int dim, WireDtype dtype,
                              const void* data) {
    return absl::DataLossError("malformed tensor message: unexpected sparse rows");
  }
  // A RowGradientChunk (push): the gradients of ids[0, count), count >= 1, count * dim values of `dtype` at
  // `data` (contiguous, any alignment).
  virtual absl::Status OnRowGradients(uint32_t table, const int64_t* ids, int64_t count, int dim, WireDtype dtype,
                                      const void* data) {
    return absl::DataLossError("malformed tensor message: unexpected sparse gradients");
  }
};

// DataLoss naming what is malformed (truncated varint or field, data not a whole number of elements or rows,
// negative offset, unknown dtype, a row wider than kMaxRowDim); a handler error is returned as it is.
absl::Status DecodeMessage(const grpc::ByteBuffer& buffer, ChunkHandler* handler);

}  // namespace dtrain::ps::coding

#endif  // DTRAIN_PS_RPC_TENSOR_CODING_H_
