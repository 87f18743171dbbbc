// Test helpers for the checkpoint tests: a scratch directory removed at the end, a glog sink that records the
// messages logged while it lives, sample CheckpointData, a bitwise comparison, and a plain file writer.
//
// Thread-safety: LogCapture may receive messages from any thread; the rest belongs to one test.
#ifndef DTRAIN_PS_CHECKPOINT_CHECKPOINT_TEST_UTIL_H_
#define DTRAIN_PS_CHECKPOINT_CHECKPOINT_TEST_UTIL_H_

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <limits>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "common/crc32c.h"
#include "common/env.h"
#include "common/testing/scratch_dir.h"
#include "gtest/gtest.h"
#include "ps/checkpoint/checkpoint_format.h"

namespace dtrain::ps::testing {

// A scratch directory removed at the end (the shared test helper).
using ::dtrain::testing::ScratchDir;

class LogCapture : public google::LogSink {
 public:
  LogCapture() { google::AddLogSink(this); }
  ~LogCapture() override { google::RemoveLogSink(this); }

  void send(google::LogSeverity severity, const char* /*full_filename*/, const char* /*base_filename*/,
            int /*line*/, const struct ::tm* /*tm_time*/, const char* message, size_t message_len) override {
    std::lock_guard<std::mutex> lock(mu_);
    absl::StrAppend(&text_, google::GetLogSeverityName(severity), ": ", std::string(message, message_len), "\n");
  }
  bool Contains(const std::string& s) {
    std::lock_guard<std::mutex> lock(mu_);
    return absl::StrContains(text_, s);
  }
  std::string text() {
    std::lock_guard<std::mutex> lock(mu_);
    return text_;
  }

