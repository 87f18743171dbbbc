// NumPy's .npy arrays and .npz archives (a zip of .npy files, stored or deflated, ZIP64 included), read in place:
// a file is memory-mapped and an array's data is a pointer into the mapping (a deflated member is inflated
// into memory instead).
//
//   ASSIGN_OR_RETURN(std::shared_ptr<const MappedFile> f, MappedFile::Open("train.npz"));
//   ASSIGN_OR_RETURN(NpzMembers members, ParseNpz(f->bytes(), f->path()));
//   ASSIGN_OR_RETURN(NpyArray x, ParseNpy(members.at("x"), "train.npz:x"));
//
// Errors: DataLoss naming the file (and member) for a malformed header, archive or truncated data;
// InvalidArgument for what is well-formed but not supported (a big-endian or object dtype, Fortran order).
//
// Thread-safety: the functions are stateless; MappedFile is immutable (read from any thread).
#ifndef DTRAIN_WORKER_DATA_NPY_FILE_H_
#define DTRAIN_WORKER_DATA_NPY_FILE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dtrain::data {

// A read-only memory mapping of a whole file (unmapped when the last reference goes).
class MappedFile {
 public:
  // NotFound / PermissionDenied / DataLoss naming the path.
  static absl::StatusOr<std::shared_ptr<const MappedFile>> Open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  absl::string_view bytes() const { return {data_, size_}; }
  const std::string& path() const { return path_; }

 private:
  MappedFile(std::string path, const char* data, size_t size) : path_(std::move(path)), data_(data), size_(size) {}
  std::string path_;
  const char* data_;
  size_t size_;
};

// The element types read (little-endian, or byte-sized): '|u1' '|i1' '|b1' '<u2' '<i2' '<f2' '<u4' '<i4' '<f4'
// '<u8' '<i8' '<f8'.
enum class NpyType { kU8, kI8, kBool, kU16, kI16, kF16, kU32, kI32, kF32, kU64, kI64, kF64 };

struct NpyArray {
  NpyType type = NpyType::kF32;
  std::vector<int64_t> shape;  // () for a scalar
  const char* data = nullptr;  // shape's product * element_size() bytes, C order; not aligned in general
  int element_size() const;
  int64_t count() const;  // elements
  std::string descr;      // as in the header, for messages
};

// Parses one .npy (bytes must outlive the result, which points into them). `name` names it in errors.
absl::StatusOr<NpyArray> ParseNpy(absl::string_view bytes, const std::string& name);

// The members of a .npz by array name ("x" for "x.npy"), each the bytes of a .npy: views into `bytes` for stored
// members, else into `inflated` (which the caller keeps with the views).
using NpzMembers = std::map<std::string, absl::string_view>;
absl::StatusOr<NpzMembers> ParseNpz(absl::string_view bytes, const std::string& name,
                                    std::vector<std::unique_ptr<std::string>>* inflated);

// Element i of an array as a double / float (any NpyType; float16 converted exactly).
double NpyValue(const NpyArray& a, int64_t i);
float HalfToFloat(uint16_t h);

}  // namespace dtrain::data

#endif  // DTRAIN_WORKER_DATA_NPY_FILE_H_
