// MNIST IDX reader (raw or gzip). zlib's gzread reads uncompressed files transparently, so one code path
// serves both; the gzip magic is only sniffed for the log line.
//
// IDX layout (all integers big-endian):
//   images: magic 2051, count, rows, cols, then count*rows*cols uint8 pixels (row-major)
//   labels: magic 2049, count, then count uint8 labels
#include <zlib.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "worker/data/dataset.h"

namespace dtrain::data {
namespace {

constexpr uint32_t kImagesMagic = 2051;
constexpr uint32_t kLabelsMagic = 2049;
// Upper bounds that keep a corrupt header from asking for absurd allocations.
constexpr uint32_t kMaxSide = 1 << 14;
constexpr int64_t kChunk = 1 << 20;

bool HasGzipMagic(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return false;
  unsigned char m[2] = {0, 0};
  const size_t n = std::fread(m, 1, 2, f);
  std::fclose(f);
  return n == 2 && m[0] == 0x1f && m[1] == 0x8b;
}

// An open IDX file that counts the (decompressed) bytes read so errors can give an offset.
class IdxFile {
 public:
  ~IdxFile() {
    if (gz_ != nullptr) gzclose(gz_);
  }

  absl::Status Open(const std::string& path) {
    path_ = path;
    gz_ = gzopen(path.c_str(), "rb");
    if (gz_ == nullptr) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
    gzbuffer(gz_, 1 << 17);
    VLOG(1) << path << (HasGzipMagic(path) ? ": gzip" : ": raw") << " IDX";
    return absl::OkStatus();
  }

  // Reads exactly n bytes into dst; `what` names the field in the truncation error.
  absl::Status ReadExactly(uint8_t* dst, int64_t n, const char* what) {
    int64_t done = 0;
    while (done < n) {
      const unsigned want = static_cast<unsigned>(std::min<int64_t>(n - done, kChunk));
      const int got = gzread(gz_, dst + done, want);
      if (got < 0) {
        int errnum = 0;
        const char* msg = gzerror(gz_, &errnum);
        return absl::DataLossError(absl::StrCat(path_, ": read error at byte offset ", offset_ + done, ": ",
                                                msg == nullptr ? "unknown" : msg));
      }
      if (got == 0) {
        return absl::DataLossError(absl::StrCat(path_, ": truncated at byte offset ", offset_ + done,
                                                " while reading ", what, " (needed ", n - done,
                                                " more bytes)"));
      }
      done += got;
    }
    offset_ += n;
    return absl::OkStatus();
  }

  absl::StatusOr<uint32_t> ReadBigEndian32(const char* what) {
    uint8_t b[4];
    RETURN_IF_ERROR(ReadExactly(b, 4, what));
    return (uint32_t{b[0]} << 24) | (uint32_t{b[1]} << 16) | (uint32_t{b[2]} << 8) | uint32_t{b[3]};
  }

  // Reads n bytes into a vector grown chunk by chunk, so that a lying header fails on truncation
  // rather than on allocating the claimed size up front.
  absl::Status ReadInto(std::vector<uint8_t>* out, int64_t n, const char* what) {
    out->clear();
    while (static_cast<int64_t>(out->size()) < n) {
      const int64_t have = static_cast<int64_t>(out->size());
      const int64_t step = std::min<int64_t>(n - have, 16 * kChunk);
      out->resize(have + step);
      RETURN_IF_ERROR(ReadExactly(out->data() + have, step, what));
    }
    return absl::OkStatus();
  }

  bool AtEnd() {
    unsigned char c;
    return gzread(gz_, &c, 1) == 0;
  }

  const std::string& path() const { return path_; }

 private:
  std::string path_;
  gzFile gz_ = nullptr;
  int64_t offset_ = 0;
};

absl::Status CheckMagic(const IdxFile& f, uint32_t got, uint32_t want, const char* kind) {
  if (got == want) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(f.path(), ": not an IDX ", kind, " file: magic ", got,
                                                 " (expected ", want, ")"));
}

}  // namespace

absl::StatusOr<Dataset> ReadMnistIdx(const std::string& images_path, const std::string& labels_path) {
  Dataset d;
  d.channels = 1;
  d.num_classes = 10;

  IdxFile images;
  RETURN_IF_ERROR(images.Open(images_path));
  ASSIGN_OR_RETURN(uint32_t magic, images.ReadBigEndian32("the magic number"));
  RETURN_IF_ERROR(CheckMagic(images, magic, kImagesMagic, "images"));
  ASSIGN_OR_RETURN(uint32_t count, images.ReadBigEndian32("the image count"));
  ASSIGN_OR_RETURN(uint32_t rows, images.ReadBigEndian32("the row count"));
  ASSIGN_OR_RETURN(uint32_t cols, images.ReadBigEndian32("the column count"));
  if (rows == 0 || cols == 0 || rows > kMaxSide || cols > kMaxSide) {
    return absl::InvalidArgumentError(
        absl::StrCat(images_path, ": implausible image size ", rows, "x", cols, " in the IDX header"));
  }
  d.height = static_cast<int>(rows);
  d.width = static_cast<int>(cols);
  RETURN_IF_ERROR(images.ReadInto(&d.pixels, int64_t{count} * rows * cols, "pixel data"));
  if (!images.AtEnd()) LOG(WARNING) << images_path << ": ignoring trailing bytes after " << count << " images";

  IdxFile labels;
  RETURN_IF_ERROR(labels.Open(labels_path));
  ASSIGN_OR_RETURN(magic, labels.ReadBigEndian32("the magic number"));
  RETURN_IF_ERROR(CheckMagic(labels, magic, kLabelsMagic, "labels"));
  ASSIGN_OR_RETURN(uint32_t label_count, labels.ReadBigEndian32("the label count"));
  if (label_count != count) {
    return absl::InvalidArgumentError(absl::StrCat(labels_path, ": has ", label_count, " labels but ",
                                                   images_path, " has ", count, " images"));
  }
  std::vector<uint8_t> raw;
  RETURN_IF_ERROR(labels.ReadInto(&raw, count, "label data"));
  d.labels.resize(count);
  for (uint32_t i = 0; i < count; ++i) {
    if (raw[i] >= d.num_classes) {
      return absl::InvalidArgumentError(absl::StrCat(labels_path, ": label ", int{raw[i]}, " of example ", i,
                                                     " is not below num_classes=", d.num_classes));
    }
    d.labels[i] = raw[i];
  }
  LOG(INFO) << "Read " << count << " " << rows << "x" << cols << " images from " << images_path;
  return d;
}

}  // namespace dtrain::data
