#include "worker/eval/npz_writer.h"

#include <unistd.h>
#include <zlib.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "gtest/gtest.h"

namespace dtrain::worker {
namespace {

// ---- an independent reader of what the writer promises: stored zip entries of NPY v1.0 '<f4' arrays ----
uint32_t Get16(const std::string& b, size_t p) {
  return static_cast<uint8_t>(b[p]) | static_cast<uint8_t>(b[p + 1]) << 8;
}
uint32_t Get32(const std::string& b, size_t p) { return Get16(b, p) | Get16(b, p + 2) << 16; }

// Parses one NPY file; adds a failure and returns false when it is not what EncodeNpy documents.
bool ParseNpy(const std::string& npy, NpyArray* out) {
  if (npy.size() < 10 || npy.compare(0, 8, std::string("\x93NUMPY\x01\x00", 8)) != 0) {
    ADD_FAILURE() << "bad NPY magic/version";
    return false;
  }
  const size_t header_len = Get16(npy, 8);
  EXPECT_EQ((10 + header_len) % 64, 0u) << "header not 64-byte aligned";
  std::string header = npy.substr(10, header_len);
  EXPECT_EQ(header.back(), '\n');
  absl::string_view h = absl::StripTrailingAsciiWhitespace(header);
  out->type = absl::StartsWith(h, "{'descr': '<i8'") ? NpyType::kInt64 : NpyType::kFloat32;
  const std::string prefix = absl::StrCat("{'descr': '", out->type == NpyType::kInt64 ? "<i8" : "<f4",
                                          "', 'fortran_order': False, 'shape': (");
  if (!absl::ConsumePrefix(&h, prefix) || !absl::ConsumeSuffix(&h, "), }")) {
    ADD_FAILURE() << "unexpected NPY header: " << header;
    return false;
  }
  out->shape.clear();
  int64_t count = 1;
  for (absl::string_view d : absl::StrSplit(h, ',', absl::SkipWhitespace())) {
    int64_t v = 0;
    EXPECT_TRUE(absl::SimpleAtoi(absl::StripAsciiWhitespace(d), &v)) << header;
    out->shape.push_back(v);
    count *= v;
  }
  const size_t element = out->type == NpyType::kInt64 ? sizeof(int64_t) : sizeof(float);
  if (npy.size() != 10 + header_len + count * element) {
    ADD_FAILURE() << "NPY data size " << npy.size() - 10 - header_len << " for " << count << " elements";
    return false;
  }
  void* to = nullptr;
  if (out->type == NpyType::kInt64) {
    out->int64_data.resize(count);
    to = out->int64_data.data();
  } else {
    out->data.resize(count);
    to = out->data.data();
  }
  // An empty array's data() may be null, and memcpy from or to null is undefined even for 0 bytes (UBSan).
  if (count > 0) std::memcpy(to, npy.data() + 10 + header_len, count * element);
  return true;
}

std::map<std::string, NpyArray> ParseNpz(const std::string& zip) {
  std::map<std::string, NpyArray> arrays;
  if (zip.size() < 22 || Get32(zip, zip.size() - 22) != 0x06054b50) {
    ADD_FAILURE() << "no end-of-central-directory record at the end";
    return arrays;
  }
  const size_t end = zip.size() - 22;
  const uint32_t entries = Get16(zip, end + 10);
  EXPECT_EQ(Get16(zip, end + 8), entries);
  const uint32_t cd_size = Get32(zip, end + 12), cd_offset = Get32(zip, end + 16);
  EXPECT_EQ(cd_offset + cd_size, end);
  size_t p = cd_offset;
  for (uint32_t i = 0; i < entries; ++i) {
    EXPECT_EQ(Get32(zip, p), 0x02014b50u);
    EXPECT_EQ(Get16(zip, p + 10), 0u) << "not stored";
    const uint32_t crc = Get32(zip, p + 16), csize = Get32(zip, p + 20), usize = Get32(zip, p + 24);
    EXPECT_EQ(csize, usize);
    const uint32_t name_len = Get16(zip, p + 28), extra = Get16(zip, p + 30), comment = Get16(zip, p + 32);
    const uint32_t local = Get32(zip, p + 42);
    const std::string name = zip.substr(p + 46, name_len);
    p += 46 + name_len + extra + comment;
    // The local header repeats name, sizes and CRC.
    EXPECT_EQ(Get32(zip, local), 0x04034b50u);
    EXPECT_EQ(Get32(zip, local + 14), crc);
    EXPECT_EQ(Get32(zip, local + 18), csize);
    const uint32_t lname = Get16(zip, local + 26), lextra = Get16(zip, local + 28);
    EXPECT_EQ(zip.substr(local + 30, lname), name);
    const std::string data = zip.substr(local + 30 + lname + lextra, csize);
    EXPECT_EQ(crc32(0, reinterpret_cast<const Bytef*>(data.data()), data.size()), crc) << name;
    EXPECT_TRUE(absl::EndsWith(name, ".npy")) << name;
    NpyArray a;
    a.name = name.substr(0, name.size() - 4);
    if (ParseNpy(data, &a)) arrays[a.name] = a;
  }
  EXPECT_EQ(p, end);
  return arrays;
}

std::vector<NpyArray> Sample() {
  NpyArray conv{"conv1_weights", {2, 3, 1, 2}, {}};
  for (int i = 0; i < 12; ++i) conv.data.push_back(0.5f * i - 1.25f);
  // A sparse table's ids: int64 beyond float precision, and a name with '/' (numpy.load() keeps it).
  return {conv, NpyArray{"conv1_biases", {2}, {0.1f, -0.2f}}, NpyArray{"scale", {}, {3.5f}},
          NpyArray{"empty", {0, 4}, {}}, Int64NpyArray("embedding/C1/ids", {3}, {-5, 123456789012345678, 0}),
          Int64NpyArray("no_ids", {0}, {})};
}

TEST(NpzWriterTest, OwnParserReadsBackEveryArray) {
  absl::StatusOr<std::string> zip = EncodeNpz(Sample());
  ASSERT_TRUE(zip.ok()) << zip.status();
  std::map<std::string, NpyArray> back = ParseNpz(*zip);
  ASSERT_EQ(back.size(), 6u);
  for (const NpyArray& want : Sample()) {
    ASSERT_TRUE(back.count(want.name)) << want.name;
    EXPECT_EQ(back[want.name].shape, want.shape) << want.name;
    EXPECT_EQ(back[want.name].type, want.type) << want.name;
    EXPECT_EQ(back[want.name].data, want.data) << want.name;
    EXPECT_EQ(back[want.name].int64_data, want.int64_data) << want.name;
  }
}

TEST(NpzWriterTest, HeaderFormat) {
  absl::StatusOr<std::string> npy = EncodeNpy(NpyArray{"b", {3}, {1, 2, 3}});
  ASSERT_TRUE(npy.ok());
  EXPECT_EQ(npy->size() % 64, 12u);  // 64-byte aligned header, then 3 floats
  EXPECT_NE(npy->find("'shape': (3,), }"), std::string::npos);
  npy = EncodeNpy(NpyArray{"w", {2, 2}, {1, 2, 3, 4}});
  EXPECT_NE(npy->find("'shape': (2, 2), }"), std::string::npos);
}

TEST(NpzWriterTest, RejectsBadInput) {
  EXPECT_EQ(EncodeNpy(NpyArray{"w", {2, 2}, {1, 2, 3}}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(EncodeNpz({NpyArray{"a", {1}, {1}}, NpyArray{"a", {1}, {2}}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(EncodeNpz({NpyArray{"", {1}, {1}}}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(EncodeNpy(Int64NpyArray("ids", {2}, {1})).status().code(), absl::StatusCode::kInvalidArgument);
  NpyArray mixed = Int64NpyArray("ids", {1}, {1});
  mixed.data = {1.0f};
  EXPECT_EQ(EncodeNpy(mixed).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(NpzNameForVariable("conv1/weights/part"), "conv1_weights_part");
}

// numpy itself, when Debian's python3 has it.
TEST(NpzWriterTest, NumpyLoadsTheArchive) {
  if (std::system("/usr/bin/python3 -c 'import numpy' >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "/usr/bin/python3 with numpy not available";
  }
  const std::string path = absl::StrCat(::testing::TempDir(), "npz_writer_test_", getpid(), ".npz");
  ASSERT_TRUE(WriteNpz(path, Sample()).ok());
  const std::string cmd = absl::StrCat(
      "/usr/bin/python3 -c \"import numpy as np\nz = np.load('", path, "')\n",
      "for k in sorted(z.files):\n  a = z[k]\n  print(k, a.dtype, a.shape, ' '.join(repr(x.item()) for x in "
      "a.ravel()))\"");
  FILE* pipe = popen(cmd.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string output;
  char buf[512];
  while (fgets(buf, sizeof(buf), pipe) != nullptr) output += buf;
  ASSERT_EQ(pclose(pipe), 0) << output;
  std::filesystem::remove(path);
  EXPECT_EQ(output,
            "conv1_biases float32 (2,) 0.10000000149011612 -0.20000000298023224\n"
            "conv1_weights float32 (2, 3, 1, 2) -1.25 -0.75 -0.25 0.25 0.75 1.25 1.75 2.25 2.75 3.25 3.75 4.25\n"
            "embedding/C1/ids int64 (3,) -5 123456789012345678 0\n"
            "empty float32 (0, 4) \n"
            "no_ids int64 (0,) \n"
            "scale float32 () 3.5\n");
}

}  // namespace
}  // namespace dtrain::worker
