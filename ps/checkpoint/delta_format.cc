#include "ps/checkpoint/delta_format.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <tuple>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/strip.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "common/status_macros.h"
#include "glog/logging.h"

namespace dtrain::ps {
namespace {

constexpr size_t kMagicLen = 8;
constexpr size_t kFixedHeader = kMagicLen + 4 + 4;  // magic, version, header_len
constexpr uint32_t kMaxTables = 1 << 16;

void PutU32(std::string* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void PutU64(std::string* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
uint32_t GetU32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}
uint64_t GetU64(const char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

// The fixed part and the header (checked); `header_end` is where the state's bytes start.
struct Parsed {
  DeltaHeader header;
  std::vector<std::vector<int64_t>> removed;
  size_t state_at = 0;
};

absl::StatusOr<Parsed> ParseFront(absl::string_view bytes, const std::string& name, bool removed_ids) {
  auto loss = [&name](auto... what) { return absl::DataLossError(absl::StrCat(name, ": ", what...)); };
  if (bytes.size() < kFixedHeader) return loss("truncated at byte ", bytes.size(), " (not even a delta header)");
  if (std::memcmp(bytes.data(), kDeltaMagic, kMagicLen) != 0) return loss("bad magic: not a dtrain delta");
  const uint32_t version = GetU32(bytes.data() + kMagicLen);
  if (version > kDeltaFormatVersion || version == 0) {
    return absl::FailedPreconditionError(absl::StrCat(name, ": delta format version ", version, ", this dtrain reads ",
                                                      kDeltaFormatVersion, " (read it with the dtrain that wrote it)"));
  }
  const uint32_t header_len = GetU32(bytes.data() + kMagicLen + 4);
  if (header_len < 20 || header_len > bytes.size() - kFixedHeader || bytes.size() - kFixedHeader - header_len < 4) {
    return loss("truncated at byte ", bytes.size(), " while reading the delta header (", header_len, " bytes)");
  }
  const size_t end = kFixedHeader + header_len;
  const uint32_t stored = GetU32(bytes.data() + end);
  if (crc32c::Unmask(stored) != crc32c::Value(bytes.data(), end) && !crc32c::kAcceptMismatchForFuzzing) {
    return loss("checksum mismatch in the delta header");
  }
  Parsed p;
  const char* h = bytes.data() + kFixedHeader;
  p.header.step = static_cast<int64_t>(GetU64(h));
  p.header.prev_step = static_cast<int64_t>(GetU64(h + 8));
  const uint32_t num_tables = GetU32(h + 16);
  if (p.header.step < 0 || p.header.prev_step < -1 || p.header.prev_step >= p.header.step || num_tables > kMaxTables) {
    return loss("implausible delta header (step ", p.header.step, ", prev_step ", p.header.prev_step, ", ", num_tables,
                " tables)");
  }
  size_t at = 20;
  p.removed.resize(removed_ids ? num_tables : 0);
  for (uint32_t t = 0; t < num_tables; ++t) {
    if (header_len - at < 12) return loss("the delta header ends inside table ", t, "'s removed ids");
    const uint32_t table = GetU32(h + at);
    const uint64_t count = GetU64(h + at + 4);
    at += 12;
    if (table != t || count > (header_len - at) / 8) {
      return loss("implausible removed ids of table ", t, " (table ", table, ", ", count, " ids)");
    }
    if (removed_ids) {
      p.removed[t].resize(count);
      if (count > 0) std::memcpy(p.removed[t].data(), h + at, count * 8);
    }
    at += count * 8;
  }
  if (at != header_len) return loss("the delta header has ", header_len - at, " bytes after its last table");
  p.state_at = end + 4;
  return p;
}

// Rows of a table while deltas are applied: id -> position in the state's vectors.
class Rows {
 public:
  explicit Rows(SparseTableState* t) : t_(t) {
    index_.reserve(t->ids.size());
    for (size_t i = 0; i < t->ids.size(); ++i) index_[t->ids[i]] = i;
  }
  void Remove(int64_t id) {
    auto it = index_.find(id);
    if (it == index_.end()) return;  // removed before the state was taken, or never held
    const size_t i = it->second, last = t_->ids.size() - 1;
    index_.erase(it);
    const int dim = t_->spec.dim;
    if (i != last) {
      t_->ids[i] = t_->ids[last];
      index_[t_->ids[i]] = i;
      std::copy_n(t_->values.begin() + last * dim, dim, t_->values.begin() + i * dim);
      for (auto& s : t_->slots) std::copy_n(s.begin() + last * dim, dim, s.begin() + i * dim);
    }
    t_->ids.pop_back();
    t_->values.resize(last * dim);
    for (auto& s : t_->slots) s.resize(last * dim);
  }
  void Set(const SparseTableState& from, size_t k) {
    const int dim = t_->spec.dim;
    auto [it, inserted] = index_.try_emplace(from.ids[k], t_->ids.size());
    const size_t i = it->second;
    if (inserted) {
      t_->ids.push_back(from.ids[k]);
      t_->values.resize(t_->values.size() + dim);
      for (auto& s : t_->slots) s.resize(s.size() + dim);
    }
    std::copy_n(from.values.begin() + k * dim, dim, t_->values.begin() + i * dim);
    for (size_t s = 0; s < t_->slots.size(); ++s) {
      std::copy_n(from.slots[s].begin() + k * dim, dim, t_->slots[s].begin() + i * dim);
    }
  }

 private:
  SparseTableState* t_;
  absl::flat_hash_map<int64_t, size_t> index_;
};

}  // namespace

std::string SerializeDelta(const DeltaData& delta) {
  std::string out;
  SerializeDeltaInto(delta, &out);
  return out;
}

void SerializeDeltaInto(const DeltaData& delta, std::string* to) {
  CHECK_EQ(delta.removed.size(), delta.state.tables.size()) << "SerializeDelta: one removed list per table";
  std::string& out = *to;
  out.assign(kDeltaMagic, kMagicLen);
  PutU32(&out, kDeltaFormatVersion);
  std::string header;
  PutU64(&header, static_cast<uint64_t>(delta.state.global_step));
  PutU64(&header, static_cast<uint64_t>(delta.prev_step));
  PutU32(&header, static_cast<uint32_t>(delta.removed.size()));
  for (size_t t = 0; t < delta.removed.size(); ++t) {
    PutU32(&header, static_cast<uint32_t>(t));
    PutU64(&header, delta.removed[t].size());
    header.append(reinterpret_cast<const char*>(delta.removed[t].data()), delta.removed[t].size() * 8);
  }
  PutU32(&out, static_cast<uint32_t>(header.size()));
  out += header;
  PutU32(&out, crc32c::Mask(crc32c::Value(out.data(), out.size())));
  AppendCheckpoint(delta.state, &out);
}

absl::StatusOr<DeltaHeader> ParseDeltaHeader(absl::string_view bytes, const std::string& name) {
  ASSIGN_OR_RETURN(Parsed p, ParseFront(bytes, name, /*removed_ids=*/false));
  return p.header;
}

absl::StatusOr<DeltaData> ParseDelta(absl::string_view bytes, const std::string& name) {
  ASSIGN_OR_RETURN(Parsed p, ParseFront(bytes, name, /*removed_ids=*/true));
  DeltaData d;
  d.prev_step = p.header.prev_step;
  d.removed = std::move(p.removed);
  ASSIGN_OR_RETURN(d.state, ParseCheckpoint(bytes.substr(p.state_at), absl::StrCat(name, " (state)")));
  if (d.state.global_step != p.header.step || d.state.tables.size() != d.removed.size()) {
    return absl::DataLossError(absl::StrCat(name, ": the header says step ", p.header.step, " and ", d.removed.size(),
                                            " tables, the state step ", d.state.global_step, " and ",
                                            d.state.tables.size(), " tables"));
  }
  return d;
}

absl::StatusOr<DeltaHeader> ReadDeltaHeader(Env* env, const std::string& path) {
  if (env != Env::Default()) {  // Env reads whole files (tests' fault-injecting ones)
    ASSIGN_OR_RETURN(std::string bytes, env->ReadFile(path));
    return ParseDeltaHeader(bytes, path);
  }
  // The fixed part, then the header and its checksum: a follower lists deltas often, and they can be large.
  std::ifstream f(path, std::ios::binary);
  if (!f) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::string bytes(kFixedHeader, '\0');
  f.read(bytes.data(), kFixedHeader);
  if (static_cast<size_t>(f.gcount()) == kFixedHeader) {
    const uint32_t header_len = GetU32(bytes.data() + kMagicLen + 4);
    if (header_len < (uint32_t{1} << 30)) {
      bytes.resize(kFixedHeader + header_len + 4);
      f.read(bytes.data() + kFixedHeader, header_len + 4);
      bytes.resize(kFixedHeader + static_cast<size_t>(f.gcount()));
    }
  } else {
    bytes.resize(static_cast<size_t>(f.gcount()));
  }
  bytes.append(4, '\0');  // ParseFront wants room for a state behind the header; the state is not read here
  return ParseDeltaHeader(bytes, path);
}

absl::StatusOr<DeltaData> ReadDelta(Env* env, const std::string& path) {
  ASSIGN_OR_RETURN(std::string bytes, env->ReadFile(path));
  return ParseDelta(bytes, path);
}

absl::Status ApplyDelta(const DeltaData& delta, CheckpointData* state) {
  const CheckpointData& d = delta.state;
  auto refuse = [&](auto... what) {
    return absl::FailedPreconditionError(absl::StrCat("delta of step ", d.global_step, " (after step ",
                                                      delta.prev_step, ") does not apply to the state of step ",
                                                      state->global_step, ": ", what...));
  };
  if (d.task_index != state->task_index || d.num_ps != state->num_ps) {
    return refuse("it is of ps task ", d.task_index, " of ", d.num_ps, ", the state of task ", state->task_index,
                  " of ", state->num_ps);
  }
  if (d.model_signature != state->model_signature || d.sparse_optimizer != state->sparse_optimizer ||
      d.sparse_num_slots != state->sparse_num_slots || d.tables.size() != state->tables.size()) {
    return refuse("another model, sparse optimizer or set of tables");
  }
  if (state->global_step < delta.prev_step || state->global_step >= d.global_step) {
    return refuse("it applies to steps [", delta.prev_step, ", ", d.global_step, ")");
  }
  for (size_t t = 0; t < d.tables.size(); ++t) {
    const SparseTableState& from = d.tables[t];
    SparseTableState& to = state->tables[t];
    if (from.spec.name != to.spec.name || from.spec.dim != to.spec.dim || from.slots.size() != to.slots.size()) {
      return refuse("table ", t, " is '", from.spec.name, "' of dim ", from.spec.dim, " there, '", to.spec.name,
                    "' of dim ", to.spec.dim, " here");
    }
  }
  for (size_t t = 0; t < d.tables.size(); ++t) {
    Rows rows(&state->tables[t]);
    for (int64_t id : delta.removed[t]) rows.Remove(id);
    for (size_t k = 0; k < d.tables[t].ids.size(); ++k) rows.Set(d.tables[t], k);
  }
  state->global_step = d.global_step;
  state->task_step = d.task_step;
  state->optimizer = d.optimizer;
  state->num_slots = d.num_slots;
  state->has_moving_averages = d.has_moving_averages;
  state->slices = d.slices;
  state->input_positions = d.input_positions;
  return absl::OkStatus();
}

std::string DeltaPath(const std::string& dir, int64_t step, int task, int num_ps) {
  return absl::StrCat(dir, dir.empty() || dir.back() == '/' ? "" : "/", "model.delta-", step, ".ps", task, "-of-",
                      num_ps);
}

bool ParseDeltaFileName(absl::string_view name, DeltaFile* out) {
  if (!absl::ConsumePrefix(&name, "model.delta-")) return false;
  const size_t dot = name.find(".ps");
  if (dot == absl::string_view::npos) return false;
  const absl::string_view step = name.substr(0, dot), rest = name.substr(dot + 3);
  const size_t of = rest.find("-of-");
  if (of == absl::string_view::npos) return false;
  auto digits = [](absl::string_view v) {
    return !v.empty() && v.size() <= 18 && std::all_of(v.begin(), v.end(), [](char c) { return c >= '0' && c <= '9'; });
  };
  if (!digits(step) || !digits(rest.substr(0, of)) || !digits(rest.substr(of + 4))) return false;
  DeltaFile f;
  if (!absl::SimpleAtoi(step, &f.step) || !absl::SimpleAtoi(rest.substr(0, of), &f.task) ||
      !absl::SimpleAtoi(rest.substr(of + 4), &f.num_ps) || f.num_ps < 1 || f.task >= f.num_ps) {
    return false;
  }
  *out = f;
  return true;
}

absl::StatusOr<std::vector<DeltaFile>> ListDeltaFiles(Env* env, const std::string& dir) {
  std::vector<DeltaFile> files;
  if (dir.empty() || !env->FileExists(dir)) return files;
  absl::StatusOr<std::vector<std::string>> names = env->GetChildren(dir);
  if (absl::IsNotFound(names.status())) return files;
  if (!names.ok()) {
    return absl::Status(names.status().code(), absl::StrCat("cannot list delta directory: ", names.status().message()));
  }
  for (const std::string& name : *names) {
    DeltaFile f;
    if (ParseDeltaFileName(name, &f)) {
      f.path = DeltaPath(dir, f.step, f.task, f.num_ps);
      files.push_back(std::move(f));
    }
  }
  std::sort(files.begin(), files.end(), [](const DeltaFile& a, const DeltaFile& b) {
    return std::tie(a.step, a.task, a.num_ps) < std::tie(b.step, b.task, b.num_ps);
  });
  return files;
}

}  // namespace dtrain::ps
