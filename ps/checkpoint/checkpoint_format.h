// The checkpoint file format: the state of one ps task (values, optimizer slots and moving averages of its
// slices, and its step) as bytes, versioned and checksummed. No I/O here: checkpoint_dir.h names, finds,
// reads and prunes the files, checkpoint_writer.h writes them, checkpoint_set.h reads a whole
// checkpoint for evaluation.
//
// Format (version 5; integers little-endian, floats IEEE-754 float32 little-endian):
//   header   "DTRNCKPT" | u32 version | u32 body_len | body | u32 masked CRC32C(everything before it)
//            body: u32 task_index | u32 num_ps | i64 global_step | i64 task_step | str model_signature |
//                  str optimizer | u32 num_slots | u8 has_moving_averages |
//                  (version 5) u32 num_model_flags | num_model_flags x str model_flag |
//                  u32 num_slices (always the header's last field)
//            (str = u32 length + bytes)
//   slice i  u32 body_len | body | u32 masked CRC32C(body_len + body)
//            body: u32 key | str variable | i64 flat_offset | i64 length | u8 flags (version 3; bit 0: state,
//                  not trainable) | f32 values[length] |
//                  f32 slot[num_slots][length] | f32 moving_average[length] (when has_moving_averages)
//   inputs   (version 2) u32 body_len | body | u32 masked CRC32C(body_len + body)
//            body: u32 count | count x (u32 worker | str position): each worker's input position at this
//            step (worker/data/batch_stream_state.h; kept by ps task 0 only, empty elsewhere)
//   tables   (version 4) u32 body_len | body | u32 masked CRC32C(body_len + body)
//            body: str sparse_optimizer | u32 sparse_num_slots | u32 num_tables
//   table t  (version 4, num_tables of them) a spec section, then its rows in blocks:
//            u32 body_len | body | u32 masked CRC32C(body_len + body)
//            body: u32 table | str name | u32 dim | i64 rows | f32 init_scale | u64 init_seed | i64 max_rows |
//                  u32 admit_after | i64 num_rows | u32 num_blocks
//            num_blocks x (u32 body_len | body | u32 masked CRC32C(body_len + body))
//            body: u32 table | u64 count | i64 ids[count] | f32 values[count * dim] |
//                  f32 slot[sparse_num_slots][count * dim]
//            (the blocks' counts add up to num_rows; a writer keeps a block under 64 MiB)
//   trailer  "DTRNTAIL" | u64 bytes before the trailer | u32 masked CRC32C(every byte before the trailer)
// Version 1 files (no inputs section) are read as having no input positions; version 1 and 2 slices (no flags)
// as trainable; versions 1-3 as having no sparse tables; versions 1-4 as having no model flags.
//
// Errors from ParseCheckpoint (every message starts with the name it was given, usually the file's path):
//   DataLoss            truncated ("truncated at byte N ..."), corrupted ("checksum mismatch in slice 3 ..."),
//                       not a checkpoint ("bad magic: not a dtrain checkpoint"), trailing garbage, fields that
//                       cannot be true (a slice longer than its section, an impossible task index)
//   FailedPrecondition  written by a newer format version (read it with that dtrain)
//   Unimplemented       on a big-endian host
//
// Thread-safety: stateless functions, safe from any thread.
#ifndef DTRAIN_PS_CHECKPOINT_CHECKPOINT_FORMAT_H_
#define DTRAIN_PS_CHECKPOINT_CHECKPOINT_FORMAT_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ps/api/ps_types.h"

