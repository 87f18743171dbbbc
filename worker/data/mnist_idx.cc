// MNIST IDX reader (raw or gzip), from files or from memory. One parser reads from an IdxSource: for files,
// zlib's gzread (which reads uncompressed files transparently; the gzip magic is only sniffed for the log
// line); for memory, the bytes themselves or zlib's inflate when they start with the gzip magic.
//
// IDX layout (all integers big-endian):
//   images: magic 2051, count, rows, cols, then count*rows*cols uint8 pixels (row-major)
//   labels: magic 2049, count, then count uint8 labels
#include <zlib.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
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

// Where IDX bytes come from: a file (gzip or raw, through zlib's gzread), or memory (gzip or raw).
class IdxSource {
 public:
  virtual ~IdxSource() = default;
  // Reads up to `n` (> 0) bytes into `dst`; returns how many (0 at the end), or a message on a read error.
  virtual absl::StatusOr<int64_t> Read(uint8_t* dst, int64_t n) = 0;
  // How many bytes are left, when that is known without reading them (raw memory); else -1.
  virtual int64_t Remaining() const { return -1; }
};

class GzFileSource : public IdxSource {
 public:
  ~GzFileSource() override {
    if (gz_ != nullptr) gzclose(gz_);
  }
  absl::Status Open(const std::string& path) {
    gz_ = gzopen(path.c_str(), "rb");
    if (gz_ == nullptr) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
    gzbuffer(gz_, 1 << 17);
    VLOG(1) << path << (HasGzipMagic(path) ? ": gzip" : ": raw") << " IDX";
    return absl::OkStatus();
  }
  absl::StatusOr<int64_t> Read(uint8_t* dst, int64_t n) override {
    const int got = gzread(gz_, dst, static_cast<unsigned>(std::min<int64_t>(n, kChunk)));
    if (got < 0) {
      int errnum = 0;
      const char* msg = gzerror(gz_, &errnum);
      return absl::DataLossError(msg == nullptr ? "unknown" : msg);
    }
    return got;
  }

 private:
  gzFile gz_ = nullptr;
};

class RawMemorySource : public IdxSource {
 public:
  explicit RawMemorySource(absl::string_view bytes) : bytes_(bytes) {}
  absl::StatusOr<int64_t> Read(uint8_t* dst, int64_t n) override {
    const int64_t got = std::min<int64_t>(n, Remaining());
    if (got > 0) std::memcpy(dst, bytes_.data() + pos_, static_cast<size_t>(got));  // data() may be null
    pos_ += static_cast<size_t>(got);
    return got;
  }
  int64_t Remaining() const override { return static_cast<int64_t>(bytes_.size() - pos_); }

 private:
  absl::string_view bytes_;
  size_t pos_ = 0;
};

// gzip in memory, read as gzread reads a file: concatenated members one after the other; anything after a
// member that is not another gzip member is ignored.
class GzipMemorySource : public IdxSource {
 public:
  explicit GzipMemorySource(absl::string_view bytes) : bytes_(bytes) {
    inflate_ok_ = inflateInit2(&z_, 16 + MAX_WBITS) == Z_OK;  // 16: gzip wrapper
    z_.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(bytes_.data()));
    z_.avail_in = static_cast<uInt>(bytes_.size());
  }
  ~GzipMemorySource() override {
    if (inflate_ok_) inflateEnd(&z_);
  }
  absl::StatusOr<int64_t> Read(uint8_t* dst, int64_t n) override {
    if (!inflate_ok_) return absl::InternalError("cannot initialize zlib");
    z_.next_out = dst;
    z_.avail_out = static_cast<uInt>(std::min<int64_t>(n, kChunk));
    const uInt want = z_.avail_out;
    while (!done_ && z_.avail_out == want) {
      const int rc = inflate(&z_, Z_NO_FLUSH);
      if (rc == Z_STREAM_END) {
        // Another member follows? Otherwise the rest is trailing garbage, as gzread treats it.
        if (z_.avail_in >= 2 && z_.next_in[0] == 0x1f && z_.next_in[1] == 0x8b) {
          inflateReset(&z_);
        } else {
          done_ = true;
        }
      } else if (rc == Z_BUF_ERROR && z_.avail_in == 0) {
        return absl::DataLossError("unexpected end of file (truncated gzip stream)");
      } else if (rc != Z_OK) {
        return absl::DataLossError(z_.msg != nullptr ? z_.msg : "invalid gzip data");
      }
    }
    return static_cast<int64_t>(want - z_.avail_out);
  }

 private:
  absl::string_view bytes_;
  z_stream z_{};
  bool inflate_ok_ = false;
  bool done_ = false;
};

