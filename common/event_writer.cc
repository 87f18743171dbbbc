#include "common/event_writer.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <string.h>
#include <unistd.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/crc32c.h"
#include "common/file_util.h"
#include "glog/logging.h"

namespace dtrain {
namespace {

// Protobuf wire types and the field numbers of tensorflow.Event / Summary / Summary.Value.
constexpr uint32_t kVarint = 0;
constexpr uint32_t kFixed64 = 1;
constexpr uint32_t kLengthDelimited = 2;
constexpr uint32_t kFixed32 = 5;

constexpr uint32_t kEventWallTime = 1;     // double
constexpr uint32_t kEventStep = 2;         // int64
constexpr uint32_t kEventFileVersion = 3;  // string
constexpr uint32_t kEventSummary = 5;      // Summary
constexpr uint32_t kSummaryValue = 1;      // repeated Summary.Value
constexpr uint32_t kValueTag = 1;          // string
constexpr uint32_t kValueSimpleValue = 2;  // float
constexpr uint32_t kValueHisto = 5;        // HistogramProto
constexpr uint32_t kHistoMin = 1;          // double
constexpr uint32_t kHistoMax = 2;          // double
constexpr uint32_t kHistoNum = 3;          // double
constexpr uint32_t kHistoSum = 4;          // double
constexpr uint32_t kHistoSumSquares = 5;   // double
constexpr uint32_t kHistoBucketLimit = 6;  // repeated double, packed
constexpr uint32_t kHistoBucket = 7;       // repeated double, packed

constexpr char kFileVersion[] = "brain.Event:2";

void PutVarint(std::string* out, uint64_t v) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

void PutKey(std::string* out, uint32_t field, uint32_t wire_type) {
  PutVarint(out, (static_cast<uint64_t>(field) << 3) | wire_type);
}

void PutFixed32(std::string* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

void PutFixed64(std::string* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

void PutDouble(std::string* out, uint32_t field, double d) {
  uint64_t bits;
  std::memcpy(&bits, &d, sizeof(bits));
  PutKey(out, field, kFixed64);
  PutFixed64(out, bits);
}

void PutBytes(std::string* out, uint32_t field, absl::string_view bytes) {
  PutKey(out, field, kLengthDelimited);
  PutVarint(out, bytes.size());
  out->append(bytes.data(), bytes.size());
}

double NowSeconds() { return absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()); }

std::string EncodeFileVersionEvent(double wall_time) {
  std::string event;
  PutDouble(&event, kEventWallTime, wall_time);
  PutBytes(&event, kEventFileVersion, kFileVersion);
  return event;
}

// Event{wall_time, step, summary{value{<summary_value>}}}.
std::string EncodeSummaryEvent(double wall_time, int64_t step, const std::string& summary_value) {
  std::string summary;
  PutBytes(&summary, kSummaryValue, summary_value);

  std::string event;
  PutDouble(&event, kEventWallTime, wall_time);
  PutKey(&event, kEventStep, kVarint);
  PutVarint(&event, static_cast<uint64_t>(step));  // int64: negatives take 10 bytes, as protobuf does
  PutBytes(&event, kEventSummary, summary);
  return event;
}

std::string EncodeScalarEvent(double wall_time, int64_t step, absl::string_view tag, float value) {
  std::string summary_value;
  PutBytes(&summary_value, kValueTag, tag);
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  PutKey(&summary_value, kValueSimpleValue, kFixed32);
  PutFixed32(&summary_value, bits);
  return EncodeSummaryEvent(wall_time, step, summary_value);
}

void PutPackedDoubles(std::string* out, uint32_t field, const std::vector<double>& values) {
  std::string packed;
  packed.reserve(values.size() * 8);
  for (double d : values) {
    uint64_t bits;
    std::memcpy(&bits, &d, sizeof(bits));
    PutFixed64(&packed, bits);
  }
  PutBytes(out, field, packed);
}

std::string EncodeHistogramEvent(double wall_time, int64_t step, absl::string_view tag, const Histogram& h) {
  std::string histo;
  PutDouble(&histo, kHistoMin, h.min());
  PutDouble(&histo, kHistoMax, h.max());
  PutDouble(&histo, kHistoNum, h.num());
  PutDouble(&histo, kHistoSum, h.sum());
  PutDouble(&histo, kHistoSumSquares, h.sum_squares());
  std::vector<double> limits, counts;
  for (const auto& [limit, count] : h.EncodedBuckets()) {
    limits.push_back(limit);
    counts.push_back(count);
  }
  PutPackedDoubles(&histo, kHistoBucketLimit, limits);
  PutPackedDoubles(&histo, kHistoBucket, counts);

  std::string summary_value;
  PutBytes(&summary_value, kValueTag, tag);
  PutBytes(&summary_value, kValueHisto, histo);
  return EncodeSummaryEvent(wall_time, step, summary_value);
}

// TFRecord framing around one record.
std::string FrameRecord(absl::string_view data) {
  std::string out;
  out.reserve(data.size() + 16);
  PutFixed64(&out, data.size());
  PutFixed32(&out, crc32c::Mask(crc32c::Value(out.data(), 8)));
  out.append(data.data(), data.size());
  PutFixed32(&out, crc32c::Mask(crc32c::Value(data.data(), data.size())));
  return out;
}

std::string HostName() {
  char buf[HOST_NAME_MAX + 1] = {};
  if (::gethostname(buf, sizeof(buf) - 1) != 0 || buf[0] == '\0') return "localhost";
  return buf;
}

}  // namespace

const std::vector<double>& Histogram::DefaultLimits() {
  // As tensorflow/core/lib/histogram/histogram.cc InitDefaultBucketsInner.
  static const std::vector<double>* limits = [] {
    std::vector<double> pos;
    for (double v = 1.0e-12; v < 1.0e20; v *= 1.1) pos.push_back(v);
    pos.push_back(DBL_MAX);
    auto* all = new std::vector<double>();
    for (auto it = pos.rbegin(); it != pos.rend(); ++it) all->push_back(-*it);
    all->push_back(0.0);
    all->insert(all->end(), pos.begin(), pos.end());
    return all;
  }();
  return *limits;
}

Histogram::Histogram() : min_(DBL_MAX), max_(-DBL_MAX), counts_(DefaultLimits().size(), 0.0) {}

void Histogram::Add(double value, double count) {
  if (std::isnan(value)) return;
  const std::vector<double>& limits = DefaultLimits();
  size_t b = std::upper_bound(limits.begin(), limits.end(), value) - limits.begin();
  if (b >= counts_.size()) b = counts_.size() - 1;  // +DBL_MAX, +inf
  counts_[b] += count;
  min_ = std::min(min_, value);
  max_ = std::max(max_, value);
  num_ += count;
  sum_ += value * count;
  sum_squares_ += value * value * count;
}

void Histogram::AddAll(const float* values, int64_t n) {
  for (int64_t i = 0; i < n; ++i) Add(values[i]);
}

std::vector<std::pair<double, double>> Histogram::EncodedBuckets() const {
  const std::vector<double>& limits = DefaultLimits();
  std::vector<std::pair<double, double>> out;
  for (size_t i = 0; i < counts_.size();) {
    double end = limits[i];
    double count = counts_[i];
    ++i;
    if (count <= 0.0) {  // collapse a run of empty buckets into one, as TF's EncodeToProto does
      while (i < counts_.size() && counts_[i] <= 0.0) {
        end = limits[i];
        count = counts_[i];
        ++i;
      }
    }
    out.emplace_back(end, count);
  }
  return out;
}

absl::StatusOr<std::unique_ptr<EventWriter>> EventWriter::Create(const std::string& dir) {
  if (dir.empty()) return absl::InvalidArgumentError("EventWriter: empty directory name");
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return ErrnoToStatus(ec.value(), absl::StrCat("cannot create directory '", dir, "'"));

  const double now = NowSeconds();
  const std::string base = absl::StrCat(dir, "/events.out.tfevents.", static_cast<int64_t>(now), ".",
                                        HostName());
  // Two writers started in the same second on one host must not share a file.
  std::string path;
  int fd = -1;
  for (int attempt = 0; attempt < 1000 && fd < 0; ++attempt) {
    path = attempt == 0 ? base : absl::StrCat(base, ".", attempt);
    fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0 && errno != EEXIST) {
      return ErrnoToStatus(errno, absl::StrCat("cannot create event file '", path, "'"));
    }
  }
  if (fd < 0) return absl::AlreadyExistsError(absl::StrCat("too many event files named '", base, "*'"));
  FILE* file = ::fdopen(fd, "wb");
  if (file == nullptr) {
    int err = errno;
    ::close(fd);
    return ErrnoToStatus(err, absl::StrCat("cannot open event file '", path, "'"));
  }
  std::unique_ptr<EventWriter> writer(new EventWriter(path, file));
  {
    absl::MutexLock lock(&writer->mu_);
    absl::Status s = writer->WriteEvent(EncodeFileVersionEvent(now));
    if (!s.ok()) return s;
  }
  if (absl::Status s = writer->Flush(); !s.ok()) return s;
  return writer;
}

EventWriter::~EventWriter() {
  absl::Status s = Close();
  if (!s.ok()) LOG(ERROR) << "EventWriter: " << s;
}

absl::Status EventWriter::WriteEvent(const std::string& event) {
  if (file_ == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("event file '", path_, "' is closed"));
  }
  const std::string record = FrameRecord(event);
  if (std::fwrite(record.data(), 1, record.size(), file_) != record.size()) {
    return ErrnoToStatus(errno, absl::StrCat("cannot write event file '", path_, "'"));
  }
  return absl::OkStatus();
}

