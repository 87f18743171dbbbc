// Writes NumPy .npz archives of float32 and int64 arrays, for exporting trained weights (dtrain_eval --export):
//
//   std::vector<NpyArray> arrays = {{"conv1_weights", {5, 5, 1, 32}, values},
//                                   Int64NpyArray("embedding/C1/ids", {n}, ids)};
//   RETURN_IF_ERROR(WriteNpz("/tmp/weights.npz", arrays));
//   # Python: w = numpy.load("/tmp/weights.npz")["conv1_weights"]
//
// An .npz is a zip archive with one "<name>.npy" entry per array, here STORED (uncompressed), each an NPY
// version 1.0 file: "\x93NUMPY" 1 0, a little-endian u16 header length, the header dict
// {'descr': '<f4', 'fortran_order': False, 'shape': (...), } ('<i8' for int64) padded with spaces to a multiple
// of 64 bytes and ended by '\n', then the data in C order. No zip64: the archive must stay below 4 GiB.
//
// Thread-safety: free functions without shared state.
#ifndef DTRAIN_WORKER_EVAL_NPZ_WRITER_H_
#define DTRAIN_WORKER_EVAL_NPZ_WRITER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace dtrain::worker {

enum class NpyType { kFloat32, kInt64 };

struct NpyArray {
  std::string name;            // entry name without ".npy" ('/' allowed: numpy.load() keys keep it)
  std::vector<int64_t> shape;  // empty = scalar; the product must equal the element count
  std::vector<float> data;     // C order (kFloat32)
  NpyType type = NpyType::kFloat32;
  std::vector<int64_t> int64_data = {};  // C order (kInt64)
};

// An int64 array (ids).
NpyArray Int64NpyArray(std::string name, std::vector<int64_t> shape, std::vector<int64_t> data);

// One array as an NPY v1.0 file. InvalidArgument when shape and data disagree, or data of the other type is set.
absl::StatusOr<std::string> EncodeNpy(const NpyArray& array);

// The whole archive. InvalidArgument for an empty or repeated name or a bad shape; ResourceExhausted beyond
// the 4 GiB zip limits.
absl::StatusOr<std::string> EncodeNpz(const std::vector<NpyArray>& arrays);

// EncodeNpz written atomically to `path` (common/file_util.h).
absl::Status WriteNpz(const std::string& path, const std::vector<NpyArray>& arrays);

// "conv1/weights" -> "conv1_weights": the entry name of a variable.
std::string NpzNameForVariable(const std::string& variable);

}  // namespace dtrain::worker

#endif  // DTRAIN_WORKER_EVAL_NPZ_WRITER_H_
