#include "worker/data/criteo.h"

#include <cmath>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/data/data_test_util.h"
#include "worker/data/dataset.h"

namespace dtrain::data {
namespace {

using ::testing::HasSubstr;
using namespace test_util;  // NOLINT

// A line of the standard layout: label, 13 integer fields (the given ones first, the rest empty), 26
// categorical fields (likewise), with its "\n".
std::string Line(const std::string& label, std::vector<std::string> ints, std::vector<std::string> cats) {
  ints.resize(13);
  cats.resize(26);
  return absl::StrCat(label, "\t", absl::StrJoin(ints, "\t"), "\t", absl::StrJoin(cats, "\t"), "\n");
}

// Two lines in the real files' style, with empty fields.
std::string TwoLines() {
  return Line("0", {"1", "1", "5", "0", "1382", "4", "15", "2", "181", "1", "2", "", "2"},
              {"68fd1e64", "80e26c9b", "fb936136", "7b4723c4", "25c83c98", "7e0ccccf", "de7995b8", "1f89b562",
               "a73ee510", "a8cd5504", "b2cb9c98", "37c9c164", "2824a5f6", "1adce6ef", "8ba8b39a", "891b62e7",
               "e5ba7672", "f54016b9", "21ddcdc9", "b1252a9d", "07b5194c", "", "3a171ecb", "c5c50484", "e8b83407",
               "9727dd16"}) +
         Line("1", {"", "-1", "", "", "0", "", "", "", "", "", "", "", ""}, {"0A3", "", "a3"});
}

absl::StatusOr<Dataset> Parse(const std::string& bytes, const CriteoLayout& layout = {}) {
  return ParseCriteo(bytes, "train.txt", layout);
}

void ExpectSame(const Dataset& a, const Dataset& b) {
  EXPECT_EQ(a.labels, b.labels);
  EXPECT_EQ(a.dense, b.dense);
  EXPECT_EQ(a.ids, b.ids);
  EXPECT_EQ(a.num_dense, b.num_dense);
  EXPECT_EQ(a.num_sparse, b.num_sparse);
}

TEST(CriteoTest, ReadsLinesWithEmptyFields) {
  absl::StatusOr<Dataset> d = Parse(TwoLines());
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->kind(), DataKind::kCtr);
  EXPECT_EQ(d->count(), 2);
  EXPECT_EQ(d->num_classes, 2);
  EXPECT_EQ(d->num_dense, 13);
  EXPECT_EQ(d->num_sparse, 26);
  EXPECT_EQ(d->labels, (std::vector<int32_t>{0, 1}));
  ASSERT_EQ(d->dense.size(), 26u);
  EXPECT_FLOAT_EQ(d->dense[0], std::log(2.0));
  EXPECT_FLOAT_EQ(d->dense[2], std::log(6.0));
  EXPECT_FLOAT_EQ(d->dense[4], std::log(1383.0));
  EXPECT_EQ(d->dense[11], 0.0f);  // empty
  for (int j = 0; j < 13; ++j) EXPECT_EQ(d->dense[13 + j], 0.0f) << j;  // empty, -1 and 0
  ASSERT_EQ(d->ids.size(), 52u);
  EXPECT_TRUE(d->id_offsets.empty());  // one id per bag: the compact layout
  EXPECT_EQ(d->ids[0], CriteoId(0, 0x68fd1e64));
  EXPECT_EQ(d->ids[25], CriteoId(25, 0x9727dd16));
  EXPECT_EQ(d->ids[21], CriteoMissingId(21));
  EXPECT_EQ(d->ids[26], CriteoId(0, 0xa3));   // "0A3": case and leading zeros do not matter
  EXPECT_EQ(d->ids[26 + 2], CriteoId(2, 0xa3));
  EXPECT_NE(d->ids[26], d->ids[26 + 2]);      // equal values of different features differ
  for (int f = 3; f < 26; ++f) EXPECT_EQ(d->ids[26 + f], CriteoMissingId(f)) << f;
  EXPECT_EQ(d->Bag(1, 0).size(), 1u);
  EXPECT_EQ(d->Bag(1, 0)[0], d->ids[26]);
}

TEST(CriteoTest, DenseTransformBeyondTheTableAndNegatives) {
  absl::StatusOr<Dataset> d = Parse(Line("1", {"4095", "4096", "123456789012", "-7", "-0"}, {}));
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_FLOAT_EQ(d->dense[0], std::log1p(4095.0));
  EXPECT_FLOAT_EQ(d->dense[1], std::log1p(4096.0));
  EXPECT_FLOAT_EQ(d->dense[2], std::log1p(123456789012.0));
  EXPECT_EQ(d->dense[3], 0.0f);
  EXPECT_EQ(d->dense[4], 0.0f);
  EXPECT_EQ(CriteoDense(4095), d->dense[0]);  // the table agrees with the function
}

TEST(CriteoTest, CrlfLastLineWithoutNewlineAndGzipReadTheSame) {
  const std::string lf = TwoLines();
  absl::StatusOr<Dataset> want = Parse(lf);
  ASSERT_TRUE(want.ok()) << want.status();
  const std::string crlf = absl::StrReplaceAll(lf, {{"\n", "\r\n"}});
  const std::string no_final_newline = lf.substr(0, lf.size() - 1);
  for (const std::string& bytes : {crlf, no_final_newline}) {
    absl::StatusOr<Dataset> got = Parse(bytes);
    ASSERT_TRUE(got.ok()) << got.status();
    ExpectSame(*got, *want);
  }
  const std::string dir = MakeTempDir();
  WriteGzFile(dir + "/train.txt.gz", crlf);
  WriteFile(dir + "/train.txt", lf);
  for (const std::string& path : {dir + "/train.txt.gz", dir + "/train.txt"}) {
    absl::StatusOr<Dataset> got = ReadCriteo(path);
    ASSERT_TRUE(got.ok()) << got.status();
    ExpectSame(*got, *want);
    absl::StatusOr<Dataset> in_memory = Parse(ReadFile(path));  // gzip in memory too
    ASSERT_TRUE(in_memory.ok()) << in_memory.status();
    ExpectSame(*in_memory, *want);
  }
}

TEST(CriteoTest, ManyChunksOfAFile) {
  // More than one 8 MiB read: lines cut across reads must be put together.
  std::string bytes;
  for (int i = 0; bytes.size() < (size_t{17} << 20); ++i) {
    bytes += Line(i % 3 == 0 ? "1" : "0", {std::to_string(i), "", std::to_string(i % 97)},
                  {absl::StrCat(absl::Hex(i)), "", absl::StrCat(absl::Hex(static_cast<int64_t>(i) * 7919))});
  }
  const std::string dir = MakeTempDir();
  WriteFile(dir + "/train.txt", bytes);
  absl::StatusOr<Dataset> file = ReadCriteo(dir + "/train.txt");
  ASSERT_TRUE(file.ok()) << file.status();
  absl::StatusOr<Dataset> memory = Parse(bytes);
  ASSERT_TRUE(memory.ok()) << memory.status();
  ExpectSame(*file, *memory);
  const int64_t n = memory->count();
  EXPECT_EQ(memory->ids[(n - 1) * 26], CriteoId(0, static_cast<uint64_t>(n - 1)));
  EXPECT_FLOAT_EQ(memory->dense[(n - 1) * 13], std::log1p(static_cast<double>(n - 1)));
}

TEST(CriteoTest, BadFieldsNameFileLineFieldAndValue) {
  const std::string good = Line("0", {}, {});
  struct Case {
    std::string line, message;
  } cases[] = {
      {Line("0", {"1", "2", "3", "4", "5", "12x"}, {}), "train.txt:2: field 7 (I6): \"12x\" is not an integer"},
      {Line("0", {"-"}, {}), "train.txt:2: field 2 (I1): \"-\" is not an integer"},
      {Line("0", {"1.5"}, {}), "train.txt:2: field 2 (I1): \"1.5\" is not an integer"},
      {Line("0", {"1234567890123456789"}, {}),
       "train.txt:2: field 2 (I1): \"1234567890123456789\" has more than 18 digits"},
      {Line("0", {}, {"", "", "68fd1e6g"}), "train.txt:2: field 17 (C3): \"68fd1e6g\" is not hexadecimal"},
      {Line("0", {}, {"12345678901234567"}),
       "train.txt:2: field 15 (C1): \"12345678901234567\" has more than 16 hexadecimal digits"},
      {Line("0", {}, {" 68fd1e64"}), "train.txt:2: field 15 (C1): \" 68fd1e64\" is not hexadecimal"},
      {Line("2", {}, {}), "train.txt:2: field 1 (label): \"2\" is not 0 or 1"},
      {Line("01", {}, {}), "train.txt:2: field 1 (label): \"01\" is not 0 or 1"},
      {Line("", {}, {}), "train.txt:2: field 1 (label) is empty"},
      {Line("0", {"\x01\xff"}, {}), "train.txt:2: field 2 (I1): \"\\x01\\xff\" is not an integer"},
  };
  for (const Case& c : cases) {
    absl::Status s = Parse(good + c.line + good).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << c.message;
    EXPECT_EQ(s.message(), c.message);
  }
}

TEST(CriteoTest, WrongFieldCountNamesBothCounts) {
  const std::string good = Line("1", {}, {});
  std::string short_line = good.substr(0, good.size() - 2) + "\n";  // drop the last tab: 39 fields
  std::string long_line = good.substr(0, good.size() - 1) + "\tdeadbeef\n";
  EXPECT_EQ(Parse(good + short_line).status().message(),
            "train.txt:2: 39 fields, expected 40 (label, 13 integer, 26 categorical)");
  EXPECT_EQ(Parse(long_line).status().message(),
            "train.txt:1: 41 fields, expected 40 (label, 13 integer, 26 categorical)");
  EXPECT_EQ(Parse(good + "\n" + good).status().message(),  // an empty line
            "train.txt:2: 1 field, expected 40 (label, 13 integer, 26 categorical)");
  EXPECT_EQ(Parse("1\t2\t3\n").status().message(),
            "train.txt:1: 3 fields, expected 40 (label, 13 integer, 26 categorical)");
}

TEST(CriteoTest, EmptyAndTruncatedFiles) {
  EXPECT_EQ(Parse("").status().message(), "train.txt: holds no examples");
  const std::string dir = MakeTempDir();
  WriteFile(dir + "/empty.txt", "");
  EXPECT_EQ(ReadCriteo(dir + "/empty.txt").status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(ReadCriteo(dir + "/absent.txt").status().code(), absl::StatusCode::kNotFound);

  std::string lines;
  for (int i = 0; i < 2000; ++i) lines += TwoLines();
  WriteGzFile(dir + "/whole.gz", lines);
  const std::string gz = ReadFile(dir + "/whole.gz");
  WriteFile(dir + "/cut.gz", gz.substr(0, gz.size() / 2));
  absl::Status s = ReadCriteo(dir + "/cut.gz").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(s.message(), HasSubstr(dir + "/cut.gz"));
  s = Parse(gz.substr(0, gz.size() / 2)).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(s.message(), HasSubstr("truncated gzip"));
}

TEST(CriteoTest, OtherLayouts) {
  const CriteoLayout layout{2, 3};
  absl::StatusOr<Dataset> d = Parse("1\t7\t\tab\t\tcd\n0\t\t3\t\t1\t\n", layout);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->num_dense, 2);
  EXPECT_EQ(d->num_sparse, 3);
  EXPECT_EQ(d->ids, (std::vector<int64_t>{CriteoId(0, 0xab), CriteoMissingId(1), CriteoId(2, 0xcd),
                                          CriteoMissingId(0), CriteoId(1, 1), CriteoMissingId(2)}));
  EXPECT_EQ(Parse(TwoLines(), layout).status().message(),
            "train.txt:1: 40 fields, expected 6 (label, 2 integer, 3 categorical)");
  EXPECT_EQ(Parse("1\n", CriteoLayout{0, 0}).status().code(), absl::StatusCode::kInvalidArgument);
  absl::StatusOr<Dataset> dense_only = Parse("1\t5\n", CriteoLayout{1, 0});
  ASSERT_TRUE(dense_only.ok()) << dense_only.status();
  EXPECT_EQ(dense_only->kind(), DataKind::kCtr);

  const std::string dir = MakeTempDir();
  absl::StatusOr<CriteoLayout> standard = ReadCriteoLayout(dir);  // no file: 13 + 26
  ASSERT_TRUE(standard.ok());
  EXPECT_EQ(standard->num_dense, 13);
  EXPECT_EQ(standard->num_sparse, 26);
  ASSERT_TRUE(WriteCriteoLayout(dir, layout).ok());
  EXPECT_EQ(ReadFile(dir + "/criteo_layout.txt"), "num_dense=2 num_sparse=3\n");
  absl::StatusOr<CriteoLayout> got = ReadCriteoLayout(dir);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->num_dense, 2);
  EXPECT_EQ(got->num_sparse, 3);
  WriteFile(dir + "/criteo_layout.txt", "num_dense=2 sparse=3\n");
  EXPECT_THAT(ReadCriteoLayout(dir).status().message(),
              HasSubstr(dir + "/criteo_layout.txt: cannot read \"sparse=3\""));
}

