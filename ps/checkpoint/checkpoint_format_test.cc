#include "ps/checkpoint/checkpoint_format.h"

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/env.h"
#include "gtest/gtest.h"
#include "ps/checkpoint/checkpoint_test_util.h"

namespace dtrain::ps {
namespace {

using ::dtrain::ps::testing::AddTables;
using ::dtrain::ps::testing::ExpectSame;
using ::dtrain::ps::testing::FixChecksums;
using ::dtrain::ps::testing::LogCapture;
using ::dtrain::ps::testing::MakeData;
using ::dtrain::ps::testing::ScratchDir;
using ::dtrain::ps::testing::WriteCheckpointFile;

TEST(CheckpointFormatTest, RoundTripIsExact) {
  for (int slots : {0, 1, 2}) {
    for (bool averages : {false, true}) {
      const CheckpointData d = MakeData(4, slots, averages);
      absl::StatusOr<CheckpointData> back = ParseCheckpoint(SerializeCheckpoint(d), "mem");
      ASSERT_TRUE(back.ok()) << back.status();
      ExpectSame(d, *back);
    }
  }
}

// State slices (BatchNorm running statistics) keep their flag.
TEST(CheckpointFormatTest, StateSlicesRoundTrip) {
  CheckpointData d = MakeData(3, 2, false);
  d.slices[1].spec.trainable = false;
  absl::StatusOr<CheckpointData> back = ParseCheckpoint(SerializeCheckpoint(d), "mem");
  ASSERT_TRUE(back.ok()) << back.status();
  ExpectSame(d, *back);
  EXPECT_TRUE(back->slices[0].spec.trainable);
  EXPECT_FALSE(back->slices[1].spec.trainable);
}

TEST(CheckpointFormatTest, InputPositionsRoundTrip) {
  CheckpointData d = MakeData(2, 1, false);
  d.input_positions = {{0, std::string("DTRNBPOS\x01\x00 position of worker 0", 32)}, {3, "w3"}, {17, ""}};
  absl::StatusOr<CheckpointData> back = ParseCheckpoint(SerializeCheckpoint(d), "mem");
  ASSERT_TRUE(back.ok()) << back.status();
  ExpectSame(d, *back);
}

// Version 5 keeps the chief's model and data flags (dtrain_eval --checkpoint=DIR alone); version 4 files are read
// as having none, and writing version 4 leaves them out.
TEST(CheckpointFormatTest, ModelFlagsRoundTripAndOlderFilesHaveNone) {
  CheckpointData d = MakeData(2, 1, false);
  d.model_flags = {"data_dir=/tmp/ctr", "embedding_dim=8", "model=dlrm", "input_mean="};
  absl::StatusOr<CheckpointData> back = ParseCheckpoint(SerializeCheckpoint(d), "mem");
  ASSERT_TRUE(back.ok()) << back.status();
  ExpectSame(d, *back);
  EXPECT_EQ(back->model_flags, d.model_flags);
  back = ParseCheckpoint(SerializeCheckpoint(d, 4), "v4");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(back->model_flags.empty());
  EXPECT_EQ(back->slices.size(), d.slices.size());
}

// Files of format version 1 (before input positions) are still read, as having none; version 1 and 2 files
// (before slice flags) as having only trainable slices.
TEST(CheckpointFormatTest, OlderVersionsAreRead) {
  CheckpointData d = MakeData(3, 2, true);
  std::string bytes = SerializeCheckpoint(d, 1);
  absl::StatusOr<CheckpointData> back = ParseCheckpoint(bytes, "v1");
  ASSERT_TRUE(back.ok()) << back.status();
  ExpectSame(d, *back);
  d.input_positions = {{1, "w1"}};
  back = ParseCheckpoint(SerializeCheckpoint(d, 2), "v2");
  ASSERT_TRUE(back.ok()) << back.status();
  ExpectSame(d, *back);
  for (const SliceState& s : back->slices) EXPECT_TRUE(s.spec.trainable);
  // And a version from the future is refused with a message that says so.
  bytes[8] = 9;
  absl::StatusOr<CheckpointData> future = ParseCheckpoint(bytes, "v9");
  EXPECT_EQ(future.status().code(), absl::StatusCode::kFailedPrecondition) << future.status();
}

TEST(CheckpointFormatTest, TruncatedFileIsDataLossWithTheByte) {
  const std::string bytes = SerializeCheckpoint(MakeData(4, 1, true));
  for (size_t n = 0; n < bytes.size(); ++n) {
    absl::StatusOr<CheckpointData> r = ParseCheckpoint(bytes.substr(0, n), "/ckpt/model.ckpt-1200.ps1-of-2");
    ASSERT_FALSE(r.ok()) << "accepted a file truncated to " << n << " bytes";
    EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << r.status();
    EXPECT_TRUE(absl::StartsWith(r.status().message(), "/ckpt/model.ckpt-1200.ps1-of-2: ")) << r.status();
    if (n >= 8) {
      EXPECT_TRUE(absl::StrContains(r.status().message(), absl::StrCat("truncated at byte ", n)) ||
                  absl::StrContains(r.status().message(), "checksum mismatch"))
          << n << ": " << r.status();
    }
  }
  // Cut inside the values of the last slice: named as truncation.
  absl::StatusOr<CheckpointData> r = ParseCheckpoint(bytes.substr(0, bytes.size() - 30), "f");
  EXPECT_TRUE(absl::StrContains(r.status().message(), absl::StrCat("truncated at byte ", bytes.size() - 30)))
      << r.status();
}

TEST(CheckpointFormatTest, EveryCorruptedByteIsDetected) {
  const std::string bytes = SerializeCheckpoint(MakeData(3, 2, true));
  for (size_t i = 0; i < bytes.size(); ++i) {
    std::string bad = bytes;
    bad[i] ^= 0x20;
    absl::StatusOr<CheckpointData> r = ParseCheckpoint(bad, "f");
    ASSERT_FALSE(r.ok()) << "accepted a file with byte " << i << " flipped";
    if (i >= 8 && i < 12) {
      EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();  // the version
    } else {
      EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << i << ": " << r.status();
    }
  }
}

TEST(CheckpointFormatTest, MessagesNameTheDamagedPart) {
  const CheckpointData d = MakeData(5, 0, false);
  const std::string bytes = SerializeCheckpoint(d);
  // Locate slice 3's values by re-serializing a prefix: header + slices 0..2, then into slice 3's body.
  CheckpointData first3 = d;
  first3.slices.resize(3);
  const size_t slice3_start = SerializeCheckpoint(first3).size() - 20;  // minus the trailer
  std::string bad = bytes;
  bad[slice3_start + 40] ^= 0x01;
  absl::StatusOr<CheckpointData> r = ParseCheckpoint(bad, "x.ckpt");
  EXPECT_EQ(r.status().message(), "x.ckpt: checksum mismatch in slice 3") << r.status();

  bad = bytes;
  bad[20] ^= 0x01;  // inside the header body
  r = ParseCheckpoint(bad, "x.ckpt");
  EXPECT_EQ(r.status().message(), "x.ckpt: checksum mismatch in header") << r.status();

  bad = bytes;
  std::memcpy(bad.data(), "GARBAGE!", 8);
  r = ParseCheckpoint(bad, "x.ckpt");
  EXPECT_EQ(r.status().message(), "x.ckpt: bad magic: not a dtrain checkpoint");

  r = ParseCheckpoint(bytes + "extra", "x.ckpt");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(absl::StrContains(r.status().message(), "unexpected bytes after the trailer")) << r.status();
}

// Found by checkpoint_fuzzer: a slice length whose byte size (length * 4 * arrays) wraps around 2^64 to the
// section's size passed the check, and the reader then tried to allocate 2^62 floats (std::length_error, an
// abort). With valid CRCs (a hostile file) it is now refused like any other bad length.
TEST(CheckpointFormatTest, SliceLengthThatWrapsAroundIsDataLoss) {
  CheckpointData d = MakeData(1, 0, false);
  d.slices[0].spec.length = 4;  // 16 bytes of values; 2^62 + 4 floats are 2^64 + 16 bytes
  d.slices[0].values.resize(4);
  std::string bytes = SerializeCheckpoint(d);
  const size_t length_at = bytes.find(d.slices[0].spec.variable) + d.slices[0].spec.variable.size() + 8;
  ASSERT_EQ(bytes[length_at], 4);
  bytes[length_at + 7] = 0x40;  // the length's top byte: 2^62 + 4
  FixChecksums(&bytes);
  absl::StatusOr<CheckpointData> r = ParseCheckpoint(bytes, "hostile");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(absl::StrContains(r.status().message(), "has a length that does not match its section")) << r.status();
  // The same edit without the wrap-around is caught the same way; the helper itself leaves a good file good.
  std::string good = SerializeCheckpoint(d);
  FixChecksums(&good);
  EXPECT_TRUE(ParseCheckpoint(good, "good").ok());
}

// Version 4: the rows of each sparse table with their ids and slots, in blocks of bounded size.
TEST(CheckpointFormatTest, SparseTablesRoundTrip) {
  for (int64_t block_bytes : {kSparseBlockBytes, int64_t{100}}) {  // one block; 3 rows (of 32 bytes) a block
    CheckpointData d = MakeData(2, 1, false);
    AddTables(&d, 10);
    const std::string bytes = SerializeCheckpoint(d, kCheckpointFormatVersion, block_bytes);
    absl::StatusOr<CheckpointData> back = ParseCheckpoint(bytes, "v4");
    ASSERT_TRUE(back.ok()) << back.status();
    ExpectSame(d, *back);
    EXPECT_EQ(back->tables[0].spec.max_rows, 1000);
    EXPECT_EQ(back->tables[1].spec.rows, 50);
    EXPECT_TRUE(back->tables[1].ids.empty());
  }
  // A model of tables only.
  CheckpointData d = MakeData(1, 0, false);
  d.slices.clear();
  AddTables(&d, 3);
  absl::StatusOr<CheckpointData> back = ParseCheckpoint(SerializeCheckpoint(d), "tables only");
  ASSERT_TRUE(back.ok()) << back.status();
  ExpectSame(d, *back);
}

TEST(CheckpointFormatTest, VersionThreeFilesHaveNoTables) {
  const CheckpointData d = MakeData(3, 2, true);
  absl::StatusOr<CheckpointData> back = ParseCheckpoint(SerializeCheckpoint(d, 3), "v3");
  ASSERT_TRUE(back.ok()) << back.status();
  ExpectSame(d, *back);
  EXPECT_TRUE(back->tables.empty());
  EXPECT_EQ(back->sparse_optimizer, "");
}

TEST(CheckpointFormatTest, DamagedTablesAreDataLoss) {
  CheckpointData d = MakeData(1, 0, false);
  AddTables(&d, 5);
  const std::string bytes = SerializeCheckpoint(d, kCheckpointFormatVersion, 64);  // 2 rows a block
  for (size_t i = 0; i < bytes.size(); ++i) {
    std::string bad = bytes;
    bad[i] ^= 0x08;
    absl::StatusOr<CheckpointData> r = ParseCheckpoint(bad, "f");
    ASSERT_FALSE(r.ok()) << "accepted a file with byte " << i << " flipped";
  }
  for (size_t n = 0; n < bytes.size(); ++n) {
    EXPECT_EQ(ParseCheckpoint(bytes.substr(0, n), "f").status().code(), absl::StatusCode::kDataLoss) << n;
  }
  // With valid checksums (a hostile writer): a row count beyond the file is refused before anything is
  // allocated, and a block that claims more rows than its table too.
  const size_t name_at = bytes.find("emb_user");
  const size_t num_rows_at = name_at + 8 + 4 + 8 + 4 + 8 + 8 + 4;  // after name: dim rows scale seed max admit
  ASSERT_EQ(bytes[num_rows_at], 5);
  std::string hostile = bytes;
  hostile[num_rows_at + 6] = 0x10;
  testing::FixChecksums(&hostile);
  absl::StatusOr<CheckpointData> r = ParseCheckpoint(hostile, "hostile");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(absl::StrContains(r.status().message(), "sparse table 0 ('emb_user'): implausible spec")) << r.status();
  hostile = bytes;
  hostile[num_rows_at] = 4;  // the blocks hold 5
  testing::FixChecksums(&hostile);
  r = ParseCheckpoint(hostile, "hostile");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(absl::StrContains(r.status().message(), "do not match")) << r.status();
  // Found by checkpoint_fuzzer: a NaN init_scale read back, and the spec no longer equalled itself.
  hostile = bytes;
  const uint32_t nan_bits = 0x7fc00000;
  std::memcpy(hostile.data() + name_at + 8 + 4 + 8, &nan_bits, 4);
  testing::FixChecksums(&hostile);
  r = ParseCheckpoint(hostile, "hostile");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(absl::StrContains(r.status().message(), "implausible spec")) << r.status();
  std::string good = bytes;
  testing::FixChecksums(&good);
  EXPECT_TRUE(ParseCheckpoint(good, "good").ok());
}

}  // namespace
}  // namespace dtrain::ps
