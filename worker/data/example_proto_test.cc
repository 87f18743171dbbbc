#include "worker/data/example_proto.h"

#include <random>
#include <string>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dtrain::data {
namespace {

using ::testing::HasSubstr;

std::string Bytes(std::initializer_list<int> b) {
  std::string s;
  for (int v : b) s.push_back(static_cast<char>(v));
  return s;
}

TEST(ExampleProtoTest, EncodesTheStandardWireFormat) {
  ImageExample e;
  e.label = 3;
  e.image_raw = "ab";
  // Example{features{feature{key:"label" value{int64_list{value:[3]}}}
  //                  feature{key:"image_raw" value{bytes_list{value:["ab"]}}}}}
  const std::string want = Bytes({0x0a, 0x25,                                                   // features
                                  0x0a, 0x0e, 0x0a, 0x05}) + "label" +
                           Bytes({0x12, 0x05, 0x1a, 0x03, 0x0a, 0x01, 0x03,                  // int64_list
                                  0x0a, 0x13, 0x0a, 0x09}) + "image_raw" +
                           Bytes({0x12, 0x06, 0x0a, 0x04, 0x0a, 0x02}) + "ab";               // bytes_list
  EXPECT_EQ(EncodeImageExample(e), want);
}

TEST(ExampleProtoTest, RoundTrip) {
  ImageExample e;
  e.image_raw = std::string("\0\xff\x10 image bytes", 15);
  e.label = 9;
  e.height = 28;
  e.width = 300;  // multi-byte varint
  e.depth = 1;
  e.pixels = 8400;
  absl::StatusOr<ImageExample> got = DecodeImageExample(EncodeImageExample(e));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->image_raw, e.image_raw);
  EXPECT_EQ(got->label, 9);
  EXPECT_EQ(got->height, 28);
  EXPECT_EQ(got->width, 300);
  EXPECT_EQ(got->depth, 1);
  EXPECT_EQ(got->pixels, 8400);
}

TEST(ExampleProtoTest, DecodesUnpackedInt64AndSkipsUnknownFeatures) {
  // label as an unpacked int64_list (tag 0x08), plus an unknown float feature and an unknown field.
  const std::string label_entry = Bytes({0x0a, 0x05}) + "label" + Bytes({0x12, 0x04, 0x1a, 0x02, 0x08, 0x07});
  const std::string other_entry = Bytes({0x0a, 0x01}) + "f" +
                                  Bytes({0x12, 0x08, 0x12, 0x06, 0x0a, 0x04, 0x00, 0x00, 0x80, 0x3f});  // float_list [1.0]
  const std::string image_entry = Bytes({0x0a, 0x09}) + "image_raw" + Bytes({0x12, 0x05, 0x0a, 0x03, 0x0a, 0x01}) + "z";
  std::string features;
  for (const std::string* entry : {&label_entry, &other_entry, &image_entry}) {
    features += Bytes({0x0a, static_cast<int>(entry->size())}) + *entry;
  }
  const std::string example = Bytes({0x10, 0x2a}) + Bytes({0x0a, static_cast<int>(features.size())}) + features;
  absl::StatusOr<ImageExample> got = DecodeImageExample(example);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->label, 7);
  EXPECT_EQ(got->image_raw, "z");
  EXPECT_EQ(got->height, -1);
}

TEST(ExampleProtoTest, RejectsMissingOrMistypedFeatures) {
  ImageExample no_label;
  no_label.image_raw = "abc";
  absl::Status s = DecodeImageExample(EncodeImageExample(no_label)).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("label"));

  // "label" holding a bytes_list.
  const std::string entry = Bytes({0x0a, 0x05}) + "label" + Bytes({0x12, 0x05, 0x0a, 0x03, 0x0a, 0x01}) + "3";
  const std::string features = Bytes({0x0a, static_cast<int>(entry.size())}) + entry;
  s = DecodeImageExample(Bytes({0x0a, static_cast<int>(features.size())}) + features).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("expected an int64_list"));
}

TEST(ExampleProtoTest, RejectsTruncatedWireData) {
  ImageExample e;
  e.label = 1;
  e.image_raw = "0123456789";
  const std::string full = EncodeImageExample(e);
  for (size_t cut = 1; cut < full.size(); ++cut) {
    absl::Status s = DecodeImageExample(full.substr(0, cut)).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << "cut at " << cut;
  }
}

// Damaged payloads (as a CRC collision or a buggy writer could produce) must fail cleanly, never crash
// or read out of bounds (run under ASan to check the latter).
TEST(ExampleProtoTest, RandomlyDamagedExamplesFailCleanly) {
  ImageExample e;
  e.label = 5;
  e.height = e.width = 4;
  e.depth = 1;
  e.pixels = 16;
  e.image_raw = std::string(16, '\x42');
  const std::string good = EncodeImageExample(e);
  std::mt19937 rng(1);
  int failures = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    std::string bad = good;
    for (int k = 0; k < 1 + trial % 3; ++k) bad[rng() % bad.size()] = static_cast<char>(rng());
    absl::StatusOr<ImageExample> got = DecodeImageExample(bad);
    if (!got.ok()) {
      ++failures;
      EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument) << got.status();
    }
  }
  EXPECT_GT(failures, 100);  // most damage is detected as malformed wire data
}

}  // namespace
}  // namespace dtrain::data
