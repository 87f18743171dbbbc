// The saved position of a BatchStream (dataset.h): what a worker stores with a checkpoint so that a resumed
// run reads exactly the batches the uninterrupted run would have read next. Everything random in a stream
// derives from (seed, epoch, shard) (the epoch's shuffle permutation) or (seed, shard, batch index) (the
// distortions), so the position plus those numbers is the whole state; no RNG state needs saving.
//
// Encoding (version 1; integers little-endian):
//   "DTRNBPOS" | u32 version | u32 body_len | body | u32 masked CRC32C(everything before it)
//   body: u64 seed | u32 shard_index | u32 num_shards | u64 shard_size | u32 batch_size | u8 shuffle |
//         u8 preprocess | u64 epoch | u64 offset | u64 next_batch
//
// Thread-safety: stateless functions.
#ifndef DTRAIN_WORKER_DATA_BATCH_STREAM_STATE_H_
#define DTRAIN_WORKER_DATA_BATCH_STREAM_STATE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dtrain::data {

inline constexpr char kBatchStreamStateMagic[] = "DTRNBPOS";  // 8 bytes, no terminator in the encoding
inline constexpr uint32_t kBatchStreamStateVersion = 1;

struct BatchStreamState {
  // What the stream was made with (BatchStreamOptions and its shard); a restore must match them.
  uint64_t seed = 0;
  int shard_index = 0;
  int num_shards = 1;
  int64_t shard_size = 0;
  int batch_size = 0;
  bool shuffle = true;
  int preprocess = 0;  // Preprocess as an integer
  // Where the next batch starts: example `offset` of epoch `epoch`'s order, which is batch `next_batch` of
  // the stream (next_batch * batch_size == epoch * shard_size + offset).
  int64_t epoch = 0;
  int64_t offset = 0;
  int64_t next_batch = 0;
};

std::string EncodeBatchStreamState(const BatchStreamState& state);

// DataLoss for a blob that is not a state (bad magic), truncated, corrupted (checksum) or inconsistent (an
// offset outside the shard, a position that does not match the batch index); FailedPrecondition for a newer
// version. Messages start with "input position: ".
absl::StatusOr<BatchStreamState> DecodeBatchStreamState(absl::string_view bytes);

// The numbers that define a stream's order, with a zero position: from its options (any struct with seed,
// shard_index, num_shards, batch_size and shuffle), the size of its shard and its preprocessing code.
template <typename StreamOptions>
BatchStreamState StreamIdentity(const StreamOptions& o, int64_t shard_size, int preprocess) {
  BatchStreamState s;
  s.seed = o.seed;
  s.shard_index = o.shard_index;
  s.num_shards = o.num_shards;
  s.shard_size = shard_size;
  s.batch_size = o.batch_size;
  s.shuffle = o.shuffle;
  s.preprocess = preprocess;
  return s;
}

// A stream's state at batch `next_batch`: `identity` (what the stream was made with, a zero position) with the
// position of that batch. What a stream's SaveState encodes.
BatchStreamState StateAtBatch(BatchStreamState identity, int64_t next_batch);

// Whether a saved state was written by the stream `mine` describes (its numbers; the position aside):
// FailedPrecondition naming every difference ("input position: saved by another input stream: ...") otherwise.
absl::Status CheckSameStream(const BatchStreamState& saved, const BatchStreamState& mine);

}  // namespace dtrain::data

#endif  // DTRAIN_WORKER_DATA_BATCH_STREAM_STATE_H_