namespace dtrain::ps {

inline constexpr char kCheckpointMagic[] = "DTRNCKPT";  // 8 bytes, no terminator in the file
inline constexpr uint32_t kCheckpointFormatVersion = 5;
// The most optimizer slots per value a file may hold (rmsprop centered with momentum keeps 3: ms, momentum, mg;
// files of any version may have up to 3, the layout does not depend on the number).
inline constexpr uint32_t kMaxCheckpointSlots = 3;
// An input position larger than this is refused (it is a few dozen bytes).
inline constexpr size_t kMaxInputPositionBytes = 1024;

// The full state of one slice.
struct SliceState {
  SliceSpec spec;
  std::vector<float> values;                 // spec.length
  std::vector<std::vector<float>> slots;     // [slot][spec.length], Optimizer::num_slots() of them
  std::vector<float> moving_average;         // spec.length, or empty when moving averages are off
};

// The rows of one sparse table that exist on a task (ps/core/sparse_store.h), with their optimizer slots.
struct SparseTableState {
  SparseTableSpec spec;
  std::vector<int64_t> ids;               // one per row, no repeats
  std::vector<float> values;              // ids.size() * spec.dim: row i at [i * dim, (i + 1) * dim)
  std::vector<std::vector<float>> slots;  // [slot][ids.size() * spec.dim], SparseOptimizer::num_slots() of them
};

// What one checkpoint file holds.
// CheckpointData::input_positions: the entry of an elastic job's input cursor (the largest id the format reads).
inline constexpr int kElasticCursorKey = 1 << 20;

struct CheckpointData {
  int task_index = 0;
  int num_ps = 1;
  // The step the checkpoint belongs to (the number in the file name): the global step on task 0 and in sync
  // mode on every task; in async mode a non-zero task's estimate of the global step (see
  // ps/core/parameter_server.h).
  int64_t global_step = 0;
  int64_t task_step = 0;  // the task's own applied-step counter (drives its learning-rate schedule)
  std::string model_signature;
  std::string optimizer;  // OptimizerConfig::name
  int num_slots = 0;
  bool has_moving_averages = false;
  std::vector<SliceState> slices;
  // Ps task 0: where each worker's input stream was at this step (worker id -> BatchStream::SaveState()), so a
  // resumed run reads the batches an uninterrupted one would. Workers without a known position are absent. The
  // key kElasticCursorKey holds an elastic job's input cursor (ps/core/elastic_plan.h) as decimal digits.
  std::map<int, std::string> input_positions;
  // Version 4: the task's shard of every sparse table (TrainConfig::tables, in table order), and the sparse
  // optimizer they were trained with (its name and slots per row element). Empty before version 4.
  std::string sparse_optimizer;
  int sparse_num_slots = 0;
  std::vector<SparseTableState> tables;
  // Version 5: the chief's model and data flags ("name=value", TrainConfig::model_flags), so that dtrain_eval
  // evaluates the checkpoint without the training command line. Empty before version 5.
  std::vector<std::string> model_flags;
};

// The encoding above. CHECKs that the data is self-consistent (lengths match the specs): it is built by the
// ParameterServer, not read from input.
// `version` < kCheckpointFormatVersion writes an older format (what that version would have written; its
// readers' tests use it): no model flags before 5 (they are left out), no sparse tables before 4 (there must be
// none), no slice flags before 3 (every slice must be trainable), no inputs section before 2.
// `sparse_block_bytes`: the most bytes of rows in one block of a sparse table (tests make it small).
inline constexpr int64_t kSparseBlockBytes = int64_t{64} << 20;
std::string SerializeCheckpoint(const CheckpointData& data, uint32_t version = kCheckpointFormatVersion,
                                int64_t sparse_block_bytes = kSparseBlockBytes);
// The same bytes appended to `*out` (a delta's header before them; a buffer reused from one write to the next).
void AppendCheckpoint(const CheckpointData& data, std::string* out, uint32_t version = kCheckpointFormatVersion,
                      int64_t sparse_block_bytes = kSparseBlockBytes);

// Validates everything (see Errors above); `name` prefixes the messages.
absl::StatusOr<CheckpointData> ParseCheckpoint(absl::string_view bytes, const std::string& name);

// "key 3 'layer1/weights' [120, +40)", for messages.
std::string DescribeSlice(const SliceSpec& s);

}  // namespace dtrain::ps

#endif  // DTRAIN_PS_CHECKPOINT_CHECKPOINT_FORMAT_H_
