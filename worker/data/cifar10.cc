// CIFAR-10 binary reader. Each record is 1 label byte followed by 3072 pixel bytes stored planar
// (1024 R, then 1024 G, then 1024 B, each 32x32 row-major); Dataset holds HWC, so records are transposed.
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "worker/data/dataset.h"

namespace dtrain::data {
namespace {

constexpr int kSide = 32;
constexpr int kChannels = 3;
constexpr int kImageBytes = kSide * kSide * kChannels;  // 3072
constexpr int kRecordBytes = 1 + kImageBytes;           // 3073

absl::StatusOr<std::string> ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  const std::streamoff size = in.tellg();
  if (size < 0) return absl::DataLossError(absl::StrCat(path, ": cannot determine the file size"));
  std::string bytes(static_cast<size_t>(size), '\0');
  in.seekg(0);
  if (!in.read(bytes.data(), size)) {
    return absl::DataLossError(absl::StrCat(path, ": read failed after byte offset ", in.gcount()));
  }
  return bytes;
}

// Appends the records of one batch file to `d` (32x32x3, 10 classes).
absl::Status AppendBatch(absl::string_view bytes, const std::string& path, Dataset* d) {
  if (bytes.empty() || bytes.size() % kRecordBytes != 0) {
    return absl::DataLossError(absl::StrCat(path, ": size ", bytes.size(),
                                            " is not a positive multiple of the CIFAR-10 record size ",
                                            kRecordBytes, " (truncated or not a CIFAR-10 binary batch)"));
  }
  const int64_t n = static_cast<int64_t>(bytes.size() / kRecordBytes);
  const int64_t first = d->count();
  d->labels.resize(first + n);
  d->pixels.resize((first + n) * kImageBytes);
  for (int64_t r = 0; r < n; ++r) {
    const auto* rec = reinterpret_cast<const uint8_t*>(bytes.data()) + r * kRecordBytes;
    if (rec[0] >= d->num_classes) {
      return absl::DataLossError(absl::StrCat(path, ": label ", int{rec[0]}, " at byte offset ",
                                              r * kRecordBytes, " is not below num_classes=", d->num_classes));
    }
    d->labels[first + r] = rec[0];
    const uint8_t* planes = rec + 1;
    uint8_t* out = d->pixels.data() + (first + r) * kImageBytes;
    for (int p = 0; p < kSide * kSide; ++p) {
      for (int c = 0; c < kChannels; ++c) out[p * kChannels + c] = planes[c * kSide * kSide + p];
    }
  }
  VLOG(1) << "Read " << n << " CIFAR-10 records from " << path;
  return absl::OkStatus();
}

Dataset EmptyCifar() {
  Dataset d;
  d.height = kSide;
  d.width = kSide;
  d.channels = kChannels;
  d.num_classes = 10;
  return d;
}

}  // namespace

absl::StatusOr<Dataset> ReadCifar10Bin(const std::vector<std::string>& paths) {
  if (paths.empty()) return absl::InvalidArgumentError("ReadCifar10Bin: no files given");
  Dataset d = EmptyCifar();
  for (const std::string& path : paths) {
    absl::StatusOr<std::string> bytes = ReadWholeFile(path);
    if (!bytes.ok()) return bytes.status();
    absl::Status s = AppendBatch(*bytes, path, &d);
    if (!s.ok()) return s;
  }
  LOG(INFO) << "Read " << d.count() << " CIFAR-10 images from " << paths.size() << " file(s)";
  return d;
}

absl::StatusOr<Dataset> ParseCifar10Bin(absl::string_view bytes, const std::string& name) {
  Dataset d = EmptyCifar();
  absl::Status s = AppendBatch(bytes, name, &d);
  if (!s.ok()) return s;
  return d;
}

}  // namespace dtrain::data
