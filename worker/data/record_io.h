// TFRecord framing, byte-compatible with TensorFlow's tf.io.TFRecordWriter (uncompressed):
//
//   uint64 length (little-endian) | uint32 masked_crc32c(length bytes) | data | uint32 masked_crc32c(data)
//
// Example:
//   TfRecordWriter w;
//   RETURN_IF_ERROR(w.Open("/data/train.tfrecords"));
//   RETURN_IF_ERROR(w.Write(serialized_example));
//   RETURN_IF_ERROR(w.Close());            // the file appears under its name only now
//
//   TfRecordReader r;
//   RETURN_IF_ERROR(r.Open("/data/train.tfrecords"));   // or r.OpenBytes(bytes, "name") for bytes in memory
//   std::string record;
//   while (true) {
//     ASSIGN_OR_RETURN(bool got, r.Read(&record));
//     if (!got) break;                       // clean end of file
//   }
//
// Errors: NotFound when the file cannot be opened; DataLoss("<path>: corrupt record at byte offset N: ...")
// for a length or data CRC mismatch or a truncated record (N is the offset where the record starts).
//
// Thread-safety: neither class is thread-safe; use one object per thread.
#ifndef DTRAIN_WORKER_DATA_RECORD_IO_H_
#define DTRAIN_WORKER_DATA_RECORD_IO_H_

#include <cstdint>
#include <fstream>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dtrain::data {

class TfRecordReader {
 public:
  absl::Status Open(const std::string& path);
  // Reads records from `bytes` (not copied: they must outlive the reader); `name` stands for the path in
  // errors.
  void OpenBytes(absl::string_view bytes, const std::string& name);
  // Reads the next record into *record. Returns false at a clean end of file.
  absl::StatusOr<bool> Read(std::string* record);
  // Byte offset of the next record.
  int64_t offset() const { return offset_; }

 private:
  absl::Status Corrupt(int64_t at, absl::string_view what) const;
  // Reads the next n bytes of the file or of the bytes; false on a read error.
  bool ReadRaw(char* dst, int64_t n);

  std::string path_;
  std::ifstream in_;
  bool in_memory_ = false;
  absl::string_view bytes_;  // in_memory_: the whole "file"; offset_ + what Read consumed of a record so far
  int64_t bytes_pos_ = 0;
  int64_t offset_ = 0;
  int64_t file_size_ = 0;
};

class TfRecordWriter {
 public:
  ~TfRecordWriter();  // abandons (deletes) the temporary file if Close() was not called
  // Writes go to "<path>.tmp"; Close() renames it to `path`.
  absl::Status Open(const std::string& path);
  absl::Status Write(absl::string_view record);
  absl::Status Close();
  int64_t records() const { return records_; }

 private:
  std::string path_, tmp_path_;
  std::ofstream out_;
  int64_t records_ = 0;
};

// Masked CRC32C as TFRecord and LevelDB use it (exposed for tests that forge records).
uint32_t MaskedCrc32c(absl::string_view bytes);

}  // namespace dtrain::data

#endif  // DTRAIN_WORKER_DATA_RECORD_IO_H_