// The hash is part of the format (ids live in checkpoints and shard the tables): these values must not change.
TEST(CriteoTest, HashGoldenValues) {
  EXPECT_EQ(Mix64(0x9e3779b97f4a7c15ULL), 0xe220a8397b1dcdafULL);  // splitmix64(seed 0)'s first output
  EXPECT_EQ(CriteoId(0, 0), 8333463007620245321);
  EXPECT_EQ(CriteoId(0, 0x68fd1e64), 2852847187653700392);
  EXPECT_EQ(CriteoId(25, 0x68fd1e64), 4275947773877829507);
  EXPECT_EQ(CriteoId(12, 0xdeadbeef), 6025022353898961539);
  EXPECT_EQ(CriteoMissingId(0), 1593351093873096686);
  EXPECT_EQ(CriteoMissingId(25), 439276235163872854);
}

TEST(CriteoTest, IdsSpreadEvenly) {
  // Consecutive values (the worst case for a weak hash) over 64 shards by the low bits and by the high bits.
  constexpr int kShards = 64, kValues = 64000;
  std::vector<int> low(kShards), high(kShards);
  for (int v = 0; v < kValues; ++v) {
    const int64_t id = CriteoId(3, static_cast<uint64_t>(v));
    ASSERT_GE(id, 0);
    ++low[id % kShards];
    ++high[id >> 57];
  }
  // Chi-square with 63 degrees of freedom: 120 is far beyond its 99.99th percentile (~110).
  for (const std::vector<int>* counts : {&low, &high}) {
    double chi2 = 0;
    const double want = static_cast<double>(kValues) / kShards;
    for (int c : *counts) chi2 += (c - want) * (c - want) / want;
    EXPECT_LT(chi2, 120) << (counts == &low ? "low bits" : "high bits");
  }
}

