#include "ps/checkpoint.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <system_error>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/strip.h"
#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "common/file_util.h"
#include "common/status_macros.h"
#include "glog/logging.h"

namespace dtrain::ps {
namespace {

static_assert(sizeof(float) == 4, "float32 expected");
constexpr char kTrailerMagic[] = "DTRNTAIL";
constexpr size_t kMagicLen = 8;
constexpr size_t kTrailerLen = kMagicLen + 8 + 4;
// Sanity bounds, so a corrupted length cannot make the reader allocate gigabytes before the CRC check.
constexpr uint32_t kMaxStringLen = 1 << 20;

bool HostIsLittleEndian() {
  const uint32_t one = 1;
  unsigned char b;
  std::memcpy(&b, &one, 1);
  return b == 1;
}

// ---- encoding ----
void PutU32(std::string* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void PutU64(std::string* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void PutStr(std::string* out, const std::string& s) {
  PutU32(out, static_cast<uint32_t>(s.size()));
  out->append(s);
}
void PutFloats(std::string* out, const std::vector<float>& v) {
  out->append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}
void PutCrc(std::string* out, size_t from) {
  PutU32(out, crc32c::Mask(crc32c::Value(out->data() + from, out->size() - from)));
}

// ---- decoding: a cursor over the whole file; every error names the file and the byte ----
class Reader {
 public:
  Reader(absl::string_view bytes, const std::string& name) : bytes_(bytes), name_(name) {}

  size_t pos() const { return pos_; }
  void Skip(size_t n) { pos_ += n; }
  size_t size() const { return bytes_.size(); }
  const char* at(size_t p) const { return bytes_.data() + p; }

  absl::Status DataLoss(absl::string_view what) const { return absl::DataLossError(absl::StrCat(name_, ": ", what)); }

  absl::Status Need(size_t n, absl::string_view what) const {
    if (bytes_.size() - pos_ < n) {
      return DataLoss(absl::StrCat("truncated at byte ", bytes_.size(), " while reading ", what, " (needs ", n,
                                   " bytes at offset ", pos_, ")"));
    }
    return absl::OkStatus();
  }
  absl::StatusOr<uint32_t> U32(absl::string_view what) {
    RETURN_IF_ERROR(Need(4, what));
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<unsigned char>(bytes_[pos_ + i])) << (8 * i);
    pos_ += 4;
    return v;
  }
  absl::StatusOr<uint8_t> U8(absl::string_view what) {
    RETURN_IF_ERROR(Need(1, what));
    return static_cast<uint8_t>(bytes_[pos_++]);
  }
  absl::StatusOr<uint64_t> U64(absl::string_view what) {
    RETURN_IF_ERROR(Need(8, what));
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(static_cast<unsigned char>(bytes_[pos_ + i])) << (8 * i);
    pos_ += 8;
    return v;
  }
  absl::StatusOr<std::string> Str(absl::string_view what) {
    ASSIGN_OR_RETURN(uint32_t n, U32(what));
    if (n > kMaxStringLen) return DataLoss(absl::StrCat(what, " has implausible length ", n));
    RETURN_IF_ERROR(Need(n, what));
    std::string s(bytes_.substr(pos_, n));
    pos_ += n;
    return s;
  }
  absl::Status Floats(int64_t n, std::vector<float>* out, absl::string_view what) {
    RETURN_IF_ERROR(Need(static_cast<size_t>(n) * sizeof(float), what));
    out->resize(n);
    std::memcpy(out->data(), bytes_.data() + pos_, n * sizeof(float));
    pos_ += n * sizeof(float);
    return absl::OkStatus();
  }
  // Reads a stored masked CRC and compares it with the CRC of bytes [from, from_end).
  absl::Status Crc(size_t from, size_t end, absl::string_view section) {
    ASSIGN_OR_RETURN(uint32_t stored, U32(absl::StrCat("the checksum of ", section)));
    if (crc32c::Unmask(stored) != crc32c::Value(bytes_.data() + from, end - from)) {
      return DataLoss(absl::StrCat("checksum mismatch in ", section));
    }
    return absl::OkStatus();
  }

 private:
  absl::string_view bytes_;
  const std::string& name_;
  size_t pos_ = 0;
};

std::string DescribeSlice(const SliceSpec& s) {
  return absl::StrCat("key ", s.key, " '", s.variable, "' [", s.flat_offset, ", +", s.length, ")");
}

}  // namespace

std::string CheckpointPrefix(const std::string& dir, int64_t step) {
  return absl::StrCat(dir, dir.empty() || dir.back() == '/' ? "" : "/", "model.ckpt-", step);
}

std::string CheckpointPath(const std::string& dir, int64_t step, int task, int num_ps) {
  return absl::StrCat(CheckpointPrefix(dir, step), ".ps", task, "-of-", num_ps);
}

bool ParseCheckpointFileName(absl::string_view name, CheckpointFile* out) {
  constexpr absl::string_view kPrefix = "model.ckpt-";
  if (!absl::ConsumePrefix(&name, kPrefix)) return false;
  const size_t dot = name.find(".ps");
  if (dot == absl::string_view::npos) return false;
  const absl::string_view step = name.substr(0, dot);
  const absl::string_view rest = name.substr(dot + 3);
  const size_t of = rest.find("-of-");
  if (of == absl::string_view::npos) return false;
  int64_t s = 0;
  int task = 0, num_ps = 0;
  auto digits = [](absl::string_view v) {
    return !v.empty() && std::all_of(v.begin(), v.end(), [](char c) { return c >= '0' && c <= '9'; });
  };
  if (!digits(step) || !digits(rest.substr(0, of)) || !digits(rest.substr(of + 4))) return false;
  if (!absl::SimpleAtoi(step, &s) || !absl::SimpleAtoi(rest.substr(0, of), &task) ||
      !absl::SimpleAtoi(rest.substr(of + 4), &num_ps) || num_ps < 1 || task >= num_ps) {
    return false;
  }
  out->step = s;
  out->task = task;
  out->num_ps = num_ps;
  return true;
}

absl::StatusOr<std::vector<CheckpointFile>> ListCheckpointFiles(const std::string& dir) {
  namespace fs = std::filesystem;
  std::vector<CheckpointFile> files;
  std::error_code ec;
  if (!fs::exists(dir, ec)) return files;
  fs::directory_iterator it(dir, ec);
  if (ec) return ErrnoToStatus(ec.value(), absl::StrCat("cannot list checkpoint directory '", dir, "'"));
  for (; it != fs::directory_iterator(); it.increment(ec)) {
    if (ec) return ErrnoToStatus(ec.value(), absl::StrCat("cannot list checkpoint directory '", dir, "'"));
    CheckpointFile f;
    if (ParseCheckpointFileName(it->path().filename().string(), &f)) {
      f.path = it->path().string();
      files.push_back(std::move(f));
    }
  }
  std::sort(files.begin(), files.end(), [](const CheckpointFile& a, const CheckpointFile& b) {
    return std::tie(a.step, a.task, a.num_ps) < std::tie(b.step, b.task, b.num_ps);
  });
  return files;
}

std::string SerializeCheckpoint(const CheckpointData& data) {
  CHECK(HostIsLittleEndian()) << "checkpoints are written on little-endian hosts only";
  std::string out;
  int64_t floats = 0;
  for (const SliceState& s : data.slices) floats += s.spec.length * (2 + data.num_slots);
  out.reserve(256 + data.slices.size() * 64 + floats * sizeof(float));

  out.append(kCheckpointMagic, kMagicLen);
  PutU32(&out, kCheckpointFormatVersion);
  std::string body;
  PutU32(&body, static_cast<uint32_t>(data.task_index));
  PutU32(&body, static_cast<uint32_t>(data.num_ps));
  PutU64(&body, static_cast<uint64_t>(data.global_step));
  PutU64(&body, static_cast<uint64_t>(data.task_step));
  PutStr(&body, data.model_signature);
  PutStr(&body, data.optimizer);
  PutU32(&body, static_cast<uint32_t>(data.num_slots));
  body.push_back(data.has_moving_averages ? 1 : 0);
  PutU32(&body, static_cast<uint32_t>(data.slices.size()));
  PutU32(&out, static_cast<uint32_t>(body.size()));
  out.append(body);
  PutCrc(&out, 0);

  for (const SliceState& s : data.slices) {
    CHECK_EQ(static_cast<int64_t>(s.values.size()), s.spec.length) << DescribeSlice(s.spec);
    CHECK_EQ(static_cast<int>(s.slots.size()), data.num_slots) << DescribeSlice(s.spec);
    CHECK_EQ(static_cast<int64_t>(s.moving_average.size()), data.has_moving_averages ? s.spec.length : 0);
    const size_t start = out.size();
    const uint64_t body_len = 4 + 4 + s.spec.variable.size() + 8 + 8 +
                              static_cast<uint64_t>(s.spec.length) * sizeof(float) *
                                  (1 + data.num_slots + (data.has_moving_averages ? 1 : 0));
    CHECK_LT(body_len, uint64_t{1} << 32) << "slice too large for one section: " << DescribeSlice(s.spec);
    PutU32(&out, static_cast<uint32_t>(body_len));
    PutU32(&out, s.spec.key);
    PutStr(&out, s.spec.variable);
    PutU64(&out, static_cast<uint64_t>(s.spec.flat_offset));
    PutU64(&out, static_cast<uint64_t>(s.spec.length));
    PutFloats(&out, s.values);
    for (const std::vector<float>& slot : s.slots) {
      CHECK_EQ(static_cast<int64_t>(slot.size()), s.spec.length);
      PutFloats(&out, slot);
    }
    if (data.has_moving_averages) PutFloats(&out, s.moving_average);
    CHECK_EQ(out.size() - start, body_len + 4);
    PutCrc(&out, start);
  }

  const uint64_t before_trailer = out.size();
  const uint32_t whole = crc32c::Value(out.data(), out.size());
  out.append(kTrailerMagic, kMagicLen);
  PutU64(&out, before_trailer);
  PutU32(&out, crc32c::Mask(whole));
  return out;
}

absl::StatusOr<CheckpointData> ParseCheckpoint(absl::string_view bytes, const std::string& name) {
  if (!HostIsLittleEndian()) return absl::UnimplementedError("checkpoints are read on little-endian hosts only");
  Reader r(bytes, name);
  RETURN_IF_ERROR(r.Need(kMagicLen, "the magic number"));
  if (std::memcmp(r.at(0), kCheckpointMagic, kMagicLen) != 0) {
    return r.DataLoss("bad magic: not a dtrain checkpoint");
  }
  r.Skip(kMagicLen);
  ASSIGN_OR_RETURN(uint32_t version, r.U32("the format version"));
  if (version == 0 || version > kCheckpointFormatVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat(name, ": checkpoint format version ", version, ", this build reads versions 1 to ",
                     kCheckpointFormatVersion, " (written by a newer dtrain? read it with that version)"));
  }
  ASSIGN_OR_RETURN(uint32_t header_len, r.U32("the header length"));
  RETURN_IF_ERROR(r.Need(static_cast<size_t>(header_len) + 4, "the header"));
  const size_t header_start = r.pos();
  {
    Reader crc_reader(bytes, name);
    crc_reader.Skip(header_start + header_len);
    RETURN_IF_ERROR(crc_reader.Crc(0, header_start + header_len, "header"));
  }
  CheckpointData d;
  ASSIGN_OR_RETURN(uint32_t task, r.U32("the task index"));
  ASSIGN_OR_RETURN(uint32_t num_ps, r.U32("num_ps"));
  ASSIGN_OR_RETURN(uint64_t global_step, r.U64("the global step"));
  ASSIGN_OR_RETURN(uint64_t task_step, r.U64("the task step"));
  ASSIGN_OR_RETURN(d.model_signature, r.Str("the model signature"));
  ASSIGN_OR_RETURN(d.optimizer, r.Str("the optimizer name"));
  ASSIGN_OR_RETURN(uint32_t num_slots, r.U32("the number of optimizer slots"));
  ASSIGN_OR_RETURN(uint8_t has_averages, r.U8("the moving-average flag"));
  ASSIGN_OR_RETURN(uint32_t num_slices, r.U32("the number of slices"));
  if (r.pos() - header_start != header_len) {
    return r.DataLoss(absl::StrCat("checksum mismatch in header (its length field says ", header_len,
                                   " bytes, its fields take ", r.pos() - header_start, ")"));
  }
  r.Skip(4);  // the header's CRC, checked above
  if (num_ps < 1 || task >= num_ps || num_slots > 2 || has_averages > 1 ||
      static_cast<int64_t>(global_step) < 0 || static_cast<int64_t>(task_step) < 0) {
    return r.DataLoss(absl::StrCat("implausible header (task ", task, " of ", num_ps, ", steps ",
                                   static_cast<int64_t>(global_step), "/", static_cast<int64_t>(task_step),
                                   ", ", num_slots, " slots)"));
  }
  d.task_index = static_cast<int>(task);
  d.num_ps = static_cast<int>(num_ps);
  d.global_step = static_cast<int64_t>(global_step);
  d.task_step = static_cast<int64_t>(task_step);
  d.num_slots = static_cast<int>(num_slots);
  d.has_moving_averages = has_averages != 0;

