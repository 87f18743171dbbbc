// Test-only: a tiny protobuf and TFRecord decoder, independent of EventWriter's encoder, for tests that read
// event files back (common/event_writer_test.cc, worker/train/summaries_test.cc). Fails the running test on
// malformed input.
#ifndef DTRAIN_COMMON_EVENT_TEST_DECODER_H_
#define DTRAIN_COMMON_EVENT_TEST_DECODER_H_

#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "common/crc32c.h"
#include "gtest/gtest.h"

namespace dtrain {
namespace testing_decoder {

struct Field {
  int wire_type = 0;
  uint64_t number = 0;   // varint, fixed32, fixed64 payloads
  std::string bytes;     // length-delimited payload
};
using Message = std::multimap<int, Field>;  // field number → occurrences

inline bool ReadVarint(const std::string& s, size_t* pos, uint64_t* v) {
  *v = 0;
  for (int shift = 0; shift < 64 && *pos < s.size(); shift += 7) {
    uint8_t b = static_cast<uint8_t>(s[(*pos)++]);
    *v |= static_cast<uint64_t>(b & 0x7f) << shift;
    if ((b & 0x80) == 0) return true;
  }
  return false;
}

inline uint64_t ReadLittleEndian(const std::string& s, size_t pos, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i) v |= static_cast<uint64_t>(static_cast<uint8_t>(s[pos + i])) << (8 * i);
  return v;
}

// Decodes one message level; fails the test on malformed input.
inline Message Decode(const std::string& s) {
  Message m;
  size_t pos = 0;
  while (pos < s.size()) {
    uint64_t key;
    EXPECT_TRUE(ReadVarint(s, &pos, &key));
    Field f;
    f.wire_type = static_cast<int>(key & 7);
    switch (f.wire_type) {
      case 0:
        EXPECT_TRUE(ReadVarint(s, &pos, &f.number));
        break;
      case 1:
        EXPECT_LE(pos + 8, s.size());
        f.number = ReadLittleEndian(s, pos, 8);
        pos += 8;
        break;
      case 2: {
        uint64_t len;
        EXPECT_TRUE(ReadVarint(s, &pos, &len));
        EXPECT_LE(pos + len, s.size());
        f.bytes = s.substr(pos, len);
        pos += len;
        break;
      }
      case 5:
        EXPECT_LE(pos + 4, s.size());
        f.number = ReadLittleEndian(s, pos, 4);
        pos += 4;
        break;
      default:
        ADD_FAILURE() << "unexpected wire type " << f.wire_type;
        return m;
    }
    m.emplace(static_cast<int>(key >> 3), f);
  }
  return m;
}

inline const Field& Only(const Message& m, int field) {
  static const Field kMissing;
  EXPECT_EQ(m.count(field), 1u) << "field " << field;
  auto it = m.find(field);
  return it == m.end() ? kMissing : it->second;
}

inline double AsDouble(uint64_t bits) {
  double d;
  std::memcpy(&d, &bits, 8);
  return d;
}

inline float AsFloat(uint64_t bits) {
  uint32_t b = static_cast<uint32_t>(bits);
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

// Splits a TFRecord file into records, checking both masked CRCs of every record.
inline std::vector<std::string> ReadRecords(const std::string& file) {
  std::vector<std::string> records;
  size_t pos = 0;
  while (pos < file.size()) {
    EXPECT_GE(file.size() - pos, 12u) << "truncated header at " << pos;
    if (file.size() - pos < 12) break;
    const uint64_t len = ReadLittleEndian(file, pos, 8);
    const uint32_t len_crc = static_cast<uint32_t>(ReadLittleEndian(file, pos + 8, 4));
    EXPECT_EQ(crc32c::Unmask(len_crc), crc32c::Value(file.data() + pos, 8)) << "at " << pos;
    EXPECT_LE(pos + 12 + len + 4, file.size()) << "truncated record at " << pos;
    if (pos + 12 + len + 4 > file.size()) break;
    std::string data = file.substr(pos + 12, len);
    const uint32_t data_crc = static_cast<uint32_t>(ReadLittleEndian(file, pos + 12 + len, 4));
    EXPECT_EQ(crc32c::Unmask(data_crc), crc32c::Value(data.data(), data.size())) << "at " << pos;
    records.push_back(std::move(data));
    pos += 12 + len + 4;
  }
  return records;
}

}  // namespace testing_decoder
}  // namespace dtrain

#endif  // DTRAIN_COMMON_EVENT_TEST_DECODER_H_
