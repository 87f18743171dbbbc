#include "worker/data/record_io.h"

#include <filesystem>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/crc32c.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/data/data_test_util.h"

namespace dtrain::data {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using namespace test_util;  // NOLINT

const std::vector<std::string>& Records() {
  static const auto* r = new std::vector<std::string>{"", "x", std::string(1000, 'q'), "last record"};
  return *r;
}

std::string WriteRecords(const std::string& path) {
  TfRecordWriter w;
  EXPECT_TRUE(w.Open(path).ok());
  for (const std::string& r : Records()) EXPECT_TRUE(w.Write(r).ok());
  EXPECT_EQ(w.records(), 4);
  EXPECT_TRUE(w.Close().ok());
  return ReadFile(path);
}

// Byte offset where record i starts.
int64_t RecordOffset(int i) {
  int64_t off = 0;
  for (int k = 0; k < i; ++k) off += 12 + Records()[k].size() + 4;
  return off;
}

absl::Status ReadAll(const std::string& path, std::vector<std::string>* out) {
  TfRecordReader r;
  absl::Status s = r.Open(path);
  if (!s.ok()) return s;
  std::string rec;
  while (true) {
    absl::StatusOr<bool> got = r.Read(&rec);
    if (!got.ok()) return got.status();
    if (!*got) return absl::OkStatus();
    out->push_back(rec);
  }
}

TEST(RecordIoTest, RoundTripAndFraming) {
  const std::string path = MakeTempDir() + "/r.tfrecords";
  const std::string bytes = WriteRecords(path);
  ASSERT_EQ(static_cast<int64_t>(bytes.size()), RecordOffset(4));
  // Record 2: little-endian length 1000 = 0x03E8, then the masked CRCs TensorFlow would write.
  const std::string header = bytes.substr(RecordOffset(2), 8);
  EXPECT_EQ(header, std::string("\xE8\x03\0\0\0\0\0\0", 8));
  uint32_t stored = 0;
  for (int i = 3; i >= 0; --i) stored = (stored << 8) | static_cast<uint8_t>(bytes[RecordOffset(2) + 8 + i]);
  EXPECT_EQ(crc32c::Unmask(stored), crc32c::Value(header.data(), 8));

  std::vector<std::string> got;
  ASSERT_TRUE(ReadAll(path, &got).ok());
  EXPECT_EQ(got, Records());
}

TEST(RecordIoTest, CorruptDataByteReportsRecordOffset) {
  const std::string path = MakeTempDir() + "/r.tfrecords";
  std::string bytes = WriteRecords(path);
  bytes[RecordOffset(2) + 12 + 500] ^= 0x01;
  WriteFile(path, bytes);
  std::vector<std::string> got;
  absl::Status s = ReadAll(path, &got);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), AllOf(HasSubstr(path), HasSubstr("corrupt record at byte offset " +
                                                            std::to_string(RecordOffset(2))),
                                 HasSubstr("data crc mismatch")));
  EXPECT_EQ(got.size(), 2u);  // the records before the damage were delivered
}

TEST(RecordIoTest, BadLengthCrc) {
  const std::string path = MakeTempDir() + "/r.tfrecords";
  std::string bytes = WriteRecords(path);
  bytes[RecordOffset(1) + 9] ^= 0x40;
  WriteFile(path, bytes);
  std::vector<std::string> got;
  absl::Status s = ReadAll(path, &got);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("byte offset " + std::to_string(RecordOffset(1))),
                                 HasSubstr("length crc mismatch")));
}

TEST(RecordIoTest, CorruptLengthIsCaughtByItsCrc) {
  const std::string path = MakeTempDir() + "/r.tfrecords";
  std::string bytes = WriteRecords(path);
  bytes[RecordOffset(3) + 5] = '\x7f';  // would claim a ~10^14-byte record
  WriteFile(path, bytes);
  std::vector<std::string> got;
  absl::Status s = ReadAll(path, &got);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("length crc mismatch"));
}

TEST(RecordIoTest, TruncatedBodyAndHeader) {
  const std::string dir = MakeTempDir();
  const std::string bytes = WriteRecords(dir + "/full.tfrecords");
  {
    WriteFile(dir + "/body.tfrecords", bytes.substr(0, bytes.size() - 2));
    std::vector<std::string> got;
    absl::Status s = ReadAll(dir + "/body.tfrecords", &got);
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
    EXPECT_THAT(s.message(), AllOf(HasSubstr("byte offset " + std::to_string(RecordOffset(3))),
                                   HasSubstr("truncated record")));
    EXPECT_EQ(got.size(), 3u);
  }
  {
    WriteFile(dir + "/header.tfrecords", bytes.substr(0, RecordOffset(3) + 5));
    std::vector<std::string> got;
    absl::Status s = ReadAll(dir + "/header.tfrecords", &got);
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
    EXPECT_THAT(s.message(), AllOf(HasSubstr("byte offset " + std::to_string(RecordOffset(3))),
                                   HasSubstr("truncated header")));
  }
}

TEST(RecordIoTest, WriterPublishesOnlyOnClose) {
  const std::string path = MakeTempDir() + "/w.tfrecords";
  {
    TfRecordWriter w;
    ASSERT_TRUE(w.Open(path).ok());
    ASSERT_TRUE(w.Write("abc").ok());
    EXPECT_FALSE(std::filesystem::exists(path));
  }  // destroyed without Close: nothing published, temporary removed
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  EXPECT_EQ(TfRecordWriter().Write("x").code(), absl::StatusCode::kFailedPrecondition);
}

TEST(RecordIoTest, MissingFileIsNotFound) {
  TfRecordReader r;
  EXPECT_EQ(r.Open(MakeTempDir() + "/none.tfrecords").code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace dtrain::data
