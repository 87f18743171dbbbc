#include "worker/eval/npz_writer.h"

#include <zlib.h>

#include <algorithm>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/file_util.h"
#include "common/status_macros.h"

namespace dtrain::worker {
namespace {

constexpr uint32_t kLocalHeaderSig = 0x04034b50;
constexpr uint32_t kCentralHeaderSig = 0x02014b50;
constexpr uint32_t kEndRecordSig = 0x06054b50;
constexpr uint16_t kVersionNeeded = 10;  // 1.0: stored entries, no features
constexpr uint16_t kDosDate = (0 << 9) | (1 << 5) | 1;  // 1980-01-01: reproducible archives
constexpr uint16_t kDosTime = 0;

void Put16(std::string* out, uint16_t v) {
  out->push_back(static_cast<char>(v & 0xff));
  out->push_back(static_cast<char>(v >> 8));
}
void Put32(std::string* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint32_t Crc32(const std::string& bytes) {
  uLong crc = crc32(0L, Z_NULL, 0);
  // zlib takes uInt lengths: feed in pieces.
  size_t done = 0;
  while (done < bytes.size()) {
    const size_t n = std::min<size_t>(bytes.size() - done, 1u << 30);
    crc = crc32(crc, reinterpret_cast<const Bytef*>(bytes.data() + done), static_cast<uInt>(n));
    done += n;
  }
  return static_cast<uint32_t>(crc);
}

}  // namespace

NpyArray Int64NpyArray(std::string name, std::vector<int64_t> shape, std::vector<int64_t> data) {
  NpyArray a{std::move(name), std::move(shape), {}};
  a.type = NpyType::kInt64;
  a.int64_data = std::move(data);
  return a;
}

absl::StatusOr<std::string> EncodeNpy(const NpyArray& array) {
  int64_t count = 1;
  for (int64_t d : array.shape) {
    if (d < 0) return absl::InvalidArgumentError(absl::StrCat("array '", array.name, "' has a negative dimension"));
    count *= d;
  }
  const bool int64 = array.type == NpyType::kInt64;
  const size_t values = int64 ? array.int64_data.size() : array.data.size();
  if (!(int64 ? array.data.empty() : array.int64_data.empty())) {
    return absl::InvalidArgumentError(absl::StrCat("array '", array.name, "' is ", int64 ? "int64" : "float32",
                                                   " but has values of the other type"));
  }
  if (count != static_cast<int64_t>(values)) {
    return absl::InvalidArgumentError(absl::StrCat("array '", array.name, "' has shape (",
                                                   absl::StrJoin(array.shape, ", "), ") but ", values, " values"));
  }
  std::string shape = absl::StrJoin(array.shape, ", ");
  if (array.shape.size() == 1) shape += ",";
  std::string header = absl::StrCat("{'descr': '", int64 ? "<i8" : "<f4", "', 'fortran_order': False, 'shape': (",
                                    shape, "), }");
  // Magic (6) + version (2) + length (2) + header + '\n' is a multiple of 64.
  const size_t unpadded = 10 + header.size() + 1;
  header.append((64 - unpadded % 64) % 64, ' ');
  header.push_back('\n');
  if (header.size() > 0xffff) return absl::InvalidArgumentError("NPY header too long (too many dimensions)");
  std::string out("\x93NUMPY\x01\x00", 8);
  Put16(&out, static_cast<uint16_t>(header.size()));
  out += header;
  // Little-endian hosts only (x86, arm64), as the header says.
  if (int64) {
    out.append(reinterpret_cast<const char*>(array.int64_data.data()), values * sizeof(int64_t));
  } else {
    out.append(reinterpret_cast<const char*>(array.data.data()), values * sizeof(float));
  }
  return out;
}

absl::StatusOr<std::string> EncodeNpz(const std::vector<NpyArray>& arrays) {
  std::string out, central;
  std::set<std::string> names;
  for (const NpyArray& a : arrays) {
    if (a.name.empty()) return absl::InvalidArgumentError("an array without a name");
    if (!names.insert(a.name).second) {
      return absl::InvalidArgumentError(absl::StrCat("two arrays are named '", a.name, "'"));
    }
    const std::string entry = a.name + ".npy";
    if (entry.size() > 0xffff) return absl::InvalidArgumentError(absl::StrCat("name too long: ", a.name));
    ASSIGN_OR_RETURN(std::string npy, EncodeNpy(a));
    if (npy.size() > 0xffffffffull || out.size() > 0xffffffffull) {
      return absl::ResourceExhaustedError("the archive would exceed 4 GiB (zip64 is not supported)");
    }
    const uint32_t crc = Crc32(npy);
    const uint32_t offset = static_cast<uint32_t>(out.size());
    const uint32_t size = static_cast<uint32_t>(npy.size());

    Put32(&out, kLocalHeaderSig);
    Put16(&out, kVersionNeeded);
    Put16(&out, 0);  // flags
    Put16(&out, 0);  // method: stored
    Put16(&out, kDosTime);
    Put16(&out, kDosDate);
    Put32(&out, crc);
    Put32(&out, size);  // compressed
    Put32(&out, size);  // uncompressed
    Put16(&out, static_cast<uint16_t>(entry.size()));
    Put16(&out, 0);  // extra field length
    out += entry;
    out += npy;

    Put32(&central, kCentralHeaderSig);
    Put16(&central, kVersionNeeded);  // made by (MS-DOS, 1.0)
    Put16(&central, kVersionNeeded);
    Put16(&central, 0);
    Put16(&central, 0);
    Put16(&central, kDosTime);
    Put16(&central, kDosDate);
    Put32(&central, crc);
    Put32(&central, size);
    Put32(&central, size);
    Put16(&central, static_cast<uint16_t>(entry.size()));
    Put16(&central, 0);  // extra
    Put16(&central, 0);  // comment
    Put16(&central, 0);  // disk number start
    Put16(&central, 0);  // internal attributes
    Put32(&central, 0);  // external attributes
    Put32(&central, offset);
    central += entry;
  }
  if (arrays.size() > 0xffff || out.size() + central.size() > 0xffffffffull) {
    return absl::ResourceExhaustedError("the archive would exceed the zip limits (zip64 is not supported)");
  }
  const uint32_t central_offset = static_cast<uint32_t>(out.size());
  out += central;
  Put32(&out, kEndRecordSig);
  Put16(&out, 0);  // this disk
  Put16(&out, 0);  // disk with the central directory
  Put16(&out, static_cast<uint16_t>(arrays.size()));
  Put16(&out, static_cast<uint16_t>(arrays.size()));
  Put32(&out, static_cast<uint32_t>(central.size()));
  Put32(&out, central_offset);
  Put16(&out, 0);  // comment length
  return out;
}

absl::Status WriteNpz(const std::string& path, const std::vector<NpyArray>& arrays) {
  ASSIGN_OR_RETURN(std::string bytes, EncodeNpz(arrays));
  return WriteFileAtomically(path, bytes);
}

std::string NpzNameForVariable(const std::string& variable) {
  std::string name = variable;
  std::replace(name.begin(), name.end(), '/', '_');
  return name;
}

}  // namespace dtrain::worker
