// Helpers for the data library's tests: temporary directories and small files in each supported format,
// written independently of the readers under test. Test-only (header-only, not part of dtrain_data).
#ifndef DTRAIN_WORKER_DATA_DATA_TEST_UTIL_H_
#define DTRAIN_WORKER_DATA_DATA_TEST_UTIL_H_

#include <zlib.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "worker/data/dataset.h"

namespace dtrain::data::test_util {

// A fresh, empty directory under the test's temp dir, unique per test.
inline std::string MakeTempDir() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::filesystem::path dir = std::filesystem::path(::testing::TempDir()) /
                              (std::string("dtrain_data_") + info->test_suite_name() + "_" + info->name());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

inline void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

inline void WriteGzFile(const std::string& path, const std::string& bytes) {
  gzFile gz = gzopen(path.c_str(), "wb");
  ASSERT_NE(gz, nullptr) << path;
  ASSERT_EQ(gzwrite(gz, bytes.data(), static_cast<unsigned>(bytes.size())), static_cast<int>(bytes.size()));
  ASSERT_EQ(gzclose(gz), Z_OK);
}

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

inline std::string BigEndian32(uint32_t v) {
  return {static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8), static_cast<char>(v)};
}

// Random pixels; labels cycle through 0..9.
inline Dataset MakeDataset(int n, int h, int w, int c, uint64_t seed = 7) {
  Dataset d;
  d.height = h;
  d.width = w;
  d.channels = c;
  std::mt19937_64 rng(seed);
  d.pixels.resize(static_cast<size_t>(n) * h * w * c);
  for (auto& p : d.pixels) p = static_cast<uint8_t>(rng());
  for (int i = 0; i < n; ++i) d.labels.push_back(i % 10);
  return d;
}

inline std::string IdxImages(const Dataset& d, uint32_t magic = 2051) {
  std::string s = BigEndian32(magic) + BigEndian32(static_cast<uint32_t>(d.count())) +
                  BigEndian32(d.height) + BigEndian32(d.width);
  s.append(d.pixels.begin(), d.pixels.end());
  return s;
}

inline std::string IdxLabels(const std::vector<int32_t>& labels, uint32_t magic = 2049) {
  std::string s = BigEndian32(magic) + BigEndian32(static_cast<uint32_t>(labels.size()));
  for (int32_t l : labels) s.push_back(static_cast<char>(l));
  return s;
}

// CIFAR-10 binary records (label byte + planar CHW) for a 32x32x3 HWC Dataset.
inline std::string CifarRecords(const Dataset& d) {
  std::string s;
  for (int64_t i = 0; i < d.count(); ++i) {
    s.push_back(static_cast<char>(d.labels[i]));
    const uint8_t* img = d.pixels.data() + i * d.image_size();
    for (int c = 0; c < 3; ++c) {
      for (int p = 0; p < 32 * 32; ++p) s.push_back(static_cast<char>(img[p * 3 + c]));
    }
  }
  return s;
}

// Examples [first, first + n) of d as a Dataset.
inline Dataset Slice(const Dataset& d, int64_t first, int64_t n) {
  Dataset s = d;
  s.labels.assign(d.labels.begin() + first, d.labels.begin() + first + n);
  s.pixels.assign(d.pixels.begin() + first * d.image_size(), d.pixels.begin() + (first + n) * d.image_size());
  return s;
}

}  // namespace dtrain::data::test_util

#endif  // DTRAIN_WORKER_DATA_DATA_TEST_UTIL_H_
