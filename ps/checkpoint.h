// Checkpoint files: the state of one ps task (values, optimizer slots and moving averages of its slices, and
// its step) in a versioned, checksummed file, TensorFlow-style one file per ps task and step:
//
//   <checkpoint_dir>/model.ckpt-<step>.ps<task>-of-<num_ps>
//
// The files of one step across all tasks form the checkpoint `<checkpoint_dir>/model.ckpt-<step>` (its
// "prefix"); dtrain_eval reads them all and reassembles the model's flat buffer from the slices' flat offsets.
//
// Format (version 1; integers little-endian, floats IEEE-754 float32 little-endian):
//   header   "DTRNCKPT" | u32 version | u32 body_len | body | u32 masked CRC32C(everything before it)
//            body: u32 task_index | u32 num_ps | i64 global_step | i64 task_step | str model_signature |
//                  str optimizer | u32 num_slots | u8 has_moving_averages | u32 num_slices
//            (str = u32 length + bytes)
//   slice i  u32 body_len | body | u32 masked CRC32C(body_len + body)
//            body: u32 key | str variable | i64 flat_offset | i64 length | f32 values[length] |
//                  f32 slot[num_slots][length] | f32 moving_average[length] (when has_moving_averages)
//   trailer  "DTRNTAIL" | u64 bytes before the trailer | u32 masked CRC32C(every byte before the trailer)
//
// Errors when reading (every message starts with the file name):
//   DataLoss            truncated ("truncated at byte N ..."), corrupted ("checksum mismatch in slice 3 ..."),
//                       not a checkpoint ("bad magic: not a dtrain checkpoint"), trailing garbage
//   FailedPrecondition  written by a newer format version; or (CheckCompatible) for another model, optimizer,
//                       number of ps tasks or slice layout, with a hint how to fix it
//   NotFound etc.       from the file system (common/file_util.h)
//
// Thread-safety: free functions without shared state; writing the same path from two threads concurrently is
// safe (WriteFileAtomically), the last rename wins.
#ifndef DTRAIN_PS_CHECKPOINT_H_
#define DTRAIN_PS_CHECKPOINT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ps/ps_types.h"

