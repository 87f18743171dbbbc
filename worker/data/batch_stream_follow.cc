// FollowFiles: a BatchStream over files that keep arriving (batch_stream_follow.h). A producer thread lists the
// directory, reads each new file whole (the Criteo or TFRecord reader), takes this worker's shard of it and cuts
// batches that may span files; the consumer takes them from a short queue. A Restore moves the producer (a new
// generation: batches built before it are dropped).
#include "worker/data/batch_stream_follow.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <optional>
#include <random>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/crc32c.h"
#include "common/env.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "worker/data/criteo.h"
#include "worker/data/ctr_dataset.h"

namespace dtrain::data {
namespace {

constexpr char kMagic[] = "DTRNFPOS";
constexpr uint32_t kVersion = 1;
constexpr uint32_t kMaxNameBytes = 4096;

// ---- the position's encoding: "DTRNFPOS" | u32 version | u32 body_len | body | u32 masked CRC32C(all before) ----
// body: u64 seed | u32 shard | u32 num_shards | u32 batch_size | u8 shuffle | u32 name_len | name | u64 offset |
//       u64 next_batch
struct Position {
  uint64_t seed = 0;
  int shard = 0, num_shards = 1, batch_size = 0;
  bool shuffle = false;
  std::string file;  // the file being read ("": none yet)
  int64_t offset = 0;      // examples of its shard taken
  int64_t next_batch = 0;  // batches returned
};

void Put32(std::string* s, uint32_t v) { s->append(reinterpret_cast<const char*>(&v), 4); }
void Put64(std::string* s, uint64_t v) { s->append(reinterpret_cast<const char*>(&v), 8); }

std::string Encode(const Position& p) {
  std::string body;
  Put64(&body, p.seed);
  Put32(&body, static_cast<uint32_t>(p.shard));
  Put32(&body, static_cast<uint32_t>(p.num_shards));
  Put32(&body, static_cast<uint32_t>(p.batch_size));
  body.push_back(p.shuffle ? 1 : 0);
  Put32(&body, static_cast<uint32_t>(p.file.size()));
  body += p.file;
  Put64(&body, static_cast<uint64_t>(p.offset));
  Put64(&body, static_cast<uint64_t>(p.next_batch));
  std::string out(kMagic, 8);
  Put32(&out, kVersion);
  Put32(&out, static_cast<uint32_t>(body.size()));
  out += body;
  Put32(&out, crc32c::Mask(crc32c::Value(out.data(), out.size())));
  return out;
}

absl::StatusOr<Position> Decode(absl::string_view b) {
  auto loss = [](auto... what) { return absl::DataLossError(absl::StrCat("input position: ", what...)); };
  auto u32 = [&b](size_t at) {
    uint32_t v;
    std::memcpy(&v, b.data() + at, 4);
    return v;
  };
  auto u64 = [&b](size_t at) {
    uint64_t v;
    std::memcpy(&v, b.data() + at, 8);
    return v;
  };
  if (b.size() < 20 || std::memcmp(b.data(), kMagic, 8) != 0) return loss("not a position of a followed directory");
  if (u32(8) != kVersion) {
    return absl::FailedPreconditionError(absl::StrCat("input position: version ", u32(8), ", this dtrain reads ",
                                                      kVersion));
  }
  const uint32_t len = u32(12);
  if (len > b.size() - 20 || len < 37) return loss("truncated");
  if (crc32c::Unmask(u32(16 + len)) != crc32c::Value(b.data(), 16 + len) && !crc32c::kAcceptMismatchForFuzzing) {
    return loss("checksum mismatch");
  }
  Position p;
  size_t at = 16;
  p.seed = u64(at);
  p.shard = static_cast<int>(u32(at + 8));
  p.num_shards = static_cast<int>(u32(at + 12));
  p.batch_size = static_cast<int>(u32(at + 16));
  p.shuffle = b[at + 20] != 0;
  const uint32_t name = u32(at + 21);
  at += 25;
  if (name > kMaxNameBytes || 16 + len - at != name + 16) return loss("implausible file name length ", name);
  p.file = std::string(b.substr(at, name));
  at += name;
  p.offset = static_cast<int64_t>(u64(at));
  p.next_batch = static_cast<int64_t>(u64(at + 8));
  if (p.offset < 0 || p.next_batch < 0 || p.file.find('/') != std::string::npos) return loss("implausible fields");
  return p;
}

bool IsRegularFile(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

bool IsTfRecordName(absl::string_view n) {
  return absl::EndsWith(n, ".tfrecords") || absl::EndsWith(n, ".tfrecord");
}

// Whether `name` in the followed directory is a data file of `format`.
bool IsDataFile(const std::string& dir, const std::string& name, DataFormat format) {
  if (name.empty() || name[0] == '.' || name[0] == '_' || name == kCriteoLayoutFile || absl::EndsWith(name, ".tmp") ||
      IsTemporaryFileName(name)) {
    return false;
  }
  if (format == DataFormat::kTfRecord && !IsTfRecordName(name)) return false;
  return IsRegularFile(dir + "/" + name);
}

absl::StatusOr<Dataset> ReadFile(const std::string& path, DataFormat format, const CriteoLayout& layout) {
  ASSIGN_OR_RETURN(Dataset d, format == DataFormat::kTfRecord ? ReadTfRecordExamples(path) : ReadCriteo(path, layout));
  if (d.kind() != DataKind::kCtr) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": --follow reads click-through-rate examples (Criteo text or "
                                                   "TFRecord CTR examples); this file holds images"));
  }
  RETURN_IF_ERROR(CheckCtrDataset(d));
  return d;
}

