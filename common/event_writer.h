// Writes TensorBoard event files without depending on TensorFlow.
//
//   ASSIGN_OR_RETURN(std::unique_ptr<EventWriter> writer, EventWriter::Create("/logs/train"));
//   RETURN_IF_ERROR(writer->AddScalar("loss", step, loss));
//   RETURN_IF_ERROR(writer->Flush());   // make it visible to TensorBoard now
//
// The file is `<dir>/events.out.tfevents.<unix seconds>.<hostname>` (with ".<n>" appended if that
// name is taken). It is a TFRecord file: each record is
//   uint64 length (little-endian) | uint32 masked crc32c(length) | data | uint32 masked crc32c(data)
// and each record's data is a serialized tensorflow.Event. The first event carries
// file_version "brain.Event:2"; each AddScalar() writes
//   Event{wall_time, step, summary{value{tag, simple_value}}}
// and each AddHistogram() writes
//   Event{wall_time, step, summary{value{tag, histo{min, max, num, sum, sum_squares, bucket_limit, bucket}}}}
// (TensorFlow's HistogramProto, TensorBoard's histogram and distribution dashboards).
// The few protobuf fields are encoded by hand (see event_writer.cc).
//
// Thread-safety: all methods are thread-safe (one internal mutex); records are never interleaved.
// Events are buffered: call Flush() to push them to the OS. The destructor flushes and closes.
#ifndef DTRAIN_COMMON_EVENT_WRITER_H_
#define DTRAIN_COMMON_EVENT_WRITER_H_

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace dtrain {

// A histogram of values with TensorFlow's default bucket limits (tensorflow/core/lib/histogram): exponential
// buckets 1e-12 · 1.1^k up to 1e20 on both sides of 0, plus ±DBL_MAX at the ends; bucket i counts values v with
// limit[i-1] <= v < limit[i]. Tracks min, max, count, sum and sum of squares like TF's Histogram.
//
//   Histogram h;
//   h.AddAll(weights, n);
//   RETURN_IF_ERROR(writer->AddHistogram("weights/conv1", step, h));
//
// Thread-safety: a plain value; not safe for concurrent mutation.
class Histogram {
 public:
  Histogram();

  // Adds `count` occurrences of `value`. NaN values are ignored; ±infinity land in the outermost buckets.
  void Add(double value, double count = 1);
  void AddAll(const float* values, int64_t n);

  double min() const { return min_; }  // DBL_MAX while empty, as in TF
  double max() const { return max_; }  // -DBL_MAX while empty
  double num() const { return num_; }
  double sum() const { return sum_; }
  double sum_squares() const { return sum_squares_; }

  // The (bucket_limit, bucket) pairs as TF encodes them: every non-empty bucket, and each run of empty
  // buckets merged into one empty bucket ending at the run's last limit. Never empty.
  std::vector<std::pair<double, double>> EncodedBuckets() const;

  // TF's default bucket limits (ascending; the last is DBL_MAX).
  static const std::vector<double>& DefaultLimits();

 private:
  double min_, max_, num_ = 0, sum_ = 0, sum_squares_ = 0;
  std::vector<double> counts_;  // one per DefaultLimits() entry
};

class EventWriter {
 public:
  // Creates `dir` (and parents) if needed and opens a new event file there. Errors name the path.
  static absl::StatusOr<std::unique_ptr<EventWriter>> Create(const std::string& dir);

  ~EventWriter();
  EventWriter(const EventWriter&) = delete;
  EventWriter& operator=(const EventWriter&) = delete;

  // Appends a scalar summary. `tag` must be non-empty; `value` is stored as a float (TensorBoard's
  // simple_value). Returns FailedPrecondition after Close(), the I/O error otherwise.
  absl::Status AddScalar(absl::string_view tag, int64_t step, double value);

  // Appends a histogram summary (errors as AddScalar).
  absl::Status AddHistogram(absl::string_view tag, int64_t step, const Histogram& histogram);

  // Pushes buffered events to the operating system.
  absl::Status Flush();

  // Flushes and closes the file; later calls fail with FailedPrecondition. Idempotent.
  absl::Status Close();

  // Full path of the event file.
  const std::string& path() const { return path_; }

 private:
  EventWriter(std::string path, FILE* file) : path_(std::move(path)), file_(file) {}

  absl::Status WriteEvent(const std::string& event) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string path_;
  absl::Mutex mu_;
  FILE* file_ ABSL_GUARDED_BY(mu_);  // null once closed
};

}  // namespace dtrain

#endif  // DTRAIN_COMMON_EVENT_WRITER_H_