  for (uint32_t i = 0; i < num_slices; ++i) {
    const std::string section = absl::StrCat("slice ", i);
    const size_t start = r.pos();
    ASSIGN_OR_RETURN(uint32_t body_len, r.U32(absl::StrCat("the length of ", section)));
    // Check the section's CRC before trusting any field of it.
    RETURN_IF_ERROR(r.Need(static_cast<size_t>(body_len) + 4, section));
    const size_t end = r.pos() + body_len;
    {
      Reader crc_reader(bytes, name);
      crc_reader.Skip(end);
      RETURN_IF_ERROR(crc_reader.Crc(start, end, section));
    }
    SliceState s;
    ASSIGN_OR_RETURN(s.spec.key, r.U32("a slice key"));
    ASSIGN_OR_RETURN(s.spec.variable, r.Str("a variable name"));
    ASSIGN_OR_RETURN(uint64_t offset, r.U64("a flat offset"));
    ASSIGN_OR_RETURN(uint64_t length, r.U64("a slice length"));
    s.spec.flat_offset = static_cast<int64_t>(offset);
    s.spec.length = static_cast<int64_t>(length);
    const uint64_t arrays = 1 + num_slots + (d.has_moving_averages ? 1 : 0);
    if (s.spec.flat_offset < 0 || s.spec.length <= 0 || r.pos() > end ||
        static_cast<uint64_t>(s.spec.length) * sizeof(float) * arrays != end - r.pos()) {
      return r.DataLoss(absl::StrCat(section, " (", DescribeSlice(s.spec), ") has a length that does not match "
                                     "its section"));
    }
    RETURN_IF_ERROR(r.Floats(s.spec.length, &s.values, "slice values"));
    s.slots.resize(num_slots);
    for (uint32_t k = 0; k < num_slots; ++k) RETURN_IF_ERROR(r.Floats(s.spec.length, &s.slots[k], "a slot"));
    if (d.has_moving_averages) RETURN_IF_ERROR(r.Floats(s.spec.length, &s.moving_average, "a moving average"));
    r.Skip(4);  // the CRC, checked above
    d.slices.push_back(std::move(s));
  }