// A file modified more recently than this may still be being written (1 s: the coarsest modification times of
// common file systems).
constexpr absl::Duration kSettle = absl::Seconds(1);

struct FileStamp {
  int64_t size = -1;  // -1: cannot stat
  int64_t mtime_ns = 0;
  bool operator==(const FileStamp& o) const { return size == o.size && mtime_ns == o.mtime_ns; }
};

FileStamp Stamp(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return {};
  return {static_cast<int64_t>(st.st_size), static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec};
}

// How much of the input a set-aside file held, for its warning: "N lines (this worker's shard: M)" of a plain
// text file (*lines = N), "N bytes" of another (gzip, TFRecord; *lines = 0), "" when it cannot be read at all.
std::string ExtentOf(const std::string& path, DataFormat format, const BatchStreamOptions& b, int64_t* lines) {
  *lines = 0;
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return "";
  std::vector<char> buf(1 << 20);
  int64_t bytes = 0, newlines = 0;
  bool text = format != DataFormat::kTfRecord;
  char last = '\n';
  size_t got;
  while ((got = std::fread(buf.data(), 1, buf.size(), f)) > 0) {
    const auto* u = reinterpret_cast<const unsigned char*>(buf.data());
    if (bytes == 0 && got >= 2 && u[0] == 0x1f && u[1] == 0x8b) text = false;  // gzip
    bytes += static_cast<int64_t>(got);
    if (text) newlines += std::count(buf.data(), buf.data() + got, '\n');
    last = buf[got - 1];
  }
  std::fclose(f);
  if (!text) return absl::StrCat(bytes, " bytes");
  *lines = newlines + (last != '\n' ? 1 : 0);  // a cut-short last line counts
  if (b.num_shards == 1) return absl::StrCat(*lines, " lines");
  const int64_t mine = *lines > b.shard_index ? (*lines - b.shard_index + b.num_shards - 1) / b.num_shards : 0;
  return absl::StrCat(*lines, " lines (this worker's shard: ", mine, ")");
}

// Reads the followed directory's new files one at a time: a read that fails while its file may still be
// written is tried again later; one that fails otherwise is the stream's error (kFail) or sets the file aside
// (kSkip: the warning, the counts). Used by one thread at a time.
class FileReader {
 public:
  struct Outcome {
    enum Kind { kRead, kRetry, kSetAside, kFailed } kind;
    absl::StatusOr<Dataset> data;  // kRead: the file's examples; kFailed: the error
    absl::Duration retry_in = absl::ZeroDuration();  // kRetry: read the file again after this long
  };

  FileReader(const FollowOptions& o, const BatchStreamOptions& b, const CriteoLayout& layout)
      : o_(o), b_(b), layout_(layout) {}