absl::Status EventWriter::AddScalar(absl::string_view tag, int64_t step, double value) {
  if (tag.empty()) return absl::InvalidArgumentError("EventWriter::AddScalar: empty tag");
  const std::string event = EncodeScalarEvent(NowSeconds(), step, tag, static_cast<float>(value));
  absl::MutexLock lock(&mu_);
  return WriteEvent(event);
}

absl::Status EventWriter::AddHistogram(absl::string_view tag, int64_t step, const Histogram& histogram) {
  if (tag.empty()) return absl::InvalidArgumentError("EventWriter::AddHistogram: empty tag");
  const std::string event = EncodeHistogramEvent(NowSeconds(), step, tag, histogram);
  absl::MutexLock lock(&mu_);
  return WriteEvent(event);
}

absl::Status EventWriter::Flush() {
  absl::MutexLock lock(&mu_);
  if (file_ == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("event file '", path_, "' is closed"));
  }
  if (std::fflush(file_) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("cannot flush event file '", path_, "'"));
  }
  return absl::OkStatus();
}

absl::Status EventWriter::Close() {
  absl::MutexLock lock(&mu_);
  if (file_ == nullptr) return absl::OkStatus();
  FILE* file = file_;
  file_ = nullptr;
  if (std::fclose(file) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("cannot close event file '", path_, "'"));
  }
  return absl::OkStatus();
}

}  // namespace dtrain