  const size_t before_trailer = r.pos();
  RETURN_IF_ERROR(r.Need(kTrailerLen, "the trailer"));
  if (std::memcmp(r.at(r.pos()), kTrailerMagic, kMagicLen) != 0) {
    return r.DataLoss(absl::StrCat("no trailer at byte ", r.pos(), " (bad trailer magic)"));
  }
  r.Skip(kMagicLen);
  ASSIGN_OR_RETURN(uint64_t stated, r.U64("the trailer"));
  if (stated != before_trailer) {
    return r.DataLoss(absl::StrCat("the trailer says ", stated, " bytes precede it, found ", before_trailer));
  }
  RETURN_IF_ERROR(r.Crc(0, before_trailer, "trailer (whole-file checksum)"));
  if (r.pos() != r.size()) {
    return r.DataLoss(absl::StrCat(r.size() - r.pos(), " unexpected bytes after the trailer at byte ", r.pos()));
  }
  return d;
}

absl::Status WriteCheckpoint(const std::string& path, const CheckpointData& data) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(parent, ec);
    if (ec) return ErrnoToStatus(ec.value(), absl::StrCat("cannot create checkpoint directory '", parent.string(), "'"));
  }
  return WriteFileAtomically(path, SerializeCheckpoint(data));
}

absl::StatusOr<CheckpointData> ReadCheckpoint(const std::string& path) {
  ASSIGN_OR_RETURN(std::string bytes, ReadFileToString(path));
  return ParseCheckpoint(bytes, path);
}