  // Reads `name` of the directory; `shape` (null for the first file) gives the features every file must have.
  Outcome Read(const std::string& name, const Dataset* shape) {
    const std::string path = o_.dir + "/" + name;
    const FileStamp before = Stamp(path);
    absl::StatusOr<Dataset> d = ReadFile(path, o_.format, layout_);
    if (d.ok() && shape != nullptr && (d->num_dense != shape->num_dense || d->num_sparse != shape->num_sparse)) {
      d = absl::InvalidArgumentError(absl::StrCat(path, ": ", d->num_dense, " dense and ", d->num_sparse,
                                                  " sparse features, the files before it have ", shape->num_dense,
                                                  " and ", shape->num_sparse));
    }
    if (d.ok()) {
      unfinished_.clear();
      return {Outcome::kRead, std::move(d)};
    }
    // Failed. Still being written? Then its end is cut short; read it again once it stops changing.
    const FileStamp after = Stamp(path);
    const absl::Time now = absl::Now();
    const absl::Duration age = now - absl::FromUnixNanos(after.mtime_ns);
    const bool changing = after.size >= 0 && (!(after == before) || age < kSettle);
    if (changing) {
      if (unfinished_ != name) {
        unfinished_ = name;
        unfinished_since_ = now;
        LOG(INFO) << "follow " << o_.dir << ": " << name << " may still be being written (" << d.status().message()
                  << "): read again once it stops changing, for up to " << absl::FormatDuration(o_.unfinished_wait);
      }
      const absl::Duration left = unfinished_since_ + o_.unfinished_wait - now;
      if (left > absl::ZeroDuration()) {
        return {Outcome::kRetry, d.status(), std::min(left, std::max(o_.poll, kSettle - age))};
      }
    }
    const std::string still =
        changing ? absl::StrCat(" (still changing after ", absl::FormatDuration(o_.unfinished_wait), ")") : "";
    unfinished_.clear();
    if (o_.bad_files == BadExamples::kFail) {
      return {Outcome::kFailed,
              absl::Status(d.status().code(), absl::StrCat(d.status().message(), still,
                                                           " (--bad_records=fail; skip sets such a file aside)"))};
    }
    int64_t lines = 0;
    const std::string extent = ExtentOf(path, o_.format, b_, &lines);
    LOG(WARNING) << "follow " << o_.dir << ": set aside " << name << ": " << d.status().message() << still << "; "
                 << (extent.empty() ? std::string("none of it") : absl::StrCat("its ", extent)) << " not trained on "
                 << "(--bad_records=skip); the input goes on with the next file";
    if (o_.set_aside != nullptr) {
      o_.set_aside->files.fetch_add(1);
      o_.set_aside->lines.fetch_add(lines);
    }
    return {Outcome::kSetAside, d.status()};
  }

 private:
  const FollowOptions& o_;
  const BatchStreamOptions& b_;
  const CriteoLayout& layout_;
  std::string unfinished_;  // the file that failed while it changed, and since when
  absl::Time unfinished_since_;
};