bool IsGzip(absl::string_view bytes) {
  return bytes.size() >= 2 && static_cast<unsigned char>(bytes[0]) == 0x1f &&
         static_cast<unsigned char>(bytes[1]) == 0x8b;
}

// An IDX byte stream that counts the (decompressed) bytes read so errors can give an offset.
class IdxFile {
 public:
  IdxFile(IdxSource* source, std::string name) : source_(source), path_(std::move(name)) {}

  // Reads exactly n bytes into dst; `what` names the field in the truncation error.
  absl::Status ReadExactly(uint8_t* dst, int64_t n, const char* what) {
    int64_t done = 0;
    while (done < n) {
      absl::StatusOr<int64_t> got = source_->Read(dst + done, n - done);
      if (!got.ok()) {
        return absl::DataLossError(absl::StrCat(path_, ": read error at byte offset ", offset_ + done, ": ",
                                                got.status().message()));
      }
      if (*got == 0) return Truncated(done, n, what);
      done += *got;
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
  // rather than on allocating the claimed size up front (at once when the source knows its size).
  absl::Status ReadInto(std::vector<uint8_t>* out, int64_t n, const char* what) {
    out->clear();
    const int64_t remaining = source_->Remaining();
    if (remaining >= 0 && remaining < n) return Truncated(remaining, n, what);
    while (static_cast<int64_t>(out->size()) < n) {
      const int64_t have = static_cast<int64_t>(out->size());
      const int64_t step = std::min<int64_t>(n - have, 16 * kChunk);
      out->resize(have + step);
      RETURN_IF_ERROR(ReadExactly(out->data() + have, step, what));
    }
    return absl::OkStatus();
  }

  bool AtEnd() {
    uint8_t c;
    absl::StatusOr<int64_t> got = source_->Read(&c, 1);
    return got.ok() && *got == 0;
  }

  const std::string& path() const { return path_; }

 private:
  absl::Status Truncated(int64_t done, int64_t n, const char* what) const {
    return absl::DataLossError(absl::StrCat(path_, ": truncated at byte offset ", offset_ + done,
                                            " while reading ", what, " (needed ", n - done, " more bytes)"));
  }

  IdxSource* source_;
  std::string path_;
  int64_t offset_ = 0;
};

absl::Status CheckMagic(const IdxFile& f, uint32_t got, uint32_t want, const char* kind) {
  if (got == want) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(f.path(), ": not an IDX ", kind, " file: magic ", got,
                                                 " (expected ", want, ")"));
}

}  // namespace

namespace {

// The labels are opened only once the images have been read, so that the images' errors come first.
using SourceOpener = std::function<absl::StatusOr<std::unique_ptr<IdxSource>>()>;

absl::StatusOr<Dataset> ParseIdxPair(IdxSource* images_source, const std::string& images_path,
                                     const SourceOpener& open_labels, const std::string& labels_path) {
  Dataset d;
  d.channels = 1;
  d.num_classes = 10;

  IdxFile images(images_source, images_path);
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

  ASSIGN_OR_RETURN(std::unique_ptr<IdxSource> labels_source, open_labels());
  IdxFile labels(labels_source.get(), labels_path);
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

std::unique_ptr<IdxSource> MemorySource(absl::string_view bytes) {
  if (IsGzip(bytes)) return std::make_unique<GzipMemorySource>(bytes);
  return std::make_unique<RawMemorySource>(bytes);
}

}  // namespace

absl::StatusOr<Dataset> ReadMnistIdx(const std::string& images_path, const std::string& labels_path) {
  GzFileSource images;
  RETURN_IF_ERROR(images.Open(images_path));
  return ParseIdxPair(&images, images_path, [&labels_path]() -> absl::StatusOr<std::unique_ptr<IdxSource>> {
    auto labels = std::make_unique<GzFileSource>();
    RETURN_IF_ERROR(labels->Open(labels_path));
    return std::unique_ptr<IdxSource>(std::move(labels));
  }, labels_path);
}

absl::StatusOr<Dataset> ParseMnistIdx(absl::string_view images, absl::string_view labels,
                                      const std::string& images_name, const std::string& labels_name) {
  std::unique_ptr<IdxSource> image_source = MemorySource(images);
  return ParseIdxPair(image_source.get(), images_name,
                      [labels]() -> absl::StatusOr<std::unique_ptr<IdxSource>> { return MemorySource(labels); },
                      labels_name);
}

}  // namespace dtrain::data