absl::Status CheckCompatible(const CheckpointData& data, const std::string& path, const TrainConfig& config,
                             int task, int num_ps) {
  const std::string hint =
      "; restore needs the same model, optimizer and number of ps tasks as the run that wrote it: use another "
      "--checkpoint_dir (or remove the old checkpoints) to start afresh";
  if (data.task_index != task || data.num_ps != num_ps) {
    return absl::FailedPreconditionError(absl::StrCat(path, ": written by ps task ", data.task_index, " of ",
                                                      data.num_ps, ", this is ps task ", task, " of ", num_ps,
                                                      hint));
  }
  if (data.model_signature != config.model_signature) {
    return absl::FailedPreconditionError(absl::StrCat(path, ": checkpoint of another model (signature '",
                                                      data.model_signature, "', this run has '",
                                                      config.model_signature, "')", hint));
  }
  if (data.optimizer != config.optimizer.name) {
    return absl::FailedPreconditionError(absl::StrCat(path, ": written with optimizer '", data.optimizer,
                                                      "', this run uses '", config.optimizer.name, "'", hint));
  }
  std::map<uint32_t, const SliceSpec*> want;
  for (const SliceSpec& s : config.slices) want[s.key] = &s;
  if (want.size() != data.slices.size()) {
    return absl::FailedPreconditionError(absl::StrCat(path, ": holds ", data.slices.size(),
                                                      " slices, this ps task is configured with ", want.size(),
                                                      " (another variable placement)", hint));
  }
  for (const SliceState& s : data.slices) {
    auto it = want.find(s.spec.key);
    if (it == want.end() || !(*it->second == s.spec)) {
      return absl::FailedPreconditionError(absl::StrCat(
          path, ": slice ", DescribeSlice(s.spec), " does not match this ps task's slice ",
          it == want.end() ? std::string("(no such key)") : DescribeSlice(*it->second),
          " (another variable placement: --min_slice_bytes or the number of ps tasks changed?)", hint));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::optional<RestorableCheckpoint>> FindCheckpointToRestore(const std::string& dir,
                                                                           const TrainConfig& config, int task,
                                                                           int num_ps, int64_t restore_step) {
  if (restore_step == kRestoreNone || dir.empty()) return std::nullopt;
  if (restore_step < 0 && restore_step != kRestoreNewest) {
    return absl::InvalidArgumentError(absl::StrCat("restore_step ", restore_step, " is not a step, ",
                                                   kRestoreNewest, " (newest) or ", kRestoreNone, " (none)"));
  }
  ASSIGN_OR_RETURN(std::vector<CheckpointFile> files, ListCheckpointFiles(dir));
  std::vector<const CheckpointFile*> mine;  // newest first
  const CheckpointFile* other_layout = nullptr;
  for (auto it = files.rbegin(); it != files.rend(); ++it) {
    if (it->num_ps == num_ps && it->task == task) {
      mine.push_back(&*it);
    } else if (it->num_ps != num_ps) {
      other_layout = &*it;
    }
  }
  if (mine.empty()) {
    if (other_layout != nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoint directory '", dir, "' holds checkpoints written by ", other_layout->num_ps,
          " ps tasks (e.g. ", other_layout->path, "), this cluster has ", num_ps,
          ": restart with ", other_layout->num_ps, " ps tasks, or use another --checkpoint_dir to start afresh"));
    }
    return std::nullopt;
  }
  auto read = [&](const CheckpointFile& f) -> absl::StatusOr<RestorableCheckpoint> {
    ASSIGN_OR_RETURN(CheckpointData data, ReadCheckpoint(f.path));
    if (data.global_step != f.step) {
      return absl::DataLossError(absl::StrCat(f.path, ": holds step ", data.global_step,
                                              ", its name says step ", f.step));
    }
    return RestorableCheckpoint{f.path, std::move(data)};
  };
  std::optional<RestorableCheckpoint> found;
  if (restore_step >= 0) {
    const CheckpointFile* exact = nullptr;
    for (const CheckpointFile* f : mine) {
      if (f->step == restore_step) exact = f;
    }
    absl::Status problem;
    if (exact == nullptr) {
      problem = absl::FailedPreconditionError(absl::StrCat(
          "ps task ", task, " has no checkpoint for step ", restore_step, " (the step ps task 0 restored) in '",
          dir, "'; its newest is ", mine.front()->path,
          ": the checkpoint files of the ps tasks are out of step; restore them together or start afresh"));
    } else {
      absl::StatusOr<RestorableCheckpoint> r = read(*exact);
      if (r.ok()) {
        found = *std::move(r);
      } else {
        problem = r.status();
      }
    }
    if (!found.has_value()) {
      if (config.mode == "sync") return problem;
      LOG(WARNING) << "ps task " << task << ": cannot restore step " << restore_step << " like ps task 0 ("
                   << problem.message() << "); async mode: restoring this task's newest valid checkpoint instead";
    }
  }
  if (!found.has_value()) {
    int skipped = 0;
    for (size_t i = 0; i < mine.size() && !found.has_value(); ++i) {
      absl::StatusOr<RestorableCheckpoint> r = read(*mine[i]);
      if (r.ok()) {
        found = *std::move(r);
      } else if (absl::IsDataLoss(r.status()) || absl::IsNotFound(r.status())) {
        ++skipped;
        LOG(WARNING) << "skipping corrupt checkpoint " << mine[i]->path << ": " << r.status().message()
                     << (i + 1 < mine.size() ? "; trying the previous one" : "; no older one left");
      } else {
        return r.status();
      }
    }
    if (!found.has_value()) {
      LOG(WARNING) << "ps task " << task << ": no valid checkpoint in '" << dir << "' (" << skipped
                   << " corrupt files skipped): starting from the chief's initial values";
      return std::nullopt;
    }
  }
  RETURN_IF_ERROR(CheckCompatible(found->data, found->path, config, task, num_ps));
  return found;
}

namespace {

// Reads the files of `step` with `num_ps` tasks from `files` (all present), ordered by task.
absl::StatusOr<std::vector<CheckpointData>> ReadStep(const std::vector<CheckpointFile>& files, int64_t step,
                                                     int num_ps, const std::string& what) {
  std::vector<const CheckpointFile*> by_task(num_ps, nullptr);
  for (const CheckpointFile& f : files) {
    if (f.step == step && f.num_ps == num_ps) by_task[f.task] = &f;
  }
  std::vector<CheckpointData> parts;
  for (int t = 0; t < num_ps; ++t) {
    if (by_task[t] == nullptr) {
      return absl::NotFoundError(absl::StrCat(what, ": the file of ps task ", t, " of ", num_ps, " is missing"));
    }
    ASSIGN_OR_RETURN(CheckpointData d, ReadCheckpoint(by_task[t]->path));
    if (d.task_index != t || d.num_ps != num_ps || d.global_step != step) {
      return absl::DataLossError(absl::StrCat(by_task[t]->path, ": holds task ", d.task_index, " of ", d.num_ps,
                                              " at step ", d.global_step, ", its name says otherwise"));
    }
    parts.push_back(std::move(d));
  }
  return parts;
}

}  // namespace

absl::StatusOr<std::vector<CheckpointData>> ReadCheckpointSet(const std::string& prefix_or_dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(prefix_or_dir, ec)) {
    ASSIGN_OR_RETURN(std::vector<CheckpointFile> files, ListCheckpointFiles(prefix_or_dir));
    // Complete (step, num_ps) sets, newest first.
    std::map<std::pair<int64_t, int>, int> counts;
    for (const CheckpointFile& f : files) ++counts[{f.step, f.num_ps}];
    for (auto it = counts.rbegin(); it != counts.rend(); ++it) {
      const auto [step, num_ps] = it->first;
      const std::string what = CheckpointPrefix(prefix_or_dir, step);
      if (it->second != num_ps) {
        LOG(WARNING) << "skipping incomplete checkpoint " << what << " (" << it->second << " of " << num_ps
                     << " ps files); trying the previous one";
        continue;
      }
      absl::StatusOr<std::vector<CheckpointData>> parts = ReadStep(files, step, num_ps, what);
      if (parts.ok()) return parts;
      if (!absl::IsDataLoss(parts.status()) && !absl::IsNotFound(parts.status())) return parts.status();
      LOG(WARNING) << "skipping corrupt checkpoint " << what << ": " << parts.status().message()
                   << "; trying the previous one";
    }
    return absl::NotFoundError(absl::StrCat("no complete, valid checkpoint in directory '", prefix_or_dir,
                                            "' (", files.size(), " checkpoint files there)"));
  }
  const fs::path prefix(prefix_or_dir);
  std::string dir = prefix.parent_path().string();
  if (dir.empty()) dir = ".";
  CheckpointFile probe;
  if (!ParseCheckpointFileName(prefix.filename().string() + ".ps0-of-1", &probe)) {
    return absl::InvalidArgumentError(absl::StrCat("'", prefix_or_dir,
                                                   "' is neither a directory nor a checkpoint prefix "
                                                   "<dir>/model.ckpt-<step>"));
  }
  ASSIGN_OR_RETURN(std::vector<CheckpointFile> files, ListCheckpointFiles(dir));
  std::set<int> num_ps_seen;
  std::set<int64_t> steps;
  for (const CheckpointFile& f : files) {
    steps.insert(f.step);
    if (f.step == probe.step) num_ps_seen.insert(f.num_ps);
  }
  if (num_ps_seen.empty()) {
    std::string there;
    for (int64_t s : steps) absl::StrAppend(&there, there.empty() ? "" : ", ", s);
    return absl::NotFoundError(absl::StrCat("no checkpoint files ", prefix_or_dir, ".ps*-of-* (steps in '", dir,
                                            "': ", there.empty() ? "none" : there, ")"));
  }
  if (num_ps_seen.size() > 1) {
    return absl::InvalidArgumentError(absl::StrCat(prefix_or_dir, " has files for ", num_ps_seen.size(),
                                                   " different numbers of ps tasks; remove the stale ones"));
  }
  return ReadStep(files, probe.step, *num_ps_seen.begin(), prefix_or_dir);
}