TEST(CriteoTest, LoadDatasetDetectsCriteo) {
  const std::string dir = MakeTempDir();
  WriteGzFile(dir + "/train.txt.gz", TwoLines() + TwoLines());
  WriteFile(dir + "/test.txt", TwoLines());
  for (DataFormat format : {DataFormat::kAuto, DataFormat::kCriteo}) {
    absl::StatusOr<DatasetPair> p = LoadDataset(dir, format);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(p->format, "criteo");
    EXPECT_EQ(p->train.count(), 4);
    EXPECT_EQ(p->test.count(), 2);
  }
  EXPECT_EQ(ParseDataFormat("criteo").value(), DataFormat::kCriteo);
  EXPECT_EQ(ParseDataFormat("auto").value(), DataFormat::kAuto);
  EXPECT_EQ(ParseDataFormat("tfrecord").value(), DataFormat::kTfRecord);
  EXPECT_THAT(ParseDataFormat("parquet").status().message(),
              HasSubstr("expected one of auto, mnist-idx, cifar10-bin, tfrecord, criteo"));

  // A layout file beside them; train and test must agree.
  ASSERT_TRUE(WriteCriteoLayout(dir, CriteoLayout{2, 3}).ok());
  WriteFile(dir + "/test.txt", "1\t7\t\tab\t\tcd\n");
  absl::Status s = LoadDataset(dir).status();
  EXPECT_THAT(s.message(), HasSubstr(dir + "/train.txt.gz:1: 40 fields, expected 6"));

  const std::string empty = MakeTempDir() + "/nothing";
  EXPECT_THAT(LoadDataset(empty, DataFormat::kCriteo).status().message(),
              HasSubstr("Criteo text: " + empty + "/train.txt[.gz], " + empty + "/test.txt[.gz]"));
}

}  // namespace
}  // namespace dtrain::data