class FollowingBatchStream : public BatchStream {
 public:
  FollowingBatchStream(FollowOptions o, BatchStreamOptions b, CriteoLayout layout, const Dataset& shape,
                       std::string first_name, std::shared_ptr<const Dataset> first)
      : o_(std::move(o)), b_(b), layout_(layout), shape_(shape), reader_(o_, b_, layout_) {
    start_ = Position{b.seed, b.shard_index, b.num_shards, b.batch_size, b.shuffle, first_name, 0, 0};
    floor_ = first_name;
    Open(std::move(first_name), std::move(first), 0);  // no other thread yet
    producer_ = std::thread([this] { Produce(); });
  }
  ~FollowingBatchStream() override {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
    }
    producer_.join();
  }

  const Batch& Next() override {
    mu_.LockWhen(absl::Condition(this, &FollowingBatchStream::HasNextOrEnded));
    if (queue_.empty()) {
      mu_.Unlock();
      current_ = Batch();
      return current_;
    }
    current_ = std::move(queue_.front().batch);
    position_ = std::move(queue_.front().after);
    queue_.pop_front();
    mu_.Unlock();
    return current_;
  }
  int64_t shard_size() const override { return 0; }  // unknown: files keep arriving
  int64_t batches_read() const override { return position_.file.empty() ? 0 : position_.next_batch; }
  std::string SaveState() const override { return Encode(position_.file.empty() ? start_ : position_); }
  absl::Status Restore(absl::string_view state) override {
    ASSIGN_OR_RETURN(Position p, Decode(state));
    std::string differences;
    auto differ = [&differences](absl::string_view what, auto saved, auto mine) {
      if (saved == mine) return;
      absl::StrAppend(&differences, differences.empty() ? "" : ", ", what, " ", saved, " (this stream: ", mine, ")");
    };
    differ("seed", p.seed, b_.seed);
    differ("shard", p.shard, b_.shard_index);
    differ("number of shards", p.num_shards, b_.num_shards);
    differ("batch size", p.batch_size, b_.batch_size);
    differ("shuffle", static_cast<int>(p.shuffle), static_cast<int>(b_.shuffle));
    if (!differences.empty()) {
      return absl::FailedPreconditionError(absl::StrCat("input position: saved by another input stream: ",
                                                        differences, "; resume with the same --seed, --batch_size and "
                                                        "cluster size, or start the input afresh"));
    }
    if (!IsRegularFile(o_.dir + "/" + p.file)) {
      return absl::FailedPreconditionError(absl::StrCat("input position: its file ", p.file, " is no longer in ",
                                                        o_.dir));
    }
    absl::MutexLock lock(&mu_);
    ++generation_;
    restart_ = p;
    queue_.clear();
    ended_ = false;
    status_ = absl::OkStatus();
    position_ = p;
    return absl::OkStatus();
  }
  absl::Status status() const override {
    absl::MutexLock lock(&mu_);
    return status_;
  }

 private:
  struct Item {
    Batch batch;
    Position after;
  };

  bool HasNextOrEnded() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !queue_.empty() || ended_; }
  // The producer should stop what it waits for: the stream goes away, or a Restore moved it.
  bool Interrupted() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopping_ || generation_ != producer_generation_;
  }
  bool RoomOrInterrupted() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return Interrupted() || static_cast<int>(queue_.size()) < std::max(1, b_.prefetch);
  }

  // Producer: the file to read from now on, at example `offset` of its shard.
  void Open(std::string name, std::shared_ptr<const Dataset> data, int64_t offset) {
    file_name_ = std::move(name);
    cursor_ = file_name_;
    file_ = std::move(data);
    order_.clear();
    for (int64_t i = b_.shard_index; i < file_->count(); i += b_.num_shards) order_.push_back(i);
    if (b_.shuffle) {
      uint32_t name_hash = 2166136261u;  // FNV-1a: fixed across platforms, unlike std::hash
      for (char c : file_name_) name_hash = (name_hash ^ static_cast<unsigned char>(c)) * 16777619u;
      std::seed_seq seq{static_cast<uint32_t>(b_.seed), static_cast<uint32_t>(b_.seed >> 32), name_hash,
                        static_cast<uint32_t>(b_.shard_index), 0x464f4c4cu};  // "FOLL"
      std::mt19937_64 rng(seq);
      for (size_t i = order_.size(); i > 1; --i) {
        const uint64_t bound = i, limit = UINT64_MAX - UINT64_MAX % bound;
        uint64_t r;
        do {
          r = rng();
        } while (r >= limit);
        std::swap(order_[i - 1], order_[r % bound]);
      }
    }
    taken_ = std::min<int64_t>(offset, static_cast<int64_t>(order_.size()));
    seen_.insert(file_name_);
  }

  // The first data file after the cursor (the newest file read or set aside) by name; "" when there is none now.
  // A file sorting before it that this stream has not read arrived too late: skipped, with a warning.
  std::string NextFile() {
    absl::StatusOr<std::vector<std::string>> names = Env::Default()->GetChildren(o_.dir);
    if (!names.ok()) return "";
    std::vector<std::string> files;
    for (const std::string& n : *names) {
      if (IsDataFile(o_.dir, n, o_.format)) files.push_back(n);
    }
    std::sort(files.begin(), files.end());
    for (const std::string& n : files) {
      if (n > cursor_) return n;
      if (n > floor_ && !seen_.count(n) && warned_late_.insert(n).second) {
        LOG(WARNING) << "follow " << o_.dir << ": " << n << " arrived after " << cursor_
                     << " was read (files are read in the order of their names): skipped";
      }
    }
    return "";
  }

  // Ends the stream (with `why` unless OK) and waits for a Restore or the stream's end.
  void End(absl::Status why) {
    absl::MutexLock lock(&mu_);
    if (generation_ != producer_generation_) return;  // a restore came first: no end
    status_ = std::move(why);
    ended_ = true;
    mu_.Await(absl::Condition(this, &FollowingBatchStream::Interrupted));
  }

  void Produce() {
    Batch pending;
    int64_t batch_index = 0;
    absl::Time last_new_file = absl::Now();
    while (true) {
      Position restart;
      {
        absl::MutexLock lock(&mu_);
        if (stopping_) return;
        if (generation_ == producer_generation_) {
          restart.file.clear();
        } else {
          producer_generation_ = generation_;
          restart = restart_;
        }
      }
      if (!restart.file.empty()) {
        absl::StatusOr<Dataset> d = ReadFile(o_.dir + "/" + restart.file, o_.format, layout_);
        if (!d.ok()) {
          End(d.status());
          continue;
        }
        floor_ = restart.file;
        Open(restart.file, std::make_shared<const Dataset>(*std::move(d)), restart.offset);
        batch_index = restart.next_batch;
        pending = Batch();
        last_new_file = absl::Now();
        continue;  // a restore may have come again meanwhile
      }
      if (taken_ == static_cast<int64_t>(order_.size())) {
        const std::string next = NextFile();
        if (next.empty()) {
          const bool stop = o_.stop && o_.stop();
          if (stop || absl::Now() - last_new_file >= o_.idle_timeout) {
            LOG(INFO) << "follow " << o_.dir << ": "
                      << (stop ? std::string("stopped")
                               : absl::StrCat("no new file for ", absl::FormatDuration(o_.idle_timeout)))
                      << " after " << file_name_ << "; the input ends";
            End(absl::OkStatus());
            continue;
          }
          absl::MutexLock lock(&mu_);
          mu_.AwaitWithTimeout(absl::Condition(this, &FollowingBatchStream::Interrupted), o_.poll);
          continue;
        }
        FileReader::Outcome read = reader_.Read(next, &shape_);
        switch (read.kind) {
          case FileReader::Outcome::kRead:
            last_new_file = absl::Now();
            Open(next, std::make_shared<const Dataset>(*std::move(read.data)), 0);
            break;
          case FileReader::Outcome::kRetry:
            if (o_.stop && o_.stop()) {  // no waiting for an unfinished file then: it was not read
              LOG(INFO) << "follow " << o_.dir << ": stopped while " << next << " was being written; the input ends";
              End(absl::OkStatus());
              break;
            }
            {
              absl::MutexLock lock(&mu_);
              mu_.AwaitWithTimeout(absl::Condition(this, &FollowingBatchStream::Interrupted), read.retry_in);
            }
            break;
          case FileReader::Outcome::kSetAside:
            // Like a file read whole: the position stays in the file before it (no example of it was taken).
            last_new_file = absl::Now();
            cursor_ = next;
            seen_.insert(next);
            break;
          case FileReader::Outcome::kFailed:
            End(read.data.status());
            break;
        }
        continue;
      }
      // One more example; a batch once full.
      if (pending.batch == 0) StartCtrBatch(*file_, b_.batch_size, &pending);
      AppendCtrExample(*file_, order_[taken_++], &pending);
      if (pending.batch < b_.batch_size) continue;
      Item item{std::move(pending), Position{b_.seed, b_.shard_index, b_.num_shards, b_.batch_size, b_.shuffle,
                                             file_name_, taken_, ++batch_index}};
      pending = Batch();
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &FollowingBatchStream::RoomOrInterrupted));
      if (generation_ == producer_generation_ && !stopping_) queue_.push_back(std::move(item));
    }
  }

  const FollowOptions o_;
  const BatchStreamOptions b_;
  const CriteoLayout layout_;
  const Dataset shape_;  // the first file's features (no examples): every file must have them
  Position start_;  // before the first batch

  // Producer-only (set before it starts, then on its thread).
  FileReader reader_;
  std::string file_name_, floor_;  // the file being read; the first one of this stream (or of its restore)
  std::string cursor_;             // the newest file read or set aside: the next file sorts after it
  std::shared_ptr<const Dataset> file_;
  std::vector<int64_t> order_;
  int64_t taken_ = 0;
  std::set<std::string> seen_, warned_late_;

  mutable absl::Mutex mu_;
  std::deque<Item> queue_ ABSL_GUARDED_BY(mu_);
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;           // Restore()s so far
  uint64_t producer_generation_ ABSL_GUARDED_BY(mu_) = 0;  // the producer's
  Position restart_ ABSL_GUARDED_BY(mu_);

  // Consumer-only.
  Batch current_;
  Position position_;  // after the batches returned
  std::thread producer_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<BatchStream>> FollowFiles(const FollowOptions& o, const BatchStreamOptions& b,
                                                         Dataset* shape) {
  if (b.batch_size <= 0) return absl::InvalidArgumentError(absl::StrCat("batch_size ", b.batch_size, " <= 0"));
  if (b.num_shards <= 0 || b.shard_index < 0 || b.shard_index >= b.num_shards) {
    return absl::InvalidArgumentError(
        absl::StrCat("shard_index ", b.shard_index, " is not in [0, num_shards=", b.num_shards, ")"));
  }
  if (o.format != DataFormat::kCriteo && o.format != DataFormat::kTfRecord && o.format != DataFormat::kAuto) {
    return absl::InvalidArgumentError("--follow reads Criteo text or TFRecord files (--data_format=criteo|tfrecord)");
  }
  if (!Env::Default()->IsDirectory(o.dir)) {
    return absl::InvalidArgumentError(absl::StrCat("--follow: ", o.dir, " is not a directory"));
  }
  if (!(o.poll > absl::ZeroDuration())) return absl::InvalidArgumentError("--follow: the poll interval must be > 0");
  ASSIGN_OR_RETURN(const CriteoLayout layout, ReadCriteoLayout(o.dir));
  // The first file (waiting for one to arrive).
  // The first file (waiting for one to arrive; with kSkip, a bad one is set aside and the next one read).
  absl::Time start = absl::Now();
  std::string first;
  FollowOptions resolved = o;
  FileReader reader(resolved, b, layout);
  std::set<std::string> set_aside;
  bool announced = false;
  std::optional<Dataset> d;
  while (!d.has_value()) {
    absl::StatusOr<std::vector<std::string>> names = Env::Default()->GetChildren(o.dir);
    if (!names.ok()) return names.status();
    std::sort(names->begin(), names->end());
    first.clear();
    for (const std::string& n : *names) {
      if (!IsDataFile(o.dir, n, o.format) || set_aside.count(n) > 0) continue;
      first = n;
      break;
    }
    absl::Duration wait = std::min(o.poll, absl::Seconds(1));
    if (!first.empty()) {
      if (o.format == DataFormat::kAuto) {
        resolved.format = IsTfRecordName(first) ? DataFormat::kTfRecord : DataFormat::kCriteo;
      }
      FileReader::Outcome read = reader.Read(first, nullptr);
      if (read.kind == FileReader::Outcome::kRead) {
        d = *std::move(read.data);
        break;
      }
      if (read.kind == FileReader::Outcome::kFailed) return read.data.status();
      if (read.kind == FileReader::Outcome::kSetAside) {
        set_aside.insert(first);
        start = absl::Now();  // a file came
        continue;
      }
      wait = read.retry_in;
    }
    // (Not idle while a file that may be unfinished is waited for: it came.)
    if ((o.stop && o.stop()) || (first.empty() && absl::Now() - start >= o.idle_timeout)) {
      return absl::NotFoundError(absl::StrCat("--follow: no ", set_aside.empty() ? "" : "readable ",
                                              "data file arrived in ", o.dir, " within ",
                                              absl::FormatDuration(o.idle_timeout),
                                              set_aside.empty() ? "" : absl::StrCat(" (", set_aside.size(),
                                                                                    " set aside)")));
    }
    if (!announced && first.empty()) LOG(INFO) << "follow " << o.dir << ": waiting for the first file";
    announced = announced || first.empty();
    absl::SleepFor(wait);
  }
  shape->num_classes = d->num_classes;
  shape->num_dense = d->num_dense;
  shape->num_sparse = d->num_sparse;
  return std::unique_ptr<BatchStream>(new FollowingBatchStream(resolved, b, layout, *shape, first,
                                                               std::make_shared<const Dataset>(*std::move(d))));
}

}  // namespace dtrain::data