absl::StatusOr<std::vector<float>> AssembleFlatBuffer(const std::vector<CheckpointData>& parts,
                                                      int64_t total_floats, bool moving_averages) {
  if (parts.empty()) return absl::InvalidArgumentError("no checkpoint files to assemble");
  std::vector<float> flat(total_floats, 0.0f);
  std::vector<char> covered(total_floats, 0);
  for (const CheckpointData& d : parts) {
    if (d.model_signature != parts[0].model_signature || d.global_step != parts[0].global_step ||
        d.num_ps != parts[0].num_ps) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the files of ps tasks 0 and ", d.task_index, " disagree (model '", parts[0].model_signature, "' vs '",
          d.model_signature, "', step ", parts[0].global_step, " vs ", d.global_step, ")"));
    }
    if (moving_averages && !d.has_moving_averages) {
      return absl::FailedPreconditionError(
          absl::StrCat("the checkpoint of step ", d.global_step, " (ps task ", d.task_index,
                       ") keeps no moving averages: trained with --moving_average_decay=0?"));
    }
    for (const SliceState& s : d.slices) {
      if (s.spec.flat_offset + s.spec.length > total_floats) {
        return absl::FailedPreconditionError(absl::StrCat("slice ", DescribeSlice(s.spec), " of ps task ",
                                                          d.task_index, " lies beyond the model's ",
                                                          total_floats, " parameters"));
      }
      const std::vector<float>& src = moving_averages ? s.moving_average : s.values;
      for (int64_t j = 0; j < s.spec.length; ++j) {
        const int64_t k = s.spec.flat_offset + j;
        if (covered[k]) {
          return absl::FailedPreconditionError(absl::StrCat("slice ", DescribeSlice(s.spec), " of ps task ",
                                                            d.task_index, " overlaps another slice at ", k));
        }
        covered[k] = 1;
        flat[k] = src[j];
      }
    }
  }
  const auto gap = std::find(covered.begin(), covered.end(), 0);
  if (gap != covered.end()) {
    return absl::FailedPreconditionError(absl::StrCat("the checkpoint does not cover parameter ",
                                                      gap - covered.begin(), " of ", total_floats,
                                                      " (files of a ps task missing, or another model?)"));
  }
  return flat;
}

absl::Status PruneCheckpoints(const std::string& dir, int task, int num_ps, int keep) {
  if (keep <= 0) return absl::OkStatus();
  ASSIGN_OR_RETURN(std::vector<CheckpointFile> files, ListCheckpointFiles(dir));
  std::vector<const CheckpointFile*> mine;
  for (const CheckpointFile& f : files) {
    if (f.task == task && f.num_ps == num_ps) mine.push_back(&f);
  }
  absl::Status first_error;
  for (size_t i = 0; i + keep < mine.size(); ++i) {  // sorted by step: the oldest first
    std::error_code ec;
    if (!std::filesystem::remove(mine[i]->path, ec) && ec) {
      absl::Status s = ErrnoToStatus(ec.value(), absl::StrCat("cannot delete old checkpoint '", mine[i]->path, "'"));
      LOG(WARNING) << s.message();
      if (first_error.ok()) first_error = s;
    }
  }
  return first_error;
}

}  // namespace dtrain::ps