 private:
  std::mutex mu_;
  std::string text_;
};

// A checkpoint of task 1 of 2 at `step` with `num_slices` slices of distinct lengths and values (including
// -0.0, a denormal and a NaN), `num_slots` optimizer slots and moving averages when `averages`.
// Bitwise equality, so -0.0, NaN payloads and denormals count.
inline bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  // memcmp of an empty vector's data() (maybe null) would be undefined even with length 0.
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

inline CheckpointData MakeData(int num_slices, int num_slots, bool averages, int64_t step = 1200) {
  CheckpointData d;
  d.task_index = 1;
  d.num_ps = 2;
  d.global_step = step;
  d.task_step = step;
  d.model_signature = "mlp/v1/784x500,500/abcd";
  d.optimizer = num_slots == 2 ? "adam" : num_slots == 1 ? "momentum" : "sgd";
  d.num_slots = num_slots;
  d.has_moving_averages = averages;
  int64_t offset = 0;
  for (int i = 0; i < num_slices; ++i) {
    SliceState s;
    s.spec = SliceSpec{static_cast<uint32_t>(3 * i + 1), absl::StrCat("layer", i, "/weights"), offset, 5 + 3 * i};
    offset += s.spec.length + 7;
    for (int64_t j = 0; j < s.spec.length; ++j) s.values.push_back(0.25f * i - 0.01f * j);
    s.slots.resize(num_slots);
    for (int k = 0; k < num_slots; ++k) {
      for (int64_t j = 0; j < s.spec.length; ++j) s.slots[k].push_back(1e-3f * (k + 1) * (j + i));
    }
    if (averages) {
      for (int64_t j = 0; j < s.spec.length; ++j) s.moving_average.push_back(-0.5f * j + i);
    }
    d.slices.push_back(std::move(s));
  }
  d.slices[0].values[0] = -0.0f;
  d.slices[0].values[1] = std::numeric_limits<float>::denorm_min();
  d.slices[0].values[2] = std::numeric_limits<float>::quiet_NaN();
  return d;
}

// Adds two sparse tables trained with adagrad (one slot): table 0 hash-keyed with `rows` rows (ids spread over
// int64, values including -0.0 and a NaN), table 1 a fixed-size [50, 2] table with no row yet.
inline void AddTables(CheckpointData* d, int64_t rows = 7) {
  d->sparse_optimizer = "adagrad";
  d->sparse_num_slots = 1;
  SparseTableState a;
  a.spec.table = 0;
  a.spec.name = "emb_user";
  a.spec.dim = 3;
  a.spec.init_scale = 0.05f;
  a.spec.init_seed = 99;
  a.spec.max_rows = 1000;
  a.spec.admit_after = 2;
  a.slots.resize(1);
  for (int64_t i = 0; i < rows; ++i) {
    a.ids.push_back((i - 3) * 1234567891011LL);
    for (int k = 0; k < 3; ++k) {
      a.values.push_back(0.1f * i - k);
      a.slots[0].push_back(0.1f + i + k);
    }
  }
  if (rows > 0) a.values[0] = -0.0f;
  if (rows > 1) a.values[4] = std::numeric_limits<float>::quiet_NaN();
  SparseTableState b;
  b.spec.table = 1;
  b.spec.name = "emb_item";
  b.spec.dim = 2;
  b.spec.rows = 50;
  b.slots.resize(1);
  d->tables = {a, b};
}

inline void ExpectSame(const CheckpointData& a, const CheckpointData& b) {
  EXPECT_EQ(a.task_index, b.task_index);
  EXPECT_EQ(a.num_ps, b.num_ps);
  EXPECT_EQ(a.global_step, b.global_step);
  EXPECT_EQ(a.task_step, b.task_step);
  EXPECT_EQ(a.model_signature, b.model_signature);
  EXPECT_EQ(a.optimizer, b.optimizer);
  EXPECT_EQ(a.num_slots, b.num_slots);
  EXPECT_EQ(a.has_moving_averages, b.has_moving_averages);
  EXPECT_EQ(a.input_positions, b.input_positions);
  ASSERT_EQ(a.slices.size(), b.slices.size());
  for (size_t i = 0; i < a.slices.size(); ++i) {
    EXPECT_EQ(a.slices[i].spec, b.slices[i].spec) << i;
    EXPECT_TRUE(SameBits(a.slices[i].values, b.slices[i].values)) << i;
    ASSERT_EQ(a.slices[i].slots.size(), b.slices[i].slots.size()) << i;
    for (size_t k = 0; k < a.slices[i].slots.size(); ++k) {
      EXPECT_TRUE(SameBits(a.slices[i].slots[k], b.slices[i].slots[k])) << i << " slot " << k;
    }
    EXPECT_TRUE(SameBits(a.slices[i].moving_average, b.slices[i].moving_average)) << i;
  }
  EXPECT_EQ(a.sparse_optimizer, b.sparse_optimizer);
  EXPECT_EQ(a.sparse_num_slots, b.sparse_num_slots);
  ASSERT_EQ(a.tables.size(), b.tables.size());
  for (size_t t = 0; t < a.tables.size(); ++t) {
    EXPECT_EQ(a.tables[t].spec, b.tables[t].spec) << t;
    EXPECT_EQ(a.tables[t].ids, b.tables[t].ids) << t;
    EXPECT_TRUE(SameBits(a.tables[t].values, b.tables[t].values)) << t;
    ASSERT_EQ(a.tables[t].slots.size(), b.tables[t].slots.size()) << t;
    for (size_t k = 0; k < a.tables[t].slots.size(); ++k) {
      EXPECT_TRUE(SameBits(a.tables[t].slots[k], b.tables[t].slots[k])) << t << " slot " << k;
    }
  }
}

// Recomputes every checksum of an encoded checkpoint (header, slices, trailer) after a test edited its fields:
// what a hostile writer does, so that the reader's checks behind the CRCs are exercised.
inline uint32_t GetU32(const std::string& b, size_t at) {
  uint32_t v;
  std::memcpy(&v, b.data() + at, 4);  // the format and the tests' hosts are little-endian
  return v;
}
inline void PutU32At(std::string* b, size_t at, uint32_t v) { std::memcpy(b->data() + at, &v, 4); }
inline void FixChecksums(std::string* b) {
  auto crc = [&](size_t from, size_t to) { return crc32c::Mask(crc32c::Value(b->data() + from, to - from)); };
  const uint32_t header_len = GetU32(*b, 12);
  PutU32At(b, 16 + header_len, crc(0, 16 + header_len));
  const uint32_t num_slices = GetU32(*b, 16 + header_len - 4);
  size_t pos = 16 + header_len + 4;
  for (uint32_t i = 0; i < num_slices; ++i) {
    const uint32_t body_len = GetU32(*b, pos);
    PutU32At(b, pos + 4 + body_len, crc(pos, pos + 4 + body_len));
    pos += 4 + body_len + 4;
  }
  // Fixes the section at pos and moves past it; returns the last u32 of its body.
  auto section = [&]() {
    const uint32_t body_len = GetU32(*b, pos);
    PutU32At(b, pos + 4 + body_len, crc(pos, pos + 4 + body_len));
    const uint32_t last = GetU32(*b, pos + body_len);
    pos += 4 + body_len + 4;
    return last;
  };
  if (GetU32(*b, 8) >= 2) section();  // the input positions
  if (GetU32(*b, 8) >= 4) {
    const uint32_t num_tables = section();
    for (uint32_t t = 0; t < num_tables; ++t) {
      const uint32_t num_blocks = section();
      for (uint32_t k = 0; k < num_blocks; ++k) section();
    }
  }
  PutU32At(b, pos + 16, crc(0, pos));  // trailer: magic (8), u64 length (8), crc
}

// Writes `d` to `path` (creating its directory) the way a CheckpointWriter would, without its retries.
inline void WriteCheckpointFile(const std::string& path, const CheckpointData& d) {
  Env* env = Env::Default();
  ASSERT_TRUE(env->CreateDirs(ParentDir(path)).ok());
  const absl::Status s = WriteFileAtomically(env, path, SerializeCheckpoint(d));
  ASSERT_TRUE(s.ok()) << s;
}

}  // namespace dtrain::ps::testing

#endif  // DTRAIN_PS_CHECKPOINT_CHECKPOINT_TEST_UTIL_H_
