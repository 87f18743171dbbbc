#include "worker/data/batch_stream_state.h"

#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/crc32c.h"

namespace dtrain::data {
namespace {

constexpr size_t kMagicLen = 8;
constexpr size_t kBodyLen = 8 + 4 + 4 + 8 + 4 + 1 + 1 + 8 + 8 + 8;  // 54

void PutU32(std::string* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void PutU64(std::string* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
uint64_t GetLittleEndian(const char* p, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

absl::Status Bad(absl::string_view what) {
  return absl::DataLossError(absl::StrCat("input position: ", what));
}

}  // namespace

std::string EncodeBatchStreamState(const BatchStreamState& s) {
  std::string out(kBatchStreamStateMagic, kMagicLen);
  PutU32(&out, kBatchStreamStateVersion);
  PutU32(&out, static_cast<uint32_t>(kBodyLen));
  PutU64(&out, s.seed);
  PutU32(&out, static_cast<uint32_t>(s.shard_index));
  PutU32(&out, static_cast<uint32_t>(s.num_shards));
  PutU64(&out, static_cast<uint64_t>(s.shard_size));
  PutU32(&out, static_cast<uint32_t>(s.batch_size));
  out.push_back(s.shuffle ? 1 : 0);
  out.push_back(static_cast<char>(s.preprocess));
  PutU64(&out, static_cast<uint64_t>(s.epoch));
  PutU64(&out, static_cast<uint64_t>(s.offset));
  PutU64(&out, static_cast<uint64_t>(s.next_batch));
  PutU32(&out, crc32c::Mask(crc32c::Value(out.data(), out.size())));
  return out;
}

absl::StatusOr<BatchStreamState> DecodeBatchStreamState(absl::string_view b) {
  if (b.size() < kMagicLen || std::memcmp(b.data(), kBatchStreamStateMagic, kMagicLen) != 0) {
    return Bad("not a saved input position (bad magic)");
  }
  if (b.size() < kMagicLen + 8) return Bad(absl::StrCat("truncated at byte ", b.size(), " (header)"));
  const auto version = static_cast<uint32_t>(GetLittleEndian(b.data() + 8, 4));
  if (version == 0 || version > kBatchStreamStateVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat("input position: format version ", version, ", this build reads versions 1 to ",
                     kBatchStreamStateVersion, " (saved by a newer dtrain? resume with that version)"));
  }
  const uint64_t body_len = GetLittleEndian(b.data() + 12, 4);
  if (body_len != kBodyLen)
    return Bad(absl::StrCat("body of ", body_len, " bytes, version 1 has ", kBodyLen));
  const size_t total = kMagicLen + 8 + kBodyLen + 4;
  if (b.size() < total) return Bad(absl::StrCat("truncated at byte ", b.size(), " of ", total));
  if (b.size() > total) return Bad(absl::StrCat(b.size() - total, " unexpected bytes after the checksum"));
  const uint32_t stored = static_cast<uint32_t>(GetLittleEndian(b.data() + total - 4, 4));
  if (crc32c::Unmask(stored) != crc32c::Value(b.data(), total - 4) && !crc32c::kAcceptMismatchForFuzzing) {
    return Bad("checksum mismatch");
  }
  const char* p = b.data() + kMagicLen + 8;
  BatchStreamState s;
  s.seed = GetLittleEndian(p, 8);
  const uint64_t shard_index = GetLittleEndian(p + 8, 4);
  const uint64_t num_shards = GetLittleEndian(p + 12, 4);
  const uint64_t shard_size = GetLittleEndian(p + 16, 8);
  const uint64_t batch_size = GetLittleEndian(p + 24, 4);
  const auto shuffle = static_cast<unsigned char>(p[28]);
  s.preprocess = static_cast<unsigned char>(p[29]);
  const uint64_t epoch = GetLittleEndian(p + 30, 8);
  const uint64_t offset = GetLittleEndian(p + 38, 8);
  const uint64_t next_batch = GetLittleEndian(p + 46, 8);
  constexpr uint64_t kMaxInt = std::numeric_limits<int>::max();
  constexpr uint64_t kMaxInt64 = std::numeric_limits<int64_t>::max();
  if (num_shards < 1 || num_shards > kMaxInt || shard_index >= num_shards || shard_size < 1 ||
      shard_size > kMaxInt64 || batch_size < 1 || batch_size > kMaxInt || shuffle > 1) {
    return Bad(absl::StrCat("implausible stream (shard ", shard_index, " of ", num_shards, ", ", shard_size,
                            " examples, batch ", batch_size, ", shuffle ", int{shuffle}, ")"));
  }
  // The position must be one place, said two ways: batch next_batch starts at epoch * shard_size + offset.
  // Compared by division, so no product can overflow.
  if (offset >= shard_size || epoch > kMaxInt64 || next_batch > kMaxInt64 / batch_size ||
      next_batch * batch_size / shard_size != epoch || next_batch * batch_size % shard_size != offset) {
    return Bad(absl::StrCat("inconsistent position (epoch ", epoch, ", offset ", offset, " of ", shard_size,
                            ", batch ", next_batch, " of ", batch_size, ")"));
  }
  s.shard_index = static_cast<int>(shard_index);
  s.num_shards = static_cast<int>(num_shards);
  s.shard_size = static_cast<int64_t>(shard_size);
  s.batch_size = static_cast<int>(batch_size);
  s.shuffle = shuffle != 0;
  s.epoch = static_cast<int64_t>(epoch);
  s.offset = static_cast<int64_t>(offset);
  s.next_batch = static_cast<int64_t>(next_batch);
  return s;
}

BatchStreamState StateAtBatch(BatchStreamState identity, int64_t next_batch) {
  const int64_t first = next_batch * identity.batch_size;
  BatchStreamState s = std::move(identity);
  s.epoch = first / s.shard_size;
  s.offset = first % s.shard_size;
  s.next_batch = next_batch;
  return s;
}

absl::Status CheckSameStream(const BatchStreamState& s, const BatchStreamState& me) {
  std::string differences;
  auto differ = [&differences](absl::string_view what, auto saved, auto mine) {
    if (saved == mine) return;
    absl::StrAppend(&differences, differences.empty() ? "" : ", ", what, " ", saved, " (this stream: ", mine,
                    ")");
  };
  differ("seed", s.seed, me.seed);
  differ("shard", s.shard_index, me.shard_index);
  differ("number of shards", s.num_shards, me.num_shards);
  differ("shard size", s.shard_size, me.shard_size);
  differ("batch size", s.batch_size, me.batch_size);
  differ("shuffle", static_cast<int>(s.shuffle), static_cast<int>(me.shuffle));
  differ("preprocessing", s.preprocess, me.preprocess);
  if (!differences.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "input position: saved by another input stream: ", differences,
        "; resume with the same data, --seed, --batch_size and cluster size, or start the input afresh"));
  }
  return absl::OkStatus();
}

}  // namespace dtrain::data