namespace dtrain::ps {

inline constexpr char kCheckpointMagic[] = "DTRNCKPT";  // 8 bytes, no terminator in the file
inline constexpr uint32_t kCheckpointFormatVersion = 1;

// The full state of one slice.
struct SliceState {
  SliceSpec spec;
  std::vector<float> values;                 // spec.length
  std::vector<std::vector<float>> slots;     // [slot][spec.length], Optimizer::num_slots() of them
  std::vector<float> moving_average;         // spec.length, or empty when moving averages are off
};

// What one checkpoint file holds.
struct CheckpointData {
  int task_index = 0;
  int num_ps = 1;
  // The step the checkpoint belongs to (the number in the file name): the global step on task 0 and in sync
  // mode on every task; in async mode a non-zero task's estimate of the global step (see parameter_server.h).
  int64_t global_step = 0;
  int64_t task_step = 0;  // the task's own applied-step counter (drives its learning-rate schedule)
  std::string model_signature;
  std::string optimizer;  // OptimizerConfig::name
  int num_slots = 0;
  bool has_moving_averages = false;
  std::vector<SliceState> slices;
};

// "<dir>/model.ckpt-<step>" and "<prefix>.ps<task>-of-<num_ps>".
std::string CheckpointPrefix(const std::string& dir, int64_t step);
std::string CheckpointPath(const std::string& dir, int64_t step, int task, int num_ps);

// One file found in a checkpoint directory (by name only; the content is not read).
struct CheckpointFile {
  int64_t step = 0;
  int task = 0;
  int num_ps = 0;
  std::string path;
};
// Parses a file name (without directory) of the form above; false for anything else (including the
// temporary files of an unfinished write).
bool ParseCheckpointFileName(absl::string_view name, CheckpointFile* out);
// Every checkpoint file in `dir`, sorted by (step, task). A missing directory is an empty list; other
// file-system errors are returned.
absl::StatusOr<std::vector<CheckpointFile>> ListCheckpointFiles(const std::string& dir);

// The encoding above. Serialize CHECKs that the data is self-consistent (lengths match the specs): it is
// built by the ParameterServer, not read from input.
std::string SerializeCheckpoint(const CheckpointData& data);
// Validates everything (see Errors above); `name` prefixes the messages.
absl::StatusOr<CheckpointData> ParseCheckpoint(absl::string_view bytes, const std::string& name);

// Atomic write (temporary file, fsync, rename, fsync of the directory); the directory is created if missing.
absl::Status WriteCheckpoint(const std::string& path, const CheckpointData& data);
absl::StatusOr<CheckpointData> ReadCheckpoint(const std::string& path);

// Whether `data` (read from `path`) can be restored into ps task `task` of `num_ps` configured with `config`:
// same task and number of ps tasks, model signature, optimizer and exactly the slices of config.slices.
// FailedPrecondition naming the difference and how to fix it (use another --checkpoint_dir, or the same
// model/flags as the run that wrote it).
absl::Status CheckCompatible(const CheckpointData& data, const std::string& path, const TrainConfig& config,
                             int task, int num_ps);

// The checkpoint ps task `task` of `num_ps` (configured with `config`) restores from `dir`, read, validated
// and checked with CheckCompatible; nullopt when there is none to restore. `restore_step` as in
// RegisterRequest (ps_types.h):
//   kRestoreNone    nullopt.
//   kRestoreNewest  the newest file of this task that reads back valid. A corrupt or truncated file is skipped
//                   with LOG(WARNING) "skipping corrupt checkpoint X: ...; trying the previous one"; if every
//                   file is corrupt, nullopt (with a warning). The newest valid file must be compatible: a
//                   checkpoint of another model/layout is refused (FailedPrecondition), never skipped, so two
//                   runs never mix their files in one directory.
//   k >= 0          the file of step k. Sync mode (config.mode): FailedPrecondition if it is missing, its
//                   read error (DataLoss) if it is corrupt. Async mode: falls back to kRestoreNewest with a
//                   warning.
// FailedPrecondition too when `dir` holds checkpoints only for another number of ps tasks.
struct RestorableCheckpoint {
  std::string path;
  CheckpointData data;
};
absl::StatusOr<std::optional<RestorableCheckpoint>> FindCheckpointToRestore(const std::string& dir,
                                                                           const TrainConfig& config, int task,
                                                                           int num_ps, int64_t restore_step);

// The files that make up one checkpoint, for readers of a whole checkpoint (dtrain_eval). `prefix_or_dir` is
// "<dir>/model.ckpt-<step>" (every "<prefix>.psI-of-N" file of that step), or a directory: its newest step for
// which the files of all N tasks are present and read back valid (older steps are tried when the newest is
// incomplete or corrupt, with a LOG(WARNING)). Returns the parsed files, ordered by task. NotFound when there
// is no such checkpoint (the message lists the steps there are), DataLoss/FailedPrecondition from reading,
// InvalidArgument when a step has files for several numbers of ps tasks.
absl::StatusOr<std::vector<CheckpointData>> ReadCheckpointSet(const std::string& prefix_or_dir);

// Reassembles the model's flat buffer (total_floats floats) from the slices of all tasks by their flat
// offsets: their values, or their moving averages when `moving_averages` (FailedPrecondition if the
// checkpoint has none). Verifies that the parts agree (one model signature, one step, the same num_ps) and
// that the slices cover [0, total_floats) exactly once (FailedPrecondition naming the gap, overlap or
// out-of-range slice otherwise).
absl::StatusOr<std::vector<float>> AssembleFlatBuffer(const std::vector<CheckpointData>& parts,
                                                      int64_t total_floats, bool moving_averages);

// Deletes all but the newest `keep` files of (task, num_ps) in `dir` (keep <= 0: deletes nothing). Returns
// the first deletion error, after trying them all.
absl::Status PruneCheckpoints(const std::string& dir, int task, int num_ps, int keep);

}  // namespace dtrain::ps

#endif  // DTRAIN_PS_CHECKPOINT_H_
