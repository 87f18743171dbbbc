#include "worker/data/record_io.h"

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/crc32c.h"

namespace dtrain::data {
namespace {

constexpr int kHeaderBytes = 12;  // length + length crc
constexpr int kFooterBytes = 4;   // data crc

void PutLittleEndian64(uint64_t v, char* out) {
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((v >> (8 * i)) & 0xFF);
}
void PutLittleEndian32(uint32_t v, char* out) {
  for (int i = 0; i < 4; ++i) out[i] = static_cast<char>((v >> (8 * i)) & 0xFF);
}
uint64_t GetLittleEndian64(const char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}
uint32_t GetLittleEndian32(const char* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

}  // namespace

uint32_t MaskedCrc32c(absl::string_view bytes) {
  return crc32c::Mask(crc32c::Value(bytes.data(), bytes.size()));
}

absl::Status TfRecordReader::Open(const std::string& path) {
  path_ = path;
  in_.open(path, std::ios::binary | std::ios::ate);
  if (!in_) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  file_size_ = static_cast<int64_t>(in_.tellg());
  in_.seekg(0);
  offset_ = 0;
  return absl::OkStatus();
}

void TfRecordReader::OpenBytes(absl::string_view bytes, const std::string& name) {
  path_ = name;
  in_memory_ = true;
  bytes_ = bytes;
  bytes_pos_ = 0;
  file_size_ = static_cast<int64_t>(bytes.size());
  offset_ = 0;
}

bool TfRecordReader::ReadRaw(char* dst, int64_t n) {
  if (!in_memory_) return static_cast<bool>(in_.read(dst, static_cast<std::streamsize>(n)));
  if (n > file_size_ - bytes_pos_) return false;
  if (n > 0) std::memcpy(dst, bytes_.data() + bytes_pos_, static_cast<size_t>(n));  // data() may be null
  bytes_pos_ += n;
  return true;
}

absl::Status TfRecordReader::Corrupt(int64_t at, absl::string_view what) const {
  return absl::DataLossError(absl::StrCat(path_, ": corrupt record at byte offset ", at, ": ", what));
}

absl::StatusOr<bool> TfRecordReader::Read(std::string* record) {
  if (offset_ >= file_size_) return false;
  const int64_t start = offset_;
  char header[kHeaderBytes];
  if (file_size_ - start < kHeaderBytes) {
    return Corrupt(start, absl::StrCat("truncated header (", file_size_ - start, " of ", kHeaderBytes,
                                       " bytes left in the file)"));
  }
  if (!ReadRaw(header, kHeaderBytes)) return Corrupt(start, "read error in the header");
  const uint32_t length_crc = GetLittleEndian32(header + 8);
  if (MaskedCrc32c(absl::string_view(header, 8)) != length_crc && !crc32c::kAcceptMismatchForFuzzing) {
    return Corrupt(start, "length crc mismatch");
  }
  const uint64_t length = GetLittleEndian64(header);
  // The length is CRC-checked, so a huge value is a genuine claim: compare with what the file holds.
  const uint64_t left = static_cast<uint64_t>(file_size_ - start - kHeaderBytes);
  if (length > left || left - length < kFooterBytes) {
    return Corrupt(start, absl::StrCat("truncated record (length ", length, " + ", kFooterBytes,
                                       " crc bytes, but only ", left, " bytes left in the file)"));
  }
  record->resize(length);
  char footer[kFooterBytes];
  if (!ReadRaw(record->data(), static_cast<int64_t>(length)) || !ReadRaw(footer, kFooterBytes)) {
    return Corrupt(start, "read error in the record body");
  }
  if (MaskedCrc32c(*record) != GetLittleEndian32(footer) && !crc32c::kAcceptMismatchForFuzzing) {
    return Corrupt(start, "data crc mismatch");
  }
  offset_ = start + kHeaderBytes + static_cast<int64_t>(length) + kFooterBytes;
  return true;
}

TfRecordWriter::~TfRecordWriter() {
  if (out_.is_open()) {
    out_.close();
    std::remove(tmp_path_.c_str());
  }
}

absl::Status TfRecordWriter::Open(const std::string& path) {
  path_ = path;
  tmp_path_ = path + ".tmp";
  records_ = 0;
  out_.open(tmp_path_, std::ios::binary | std::ios::trunc);
  if (!out_) return absl::PermissionDeniedError(absl::StrCat(tmp_path_, ": cannot open for writing"));
  return absl::OkStatus();
}

absl::Status TfRecordWriter::Write(absl::string_view record) {
  if (!out_.is_open()) return absl::FailedPreconditionError("TfRecordWriter::Write before Open");
  char header[kHeaderBytes];
  PutLittleEndian64(record.size(), header);
  PutLittleEndian32(MaskedCrc32c(absl::string_view(header, 8)), header + 8);
  char footer[kFooterBytes];
  PutLittleEndian32(MaskedCrc32c(record), footer);
  out_.write(header, kHeaderBytes);
  out_.write(record.data(), static_cast<std::streamsize>(record.size()));
  out_.write(footer, kFooterBytes);
  if (!out_) return absl::DataLossError(absl::StrCat(tmp_path_, ": write failed (disk full?)"));
  ++records_;
  return absl::OkStatus();
}

absl::Status TfRecordWriter::Close() {
  if (!out_.is_open()) return absl::FailedPreconditionError("TfRecordWriter::Close before Open");
  out_.close();
  if (!out_) {
    std::remove(tmp_path_.c_str());
    return absl::DataLossError(absl::StrCat(tmp_path_, ": close failed (disk full?)"));
  }
  if (std::rename(tmp_path_.c_str(), path_.c_str()) != 0) {
    const std::string err = std::strerror(errno);
    std::remove(tmp_path_.c_str());
    return absl::PermissionDeniedError(absl::StrCat("cannot rename ", tmp_path_, " to ", path_, ": ", err));
  }
  return absl::OkStatus();
}

}  // namespace dtrain::data
